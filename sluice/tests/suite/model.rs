//! Several clients, one truth: a model-based test of 2 to 4 clients in different modes
//! (fast path, seed protocol, prefetching on a lean bucket) on one store, running random
//! sequences of acquires (one or two dimensions), callers waiting their turn in a
//! bucket's queue (`acquire_within`, see `model/queue.rs`), acquires dropped half-way
//! (waiting callers too, during their turn), releases,
//! cost adjustments, bucket redefinitions (capacity and rate up and down), deletes and
//! re-creations by sluice, raw re-seeds at `version = 0` by another tool, vendor pauses,
//! reconciler passes and clock steps. The clients run at different priorities (the highest,
//! `interactive`, `standard`, and `batch`, which no bucket lists) and every bucket keeps
//! reserves for the higher ones.
//!
//! The reference model is the true bucket: the rows the store holds, read raw before and
//! after every step. After every step it checks:
//!
//! - **the ledger**: a grant takes exactly its cost from the true bucket (plus, on a
//!   prefetching client's write, exactly its prefetch), a refusal takes nothing, a dropped
//!   acquire leaves the bucket as it was (or its prefetch taken), a release gives back
//!   exactly a slot's cost, an adjustment exactly its difference;
//! - **no over-grant in any window**: the tokens granted between any two steps stay within
//!   what the bucket held at the first, plus what came back in between, plus refill at the
//!   fastest rate defined, plus the documented prefetch bound, a waiting caller's grant
//!   counted at its turn;
//! - **freshness**: a grant without a store call comes only from prefetched tokens; a
//!   refusal without a call comes only inside the window of an earlier refusal the store
//!   answered; a refusal the store answered is exact for the true bucket; a
//!   `CostExceedsCapacity` (or `CostExceedsShare`) is confirmed by the store and true;
//! - **reserves**: a written grant never leaves the true bucket below the reserves kept
//!   above its client's priority;
//! - **liveness**: a client asking again, after its last RetryIn for that request has
//!   passed, when the true bucket can serve it, is granted.
//!
//! Each client's store counts its calls and yields before and after each one, so that an
//! acquire dropped after a few polls is dropped at any point of its protocol, including
//! after its write was applied and before its answer arrived.
//!
//! The same run goes against the in-memory store (many cases) and against DynamoDB (fewer
//! cases, a table each): `scripts/test.sh` runs it on DynamoDB Local and again through
//! `dynamodb-fidelity`, which adds real DynamoDB's per-item ceilings, billing and
//! transaction conflicts. On DynamoDB the store's calls run on a runtime of their own, in
//! real time, while the clients' time stays paused: a call in flight is waited for by
//! every step before it reads the truth, and an acquire dropped while its write is in
//! flight leaves that write to land (as on the real network).

use crate::dynamo;
mod queue;

use std::collections::HashMap;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use proptest::prelude::*;
use sluice::store::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    Store, StoreError,
};
use sluice::{
    Acquire, Bucket, Config, Dimension, Error, Lease, MemoryStore, Prefetch, Priority, RefillRate,
    Sluice, Tokens, admin::Tighten, bucket::BucketState, clock::ManualClock, clock::UnixMillis,
    config::Protocol, store::Take,
};

/// Where the in-memory runs' clocks start.
const START: i64 = 1_700_000_000_000;
const R: &str = "model#rpm";
const L: &str = "model#lean";
const C: &str = "model#concurrent";
const PREFETCH: i64 = 3;
const HOLD: Duration = Duration::from_millis(200);
/// The clock skew every client allows for: an expired slot may be given back only this
/// long after its expiry.
const SKEW: Duration = Duration::from_millis(300);
/// When an expired slot lease may be given back: `SKEW` after its expiry, a vendor pause's
/// cool-down lease at its expiry exactly.
fn back_at(lease: &sluice::store::LeaseRecord) -> UnixMillis {
    if lease.caller == sluice::config::COOLDOWN_CALLER {
        lease.expires_at
    } else {
        lease.expires_at.saturating_add(SKEW)
    }
}

const SLOT_POLL: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Dim {
    R,
    L,
    C,
}

impl Dim {
    fn name(self) -> &'static str {
        match self {
            Dim::R => R,
            Dim::L => L,
            Dim::C => C,
        }
    }

    fn refills(self) -> bool {
        self != Dim::C
    }
}

/// What an acquire asks for: one dimension, or `R` and `L` together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Target {
    One(Dim),
    Both,
}

impl Target {
    fn dims(self) -> Vec<Dim> {
        match self {
            Target::One(d) => vec![d],
            Target::Both => vec![Dim::R, Dim::L],
        }
    }

    fn request(self, cost: i64) -> Acquire {
        match self {
            Target::One(d) => Acquire::with_cost(d.name(), cost),
            Target::Both => Acquire::with_cost(R, cost).and_cost(L, cost),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Fast,
    Seed,
    Prefetch,
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        client: usize,
        target: Target,
        cost: i64,
    },
    /// An acquire polled `polls` times, then dropped by its caller.
    Drop {
        client: usize,
        target: Target,
        cost: i64,
        polls: u8,
    },
    Release {
        client: usize,
        pick: usize,
    },
    Adjust {
        client: usize,
        pick: usize,
        cost: i64,
    },
    Redefine {
        dim: Dim,
        capacity: u64,
        per_second: u64,
    },
    /// Deleted and created again by sluice.
    Recreate(Dim),
    /// Deleted and written whole at `version = 0` by another tool.
    Reseed(Dim),
    Pause {
        client: usize,
        dim: Dim,
        ms: u64,
    },
    Reconcile(usize),
    Advance(u64),
    /// A caller waiting up to `wait` ms for its turn (`acquire_within`) on `R`, `L` or
    /// both; with `polls`, dropped after that many polls (before its write, during it, or
    /// while it waits its turn).
    Queue {
        client: usize,
        target: Target,
        cost: i64,
        wait: u64,
        polls: Option<u8>,
    },
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        3 => Just(Target::One(Dim::R)),
        3 => Just(Target::One(Dim::L)),
        3 => Just(Target::One(Dim::C)),
        2 => Just(Target::Both),
    ]
}

