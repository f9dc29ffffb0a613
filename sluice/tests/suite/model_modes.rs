//! Clients in every mode on one store, on a bucket spread over rows that a reshard
//! changes between their steps: a model-based test against the true bucket, the sum of its
//! rows read raw. The combinations are where a path's defects hide: a shadow client's write
//! on a spread bucket, a several-dimension acquire through the lanes beside the seed's
//! transaction on the same rows, priorities on each.
//!
//! Two to four clients, each in one mode (the fast path, the seed's protocol, which knows
//! the dimension's own row only, or shadow mode, which never refuses and takes every cost),
//! at three priorities, run random sequences of acquires on the spread bucket alone or with
//! a second, single-row bucket (all or nothing), releases, cost corrections, reshards to 1
//! to 6 rows and clock steps. After every step:
//!
//! - **the ledger**: a grant takes exactly its cost from the whole (the sum of every row's
//!   tokens, refilled), and from the second bucket when it names it, whatever the client's
//!   mode; a refusal and a release take nothing, a reshard neither makes nor loses a
//!   token, a correction charges exactly its difference and refunds at most it;
//! - **shadow never refuses**: a shadow client's acquire is granted, and its cost taken;
//! - **no over-grant in any window**: the enforcing grants between any two steps stay within
//!   what the rows held at the first (a row in debt counted as empty: debt stays on the row
//!   that ran it up, the documented bound), plus refunds, plus refill at the whole's rate;
//! - **refusals are the whole bucket's**: a fast client is refused only when the rows
//!   together cannot give the cost at its priority (a seed client: when its row cannot),
//!   and a refusal computed from the rows the store just returned is exact: the first
//!   millisecond at which the rows together can (one from remembered rows may be early,
//!   as the freshness rules allow); a refusal names only dimensions the request named;
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
    Acquire, Bucket, Config, Dimension, Error, Lease, MemoryStore, Priority, RefillRate, Sluice,
    Tokens, bucket::BucketState, clock::ManualClock, clock::UnixMillis, config::Protocol,
};

const D: &str = "model#tpm";
/// The second bucket, one row, named with the first by some acquires.
const R: &str = "model#rpm";

