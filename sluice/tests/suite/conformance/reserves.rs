//! Priorities and reserves, the same on every store.

use std::time::Duration;

use sluice::{Acquire, Bucket, Error, Priority, RefillRate, Tokens};

use super::{Env, retry_in};

fn p(name: &str) -> Priority {
    name.parse().unwrap()
}

fn at(env: &Env, metric: &str, name: &str) -> Acquire {
    Acquire::new(env.dim(metric)).priority(p(name))
}

pub async fn reserves_are_kept_for_higher_priorities_with_exact_waits(env: Env) {
    // 4 requests, 2 per second; 2 kept for `interactive`.
    let rpm = Bucket::requests(RefillRate::per_second(2))
        .with_capacity(4)
        .with_reserve(p("interactive"), 2);
    env.sluice.put_bucket(&env.dim("rpm"), rpm).await.unwrap();
    let batch = env.client("batch-worker");
    for _ in 0..2 {
        batch
            .acquire(at(&env, "rpm", "batch"))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    // 2 left, both reserved: `batch` needs 3, one refill away.
    let d = retry_in(batch.acquire(at(&env, "rpm", "batch")).await);
    assert_eq!(d, Duration::from_millis(500));
    // The reserve is there for `interactive`, from another client.
    env.sluice
        .acquire(at(&env, "rpm", "interactive"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(env.available("rpm").await, Tokens::new(1));
    // Once its RetryIn has passed, `batch` asks the store again: 2 held, 3 needed, so one
    // more refill, and not a millisecond earlier.
    env.advance_ms(500);
    let d = retry_in(batch.acquire(at(&env, "rpm", "batch")).await);
    assert_eq!(d, Duration::from_millis(500));
    env.advance_ms(499);
    retry_in(batch.acquire(at(&env, "rpm", "batch")).await);
    env.advance_ms(1);
    batch
        .acquire(at(&env, "rpm", "batch"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(env.available("rpm").await, Tokens::new(2));
}

pub async fn a_concurrent_bucket_keeps_reserved_slots_free(env: Env) {
    let slots = Bucket::concurrent(3).with_reserve(p("interactive"), 1);
    env.sluice
        .put_bucket(&env.dim("slots"), slots)
        .await
        .unwrap();
    let batch = env.client("batch-worker");
    let a = batch.acquire(at(&env, "slots", "batch")).await.unwrap();
    let b = batch.acquire(at(&env, "slots", "batch")).await.unwrap();
    retry_in(batch.acquire(at(&env, "slots", "batch")).await);
    let c = env
        .sluice
        .acquire(at(&env, "slots", "interactive"))
        .await
        .unwrap();
    retry_in(env.sluice.acquire(at(&env, "slots", "interactive")).await);
    a.release().await.unwrap();
    // A reserve is slots kept free, whoever holds the others: with `interactive` in one,
    // the slot `batch` gave back is the one kept free now.
    retry_in(batch.acquire(at(&env, "slots", "batch")).await);
    c.release().await.unwrap();
    // Freed by another client: seen once the slot poll interval has passed.
    env.advance_ms(300);
    let a = batch.acquire(at(&env, "slots", "batch")).await.unwrap();
    let c = env
        .sluice
        .acquire(at(&env, "slots", "interactive"))
        .await
        .unwrap();
    for lease in [a, b, c] {
        lease.release().await.unwrap();
    }
    assert_eq!(env.available("slots").await, Tokens::new(3));
}

pub async fn reserves_are_stored_and_a_warm_client_follows_their_change(env: Env) {
    let tpm = |reserve: i64| {
        Bucket::tokens(RefillRate::per_second(1))
            .with_capacity(100)
            .with_reserve(p("interactive"), reserve)
    };
    env.sluice
        .put_bucket(&env.dim("tpm"), tpm(10))
        .await
        .unwrap();
    let stored = env.sluice.bucket(&env.dim("tpm")).await.unwrap().unwrap();
    assert_eq!(stored.bucket, tpm(10), "the reserves come back as written");
    let batch = env.client("batch-worker");
    let request = || Acquire::with_cost(env.dim("tpm"), 30).priority(p("batch"));
    batch
        .acquire(request())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Raised elsewhere: the warm client's next write, computed from the row it remembers,
    // does not apply, and the row it is handed back refuses (70 left, 60 reserved).
    env.sluice
        .put_bucket(&env.dim("tpm"), tpm(60))
        .await
        .unwrap();
    let d = retry_in(batch.acquire(request()).await);
    assert_eq!(d, Duration::from_secs(20));
    assert_eq!(env.available("tpm").await, Tokens::new(70));
    let snapshot = env.sluice.snapshot(&env.dim("tpm")).await.unwrap();
    assert_eq!(snapshot.available_to(Some(&p("batch"))), Tokens::new(10));
    assert_eq!(
        snapshot.available_to(Some(&p("interactive"))),
        Tokens::new(70)
    );
    // Lowered to none: everything is everyone's again. 50 was beyond `batch`'s share, so
    // the warm client confirms it with the store, and is granted.
    env.sluice
        .put_bucket(
            &env.dim("tpm"),
            Bucket::tokens(RefillRate::per_second(1)).with_capacity(100),
        )
        .await
        .unwrap();
    batch
        .acquire(Acquire::with_cost(env.dim("tpm"), 50).priority(p("batch")))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let row = env.sluice.bucket(&env.dim("tpm")).await.unwrap().unwrap();
    assert!(row.bucket.reserves().is_empty());
}

pub async fn a_cost_beyond_a_priority_s_share_is_confirmed_and_distinct(env: Env) {
    let tpm = Bucket::tokens(RefillRate::per_second(1))
        .with_capacity(100)
        .with_reserve(p("interactive"), 40);
    env.sluice.put_bucket(&env.dim("tpm"), tpm).await.unwrap();
    let request = Acquire::with_cost(env.dim("tpm"), 61).priority(p("batch"));
    match env.sluice.acquire(request.clone()).await {
        Err(Error::CostExceedsShare { share, .. }) => assert_eq!(share, Tokens::new(60)),
        other => panic!("expected CostExceedsShare, got {other:?}"),
    }
    // A reserve lowered elsewhere is seen at once.
    let lower = Bucket::tokens(RefillRate::per_second(1))
        .with_capacity(100)
        .with_reserve(p("interactive"), 39);
    env.client("operator")
        .put_bucket(&env.dim("tpm"), lower)
        .await
        .unwrap();
    env.sluice
        .acquire(request)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
