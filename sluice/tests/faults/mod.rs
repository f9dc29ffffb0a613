//! Faults for in-process tests: a store that can be taken down (the in-memory store
//! behind a switch that makes every call time out while it is off), and a clock that is
//! off by a fixed amount.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sluice::store::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    StoreError,
};
use sluice::{
    Dimension, MemoryStore, bucket::BucketState, clock::Clock, clock::UnixMillis, store::Store,
};

/// `inner`'s time moved by `offset_ms` (negative: behind), like a host whose clock is off.
#[derive(Debug, Clone)]
pub struct SkewedClock<C> {
    pub inner: C,
    pub offset_ms: i64,
}

impl<C: Clock> Clock for SkewedClock<C> {
    fn now(&self) -> UnixMillis {
        UnixMillis::new(self.inner.now().as_millis() + self.offset_ms)
    }
}

/// The in-memory store, unless it is down: then every call times out.
#[derive(Debug, Default)]
pub struct Switch {
    pub inner: MemoryStore,
    pub down: AtomicBool,
    /// Calls made while down.
    pub calls_while_down: AtomicU64,
    /// While set, commits time out (reads still answer): a write whose answer is lost.
    pub commits_down: AtomicBool,
}

impl Switch {
    /// Takes the store down (`true`) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            self.calls_while_down.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Timeout { source: None });
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for Switch {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        self.check()?;
        self.inner.read_buckets(dimensions).await
    }

    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        self.check()?;
        if self.commits_down.load(Ordering::SeqCst) {
            return Err(StoreError::Timeout { source: None }.into());
        }
        self.inner.commit(commit).await
    }

    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        self.check()?;
        self.inner.delete_leases(keys).await
    }

    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        self.check()?;
        self.inner.read_leases(keys).await
    }

    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError> {
        self.check()?;
        self.inner.scan_leases(filter).await
    }

    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        self.check()?;
        self.inner.change(change).await
    }

    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        self.check()?;
        self.inner.put_leases(leases).await
    }

    async fn end_lease(
        &self,
        key: &LeaseKey,
        expiring_at: Option<sluice::clock::UnixMillis>,
    ) -> Result<bool, StoreError> {
        self.check()?;
        self.inner.end_lease(key, expiring_at).await
    }
    async fn renew_lease(
        &self,
        key: &LeaseKey,
        from: sluice::clock::UnixMillis,
        to: sluice::clock::UnixMillis,
    ) -> Result<bool, StoreError> {
        self.check()?;
        self.inner.renew_lease(key, from, to).await
    }

    async fn count_waiting(
        &self,
        dimension: &Dimension,
        epoch: u64,
        weight: u64,
        forget: &[u64],
    ) -> Result<Option<BucketState>, StoreError> {
        self.check()?;
        self.inner
            .count_waiting(dimension, epoch, weight, forget)
            .await
    }

    async fn respread_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
        moves: &[Option<sluice::store::Commute>],
    ) -> Result<bool, StoreError> {
        self.check()?;
        self.inner.respread_buckets(expected, rows, moves).await
    }
    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError> {
        self.check()?;
        self.inner.put_bucket(state, expected).await
    }

    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError> {
        self.check()?;
        self.inner.list_buckets().await
    }

    async fn delete_bucket(&self, dimension: &Dimension) -> Result<bool, StoreError> {
        self.check()?;
        self.inner.delete_bucket(dimension).await
    }
}
