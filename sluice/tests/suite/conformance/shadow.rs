//! Shadow mode: acquires never refused, what would have been counted, the tokens taken.

use std::sync::Arc;

use sluice::{Acquire, Bucket, Config, Error, Mode, RefillRate, Tokens};

use super::{Env, retry_in};

/// A tokens bucket of 10 refilling 5 a second.
fn ten_at_five() -> Bucket {
    Bucket::tokens(RefillRate::per_second(5)).with_capacity(10)
}

/// What shadow acquires counted on `dimension`'s row.
async fn counted(env: &Env, dimension: &str) -> u64 {
    env.sluice
        .bucket(dimension)
        .await
        .unwrap()
        .unwrap()
        .shadow_refused()
}

/// A load beyond capacity on a bucket in shadow: never refused, every cost taken (the row
/// goes into debt), and what it counts is exactly what the same bucket enforcing refuses
/// on the same schedule, one call at a time and many at once.
pub async fn a_shadow_bucket_never_refuses_and_counts_what_enforcing_refuses(env: Env) {
    let enforcing = env.define("enforcing", ten_at_five()).await;
    let shadow = env
        .define("shadow", ten_at_five().with_mode(Mode::Shadow))
        .await;
    let mut started = None;
    let (mut refused, mut taken) = (0u64, 0i64);
    // About 20 a second asked of 5 a second, in uneven steps and costs.
    for step in 0..80u64 {
        env.advance_ms(30 + (step * 37) % 41);
        // Full until the first take: refill counts from then.
        started.get_or_insert(env.clock.now());
        let cost = 1 + (step * 7 % 3) as i64;
        taken += cost;
        match env
            .sluice
            .acquire(Acquire::with_cost(&enforcing, cost))
            .await
        {
            Ok(lease) => drop(lease),
            Err(Error::RetryIn(_)) => refused += 1,
            Err(e) => panic!("enforcing: {e}"),
        }
        let granted = env.sluice.acquire(Acquire::with_cost(&shadow, cost)).await;
        assert!(granted.is_ok(), "a shadow bucket refused: {granted:?}");
    }
    assert!(
        refused > 20,
        "the schedule overloads the bucket ({refused} refused)"
    );
    assert_eq!(counted(&env, &shadow).await, refused);
    // Many at once: 16 callers at one instant, each of one token.
    env.advance_ms(1_000);
    let sluice = Arc::new(env.sluice.clone());
    let burst = |d: String| {
        let sluice = sluice.clone();
        tokio::spawn(async move { sluice.acquire(Acquire::with_cost(d, 1)).await })
    };
    let enforced: Vec<_> = (0..16).map(|_| burst(enforcing.clone())).collect();
    let shadowed: Vec<_> = (0..16).map(|_| burst(shadow.clone())).collect();
    for task in enforced {
        if let Err(e) = task.await.unwrap() {
            assert!(matches!(e, Error::RetryIn(_)), "{e}");
            refused += 1;
        }
    }
    for task in shadowed {
        assert!(task.await.unwrap().is_ok(), "a shadow bucket refused");
    }
    taken += 16;
    assert_eq!(counted(&env, &shadow).await, refused);
    // The row took every cost: 10 to start, 5 a second since, less everything asked (the
    // load never let it refill to full).
    let elapsed = env.clock.now().as_millis() - started.unwrap().as_millis();
    let expected =
        Tokens::new(10) + Tokens::from_nanos(i128::from(elapsed) * 5_000_000) - Tokens::new(taken);
    assert!(expected < Tokens::ZERO, "in debt");
    assert_eq!(env.available("shadow").await, expected);
}

/// One client in shadow and one enforcing, on one enforcing bucket: the shadow client is
/// never refused, and the enforcing one sees what it took, debt included, to the token.
pub async fn a_shadow_client_and_an_enforcing_client_conserve_tokens(env: Env) {
    let d = env
        .define(
            "mixed",
            Bucket::requests(RefillRate::per_second(1)).with_capacity(10),
        )
        .await;
    let shadow = env.client_with("shadow", |c| Config {
        mode: Mode::Shadow,
        ..c
    });
    for _ in 0..15 {
        drop(shadow.acquire(d.as_str()).await.unwrap());
    }
    let row = env.sluice.bucket(&d).await.unwrap().unwrap();
    assert_eq!(row.tokens, Tokens::new(-5), "every grant taken");
    assert_eq!(row.shadow_refused(), 5);
    // The enforcing client waits out the debt: 6 s to hold one again.
    let wait = retry_in(env.sluice.acquire(d.as_str()).await);
    assert_eq!(wait, std::time::Duration::from_secs(6));
    env.advance_ms(5_999);
    assert!(matches!(
        env.sluice.acquire(d.as_str()).await,
        Err(Error::RetryIn(_))
    ));
    env.advance_ms(1);
    drop(env.sluice.acquire(d.as_str()).await.unwrap());
    // 10 + 6 refilled - 16 granted.
    assert_eq!(env.available("mixed").await, Tokens::ZERO);
}

/// A bucket switched from shadow to enforce by one definition: a client that saw it in
/// shadow is refused at once, and the count starts again; and back.
pub async fn switching_a_shadow_bucket_to_enforce_is_one_definition(env: Env) {
    let d = env
        .define("switch", ten_at_five().with_mode(Mode::Shadow))
        .await;
    let warm = env.client("warm");
    for _ in 0..12 {
        drop(warm.acquire(d.as_str()).await.unwrap());
    }
    assert_eq!(counted(&env, &d).await, 2);
    env.sluice.put_bucket(&d, ten_at_five()).await.unwrap();
    assert!(matches!(
        warm.acquire(d.as_str()).await,
        Err(Error::RetryIn(_))
    ));
    let row = env.sluice.bucket(&d).await.unwrap().unwrap();
    assert_eq!(
        (row.bucket.mode(), row.shadow_refused()),
        (Mode::Enforce, 0)
    );
    assert_eq!(
        row.tokens,
        Tokens::new(-2),
        "the debt stays with the bucket"
    );
    env.sluice
        .put_bucket(&d, ten_at_five().with_mode(Mode::Shadow))
        .await
        .unwrap();
    env.advance_ms(1_000);
    drop(warm.acquire(Acquire::with_cost(&d, 4)).await.unwrap());
    assert_eq!(counted(&env, &d).await, 1, "3 held, 4 asked");
}

/// A client that never saw a bucket in shadow takes its first acquire in shadow too (an
/// enforcing write would leave the row's ledger stale): the count stays exact with clients
/// that come and go, as single-caller processes do.
pub async fn a_new_client_s_first_acquire_on_a_shadow_bucket_keeps_the_count_exact(env: Env) {
    let d = env
        .define(
            "newcomer",
            Bucket::requests(RefillRate::per_second(1))
                .with_capacity(10)
                .with_mode(Mode::Shadow),
        )
        .await;
    let first = env.client("first");
    drop(first.acquire(Acquire::with_cost(&d, 8)).await.unwrap());
    drop(first.acquire(Acquire::with_cost(&d, 8)).await.unwrap());
    assert_eq!(counted(&env, &d).await, 1);
    // Refill brings an enforcing bucket back to full (and the row to 10 from -6).
    env.advance_ms(20_000);
    let newcomer = env.client("newcomer");
    drop(newcomer.acquire(Acquire::with_cost(&d, 8)).await.unwrap());
    // An enforcing bucket now holds 2: 5 more would be refused.
    drop(first.acquire(Acquire::with_cost(&d, 5)).await.unwrap());
    assert_eq!(counted(&env, &d).await, 2);
}
