use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use super::*;
use crate::bucket::{Bucket, BucketState, Mode};
use crate::clock::{ManualClock, UnixMillis};
use crate::config::FailurePolicy;
use crate::rate::RefillRate;
use crate::shared::test_store::{Hooked, Hooks, client};
use crate::store::{BucketChange, ChangeError, MemoryStore, Store, StoreError};
use crate::{Acquire, Sluice};

/// What the store does to every bucket change, as a test switches it (and, for `SPLIT`,
/// how many changes of `u#a` it throttled).
#[derive(Debug, Default)]
struct Switch(AtomicU8, std::sync::atomic::AtomicU32);

const APPLY: u8 = 0;
const THROTTLE: u8 = 1;
const HELD: u8 = 2;
const OUT: u8 = 3;
const SPLIT: u8 = 4;

impl Switch {
    fn set(&self, how: u8) {
        self.0.store(how, Ordering::SeqCst);
    }
}

impl Hooks for Switch {
    fn change(&self, change: &BucketChange) -> Result<(), ChangeError> {
        let error = match self.0.load(Ordering::SeqCst) {
            THROTTLE => StoreError::Throttled { source: None },
            HELD => StoreError::TransactionConflict { source: None },
            OUT => StoreError::Unavailable {
                message: "connection refused".into(),
                source: None,
            },
            // The row `u#a` throttled once, `u#b` refused outright.
            SPLIT
                if change.dimension.as_str() == "u#a"
                    && self.1.fetch_add(1, Ordering::SeqCst) == 0 =>
            {
                StoreError::Throttled { source: None }
            }
            SPLIT if change.dimension.as_str() == "u#b" => StoreError::Rejected {
                message: "not allowed".into(),
                source: None,
            },
            _ => return Ok(()),
        };
        Err(error.into())
    }
}

fn clock() -> ManualClock {
    ManualClock::new(UnixMillis::from_secs(1_700_000_000))
}

/// A bucket of one call that refills one a minute.
fn one_a_minute() -> Bucket {
    Bucket::requests(RefillRate::new(1, Duration::from_secs(60))).with_capacity(1)
}

fn builder(store: &Arc<Hooked<Switch>>, clock: &ManualClock) -> crate::SluiceBuilder {
    let store: Arc<dyn Store> = store.clone();
    Sluice::builder().store_arc(store).clock(clock.clone())
}

/// `n` acquires of `dim` by `sluice`: how many were granted.
async fn granted(sluice: &Sluice, dim: &str, n: usize) -> usize {
    let mut granted = 0;
    for _ in 0..n {
        match sluice.acquire(dim).await {
            Ok(lease) => {
                granted += 1;
                lease.release().await.unwrap();
            }
            Err(Error::RetryIn(_) | Error::Store(_)) => {}
            Err(other) => panic!("{other:?}"),
        }
    }
    granted
}

#[tokio::test]
async fn a_shadow_take_the_store_pushes_back_is_granted_unrecorded() {
    let clock = clock();
    for how in [THROTTLE, HELD] {
        let store = Arc::new(Hooked::new(Switch::default()));
        let enforcing = builder(&store, &clock).build().unwrap();
        let shadow = builder(&store, &clock).mode(Mode::Shadow).build().unwrap();
        enforcing.put_bucket("t#rpm", one_a_minute()).await.unwrap();
        enforcing
            .put_bucket("s#rpm", one_a_minute().with_mode(Mode::Shadow))
            .await
            .unwrap();
        // Each client learns both rows while the store answers.
        assert_eq!(granted(&shadow, "t#rpm", 1).await, 1);
        assert_eq!(granted(&enforcing, "s#rpm", 1).await, 1);
        store.hooks.set(how);
        // An enforcing take hears the back-pressure.
        match enforcing.acquire("t#rpm").await {
            Err(Error::RetryIn(refusal)) => assert!(refusal.short.is_empty(), "{refusal:?}"),
            other => panic!("{how}: {other:?}"),
        }
        // A client in shadow, and a bucket in shadow, never refuse: granted unrecorded.
        assert_eq!(granted(&shadow, "t#rpm", 4).await, 4, "{how}");
        assert_eq!(granted(&enforcing, "s#rpm", 4).await, 4, "{how}");
        let both = Acquire::new("s#rpm").and("s#rpm");
        assert!(shadow.acquire(both).await.is_ok(), "{how}");
        // Nothing was written while the store pushed back.
        assert_eq!(row(&store.inner, "s#rpm").await.shadow.refused, 0, "{how}");
    }
}

