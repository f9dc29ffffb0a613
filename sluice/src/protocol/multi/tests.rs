use std::sync::Arc;

use super::*;
use crate::Sluice;
use crate::acquire::Acquire;
use crate::bucket::{Bucket, BucketState};
use crate::clock::ManualClock;
use crate::dimension::Dimension;
use crate::rate::RefillRate;
use crate::store::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    MemoryStore, Store, StoreError,
};

fn client(store: Arc<dyn Store>, clock: &ManualClock) -> Sluice {
    Sluice::builder()
        .store_arc(store)
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_waiting_callers_pair_takes_no_other_dimensions_window_from_before_its_wait() {
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let sluice = client(store.clone(), &clock);
    let slow = Bucket::requests(RefillRate::new(1, Duration::from_secs(10))).with_capacity(1);
    sluice
        .put_bucket(
            "pair#a",
            Bucket::requests(RefillRate::per_second(1)).with_capacity(1),
        )
        .await
        .unwrap();
    sluice.put_bucket("pair#b", slow.clone()).await.unwrap();
    // This client empties b: its own write opens a 10 s window on b.
    sluice
        .acquire("pair#b")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Elsewhere b is created again, full: this client has not seen it.
    let other = client(store, &clock);
    other.delete_bucket("pair#b").await.unwrap();
    other.put_bucket("pair#b", slow).await.unwrap();
    sluice
        .acquire("pair#a")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    clock.advance(Duration::from_millis(1));
    // A waiting caller's retry, its wait begun now: a is short for 999 ms; b's window
    // is from before the wait and must not lengthen the answer to 10 s.
    let waited_from = sluice.now();
    let answer = sluice
        .acquire_after(&Acquire::new("pair#a").and("pair#b"), Some(waited_from))
        .await
        .unwrap_err();
    assert_eq!(answer.retry_in(), Some(Duration::from_millis(999)));
}

/// A store that, on the changes of one dimension, moves its clock on while it writes a
/// give-back (`slow`: the change that follows the end of one of its lease rows, or adds to
/// its tokens), or refuses the first `throttles` with a throttle (`pressed`); it counts the
/// changes of each dimension.
#[derive(Debug, Default)]
struct Pressed {
    inner: MemoryStore,
    clock: Option<ManualClock>,
    slow: Option<Dimension>,
    ended: std::sync::atomic::AtomicBool,
    pressed: Option<Dimension>,
    throttles: std::sync::atomic::AtomicU32,
    changes: std::sync::Mutex<Vec<Dimension>>,
}

#[async_trait::async_trait]
impl Store for Pressed {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        self.inner.read_buckets(dimensions).await
    }
    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        self.inner.commit(commit).await
    }
    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        self.changes.lock().unwrap().push(change.dimension.clone());
        let refuse = self.pressed.as_ref() == Some(&change.dimension)
            && self
                .throttles
                .fetch_update(
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                    |n| n.checked_sub(1),
                )
                .is_ok();
        if refuse {
            return Err(ChangeError::Store(StoreError::Throttled { source: None }));
        }
        // A give-back adds to the tokens, or fills the bucket (its lease row, not yet
        // written, never will be).
        let adds = match change.commute.tokens {
            crate::bucket::TokensOp::Add(t) => t > crate::tokens::Tokens::ZERO,
            crate::bucket::TokensOp::Set(t) => t >= change.bucket.capacity(),
        };
        if self.slow.as_ref() == Some(&change.dimension)
            && (self.ended.swap(false, std::sync::atomic::Ordering::Relaxed) || adds)
            && let Some(clock) = &self.clock
        {
            clock.advance(Duration::from_millis(400));
        }
        self.inner.change(change).await
    }
    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        self.inner.put_leases(leases).await
    }
    async fn end_lease(&self, key: &LeaseKey) -> Result<bool, StoreError> {
        if self.slow.is_some() && key.dimension() == self.slow {
            self.ended.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.inner.end_lease(key).await
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
    async fn replace_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
    ) -> Result<bool, StoreError> {
        self.inner.replace_buckets(expected, rows).await
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

#[tokio::test]
async fn a_pairs_retry_in_counts_down_while_the_give_back_is_written() {
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let store = Arc::new(Pressed {
        clock: Some(clock.clone()),
        slow: Some("pair#a".parse().unwrap()),
        ..Pressed::default()
    });
    let sluice = client(store.clone(), &clock);
    sluice
        .put_bucket(
            "pair#a",
            Bucket::requests(RefillRate::per_second(100)).with_capacity(100),
        )
        .await
        .unwrap();
    sluice
        .put_bucket(
            "pair#b",
            Bucket::requests(RefillRate::per_second(1)).with_capacity(1),
        )
        .await
        .unwrap();
    // Another client empties b; this one has not seen it and takes a and b together.
    let other = client(store, &clock);
    let _held = other.acquire("pair#b").await.unwrap();
    let started = sluice.now();
    let answer = sluice
        .acquire(Acquire::new("pair#a").and("pair#b"))
        .await
        .unwrap_err();
    // b is back 1 s after it was found short; giving a back took 400 ms of that.
    assert!(sluice.now().saturating_since(started) >= Duration::from_millis(400));
    assert_eq!(answer.retry_in(), Some(Duration::from_millis(600)));
    assert_eq!(
        sluice
            .bucket("pair#a")
            .await
            .unwrap()
            .unwrap()
            .available(sluice.now()),
        crate::tokens::Tokens::new(100)
    );
}

fn throttling(throttles: u32) -> Arc<Pressed> {
    Arc::new(Pressed {
        pressed: Some("pair#tpm".parse().unwrap()),
        throttles: std::sync::atomic::AtomicU32::new(throttles),
        ..Pressed::default()
    })
}

async fn pair_buckets(sluice: &Sluice) {
    sluice
        .put_bucket("pair#rpm", Bucket::requests(RefillRate::per_minute(600)))
        .await
        .unwrap();
    sluice
        .put_bucket("pair#tpm", Bucket::tokens(RefillRate::per_minute(60_000)))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_dimension_throttled_while_another_is_held_is_asked_again_not_given_back() {
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let store = throttling(2);
    let sluice = client(store.clone(), &clock);
    pair_buckets(&sluice).await;
    let lease = sluice
        .acquire(Acquire::new("pair#rpm").and_cost("pair#tpm", 100))
        .await
        .expect("granted once the throttles pass");
    let changes = store.changes.lock().unwrap().clone();
    let rpm = changes.iter().filter(|d| d.as_str() == "pair#rpm").count();
    let tpm = changes.iter().filter(|d| d.as_str() == "pair#tpm").count();
    assert_eq!((rpm, tpm), (1, 3), "rpm taken once and held: {changes:?}");
    assert_eq!(
        lease.cost("pair#tpm"),
        Some(crate::tokens::Tokens::new(100))
    );
    lease.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_dimension_throttled_past_the_retries_gives_back_what_was_held() {
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let store = throttling(u32::MAX);
    let sluice = client(store.clone(), &clock);
    pair_buckets(&sluice).await;
    let before = sluice.snapshot("pair#rpm").await.unwrap().available;
    let answer = sluice
        .acquire(Acquire::new("pair#rpm").and_cost("pair#tpm", 100))
        .await
        .unwrap_err();
    assert!(answer.retry_in().is_some(), "{answer:?}");
    let tpm = store
        .changes
        .lock()
        .unwrap()
        .iter()
        .filter(|d| d.as_str() == "pair#tpm")
        .count();
    assert_eq!(tpm as u32, 1 + BACK_PRESSURE_RETRIES);
    // rpm was given back: a request is not consumed by a refused pair.
    assert_eq!(sluice.snapshot("pair#rpm").await.unwrap().available, before);
}
