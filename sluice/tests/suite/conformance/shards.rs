//! Buckets spread over several rows: the whole capacity is one acquire's to take, a
//! refusal is the whole bucket's, and resharding keeps every token.

use std::time::Duration;

use sluice::{
    Acquire, Bucket, Error, RefillRate, Tokens, bucket::ShardLimit, config::Protocol,
    error::ShardError,
};

use super::Env;

/// The tokens every row of `metric`'s bucket holds now, added up (each row counted
/// once: the dimension's own and its shards `{dimension}#{k}`).
async fn whole_available(env: &Env, metric: &str) -> Tokens {
    let base = env.dim(metric);
    let shard = format!("{base}#");
    let rows: Vec<_> = env
        .store
        .list_buckets()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.dimension.as_str() == base || r.dimension.as_str().starts_with(&shard))
        .collect();
    assert_eq!(
        rows.len(),
        usize::from(rows[0].shards),
        "every shard has its row"
    );
    rows.iter()
        .fold(Tokens::ZERO, |sum, r| sum + r.available(env.clock.now()))
}

/// Four clients that reshard on their own, over rows of at most 10 writes a second, up
/// to `max_shards` rows.
fn resharding_clients(env: &Env, max_shards: u16) -> Vec<sluice::Sluice> {
    (0..4)
        .map(|i| {
            env.client_with(&format!("c{i}"), |c| sluice::Config {
                sharding: sluice::Sharding {
                    item_write_ceiling: Some(10),
                    max_shards,
                },
                ..c
            })
        })
        .collect()
}

pub async fn a_sharded_bucket_grants_its_whole_capacity_and_answers_the_bucket_s_retry_in(
    env: Env,
) {
    let d = env
        .define(
            "tpm",
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000),
        )
        .await;
    let rows = env.sluice.reshard(&d, 4).await.unwrap();
    assert_eq!(rows.len(), 4);
    assert!(
        rows.iter()
            .all(|r| r.shards == 4 && r.tokens == Tokens::new(250))
    );
    assert_eq!(whole_available(&env, "tpm").await, Tokens::new(1_000));
    // An operator sees one bucket: the whole, not its rows.
    let snap = env.sluice.snapshot(&d).await.unwrap();
    assert_eq!(
        (snap.capacity, snap.available),
        (Tokens::new(1_000), Tokens::new(1_000))
    );
    let all = env.sluice.snapshots().await.unwrap();
    let mine: Vec<_> = all
        .iter()
        .filter(|s| s.dimension.as_str().starts_with(&d))
        .collect();
    assert_eq!(mine.len(), 1, "{all:?}");
    assert_eq!(mine[0].dimension.as_str(), d);
    if env.protocol() == Protocol::Seed {
        // The seed's protocol knows the dimension's own row only: a bucket of its share,
        // and the other shards keep theirs.
        let e = env
            .sluice
            .acquire(Acquire::with_cost(&d, 251))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::CostExceedsCapacity { .. }), "{e}");
        let _held = env
            .sluice
            .acquire(Acquire::with_cost(&d, 250))
            .await
            .unwrap();
        assert_eq!(whole_available(&env, "tpm").await, Tokens::new(750));
        return;
    }
    // The whole capacity in one acquire: every shard gives its part.
    let grant = env
        .sluice
        .acquire(Acquire::with_cost(&d, 1_000))
        .await
        .unwrap();
    assert_eq!(whole_available(&env, "tpm").await, Tokens::ZERO);
    drop(grant);
    // Empty, the bucket refills 100 a second over its four rows: one token in 10 ms (a
    // single shard would take 40 ms to hold one).
    let e = env
        .sluice
        .acquire(Acquire::with_cost(&d, 1))
        .await
        .unwrap_err();
    assert_eq!(e.retry_in(), Some(Duration::from_millis(10)), "{e}");
    env.advance_ms(9);
    let e = env
        .sluice
        .acquire(Acquire::with_cost(&d, 1))
        .await
        .unwrap_err();
    assert_eq!(e.retry_in(), Some(Duration::from_millis(1)), "{e}");
    env.advance_ms(1);
    let _held = env.sluice.acquire(Acquire::with_cost(&d, 1)).await.unwrap();
    assert_eq!(whole_available(&env, "tpm").await, Tokens::ZERO);
    // A cost beyond the whole capacity is the whole bucket's error.
    let e = env
        .sluice
        .acquire(Acquire::with_cost(&d, 1_001))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::CostExceedsCapacity { capacity, .. } if capacity == Tokens::new(1_000)),
        "{e}"
    );
}

