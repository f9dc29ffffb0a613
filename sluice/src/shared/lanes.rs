//! Each client's lanes: per dimension, what it remembers of the bucket row and the
//! requests waiting for the fast path's next write to that row.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::acquire::Wanted;
use crate::bucket::BucketState;
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::grant::{Grant, LeasePart};
use crate::shared::recent::Recent;
use crate::shared::remembered::Remembered;
use crate::store::StoreError;

/// The most requests waiting on one lane; a caller beyond it waits for room.
pub(crate) const MAX_QUEUED: usize = 1_024;

/// The most requests one write grants (their lease rows go in batches of 25).
pub(crate) const MAX_BATCH: usize = 64;

/// The most releases one write carries.
pub(crate) const MAX_RELEASES: usize = 64;

/// The lanes of one client, by dimension: the most recently used (see [`Recent`]), and
/// those in use.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    pub(crate) lanes: Mutex<Recent<Arc<Lane>>>,
    /// How many rows each sharded bucket has, as last heard from any of its rows (see
    /// [`shards`](crate::bucket::shards)); a dimension not listed has one.
    shards: Mutex<Recent<u16>>,
    /// The `dimension` label values this client's metrics reported (bounded).
    pub(crate) labels: crate::metrics::Labels,
}

impl Lanes {
    /// How many rows the bucket of `base` has, as far as this client knows.
    pub(crate) fn shards(&self, base: &Dimension) -> u16 {
        lock(&self.shards).get(base).copied().unwrap_or(1)
    }

    /// Notes that the bucket of `base` has `n` rows.
    pub(crate) fn note_shards(&self, base: &Dimension, n: u16) {
        let mut shards = lock(&self.shards);
        if n > 1 {
            shards.insert(base.clone(), n);
        } else {
            shards.remove(base);
        }
    }

    /// Remembers every row of `base`'s bucket, just read at `now`: their count and each row.
    pub(crate) fn learn_rows(&self, base: &Dimension, rows: &[BucketState], now: UnixMillis) {
        self.note_shards(base, u16::try_from(rows.len()).unwrap_or(1));
        for row in rows {
            self.learn(row.clone(), now);
        }
    }

    pub(crate) fn lane(&self, dimension: &Dimension) -> Arc<Lane> {
        let mut lanes = lock(&self.lanes);
        if let Some(lane) = lanes.get(dimension) {
            return lane.clone();
        }
        // Past the bound, the least recently used idle lanes are forgotten (a lane in use
        // is held elsewhere too: a job queued, a write in flight). Their dimensions cost
        // one read again when next used.
        let lane = Arc::new(Lane::default());
        lanes.insert_keeping(dimension.clone(), lane.clone(), |l| {
            Arc::strong_count(l) > 1
        });
        lane
    }

    /// Takes `row`, just learned from the store, as the truth about its dimension.
    pub(crate) fn learn(&self, row: BucketState, now: UnixMillis) {
        self.lane(&row.dimension).memory().learn(row, now);
    }

    /// Takes `row`, which this client's own write just produced, as the truth about its
    /// dimension (see [`Remembered::learn_written`]).
    pub(crate) fn learn_written(&self, row: BucketState, now: UnixMillis) {
        self.lane(&row.dimension).memory().learn_written(row, now);
    }

    /// Forgets what this client knew of `dimension`.
    pub(crate) fn forget(&self, dimension: &Dimension) {
        if let Some(lane) = lock(&self.lanes).get(dimension) {
            lane.memory().forget();
        }
    }

    /// The lane of `dimension` when it is, as far as this client knows, a `concurrent`
    /// bucket.
    pub(crate) fn slots_lane(&self, dimension: &Dimension) -> Option<Arc<Lane>> {
        lock(&self.lanes)
            .get(dimension)
            .filter(|lane| lane.memory().holds_slots())
            .cloned()
    }
}

/// One request waiting on a lane.
pub(crate) struct Queued {
    /// Which caller queued it.
    pub(crate) ticket: u64,
    pub(crate) job: Job,
    /// Its place in the lane's bounded queue.
    pub(crate) _room: tokio::sync::OwnedSemaphorePermit,
}

pub(crate) enum Job {
    Acquire(AcquireJob),
    Release(ReleaseJob),
}

