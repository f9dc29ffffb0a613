//! When a `requests`/`tokens` lease gets its row: only once it has been held for a second
//! (at most half its time to live), so a lease released sooner costs no row write and no
//! row delete; a lean bucket's never; `Lease::recorded` writes it at once; an adjustment
//! before the row is written changes the cost it is written with; a give-back of a pair
//! refused on its second dimension restores the first without touching a row. Paused
//! time, one store counting its lease-row calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice::store::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    Store, StoreError,
};
use sluice::{
    Acquire, Bucket, Dimension, MemoryStore, RefillRate, Sluice, Tokens, bucket::BucketState,
    clock::TokioClock, clock::UnixMillis,
};

/// A store counting the calls that write or delete lease rows.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryStore,
    puts: AtomicU64,
    deletes: AtomicU64,
    commits: AtomicU64,
}

#[async_trait::async_trait]
impl Store for Counting {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        self.inner.read_buckets(dimensions).await
    }
    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        self.commits.fetch_add(1, Ordering::SeqCst);
        self.inner.commit(commit).await
    }
    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
        self.inner.delete_leases(keys).await
    }
    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        self.inner.read_leases(keys).await
    }
    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError> {
        self.inner.scan_leases(filter).await
    }
    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        self.inner.change(change).await
    }
    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        self.inner.put_leases(leases).await
    }
    async fn end_lease(
        &self,
        key: &LeaseKey,
        expiring_at: Option<sluice::clock::UnixMillis>,
    ) -> Result<bool, StoreError> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
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
    async fn respread_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
        moves: &[Option<sluice::store::Commute>],
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

impl Counting {
    fn puts(&self) -> u64 {
        self.puts.load(Ordering::SeqCst)
    }
    fn deletes(&self) -> u64 {
        self.deletes.load(Ordering::SeqCst)
    }
}

const RPM: &str = "rows#rpm";
const TPM: &str = "rows#tpm";

async fn setup() -> (Arc<Counting>, Sluice) {
    let store = Arc::new(Counting::default());
    let sluice = Sluice::builder()
        .store_arc(store.clone())
        .clock(TokioClock::starting_at(UnixMillis::from_secs(
            1_700_000_000,
        )))
        .build()
        .unwrap();
    sluice
        .put_bucket(
            RPM,
            Bucket::requests(RefillRate::per_minute(600)).with_capacity(100),
        )
        .await
        .unwrap();
    sluice
        .put_bucket(
            TPM,
            Bucket::tokens(RefillRate::per_minute(6_000)).with_capacity(1_000),
        )
        .await
        .unwrap();
    (store, sluice)
}

async fn rows(sluice: &Sluice) -> Vec<LeaseRecord> {
    sluice.leases(&LeaseFilter::default()).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_lease_released_before_its_row_is_due_never_writes_one() {
    let (store, sluice) = setup().await;
    for _ in 0..5 {
        let lease = sluice.acquire(RPM).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        lease.release().await.unwrap();
    }
    // Long after: no row was ever written, none deleted.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!((store.puts(), store.deletes()), (0, 0));
    assert!(rows(&sluice).await.is_empty());
    assert_eq!(
        sluice.snapshot(RPM).await.unwrap().available,
        Tokens::new(100)
    );
}

/// The task that would write a lease's row ends as soon as the lease has ended: leases
/// released at once leave no task asleep for the second a row waits (at 100,000 grants a
/// second, that was 100,000 sleeping tasks).
#[tokio::test(start_paused = true)]
async fn a_lease_released_before_its_row_is_due_leaves_no_task_waiting_for_it() {
    let (_store, sluice) = setup().await;
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = tasks();
    for _ in 0..50 {
        sluice.acquire(RPM).await.unwrap().release().await.unwrap();
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(
        tasks() <= before + 2,
        "{} tasks alive, {before} before",
        tasks()
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_held_past_record_after_gets_its_row_and_its_release_deletes_it() {
    let (store, sluice) = setup().await;
    let lease = sluice.acquire(Acquire::with_cost(TPM, 250)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(rows(&sluice).await.is_empty(), "not due yet");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let written = rows(&sluice).await;
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].cost, Tokens::new(250));
    assert_eq!(written[0].key.as_str(), lease.id().keys()[0].as_str());
    lease.release().await.unwrap();
    assert!(rows(&sluice).await.is_empty());
    assert_eq!((store.puts(), store.deletes()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_short_lease_is_recorded_by_half_its_time_to_live() {
    let (_, sluice) = setup().await;
    let _lease = sluice
        .acquire(Acquire::new(RPM).ttl(Duration::from_millis(1_200)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(rows(&sluice).await.is_empty());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rows(&sluice).await.len(), 1, "written by half its 1.2 s");
}

#[tokio::test(start_paused = true)]
async fn recorded_writes_the_row_at_once() {
    let (store, sluice) = setup().await;
    let lease = sluice.acquire(RPM).await.unwrap();
    let before = tokio::time::Instant::now();
    lease.recorded().await;
    assert_eq!(tokio::time::Instant::now(), before, "no time passed");
    assert_eq!(rows(&sluice).await.len(), 1);
    assert_eq!(store.puts(), 1);
    lease.release().await.unwrap();
    assert!(rows(&sluice).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_lean_bucket_s_lease_never_gets_a_row_however_long_it_is_held() {
    let (store, sluice) = setup().await;
    sluice
        .put_bucket(
            "rows#lean",
            Bucket::requests(RefillRate::per_minute(600))
                .with_capacity(100)
                .lean(),
        )
        .await
        .unwrap();
    let lease = sluice.acquire("rows#lean").await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    lease.recorded().await;
    assert!(rows(&sluice).await.is_empty());
    lease.release().await.unwrap();
    assert_eq!((store.puts(), store.deletes()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn an_adjustment_before_the_row_is_written_sets_the_cost_it_is_written_with() {
    let (store, sluice) = setup().await;
    let mut lease = sluice.acquire(Acquire::with_cost(TPM, 400)).await.unwrap();
    let commits = store.commits.load(Ordering::SeqCst);
    lease.adjust(TPM, 150).await.unwrap();
    assert_eq!(
        store.commits.load(Ordering::SeqCst),
        commits,
        "no row to change yet"
    );
    assert_eq!(
        sluice.snapshot(TPM).await.unwrap().available,
        Tokens::new(850),
        "the bucket charged 150 in all"
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let written = rows(&sluice).await;
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].cost, Tokens::new(150));
    // Once written, an adjustment changes the row.
    lease.adjust(TPM, 200).await.unwrap();
    assert_eq!(rows(&sluice).await[0].cost, Tokens::new(200));
    lease.release().await.unwrap();
    assert!(rows(&sluice).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_pair_refused_on_its_second_dimension_gives_the_first_back_without_a_row() {
    let (store, sluice) = setup().await;
    // Another client empties tpm; this one has not seen it.
    let other = Sluice::builder()
        .store_arc(store.clone())
        .clock(TokioClock::starting_at(UnixMillis::from_secs(
            1_700_000_000,
        )))
        .build()
        .unwrap();
    let held = other.acquire(Acquire::with_cost(TPM, 1_000)).await.unwrap();
    let refused = sluice
        .acquire(Acquire::new(RPM).and_cost(TPM, 500))
        .await
        .unwrap_err();
    assert!(refused.retry_in().is_some(), "{refused}");
    assert_eq!(
        sluice.snapshot(RPM).await.unwrap().available,
        Tokens::new(100),
        "rpm given back"
    );
    assert_eq!((store.puts(), store.deletes()), (0, 0));
    held.release().await.unwrap();
}
