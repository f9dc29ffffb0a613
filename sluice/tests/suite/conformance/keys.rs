//! Keyed buckets: one definition (the template), a bucket per key, each key's row created
//! by its first acquire in that acquire's write.

use std::time::Duration;

use sluice::{Acquire, Bucket, Dimension, Error, RefillRate, Tokens, config::Protocol};

use super::{Env, retry_in};

/// Whether the suite runs the fast path: the seed's protocol (a testing client of the
/// interoperability contract) has no templates, and acquires on a key's row only once it
/// exists.
fn keys_served(env: &Env) -> bool {
    env.protocol() == Protocol::Fast
}

/// Defines `metric` as a keyed `requests` bucket: `capacity`, refilling `per_second`.
async fn template(env: &Env, metric: &str, capacity: u64, per_second: u64) -> Dimension {
    let d: Dimension = env.dim(metric).parse().unwrap();
    env.sluice
        .put_bucket(
            d.as_str(),
            Bucket::requests(RefillRate::per_second(per_second))
                .with_capacity(capacity)
                .keyed(),
        )
        .await
        .unwrap();
    d
}

fn key(template: &Dimension, key: &str) -> Dimension {
    template.with_key(key).unwrap()
}

async fn stored(env: &Env, d: &Dimension) -> Option<sluice::bucket::BucketState> {
    env.sluice.bucket(d.as_str()).await.unwrap()
}

/// What `d`'s stored row holds now.
async fn available(env: &Env, d: &Dimension) -> Tokens {
    stored(env, d)
        .await
        .expect("a row")
        .available(env.clock.now())
}