pub async fn clients_on_a_bucket_resharded_between_their_grants_never_over_grant(env: Env) {
    let d = env
        .define(
            "rpm",
            Bucket::requests(RefillRate::per_minute(1)).with_capacity(120),
        )
        .await;
    let clients: Vec<_> = (0..3).map(|i| env.client(&format!("c{i}"))).collect();
    let mut granted = 0u32;
    for (round, shards) in [4u16, 1, 8, 3, 2].into_iter().enumerate() {
        // Each round, every client takes 8 (one at a time), then the bucket is resharded.
        for c in &clients {
            for _ in 0..8 {
                if c.acquire(Acquire::new(&d)).await.is_ok() {
                    granted += 1;
                }
            }
        }
        env.sluice.reshard(&d, shards).await.unwrap();
        let left = whole_available(&env, "rpm").await;
        assert_eq!(left, Tokens::new(120 - i64::from(granted)), "round {round}");
    }
    // Then they drain it: exactly what is left, not one more (the clock stands still).
    loop {
        let mut any = false;
        for c in &clients {
            match c.acquire(Acquire::new(&d)).await {
                Ok(_) => {
                    granted += 1;
                    any = true;
                }
                Err(e) => assert!(e.retry_in().is_some(), "{e}"),
            }
        }
        if !any {
            break;
        }
    }
    let expected = if env.protocol() == Protocol::Seed {
        // The seed's protocol drains shard 0's share only.
        120 - i64::from(granted)
    } else {
        0
    };
    assert_eq!(whole_available(&env, "rpm").await, Tokens::new(expected));
    assert!(granted <= 120);
}

pub async fn a_sharded_bucket_is_redefined_and_deleted_as_a_whole(env: Env) {
    let d = env
        .define(
            "rpm",
            Bucket::requests(RefillRate::per_minute(60)).with_capacity(400),
        )
        .await;
    env.sluice.reshard(&d, 4).await.unwrap();
    let _held = env
        .sluice
        .acquire(Acquire::with_cost(&d, 100))
        .await
        .unwrap();
    assert_eq!(whole_available(&env, "rpm").await, Tokens::new(300));
    // Lowered to 200: each row gets its share of the new capacity, the tokens held now
    // are kept (capped at the new capacity), and the rows stay four.
    let first = env
        .sluice
        .put_bucket(
            &d,
            Bucket::requests(RefillRate::per_minute(60)).with_capacity(200),
        )
        .await
        .unwrap();
    assert_eq!(
        (first.shards, first.bucket.capacity()),
        (4, Tokens::new(50))
    );
    assert_eq!(whole_available(&env, "rpm").await, Tokens::new(200));
    // Raised to 1,000: nothing is handed out that the bucket did not hold.
    env.sluice
        .put_bucket(
            &d,
            Bucket::requests(RefillRate::per_minute(60)).with_capacity(1_000),
        )
        .await
        .unwrap();
    assert_eq!(whole_available(&env, "rpm").await, Tokens::new(200));
    // A definition too small for four rows is refused, with the reason.
    let e = env
        .sluice
        .put_bucket(&d, Bucket::requests(RefillRate::per_minute(3)))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Shards(_)), "{e}");
    assert!(env.sluice.delete_bucket(&d).await.unwrap());
    let prefix = format!("{d}#");
    let left: Vec<_> = env
        .store
        .list_buckets()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.dimension.as_str() == d || r.dimension.as_str().starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

