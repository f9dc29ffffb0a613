//! Several clients (several "processes") on one store: what one client remembers must never
//! give an answer the store would not give once another client changed the bucket.

use std::time::Duration;

use sluice::{Acquire, Bucket, Error, RefillRate, Tokens, bucket::BucketState, store::Take};

use super::{Env, SLOT_POLL, requests, retry_in};

/// Rewrites the bucket of `metric` as another tool would re-seed it: deleted, then written
/// whole at `version = 0`, full.
async fn reseed_raw(env: &Env, metric: &str) {
    let dimension = env.dim(metric).parse().unwrap();
    let current = env
        .store
        .read_buckets(std::slice::from_ref(&dimension))
        .await
        .unwrap()[0]
        .clone()
        .unwrap();
    assert!(env.store.delete_bucket(&dimension).await.unwrap());
    let state = BucketState::full(dimension, current.bucket.clone(), env.clock.now());
    assert_eq!(state.version, 0);
    assert!(env.store.put_bucket(&state, None).await.unwrap());
}

pub async fn a_slot_freed_by_another_client_is_seen_within_the_poll_interval(env: Env) {
    let dim = env.dim("concurrent");
    env.sluice
        .put_bucket(&dim, Bucket::concurrent(1))
        .await
        .unwrap();
    let b = env.client("b");
    let held = b.acquire(dim.as_str()).await.unwrap();
    // The holder's lease lives 60 s, but its holder may release it any moment: the RetryIn
    // is the poll interval, a good time to ask again.
    let wait = retry_in(env.sluice.acquire(dim.as_str()).await);
    assert_eq!(wait, SLOT_POLL);
    held.release().await.unwrap();
    // Within it this client may still answer from what it saw; at it, it asks the store
    // and finds the slot another client freed.
    env.advance_ms(wait.as_millis() as u64);
    let lease = env
        .sluice
        .acquire(dim.as_str())
        .await
        .expect("the slot another client freed is granted at its RetryIn");
    lease.release().await.unwrap();
    // Held again, and released while the waiter's RetryIn runs: granted at it.
    for released_after in [0, SLOT_POLL.as_millis() as u64 / 2] {
        let held = b.acquire(dim.as_str()).await.unwrap();
        let wait = retry_in(env.sluice.acquire(dim.as_str()).await);
        assert!(wait <= SLOT_POLL, "{wait:?}");
        env.advance_ms(released_after);
        held.release().await.unwrap();
        env.advance_ms(wait.as_millis() as u64 - released_after);
        env.sluice
            .acquire(dim.as_str())
            .await
            .expect("granted at the RetryIn")
            .release()
            .await
            .unwrap();
    }
}

pub async fn a_short_concurrent_bucket_with_no_live_lease_answers_the_poll_interval(env: Env) {
    let dim = env.dim("concurrent");
    env.sluice
        .put_bucket(&dim, Bucket::concurrent(2))
        .await
        .unwrap();
    // A bucket short of slots that no lease row explains (lease rows swept away; leases
    // in rows of their own, as only those can vanish without their bucket row).
    let rows = env.client("conformance");
    let lease = rows.acquire(dim.as_str()).await.unwrap();
    let lease2 = rows.acquire(dim.as_str()).await.unwrap();
    let keys: Vec<_> = lease
        .id()
        .keys()
        .iter()
        .chain(lease2.id().keys())
        .cloned()
        .collect();
    std::mem::forget(lease);
    std::mem::forget(lease2);
    env.store.delete_leases(&keys).await.unwrap();
    let other = env.client("other");
    let d = retry_in(other.acquire(dim.as_str()).await);
    assert!(
        d <= SLOT_POLL,
        "no lease explains the shortage: look again within the poll interval, not {d:?}"
    );
    // The reconciler heals the bucket from its (absent) leases; the next look grants.
    assert_eq!(other.reconcile().await.unwrap().buckets_healed, 1);
    env.advance_ms(d.as_millis() as u64);
    other
        .acquire(dim.as_str())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

pub async fn a_raised_capacity_is_seen_by_a_warm_client(env: Env) {
    let dim = env.dim("tpm");
    env.sluice
        .put_bucket(
            &dim,
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(100),
        )
        .await
        .unwrap();
    env.sluice
        .acquire(Acquire::with_cost(dim.as_str(), 1))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // An operator raises the limit through another client: 99 tokens stay, capacity 1,000.
    env.client("operator")
        .put_bucket(
            &dim,
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000),
        )
        .await
        .unwrap();
    // 500 is possible now: 401 tokens short at 100/s.
    assert_eq!(
        retry_in(
            env.sluice
                .acquire(Acquire::with_cost(dim.as_str(), 500))
                .await
        ),
        Duration::from_millis(4_010)
    );
    env.advance_ms(4_010);
    env.sluice
        .acquire(Acquire::with_cost(dim.as_str(), 500))
        .await
        .expect("granted under the raised capacity")
        .release()
        .await
        .unwrap();
}

