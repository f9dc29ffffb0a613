//! However many clients wait for a slot of a short `concurrent` bucket, together they look
//! at its row about a hundred times a second: each counts itself on the row once an epoch
//! and spaces its looks by the count. A slot given back still reaches one of them at once.
//! Paused time, one store counting the calls on the bucket's row.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice::store::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    Store, StoreError,
};
use sluice::{Bucket, BucketState, Dimension, MemoryStore, Sluice, TokioClock, UnixMillis};
use tokio::time::Instant;

const DIM: &str = "waiting#slots";

/// A store counting the calls on the bucket's row and on its slot leases.
#[derive(Debug, Default)]
struct Looks {
    inner: MemoryStore,
    /// Reads, changes and counts of waiting clients: calls on the bucket's row.
    row: AtomicU64,
    /// Counts of waiting clients alone.
    counts: AtomicU64,
    /// Queries of the bucket's slot leases.
    leases: AtomicU64,
}

impl Looks {
    fn take(&self) -> (u64, u64, u64) {
        (
            self.row.swap(0, Ordering::SeqCst),
            self.counts.swap(0, Ordering::SeqCst),
            self.leases.swap(0, Ordering::SeqCst),
        )
    }
}

#[async_trait::async_trait]
impl Store for Looks {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        self.row.fetch_add(1, Ordering::SeqCst);
        self.inner.read_buckets(dimensions).await
    }
    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        self.row.fetch_add(1, Ordering::SeqCst);
        self.inner.commit(commit).await
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
        dimension: &Dimension,
        limit: usize,
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        self.leases.fetch_add(1, Ordering::SeqCst);
        self.inner.slot_leases(dimension, limit).await
    }
    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        self.row.fetch_add(1, Ordering::SeqCst);
        self.inner.change(change).await
    }
    async fn count_waiting(
        &self,
        dimension: &Dimension,
        epoch: u64,
        weight: u64,
        forget: &[u64],
    ) -> Result<Option<BucketState>, StoreError> {
        self.row.fetch_add(1, Ordering::SeqCst);
        self.counts.fetch_add(1, Ordering::SeqCst);
        self.inner
            .count_waiting(dimension, epoch, weight, forget)
            .await
    }
    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        self.inner.put_leases(leases).await
    }
    async fn end_lease(
        &self,
        key: &LeaseKey,
        expiring_at: Option<UnixMillis>,
    ) -> Result<bool, StoreError> {
        self.inner.end_lease(key, expiring_at).await
    }
    async fn renew_lease(
        &self,
        key: &LeaseKey,
        from: UnixMillis,
        to: UnixMillis,
    ) -> Result<bool, StoreError> {
        self.inner.renew_lease(key, from, to).await
    }
    async fn respread_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
        moves: &[Option<sluice::Commute>],
    ) -> Result<bool, StoreError> {
        self.inner.respread_buckets(expected, rows, moves).await
    }
    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError> {
        self.inner.put_bucket(state, expected).await
    }
    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError> {
        self.inner.list_buckets().await
    }
    async fn delete_bucket(&self, dimension: &Dimension) -> Result<bool, StoreError> {
        self.inner.delete_bucket(dimension).await
    }
}

/// `clients` clients of `callers` callers each wait on a bucket whose two slots another
/// client holds, started one after another. Once the count has settled, a minute is
/// measured: the calls on the row and the lease queries, a second, and the counts in the
/// minute. Then the slot given back must reach a waiter within a second.
async fn waiting(clients: u64, callers: u64) -> (u64, u64, u64) {
    let store = Arc::new(Looks::default());
    let clock = TokioClock::starting_at(UnixMillis::from_secs(1_700_000_000));
    let client = |caller: String| {
        Sluice::builder()
            .store_arc(store.clone())
            .clock(clock)
            .caller(caller)
            .build()
            .unwrap()
    };
    let holder = client("holder".to_owned());
    holder.put_bucket(DIM, Bucket::concurrent(2)).await.unwrap();
    let mut held = vec![
        holder.acquire(DIM).await.unwrap(),
        holder.acquire(DIM).await.unwrap(),
    ];
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = tokio::task::JoinSet::new();
    for i in 0..clients {
        let sluice = client(format!("waiter-{i}"));
        // Started one after another, as a fleet starts.
        tokio::time::sleep(Duration::from_millis(10)).await;
        for _ in 0..callers {
            let (sluice, tx) = (sluice.clone(), granted_tx.clone());
            waiters.spawn(async move {
                let lease = sluice
                    .acquire_within(DIM, Duration::from_secs(600))
                    .await
                    .unwrap();
                tx.send(Instant::now()).unwrap();
                // Held to the end: the test counts one grant per slot given back.
                std::future::pending::<()>().await;
                drop(lease);
            });
        }
    }
    // Two epochs for the count to settle, then a minute measured.
    tokio::time::sleep(Duration::from_secs(40)).await;
    store.take();
    let minute = Duration::from_secs(60);
    tokio::time::sleep(minute).await;
    let (row, counts, leases) = store.take();
    assert!(granted.try_recv().is_err(), "nothing was given back yet");
    // A slot given back reaches one of the waiters at once.
    let freed = Instant::now();
    held.pop().unwrap().release().await.unwrap();
    let reached = tokio::time::timeout(Duration::from_secs(1), granted.recv())
        .await
        .expect("a waiter got the slot given back within a second")
        .unwrap();
    assert!(reached - freed <= Duration::from_secs(1));
    waiters.abort_all();
    drop(held);
    let seconds = minute.as_secs();
    (row / seconds, leases / seconds, counts)
}

/// 200 single-caller clients (the old spacing, every client at the 300 ms poll interval,
/// jittered, looked at the row about 900 times a second): about a hundred, with a few
/// counts an epoch.
#[tokio::test(start_paused = true)]
async fn two_hundred_waiting_clients_look_about_a_hundred_times_a_second() {
    let (row, leases, counts) = waiting(200, 1).await;
    assert!(
        row <= 150,
        "{row} calls a second on the row ({counts} counts)"
    );
    assert!(leases <= 150, "{leases} lease queries a second");
    assert!(counts <= 3 * 2 * 40, "{counts} counts in three epochs");
}

/// 20 clients of 10 callers each: the callers are counted, not the clients (counting the
/// clients, each caller of a client looked about every 300 ms: several hundred looks a
/// second).
#[tokio::test(start_paused = true)]
async fn two_hundred_waiting_callers_in_twenty_clients_look_about_a_hundred_times_a_second() {
    let (row, leases, counts) = waiting(20, 10).await;
    assert!(
        row <= 150,
        "{row} calls a second on the row ({counts} counts)"
    );
    assert!(leases <= 150, "{leases} lease queries a second");
    assert!(counts <= 3 * 2 * 40, "{counts} counts in three epochs");
}
