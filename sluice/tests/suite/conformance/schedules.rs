//! Scheduled limits: applied at their boundary by the reconciler, once.

use sluice::{
    Acquire, Bucket, Error, RefillRate, Tokens, bucket::Limits, bucket::Window, clock::UnixMillis,
};

use super::{Env, Gate, retry_in};

const DAY_MS: i64 = 86_400_000;

/// 100 a second and 1,000 at most by day; 500 a second and 5,000 from 22:00 to 06:00 UTC.
fn nightly() -> Bucket {
    let night = Window {
        from: "22:00".parse().unwrap(),
        to: "06:00".parse().unwrap(),
        limits: Limits {
            capacity: Tokens::new(5_000),
            refill: RefillRate::per_second(500),
            reserves: Vec::new(),
        },
    };
    Bucket::tokens(RefillRate::per_second(100))
        .with_capacity(1_000)
        .with_schedule(vec![night])
}

/// Moves the test's clock to `millis` into the next day (UTC).
fn advance_to(env: &Env, millis_of_day: i64) {
    let now = env.clock.now().as_millis();
    let mut target = now.div_euclid(DAY_MS) * DAY_MS + millis_of_day;
    if target <= now {
        target += DAY_MS;
    }
    env.advance_ms(u64::try_from(target - now).unwrap());
}

/// Two reconcilers running at once at the boundary: the change is made once, in one
/// write, and every client's acquire follows it; the morning change likewise.
pub async fn scheduled_limits_apply_at_the_boundary_exactly_once_with_two_reconcilers(env: Env) {
    advance_to(&env, 21 * 3_600_000 + 59 * 60_000);
    let d = env.define("nightly", nightly()).await;
    let (a, b) = (env.client("reconciler-a"), env.client("reconciler-b"));
    let row = env.sluice.bucket(&d).await.unwrap().unwrap();
    assert_eq!(row.bucket.capacity(), Tokens::new(1_000));
    let (next, limits) = row
        .bucket
        .schedule()
        .unwrap()
        .next_change(env.clock.now())
        .unwrap();
    assert_eq!(next.as_millis() - env.clock.now().as_millis(), 60_000);
    assert_eq!(limits.capacity, Tokens::new(5_000));
    assert_eq!(
        a.reconcile().await.unwrap().schedules_applied,
        0,
        "not due yet"
    );
    let e = env
        .sluice
        .acquire(Acquire::with_cost(&d, 1_500))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::CostExceedsCapacity { .. }), "{e}");
    env.advance_ms(60_000);
    let before = env.sluice.bucket(&d).await.unwrap().unwrap().version;
    let (ra, rb) = tokio::join!(a.reconcile(), b.reconcile());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(
        ra.schedules_applied + rb.schedules_applied,
        1,
        "{ra} / {rb}"
    );
    let row = env.sluice.bucket(&d).await.unwrap().unwrap();
    assert_eq!(row.version, before + 1, "one write");
    assert_eq!(row.bucket.capacity(), Tokens::new(5_000));
    assert_eq!(row.bucket.refill_rate(), RefillRate::per_second(500));
    for again in [a.reconcile().await.unwrap(), b.reconcile().await.unwrap()] {
        assert_eq!(again.schedules_applied, 0);
    }
    // The tokens held stay (no fresh burst); the night's rate refills 500 more in 1 s.
    let wait = retry_in(env.sluice.acquire(Acquire::with_cost(&d, 1_500)).await);
    assert_eq!(wait, std::time::Duration::from_secs(1));
    env.advance_ms(1_000);
    drop(
        env.sluice
            .acquire(Acquire::with_cost(&d, 1_500))
            .await
            .unwrap(),
    );
    // At 06:00 the day's limits come back, the tokens capped at the day's capacity.
    advance_to(&env, 6 * 3_600_000);
    let (ra, rb) = tokio::join!(a.reconcile(), b.reconcile());
    assert_eq!(
        ra.unwrap().schedules_applied + rb.unwrap().schedules_applied,
        1
    );
    let row = env.sluice.bucket(&d).await.unwrap().unwrap();
    assert_eq!(row.bucket.capacity(), Tokens::new(1_000));
    assert_eq!(row.available(env.clock.now()), Tokens::new(1_000));
}