fn dim() -> impl Strategy<Value = Dim> {
    prop_oneof![Just(Dim::R), Just(Dim::L), Just(Dim::C)]
}

fn op() -> impl Strategy<Value = Op> {
    let client = 0usize..4;
    prop_oneof![
        8 => (client.clone(), target(), 1i64..=4)
            .prop_map(|(client, target, cost)| Op::Acquire { client, target, cost }),
        2 => (client.clone(), target(), 1i64..=3, 0u8..8)
            .prop_map(|(client, target, cost, polls)| Op::Drop { client, target, cost, polls }),
        3 => (client.clone(), any::<usize>()).prop_map(|(client, pick)| Op::Release { client, pick }),
        2 => (client.clone(), any::<usize>(), 0i64..=6)
            .prop_map(|(client, pick, cost)| Op::Adjust { client, pick, cost }),
        1 => (dim(), 2u64..=25, 1u64..=12)
            .prop_map(|(dim, capacity, per_second)| Op::Redefine { dim, capacity, per_second }),
        1 => dim().prop_map(Op::Recreate),
        1 => dim().prop_map(Op::Reseed),
        1 => (client.clone(), dim(), 0u64..=2_000)
            .prop_map(|(client, dim, ms)| Op::Pause { client, dim, ms }),
        1 => client.clone().prop_map(Op::Reconcile),
        5 => prop_oneof![3 => 0u64..400, 1 => 400u64..3_000].prop_map(Op::Advance),
        5 => (
            client,
            prop_oneof![Just(Target::One(Dim::R)), Just(Target::One(Dim::L)), Just(Target::Both)],
            1i64..=4,
            prop_oneof![1 => 1u64..=50, 3 => 50u64..=3_000],
            proptest::option::weighted(0.3, 0u8..12),
        )
            .prop_map(|(client, target, cost, wait, polls)| Op::Queue {
                client,
                target,
                cost,
                wait,
                polls,
            }),
    ]
}

/// The shared store as one client sees it: counting that client's calls, and yielding
/// before and after each, so that a dropped acquire can stop anywhere.
#[derive(Debug, Clone)]
struct ClientStore {
    inner: Shared,
    calls: Arc<AtomicU64>,
}

/// The store every client shares: in memory, or a table on DynamoDB.
type Shared = Arc<dyn Store>;

/// Store calls to DynamoDB in flight (their callers waiting, or left by a dropped caller).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// The runtime DynamoDB calls run on: real time, beside the clients' paused one.
fn remote() -> &'static tokio::runtime::Runtime {
    static REMOTE: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    REMOTE.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    })
}

/// Counts one call in flight while it lives.
struct Flying;

impl Flying {
    fn new() -> Flying {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        Flying
    }
}

impl Drop for Flying {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A DynamoDB store whose calls run on [`remote`]: counted in flight until both the call
/// and its caller are done with it.
#[derive(Debug, Clone)]
struct Remote(sluice::DynamoStore);

impl Remote {
    async fn run<T, F>(&self, call: impl FnOnce(sluice::DynamoStore) -> F) -> T
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let _waiting = Flying::new();
        let flying = Flying::new();
        let call = call(self.0.clone());
        remote()
            .spawn(async move {
                let out = call.await;
                drop(flying);
                out
            })
            .await
            .expect("a DynamoDB call panicked")
    }
}

#[async_trait::async_trait]
impl Store for Remote {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        let d = dimensions.to_vec();
        self.run(|s| async move { s.read_buckets(&d).await }).await
    }

    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        self.run(|s| async move { s.commit(commit).await }).await
    }

    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        let k = keys.to_vec();
        self.run(|s| async move { s.delete_leases(&k).await }).await
    }

    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        let k = keys.to_vec();
        self.run(|s| async move { s.read_leases(&k).await }).await
    }

    async fn slot_leases(
        &self,
        dimension: &Dimension,
        limit: usize,
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        let d = dimension.clone();
        self.run(move |s| async move { s.slot_leases(&d, limit).await })
            .await
    }

    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError> {
        let f = filter.clone();
        self.run(|s| async move { s.scan_leases(&f).await }).await
    }

    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        self.run(|s| async move { s.change(change).await }).await
    }

    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        let l = leases.to_vec();
        self.run(|s| async move { s.put_leases(&l).await }).await
    }

    async fn end_lease(
        &self,
        key: &LeaseKey,
        expiring_at: Option<sluice::clock::UnixMillis>,
    ) -> Result<bool, StoreError> {
        let k = key.clone();
        self.run(|s| async move { s.end_lease(&k, expiring_at).await })
            .await
    }

    async fn renew_lease(
        &self,
        key: &LeaseKey,
        from: sluice::clock::UnixMillis,
        to: sluice::clock::UnixMillis,
    ) -> Result<bool, StoreError> {
        let k = key.clone();
        self.run(|s| async move { s.renew_lease(&k, from, to).await })
            .await
    }

    async fn count_waiting(
        &self,
        dimension: &Dimension,
        epoch: u64,
        weight: u64,
        forget: &[u64],
    ) -> Result<Option<BucketState>, StoreError> {
        let (d, forget) = (dimension.clone(), forget.to_vec());
        self.run(|s| async move { s.count_waiting(&d, epoch, weight, &forget).await })
            .await
    }

    async fn respread_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
        moves: &[Option<sluice::store::Commute>],
    ) -> Result<bool, StoreError> {
        let (expected, rows, moves) = (expected.to_vec(), rows.to_vec(), moves.to_vec());
        self.run(|s| async move { s.respread_buckets(&expected, &rows, &moves).await })
            .await
    }
    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError> {
        let (state, expected) = (state.clone(), expected.cloned());
        self.run(|s| async move { s.put_bucket(&state, expected.as_ref()).await })
            .await
    }

    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError> {
        self.run(|s| async move { s.list_buckets().await }).await
    }

    async fn delete_bucket(&self, dimension: &Dimension) -> Result<bool, StoreError> {
        let d = dimension.clone();
        self.run(|s| async move { s.delete_bucket(&d).await }).await
    }

    fn loses_answers(&self) -> bool {
        self.0.loses_answers()
    }
}

