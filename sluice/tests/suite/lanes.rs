//! Callers that go away: an acquire whose caller dropped it (cancelled, timed out) is never
//! granted, or its grant is given back at once; a caller queued behind them is answered.
//!
//! The store holds each change after applying it until the test opens its gate, so that a
//! write can be caught in flight, with callers queued behind it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sluice::store::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    Store, StoreError,
};
use sluice::{
    Bucket, Dimension, MemoryStore, RefillRate, Sluice, Tokens, bucket::BucketState,
    clock::ManualClock, clock::UnixMillis,
};

/// A memory store whose changes wait, once applied, for the gate to open.
#[derive(Debug, Clone)]
struct GatedStore {
    inner: MemoryStore,
    gate: Arc<tokio::sync::Semaphore>,
    closed: Arc<std::sync::atomic::AtomicBool>,
    held: Arc<AtomicUsize>,
    /// While set, every call yields once before it goes on: each is an await point that
    /// is pending once, where a caller may drop it.
    stepping: Arc<std::sync::atomic::AtomicBool>,
}

impl Default for GatedStore {
    fn default() -> Self {
        GatedStore {
            inner: MemoryStore::new(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            closed: Arc::default(),
            held: Arc::default(),
            stepping: Arc::default(),
        }
    }
}

impl GatedStore {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    fn open(&self) {
        self.closed.store(false, Ordering::SeqCst);
        self.gate.add_permits(1_000);
    }

    /// Pending once, while stepping.
    async fn step(&self) {
        if self.stepping.load(Ordering::SeqCst) {
            tokio::task::yield_now().await;
        }
    }

    /// Waits until `n` changes are held at the gate.
    async fn held(&self, n: usize) {
        while self.held.load(Ordering::SeqCst) < n {
            tokio::task::yield_now().await;
        }
    }
}

#[async_trait::async_trait]
impl Store for GatedStore {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        self.step().await;
        self.inner.read_buckets(dimensions).await
    }

    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        self.step().await;
        self.inner.commit(commit).await
    }

    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        self.step().await;
        self.inner.delete_leases(keys).await
    }

    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        self.step().await;
        self.inner.read_leases(keys).await
    }

    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError> {
        self.step().await;
        self.inner.scan_leases(filter).await
    }

    async fn slot_leases(
        &self,
        dimension: &Dimension,
        limit: usize,
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        self.step().await;
        self.inner.slot_leases(dimension, limit).await
    }

    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        self.step().await;
        let result = self.inner.change(change).await;
        if self.closed.load(Ordering::SeqCst) {
            self.held.fetch_add(1, Ordering::SeqCst);
            let _permit = self.gate.acquire().await.unwrap();
        }
        result
    }

    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        self.step().await;
        self.inner.put_leases(leases).await
    }

    async fn end_lease(
        &self,
        key: &LeaseKey,
        expiring_at: Option<sluice::clock::UnixMillis>,
    ) -> Result<bool, StoreError> {
        self.step().await;
        self.inner.end_lease(key, expiring_at).await
    }
    async fn renew_lease(
        &self,
        key: &LeaseKey,
        from: sluice::clock::UnixMillis,
        to: sluice::clock::UnixMillis,
    ) -> Result<bool, StoreError> {
        self.step().await;
        self.inner.renew_lease(key, from, to).await
    }

    async fn respread_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
        moves: &[Option<sluice::store::Commute>],
    ) -> Result<bool, StoreError> {
        self.step().await;
        self.inner.respread_buckets(expected, rows, moves).await
    }
    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError> {
        self.step().await;
        self.inner.put_bucket(state, expected).await
    }

    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError> {
        self.step().await;
        self.inner.list_buckets().await
    }

    async fn delete_bucket(&self, dimension: &Dimension) -> Result<bool, StoreError> {
        self.step().await;
        self.inner.delete_bucket(dimension).await
    }
}

async fn client_with(bucket: Bucket) -> (Sluice, GatedStore, &'static str) {
    let store = GatedStore::default();
    let sluice = Sluice::builder()
        .store(store.clone())
        .clock(ManualClock::new(UnixMillis::from_secs(1_700_000_000)))
        .build()
        .unwrap();
    let dim = "gated#rpm";
    sluice.put_bucket(dim, bucket).await.unwrap();
    (sluice, store, dim)
}

fn ten() -> Bucket {
    Bucket::requests(RefillRate::per_minute(1)).with_capacity(10)
}

/// Lets spawned tasks run until they wait on something.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

async fn tokens(sluice: &Sluice, dim: &str) -> Tokens {
    sluice.bucket(dim).await.unwrap().unwrap().tokens
}

#[tokio::test]
async fn a_queued_acquire_dropped_by_its_caller_is_never_granted() {
    for bucket in [ten(), ten().lean()] {
        let (sluice, store, dim) = client_with(bucket).await;
        store.close();
        let first = tokio::spawn({
            let sluice = sluice.clone();
            async move { sluice.acquire(dim).await }
        });
        store.held(1).await;
        // Queued behind the write in flight, then cancelled.
        let cancelled = tokio::spawn({
            let sluice = sluice.clone();
            async move { sluice.acquire(dim).await }
        });
        settle().await;
        cancelled.abort();
        settle().await;
        store.open();
        first.await.unwrap().unwrap().release().await.unwrap();
        sluice.acquire(dim).await.unwrap().release().await.unwrap();
        settle().await;
        assert_eq!(
            tokens(&sluice, dim).await,
            Tokens::new(8),
            "two grants, not three"
        );
        assert!(
            sluice
                .leases(&LeaseFilter::default())
                .await
                .unwrap()
                .is_empty()
        );
    }
}

