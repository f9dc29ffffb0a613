//! Several clients on one bucket spread over rows that a reshard changes between their
//! steps: a model-based test against the true bucket, the sum of its rows read raw.
//!
//! Two to four clients (the fast path at three priorities, and the seed's protocol, which
//! knows the dimension's own row only) run random sequences of acquires, releases, cost
//! corrections, reshards to 1 to 6 rows and clock steps. After every step:
//!
//! - **the ledger**: a grant takes exactly its cost from the whole (the sum of every row's
//!   tokens, refilled), a refusal and a release take nothing, a reshard neither makes nor
//!   loses a token, a correction charges exactly its difference and refunds at most it;
//! - **no over-grant in any window**: the grants between any two steps stay within what
//!   the rows held at the first (a row in debt counted as empty: debt stays on the row
//!   that ran it up, the documented bound), plus refunds, plus refill at the whole's rate;
//! - **refusals are the whole bucket's**: a fast client is refused only when the rows
//!   together cannot give the cost at its priority (a seed client: when its row cannot),
//!   and a refusal computed from the rows the store just returned is exact: the first
//!   millisecond at which the rows together can (one from remembered rows may be early,
//!   as the freshness rules allow);
//! - **liveness**: a fast client asking again once its last RetryIn for that request ran
//!   out, when the rows together can serve it, is granted.
//!
//! On the in-memory store (many cases) and on DynamoDB (fewer, a table each).

use crate::counted::Counted;
use crate::dynamo;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use sluice::store::Store;
use sluice::{
    Acquire, Bucket, Config, Error, Lease, MemoryStore, Priority, RefillRate, Sluice, Tokens,
    bucket::BucketState, clock::ManualClock, clock::UnixMillis, config::Protocol,
};

const D: &str = "model#tpm";

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        client: usize,
        cost: u64,
    },
    Release {
        client: usize,
        pick: usize,
    },
    Adjust {
        client: usize,
        pick: usize,
        cost: u64,
    },
    Reshard(u16),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..4, 1u64..=60).prop_map(|(client, cost)| Op::Acquire { client, cost }),
        1 => (0usize..4, 0usize..8).prop_map(|(client, pick)| Op::Release { client, pick }),
        1 => (0usize..4, 0usize..8, 0u64..=40)
            .prop_map(|(client, pick, cost)| Op::Adjust { client, pick, cost }),
        2 => (1u16..=6).prop_map(Op::Reshard),
        3 => (0u64..1_500).prop_map(Op::Advance),
    ]
}

/// Client `i`'s priority: the highest, `interactive` (its own reserve), `batch` (below
/// every reserve).
fn priority_of(i: usize) -> Option<Priority> {
    [None, Some("interactive"), Some("batch")][i % 3].map(|p| p.parse().unwrap())
}

struct Client {
    seed: bool,
    sluice: Sluice,
    calls: Arc<AtomicU64>,
    reads: Arc<AtomicU64>,
    leases: Vec<(Lease, u64)>,
}

struct World {
    store: Arc<dyn Store>,
    clock: ManualClock,
    whole: Bucket,
    clients: Vec<Client>,
    /// Per step: when it started, the whole's tokens then, and what came back in it.
    steps: Vec<(i64, Tokens, Tokens)>,
    /// Per step: the tokens granted in it.
    granted: Vec<Tokens>,
    /// Per client and cost: when its last RetryIn runs out.
    retry_ends: HashMap<(usize, u64), i64>,
    /// Per client: when it last consulted the store for an acquire.
    looks: HashMap<usize, i64>,
}

/// The rows of the bucket as stored (its own and its shards'), read raw.
async fn rows(store: &Arc<dyn Store>) -> Vec<BucketState> {
    let mut rows: Vec<_> = store
        .list_buckets()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.dimension.as_str() == D || r.dimension.as_str().starts_with("model#tpm#"))
        .collect();
    // The dimension's own row first, then its shards by number.
    rows.sort_by_key(|r| {
        r.dimension.as_str()[D.len()..]
            .trim_start_matches('#')
            .parse::<u16>()
            .unwrap_or(0)
    });
    assert_eq!(
        rows.len(),
        usize::from(rows[0].shards),
        "every shard has its row"
    );
    rows
}

fn sum(rows: &[BucketState], f: impl Fn(&BucketState) -> Tokens) -> Tokens {
    rows.iter().fold(Tokens::ZERO, |s, r| s + f(r))
}

/// What the rows together can give an acquire at `priority` at `at`.
fn free(rows: &[BucketState], priority: Option<&Priority>, at: UnixMillis) -> Tokens {
    sum(rows, |r| r.available_to(priority, at))
}

/// The first millisecond from `now` at which the rows together can give `cost`.
fn true_wait(
    rows: &[BucketState],
    priority: Option<&Priority>,
    cost: Tokens,
    now: UnixMillis,
) -> Duration {
    (1..=3_600_000u64)
        .map(Duration::from_millis)
        .find(|d| free(rows, priority, now.saturating_add(*d)) >= cost)
        .expect("a refilling bucket gets there within the hour")
}

