//! A memory store with hooks, for unit tests that hold, count or refuse some of a store's
//! calls and leave the rest to [`MemoryStore`].

use crate::bucket::{BucketState, Commute};
use crate::dimension::Dimension;
use crate::store::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    MemoryStore, Store, StoreError,
};

/// What a test does with a store's calls before the memory store answers them.
#[async_trait::async_trait]
pub(crate) trait Hooks: Send + Sync + std::fmt::Debug + 'static {
    /// Before a bucket change: an error refuses it.
    fn change(&self, _change: &BucketChange) -> Result<(), ChangeError> {
        Ok(())
    }

    /// Before a bucket change is sent to the memory store: a slow store's answer.
    async fn hold_change(&self) {}

    /// After a bucket change applied: an error is answered instead (an answer lost after
    /// the write).
    fn answered(&self, _change: &BucketChange) -> Result<(), ChangeError> {
        Ok(())
    }

    /// Before a commit (a transaction of bucket and lease rows): an error refuses it.
    fn commit(&self, _commit: &Commit) -> Result<(), CommitError> {
        Ok(())
    }

    /// Before a reshard's transaction, with the moves of the rows it keeps: `Ok(false)`
    /// answers that it lost its race, an error refuses it.
    fn respread(&self, _moves: &[Option<Commute>]) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// Before bucket rows are read.
    fn read_buckets(&self, _dimensions: &[Dimension]) {}

    /// Before a lease row is ended.
    fn end_lease(&self, _key: &LeaseKey) {}

    /// Before lease rows are deleted without condition: an error refuses the delete.
    async fn delete_leases(&self, _keys: &[LeaseKey]) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A client of `store` reading `clock`.
pub(crate) fn client(
    store: std::sync::Arc<dyn Store>,
    clock: &crate::clock::ManualClock,
) -> crate::Sluice {
    crate::Sluice::builder()
        .store_arc(store)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// A [`MemoryStore`] whose calls go through `hooks` first.
#[derive(Debug, Default)]
pub(crate) struct Hooked<H> {
    pub(crate) inner: MemoryStore,
    pub(crate) hooks: H,
}

impl<H> Hooked<H> {
    /// A new, empty memory store behind `hooks`.
    pub(crate) fn new(hooks: H) -> Self {
        Hooked {
            inner: MemoryStore::new(),
            hooks,
        }
    }
}

/// Implements [`Store`] for [`Hooked`]: the methods written out, then those listed after
/// `passed`, which go to the memory store unchanged.
macro_rules! hooked_store {
    ({ $($hooked:tt)* } passed { $($name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)* }) => {
        #[async_trait::async_trait]
        impl<H: Hooks> Store for Hooked<H> {
            $($hooked)*
            $(
                async fn $name(&self, $($arg: $ty),*) -> $out {
                    self.inner.$name($($arg),*).await
                }
            )*
        }
    };
}

hooked_store!({
    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        self.hooks.change(&change)?;
        self.hooks.hold_change().await;
        let after = self.inner.change(change.clone()).await?;
        self.hooks.answered(&change)?;
        Ok(after)
    }
    async fn respread_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
        moves: &[Option<Commute>],
    ) -> Result<bool, StoreError> {
        if !self.hooks.respread(moves)? {
            return Ok(false);
        }
        self.inner.respread_buckets(expected, rows, moves).await
    }
    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        self.hooks.commit(&commit)?;
        self.inner.commit(commit).await
    }
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        self.hooks.read_buckets(dimensions);
        self.inner.read_buckets(dimensions).await
    }
    async fn end_lease(
        &self,
        key: &LeaseKey,
        expiring_at: Option<crate::clock::UnixMillis>,
    ) -> Result<bool, StoreError> {
        self.hooks.end_lease(key);
        self.inner.end_lease(key, expiring_at).await
    }
    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        self.hooks.delete_leases(keys).await?;
        self.inner.delete_leases(keys).await
    }
} passed {
    put_leases(leases: &[LeaseRecord]) -> Result<(), StoreError>;
    renew_lease(key: &LeaseKey, from: crate::clock::UnixMillis, to: crate::clock::UnixMillis) -> Result<bool, StoreError>;
    count_waiting(dimension: &Dimension, epoch: u64, weight: u64, forget: &[u64]) -> Result<Option<BucketState>, StoreError>;
    read_leases(keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError>;
    scan_leases(filter: &LeaseFilter) -> Result<LeaseScan, StoreError>;
    put_bucket(state: &BucketState, expected: Option<&BucketState>) -> Result<bool, StoreError>;
    list_buckets() -> Result<Vec<BucketState>, StoreError>;
    delete_bucket(dimension: &Dimension) -> Result<bool, StoreError>;
});
