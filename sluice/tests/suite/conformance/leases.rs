//! Lease rows beside the bucket row, grants that commute, and several dimensions taken one
//! write per bucket: what another client, a reconciler, a redefinition or a caller that
//! goes away half-way sees.

use std::time::Duration;

use sluice::store::{LeaseFilter, LeaseRecord};
use sluice::{Acquire, Bucket, RefillRate, Tokens, bucket::BucketState, config::Protocol};

use super::{Env, Gate, requests, retry_in};

/// The row of `metric` as stored.
async fn row(env: &Env, metric: &str) -> BucketState {
    env.sluice
        .bucket(&env.dim(metric))
        .await
        .unwrap()
        .expect("bucket")
}

/// The lease rows of `metric`.
async fn leases(env: &Env, metric: &str) -> Vec<LeaseRecord> {
    env.store
        .list_leases(&LeaseFilter {
            dimension: Some(env.dim(metric).parse().unwrap()),
            expired_before: None,
        })
        .await
        .unwrap()
}

fn fast(env: &Env) -> bool {
    env.sluice.config().protocol == Protocol::Fast
}

pub async fn a_grant_writes_its_lease_row_beside_the_bucket_row(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    let before = row(&env, "rpm").await;
    let lease = env
        .sluice
        .acquire(Acquire::with_cost(env.dim("rpm"), 2))
        .await
        .unwrap();
    let after = row(&env, "rpm").await;
    assert_eq!(after.tokens, before.tokens - Tokens::new(2));
    lease.recorded().await;
    let listed = leases(&env, "rpm").await;
    assert_eq!(listed.len(), 1);
    let record = &listed[0];
    assert_eq!(record.key, lease.id().keys()[0]);
    assert_eq!(record.cost, Tokens::new(2));
    assert_eq!(record.caller, "conformance");
    assert_eq!(record.expires_at, lease.expires_at());
    // Read back by key, like any lease.
    let read = env.store.read_leases(lease.id().keys()).await.unwrap();
    assert_eq!(read, vec![Some(record.clone())]);
    lease.release().await.unwrap();
    assert!(leases(&env, "rpm").await.is_empty());
    let released = row(&env, "rpm").await;
    assert_eq!(
        released.tokens, after.tokens,
        "a requests lease gives nothing back"
    );
}

pub async fn other_clients_grants_do_not_make_a_grant_fail(env: Env) {
    requests(&env, "rpm", 100, 1).await;
    let dim = env.dim("rpm");
    let (a, b) = (env.client("a"), env.client("b"));
    // Each client remembers the row as its own last write left it; the other's writes
    // since do not turn its next one away (the seed's protocol, which conditions every
    // write on the version it read, reads the row first instead).
    let mut held = Vec::new();
    for _ in 0..5 {
        for client in [&a, &b] {
            let lease = client.acquire(dim.as_str()).await.unwrap();
            if fast(&env) {
                assert_eq!(lease.attempts(), 1, "a grant was turned away");
            }
            held.push(lease);
        }
    }
    assert_eq!(env.available("rpm").await, Tokens::new(90));
    // Releasing gives nothing back and writes nothing to the bucket.
    let version = row(&env, "rpm").await.version;
    for lease in held {
        lease.release().await.unwrap();
    }
    assert_eq!(row(&env, "rpm").await.version, version);
    assert!(leases(&env, "rpm").await.is_empty());
}

/// A clock that reads the suite's milliseconds and a fixed microsecond within each.
#[derive(Debug, Clone)]
struct AtMicro(sluice::clock::ManualClock, i64);

impl sluice::clock::Clock for AtMicro {
    fn now(&self) -> sluice::clock::UnixMillis {
        self.0.now()
    }

    fn now_micros(&self) -> i64 {
        self.0.now().as_millis() * 1_000 + self.1
    }
}