pub async fn a_hot_bucket_spreads_itself_and_gathers_back_when_it_cools(env: Env) {
    let d = env
        .define(
            "rpm",
            Bucket::requests(RefillRate::per_minute(1)).with_capacity(100_000),
        )
        .await;
    // Rows that take at most 10 writes a second; four clients, 400 grants a second.
    let clients = resharding_clients(&env, 8);
    let shards = |env: &Env| {
        let d = d.clone();
        let sluice = env.sluice.clone();
        async move { sluice.bucket(&d).await.unwrap().unwrap().shards }
    };
    let start = env.clock.now();
    let mut granted = 0i64;
    let mut spread_at = None;
    for round in 0..400 {
        for c in &clients {
            // A reshard in the background may hold the rows a moment: waited out.
            let lease = c
                .acquire_within(Acquire::new(&d), Duration::from_secs(2))
                .await
                .unwrap();
            lease.release().await.unwrap();
            granted += 1;
        }
        env.advance_ms(10);
        if spread_at.is_none() && shards(&env).await > 1 {
            spread_at = Some(round);
        }
    }
    let seed = env.protocol() == Protocol::Seed;
    if seed {
        // The seed's protocol writes the one row it knows and never reshards.
        assert_eq!(shards(&env).await, 1);
    } else {
        // Spread within a window or two of the first sure measure (two hot windows: about
        // two seconds in), to the most allowed: 400 a second over rows of 10 wants 128.
        // Each client acts with odds of twice its share (a half), doubled each window in
        // which nobody did: by the window after at the latest.
        assert!(
            spread_at.is_some_and(|r| r <= 350),
            "spread at {spread_at:?}"
        );
        assert_eq!(shards(&env).await, 8);
    }
    // Cool: one grant per client every 6 s (under a tenth of a row's ceiling, even on one
    // row, however the clients' picks fall). After enough cool measures in a row
    // (`Sharding::COOL_WINDOWS`), half as many rows, and so on to one row again.
    for _ in 0..1_000 {
        env.advance_ms(6_000);
        for c in &clients {
            // A reshard another acquire decided runs in the background: its transaction
            // may hold the rows a moment (back-pressure), which a caller waits out.
            c.acquire_within(Acquire::new(&d), Duration::from_secs(2))
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
            granted += 1;
        }
        if shards(&env).await == 1 {
            break;
        }
    }
    assert_eq!(shards(&env).await, 1, "gathered back when cool");
    // No token made or lost by the reshards: what was granted and what is left add up
    // to the capacity and the refill since (one a minute), to a millionth of a token
    // (refill is counted in billionths, each write rounding its part down).
    let elapsed = env.clock.now().as_millis() - start.as_millis();
    let refill = Tokens::from_nanos(i128::from(elapsed) * 1_000_000_000 / 60_000);
    let expected = Tokens::new(100_000 - granted) + refill;
    let left = whole_available(&env, "rpm").await;
    let off = (left.as_nanos() - expected.as_nanos()).abs();
    assert!(off <= 1_000, "left {left}, expected {expected}");
}

pub async fn corrections_follow_a_grant_over_shards_and_shards_gathered_away(env: Env) {
    let d = env
        .define(
            "tpm",
            Bucket::tokens(RefillRate::per_minute(1)).with_capacity(1_000),
        )
        .await;
    env.sluice.reshard(&d, 4).await.unwrap();
    if env.protocol() == Protocol::Seed {
        return;
    }
    // 300 from rows of 250: two parts. Corrected to 100: 200 back, whichever rows gave.
    let mut gathered = env
        .sluice
        .acquire(Acquire::with_cost(&d, 300))
        .await
        .unwrap();
    assert_eq!(
        gathered.id().to_string().matches(',').count(),
        1,
        "two parts"
    );
    gathered.adjust(&d, 100).await.unwrap();
    assert_eq!(whole_available(&env, "tpm").await, Tokens::new(900));
    gathered.adjust(&d, 400).await.unwrap();
    assert_eq!(whole_available(&env, "tpm").await, Tokens::new(600));
    // A grant taken from shard 1, 2 or 3, whose row a reshard to one row then removes:
    // its refund goes to the row that took its place.
    let mut on_shard = loop {
        let lease = env
            .sluice
            .acquire(Acquire::with_cost(&d, 10))
            .await
            .unwrap();
        // `lease#{vendor}#{metric}#{k}#{unique}`: a shard other than the dimension's own.
        if lease.id().to_string().split('#').count() == 5 {
            break lease;
        }
        lease.release().await.unwrap();
    };
    env.sluice.reshard(&d, 1).await.unwrap();
    let before = whole_available(&env, "tpm").await;
    on_shard.adjust(&d, 0).await.unwrap();
    assert_eq!(whole_available(&env, "tpm").await, before + Tokens::new(10));
}