pub async fn a_first_denial_reflects_what_other_clients_took(env: Env) {
    // 10 per second, capacity 10.
    requests(&env, "rpm", 10, 10).await;
    let dim = env.dim("rpm");
    let b = env.client("b");
    env.sluice
        .acquire(Acquire::with_cost(dim.as_str(), 5))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    b.acquire(Acquire::with_cost(dim.as_str(), 5))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // This client last saw 5 tokens (300 ms short of 8); the bucket holds none (800 ms).
    assert_eq!(
        retry_in(
            env.sluice
                .acquire(Acquire::with_cost(dim.as_str(), 8))
                .await
        ),
        Duration::from_millis(800)
    );
    env.advance_ms(799);
    assert!(
        env.sluice
            .acquire(Acquire::with_cost(dim.as_str(), 8))
            .await
            .is_err()
    );
    env.advance_ms(1);
    env.sluice
        .acquire(Acquire::with_cost(dim.as_str(), 8))
        .await
        .expect("granted at the promised instant")
        .release()
        .await
        .unwrap();
}

pub async fn a_retry_after_its_delay_sees_tokens_another_client_gave_back(env: Env) {
    let dim = env.dim("tpm");
    env.sluice
        .put_bucket(
            &dim,
            Bucket::tokens(RefillRate::per_second(10)).with_capacity(100),
        )
        .await
        .unwrap();
    let b = env.client("b");
    let mut mine = env
        .sluice
        .acquire(Acquire::with_cost(dim.as_str(), 10))
        .await
        .unwrap();
    let mut theirs = b
        .acquire(Acquire::with_cost(dim.as_str(), 90))
        .await
        .unwrap();
    // Empty: 50 tokens are 5 s away.
    assert_eq!(
        retry_in(
            env.sluice
                .acquire(Acquire::with_cost(dim.as_str(), 50))
                .await
        ),
        Duration::from_secs(5)
    );
    env.advance_ms(100);
    // This client's own call used 60 tokens, not 10: its bucket row goes into debt.
    mine.adjust(&dim, 60).await.unwrap();
    // The other client's call used none of its 90: they come back.
    theirs.adjust(&dim, 0).await.unwrap();
    env.advance_ms(4_900);
    // After its RetryIn, the bucket holds 90 tokens; what this client last wrote would
    // still be short. The answer must come from the bucket.
    assert!(env.available("tpm").await >= Tokens::new(50));
    env.sluice
        .acquire(Acquire::with_cost(dim.as_str(), 50))
        .await
        .expect("granted: another client gave tokens back")
        .release()
        .await
        .unwrap();
    mine.release().await.unwrap();
    theirs.release().await.unwrap();
}

pub async fn a_write_computed_from_a_recreated_bucket_never_succeeds(env: Env) {
    let dim = env.dim("rpm");
    let definition = Bucket::requests(RefillRate::per_minute(1)).with_capacity(10);
    env.sluice
        .put_bucket(&dim, definition.clone())
        .await
        .unwrap();
    env.sluice
        .acquire(dim.as_str())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // This client remembers 9 tokens. Another deletes and recreates the bucket, then
    // takes 5 of the fresh 10.
    let b = env.client("b");
    assert!(b.delete_bucket(&dim).await.unwrap());
    b.put_bucket(&dim, definition).await.unwrap();
    b.acquire(Acquire::with_cost(dim.as_str(), 5))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    match env
        .sluice
        .acquire(Acquire::with_cost(dim.as_str(), 9))
        .await
    {
        Err(Error::RetryIn(_)) => {}
        other => panic!("9 of 5 tokens: expected RetryIn, got {other:?}"),
    }
    assert_eq!(env.tokens("rpm").await, Tokens::new(5));
}

pub async fn a_write_computed_from_a_reseeded_bucket_never_succeeds(env: Env) {
    let dim = env.dim("rpm");
    env.sluice
        .put_bucket(
            &dim,
            Bucket::requests(RefillRate::per_minute(1)).with_capacity(10),
        )
        .await
        .unwrap();
    env.sluice
        .acquire(dim.as_str())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Another tool re-seeds the row at version 0; another client takes 5: the row is at
    // the version this client remembers, with other tokens.
    reseed_raw(&env, "rpm").await;
    let b = env.client("b");
    b.acquire(Acquire::with_cost(dim.as_str(), 5))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let row = env.sluice.bucket(&dim).await.unwrap().unwrap();
    assert_eq!((row.version, row.tokens), (1, Tokens::new(5)));
    match env
        .sluice
        .acquire(Acquire::with_cost(dim.as_str(), 9))
        .await
    {
        Err(Error::RetryIn(_)) => {}
        other => panic!("9 of 5 tokens: expected RetryIn, got {other:?}"),
    }
    assert_eq!(env.tokens("rpm").await, Tokens::new(5));
}