impl World {
    async fn new(
        store: Arc<dyn Store>,
        start: i64,
        seeds: &[bool],
        capacity: u64,
        per_second: u64,
    ) -> World {
        let clock = ManualClock::new(UnixMillis::new(start));
        let whole = Bucket::tokens(RefillRate::per_second(per_second))
            .with_capacity(capacity)
            .with_reserve("interactive".parse().unwrap(), 6);
        let clients: Vec<Client> = seeds
            .iter()
            .enumerate()
            .map(|(i, seed)| {
                let calls = Arc::new(AtomicU64::new(0));
                let reads = Arc::new(AtomicU64::new(0));
                let sluice = sluice::SluiceBuilder::from_config(Config {
                    caller: format!("client-{i}"),
                    max_retries: 20,
                    protocol: if *seed {
                        Protocol::Seed
                    } else {
                        Protocol::Fast
                    },
                    priority: priority_of(i),
                    ..Config::default()
                })
                .store(Counted {
                    calls: calls.clone(),
                    reads: reads.clone(),
                    ..Counted::new(store.clone())
                })
                .clock(clock.clone())
                .build()
                .unwrap();
                Client {
                    seed: *seed,
                    sluice,
                    calls,
                    reads,
                    leases: Vec::new(),
                }
            })
            .collect();
        clients[0]
            .sluice
            .put_bucket(D, whole.clone())
            .await
            .unwrap();
        World {
            store,
            clock,
            whole,
            clients,
            steps: Vec::new(),
            granted: Vec::new(),
            retry_ends: HashMap::new(),
            looks: HashMap::new(),
        }
    }

    fn now(&self) -> UnixMillis {
        self.clock.now()
    }