pub async fn several_dimensions_and_priorities_on_sharded_buckets(env: Env) {
    let (rpm, tpm) = (env.dim("rpm"), env.dim("tpm"));
    env.sluice
        .put_bucket(
            &rpm,
            Bucket::requests(RefillRate::per_minute(1))
                .with_capacity(40)
                .with_reserve("interactive".parse().unwrap(), 8),
        )
        .await
        .unwrap();
    env.sluice
        .put_bucket(
            &tpm,
            Bucket::tokens(RefillRate::per_minute(1)).with_capacity(1_000),
        )
        .await
        .unwrap();
    env.sluice.reshard(&rpm, 4).await.unwrap();
    env.sluice.reshard(&tpm, 2).await.unwrap();
    if env.protocol() == Protocol::Seed {
        return;
    }
    // A pair taking more of `tpm` than either of its rows holds: granted whole, all or
    // nothing.
    let pair = env
        .sluice
        .acquire(Acquire::with_cost(&rpm, 1).and_cost(&tpm, 700))
        .await
        .unwrap();
    assert_eq!(whole_available(&env, "rpm").await, Tokens::new(39));
    assert_eq!(whole_available(&env, "tpm").await, Tokens::new(300));
    // Refused on `tpm`: nothing held on `rpm`.
    let e = env
        .sluice
        .acquire(Acquire::with_cost(&rpm, 1).and_cost(&tpm, 301))
        .await
        .unwrap_err();
    assert!(e.retry_in().is_some(), "{e}");
    assert_eq!(whole_available(&env, "rpm").await, Tokens::new(39));
    pair.release().await.unwrap();
    // `batch` (not listed) leaves the 8 kept for `interactive` across the rows: 31 more.
    let batch = env.client_with("batch", |c| sluice::Config {
        priority: Some("batch".parse().unwrap()),
        ..c
    });
    let taken = batch.acquire(Acquire::with_cost(&rpm, 31)).await.unwrap();
    let e = batch
        .acquire(Acquire::with_cost(&rpm, 1))
        .await
        .unwrap_err();
    assert!(e.retry_in().is_some(), "{e}");
    let interactive = env.client_with("interactive", |c| sluice::Config {
        priority: Some("interactive".parse().unwrap()),
        ..c
    });
    let reserved = interactive
        .acquire(Acquire::with_cost(&rpm, 8))
        .await
        .unwrap();
    assert_eq!(whole_available(&env, "rpm").await, Tokens::ZERO);
    drop((taken, reserved));
}

/// A reshard to 8 rows of a requests bucket of 1,000 with 100 taken, whose write a gate
/// holds while another client takes `costs` (the clock stands still: nothing refills),
/// then lets go.
struct RacedReshard {
    d: String,
    /// The 100 taken before, and what the other client holds.
    held: Vec<sluice::Lease>,
    /// What the other client took while the reshard was held.
    taken: i64,
    rows: usize,
    gate: std::sync::Arc<super::Gate>,
}

