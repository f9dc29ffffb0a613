//! A store that counts a client's calls on bucket rows, for the tests that check how many
//! a client makes (a model test's memory rules, the waiting callers' bound).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice::store::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    Store, StoreError,
};
use sluice::{Dimension, bucket::BucketState};

/// A client's view of a shared store: the same store, its calls on bucket rows counted
/// (a refusal answered with no call came from the client's memory): reads, commits,
/// changes and respreads in `calls`, reads also in `reads`; counts of waiting callers
/// (also on the bucket's row) in `waits`, queries of slot leases in `slot_queries`.
#[derive(Debug)]
pub(crate) struct Counted {
    pub(crate) inner: Arc<dyn Store>,
    pub(crate) calls: Arc<AtomicU64>,
    pub(crate) reads: Arc<AtomicU64>,
    pub(crate) waits: Arc<AtomicU64>,
    pub(crate) slot_queries: Arc<AtomicU64>,
}

impl Counted {
    /// `inner`, every count at zero.
    pub(crate) fn new(inner: Arc<dyn Store>) -> Counted {
        Counted {
            inner,
            calls: Arc::default(),
            reads: Arc::default(),
            waits: Arc::default(),
            slot_queries: Arc::default(),
        }
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl Store for Counted {
    async fn read_buckets(&self, d: &[Dimension]) -> Result<Vec<Option<BucketState>>, StoreError> {
        self.count();
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read_buckets(d).await
    }
    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        self.count();
        self.inner.commit(commit).await
    }
    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        self.count();
        self.inner.change(change).await
    }
    async fn respread_buckets(
        &self,
        old: &[BucketState],
        new: &[BucketState],
        moves: &[Option<sluice::store::Commute>],
    ) -> Result<bool, StoreError> {
        self.count();
        self.inner.respread_buckets(old, new, moves).await
    }
    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        self.inner.delete_leases(keys).await
    }
    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        self.inner.read_leases(keys).await
    }
    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError> {
        self.inner.scan_leases(filter).await
    }
    async fn slot_leases(
        &self,
        d: &Dimension,
        limit: usize,
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        self.slot_queries.fetch_add(1, Ordering::SeqCst);
        self.inner.slot_leases(d, limit).await
    }
    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError> {
        self.inner.put_bucket(state, expected).await
    }
    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        self.inner.put_leases(leases).await
    }
    async fn end_lease(
        &self,
        key: &LeaseKey,
        expiring_at: Option<sluice::clock::UnixMillis>,
    ) -> Result<bool, StoreError> {
        self.inner.end_lease(key, expiring_at).await
    }
    async fn renew_lease(
        &self,
        key: &LeaseKey,
        from: sluice::clock::UnixMillis,
        to: sluice::clock::UnixMillis,
    ) -> Result<bool, StoreError> {
        self.inner.renew_lease(key, from, to).await
    }
    async fn count_waiting(
        &self,
        dimension: &Dimension,
        epoch: u64,
        weight: u64,
        forget: &[u64],
    ) -> Result<Option<BucketState>, StoreError> {
        self.waits.fetch_add(1, Ordering::SeqCst);
        self.inner
            .count_waiting(dimension, epoch, weight, forget)
            .await
    }
    fn loses_answers(&self) -> bool {
        self.inner.loses_answers()
    }
    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError> {
        self.inner.list_buckets().await
    }
    async fn delete_bucket(&self, d: &Dimension) -> Result<bool, StoreError> {
        self.inner.delete_bucket(d).await
    }
}
