//! The failure policy: what acquires do while the store cannot answer. `closed` (the
//! default) fails with the store's typed error; `open` grants from a local bucket at a
//! share of the shared bucket's capacity and rate, never for `concurrent` buckets nor for
//! buckets the client has not seen, and goes back to the store once it answers.
//!
//! The store is the in-memory one behind a switch that makes every call time out, and the
//! client's clock is a manual one: no test waits.

use crate::faults;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sluice::{
    Acquire, Bucket, Error, FailurePolicy, RefillRate, Sluice, Tokens, clock::ManualClock,
    clock::UnixMillis,
};

use faults::Switch;
use sluice::store::StoreError;

struct Setup {
    sluice: Sluice,
    store: Arc<Switch>,
    clock: ManualClock,
}

/// A client with `policy` on a switchable store holding `openai#rpm` (100 per second,
/// capacity 100), `openai#tpm` (10,000 per second) and `eleven#concurrent` (2 slots), all
/// seen once by the client while the store answered.
async fn setup(policy: FailurePolicy) -> Setup {
    let store = Arc::new(Switch::default());
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let sluice = Sluice::builder()
        .store_arc(store.clone())
        .clock(clock.clone())
        .failure_policy(policy)
        .build()
        .unwrap();
    let buckets = [
        ("openai#rpm", Bucket::requests(RefillRate::per_second(100))),
        ("openai#tpm", Bucket::tokens(RefillRate::per_second(10_000))),
        ("eleven#concurrent", Bucket::concurrent(2)),
    ];
    for (dimension, bucket) in buckets {
        sluice.put_bucket(dimension, bucket).await.unwrap();
        sluice
            .acquire(dimension)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    Setup {
        sluice,
        store,
        clock,
    }
}

const OPEN_10: FailurePolicy = FailurePolicy::Open { percent: 10 };

#[tokio::test]
async fn closed_fails_with_the_stores_error() {
    let s = setup(FailurePolicy::default()).await;
    s.store.down.store(true, Ordering::SeqCst);
    let e = s.sluice.acquire("openai#rpm").await.unwrap_err();
    assert!(
        matches!(e, Error::Store(StoreError::Timeout { .. })),
        "{e:?}"
    );
}

#[tokio::test]
async fn open_grants_from_an_empty_local_bucket_at_its_share_with_exact_retry_in() {
    let s = setup(OPEN_10).await;
    s.store.down.store(true, Ordering::SeqCst);
    // The outage begins: the local bucket starts empty and refills at 10 per second.
    let e = s.sluice.acquire("openai#rpm").await.unwrap_err();
    let Error::RetryIn(sluice::RetryIn { delay: wait, .. }) = e else {
        panic!("expected a RetryIn from the local bucket, got {e:?}");
    };
    assert_eq!(wait, Duration::from_millis(100));
    // One millisecond early is refused; on time is granted, with no store call.
    s.clock.advance(Duration::from_millis(99));
    assert!(matches!(
        s.sluice.acquire("openai#rpm").await,
        Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) if d == Duration::from_millis(1)
    ));
    s.clock.advance(Duration::from_millis(1));
    let lease = s.sluice.acquire("openai#rpm").await.unwrap();
    assert_eq!(lease.attempts(), 0, "granted locally");
    lease.release().await.unwrap();
    // Over the next 10 s: at most the local capacity (10) plus 10 per second, and nearly
    // all of it when asked every 5 ms.
    let mut granted = 0u64;
    for _ in 0..2_000 {
        s.clock.advance(Duration::from_millis(5));
        match s.sluice.acquire("openai#rpm").await {
            Ok(lease) => {
                granted += 1;
                lease.release().await.unwrap();
            }
            Err(Error::RetryIn(_)) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(
        (99..=100).contains(&granted),
        "{granted} local grants in 10 s"
    );
    // The store was asked about once a second (the first failure, then one probe a
    // second), not on every acquire.
    let calls = s.store.calls_while_down.load(Ordering::SeqCst);
    assert!((10..=13).contains(&calls), "{calls} store calls while down");
}

#[tokio::test]
async fn open_ends_when_the_store_answers_again_and_never_touched_the_shared_bucket() {
    let s = setup(OPEN_10).await;
    let before = s.sluice.bucket("openai#rpm").await.unwrap().unwrap();
    s.store.down.store(true, Ordering::SeqCst);
    s.sluice.acquire("openai#rpm").await.unwrap_err();
    s.clock.advance(Duration::from_millis(500));
    let local = s.sluice.acquire("openai#rpm").await.unwrap();
    assert_eq!(local.attempts(), 0);
    // Adjusting a local grant charges the local bucket only.
    let mut local = local;
    local.adjust("openai#rpm", 3).await.unwrap();
    local.release().await.unwrap();
    s.store.down.store(false, Ordering::SeqCst);
    let during = s.sluice.bucket("openai#rpm").await.unwrap().unwrap();
    assert_eq!(during.version, before.version, "no write while down");
    // Within a second, an acquire asks the store again, and from then on the shared
    // bucket grants.
    s.clock.advance(Duration::from_secs(1));
    let shared = s.sluice.acquire("openai#rpm").await.unwrap();
    assert!(shared.attempts() >= 1, "granted by the store");
    shared.release().await.unwrap();
    let after = s.sluice.bucket("openai#rpm").await.unwrap().unwrap();
    assert!(after.version > before.version);
}

#[tokio::test]
async fn concurrent_and_unseen_buckets_and_closed_dimensions_stay_closed() {
    let store = Arc::new(Switch::default());
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let sluice = Sluice::builder()
        .store_arc(store.clone())
        .clock(clock.clone())
        .failure_policy(OPEN_10)
        .failure_policy_for("openai#tpm".parse().unwrap(), FailurePolicy::Closed)
        .build()
        .unwrap();
    for (dimension, bucket) in [
        ("openai#rpm", Bucket::requests(RefillRate::per_second(100))),
        ("openai#tpm", Bucket::tokens(RefillRate::per_second(10_000))),
        ("eleven#concurrent", Bucket::concurrent(2)),
        ("unseen#rpm", Bucket::requests(RefillRate::per_second(100))),
    ] {
        sluice.put_bucket(dimension, bucket).await.unwrap();
    }
    for dimension in ["openai#rpm", "openai#tpm", "eleven#concurrent"] {
        sluice
            .acquire(dimension)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    store.down.store(true, Ordering::SeqCst);
    clock.advance(Duration::from_secs(1));
    let is_timeout = |r: Result<sluice::Lease, Error>| {
        matches!(r, Err(Error::Store(StoreError::Timeout { .. })))
    };
    // A slot granted locally could be one another process holds.
    assert!(is_timeout(sluice.acquire("eleven#concurrent").await));
    // Its definition was never seen.
    assert!(is_timeout(sluice.acquire("unseen#rpm").await));
    // Closed for this dimension, alone or with an open one.
    assert!(is_timeout(sluice.acquire("openai#tpm").await));
    let pair = Acquire::new("openai#rpm").and_cost("openai#tpm", 100);
    assert!(is_timeout(sluice.acquire(pair).await));
    // The open one alone is granted from its local bucket (empty when the outage began).
    assert!(matches!(
        sluice.acquire("openai#rpm").await,
        Err(Error::RetryIn(_))
    ));
    clock.advance(Duration::from_millis(100));
    assert_eq!(sluice.acquire("openai#rpm").await.unwrap().attempts(), 0);
}

#[tokio::test]
async fn a_pair_fails_open_all_or_nothing() {
    let store = Arc::new(Switch::default());
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let sluice = Sluice::builder()
        .store_arc(store.clone())
        .clock(clock.clone())
        .failure_policy(FailurePolicy::Open { percent: 50 })
        .build()
        .unwrap();
    sluice
        .put_bucket("openai#rpm", Bucket::requests(RefillRate::per_second(100)))
        .await
        .unwrap();
    sluice
        .put_bucket("openai#tpm", Bucket::tokens(RefillRate::per_second(1_000)))
        .await
        .unwrap();
    let pair = || Acquire::new("openai#rpm").and_cost("openai#tpm", 400);
    sluice
        .acquire(pair())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    store.down.store(true, Ordering::SeqCst);
    sluice.acquire(pair()).await.unwrap_err();
    // 500 tokens per second locally: 400 after 800 ms; rpm has plenty by then.
    clock.advance(Duration::from_millis(799));
    assert!(matches!(
        sluice.acquire(pair()).await,
        Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) if d == Duration::from_millis(1)
    ));
    clock.advance(Duration::from_millis(1));
    let lease = sluice.acquire(pair()).await.unwrap();
    assert_eq!(lease.cost("openai#tpm"), Some(Tokens::new(400)));
    assert_eq!(lease.cost("openai#rpm"), Some(Tokens::new(1)));
}

#[tokio::test]
async fn open_keeps_each_priority_s_share_of_the_reserves_in_the_local_bucket() {
    let s = setup(OPEN_10).await;
    // 100 per second and 6,000 held; 3,000 kept for `interactive`: locally 10 per second,
    // 600 held, 300 kept.
    let reserved = Bucket::requests(RefillRate::per_second(100))
        .with_reserve("interactive".parse().unwrap(), 3_000);
    s.sluice.put_bucket("openai#rpm", reserved).await.unwrap();
    // The local bucket follows the definition the last grant saw.
    let seen = s.sluice.acquire("openai#rpm").await.unwrap();
    seen.release().await.unwrap();
    s.store.down.store(true, Ordering::SeqCst);
    let at = |p: &str| Acquire::with_cost("openai#rpm", 10).priority(p.parse().unwrap());
    // Empty: `interactive` waits for 10, `batch` for 10 above the 300 kept.
    assert_eq!(
        s.sluice
            .acquire(at("interactive"))
            .await
            .unwrap_err()
            .retry_in(),
        Some(Duration::from_secs(1))
    );
    assert_eq!(
        s.sluice.acquire(at("batch")).await.unwrap_err().retry_in(),
        Some(Duration::from_secs(31))
    );
    s.clock.advance(Duration::from_secs(31));
    s.sluice
        .acquire(at("batch"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // 300 left locally, all kept: `batch` waits again, `interactive` takes from them.
    assert!(s.sluice.acquire(at("batch")).await.is_err());
    s.sluice
        .acquire(at("interactive"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn open_on_a_spread_bucket_keeps_a_share_of_the_whole_not_of_one_row() {
    let s = setup(OPEN_10).await;
    // openai#rpm (100 per second) over 4 rows of 25 per second: the share is of the 100.
    s.sluice.reshard("openai#rpm", 4).await.unwrap();
    s.sluice
        .acquire("openai#rpm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    s.store.down.store(true, Ordering::SeqCst);
    let e = s.sluice.acquire("openai#rpm").await.unwrap_err();
    assert!(
        matches!(e, Error::RetryIn(sluice::RetryIn { delay: d, .. }) if d == Duration::from_millis(100)),
        "10 per second locally, as for the bucket in one row: {e:?}"
    );
    s.clock.advance(Duration::from_millis(100));
    let lease = s.sluice.acquire("openai#rpm").await.unwrap();
    assert_eq!(lease.attempts(), 0, "granted locally");
}

/// Shadow mode never fails a call: while the store cannot answer, an acquire whose buckets
/// are all in shadow (or of a client in shadow) is granted without a write; one that also
/// names an enforcing bucket fails as that bucket's policy says.
#[tokio::test]
async fn shadow_mode_grants_without_a_write_while_the_store_cannot_answer() {
    let s = setup(FailurePolicy::default()).await;
    let trial = Bucket::requests(RefillRate::per_second(1))
        .with_capacity(1)
        .with_mode(sluice::Mode::Shadow);
    s.sluice.put_bucket("trial#rpm", trial).await.unwrap();
    drop(s.sluice.acquire("trial#rpm").await.unwrap());
    let shadow_client = Sluice::builder()
        .store_arc(s.store.clone())
        .clock(s.clock.clone())
        .mode(sluice::Mode::Shadow)
        .build()
        .unwrap();
    s.store.set_down(true);
    for _ in 0..3 {
        let lease = s.sluice.acquire("trial#rpm").await.unwrap();
        assert_eq!(lease.attempts(), 0, "no write");
        lease.release().await.unwrap();
    }
    drop(shadow_client.acquire("openai#rpm").await.unwrap());
    // Transactions that keep timing out do not touch a shadow take (the fast path's one
    // write, which takes the cost and counts that an enforcing bucket, empty, would have
    // refused it); and an outage after it: still granted, the bucket still known to be
    // in shadow.
    s.store.set_down(false);
    s.store.commits_down.store(true, Ordering::SeqCst);
    drop(s.sluice.acquire("trial#rpm").await.unwrap());
    s.store.set_down(true);
    drop(s.sluice.acquire("trial#rpm").await.unwrap());
    s.store.commits_down.store(false, Ordering::SeqCst);
    let pair = Acquire::new("trial#rpm").and("openai#rpm");
    let e = s.sluice.acquire(pair).await.unwrap_err();
    assert!(
        matches!(e, Error::Store(StoreError::Timeout { .. })),
        "{e:?}"
    );
    s.store.set_down(false);
    // What was granted unrecorded was not taken; the write took its one.
    let row = s.sluice.bucket("trial#rpm").await.unwrap().unwrap();
    assert_eq!((row.tokens, row.shadow_refused()), (Tokens::new(-1), 1));
}