pub async fn a_multi_dimension_acquire_follows_rows_whose_version_went_down(env: Env) {
    requests(&env, "rpm", 100, 1).await;
    requests(&env, "tpm", 1_000, 1).await;
    let both = || Acquire::new(env.dim("rpm")).and_cost(env.dim("tpm"), 10);
    for _ in 0..3 {
        env.sluice
            .acquire(both())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    reseed_raw(&env, "rpm").await;
    reseed_raw(&env, "tpm").await;
    env.sluice
        .acquire(both())
        .await
        .expect("granted from the re-seeded rows")
        .release()
        .await
        .unwrap();
    assert_eq!(env.tokens("rpm").await, Tokens::new(99));
    assert_eq!(env.tokens("tpm").await, Tokens::new(990));
}

pub async fn cost_above_a_remembered_capacity_is_confirmed_by_the_store(env: Env) {
    let dim = env.dim("tpm");
    env.sluice
        .put_bucket(
            &dim,
            Bucket::tokens(RefillRate::per_second(1_000)).with_capacity(100),
        )
        .await
        .unwrap();
    env.sluice
        .acquire(Acquire::with_cost(dim.as_str(), 1))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    env.client("operator")
        .put_bucket(
            &dim,
            Bucket::tokens(RefillRate::per_second(1_000)).with_capacity(1_000),
        )
        .await
        .unwrap();
    env.advance_ms(1_000);
    let lease = env
        .sluice
        .acquire(Acquire::with_cost(dim.as_str(), 500))
        .await
        .expect("not CostExceedsCapacity: the capacity was raised");
    lease.release().await.unwrap();
    // A cost above the stored capacity is still the distinct error.
    let e = env
        .sluice
        .acquire(Acquire::with_cost(dim.as_str(), 1_001))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::CostExceedsCapacity { .. }), "{e}");
    let row = env.sluice.bucket(&dim).await.unwrap().unwrap();
    assert!(matches!(
        row.take(Tokens::new(1_001), env.clock.now()),
        Take::ExceedsCapacity
    ));
}

pub async fn redefining_a_concurrent_bucket_moves_its_free_slots_with_its_capacity(env: Env) {
    let dim = env.dim("concurrent");
    env.sluice
        .put_bucket(&dim, Bucket::concurrent(4))
        .await
        .unwrap();
    let held = env.sluice.acquire(dim.as_str()).await.unwrap();
    // Lowered to 2 with 1 held: 1 free, not 2.
    let other = env.client("operator");
    other.put_bucket(&dim, Bucket::concurrent(2)).await.unwrap();
    assert_eq!(env.tokens("concurrent").await, Tokens::new(1));
    let second = env.sluice.acquire(dim.as_str()).await.unwrap();
    assert!(matches!(
        env.sluice.acquire(dim.as_str()).await,
        Err(Error::RetryIn(_))
    ));
    // Raised to 5 with 2 held: 3 free at once, for every client.
    other.put_bucket(&dim, Bucket::concurrent(5)).await.unwrap();
    env.advance_ms(SLOT_POLL.as_millis() as u64);
    let more: Vec<_> = futures::future::join_all((0..3).map(|_| env.sluice.acquire(dim.as_str())))
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("three more slots");
    assert_eq!(env.tokens("concurrent").await, Tokens::ZERO);
    for lease in more.into_iter().chain([held, second]) {
        lease.release().await.unwrap();
    }
    assert_eq!(env.tokens("concurrent").await, Tokens::new(5));
}

pub async fn a_multi_dimension_acquire_on_a_bucket_deleted_elsewhere_is_unknown(env: Env) {
    requests(&env, "rpm", 100, 1).await;
    requests(&env, "tpm", 1_000, 1).await;
    let both = || Acquire::new(env.dim("rpm")).and_cost(env.dim("tpm"), 10);
    env.sluice
        .acquire(both())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(
        env.client("b")
            .delete_bucket(&env.dim("tpm"))
            .await
            .unwrap()
    );
    for _ in 0..2 {
        match env.sluice.acquire(both()).await {
            Err(Error::UnknownDimension { dimension, .. }) => {
                assert_eq!(dimension.as_str(), env.dim("tpm"));
            }
            other => panic!("expected UnknownDimension, got {other:?}"),
        }
    }
}