pub async fn fills_within_one_millisecond_count_refill_to_the_microsecond(env: Env) {
    if !fast(&env) {
        return;
    }
    // A million a second: a token refills every microsecond, so the bucket is full at
    // every grant, and two grants a microsecond apart both find it full.
    env.sluice
        .put_bucket(
            &env.dim("fast"),
            Bucket::requests(RefillRate::per_second(1_000_000))
                .with_capacity(1_000)
                .lean(),
        )
        .await
        .unwrap();
    let dim = env.dim("fast");
    let client = |name: &str, micros: i64| {
        sluice::SluiceBuilder::from_config(env.sluice.config().clone())
            .caller(name)
            .store_arc(env.store.clone())
            .clock(AtMicro(env.clock.clone(), micros))
            .build()
            .unwrap()
    };
    let (a, b, c) = (client("a", 100), client("b", 101), client("c", 101));
    // Each fills it once, and remembers the row its fill left.
    for each in [&a, &b, &c] {
        let _lease = each.acquire(dim.as_str()).await.unwrap();
        env.advance_ms(1);
    }
    env.advance_ms(5);
    // Within one millisecond: `a` fills it at µs 100, leaving 999, stored as 899 as of the
    // millisecond's start (the 100 refilled by µs 100 are not counted again).
    assert_eq!(a.acquire(dim.as_str()).await.unwrap().attempts(), 1);
    let filled = row(&env, "fast").await;
    assert_eq!(filled.tokens, Tokens::new(899));
    // `b`, from its older row, at µs 101: the refill since `a`'s fill covers `a`'s take, so
    // its fill applies at once.
    let lease = b.acquire(dim.as_str()).await.unwrap();
    assert_eq!(
        lease.attempts(),
        1,
        "a fill a microsecond later was turned away"
    );
    let after = row(&env, "fast").await;
    assert_eq!(after.tokens, Tokens::new(898));
    assert_eq!(after.version, filled.version + 1);
    // `c` at the same microsecond as `b`: no refill between, so not full; its fill is
    // turned away and it takes from what the row holds instead.
    let lease = c.acquire(dim.as_str()).await.unwrap();
    assert_eq!(lease.attempts(), 2);
    assert_eq!(row(&env, "fast").await.tokens, Tokens::new(897));
    // Refill counted from the millisecond's start gives the rest back, once.
    env.advance_ms(1);
    assert_eq!(env.available("fast").await, Tokens::new(1_000));
}

pub async fn slots_are_given_back_exactly_once_by_their_holders(env: Env) {
    let dim = env.dim("concurrent");
    env.sluice
        .put_bucket(&dim, Bucket::concurrent(5))
        .await
        .unwrap();
    let (a, b) = (env.client("a"), env.client("b"));
    let mut held = Vec::new();
    for client in [&a, &b, &a, &b] {
        held.push(client.acquire(dim.as_str()).await.unwrap());
    }
    assert_eq!(leases(&env, "concurrent").await.len(), 4);
    assert_eq!(env.available("concurrent").await, Tokens::new(1));
    let fifth = env.sluice.acquire(dim.as_str()).await.unwrap();
    // Every lease may be released by its holder: ask again after the poll interval.
    assert_eq!(retry_in(a.acquire(dim.as_str()).await), super::SLOT_POLL);
    // A release by id elsewhere and the holder's own: the slot comes back once.
    let id = fifth.id().clone();
    assert!(b.release_id(&id).await.unwrap());
    fifth.release().await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(1));
    for lease in held {
        lease.release().await.unwrap();
    }
    assert_eq!(env.available("concurrent").await, Tokens::new(5));
    assert!(leases(&env, "concurrent").await.is_empty());
}

pub async fn a_redefinition_keeps_the_live_leases(env: Env) {
    let dim = env.dim("concurrent");
    env.sluice
        .put_bucket(&dim, Bucket::concurrent(2))
        .await
        .unwrap();
    let held = env.sluice.acquire(dim.as_str()).await.unwrap();
    env.sluice
        .put_bucket(&dim, Bucket::concurrent(3))
        .await
        .unwrap();
    assert_eq!(
        leases(&env, "concurrent").await.len(),
        1,
        "the lease survives"
    );
    assert_eq!(env.available("concurrent").await, Tokens::new(2));
    held.release().await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(3));
    // Given back once: the reconciler finds nothing left to give.
    env.advance_ms(61_000);
    assert!(env.sluice.reconcile().await.unwrap().is_noop());
    assert_eq!(env.available("concurrent").await, Tokens::new(3));
}