impl ClientStore {
    async fn enter(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
    }
}

#[async_trait::async_trait]
impl Store for ClientStore {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        self.enter().await;
        let rows = self.inner.read_buckets(dimensions).await;
        tokio::task::yield_now().await;
        rows
    }

    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        self.enter().await;
        let result = self.inner.commit(commit).await;
        // Applied; its answer has not reached the caller yet.
        tokio::task::yield_now().await;
        result
    }

    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        self.enter().await;
        self.inner.delete_leases(keys).await
    }

    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        self.enter().await;
        self.inner.read_leases(keys).await
    }

    async fn slot_leases(
        &self,
        dimension: &Dimension,
        limit: usize,
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        self.enter().await;
        self.inner.slot_leases(dimension, limit).await
    }

    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError> {
        self.enter().await;
        self.inner.scan_leases(filter).await
    }

    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        self.enter().await;
        self.inner.change(change).await
    }

    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        self.enter().await;
        self.inner.put_leases(leases).await
    }

    async fn end_lease(
        &self,
        key: &LeaseKey,
        expiring_at: Option<sluice::clock::UnixMillis>,
    ) -> Result<bool, StoreError> {
        self.enter().await;
        self.inner.end_lease(key, expiring_at).await
    }

    async fn renew_lease(
        &self,
        key: &LeaseKey,
        from: sluice::clock::UnixMillis,
        to: sluice::clock::UnixMillis,
    ) -> Result<bool, StoreError> {
        self.enter().await;
        self.inner.renew_lease(key, from, to).await
    }

    async fn count_waiting(
        &self,
        dimension: &Dimension,
        epoch: u64,
        weight: u64,
        forget: &[u64],
    ) -> Result<Option<BucketState>, StoreError> {
        self.enter().await;
        self.inner
            .count_waiting(dimension, epoch, weight, forget)
            .await
    }

    async fn respread_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
        moves: &[Option<sluice::store::Commute>],
    ) -> Result<bool, StoreError> {
        self.enter().await;
        self.inner.respread_buckets(expected, rows, moves).await
    }
    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError> {
        self.enter().await;
        self.inner.put_bucket(state, expected).await
    }

    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError> {
        self.enter().await;
        self.inner.list_buckets().await
    }

    async fn delete_bucket(&self, dimension: &Dimension) -> Result<bool, StoreError> {
        self.enter().await;
        self.inner.delete_bucket(dimension).await
    }
}

struct Client {
    mode: Mode,
    /// The client's priority: the buckets keep 1 for `interactive` and 1 more for
    /// `standard`; `batch` is not listed and leaves both; `None` is the highest.
    priority: Option<Priority>,
    sluice: Sluice,
    calls: Arc<AtomicU64>,
    leases: Vec<Lease>,
}

/// The true bucket rows, read raw.
type Truth = HashMap<Dim, BucketState>;

/// A grant seen by a caller: when, on which dimension, how many tokens.
#[derive(Debug, Clone, Copy)]
struct Granted {
    step: usize,
    dim: Dim,
    cost: Tokens,
    /// When it may be used (a waiting caller's turn; else when it was granted), in ms.
    ready: i64,
}

/// One step of the run, as the window check needs it.
struct Step {
    started: i64,
    ended: i64,
    /// Per refilling bucket: what it held at the start, what came back to it other than by
    /// refill during the step, and the fastest rate defined for it.
    supply: HashMap<Dim, Supply>,
}

#[derive(Debug, Clone, Copy)]
struct Supply {
    held: Tokens,
    came_back: Tokens,
    rate: RefillRate,
}

struct World {
    store: Shared,
    clock: ManualClock,
    clients: Vec<Client>,
    steps: Vec<Step>,
    grants: Vec<Granted>,
    /// Per client and request: when its last RetryIn runs out.
    retry_ends: HashMap<(usize, Target, i64), i64>,
    /// Per client and dimension: when the last denial the store answered lets memory
    /// answer until.
    windows: HashMap<(usize, Dim), i64>,
    /// Per client and dimension: when the client last consulted the store in a step that
    /// may have touched that dimension.
    looks: HashMap<(usize, Dim), i64>,
}

