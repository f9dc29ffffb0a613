//! A store that holds one bucket row's writes until the test lets them go: what other
//! clients do meanwhile is what the held write races.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use sluice::store::{
    BoxError, BucketChange, BucketWrite, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey,
    LeaseRecord, LeaseScan, Store, StoreError,
};
use sluice::{Dimension, Sluice, bucket::BucketState, store::Commute};

use super::Env;

/// A store that holds every write to one dimension's bucket row (a commit, a change, a
/// reshard of its bucket) until told to go on, and counts the reshards.
#[derive(Debug)]
pub struct Gate {
    inner: Arc<dyn Store>,
    gated: Dimension,
    open: tokio::sync::watch::Receiver<bool>,
    /// Notified when a gated write arrives.
    pub arrived: tokio::sync::Notify,
    /// The reshards sent through the gate.
    pub reshards: AtomicU32,
    /// While above zero, each change of the gated row is answered at once as throttled by
    /// the item's own throughput, and counted down, instead of held.
    pub throttling: AtomicU32,
    /// While set, definitions of the gated row (`put_bucket`) are held too.
    pub holds_definitions: std::sync::atomic::AtomicBool,
    /// While set, a reshard's moves are dropped: every row is conditioned on being as
    /// read, as a store may do (see `Store::respread_buckets`).
    pub ignores_moves: std::sync::atomic::AtomicBool,
}

impl Gate {
    /// A gate before `env`'s store on `metric`'s row, closed, and what opens it.
    pub fn new(env: &Env, metric: &str) -> (Arc<Gate>, tokio::sync::watch::Sender<bool>) {
        let (open, gate_open) = tokio::sync::watch::channel(false);
        let gate = Arc::new(Gate {
            inner: env.store.clone(),
            gated: env.dim(metric).parse().expect("a dimension"),
            open: gate_open,
            arrived: tokio::sync::Notify::new(),
            reshards: AtomicU32::new(0),
            throttling: AtomicU32::new(0),
            holds_definitions: std::sync::atomic::AtomicBool::new(false),
            ignores_moves: std::sync::atomic::AtomicBool::new(false),
        });
        (gate, open)
    }

    /// A client configured as `env`'s, on the store through this gate.
    pub fn client(self: &Arc<Self>, env: &Env) -> Sluice {
        self.client_with(env, |c| c)
    }

    /// A client configured as `env`'s changed by `config`, on the store through this gate.
    pub fn client_with(
        self: &Arc<Self>,
        env: &Env,
        config: impl FnOnce(sluice::Config) -> sluice::Config,
    ) -> Sluice {
        sluice::SluiceBuilder::from_config(config(env.sluice.config().clone()))
            .store_arc(self.clone())
            .clock(env.clock.clone())
            .build()
            .expect("a client")
    }

    /// Says a gated write arrived, and holds it until the gate opens.
    async fn wait(&self) -> Result<(), StoreError> {
        self.arrived.notify_one();
        let mut open = self.open.clone();
        open.wait_for(|o| *o)
            .await
            .map_err(|e| StoreError::Service {
                message: "gate dropped".to_owned(),
                source: Some(Box::new(e) as BoxError),
            })?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for Gate {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        self.inner.read_buckets(dimensions).await
    }
    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        if commit
            .buckets
            .iter()
            .any(|w: &BucketWrite| *w.dimension() == self.gated)
        {
            self.wait().await?;
        }
        self.inner.commit(commit).await
    }
    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        if change.dimension == self.gated {
            let throttled = self
                .throttling
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if throttled {
                return Err(ChangeError::Store(StoreError::Throttled { source: None }));
            }
            self.wait().await?;
        }
        self.inner.change(change).await
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
        self.inner
            .count_waiting(dimension, epoch, weight, forget)
            .await
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
    async fn respread_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
        moves: &[Option<Commute>],
    ) -> Result<bool, StoreError> {
        self.reshards.fetch_add(1, Ordering::SeqCst);
        if expected.iter().any(|r| r.dimension == self.gated) {
            self.wait().await?;
        }
        let moves = match self.ignores_moves.load(Ordering::SeqCst) {
            true => &[],
            false => moves,
        };
        self.inner.respread_buckets(expected, rows, moves).await
    }
    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError> {
        if state.dimension == self.gated && self.holds_definitions.load(Ordering::SeqCst) {
            self.wait().await?;
        }
        self.inner.put_bucket(state, expected).await
    }
    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError> {
        self.inner.list_buckets().await
    }
    async fn delete_bucket(&self, dimension: &Dimension) -> Result<bool, StoreError> {
        self.inner.delete_bucket(dimension).await
    }
}