pub async fn an_expired_slot_is_reclaimed_once_by_a_short_bucket_or_the_reconciler(env: Env) {
    let dim = env.dim("concurrent");
    env.sluice
        .put_bucket(&dim, Bucket::concurrent(2))
        .await
        .unwrap();
    let b = env.client("b");
    let crashed = b
        .acquire(Acquire::new(dim.as_str()).ttl(Duration::from_secs(5)))
        .await
        .unwrap();
    let id = crashed.id().clone();
    std::mem::forget(crashed);
    let live = env.sluice.acquire(dim.as_str()).await.unwrap();
    // Both holders may release any moment: the poll interval.
    assert_eq!(
        retry_in(env.sluice.acquire(dim.as_str()).await),
        super::SLOT_POLL
    );
    env.advance_ms(5_000 + super::SKEW.as_millis() as u64);
    // The short bucket gives the expired slot back and grants it, in the same write or the
    // next one.
    let reclaimed = env.sluice.acquire(dim.as_str()).await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::ZERO);
    // The crashed holder's release and the reconciler now find nothing to give back.
    assert!(!b.release_id(&id).await.unwrap());
    assert!(env.sluice.reconcile().await.unwrap().is_noop());
    assert_eq!(env.available("concurrent").await, Tokens::ZERO);
    live.release().await.unwrap();
    reclaimed.release().await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(2));
}

pub async fn a_pair_refused_on_one_dimension_holds_nothing_on_the_other(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    env.sluice
        .put_bucket(
            &env.dim("tpm"),
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000),
        )
        .await
        .unwrap();
    // Another client empties tpm: this client has not seen it, and its memory says both
    // buckets are full, so it takes rpm first and must give it back.
    let b = env.client("b");
    let pair = Acquire::new(env.dim("rpm")).and_cost(env.dim("tpm"), 500);
    env.sluice
        .acquire(pair.clone())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let drained = b
        .acquire(Acquire::with_cost(env.dim("tpm"), 500))
        .await
        .unwrap();
    let rpm_before = row(&env, "rpm").await;
    let d = retry_in(env.sluice.acquire(pair.clone()).await);
    assert_eq!(d, Duration::from_secs(5), "500 tpm at 100/s");
    let rpm_after = row(&env, "rpm").await;
    assert_eq!(
        rpm_after.available(env.clock.now()),
        rpm_before.available(env.clock.now()),
        "rpm given back exactly when the caller sees the refusal"
    );
    drained.recorded().await;
    assert!(leases(&env, "rpm").await.is_empty());
    assert_eq!(leases(&env, "tpm").await.len(), 1);
    // At the RetryIn it is granted, both dimensions.
    env.advance_ms(5_000);
    let granted = env.sluice.acquire(pair).await.unwrap();
    assert_eq!(granted.id().keys().len(), 2);
    assert_eq!(env.available("tpm").await, Tokens::ZERO);
    granted.release().await.unwrap();
    drained.release().await.unwrap();
}

pub async fn a_pair_dropped_half_way_gives_back_what_it_took(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    requests(&env, "tpm", 1_000, 100).await;
    let (gate, open) = Gate::new(&env, "tpm");
    let client = gate.client(&env);
    let pair = Acquire::new(env.dim("rpm")).and_cost(env.dim("tpm"), 100);
    let acquiring = tokio::spawn({
        let client = client.clone();
        async move { client.acquire(pair).await }
    });
    // The pair's write of tpm is in flight (rpm was taken first, by name); the caller goes
    // away.
    gate.arrived.notified().await;
    acquiring.abort();
    assert!(acquiring.await.unwrap_err().is_cancelled());
    open.send(true).unwrap();
    // Whatever was taken comes back, in the background; nothing stays held.
    for _ in 0..200 {
        if leases(&env, "rpm").await.is_empty()
            && leases(&env, "tpm").await.is_empty()
            && env.available("rpm").await == Tokens::new(10)
            && env.available("tpm").await == Tokens::new(1_000)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "held after the caller went away: rpm {} tpm {} leases {:?} {:?}",
        env.available("rpm").await,
        env.available("tpm").await,
        leases(&env, "rpm").await,
        leases(&env, "tpm").await
    );
}