pub(crate) struct AcquireJob {
    pub(crate) wanted: Wanted,
    pub(crate) ttl: Duration,
    /// A waiting caller's wait began then: it takes a denial only from a row learned since.
    pub(crate) fresh_after: Option<UnixMillis>,
    /// Whether this is the whole request (not one dimension of several).
    pub(crate) alone: bool,
    pub(crate) reply: Reply<Grant>,
}

/// A slot given back (its lease row already deleted by whoever queued it): its cost rides
/// on the lane's next change.
pub(crate) struct ReleaseJob {
    pub(crate) part: LeasePart,
    /// Answered once the cost is back.
    pub(crate) reply: Reply<()>,
}

pub(crate) type Reply<T> = tokio::sync::oneshot::Sender<Result<T, Error>>;

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, dimension) = match &self.job {
            Job::Acquire(a) => ("acquire", &a.wanted.dimension),
            Job::Release(r) => ("release", &r.part.dimension),
        };
        f.debug_struct("Queued")
            .field("ticket", &self.ticket)
            .field(kind, dimension)
            .finish()
    }
}

#[derive(Debug)]
pub(crate) struct Lane {
    pub(crate) tickets: std::sync::atomic::AtomicU64,
    memory: Mutex<Remembered>,
    pub(crate) queue: Mutex<Vec<Queued>>,
    /// Room in the queue, so that it stays bounded.
    pub(crate) room: Arc<tokio::sync::Semaphore>,
    pub(crate) writer: Arc<tokio::sync::Mutex<()>>,
    /// Throttles of the lane's writes, less those that applied since (each halves it): how
    /// long a throttled write waits.
    pub(crate) throttled: std::sync::atomic::AtomicU32,
    /// Writes of the lane's row the store throttled for the item's own throughput (not a
    /// transaction holding it), since the row's heat was last measured.
    pub(crate) throttles: std::sync::atomic::AtomicU32,
    /// Writes of the lane's row that failed their condition (billed, and not counted in
    /// the row's version), since the row's heat was last measured.
    pub(crate) lost_races: std::sync::atomic::AtomicU32,
    /// Times this lane answered its acquires with a RetryIn because the store pushed back
    /// (a throttled read or write), not because the bucket was short.
    pub(crate) pushed_back: std::sync::atomic::AtomicU64,
    /// When the store last pushed the lane's row back (unix milliseconds; 0: never): a
    /// spread bucket's acquires go to its other rows for a while (see
    /// `sharded::pick`).
    pub(crate) pushed_at: std::sync::atomic::AtomicI64,
    /// What the lane's acquires cost, of late.
    pub(crate) costs: CallCosts,
    /// Callers of this client waiting for a slot of the lane's bucket (in
    /// `acquire_within`): what this client adds when it counts the waiting callers on the
    /// row (see [`Waiting`](crate::store::Waiting)).
    pub(crate) waiting: std::sync::atomic::AtomicU64,
}

/// What one acquire of a lane costs, of late: the mean of the costs asked, the older ones
/// counting for less (halved every [`CallCosts::HALF_LIFE`] acquires). A `tokens` bucket's
/// calls cost what their requests say (an estimate of a model's tokens), not its
/// `cost_per_call`: this is how many calls its refill serves.
#[derive(Debug, Default)]
pub(crate) struct CallCosts {
    /// The costs noted, in millionths of a token (each at most `u32::MAX` tokens, so that
    /// twice [`CallCosts::HALF_LIFE`] of them fit).
    micros: std::sync::atomic::AtomicU64,
    calls: std::sync::atomic::AtomicU64,
}

impl CallCosts {
    const HALF_LIFE: u64 = 256;

    /// Notes an acquire of `cost`.
    pub(crate) fn note(&self, cost: crate::tokens::Tokens) {
        use std::sync::atomic::Ordering::Relaxed;
        let micros = u64::try_from(cost.as_nanos().max(0) / 1_000).unwrap_or(u64::MAX);
        let micros = micros.min(u64::from(u32::MAX) * 1_000_000);
        // Halved together (near enough, between racing notes: it is a mean, not a count).
        if self.calls.fetch_add(1, Relaxed) + 1 >= 2 * Self::HALF_LIFE {
            self.calls.store(Self::HALF_LIFE, Relaxed);
            let sum = self.micros.load(Relaxed);
            self.micros.store(sum / 2, Relaxed);
        }
        self.micros.fetch_add(micros, Relaxed);
    }