impl RacedReshard {
    /// Checks the reshard landed on 8 rows after `attempts` transactions (`why`), and that
    /// every token the others took stays taken, none made.
    async fn landed(&self, env: &Env, attempts: u32, why: &str) {
        assert_eq!(self.rows, 8);
        let sent = self.gate.reshards.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(sent, attempts, "{why}");
        assert_eq!(
            whole_available(env, "rpm").await,
            Tokens::new(1_000 - 100 - self.taken),
            "every token the others took stays taken, none is made"
        );
    }
}

async fn reshard_raced(env: &Env, ignores_moves: bool, costs: &[i64]) -> RacedReshard {
    reshard_raced_on(env, ignores_moves, false, costs).await
}

/// [`reshard_raced`], with the row (100 taken) written whole by another SDK first when
/// `seed_written`: the seed's attributes as they were, no write id.
async fn reshard_raced_on(
    env: &Env,
    ignores_moves: bool,
    seed_written: bool,
    costs: &[i64],
) -> RacedReshard {
    let d = env
        .define(
            "rpm",
            Bucket::requests(RefillRate::per_second(10)).with_capacity(1_000),
        )
        .await;
    // Not full: a full row's level does not depend on what it stores while the refill
    // covers the takes, and here the clock stands still.
    let mut held = vec![
        env.sluice
            .acquire(Acquire::with_cost(&d, 100))
            .await
            .unwrap(),
    ];
    if seed_written {
        let read = env.sluice.bucket(&d).await.unwrap().unwrap();
        let mut seed = read.clone();
        seed.version = read.version + 1;
        seed.set_write_id(None);
        seed.set_recent_writes(sluice::store::RecentWrites::default());
        assert!(env.store.put_bucket(&seed, Some(&read)).await.unwrap());
    }
    let (gate, open) = super::Gate::new(env, "rpm");
    gate.ignores_moves
        .store(ignores_moves, std::sync::atomic::Ordering::SeqCst);
    let resharder = gate.client(env);
    let resharding = tokio::spawn({
        let d = d.clone();
        async move { resharder.reshard(&d, 8).await }
    });
    // The reshard has read the row and its write is held: another client takes from it
    // meanwhile.
    gate.arrived.notified().await;
    let other = env.client("other");
    let mut taken = 0;
    for &cost in costs {
        held.push(other.acquire(Acquire::with_cost(&d, cost)).await.unwrap());
        taken += cost;
    }
    open.send(true).unwrap();
    let rows = resharding.await.unwrap().unwrap().len();
    RacedReshard {
        d,
        held,
        taken,
        rows,
        gate,
    }
}

/// A reshard reads every row, then writes them in one transaction: on a hot bucket the
/// rows change in between. The rows that stay are moved by what they give or take, so the
/// reshard lands at its first attempt, and what the other clients took meanwhile stays
/// taken.
pub async fn a_reshard_lands_on_rows_other_clients_take_from_meanwhile(env: Env) {
    let raced = reshard_raced(&env, false, &[7, 9, 11, 13, 15, 17, 19, 21]).await;
    let (d, taken) = (&raced.d, raced.taken);
    assert_eq!(raced.rows, 8);
    assert_eq!(
        raced
            .gate
            .reshards
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the reshard landed at its first attempt"
    );
    assert_eq!(
        whole_available(&env, "rpm").await,
        Tokens::new(1_000 - 100 - taken),
        "every token the others took stays taken, none is made"
    );
    // A client goes on with the new rows: the rest is granted whole, then refused. (On
    // the fast protocol: the seed protocol's clients see shard 0 alone, as the seed's
    // other SDKs do.)
    let mut held = raced.held;
    drop(held.remove(0));
    let fast = env.fast_client("fast");
    let rest = fast
        .acquire(Acquire::with_cost(d, 1_000 - 100 - taken))
        .await
        .unwrap();
    assert!(matches!(
        fast.acquire(Acquire::new(d)).await,
        Err(Error::RetryIn(_))
    ));
    drop((held, rest));
}