#[tokio::test]
async fn the_open_policy_never_refuses_a_shadow_take_while_the_store_is_out() {
    let clock = clock();
    let store = Arc::new(Hooked::new(Switch::default()));
    let open = FailurePolicy::Open { percent: 10 };
    let enforcing = builder(&store, &clock)
        .failure_policy(open)
        .build()
        .unwrap();
    let shadow = builder(&store, &clock)
        .failure_policy(open)
        .mode(Mode::Shadow)
        .build()
        .unwrap();
    enforcing
        .put_bucket("o#rpm", Bucket::requests(RefillRate::per_minute(10)))
        .await
        .unwrap();
    assert_eq!(granted(&enforcing, "o#rpm", 1).await, 1);
    assert_eq!(granted(&shadow, "o#rpm", 1).await, 1);
    store.hooks.set(OUT);
    // The local bucket holds a tenth of ten, one call at most: refusals.
    assert!(granted(&enforcing, "o#rpm", 5).await <= 1);
    assert_eq!(granted(&shadow, "o#rpm", 5).await, 5);
    // With the store back, nothing was recorded of the outage.
    store.hooks.set(APPLY);
    assert_eq!(row(&store.inner, "o#rpm").await.shadow.refused, 0);
}

/// The row of `dim` in `store`.
async fn row(store: &MemoryStore, dim: &str) -> BucketState {
    let dim: crate::dimension::Dimension = dim.parse().unwrap();
    let mut rows = store
        .read_buckets(std::slice::from_ref(&dim))
        .await
        .unwrap();
    rows.pop().flatten().unwrap()
}

#[tokio::test]
async fn a_shadow_dimension_is_not_taken_for_a_request_another_refuses() {
    let clock = clock();
    let store = Arc::new(MemoryStore::new());
    let sluice = client(store.clone(), &clock);
    let other = client(store.clone(), &clock);
    sluice
        .put_bucket("m#shadow", one_a_minute().with_mode(Mode::Shadow))
        .await
        .unwrap();
    sluice
        .put_bucket("m#enforce", one_a_minute())
        .await
        .unwrap();
    assert_eq!(granted(&sluice, "m#enforce", 1).await, 1);
    clock.advance(Duration::from_secs(60));
    // The enforcing bucket is emptied by another client: this one remembers it full.
    let _theirs = other.acquire("m#enforce").await.unwrap();
    // The shadow bucket is empty: a take from it now is one an enforcing bucket refuses.
    assert_eq!(granted(&sluice, "m#shadow", 1).await, 1);
    let before = row(&store, "m#shadow").await;
    let both = Acquire::new("m#shadow").and("m#enforce");
    match sluice.acquire(both.clone()).await {
        Err(Error::RetryIn(refusal)) => {
            assert!(refusal.delay_of("m#enforce").is_some(), "{refusal:?}");
        }
        other => panic!("{other:?}"),
    }
    // The shadow row is as it was: no take given back, no refusal counted for a call
    // that was never made.
    let after = row(&store, "m#shadow").await;
    assert_eq!(after.tokens, before.tokens);
    assert_eq!(after.shadow, before.shadow);
    // Once the enforcing bucket serves, the request is granted whole, and the shadow row
    // counts the take an enforcing bucket would have refused.
    clock.advance(Duration::from_secs(60));
    assert_eq!(granted(&sluice, "m#shadow", 1).await, 1);
    let lease = sluice.acquire(both).await.unwrap();
    assert_eq!(lease.dimensions().count(), 2);
    assert_eq!(row(&store, "m#shadow").await.shadow.refused, 1);
}

#[tokio::test]
async fn a_shadow_grant_nothing_recorded_is_never_given_back() {
    let clock = clock();
    let store = Arc::new(Hooked::new(Switch::default()));
    let shadow = builder(&store, &clock).mode(Mode::Shadow).build().unwrap();
    let ten = Bucket::requests(RefillRate::per_minute(10));
    for dim in ["u#a", "u#b"] {
        shadow.put_bucket(dim, ten.clone()).await.unwrap();
        // Learned, and below full.
        assert_eq!(granted(&shadow, dim, 1).await, 1);
    }
    let before = row(&store.inner, "u#a").await.tokens;
    store.hooks.set(SPLIT);
    // `u#a` is granted unrecorded (throttled); `u#b` fails with an error no shadow grant
    // answers, so the request fails and what it holds is given back: nothing, for `u#a`
    // (the store would take a give-back of it now).
    match shadow.acquire(Acquire::new("u#a").and("u#b")).await {
        Err(Error::Store(StoreError::Rejected { .. })) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(store.hooks.1.load(Ordering::SeqCst), 1);
    assert_eq!(row(&store.inner, "u#a").await.tokens, before);
}
