//! A lease in time: a slot's body runs to its deadline, its lease renewed meanwhile, no client gives an expired
//! lease back before the clock-skew margin has passed (whatever its own clock says), and
//! a `requests` lease whose holder released it is never refunded, even when the release
//! only gets through after the lease expired.
//!
//! Tokio's time is paused and every clock is a [`TokioClock`] (some moved by a fixed
//! offset, like hosts whose clocks are off): no test waits.

use crate::faults;

use std::sync::Arc;
use std::time::Duration;

use sluice::{
    Acquire, Bucket, Error, MemoryStore, RefillRate, Sluice, Tokens, clock::TokioClock,
    clock::UnixMillis, store::Store,
};
use tokio::time::Instant;

use faults::{SkewedClock, Switch};

const START: UnixMillis = UnixMillis::from_secs(1_700_000_000);

fn client(store: Arc<dyn Store>, clock: SkewedClock<TokioClock>, skew: Duration) -> Sluice {
    Sluice::builder()
        .store_arc(store)
        .clock(clock)
        .clock_skew(skew)
        .slot_poll(Duration::from_millis(50))
        .build()
        .unwrap()
}

fn clock(offset_ms: i64) -> SkewedClock<TokioClock> {
    SkewedClock {
        inner: TokioClock::starting_at(START),
        offset_ms,
    }
}

/// A client on a store of its own, and a lease for `ttl` on its one `eleven#concurrent` slot.
async fn one_slot(ttl: Duration) -> (Sluice, sluice::Lease) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let sluice = client(store, clock(0), Duration::ZERO);
    sluice
        .put_bucket("eleven#concurrent", Bucket::concurrent(1))
        .await
        .unwrap();
    let lease = sluice
        .acquire(Acquire::new("eleven#concurrent").ttl(ttl))
        .await
        .unwrap();
    (sluice, lease)
}