fn definition(dim: Dim, capacity: u64, per_second: u64) -> Bucket {
    let bucket = match dim {
        Dim::R => Bucket::requests(RefillRate::per_second(per_second)).with_capacity(capacity),
        Dim::L => Bucket::requests(RefillRate::per_second(per_second))
            .with_capacity(capacity)
            .lean(),
        Dim::C => Bucket::concurrent(capacity.min(5)),
    };
    // Reserves for the higher priorities, as far as the capacity holds them.
    let bucket = bucket.with_reserve(priority_of(1).unwrap(), 1);
    if bucket.capacity() >= Tokens::new(2) {
        bucket.with_reserve(priority_of(3).unwrap(), 1)
    } else {
        bucket
    }
}

/// Client `i`'s priority: the highest (none), `interactive`, `batch` (not listed: below
/// every reserve), `standard`.
fn priority_of(i: usize) -> Option<Priority> {
    [None, Some("interactive"), Some("batch"), Some("standard")][i % 4].map(|p| p.parse().unwrap())
}

/// Lets every task the last step left behind (background releases, grants given back)
/// finish: tokio's time is paused, so this costs no real time, except waiting for the
/// DynamoDB calls in flight (which may start more of them).
async fn settle() {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        if IN_FLIGHT.load(Ordering::SeqCst) == 0 {
            return;
        }
        while IN_FLIGHT.load(Ordering::SeqCst) > 0 {
            remote()
                .spawn(tokio::time::sleep(Duration::from_millis(1)))
                .await
                .unwrap();
        }
    }
}

impl World {
    async fn new(store: Shared, start: i64, modes: &[Mode], sizes: [(u64, u64); 3]) -> World {
        let clock = ManualClock::new(UnixMillis::new(start));
        let clients = modes
            .iter()
            .enumerate()
            .map(|(i, mode)| {
                let calls = Arc::new(AtomicU64::new(0));
                let builder = sluice::SluiceBuilder::from_config(Config {
                    caller: format!("client-{i}"),
                    lease_ttl: Duration::from_secs(5),
                    max_retries: 20,
                    protocol: if *mode == Mode::Seed {
                        Protocol::Seed
                    } else {
                        Protocol::Fast
                    },
                    slot_poll: SLOT_POLL,
                    clock_skew: SKEW,
                    priority: priority_of(i),
                    ..Config::default()
                })
                .store(ClientStore {
                    inner: store.clone(),
                    calls: calls.clone(),
                })
                .clock(clock.clone());
                let builder = if *mode == Mode::Prefetch {
                    builder.prefetch(L.parse().unwrap(), Prefetch::new(PREFETCH, HOLD))
                } else {
                    builder
                };
                Client {
                    mode: *mode,
                    priority: priority_of(i),
                    sluice: builder.build().unwrap(),
                    calls,
                    leases: Vec::new(),
                }
            })
            .collect::<Vec<_>>();
        for (dim, (capacity, per_second)) in [Dim::R, Dim::L, Dim::C].into_iter().zip(sizes) {
            clients[0]
                .sluice
                .put_bucket(dim.name(), definition(dim, capacity, per_second))
                .await
                .unwrap();
        }
        World {
            store,
            clock,
            clients,
            steps: Vec::new(),
            grants: Vec::new(),
            retry_ends: HashMap::new(),
            windows: HashMap::new(),
            looks: HashMap::new(),
        }
    }

    async fn truth(&self) -> Truth {
        let dims = [Dim::R, Dim::L, Dim::C];
        let names: Vec<Dimension> = dims.iter().map(|d| d.name().parse().unwrap()).collect();
        let rows = self.store.read_buckets(&names).await.unwrap();
        dims.into_iter()
            .zip(rows)
            .map(|(d, row)| (d, row.expect("every bucket exists between steps")))
            .collect()
    }

    fn now(&self) -> UnixMillis {
        self.clock.now()
    }

    fn available(&self, truth: &Truth, dim: Dim) -> Tokens {
        truth[&dim].available(self.now())
    }

    /// What the true bucket answers to `cost` on `dim` now, at `client`'s priority.
    fn take(&self, truth: &Truth, dim: Dim, cost: i64, client: usize) -> Take {
        let priority = self.clients[client].priority.as_ref();
        truth[&dim].take_as(Tokens::new(cost), priority, self.now())
    }

    /// What `client`'s grants must leave in `dim`'s true bucket: the reserves above it.
    fn floor(&self, truth: &Truth, dim: Dim, client: usize) -> Tokens {
        truth[&dim]
            .bucket
            .floor_for(self.clients[client].priority.as_ref())
    }

    /// The RetryIn of a `concurrent` bucket found short: until the last live cool-down
    /// ends while one holds the slots; else the poll interval, or sooner when the earliest
    /// live slot lease may be given back sooner (`SKEW` after its expiry); the poll
    /// interval when none is live.
    async fn slot_wait(&self) -> Duration {
        let now = self.now();
        let live: Vec<_> = self
            .store
            .slot_leases(&C.parse().unwrap(), 1_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|l| back_at(l) > now)
            .collect();
        let cooling = live
            .iter()
            .filter(|l| l.caller == sluice::config::COOLDOWN_CALLER)
            .map(back_at)
            .max();
        if let Some(end) = cooling {
            return end.saturating_since(now);
        }
        live.iter()
            .map(back_at)
            .min()
            .map_or(SLOT_POLL, |t| t.saturating_since(now).min(SLOT_POLL))
    }