pub async fn a_fleet_s_first_grants_on_a_full_row_each_take_one_write(env: Env) {
    // 20 a second, holding 10: a call takes 50 ms to refill.
    requests(&env, "slow", 10, 20).await;
    let dim = env.dim("slow");
    env.advance_ms(60_000);
    // Eight processes read the full row before any of them writes, as a fleet starts.
    let fleet: Vec<_> = (0..8).map(|i| env.client(&format!("p{i}"))).collect();
    for process in &fleet {
        process.peek(dim.as_str()).await.unwrap();
    }
    let start = env.clock.now();
    let mut held = Vec::new();
    for process in &fleet {
        env.advance_ms(3);
        let lease = process.acquire(dim.as_str()).await.unwrap();
        if fast(&env) {
            // Each first write applies as it was computed: the first leads the herd, the
            // others join it (where each would be a fill, and fills after the first fail).
            assert_eq!(lease.attempts(), 1, "a first grant was turned away");
        }
        held.push(lease);
    }
    // Exactly what eight grants leave, with the refill since the first (21 ms: 0.42).
    assert_eq!(
        env.available("slow").await,
        Tokens::from_nanos(2_420_000_000)
    );
    if fast(&env) {
        let first = start.saturating_add(Duration::from_millis(3));
        let stored = row(&env, "slow").await;
        assert_eq!(
            (stored.last_refill_at, stored.herd_at()),
            (first, Some(first))
        );
        // Full again a second later: a process's next grant fills it, which ends the herd.
        env.advance_ms(1_000);
        fleet[0]
            .acquire(dim.as_str())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        assert_eq!(row(&env, "slow").await.herd_at(), None);
    }
    for lease in held {
        lease.release().await.unwrap();
    }
}

pub async fn a_process_that_read_the_row_after_a_herd_s_lead_joins_it(env: Env) {
    // 20 a second, holding 10: a call takes 50 ms to refill.
    requests(&env, "slow", 10, 20).await;
    let dim = env.dim("slow");
    env.advance_ms(60_000);
    // The first process of a fleet reads the full row and leads the herd.
    let fleet: Vec<_> = (0..5).map(|i| env.client(&format!("p{i}"))).collect();
    fleet[0].peek(dim.as_str()).await.unwrap();
    env.advance_ms(3);
    let lead = env.clock.now();
    let mut held = vec![fleet[0].acquire(dim.as_str()).await.unwrap()];
    // The others read the row the lead left (one taken, the herd's timestamp set); then
    // the lead's process takes five more.
    for process in &fleet[1..] {
        process.peek(dim.as_str()).await.unwrap();
    }
    held.push(
        fleet[0]
            .acquire(Acquire::with_cost(dim.as_str(), 5))
            .await
            .unwrap(),
    );
    // By the time each of the others writes, the row it read has refilled to full.
    env.advance_ms(100);
    for process in &fleet[1..] {
        env.advance_ms(3);
        let lease = process.acquire(dim.as_str()).await.unwrap();
        if fast(&env) {
            // Each joins the herd, where a fill from the row it read fails on the takes
            // since.
            assert_eq!(lease.attempts(), 1, "a first grant was turned away");
            assert_eq!(row(&env, "slow").await.herd_at(), Some(lead));
        }
        held.push(lease);
    }
    // Ten taken, each exactly once, and the refill since the lead (112 ms: 2.24).
    assert_eq!(
        env.clock.now().saturating_since(lead),
        Duration::from_millis(112)
    );
    assert_eq!(
        env.available("slow").await,
        Tokens::from_nanos(2_240_000_000)
    );
    for lease in held {
        lease.release().await.unwrap();
    }
}