#[tokio::test(start_paused = true)]
async fn a_bodys_deadline_is_its_timeout_and_its_slot_is_renewed_meanwhile() {
    let (sluice, lease) = one_slot(Duration::from_secs(1)).await;
    // A body three times as long as the lease's TTL, within its deadline: the slot is
    // renewed while it runs, and the body completes.
    let started = Instant::now();
    let out = lease
        .run(
            Duration::from_secs(5),
            tokio::time::sleep(Duration::from_secs(3)),
        )
        .await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    // Released on the way out.
    let snapshot = sluice.snapshot("eleven#concurrent").await.unwrap();
    assert_eq!(snapshot.available, Tokens::new(1));
    // Past its deadline, the body is cut at it exactly.
    let lease = sluice
        .acquire(Acquire::new("eleven#concurrent").ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    let started = Instant::now();
    let out = lease
        .run(
            Duration::from_secs(2),
            tokio::time::sleep(Duration::from_secs(5)),
        )
        .await;
    assert!(
        matches!(out, Err(Error::Timeout(d)) if d == Duration::from_secs(2)),
        "{out:?}"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn a_lease_whose_slot_expired_unrenewed_does_not_start_its_body() {
    let store = Arc::new(Switch::default());
    let sluice = client(store.clone(), clock(0), Duration::ZERO);
    sluice
        .put_bucket("eleven#concurrent", Bucket::concurrent(1))
        .await
        .unwrap();
    let lease = sluice
        .acquire(Acquire::new("eleven#concurrent").ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    // The store fails every renewal for the whole TTL (or the answer took that long).
    store.set_down(true);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(lease.remaining().is_zero());
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = started.clone();
    let out = lease
        .run(Duration::from_secs(1), async move {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .await;
    assert!(
        matches!(out, Err(Error::Timeout(d)) if d.is_zero()),
        "{out:?}"
    );
    assert!(!started.load(std::sync::atomic::Ordering::SeqCst));
    // Expired, its release given up: the reconciler gives the slot back once the store
    // answers again.
    store.set_down(false);
    assert_eq!(sluice.reconcile().await.unwrap().leases_restored, 1);
    let snapshot = sluice.snapshot("eleven#concurrent").await.unwrap();
    assert_eq!(snapshot.available, Tokens::new(1));
}

/// Two hosts whose clocks are `ahead_ms` apart share one `concurrent(1)` bucket: the
/// holder's body runs as long as its slot allows; the other host, whose clock is ahead,
/// waits for the slot. It never gets it while the body still runs.
async fn a_slot_in_use_is_never_handed_on(ahead_ms: i64, skew: Duration) -> Duration {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let holder = client(store.clone(), clock(0), skew);
    let ahead = client(store, clock(ahead_ms), skew);
    holder
        .put_bucket("eleven#concurrent", Bucket::concurrent(1))
        .await
        .unwrap();
    let started = Instant::now();
    let body_ended = tokio::spawn({
        let holder = holder.clone();
        async move {
            // The body would run for a minute: it is cut at its deadline, then the
            // slot is released.
            let lease = holder
                .acquire(Acquire::new("eleven#concurrent").ttl(Duration::from_secs(2)))
                .await
                .unwrap();
            let out = lease
                .run(
                    Duration::from_secs(2),
                    tokio::time::sleep(Duration::from_secs(60)),
                )
                .await;
            assert!(matches!(out, Err(Error::Timeout(_))), "{out:?}");
            Instant::now()
        }
    });
    tokio::task::yield_now().await;
    let granted = ahead
        .acquire_within("eleven#concurrent", Duration::from_secs(30))
        .await
        .unwrap();
    let got_at = Instant::now();
    let body_ended = body_ended.await.unwrap();
    assert!(
        got_at >= body_ended,
        "the slot was handed on {:?} before its body ended",
        body_ended - got_at
    );
    granted.release().await.unwrap();
    got_at - started
}

#[tokio::test(start_paused = true)]
async fn a_client_whose_clock_is_ahead_waits_out_the_skew_margin() {
    // 1.5 s ahead, 2 s allowed for: the slot comes back (released by its holder) when
    // its body ends, never before.
    let waited = a_slot_in_use_is_never_handed_on(1_500, Duration::from_secs(2)).await;
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
}

#[tokio::test(start_paused = true)]
async fn a_leaked_slot_comes_back_the_skew_margin_after_its_expiry() {
    let store = MemoryStore::new();
    let skew = Duration::from_secs(2);
    // The holder reaches the table through a switch: its death is the switch going off.
    let holder_store = Arc::new(Switch {
        inner: store.clone(),
        ..Switch::default()
    });
    let holder = client(holder_store.clone(), clock(0), skew);
    let ahead = client(Arc::new(store), clock(1_500), skew);
    holder
        .put_bucket("eleven#concurrent", Bucket::concurrent(1))
        .await
        .unwrap();
    let lease = holder
        .acquire(Acquire::new("eleven#concurrent").ttl(Duration::from_secs(2)))
        .await
        .unwrap();
    // Its holder dies: the lease is never released, nor renewed.
    std::mem::forget(lease);
    holder_store.set_down(true);
    let started = Instant::now();
    // By the other host's clock the lease expires in 0.5 s and may be given back 2 s
    // after that; its holder might release it sooner: ask again after the poll interval.
    let e = ahead.acquire("eleven#concurrent").await.unwrap_err();
    assert_eq!(e.retry_in(), Some(Duration::from_millis(50)));
    let granted = ahead
        .acquire_within("eleven#concurrent", Duration::from_secs(30))
        .await
        .unwrap();
    // 2.5 s by the waiting host's clock, 4 s by the holder's: the holder's body had
    // ended by its own clock 2 s before.
    assert_eq!(started.elapsed(), Duration::from_millis(2_500));
    granted.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_requests_lease_released_after_its_expiry_is_never_refunded() {
    let store = Arc::new(Switch::default());
    let dyn_store: Arc<dyn Store> = store.clone();
    let skew = Duration::from_secs(1);
    let holder = client(dyn_store.clone(), clock(0), skew);
    let reconciler = client(dyn_store, clock(900), skew);
    // One request a day: a refund would show.
    holder
        .put_bucket(
            "openai#rpm",
            Bucket::requests(RefillRate::per_day(1)).with_capacity(10),
        )
        .await
        .unwrap();
    let lease = holder
        .acquire(Acquire::new("openai#rpm").ttl(Duration::from_secs(5)))
        .await
        .unwrap();
    lease.recorded().await;
    let available = async || holder.snapshot("openai#rpm").await.unwrap().available;
    assert_eq!(available().await, Tokens::new(9));
    // The store stops answering as the holder releases: the release fails, and is
    // retried in the background.
    store.set_down(true);
    assert!(lease.release().await.is_err());
    // The store stays down until well past the lease's expiry (5 s) and its skew margin.
    tokio::time::sleep(Duration::from_secs(30)).await;
    store.set_down(false);
    // A reconcile pass now finds the lease expired, but within its release grace.
    let report = reconciler.reconcile().await.unwrap();
    assert_eq!(report.leases_in_grace, 1, "{report}");
    assert_eq!(report.leases_restored, 0, "{report}");
    // The holder's retry gets through within its backoff, and the lease is gone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::time::sleep(sluice::config::RELEASE_GRACE).await;
    let report = reconciler.reconcile().await.unwrap();
    assert_eq!(report.leases_seen, 0, "{report}");
    assert_eq!(report.leases_restored, 0, "{report}");
    // The released request was not refunded: 91 s of refill at one a day is not a token.
    let now = available().await;
    assert!(
        now >= Tokens::new(9) && now < Tokens::new(10),
        "{now} tokens"
    );
}

/// The store stopped for two minutes while 1,000 slot leases are released: the releases
/// wait in the client's one background queue (one probe at a time while every call fails,
/// never a task per release hammering the store), `flush` with a 1 s deadline returns by
/// it, and once the store is back every lease ends exactly once: the bucket holds all its
/// slots again, with no lease row left.
#[tokio::test(start_paused = true)]
async fn releases_during_a_two_minute_outage_are_queued_bounded_and_none_is_lost() {
    let store = Arc::new(Switch::default());
    let sluice = Sluice::builder()
        .store_arc(store.clone())
        .clock(clock(0))
        .lease_ttl(Duration::from_secs(600))
        .build()
        .unwrap();
    sluice
        .put_bucket("tts#concurrent", Bucket::concurrent(1_000))
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..1_000 {
        held.push(sluice.acquire("tts#concurrent").await.unwrap());
    }
    store.set_down(true);
    for lease in held {
        assert!(lease.release().await.is_err());
    }
    let started = Instant::now();
    assert!(matches!(
        sluice.flush(Duration::from_secs(1)).await,
        Err(Error::Timeout(_))
    ));
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    tokio::time::sleep(Duration::from_secs(119)).await;
    // Two minutes of outage: each release's own attempt, then one probe (a delete and
    // the read that settles its lost answer) every 100 to 200 ms: about 25 calls a
    // second at most, where a task per release made 1,000 times that.
    let calls = store
        .calls_while_down
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        calls <= 1_000 + 25 * 120,
        "{calls} calls while the store was down"
    );
    store.set_down(false);
    sluice.flush(Duration::from_secs(30)).await.unwrap();
    let row = sluice.bucket("tts#concurrent").await.unwrap().unwrap();
    assert_eq!(row.tokens, Tokens::new(1_000), "every slot back, once");
    assert!(sluice.leases(&Default::default()).await.unwrap().is_empty());
}