/// Acquires `request` on `client` and releases it at once.
async fn take(client: &sluice::Sluice, request: impl Into<Acquire>) {
    client
        .acquire(request)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

pub async fn a_key_s_first_acquire_creates_its_row_from_the_template_in_one_write(env: Env) {
    if !keys_served(&env) {
        return;
    }
    let t = template(&env, "ingest", 5, 1).await;
    let tenant = key(&t, "tenant-1");
    assert!(stored(&env, &tenant).await.is_none());
    let lease = env.sluice.acquire(tenant.as_str()).await.unwrap();
    assert_eq!(lease.attempts(), 1, "a first use is one write");
    let row = stored(&env, &tenant)
        .await
        .expect("created by the first acquire");
    assert_eq!(row.bucket.capacity(), Tokens::new(5));
    assert!(
        !row.bucket.is_keyed(),
        "a key's row is a bucket, not a template"
    );
    assert_eq!(row.available(env.clock.now()), Tokens::new(4));
    lease.release().await.unwrap();
    // The template is no bucket: nothing takes from it.
    let template_row = stored(&env, &t).await.unwrap();
    assert!(matches!(
        env.sluice.acquire(t.as_str()).await,
        Err(Error::KeyRequired { dimension }) if dimension == t
    ));
    assert!(matches!(
        env.sluice.peek(t.as_str()).await,
        Err(Error::KeyRequired { .. })
    ));
    assert_eq!(stored(&env, &t).await.unwrap(), template_row);
    // A cost the template's bucket can never hold, from a client that never saw the key:
    // the distinct error, at once.
    let big = env.client("big");
    let ask = key(&t, "tenant-9");
    let too_big =
        tokio::spawn(async move { big.acquire(Acquire::with_cost(ask.as_str(), 6u64)).await });
    let answer = tokio::time::timeout(Duration::from_secs(10), too_big)
        .await
        .expect("answered, not retried forever")
        .unwrap();
    assert!(
        matches!(answer, Err(Error::CostExceedsCapacity { .. })),
        "{answer:?}"
    );
    // A key of a bucket that is not keyed, or of none: no bucket.
    super::requests(&env, "plain", 5, 1).await;
    let plain: Dimension = env.dim("plain").parse().unwrap();
    for d in [
        key(&plain, "t"),
        key(&env.dim("none").parse().unwrap(), "t"),
    ] {
        match env.sluice.acquire(d.as_str()).await {
            Err(Error::UnknownDimension { dimension, .. }) => assert_eq!(dimension, d),
            other => panic!("expected an unknown dimension for {d}, got {other:?}"),
        }
        assert!(stored(&env, &d).await.is_none());
    }
}

pub async fn each_key_is_a_bucket_of_its_own_with_exact_waits(env: Env) {
    if !keys_served(&env) {
        return;
    }
    // 3 held, 4 a second: after 3 grants the next is 250 ms away, on that key alone.
    let t = template(&env, "ingest", 3, 4).await;
    let (a, b) = (key(&t, "a"), key(&t, "b"));
    for _ in 0..3 {
        take(&env.sluice, a.as_str()).await;
    }
    env.advance_ms(100);
    assert_eq!(
        retry_in(env.sluice.acquire(a.as_str()).await),
        Duration::from_millis(150)
    );
    env.sluice
        .acquire(b.as_str())
        .await
        .expect("another key is full")
        .release()
        .await
        .unwrap();
    // Another client, first using `a` now, learns its row from its failed write.
    let other = env.client("other");
    assert_eq!(
        retry_in(other.acquire(a.as_str()).await),
        Duration::from_millis(150)
    );
    env.advance_ms(150);
    other
        .acquire(a.as_str())
        .await
        .expect("granted at the promised instant")
        .release()
        .await
        .unwrap();
}

pub async fn first_uses_of_one_key_racing_from_two_clients_never_over_grant(env: Env) {
    if !keys_served(&env) {
        return;
    }
    let t = template(&env, "ingest", 4, 1).await;
    let tenant = key(&t, "racer");
    let (one, two) = (env.client("one"), env.client("two"));
    let asks = (0..6).flat_map(|_| [one.clone(), two.clone()]).map(|c| {
        let d = tenant.clone();
        tokio::spawn(async move { c.acquire(d.as_str()).await })
    });
    let mut granted = 0;
    for ask in asks.collect::<Vec<_>>() {
        match ask.await.unwrap() {
            Ok(_) => granted += 1,
            Err(Error::RetryIn(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    // The clock stands still: what the bucket holds, and no more.
    assert_eq!(granted, 4);
    assert_eq!(available(&env, &tenant).await, Tokens::ZERO);
}

pub async fn an_idle_key_s_row_removed_reads_as_full_and_comes_back(env: Env) {
    if !keys_served(&env) {
        return;
    }
    let t = template(&env, "ingest", 5, 10).await;
    let tenant = key(&t, "idle");
    for _ in 0..2 {
        take(&env.sluice, tenant.as_str()).await;
    }
    // Full again after 200 ms; the row then goes (as the reconciler or a TTL removes it).
    env.advance_ms(1_000);
    assert!(env.store.delete_bucket(&tenant).await.unwrap());
    // The client that remembers the row, and one that never saw it, find a full bucket.
    let lease = env.sluice.acquire(tenant.as_str()).await.unwrap();
    let fresh = env.client("fresh");
    let other = fresh.acquire(tenant.as_str()).await.unwrap();
    assert_eq!(
        other.attempts(),
        2,
        "the row exists again: one failed fill, one take"
    );
    let row = stored(&env, &tenant).await.expect("created again");
    assert_eq!(row.available(env.clock.now()), Tokens::new(3));
    drop((lease, other));
    // A row full again long after its last call: a client that never saw it fills it with
    // one write.
    env.advance_ms(1_000);
    let late = env.client("late");
    let lease = late.acquire(tenant.as_str()).await.unwrap();
    assert_eq!(
        lease.attempts(),
        1,
        "an idle key's row is filled in one write"
    );
    assert_eq!(available(&env, &tenant).await, Tokens::new(4));
}

pub async fn a_key_and_a_shared_dimension_are_taken_all_or_nothing(env: Env) {
    if !keys_served(&env) {
        return;
    }
    let t = template(&env, "tenant-tpm", 100, 1).await;
    super::requests(&env, "vendor", 1, 1).await;
    let shared = env.dim("vendor");
    let tenant = key(&t, "t1");
    let both = || Acquire::with_cost(tenant.as_str(), 10u64).and(shared.as_str());
    env.sluice
        .acquire(both())
        .await
        .expect("both have room")
        .release()
        .await
        .unwrap();
    let after_one = available(&env, &tenant).await;
    assert_eq!(after_one, Tokens::new(90));
    // The shared dimension is short: the key gives back what it took, or takes nothing.
    let other = env.client("other");
    assert!(matches!(
        other.acquire(both()).await,
        Err(Error::RetryIn(_))
    ));
    assert_eq!(available(&env, &tenant).await, after_one);
    let fresh_key = key(&t, "t2");
    assert!(matches!(
        other
            .acquire(Acquire::new(fresh_key.as_str()).and(shared.as_str()))
            .await,
        Err(Error::RetryIn(_))
    ));
    if let Some(row) = stored(&env, &fresh_key).await {
        assert_eq!(row.available(env.clock.now()), Tokens::new(100));
    }
}

pub async fn a_key_s_override_keeps_its_own_definition(env: Env) {
    if !keys_served(&env) {
        return;
    }
    let t = template(&env, "ingest", 2, 1).await;
    let big = key(&t, "big-customer");
    env.sluice
        .put_bucket(
            big.as_str(),
            Bucket::requests(RefillRate::per_second(1)).with_capacity(10),
        )
        .await
        .unwrap();
    // A client that never saw the key writes from the template first: its write fails
    // on the override's definition and is made again from the row.
    let fresh = env.client("fresh");
    for _ in 0..10 {
        fresh
            .acquire(big.as_str())
            .await
            .expect("the override holds 10")
            .release()
            .await
            .unwrap();
    }
    assert!(matches!(
        fresh.acquire(big.as_str()).await,
        Err(Error::RetryIn(_))
    ));
    let row = stored(&env, &big).await.unwrap();
    assert_eq!(row.bucket.capacity(), Tokens::new(10));
    // Other keys follow the template.
    let small = key(&t, "small");
    for _ in 0..2 {
        take(&fresh, small.as_str()).await;
    }
    assert!(matches!(
        fresh.acquire(small.as_str()).await,
        Err(Error::RetryIn(_))
    ));
}

pub async fn the_reconciler_removes_idle_keys_rows_and_nothing_is_lost(env: Env) {
    if !keys_served(&env) {
        return;
    }
    // 5 held, 10 a second: full again half a second after it was emptied.
    let t = template(&env, "ingest", 5, 10).await;
    let (idle, busy, own) = (key(&t, "idle"), key(&t, "busy"), key(&t, "own"));
    env.sluice
        .put_bucket(
            own.as_str(),
            Bucket::requests(RefillRate::per_second(10)).with_capacity(50),
        )
        .await
        .unwrap();
    for _ in 0..2 {
        take(&env.sluice, idle.as_str()).await;
    }
    // Full for less than the idle time: kept.
    env.advance_ms(60_000);
    assert_eq!(env.sluice.reconcile().await.unwrap().keys_removed, 0);
    // Ten minutes full, and another key emptied just now.
    env.advance_ms(600_000);
    for _ in 0..5 {
        take(&env.sluice, busy.as_str()).await;
    }
    let report = env.sluice.reconcile().await.unwrap();
    assert_eq!(report.keys_removed, 1, "{report}");
    assert!(stored(&env, &idle).await.is_none());
    assert!(
        stored(&env, &busy).await.is_some(),
        "a key in use keeps its row"
    );
    assert!(
        stored(&env, &own).await.is_some(),
        "an override is a definition"
    );
    assert!(stored(&env, &t).await.is_some(), "the template stays");
    // The removed key is full, for the client that remembered its row and for one that
    // never saw it.
    let other = env.client("other");
    let leases = [
        env.sluice.acquire(idle.as_str()).await.unwrap(),
        other.acquire(idle.as_str()).await.unwrap(),
    ];
    assert_eq!(available(&env, &idle).await, Tokens::new(3));
    drop(leases);
    // A row written since the reconciler read it is never removed.
    env.advance_ms(700_000);
    let read = stored(&env, &idle).await.unwrap();
    assert!(
        sluice::store::Store::delete_bucket_as(&*env.store, &read)
            .await
            .is_ok()
    );
    assert!(stored(&env, &idle).await.is_none(), "removed as read");
    take(&env.sluice, idle.as_str()).await;
    let read = stored(&env, &idle).await.unwrap();
    take(&env.sluice, idle.as_str()).await;
    assert!(!env.store.delete_bucket_as(&read).await.unwrap());
    assert_eq!(available(&env, &idle).await, Tokens::new(3));
}

pub async fn an_unwritten_key_is_seen_as_its_template_s_bucket_full(env: Env) {
    if !keys_served(&env) {
        return;
    }
    let t = template(&env, "ingest", 5, 2).await;
    let fresh = key(&t, "fresh");
    assert!(env.sluice.peek(fresh.as_str()).await.unwrap().is_granted());
    assert!(matches!(
        env.sluice
            .peek(Acquire::with_cost(fresh.as_str(), 6u64))
            .await,
        Err(Error::CostExceedsCapacity { .. })
    ));
    let snapshot = env.sluice.snapshot(fresh.as_str()).await.unwrap();
    assert_eq!(
        (snapshot.capacity, snapshot.available, snapshot.refill_rate),
        (Tokens::new(5), Tokens::new(5), RefillRate::per_second(2))
    );
    assert!(env.sluice.allow(fresh.as_str()).await.unwrap());
    assert!(stored(&env, &fresh).await.is_some(), "created by the grant");
    let snapshot = env.sluice.snapshot(fresh.as_str()).await.unwrap();
    assert_eq!(snapshot.available, Tokens::new(4));
    for _ in 0..4 {
        assert!(env.sluice.allow(fresh.as_str()).await.unwrap());
    }
    assert!(!env.sluice.allow(fresh.as_str()).await.unwrap());
    assert_eq!(
        env.sluice.peek(fresh.as_str()).await.unwrap().retry_in(),
        Some(Duration::from_millis(500))
    );
    // Looking at an unwritten key writes nothing; one of no keyed bucket is unknown.
    let never = key(&t, "never");
    env.sluice.snapshot(never.as_str()).await.unwrap();
    assert!(stored(&env, &never).await.is_none());
    let orphan = key(&env.dim("none").parse().unwrap(), "k");
    assert!(matches!(
        env.sluice.peek(orphan.as_str()).await,
        Err(Error::UnknownDimension { .. })
    ));
}

pub async fn a_correction_after_a_key_s_row_was_removed_is_charged_to_it(env: Env) {
    if !keys_served(&env) {
        return;
    }
    // 100 held, 10 a second: an estimate of 10, held long past the key's idle time.
    let t = template(&env, "user-tpm", 100, 10).await;
    let user = key(&t, "long-job");
    let mut lease = env
        .sluice
        .acquire(Acquire::with_cost(user.as_str(), 10u64).ttl(Duration::from_secs(3_600)))
        .await
        .unwrap();
    env.advance_ms(700_000);
    assert_eq!(env.sluice.reconcile().await.unwrap().keys_removed, 1);
    // It used 50: the 40 more are charged to the key, whose row comes back for it.
    lease.adjust(user.as_str(), 50u64).await.unwrap();
    assert_eq!(
        stored(&env, &user)
            .await
            .expect("made again")
            .available(env.clock.now()),
        Tokens::new(60)
    );
    lease.release().await.unwrap();
}
