//! Priorities and reserves over random sequences: the bucket math alone, then several
//! clients (fast, seed, lean) on one in-memory store.
//!
//! - No grant at priority `p` leaves the bucket below the reserves kept above `p`.
//! - A RetryIn at priority `p` is exact: one millisecond earlier is refused, at the delay it
//!   is granted.
//! - The highest priority (no priority, or the first listed) behaves exactly as on a bucket
//!   with no reserves.

use std::time::Duration;

use proptest::prelude::*;
use sluice::{
    Acquire, Bucket, Config, Error, MemoryStore, Priority, RefillRate, Sluice, SluiceBuilder,
    Tokens, bucket::BucketState, clock::ManualClock, clock::UnixMillis, config::Protocol,
    store::Take,
};

const NAMES: [&str; 4] = ["interactive", "standard", "batch", "unlisted"];

fn priority(i: usize) -> Option<Priority> {
    // 4: no priority at all.
    NAMES.get(i).map(|n| n.parse().unwrap())
}

/// A bucket with reserves for the first `listed` names, each `reserve` tokens.
fn reserved(bucket: Bucket, listed: usize, reserve: i64) -> Bucket {
    NAMES[..listed]
        .iter()
        .fold(bucket, |b, n| b.with_reserve(n.parse().unwrap(), reserve))
}

fn at(ms: i64) -> UnixMillis {
    UnixMillis::new(1_700_000_000_000 + ms)
}