/// A row another SDK wrote whole carries no write id (the seed's SDKs, Terraform): the
/// reshard moves it as it moves sluice's own rows, so it lands at its first attempt
/// there too, however often the row is written meanwhile; what the others took stays
/// taken.
pub async fn a_reshard_lands_on_a_row_another_sdk_wrote_while_others_take_from_it(env: Env) {
    let raced = reshard_raced_on(&env, false, true, &[7, 9, 11, 13]).await;
    raced
        .landed(&env, 1, "the reshard landed at its first attempt")
        .await;
}

/// A store may ignore a reshard's moves (see `Store::respread_buckets`): then a reshard
/// whose rows other clients took from meanwhile is refused as a whole, reads the rows
/// again and lands; what the others took stays taken, and no token is made.
pub async fn a_store_that_ignores_moves_still_reshards_exactly(env: Env) {
    let raced = reshard_raced(&env, true, &[7, 9, 11]).await;
    raced
        .landed(&env, 2, "refused once (its rows moved), then landed")
        .await;
}

/// A bucket whose definition pins or caps its rows: defining it spreads it, a reshard by
/// hand outside the bound is refused, a new bound moves it, and automatic sharding stays
/// within it whatever the load.
pub async fn a_bucket_pinned_or_capped_by_its_definition_keeps_within_it(env: Env) {
    let d = env.dim("rpm");
    let rpm = Bucket::requests(RefillRate::per_minute(1)).with_capacity(100_000);
    let shards = || {
        let (d, sluice) = (d.clone(), env.sluice.clone());
        async move { sluice.bucket(&d).await.unwrap().unwrap().shards }
    };
    let define = |limit| {
        let (d, sluice, bucket) = (d.clone(), env.sluice.clone(), rpm.clone());
        async move {
            sluice
                .put_bucket(&d, bucket.with_shards(limit))
                .await
                .unwrap()
        }
    };
    let pinned = define(ShardLimit::Pinned(4)).await;
    assert_eq!((pinned.shards, shards().await), (4, 4));
    assert!(matches!(
        env.sluice.reshard(&d, 8).await,
        Err(Error::Shards(ShardError::Limited { shards: 8, .. }))
    ));
    assert_eq!(whole_available(&env, "rpm").await, Tokens::new(100_000));
    // Pinned to one row: gathered at once by the redefinition, every token kept; then
    // capped at 2 (one row is within it: left as it is).
    define(ShardLimit::Pinned(1)).await;
    assert_eq!(shards().await, 1);
    assert_eq!(whole_available(&env, "rpm").await, Tokens::new(100_000));
    define(ShardLimit::AtMost(2)).await;
    assert_eq!(shards().await, 1);
    // Hot enough to want 128 rows of 10 writes a second: spread to 2 and no further, by
    // clients that would go to 32 (the seed's protocol never reshards), within four
    // windows (see `a_hot_bucket_spreads_itself_and_gathers_back_when_it_cools`).
    let clients = resharding_clients(&env, 32);
    for _ in 0..400 {
        for c in &clients {
            // A reshard another acquire decided runs in the background: its transaction
            // may hold the rows a moment (back-pressure), which a caller waits out.
            c.acquire_within(Acquire::new(&d), Duration::from_secs(2))
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }
        env.advance_ms(10);
        assert!(shards().await <= 2, "beyond its cap");
    }
    let spread = if env.protocol() == Protocol::Seed {
        1
    } else {
        2
    };
    assert_eq!(shards().await, spread);
}