/// A holder's renewal and a reclaim of its lease row are both conditioned on the expiry
/// each last saw: one wins, never both, and a resent renewal applies nothing twice.
pub async fn a_slot_renewal_and_a_reclaim_of_its_row_never_both_win(env: Env) {
    let dim = env.dim("concurrent");
    env.sluice
        .put_bucket(&dim, Bucket::concurrent(1))
        .await
        .unwrap();
    let lease = env.sluice.acquire(dim.as_str()).await.unwrap();
    let row = leases(&env, "concurrent").await.remove(0);
    let (key, seen) = (row.key.clone(), row.expires_at);
    let later = seen.saturating_add(Duration::from_secs(10));
    assert!(env.store.renew_lease(&key, seen, later).await.unwrap());
    // The same renewal again (its answer lost, say): nothing changes twice.
    assert!(env.store.renew_lease(&key, seen, later).await.unwrap());
    // A renewal from an expiry the row no longer has: refused.
    let stale = seen.saturating_add(Duration::from_millis(1));
    let further = later.saturating_add(Duration::from_secs(1));
    assert!(!env.store.renew_lease(&key, stale, further).await.unwrap());
    // A reclaim of the expiry it saw before the renewal: refused, the row stays.
    assert!(!env.store.end_lease(&key, Some(seen)).await.unwrap());
    assert_eq!(leases(&env, "concurrent").await[0].expires_at, later);
    // Past the renewed expiry and the margin, the reconciler reclaims it, once.
    env.advance_ms(75_000);
    assert_eq!(env.sluice.reconcile().await.unwrap().leases_restored, 1);
    assert!(!env.store.renew_lease(&key, later, later).await.unwrap());
    assert_eq!(env.available("concurrent").await, Tokens::new(1));
    // Its holder learns it and gives nothing back twice.
    assert!(lease.remaining().is_zero());
    lease.release().await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(1));
}

/// Counting the clients that wait for a slot changes nothing else in the row (its
/// version, write id and tokens stay, so no other writer's condition fails), forgets the
/// epochs it is told to, and never creates a bucket.
pub async fn counting_waiting_clients_changes_nothing_else_in_the_row(env: Env) {
    let dim: sluice::Dimension = env.dim("concurrent").parse().unwrap();
    env.sluice
        .put_bucket(dim.as_str(), Bucket::concurrent(2))
        .await
        .unwrap();
    let before = env.sluice.bucket(dim.as_str()).await.unwrap().unwrap();
    let counts = |row: &BucketState| row.waiting().counts().collect::<Vec<_>>();
    let counted = env.store.count_waiting(&dim, 7, 3, &[]).await.unwrap();
    let counted = counted.expect("the row");
    assert_eq!(counts(&counted), vec![(7, 3)]);
    let mut rest = counted.clone();
    rest.set_waiting(before.waiting().clone());
    assert_eq!(rest, before, "nothing else changed");
    // The next epoch, forgetting the one before the last.
    env.store.count_waiting(&dim, 8, 32, &[]).await.unwrap();
    env.store.count_waiting(&dim, 9, 1, &[7]).await.unwrap();
    let counted = env.store.count_waiting(&dim, 9, 2, &[]).await.unwrap();
    assert_eq!(counts(&counted.unwrap()), vec![(8, 32), (9, 3)]);
    // A grant goes on as before, and leaves the counts.
    let lease = env.sluice.acquire(dim.as_str()).await.unwrap();
    let after = env.sluice.bucket(dim.as_str()).await.unwrap().unwrap();
    assert_eq!(after.tokens, Tokens::new(1));
    assert_eq!(counts(&after), vec![(8, 32), (9, 3)]);
    lease.release().await.unwrap();
    // No bucket: nothing counted, nothing created.
    let gone: sluice::Dimension = env.dim("gone").parse().unwrap();
    assert!(
        env.store
            .count_waiting(&gone, 9, 1, &[])
            .await
            .unwrap()
            .is_none()
    );
    assert!(env.sluice.bucket(gone.as_str()).await.unwrap().is_none());
}