    async fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        let now = self.now();
        let before = rows(&self.store).await;
        let held = sum(&before, |r| r.available(now));
        let count = self.clients.len();
        let mut granted = Tokens::ZERO;
        let mut came_back = Tokens::ZERO;
        match op {
            Op::Acquire { client, cost } => {
                let c = client % count;
                let priority = priority_of(c);
                let calls = self.clients[c].calls.load(Ordering::SeqCst);
                let reads = self.clients[c].reads.load(Ordering::SeqCst);
                let answer = self.clients[c]
                    .sluice
                    .acquire(Acquire::with_cost(D, cost))
                    .await;
                let called = self.clients[c].calls.load(Ordering::SeqCst) != calls;
                // Every row read in this acquire (a sharded bucket's whole view reads its
                // own row, then the others): its refusal is computed from the store's rows.
                let read_all =
                    before.len() == 1 || self.clients[c].reads.load(Ordering::SeqCst) >= reads + 2;
                let after = rows(&self.store).await;
                let left = sum(&after, |r| r.available(now));
                let want = Tokens::new(cost as i64);
                let seed = self.clients[c].seed;
                // What this client can reach: every row, or the seed's one row.
                let reach = |rows: &[BucketState]| {
                    if seed {
                        free(&rows[..1], priority.as_ref(), now)
                    } else {
                        free(rows, priority.as_ref(), now)
                    }
                };
                // Liveness: asked again once its last RetryIn for it ran out, a request the
                // rows it reaches can serve is granted, unless that refusal came from memory
                // and the client consulted the store since the RetryIn ran out.
                let ended = self
                    .retry_ends
                    .get(&(c, cost))
                    .copied()
                    .filter(|end| now.as_millis() >= *end);
                let looked_since =
                    ended.is_some_and(|end| self.looks.get(&c).is_some_and(|t| *t >= end));
                if called {
                    self.looks.insert(c, now.as_millis());
                }
                match answer {
                    Ok(lease) => {
                        prop_assert_eq!(held - left, want, "a grant takes exactly its cost");
                        granted = want;
                        self.retry_ends.remove(&(c, cost));
                        self.clients[c].leases.push((lease, cost));
                    }
                    Err(Error::RetryIn(sluice::RetryIn { delay: wait, .. })) => {
                        prop_assert_eq!(left, held, "a refusal takes nothing");
                        prop_assert!(
                            ended.is_none() || reach(&before) < want || (!called && looked_since),
                            "client {} asked {} again after its RetryIn, {} free, refused",
                            c,
                            cost,
                            reach(&before)
                        );
                        if called && read_all {
                            prop_assert!(
                                reach(&before) < want,
                                "the store refused {} with {} free",
                                cost,
                                reach(&before)
                            );
                            if !seed {
                                prop_assert_eq!(
                                    wait,
                                    true_wait(&before, priority.as_ref(), want, now)
                                );
                            }
                        }
                        self.retry_ends
                            .insert((c, cost), now.as_millis() + wait.as_millis() as i64);
                    }
                    Err(Error::CostExceedsCapacity { .. } | Error::CostExceedsShare { .. }) => {
                        prop_assert_eq!(left, held);
                        let share = if seed {
                            before[0].bucket.share_for(priority.as_ref())
                        } else {
                            self.whole.share_for(priority.as_ref())
                        };
                        prop_assert!(want > share);
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("unexpected: {e}"))),
                }
            }
            Op::Release { client, pick } => {
                let c = client % count;
                if !self.clients[c].leases.is_empty() {
                    let i = pick % self.clients[c].leases.len();
                    let (lease, _) = self.clients[c].leases.swap_remove(i);
                    lease.release().await.unwrap();
                    let after = rows(&self.store).await;
                    prop_assert_eq!(
                        sum(&after, |r| r.available(now)),
                        held,
                        "a release gives nothing back"
                    );
                }
            }
            Op::Adjust { client, pick, cost } => {
                let c = client % count;
                if !self.clients[c].leases.is_empty() {
                    let i = pick % self.clients[c].leases.len();
                    let old = self.clients[c].leases[i].1;
                    self.clients[c].leases[i].0.adjust(D, cost).await.unwrap();
                    self.clients[c].leases[i].1 = cost;
                    let left = sum(&rows(&self.store).await, |r| r.available(now));
                    let delta = Tokens::new(cost as i64 - old as i64);
                    if cost >= old {
                        prop_assert_eq!(
                            held - left,
                            delta,
                            "a charge takes exactly its difference"
                        );
                    } else {
                        prop_assert!(
                            left - held <= -delta,
                            "a refund gives back at most its difference"
                        );
                        came_back = left - held;
                    }
                }
            }
            Op::Reshard(n) => {
                match self.clients[0].sluice.reshard(D, n).await {
                    Ok(rows) => prop_assert_eq!(rows.len(), usize::from(n)),
                    Err(Error::Shards(_)) => {}
                    Err(e) => return Err(TestCaseError::fail(format!("reshard: {e}"))),
                }
                let left = sum(&rows(&self.store).await, |r| r.available(now));
                prop_assert!(
                    (left - held).as_nanos().abs() <= 10,
                    "a reshard keeps every token: {held} then {left}"
                );
            }
            Op::Advance(ms) => self.clock.advance(Duration::from_millis(ms)),
        }
        // Debt stays on the row that ran it up (the documented bound): the other rows keep
        // granting what they hold, so the window bound counts no row below zero.
        let held_above = sum(&before, |r| r.available(now).max(Tokens::ZERO));
        self.steps.push((now.as_millis(), held_above, came_back));
        self.granted.push(granted);
        Ok(())
    }

    /// Between any two steps, the grants stay within what the whole held at the first,
    /// plus what came back, plus refill at the whole's rate.
    fn check_windows(&self) -> Result<(), TestCaseError> {
        let rate = self.whole.refill_rate();
        for i in 0..self.steps.len() {
            let (start, held, _) = self.steps[i];
            let mut granted = Tokens::ZERO;
            let mut back = Tokens::ZERO;
            for j in i..self.steps.len() {
                granted += self.granted[j];
                back += self.steps[j].2;
                let end = self
                    .steps
                    .get(j + 1)
                    .map_or(self.now().as_millis(), |s| s.0);
                let refill = rate.refill_over(Duration::from_millis((end - start) as u64));
                let bound = (held + back + refill).max(Tokens::ZERO);
                prop_assert!(
                    granted <= bound,
                    "steps {}..={}: {} granted, bound {}",
                    i,
                    j,
                    granted,
                    bound
                );
            }
        }
        Ok(())
    }
}

async fn run_case(
    store: Arc<dyn Store>,
    start: i64,
    seeds: Vec<bool>,
    size: (u64, u64),
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let mut world = World::new(store, start, &seeds, size.0, size.1).await;
    for op in ops {
        world.step(op).await?;
    }
    world.check_windows()?;
    for client in &mut world.clients {
        for (lease, _) in client.leases.drain(..) {
            let _ = lease.release().await;
        }
    }
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// How many cases the DynamoDB run tries (`SLUICE_MODEL_DYNAMODB_CASES`, default 24).
fn dynamodb_cases() -> u32 {
    std::env::var("SLUICE_MODEL_DYNAMODB_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
        / 2
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn clients_on_a_resharded_bucket_never_answer_against_the_whole(
        seeds in proptest::collection::vec(prop::bool::weighted(0.25), 2..=4),
        size in (60u64..=400, 1u64..=50),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        runtime().block_on(run_case(Arc::new(MemoryStore::new()), 1_700_000_000_000, seeds, size, ops))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: dynamodb_cases().max(1), max_shrink_iters: 32, ..ProptestConfig::default() })]

    #[test]
    fn clients_on_a_resharded_bucket_on_dynamodb_never_answer_against_the_whole(
        seeds in proptest::collection::vec(prop::bool::weighted(0.25), 1..=3),
        size in (60u64..=400, 1u64..=50),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let mut seeds = seeds;
        seeds.insert(0, false);
        seeds.push(true);
        runtime().block_on(async {
            let Some(store) = dynamo::fresh_store().await else {
                return Ok(());
            };
            let start = dynamo::future_secs() * 1_000;
            run_case(Arc::new(store), start, seeds, size, ops).await
        })?;
    }
}