/// A client with one caller knows a bucket as one row when other clients spread it: its
/// next write goes to that row, which the store throttles (the row is hot: that is why it
/// was spread). The throttle's answer does not say the bucket was spread; one read of the
/// row does, and the client is granted from another row at once, not sent to wait.
pub async fn a_client_throttled_on_a_row_since_spread_learns_the_spread_at_once(env: Env) {
    let d = env
        .define(
            "rpm",
            Bucket::requests(RefillRate::per_second(10)).with_capacity(100),
        )
        .await;
    let (gate, open) = super::Gate::new(&env, "rpm");
    open.send(true).unwrap();
    let lone = gate.client_with(&env, |c| sluice::Config {
        protocol: Protocol::Fast,
        ..c
    });
    lone.acquire(Acquire::new(&d))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    env.sluice.reshard(&d, 4).await.unwrap();
    // From now on the store throttles every write of the first row.
    gate.throttling
        .store(u32::MAX, std::sync::atomic::Ordering::SeqCst);
    for i in 0..40 {
        let lease = lone.acquire(Acquire::new(&d)).await;
        assert!(lease.is_ok(), "acquire {i}: {lease:?}");
        lease.unwrap().release().await.unwrap();
    }
    // Each acquire met at most one throttle: its first row, when that was the first
    // row; the whole bucket then sends it to another.
    let throttled = u32::MAX - gate.throttling.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (1..=40).contains(&throttled),
        "{throttled} throttled writes"
    );
    assert_eq!(whole_available(&env, "rpm").await, Tokens::new(100 - 41));
}

/// A clock some milliseconds off another's, for a client of the suite on another "host".
#[derive(Debug, Clone)]
struct Skewed {
    inner: sluice::clock::ManualClock,
    offset_ms: i64,
}

impl sluice::clock::Clock for Skewed {
    fn now(&self) -> sluice::clock::UnixMillis {
        sluice::clock::UnixMillis::new(self.inner.now().as_millis() + self.offset_ms)
    }
}

/// A client whose clock is 2 s behind the other writers' spreads a bucket they refilled
/// "in its future", then gathers it back: no refill is counted twice, none is counted
/// before it comes by any row's timestamp, and the others go on from the rows it wrote.
/// What a row refilled "in its future" holds is kept exactly (the refill of rows stamped
/// earlier than the latest, which such a clock cannot tell from refill still to come, a
/// row filled ahead as docs/dynamodb.md says, would be dropped: never more than the bucket
/// held). A grant gathered from several rows in between is a take of each, which moves no
/// row's timestamp.
pub async fn a_reshard_by_a_client_whose_clock_is_behind_counts_no_refill_early(env: Env) {
    let d = env
        .define(
            "tpm",
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000),
        )
        .await;
    let other = env.fast_client("other");
    drop(other.acquire(Acquire::with_cost(&d, 600)).await.unwrap());
    env.advance_ms(1_000);
    // Refilled by a take at the others' now: 400 + 100 - 50.
    drop(other.acquire(Acquire::with_cost(&d, 50)).await.unwrap());
    let behind = sluice::SluiceBuilder::from_config(env.sluice.config().clone())
        .store_arc(env.store.clone())
        .clock(Skewed {
            inner: env.clock.clone(),
            offset_ms: -2_000,
        })
        .build()
        .unwrap();
    assert_eq!(whole_available(&env, "tpm").await, Tokens::new(450));
    let rows = behind.reshard(&d, 4).await.unwrap();
    assert_eq!(rows.len(), 4);
    assert_eq!(whole_available(&env, "tpm").await, Tokens::new(450));
    // A second on, by the others' clock: exactly a second of refill more, on every row.
    env.advance_ms(1_000);
    assert_eq!(whole_available(&env, "tpm").await, Tokens::new(550));
    // Gathered from two rows (none holds 200 alone): each part a take of its row, neither
    // full nor refilled a minute ago, so it leaves the row's refill timestamp where it was.
    drop(other.acquire(Acquire::with_cost(&d, 200)).await.unwrap());
    assert_eq!(whole_available(&env, "tpm").await, Tokens::new(350));
    // Every row keeps the others' timestamp of a second ago, which the reshard keeps with
    // what the rows hold: nothing dropped, nothing early (1,000 less 850 taken, plus three
    // seconds of refill by the others' clock).
    let rows = behind.reshard(&d, 1).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(whole_available(&env, "tpm").await, Tokens::new(350));
    env.advance_ms(1_000);
    assert_eq!(whole_available(&env, "tpm").await, Tokens::new(450));
}