    /// The tokens expired slot leases of `C` hold now: what an acquire may give back to the
    /// bucket on its way (the reconciler's work, done when the bucket is short).
    async fn reclaimable(&self) -> Tokens {
        let now = self.now();
        self.store
            .slot_leases(&C.parse().unwrap(), 1_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|l| back_at(l) <= now)
            .map(|l| l.cost)
            .sum()
    }

    async fn lease_rows(&self) -> usize {
        self.store
            .list_leases(&LeaseFilter::default())
            .await
            .unwrap()
            .len()
    }

    fn record_step(&mut self, step: usize, started: UnixMillis, before: &Truth, after: &Truth) {
        let advanced = self.now() != started;
        let entry = [Dim::R, Dim::L]
            .into_iter()
            .map(|d| {
                // Within a step that moves the clock, what came back is refill.
                let came_back = if advanced {
                    Tokens::ZERO
                } else {
                    (self.available(after, d) - self.available(before, d)).max(Tokens::ZERO)
                };
                let rate = before[&d]
                    .bucket
                    .refill_rate()
                    .max(after[&d].bucket.refill_rate());
                let held = before[&d].available(started);
                (
                    d,
                    Supply {
                        held,
                        came_back,
                        rate,
                    },
                )
            })
            .collect();
        assert_eq!(self.steps.len(), step);
        self.steps.push(Step {
            started: started.as_millis(),
            ended: self.now().as_millis(),
            supply: entry,
        });
    }

    /// No window of steps grants more than the bucket held at its start, plus what came
    /// back during it, plus refill at the fastest rate defined, plus what prefetching
    /// clients may hold (never more than one prefetch each, granted within its hold).
    fn check_windows(&self) -> Result<(), TestCaseError> {
        let prefetchers = self
            .clients
            .iter()
            .filter(|c| c.mode == Mode::Prefetch)
            .count() as i64;
        for dim in [Dim::R, Dim::L] {
            for a in 0..self.steps.len() {
                let (t_a, at_a) = (self.steps[a].started, self.steps[a].supply[&dim]);
                let mut granted = Tokens::ZERO;
                let mut came_back = Tokens::ZERO;
                let mut rate = at_a.rate;
                // Grants of the window's steps whose turn is still to come: counted once
                // it has (a reservation is used at its turn, not when it is taken).
                let mut waiting: Vec<&Granted> = Vec::new();
                for b in a..self.steps.len() {
                    let (t_b, at_b) = (self.steps[b].ended, self.steps[b].supply[&dim]);
                    came_back += at_b.came_back;
                    rate = rate.max(at_b.rate);
                    waiting.extend(self.grants.iter().filter(|g| g.step == b && g.dim == dim));
                    granted += waiting
                        .iter()
                        .filter(|g| g.ready <= t_b)
                        .map(|g| g.cost)
                        .sum::<Tokens>();
                    waiting.retain(|g| g.ready > t_b);
                    let refill = rate.refill_over(Duration::from_millis((t_b - t_a) as u64));
                    let prefetched = if dim == Dim::L {
                        Tokens::new(PREFETCH * prefetchers)
                    } else {
                        Tokens::ZERO
                    };
                    let supply = at_a.held.max(Tokens::ZERO) + came_back + refill + prefetched;
                    prop_assert!(
                        granted <= supply,
                        "{dim:?}: {granted} granted in steps {a}..={b} ({} ms), supply {supply}",
                        t_b - t_a
                    );
                }
            }
        }
        Ok(())
    }