/// A reconciler whose write of a due change is held while another makes it: the held write
/// fails on the changed row, and the reconciler, reading it again, finds nothing left to
/// do (the change is made once, not twice).
pub async fn a_schedule_change_lost_to_another_reconciler_is_not_made_again(env: Env) {
    advance_to(&env, 21 * 3_600_000 + 59 * 60_000);
    let d = env.define("raced", nightly()).await;
    let (gate, open) = Gate::new(&env, "raced");
    gate.holds_definitions
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let held = gate.client(&env);
    env.advance_ms(60_000);
    let before = env.sluice.bucket(&d).await.unwrap().unwrap().version;
    let arrived = gate.arrived.notified();
    let slow = tokio::spawn(async move { held.reconcile().await });
    arrived.await;
    let fast = env.client("reconciler-b").reconcile().await.unwrap();
    assert_eq!(fast.schedules_applied, 1);
    open.send(true).unwrap();
    let slow = slow.await.unwrap().unwrap();
    assert_eq!(slow.schedules_applied, 0, "{slow}");
    assert!(slow.errors.is_empty(), "{slow}");
    let row = env.sluice.bucket(&d).await.unwrap().unwrap();
    assert_eq!(
        (row.version, row.bucket.capacity()),
        (before + 1, Tokens::new(5_000))
    );
}

/// A bucket defined inside a window is stored with the window's limits, and its schedule
/// is kept through a redefinition that gives it none.
pub async fn a_scheduled_bucket_is_defined_with_the_limits_due_now(env: Env) {
    advance_to(&env, 23 * 3_600_000);
    let d = env.define("defined-at-night", nightly()).await;
    let row = env.sluice.bucket(&d).await.unwrap().unwrap();
    assert_eq!(row.bucket.capacity(), Tokens::new(5_000));
    assert_eq!(row.bucket.schedule(), nightly().schedule());
    let day = UnixMillis::new(env.clock.now().as_millis() + 12 * 3_600_000);
    assert_eq!(row.bucket.at(day).capacity(), Tokens::new(1_000));
    // Redefined without a schedule: the schedule is gone, and the reconciler leaves it.
    env.sluice
        .put_bucket(
            &d,
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000),
        )
        .await
        .unwrap();
    advance_to(&env, 6 * 3_600_000);
    assert_eq!(env.sluice.reconcile().await.unwrap().schedules_applied, 0);
    let row = env.sluice.bucket(&d).await.unwrap().unwrap();
    assert!(row.bucket.schedule().is_none());
    assert_eq!(row.bucket.capacity(), Tokens::new(1_000));
}

/// A spread bucket's schedule is the whole bucket's: not due, nothing is written; due, the
/// whole is redefined over its rows, each with its share.
pub async fn a_spread_bucket_s_schedule_is_applied_to_the_whole(env: Env) {
    advance_to(&env, 21 * 3_600_000 + 59 * 60_000);
    let d = env.define("spread", nightly()).await;
    env.sluice.reshard(&d, 4).await.unwrap();
    assert_eq!(env.sluice.reconcile().await.unwrap().schedules_applied, 0);
    let whole = env.sluice.whole_buckets().await.unwrap();
    let whole = whole.iter().find(|b| b.dimension.as_str() == d).unwrap();
    assert_eq!(whole.bucket.capacity(), Tokens::new(1_000));
    assert_eq!(whole.bucket.schedule(), nightly().schedule());
    env.advance_ms(60_000);
    let report = env.sluice.reconcile().await.unwrap();
    assert_eq!(report.schedules_applied, 1, "{report}");
    let whole = env.sluice.whole_buckets().await.unwrap();
    let whole = whole.iter().find(|b| b.dimension.as_str() == d).unwrap();
    assert_eq!(whole.bucket.capacity(), Tokens::new(5_000));
    assert_eq!(whole.shards, 4);
    assert_eq!(env.sluice.reconcile().await.unwrap().schedules_applied, 0);
}
