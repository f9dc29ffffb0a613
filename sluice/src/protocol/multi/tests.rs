use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::*;
use crate::Sluice;
use crate::acquire::Acquire;
use crate::bucket::{Bucket, TokensOp};
use crate::clock::ManualClock;
use crate::dimension::Dimension;
use crate::rate::RefillRate;
use crate::shared::test_store::{Hooked, Hooks, client};
use crate::store::{BucketChange, ChangeError, LeaseKey, MemoryStore, Store, StoreError};
use crate::tokens::Tokens;

/// A manual clock at the tests' start.
fn clock() -> ManualClock {
    ManualClock::new(UnixMillis::from_secs(1_700_000_000))
}

/// A `requests` bucket of `capacity`, refilling `per_second`.
fn per_second(per_second: u64, capacity: i64) -> Bucket {
    Bucket::requests(RefillRate::per_second(per_second)).with_capacity(capacity)
}

/// Puts `bucket` on `dim`.
async fn define(sluice: &Sluice, dim: &str, bucket: Bucket) {
    sluice.put_bucket(dim, bucket).await.unwrap();
}

/// Takes one call on `dim` and releases it.
async fn take_one(sluice: &Sluice, dim: &str) {
    sluice.acquire(dim).await.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn a_waiting_callers_pair_takes_no_other_dimensions_window_from_before_its_wait() {
    let clock = clock();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let sluice = client(store.clone(), &clock);
    let slow = Bucket::requests(RefillRate::new(1, Duration::from_secs(10))).with_capacity(1);
    define(&sluice, "pair#a", per_second(1, 1)).await;
    define(&sluice, "pair#b", slow.clone()).await;
    // This client empties b: its own write opens a 10 s window on b.
    take_one(&sluice, "pair#b").await;
    // Elsewhere b is created again, full: this client has not seen it.
    let other = client(store, &clock);
    other.delete_bucket("pair#b").await.unwrap();
    define(&other, "pair#b", slow).await;
    take_one(&sluice, "pair#a").await;
    clock.advance(Duration::from_millis(1));
    // A waiting caller's retry, its wait begun now: a is short for 999 ms; b's window
    // is from before the wait and must not lengthen the answer to 10 s.
    let waited_from = sluice.now();
    let answer = sluice
        .acquire_after(
            &Acquire::new("pair#a").and("pair#b"),
            Some(waited_from),
            Duration::ZERO,
        )
        .await
        .unwrap_err();
    assert_eq!(answer.retry_in(), Some(Duration::from_millis(999)));
}

/// Hooks that, on the changes of one dimension, move the clock on while the store writes a
/// give-back (`slow`: the change that follows the end of one of its lease rows, or adds to
/// its tokens), or refuse the first `throttles` with a throttle (`pressed`); they count the
/// changes of each dimension.
#[derive(Debug, Default)]
struct Pressed {
    clock: Option<ManualClock>,
    slow: Option<Dimension>,
    ended: AtomicBool,
    pressed: Option<Dimension>,
    throttles: AtomicU32,
    changes: std::sync::Mutex<Vec<Dimension>>,
}

impl Pressed {
    /// How many changes of `dim` reached the store.
    fn changes_of(&self, dim: &str) -> usize {
        let changes = self.changes.lock().unwrap();
        changes.iter().filter(|d| d.as_str() == dim).count()
    }
}

impl Hooks for Pressed {
    fn change(&self, change: &BucketChange) -> Result<(), ChangeError> {
        self.changes.lock().unwrap().push(change.dimension.clone());
        let refuse = self.pressed.as_ref() == Some(&change.dimension)
            && self
                .throttles
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok();
        if refuse {
            return Err(ChangeError::Store(StoreError::Throttled { source: None }));
        }
        // A give-back adds to the tokens, or fills the bucket (its lease row, not yet
        // written, never will be).
        let adds = match change.commute.tokens {
            TokensOp::Add(t) => t > Tokens::ZERO,
            TokensOp::Set(t) => t >= change.bucket.capacity(),
        };
        if self.slow.as_ref() == Some(&change.dimension)
            && (self.ended.swap(false, Ordering::Relaxed) || adds)
            && let Some(clock) = &self.clock
        {
            clock.advance(Duration::from_millis(400));
        }
        Ok(())
    }

    fn end_lease(&self, key: &LeaseKey) {
        if self.slow.is_some() && key.dimension() == self.slow {
            self.ended.store(true, Ordering::Relaxed);
        }
    }
}

#[tokio::test]
async fn a_pairs_retry_in_counts_down_while_the_give_back_is_written() {
    let clock = clock();
    let store = Arc::new(Hooked::new(Pressed {
        clock: Some(clock.clone()),
        slow: Some("pair#a".parse().unwrap()),
        ..Pressed::default()
    }));
    let sluice = client(store.clone(), &clock);
    define(&sluice, "pair#a", per_second(100, 100)).await;
    define(&sluice, "pair#b", per_second(1, 1)).await;
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
    let a = sluice.bucket("pair#a").await.unwrap().unwrap();
    assert_eq!(a.available(sluice.now()), Tokens::new(100));
}

/// A client of a store that counts the changes of each dimension, with `pair#a` (a
/// hundred calls a second) and `pair#z` (one): this client saw z with a call to spare,
/// another client took it.
async fn scarce_z_taken_elsewhere() -> (Arc<Hooked<Pressed>>, Sluice, crate::Lease) {
    let clock = clock();
    let store = Arc::new(Hooked::new(Pressed::default()));
    let sluice = client(store.clone(), &clock);
    define(&sluice, "pair#a", per_second(100, 100)).await;
    define(&sluice, "pair#z", per_second(1, 2)).await;
    take_one(&sluice, "pair#a").await;
    take_one(&sluice, "pair#z").await;
    let other = client(store.clone(), &clock);
    let held = other.acquire("pair#z").await.unwrap();
    (store, sluice, held)
}

#[tokio::test]
async fn a_waiting_caller_takes_the_scarcest_dimension_first_though_none_was_seen_short() {
    let (store, sluice, _held) = scarce_z_taken_elsewhere().await;
    let before = store.hooks.changes_of("pair#a");
    // z is the bottleneck, whatever the names: a waiter takes it first, alone.
    let answer = sluice
        .acquire_within(
            Acquire::new("pair#a").and("pair#z"),
            Duration::from_millis(500),
        )
        .await
        .unwrap_err();
    assert_eq!(answer.retry_in(), Some(Duration::from_secs(1)));
    assert_eq!(
        store.hooks.changes_of("pair#a") - before,
        0,
        "the ample dimension is not taken (and held, then given back) for a waiter z refuses"
    );
}

#[tokio::test]
async fn a_caller_that_does_not_wait_takes_what_its_memory_allows_together() {
    let (store, sluice, _held) = scarce_z_taken_elsewhere().await;
    let before = store.hooks.changes_of("pair#a");
    // One round of writes: a is taken beside z, and given back when z refuses.
    let answer = sluice
        .acquire(Acquire::new("pair#a").and("pair#z"))
        .await
        .unwrap_err();
    assert_eq!(answer.retry_in(), Some(Duration::from_secs(1)));
    assert_eq!(store.hooks.changes_of("pair#a") - before, 2);
}

/// A client on a store that refuses the first `throttles` changes of `pair#tpm`, with the
/// buckets `pair#rpm` and `pair#tpm`.
async fn throttled_pair(throttles: u32) -> (Arc<Hooked<Pressed>>, Sluice) {
    let store = Arc::new(Hooked::new(Pressed {
        pressed: Some("pair#tpm".parse().unwrap()),
        throttles: AtomicU32::new(throttles),
        ..Pressed::default()
    }));
    let sluice = client(store.clone(), &clock());
    let rpm = Bucket::requests(RefillRate::per_minute(600));
    define(&sluice, "pair#rpm", rpm).await;
    define(
        &sluice,
        "pair#tpm",
        Bucket::tokens(RefillRate::per_minute(60_000)),
    )
    .await;
    (store, sluice)
}

/// One request on `pair#rpm` with 100 tokens on `pair#tpm`.
fn pair() -> Acquire {
    Acquire::new("pair#rpm").and_cost("pair#tpm", 100)
}

#[tokio::test(start_paused = true)]
async fn a_dimension_throttled_while_another_is_held_is_asked_again_not_given_back() {
    let (store, sluice) = throttled_pair(2).await;
    let lease = sluice
        .acquire(pair())
        .await
        .expect("granted once the throttles pass");
    let (rpm, tpm) = (
        store.hooks.changes_of("pair#rpm"),
        store.hooks.changes_of("pair#tpm"),
    );
    let changes = store.hooks.changes.lock().unwrap().clone();
    assert_eq!((rpm, tpm), (1, 3), "rpm taken once and held: {changes:?}");
    assert_eq!(lease.cost("pair#tpm"), Some(Tokens::new(100)));
    lease.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_dimension_throttled_past_the_retries_gives_back_what_was_held() {
    let (store, sluice) = throttled_pair(u32::MAX).await;
    let before = sluice.snapshot("pair#rpm").await.unwrap().available;
    let answer = sluice.acquire(pair()).await.unwrap_err();
    assert!(answer.retry_in().is_some(), "{answer:?}");
    let tpm = store.hooks.changes_of("pair#tpm");
    assert_eq!(tpm as u32, 1 + BACK_PRESSURE_RETRIES);
    // rpm was given back: a request is not consumed by a refused pair.
    assert_eq!(sluice.snapshot("pair#rpm").await.unwrap().available, before);
}