#[derive(Debug, Clone)]
enum Step {
    Take { who: usize, cost: i64 },
    Advance(i64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0usize..5, 1i64..=6).prop_map(|(who, cost)| Step::Take { who, cost }),
        2 => (0i64..700).prop_map(Step::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_math_keeps_the_reserves_above_and_waits_exactly(
        capacity in 4i64..=20,
        per_second in 1u64..=20,
        listed in 1usize..=3,
        reserve in 1i64..=3,
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        let rate = RefillRate::per_second(per_second);
        let plain = Bucket::requests(rate).with_capacity(capacity);
        let bucket = reserved(plain.clone(), listed, reserve);
        prop_assume!(bucket.validate().is_ok());
        let mut row = BucketState::full("prop#rpm".parse().unwrap(), bucket.clone(), at(0));
        let mut now = 0;
        for s in steps {
            match s {
                Step::Advance(ms) => now += ms,
                Step::Take { who, cost } => {
                    let p = priority(who);
                    let floor = bucket.floor_for(p.as_ref());
                    let cost = Tokens::new(cost);
                    let take = row.take_as(cost, p.as_ref(), at(now));
                    // The highest priority: exactly what a bucket with no reserves answers.
                    if floor == Tokens::ZERO {
                        let mut unreserved = row.clone();
                        unreserved.bucket = plain.clone();
                        prop_assert_eq!(&take, &unreserved.take(cost, at(now)));
                    }
                    match take {
                        Take::Granted { level } => {
                            prop_assert!(level.tokens >= floor, "{:?} left {} below its floor {}", p, level.tokens, floor);
                            row.set_level(level);
                        }
                        Take::Short { wait: Some(wait) } => {
                            let ms = i64::try_from(wait.as_millis()).unwrap();
                            prop_assert!(ms >= 1);
                            prop_assert!(
                                !matches!(row.take_as(cost, p.as_ref(), at(now + ms - 1)), Take::Granted { .. }),
                                "granted a millisecond before the wait of {:?}", wait
                            );
                            prop_assert!(
                                matches!(row.take_as(cost, p.as_ref(), at(now + ms)), Take::Granted { .. }),
                                "refused after the wait of {:?}", wait
                            );
                        }
                        Take::ExceedsCapacity => prop_assert!(cost > bucket.capacity()),
                        Take::ExceedsShare { share } => {
                            prop_assert!(cost + floor > bucket.capacity());
                            prop_assert_eq!(share, bucket.capacity() - floor);
                        }
                        other => prop_assert!(false, "unexpected {:?} from a requests bucket", other),
                    }
                }
            }
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// One client of each kind on `store`: fast, seed, fast folding the refill into the row on
/// every grant that counts it.
fn clients(store: &std::sync::Arc<MemoryStore>, clock: &ManualClock) -> Vec<Sluice> {
    [Protocol::Fast, Protocol::Seed, Protocol::Fast]
        .into_iter()
        .enumerate()
        .map(|(i, protocol)| {
            SluiceBuilder::from_config(Config {
                protocol,
                fold_after: if i == 2 {
                    Duration::from_millis(1)
                } else {
                    sluice::config::DEFAULT_FOLD_AFTER
                },
                ..Config::default()
            })
            .store_arc(store.clone())
            .clock(clock.clone())
            .build()
            .unwrap()
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        client: usize,
        who: usize,
        cost: i64,
    },
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..3, 0usize..5, 1i64..=5).prop_map(|(client, who, cost)| Op::Acquire { client, who, cost }),
        2 => (0u64..600).prop_map(Op::Advance),
    ]
}

/// What one acquire answered, for comparing two runs.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Granted,
    RetryIn(Duration),
    Never,
}

/// Runs `ops` on a fresh store with `bucket`, checking after every grant that the row
/// keeps the reserves above its priority and that every RetryIn is exact; the answers.
async fn run(
    bucket: Bucket,
    lean: bool,
    ops: &[Op],
    only_highest: bool,
) -> Result<Vec<Answer>, TestCaseError> {
    let store = std::sync::Arc::new(MemoryStore::new());
    let clock = ManualClock::new(at(0));
    let clients = clients(&store, &clock);
    let dim = "prop#rpm";
    let bucket = if lean { bucket.lean() } else { bucket };
    clients[0].put_bucket(dim, bucket.clone()).await.unwrap();
    let mut answers = Vec::new();
    for op in ops {
        match op {
            Op::Advance(ms) => clock.advance(Duration::from_millis(*ms)),
            Op::Acquire { client, who, cost } => {
                let p = if only_highest { None } else { priority(*who) };
                let request = Acquire::with_cost(dim, *cost).or_priority(p.clone());
                let sluice = &clients[*client];
                match sluice.acquire(request.clone()).await {
                    Ok(lease) => {
                        let row = sluice.bucket(dim).await.unwrap().unwrap();
                        let floor = bucket.floor_for(p.as_ref());
                        prop_assert!(
                            row.available(clock.now()) >= floor,
                            "{:?} took from the reserves above it: {} left, floor {}",
                            p,
                            row.available(clock.now()),
                            floor
                        );
                        lease.release().await.unwrap();
                        answers.push(Answer::Granted);
                    }
                    Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => {
                        // Never late: a millisecond earlier is refused. At the delay it is
                        // granted, unless another client took tokens after the row it was
                        // computed from (an early RetryIn): then the live row is short.
                        clock.advance(d - Duration::from_millis(1));
                        let early = sluice.acquire(request.clone()).await;
                        prop_assert!(
                            matches!(early, Err(Error::RetryIn(_))),
                            "granted 1 ms early: {:?}",
                            early.map(|_| ())
                        );
                        clock.advance(Duration::from_millis(1));
                        match sluice.acquire(request).await {
                            Ok(lease) => lease.release().await.unwrap(),
                            Err(Error::RetryIn(_)) => {
                                let row = sluice.bucket(dim).await.unwrap().unwrap();
                                let live = row.take_as(Tokens::new(*cost), p.as_ref(), clock.now());
                                prop_assert!(
                                    !matches!(live, Take::Granted { .. }),
                                    "refused at its RetryIn {:?} with room",
                                    d
                                );
                            }
                            Err(e) => prop_assert!(false, "unexpected error {}", e),
                        }
                        answers.push(Answer::RetryIn(d));
                    }
                    Err(Error::CostExceedsShare { .. } | Error::CostExceedsCapacity { .. }) => {
                        answers.push(Answer::Never);
                    }
                    Err(e) => prop_assert!(false, "unexpected error {}", e),
                }
            }
        }
    }
    Ok(answers)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn clients_of_every_kind_keep_the_reserves_and_answer_exact_waits(
        capacity in 4u64..=12,
        per_second in 1u64..=10,
        listed in 1usize..=3,
        lean in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let plain = Bucket::requests(RefillRate::per_second(per_second)).with_capacity(capacity);
        let bucket = reserved(plain.clone(), listed, 1);
        runtime().block_on(async {
            run(bucket.clone(), lean, &ops, false).await?;
            // The highest priority: the same answers as with no reserves at all.
            let with = run(bucket, lean, &ops, true).await?;
            let without = run(plain, lean, &ops, true).await?;
            prop_assert_eq!(with, without);
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn a_concurrent_bucket_keeps_slots_free_for_higher_priorities() {
    let sluice = Sluice::in_memory();
    let slots = Bucket::concurrent(4).with_reserve("interactive".parse().unwrap(), 2);
    sluice.put_bucket("voice#concurrent", slots).await.unwrap();
    let batch = || Acquire::new("voice#concurrent").priority("batch".parse().unwrap());
    let a = sluice.acquire(batch()).await.unwrap();
    let b = sluice.acquire(batch()).await.unwrap();
    assert!(matches!(
        sluice.acquire(batch()).await,
        Err(Error::RetryIn(_))
    ));
    let interactive = || Acquire::new("voice#concurrent").priority("interactive".parse().unwrap());
    let c = sluice.acquire(interactive()).await.unwrap();
    // Two slots are kept free from `batch`, whoever holds the others: with `interactive`
    // in one, a slot `batch` gives back is one of those two.
    a.release().await.unwrap();
    assert!(matches!(
        sluice.acquire(batch()).await,
        Err(Error::RetryIn(_))
    ));
    let a = sluice.acquire(interactive()).await.unwrap();
    let d = sluice.acquire(interactive()).await.unwrap();
    assert!(matches!(
        sluice.acquire(interactive()).await,
        Err(Error::RetryIn(_))
    ));
    for lease in [a, b, c, d] {
        lease.release().await.unwrap();
    }
    assert_eq!(
        sluice.snapshot("voice#concurrent").await.unwrap().available,
        Tokens::new(4)
    );
}

#[tokio::test]
async fn a_cost_beyond_a_priority_s_share_is_a_typed_error_naming_it() {
    let sluice = Sluice::in_memory();
    let tpm = Bucket::tokens(RefillRate::per_minute(1_000))
        .with_reserve("interactive".parse().unwrap(), 400);
    sluice.put_bucket("openai#tpm", tpm).await.unwrap();
    let e = sluice
        .acquire(Acquire::with_cost("openai#tpm", 700).priority("batch".parse().unwrap()))
        .await
        .unwrap_err();
    match &e {
        Error::CostExceedsShare {
            priority,
            share,
            cost,
            ..
        } => {
            assert_eq!(priority.as_str(), "batch");
            assert_eq!((*share, *cost), (Tokens::new(600), Tokens::new(700)));
        }
        other => panic!("expected CostExceedsShare, got {other:?}"),
    }
    assert!(e.to_string().contains("priority `batch`"), "{e}");
    // The same cost at the highest priority is granted.
    sluice
        .acquire(Acquire::with_cost("openai#tpm", 700).priority("interactive".parse().unwrap()))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn the_client_default_priority_applies_to_acquires_that_name_none() {
    let clock = ManualClock::new(at(0));
    let store = std::sync::Arc::new(MemoryStore::new());
    let batch = Sluice::builder()
        .store_arc(store.clone())
        .clock(clock.clone())
        .priority("batch".parse().unwrap())
        .build()
        .unwrap();
    let rpm = Bucket::requests(RefillRate::per_second(1))
        .with_capacity(3)
        .with_reserve("interactive".parse().unwrap(), 2);
    batch.put_bucket("v#rpm", rpm).await.unwrap();
    batch
        .acquire("v#rpm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(
        batch.acquire("v#rpm").await.unwrap_err().retry_in(),
        Some(Duration::from_secs(1))
    );
    // The acquire's own priority wins over the client's.
    batch
        .acquire(Acquire::new("v#rpm").priority("interactive".parse().unwrap()))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn bad_reserves_are_refused_with_the_attribute_named() {
    let sluice = Sluice::in_memory();
    let p = |s: &str| -> Priority { s.parse().unwrap() };
    let cases = [
        Bucket::concurrent(4).with_reserve(p("a"), 5),
        Bucket::concurrent(4).with_reserve(p("a"), 0),
        Bucket::concurrent(4)
            .with_reserve(p("a"), 1)
            .with_reserve(p("a"), 1),
        (0..9).fold(Bucket::concurrent(100), |b, i| {
            b.with_reserve(p(&format!("p{i}")), 1)
        }),
    ];
    for bucket in cases {
        match sluice.put_bucket("v#concurrent", bucket.clone()).await {
            Err(Error::InvalidBucket { source, .. }) => assert_eq!(source.attribute(), "reserves"),
            other => panic!("{bucket:?}: expected InvalidBucket, got {other:?}"),
        }
    }
}