    /// Runs one step, noting which clients consulted the store during it.
    async fn step(&mut self, step: usize, op: Op) -> Result<(), TestCaseError> {
        settle().await;
        let calls: Vec<u64> = self
            .clients
            .iter()
            .map(|c| c.calls.load(Ordering::SeqCst))
            .collect();
        let now = self.now().as_millis();
        let touched: Vec<Dim> = match &op {
            Op::Acquire { target, .. } | Op::Drop { target, .. } | Op::Queue { target, .. } => {
                target.dims()
            }
            Op::Redefine { dim, .. } | Op::Recreate(dim) | Op::Pause { dim, .. } => vec![*dim],
            Op::Release { .. } | Op::Adjust { .. } | Op::Reconcile(_) => {
                vec![Dim::R, Dim::L, Dim::C]
            }
            Op::Reseed(_) | Op::Advance(_) => Vec::new(),
        };
        self.run(step, op).await?;
        settle().await;
        let after = self.truth().await;
        let at = self.now();
        for (client, before) in calls.iter().enumerate() {
            if self.clients[client].calls.load(Ordering::SeqCst) > *before {
                for d in &touched {
                    self.looks.insert((client, *d), now);
                    // A write of this client's that left the bucket unable to serve a call
                    // at its lowest priority (above every reserve) may open a denial window
                    // until it can, for requests that leave every reserve: this client's
                    // if its priority is listed nowhere.
                    let cost = after[d].bucket.cost_per_call();
                    let lowest = after[d].bucket.reserved();
                    let covered = self.floor(&after, *d, client) >= lowest;
                    if let (true, true, Take::Short { wait: Some(w) }) = (
                        d.refills(),
                        covered,
                        after[d].take_as(cost, self.clients[client].priority.as_ref(), at),
                    ) {
                        let until = at.as_millis() + w.as_millis() as i64;
                        let open = self.windows.entry((client, *d)).or_insert(until);
                        *open = (*open).max(until);
                    }
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_lines)]
    async fn run(&mut self, step: usize, op: Op) -> Result<(), TestCaseError> {
        let before = self.truth().await;
        let rows_before = self.lease_rows().await;
        let reclaimable = self.reclaimable().await;
        let now = self.now();
        let count = self.clients.len();
        match op {
            Op::Acquire {
                client,
                target,
                cost,
            } => {
                let client = client % count;
                let c = &self.clients[client];
                let calls = c.calls.load(Ordering::SeqCst);
                let result = c.sluice.acquire(target.request(cost)).await;
                let calls = c.calls.load(Ordering::SeqCst) - calls;
                let mode = c.mode;
                settle().await;
                let after = self.truth().await;
                let key = (client, target, cost);
                let servable = target
                    .dims()
                    .into_iter()
                    .all(|d| matches!(self.take(&before, d, cost, client), Take::Granted { .. }));
                // Liveness: after its last RetryIn, a request the bucket can serve is granted,
                // unless this client consulted the store since that RetryIn ran out (at its
                // millisecond or later; the bucket could not serve it then): a denial from
                // memory ends at its RetryIn.
                if let Some(end) = self.retry_ends.get(&key)
                    && now.as_millis() >= *end
                    && servable
                {
                    let looked_since = calls == 0
                        && target
                            .dims()
                            .iter()
                            .any(|d| self.looks.get(&(client, *d)).is_some_and(|t| t >= end));
                    prop_assert!(
                        result.is_ok() || looked_since,
                        "client {client} asked {target:?} x{cost} again after its RetryIn, \
                         the bucket could serve it, and got {result:?} ({calls} calls)"
                    );
                }
                match result {
                    Ok(lease) => {
                        self.retry_ends.remove(&key);
                        let prefetched_grant = lease.attempts() == 0;
                        prop_assert!(
                            calls > 0 || prefetched_grant,
                            "a grant without a store call must come from prefetched tokens"
                        );
                        if prefetched_grant {
                            prop_assert!(mode == Mode::Prefetch && target == Target::One(Dim::L));
                        }
                        for d in target.dims() {
                            let took = self.available(&before, d) - self.available(&after, d);
                            // No grant takes from the reserves above its priority.
                            if !prefetched_grant {
                                let floor = self.floor(&after, d, client);
                                prop_assert!(
                                    self.available(&after, d) >= floor,
                                    "{d:?}: client {client} ({:?}) left {} below its floor {floor}",
                                    self.clients[client].priority,
                                    self.available(&after, d)
                                );
                            }
                            if d == Dim::C {
                                // Expired leases found on the way may have come back first.
                                prop_assert!(
                                    took <= Tokens::new(cost)
                                        && took >= Tokens::new(cost) - reclaimable,
                                    "C: a grant of {cost} took {took} ({reclaimable} reclaimable)"
                                );
                                self.grants.push(Granted {
                                    step,
                                    dim: d,
                                    cost: Tokens::new(cost),
                                    ready: now.as_millis(),
                                });
                                continue;
                            }
                            let prefetch = Tokens::new(PREFETCH);
                            let expected: &[Tokens] = match (prefetched_grant, mode, d) {
                                (true, _, _) => &[Tokens::ZERO],
                                (false, Mode::Prefetch, Dim::L) => {
                                    &[Tokens::new(cost), Tokens::new(cost) + prefetch]
                                }
                                _ => &[Tokens::new(cost)],
                            };
                            prop_assert!(
                                expected.contains(&took),
                                "{d:?}: a grant of {cost} took {took} from the bucket"
                            );
                            if !prefetched_grant {
                                // A written grant never leaves the bucket short of it.
                                prop_assert!(self.available(&after, d) >= Tokens::ZERO);
                            }
                            self.grants.push(Granted {
                                step,
                                dim: d,
                                cost: Tokens::new(cost),
                                ready: now.as_millis(),
                            });
                        }
                        self.clients[client].leases.push(lease);
                    }
                    Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => {
                        prop_assert!(d >= Duration::from_millis(1));
                        prop_assert!(
                            !servable || calls == 0 || target == Target::Both,
                            "the store refused a request it could serve"
                        );
                        for dm in target.dims() {
                            if dm.refills() {
                                prop_assert_eq!(
                                    self.available(&before, dm),
                                    self.available(&after, dm),
                                    "a refusal changed {:?}",
                                    dm
                                );
                            }
                        }
                        let end = now.as_millis() + d.as_millis() as i64;
                        self.retry_ends.insert(key, end);
                        if calls == 0 {
                            // From memory: only inside a window the store opened.
                            let open = target.dims().iter().any(|dm| {
                                self.windows
                                    .get(&(client, *dm))
                                    .is_some_and(|w| now.as_millis() < *w)
                            });
                            prop_assert!(
                                open,
                                "client {client} refused {target:?} x{cost} from memory outside \
                                 any window the store opened"
                            );
                        } else {
                            if let Target::One(dm) = target {
                                // The store's answer is exact for the true bucket. A slot's
                                // wait is read from its leases, which their live holders
                                // renew meanwhile (only ever later): read after the answer,
                                // they may give a longer wait, never a shorter one.
                                match self.take(&before, dm, cost, client) {
                                    Take::Short { wait: Some(exact) } => prop_assert_eq!(
                                        d,
                                        exact,
                                        "the store's RetryIn for {:?} x{}",
                                        dm,
                                        cost
                                    ),
                                    _ => {
                                        let exact = self.slot_wait().await;
                                        prop_assert!(
                                            d <= exact,
                                            "the store's slot wait for {:?} x{}: {:?}, the leases say {:?}",
                                            dm,
                                            cost,
                                            d,
                                            exact
                                        );
                                    }
                                }
                            }
                            for dm in target.dims() {
                                if matches!(
                                    self.take(&before, dm, cost, client),
                                    Take::Short { .. }
                                ) {
                                    let window = if dm.refills() { d } else { d.min(SLOT_POLL) };
                                    let until = now.as_millis() + window.as_millis() as i64;
                                    let w = self.windows.entry((client, dm)).or_insert(until);
                                    *w = (*w).max(until);
                                }
                            }
                        }
                    }
                    Err(Error::CostExceedsCapacity { dimension, .. }) => {
                        prop_assert!(
                            calls > 0,
                            "CostExceedsCapacity must be confirmed by the store"
                        );
                        let dm = target
                            .dims()
                            .into_iter()
                            .find(|d| d.name() == dimension.as_str())
                            .unwrap();
                        prop_assert!(Tokens::new(cost) > before[&dm].bucket.capacity());
                    }
                    Err(Error::CostExceedsShare { dimension, .. }) => {
                        prop_assert!(calls > 0, "CostExceedsShare must be confirmed by the store");
                        let dm = target
                            .dims()
                            .into_iter()
                            .find(|d| d.name() == dimension.as_str())
                            .unwrap();
                        prop_assert!(
                            Tokens::new(cost) + self.floor(&before, dm, client)
                                > before[&dm].bucket.capacity()
                        );
                    }
                    Err(e) => prop_assert!(false, "unexpected error {e}"),
                }
                self.record_step(step, now, &before, &after);
                return Ok(());
            }
            Op::Drop {
                client,
                target,
                cost,
                polls,
            } => {
                let client = client % count;
                let c = &self.clients[client];
                let mode = c.mode;
                let mut granted = None;
                {
                    let mut acquire = pin!(c.sluice.acquire(target.request(cost)));
                    for _ in 0..polls {
                        if let Poll::Ready(result) = futures::poll!(acquire.as_mut()) {
                            granted = Some(result);
                            break;
                        }
                    }
                }
                settle().await;
                let after = self.truth().await;
                let completed = matches!(granted, Some(Ok(_)));
                for d in target.dims() {
                    if !d.refills() {
                        continue;
                    }
                    let took = self.available(&before, d) - self.available(&after, d);
                    let prefetch = Tokens::new(PREFETCH);
                    let mut allowed = vec![if completed {
                        Tokens::new(cost)
                    } else {
                        Tokens::ZERO
                    }];
                    if mode == Mode::Prefetch && d == Dim::L {
                        allowed.push(allowed[0] + prefetch);
                        if completed {
                            // Granted from prefetched tokens: nothing written.
                            allowed.push(Tokens::ZERO);
                        }
                    }
                    prop_assert!(
                        allowed.contains(&took),
                        "{d:?}: an acquire of {cost} dropped after {polls} polls took {took} (completed: {completed})"
                    );
                }
                // A write the caller left may still have refused it, from the store: memory
                // may then answer from that refusal's window.
                for dm in target.dims() {
                    let window = match self.take(&before, dm, cost, client) {
                        Take::Short { wait: Some(w) } => Some(w),
                        Take::Short { wait: None } => Some(self.slot_wait().await.min(SLOT_POLL)),
                        _ => None,
                    };
                    if let Some(w) = window {
                        let until = now.as_millis() + w.as_millis() as i64;
                        let open = self.windows.entry((client, dm)).or_insert(until);
                        *open = (*open).max(until);
                    }
                }
                if let Some(Ok(lease)) = granted {
                    for d in target.dims() {
                        self.grants.push(Granted {
                            step,
                            dim: d,
                            cost: Tokens::new(cost),
                            ready: now.as_millis(),
                        });
                    }
                    self.clients[client].leases.push(lease);
                } else {
                    // No lease row may outlive a dropped acquire.
                    prop_assert!(self.lease_rows().await <= rows_before);
                }
                self.record_step(step, now, &before, &after);
                return Ok(());
            }
            Op::Release { client, pick } => {
                let client = client % count;
                if !self.clients[client].leases.is_empty() {
                    let i = pick % self.clients[client].leases.len();
                    let lease = self.clients[client].leases.swap_remove(i);
                    let slot = lease.cost(C);
                    lease.release().await.unwrap();
                    settle().await;
                    let after = self.truth().await;
                    for d in [Dim::R, Dim::L] {
                        prop_assert_eq!(self.available(&before, d), self.available(&after, d));
                    }
                    if let Some(cost) = slot {
                        let back = after[&Dim::C].tokens - before[&Dim::C].tokens;
                        prop_assert!(
                            back >= Tokens::ZERO && back <= cost,
                            "a released slot gave back {back}"
                        );
                    }
                }
            }
            Op::Adjust { client, pick, cost } => {
                let client = client % count;
                if !self.clients[client].leases.is_empty() {
                    let i = pick % self.clients[client].leases.len();
                    let dims: Vec<Dim> = [Dim::R, Dim::L, Dim::C]
                        .into_iter()
                        .filter(|d| self.clients[client].leases[i].cost(d.name()).is_some())
                        .collect();
                    let d = dims[pick % dims.len()];
                    let was = self.clients[client].leases[i].cost(d.name()).unwrap();
                    let result = self.clients[client].leases[i].adjust(d.name(), cost).await;
                    settle().await;
                    let after = self.truth().await;
                    match result {
                        Ok(()) => {
                            let delta = Tokens::new(cost) - was;
                            let had = self.available(&before, d);
                            let capacity = after[&d].bucket.capacity();
                            let expected = if delta >= Tokens::ZERO {
                                had - delta
                            } else {
                                (had - delta).min(capacity).max(had)
                            };
                            prop_assert_eq!(
                                self.available(&after, d),
                                expected,
                                "adjusting {:?} by {}",
                                d,
                                delta
                            );
                        }
                        // Expired and reconciled already.
                        Err(Error::LeaseNotFound(_)) => {}
                        Err(e) => prop_assert!(false, "adjust failed: {e}"),
                    }
                }
            }
            Op::Redefine {
                dim,
                capacity,
                per_second,
            } => {
                let new = definition(dim, capacity, per_second);
                self.clients[0]
                    .sluice
                    .put_bucket(dim.name(), new.clone())
                    .await
                    .unwrap();
                settle().await;
                let after = self.truth().await;
                let had = self.available(&before, dim);
                let expected = if dim.refills() {
                    had.min(new.capacity())
                } else {
                    (had + new.capacity() - before[&dim].bucket.capacity()).min(new.capacity())
                };
                prop_assert_eq!(
                    self.available(&after, dim),
                    expected,
                    "redefining {:?}",
                    dim
                );
            }
            Op::Recreate(dim) => {
                let current = before[&dim].bucket.clone();
                assert!(
                    self.clients[0]
                        .sluice
                        .delete_bucket(dim.name())
                        .await
                        .unwrap()
                );
                self.clients[0]
                    .sluice
                    .put_bucket(dim.name(), current)
                    .await
                    .unwrap();
            }
            Op::Reseed(dim) => {
                let d: Dimension = dim.name().parse().unwrap();
                assert!(self.store.delete_bucket(&d).await.unwrap());
                let row = BucketState::full(d, before[&dim].bucket.clone(), now);
                assert!(self.store.put_bucket(&row, None).await.unwrap());
            }
            Op::Pause { client, dim, ms } => {
                let client = client % count;
                self.clients[client]
                    .sluice
                    .tighten(dim.name(), Tighten::PauseFor(Duration::from_millis(ms)))
                    .await
                    .unwrap();
                settle().await;
                let after = self.truth().await;
                for d in [Dim::R, Dim::L] {
                    prop_assert!(self.available(&after, d) <= self.available(&before, d));
                }
            }
            Op::Reconcile(client) => {
                let client = client % count;
                let report = self.clients[client].sluice.reconcile().await.unwrap();
                prop_assert!(report.errors.is_empty(), "{report}");
            }
            Op::Advance(ms) => self.clock.advance(Duration::from_millis(ms)),
            Op::Queue {
                client,
                target,
                cost,
                wait,
                polls,
            } => {
                let asked = queue::Asked {
                    client: client % count,
                    target,
                    cost,
                    wait: Duration::from_millis(wait),
                };
                self.queue(step, asked, polls, &before).await?;
            }
        }
        settle().await;
        let after = self.truth().await;
        self.record_step(step, now, &before, &after);
        Ok(())
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Fast), Just(Mode::Seed), Just(Mode::Prefetch)]
}

/// Runs one case: `ops` by clients in `modes` on `store`, with clocks starting at `start`.
async fn run_case(
    store: Shared,
    start: i64,
    modes: &[Mode],
    sizes: [(u64, u64); 3],
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let mut world = World::new(store, start, modes, sizes).await;
    for (step, op) in ops.into_iter().enumerate() {
        world.step(step, op).await?;
    }
    world.check_windows()?;
    // Every lease still held goes back.
    for client in &mut world.clients {
        for lease in client.leases.drain(..) {
            let _ = lease.release().await;
        }
    }
    settle().await;
    Ok(())
}

/// A table of its own on DynamoDB (Local, or `dynamodb-fidelity` in front of it) for one
/// case, or `None` to skip.
async fn dynamodb_table() -> Option<Shared> {
    let endpoint = dynamo::endpoint()?;
    let store = remote()
        .spawn(async move {
            let table = format!("sluice-model-{:016x}", rand::random::<u64>());
            let store = sluice::DynamoStore::new(dynamo::client(&endpoint), table);
            store.create_table().await.expect("create a model table");
            store
        })
        .await
        .unwrap();
    Some(Arc::new(Remote(store)))
}

/// How many cases the DynamoDB run tries (`SLUICE_MODEL_DYNAMODB_CASES`, default 24).
fn dynamodb_cases() -> u32 {
    std::env::var("SLUICE_MODEL_DYNAMODB_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn several_clients_never_answer_against_the_true_bucket(
        modes in proptest::collection::vec(mode(), 2..=4),
        sizes in [(3u64..=20, 1u64..=10), (3u64..=20, 1u64..=10), (1u64..=4, 0u64..=0)],
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        runtime().block_on(run_case(Arc::new(MemoryStore::new()), START, &modes, sizes, ops))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: dynamodb_cases(),
        max_shrink_iters: 64,
        ..ProptestConfig::default()
    })]

    /// The same on DynamoDB, a seed-protocol client always among the clients.
    #[test]
    fn several_clients_on_dynamodb_never_answer_against_the_true_bucket(
        modes in proptest::collection::vec(mode(), 1..=3),
        sizes in [(3u64..=20, 1u64..=10), (3u64..=20, 1u64..=10), (1u64..=4, 0u64..=0)],
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut modes = modes;
        modes.insert(0, Mode::Seed);
        runtime().block_on(async {
            let Some(store) = dynamodb_table().await else {
                return Ok(());
            };
            let start = dynamo::future_secs() * 1_000;
            run_case(store, start, &modes, sizes, ops).await
        })?;
    }
}