    /// The mean cost of the acquires noted, if any.
    pub(crate) fn mean(&self) -> Option<crate::tokens::Tokens> {
        use std::sync::atomic::Ordering::Relaxed;
        let calls = self.calls.load(Relaxed);
        (calls > 0).then(|| {
            let micros = self.micros.load(Relaxed) / calls;
            crate::tokens::Tokens::from_nanos(i128::from(micros) * 1_000)
        })
    }
}

impl Default for Lane {
    fn default() -> Self {
        Lane {
            tickets: std::sync::atomic::AtomicU64::default(),
            memory: Mutex::default(),
            queue: Mutex::default(),
            room: Arc::new(tokio::sync::Semaphore::new(MAX_QUEUED)),
            writer: Arc::default(),
            throttled: std::sync::atomic::AtomicU32::default(),
            throttles: std::sync::atomic::AtomicU32::default(),
            lost_races: std::sync::atomic::AtomicU32::default(),
            pushed_back: std::sync::atomic::AtomicU64::default(),
            pushed_at: std::sync::atomic::AtomicI64::default(),
            costs: CallCosts::default(),
            waiting: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Lane {
    /// Counts a write of the lane's row (of `dimension`) that failed its condition.
    pub(crate) fn lost_race(&self, labels: &crate::metrics::Labels, dimension: &str) {
        crate::metrics::contention_retry(labels, dimension);
        self.lost_races
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// What this client remembers of the lane's bucket row.
    pub(crate) fn memory(&self) -> MutexGuard<'_, Remembered> {
        lock(&self.memory)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Takes a caller's job out of its lane's queue when the caller goes away before a writer
/// took it.
pub(crate) struct Dequeue<'a> {
    pub(crate) lane: &'a Lane,
    pub(crate) ticket: u64,
    /// Whether the job may still be in the queue (not once it was answered).
    pub(crate) queued: bool,
}

impl Drop for Dequeue<'_> {
    fn drop(&mut self) {
        if self.queued {
            lock(&self.lane.queue).retain(|q| q.ticket != self.ticket);
        }
    }
}

/// Moves the requests waiting in `lane`'s queue that can ride on the bucket write into
/// this write's batch, as far as it has room; the others stay queued.
pub(crate) fn join_queued(
    lane: &Lane,
    acquires: &mut Vec<AcquireJob>,
    releases: &mut Vec<ReleaseJob>,
) {
    let mut queue = lock(&lane.queue);
    if queue.is_empty() {
        return;
    }
    let mut stay = Vec::with_capacity(queue.len());
    sort_into_write(queue.drain(..), acquires, releases, &mut stay);
    *queue = stay;
}

/// Sorts `jobs` into one write's batch, as far as it has room: acquires whose caller is
/// gone are dropped unanswered (never granted), the jobs that do not fit go to `later`.
pub(crate) fn sort_into_write(
    jobs: impl IntoIterator<Item = Queued>,
    acquires: &mut Vec<AcquireJob>,
    releases: &mut Vec<ReleaseJob>,
    later: &mut Vec<Queued>,
) {
    for Queued { ticket, job, _room } in jobs {
        match job {
            Job::Acquire(a) if a.reply.is_closed() => {}
            Job::Acquire(a) if acquires.len() < MAX_BATCH => acquires.push(a),
            Job::Release(r) if releases.len() < MAX_RELEASES => releases.push(r),
            job => later.push(Queued { ticket, job, _room }),
        }
    }
}

/// Answers each job with the same outcome (a store error copied for each).
pub(crate) fn answer_all<J>(
    jobs: Vec<J>,
    reply: impl Fn(J) -> Reply<()>,
    outcome: &Result<(), StoreError>,
) {
    for job in jobs {
        let _ = reply(job).send(match outcome {
            Ok(()) => Ok(()),
            Err(e) => Err(Error::Store(e.clone_lossy())),
        });
    }
}

/// Answers each job with an error made by `error`.
pub(crate) fn answer_each<J, T>(
    jobs: Vec<J>,
    reply: impl Fn(J) -> Reply<T>,
    error: impl Fn() -> Error,
) {
    for job in jobs {
        let _ = reply(job).send(Err(error()));
    }
}

/// Answers every acquire and release of a write with the same failure.
pub(crate) fn fail_all(
    acquires: Vec<AcquireJob>,
    releases: Vec<ReleaseJob>,
    error: impl Fn() -> Error,
) {
    answer_each(acquires, |a| a.reply, &error);
    answer_each(releases, |r| r.reply, &error);
}