/// How a client acquires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Fast,
    Seed,
    Shadow,
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![2 => Just(Mode::Fast), 1 => Just(Mode::Seed), 1 => Just(Mode::Shadow)]
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        client: usize,
        cost: u64,
        /// Also one request of `R`.
        both: bool,
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
        6 => (0usize..4, 1u64..=60, prop::bool::weighted(0.3))
            .prop_map(|(client, cost, both)| Op::Acquire { client, cost, both }),
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
    mode: Mode,
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
        modes: &[Mode],
        capacity: u64,
        per_second: u64,
    ) -> World {
        let clock = ManualClock::new(UnixMillis::new(start));
        let whole = Bucket::tokens(RefillRate::per_second(per_second))
            .with_capacity(capacity)
            .with_reserve("interactive".parse().unwrap(), 6);
        let clients: Vec<Client> = modes
            .iter()
            .enumerate()
            .map(|(i, &mode)| {
                let calls = Arc::new(AtomicU64::new(0));
                let reads = Arc::new(AtomicU64::new(0));
                let sluice = sluice::SluiceBuilder::from_config(Config {
                    caller: format!("client-{i}"),
                    max_retries: 20,
                    protocol: if mode == Mode::Seed {
                        Protocol::Seed
                    } else {
                        Protocol::Fast
                    },
                    mode: if mode == Mode::Shadow {
                        sluice::Mode::Shadow
                    } else {
                        sluice::Mode::Enforce
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
                    mode,
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
        let second = Bucket::requests(RefillRate::per_second(2)).with_capacity(4);
        clients[0].sluice.put_bucket(R, second).await.unwrap();
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
            Op::Acquire { client, cost, both } => {
                granted = self.acquire(client % count, cost, both, &before).await?;
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

    /// The second bucket's one row, as stored.
    async fn second(&self) -> BucketState {
        let d: Dimension = R.parse().unwrap();
        self.store.read_buckets(&[d]).await.unwrap()[0]
            .clone()
            .expect("the second bucket exists")
    }

    /// Client `c` acquires `cost` on the spread bucket (and one request of the second when
    /// `both`), and checks the answer against the rows `before` it; the tokens it granted
    /// that count against the window bound (an enforcing grant's cost).
    async fn acquire(
        &mut self,
        c: usize,
        cost: u64,
        both: bool,
        before: &[BucketState],
    ) -> Result<Tokens, TestCaseError> {
        let now = self.now();
        let held = sum(before, |r| r.available(now));
        let second_before = self.second().await.available(now);
        let priority = priority_of(c);
        let calls = self.clients[c].calls.load(Ordering::SeqCst);
        let reads = self.clients[c].reads.load(Ordering::SeqCst);
        let request = if both {
            Acquire::with_cost(D, cost).and(R)
        } else {
            Acquire::with_cost(D, cost)
        };
        let answer = self.clients[c].sluice.acquire(request).await;
        let called = self.clients[c].calls.load(Ordering::SeqCst) != calls;
        // Every row read in this acquire (a sharded bucket's whole view reads its own row,
        // then the others): its refusal is computed from the store's rows.
        let read_all =
            before.len() == 1 || self.clients[c].reads.load(Ordering::SeqCst) >= reads + 2;
        let after = rows(&self.store).await;
        let left = sum(&after, |r| r.available(now));
        let second_left = self.second().await.available(now);
        let want = Tokens::new(cost as i64);
        let mode = self.clients[c].mode;
        let seed = mode == Mode::Seed;
        // What this client can reach: every row, or the seed's one row.
        let reach = |rows: &[BucketState]| {
            if seed {
                free(&rows[..1], priority.as_ref(), now)
            } else {
                free(rows, priority.as_ref(), now)
            }
        };
        // Liveness: asked again once its last RetryIn for it ran out, a request the rows it
        // reaches can serve is granted, unless that refusal came from memory and the client
        // consulted the store since the RetryIn ran out.
        let key = (c, cost + u64::from(both) * 1_000);
        let ended = self
            .retry_ends
            .get(&key)
            .copied()
            .filter(|end| now.as_millis() >= *end);
        let looked_since = ended.is_some_and(|end| self.looks.get(&c).is_some_and(|t| *t >= end));
        if called {
            self.looks.insert(c, now.as_millis());
        }
        if mode == Mode::Shadow {
            prop_assert!(answer.is_ok(), "shadow mode refused: {:?}", answer.err());
        }
        match answer {
            Ok(lease) => {
                prop_assert_eq!(held - left, want, "a grant takes exactly its cost");
                if both {
                    prop_assert_eq!(
                        second_before - second_left,
                        Tokens::new(1),
                        "and its request of the second bucket"
                    );
                } else {
                    prop_assert_eq!(second_left, second_before);
                }
                self.retry_ends.remove(&key);
                self.clients[c].leases.push((lease, cost));
                return Ok(if mode == Mode::Shadow {
                    Tokens::ZERO
                } else {
                    want
                });
            }
            Err(Error::RetryIn(refusal)) => {
                prop_assert_eq!(left, held, "a refusal takes nothing");
                prop_assert_eq!(second_left, second_before, "from either bucket");
                for short in &refusal.short {
                    let named = short.dimension.as_str();
                    prop_assert!(
                        named == D || (both && named == R),
                        "a refusal named {}, which the request did not",
                        named
                    );
                }
                let reachable = reach(before) >= want;
                let second_free = !both || second_before >= Tokens::new(1);
                prop_assert!(
                    ended.is_none() || !reachable || !second_free || (!called && looked_since),
                    "client {} asked {} again after its RetryIn, {} free, refused",
                    c,
                    cost,
                    reach(before)
                );
                if called && read_all && !both {
                    prop_assert!(
                        !reachable,
                        "the store refused {} with {} free",
                        cost,
                        reach(before)
                    );
                    prop_assert!(refusal.delay_of(D).is_some(), "{:?}", refusal);
                    if !seed {
                        prop_assert_eq!(refusal.delay_of(D), Some(refusal.delay));
                        prop_assert_eq!(
                            refusal.delay,
                            true_wait(before, priority.as_ref(), want, now)
                        );
                    }
                }
                let wait = refusal.delay.as_millis() as i64;
                self.retry_ends.insert(key, now.as_millis() + wait);
            }
            Err(Error::CostExceedsCapacity { .. } | Error::CostExceedsShare { .. }) => {
                prop_assert_eq!(left, held);
                prop_assert_eq!(second_left, second_before);
                let share = if seed {
                    before[0].bucket.share_for(priority.as_ref())
                } else {
                    self.whole.share_for(priority.as_ref())
                };
                prop_assert!(want > share);
            }
            Err(e) => return Err(TestCaseError::fail(format!("unexpected: {e}"))),
        }
        Ok(Tokens::ZERO)
    }

    /// Between any two steps, the enforcing grants stay within what the whole held at the first,
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
    modes: Vec<Mode>,
    size: (u64, u64),
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let mut world = World::new(store, start, &modes, size.0, size.1).await;
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

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// How many cases the DynamoDB run tries (`SLUICE_MODEL_DYNAMODB_CASES`, default 24).
pub(crate) fn dynamodb_cases() -> u32 {
    std::env::var("SLUICE_MODEL_DYNAMODB_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
        / 2
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn clients_in_every_mode_on_a_resharded_bucket_never_answer_against_the_whole(
        modes in proptest::collection::vec(mode(), 2..=4),
        size in (60u64..=400, 1u64..=50),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        runtime().block_on(run_case(Arc::new(MemoryStore::new()), 1_700_000_000_000, modes, size, ops))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: dynamodb_cases().max(1), max_shrink_iters: 32, ..ProptestConfig::default() })]

    #[test]
    fn clients_in_every_mode_on_a_resharded_bucket_on_dynamodb_never_answer_against_the_whole(
        modes in proptest::collection::vec(mode(), 0..=1),
        size in (60u64..=400, 1u64..=50),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        // Every mode in every case, and one more drawn.
        let mut modes = modes;
        modes.splice(0..0, [Mode::Fast, Mode::Seed, Mode::Shadow]);
        runtime().block_on(async {
            let Some(store) = dynamo::fresh_store().await else {
                return Ok(());
            };
            let start = dynamo::future_secs() * 1_000;
            run_case(Arc::new(store), start, modes, size, ops).await
        })?;
    }
}