#[tokio::test]
async fn an_acquire_dropped_while_its_write_is_in_flight_gives_its_grant_back() {
    for (bucket, full) in [
        (ten(), Tokens::new(10)),
        (ten().lean(), Tokens::new(10)),
        (Bucket::concurrent(3), Tokens::new(3)),
    ] {
        let (sluice, store, dim) = client_with(bucket).await;
        store.close();
        let dropped = tokio::spawn({
            let sluice = sluice.clone();
            async move { sluice.acquire(dim).await }
        });
        // The grant is written; its answer has not reached the caller, who goes away.
        store.held(1).await;
        dropped.abort();
        settle().await;
        store.open();
        settle().await;
        assert_eq!(tokens(&sluice, dim).await, full, "the grant was given back");
        assert!(
            sluice
                .leases(&LeaseFilter::default())
                .await
                .unwrap()
                .is_empty(),
            "no lease row left behind"
        );
    }
}

#[tokio::test]
async fn a_caller_behind_many_dropped_acquires_is_answered() {
    let (sluice, store, dim) =
        client_with(Bucket::requests(RefillRate::per_minute(1)).with_capacity(500)).await;
    store.close();
    let first = tokio::spawn({
        let sluice = sluice.clone();
        async move { sluice.acquire(dim).await }
    });
    store.held(1).await;
    let dropped: Vec<_> = (0..100)
        .map(|_| {
            let sluice = sluice.clone();
            tokio::spawn(async move { sluice.acquire(dim).await })
        })
        .collect();
    settle().await;
    let last = tokio::spawn({
        let sluice = sluice.clone();
        async move { sluice.acquire(dim).await }
    });
    settle().await;
    for task in &dropped {
        task.abort();
    }
    settle().await;
    store.open();
    first.await.unwrap().unwrap().release().await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(10), last)
        .await
        .expect("the live caller is answered")
        .unwrap()
        .unwrap();
    lease.release().await.unwrap();
    settle().await;
    assert_eq!(tokens(&sluice, dim).await, Tokens::new(498));
}

#[tokio::test]
async fn a_release_dropped_by_its_caller_still_happens() {
    let (sluice, store, dim) = client_with(Bucket::concurrent(3)).await;
    let lease = sluice.acquire(dim).await.unwrap();
    let key = lease.id().keys()[0].clone();
    store.close();
    let writing = tokio::spawn({
        let sluice = sluice.clone();
        async move { sluice.acquire(dim).await }
    });
    store.held(1).await;
    // Queued behind the write in flight, then its caller goes away (a timeout around a
    // slot, a cancelled request).
    let releasing = tokio::spawn(lease.release());
    settle().await;
    releasing.abort();
    settle().await;
    store.open();
    let other = writing.await.unwrap().unwrap();
    settle().await;
    assert!(
        store.read_leases(&[key]).await.unwrap()[0].is_none(),
        "the lease row was deleted"
    );
    assert_eq!(
        tokens(&sluice, dim).await,
        Tokens::new(2),
        "its slot came back"
    );
    other.release().await.unwrap();
    assert_eq!(tokens(&sluice, dim).await, Tokens::new(3));
}

/// A sharded acquire dropped at each of its await points (every store call pending once)
/// takes nothing: the bucket's rows together hold what they held, whatever the point.
#[tokio::test]
async fn a_sharded_acquire_dropped_at_every_await_point_takes_nothing() {
    let (sluice, store, dim) =
        client_with(Bucket::requests(RefillRate::per_minute(1)).with_capacity(40)).await;
    sluice.reshard(dim, 4).await.unwrap();
    let whole = async || {
        let rows = sluice.buckets().await.unwrap();
        rows.iter()
            .filter(|r| r.dimension.as_str().starts_with(dim))
            .fold(Tokens::ZERO, |sum, r| sum.saturating_add(r.tokens))
    };
    let full = whole().await;
    store.stepping.store(true, Ordering::SeqCst);
    let mut points = 0;
    loop {
        let mut acquire = Box::pin(sluice.acquire(dim));
        let mut answered = None;
        for _ in 0..points {
            if let std::task::Poll::Ready(answer) = futures::poll!(acquire.as_mut()) {
                answered = Some(answer);
                break;
            }
        }
        if let Some(answer) = answered {
            drop(answer.unwrap());
            assert_eq!(whole().await, full.saturating_sub(Tokens::new(1)));
            break;
        }
        drop(acquire);
        settle().await;
        assert_eq!(whole().await, full, "dropped after {points} polls");
        points += 1;
        assert!(points < 100, "the acquire never answered");
    }
    assert!(points > 1, "{points} await points");
    // Whichever row a grant came from, its lease names the bucket and what it holds there.
    store.stepping.store(false, Ordering::SeqCst);
    for _ in 0..20 {
        let lease = sluice.acquire(dim).await.unwrap();
        let named: Vec<String> = lease.dimensions().map(|d| d.to_string()).collect();
        assert_eq!(named, [dim]);
        assert_eq!(lease.cost(dim), Some(Tokens::new(1)));
    }
}
