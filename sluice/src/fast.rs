//! The fast path: one conditional write per grant, and none for a denial already known.
//!
//! Each client keeps, per dimension, a *lane*: the bucket row as this client last wrote or
//! saw it. A single-dimension acquire goes straight to the conditional write computed from
//! that row, without reading it first. When another writer got there first, the failed
//! condition hands back the current row (`ALL_OLD`): the lane takes it and the write is
//! recomputed and retried at once, without a read and without backoff (backoff stays for
//! transaction conflicts). When the row the lane knows is short, the exact RetryIn is
//! answered without any call: anything another process did since can only have taken more
//! tokens (the write would have failed anyway) or given some back (then the answer is
//! conservative), and every grant still goes through a conditional write.
//!
//! Acquires and releases waiting on the same lane are committed together: while one write
//! is in flight, the requests behind it queue, and the next write carries them all in one
//! atomic write: the bucket update (slots given back first, then as many grants as the
//! bucket allows), the new lease rows, and the deleted ones. Under load, calls per grant
//! drop well below one; a single caller pays exactly one write to acquire and one to
//! release. A release does not read the bucket either: a `concurrent` slot goes back
//! through the same conditional write from the lane's row.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::acquire::Wanted;
use crate::bucket::{BucketState, Take};
use crate::client::{Sluice, backoff_delay, new_unique};
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::lease::{Lease, LeaseId, LeasePart};
use crate::store::{
    BucketWrite, Commit, CommitError, ConditionFailure, LeaseKey, LeaseRecord, LeaseWrite,
    StoreError,
};
use crate::tokens::Tokens;

/// The most requests one write grants: one bucket update plus their lease rows and the
/// released ones stay within DynamoDB's 100 items per transaction.
const MAX_BATCH: usize = 64;

/// The most releases one write carries (`1 + MAX_BATCH + MAX_RELEASES` = 100 items).
const MAX_RELEASES: usize = 35;

/// Condition failures with a fresh row in hand are retried at once; this bounds them. Every
/// lost race is another writer's grant, so the row keeps moving; a writer much slower than
/// its rivals (an overloaded host) can still lose many times in a row before it wins.
pub(crate) const MAX_FRESH_RETRIES: u32 = 256;

/// The most lanes a client keeps: one that cycles through more dimensions than this
/// forgets the idle ones rather than growing without bound.
const MAX_LANES: usize = 4096;

/// The lanes of one client, by dimension.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    lanes: Mutex<HashMap<Dimension, Arc<Lane>>>,
}

impl Lanes {
    fn lane(&self, dimension: &Dimension) -> Arc<Lane> {
        let mut lanes = lock(&self.lanes);
        if let Some(lane) = lanes.get(dimension) {
            return lane.clone();
        }
        if lanes.len() >= MAX_LANES {
            // Forget the idle lanes (only the map holds them: no job queued, no write in
            // flight). Their dimensions cost one read again when next used.
            lanes.retain(|_, lane| Arc::strong_count(lane) > 1);
        }
        let lane = Arc::new(Lane::default());
        lanes.insert(dimension.clone(), lane.clone());
        lane
    }

    /// Records the row as it is after this client's own write.
    pub(crate) fn remember(&self, row: BucketState) {
        let lane = self.lane(&row.dimension);
        let mut known = lock(&lane.known);
        // Never go back to an older version than one already seen.
        if known.row.as_ref().is_none_or(|r| r.version < row.version) {
            known.row = Some(row);
        }
        known.short_until = None;
    }

    /// The row this client last saw for `dimension`, if any.
    pub(crate) fn known(&self, dimension: &Dimension) -> Option<BucketState> {
        let lanes = lock(&self.lanes);
        let lane = lanes.get(dimension)?;
        lock(&lane.known).row.clone()
    }

    /// Forgets what this client knew of `dimension` (its definition changed).
    pub(crate) fn forget(&self, dimension: &Dimension) {
        if let Some(lane) = lock(&self.lanes).get(dimension) {
            *lock(&lane.known) = Known::default();
        }
    }
}

/// What a lane knows of its bucket.
#[derive(Debug, Default)]
struct Known {
    row: Option<BucketState>,
    /// A `concurrent` bucket found short, with no slot expected back before this time
    /// (the earliest live lease expiry); a release by this client clears it.
    short_until: Option<UnixMillis>,
    /// Tokens this client took ahead (see [`Prefetch`](crate::Prefetch)), grantable
    /// locally until `until`.
    reservoir: Option<Reservoir>,
}

#[derive(Debug, Clone, Copy)]
struct Reservoir {
    tokens: Tokens,
    until: UnixMillis,
}

/// One request waiting on a lane.
struct Queued {
    /// Which caller queued it.
    ticket: u64,
    job: Job,
}

enum Job {
    Acquire(AcquireJob),
    Release(ReleaseJob),
}

struct AcquireJob {
    wanted: Wanted,
    ttl: Duration,
    reply: Reply<Lease>,
}

struct ReleaseJob {
    part: LeasePart,
    /// Answered once the row is gone (deleted by this write, or already released or
    /// reconciled).
    reply: Reply<()>,
}

type Reply<T> = tokio::sync::oneshot::Sender<Result<T, Error>>;

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

#[derive(Debug, Default)]
struct Lane {
    tickets: std::sync::atomic::AtomicU64,
    known: Mutex<Known>,
    queue: Mutex<Vec<Queued>>,
    writer: Arc<tokio::sync::Mutex<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Sluice {
    /// A single-dimension acquire on the fast path.
    pub(crate) async fn acquire_fast(&self, wanted: Wanted, ttl: Duration) -> Result<Lease, Error> {
        let lane = self.lanes().lane(&wanted.dimension);
        if let Some(lease) = self.grant_prefetched(&lane, &wanted, ttl) {
            return Ok(lease);
        }
        if let Some(answer) = self.known_answer(&lane, &wanted) {
            return Err(answer);
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job::Acquire(AcquireJob { wanted, ttl, reply });
        self.on_lane(&lane, job, answer).await
    }

    /// Releases one lease row on the fast path: the delete (and, for a `concurrent` bucket,
    /// the slot given back) rides on the lane's next write, without reading the bucket.
    pub(crate) async fn release_fast(&self, part: LeasePart) -> Result<(), Error> {
        let lane = self.lanes().lane(&part.dimension);
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.on_lane(&lane, Job::Release(ReleaseJob { part, reply }), answer)
            .await
    }

    /// Queues `job` on `lane` and waits for its answer: either an earlier writer takes the
    /// job along, or this caller becomes the writer. Waiting for the answer and for the
    /// writer's turn at once keeps callers whose job is already done out of the writers'
    /// line.
    async fn on_lane<T>(
        &self,
        lane: &Arc<Lane>,
        job: Job,
        mut answer: tokio::sync::oneshot::Receiver<Result<T, Error>>,
    ) -> Result<T, Error> {
        let ticket = lane
            .tickets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&lane.queue).push(Queued { ticket, job });
        let writer = match lane.writer.clone().try_lock_owned() {
            // No write in flight: this caller writes (without registering a wake-up on the
            // answer, which would cost a needless reschedule).
            Ok(writer) => writer,
            Err(_) => tokio::select! {
                biased;
                reply = &mut answer => return reply.unwrap_or_else(|_| Err(abandoned())),
                writer = lane.writer.clone().lock_owned() => writer,
            },
        };
        let batch = std::mem::take(&mut *lock(&lane.queue));
        if batch.is_empty() {
            // An earlier writer took this job along.
            drop(writer);
        } else if batch.len() == 1 && batch[0].ticket == ticket {
            // Only this caller's own job: write inline. Cancelling it affects no one else
            // (jobs arriving meanwhile wait in the queue for the next writer).
            self.commit_batch(lane, batch).await;
            drop(writer);
            return answer.try_recv().unwrap_or_else(|_| Err(abandoned()));
        } else {
            // The write runs in its own task: a caller dropping its acquire or release must
            // not cancel a write other callers are waiting for.
            let client = self.clone();
            let lane = lane.clone();
            let task = tokio::spawn(async move {
                client.commit_batch(&lane, batch).await;
                drop(writer);
            });
            if let Err(e) = task.await
                && e.is_panic()
            {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        answer.await.unwrap_or_else(|_| Err(abandoned()))
    }

    /// The lease of a single-dimension grant.
    fn one_part_lease(
        &self,
        part: LeasePart,
        created_at: UnixMillis,
        expires_at: UnixMillis,
        attempts: u32,
    ) -> Lease {
        Lease {
            client: self.clone(),
            id: LeaseId::new(vec![part.key.clone()]),
            parts: vec![part],
            created_at,
            expires_at,
            attempts,
        }
    }

    /// A grant from the tokens this client prefetched, if they are still fresh and enough.
    fn grant_prefetched(&self, lane: &Lane, wanted: &Wanted, ttl: Duration) -> Option<Lease> {
        let mut known = lock(&lane.known);
        let known = &mut *known;
        let reservoir = known.reservoir.as_mut()?;
        let now = self.now();
        if now >= reservoir.until {
            // Held too long: dropped, never granted (the overshoot bound depends on it).
            known.reservoir = None;
            return None;
        }
        let cost = wanted.cost(known.row.as_ref()?.bucket.cost_per_call());
        if cost > reservoir.tokens {
            return None;
        }
        reservoir.tokens -= cost;
        let part = LeasePart {
            key: LeaseKey::new(&wanted.dimension, &new_unique()),
            dimension: wanted.dimension.clone(),
            cost,
            restores: false,
            has_row: false,
        };
        Some(self.one_part_lease(part, now, now.saturating_add(ttl), 0))
    }

    /// The answer the lane already knows without any call: a RetryIn from the row it last
    /// saw (or a `concurrent` bucket's known shortage), or a cost that can never fit.
    fn known_answer(&self, lane: &Lane, wanted: &Wanted) -> Option<Error> {
        let known = lock(&lane.known);
        let row = known.row.as_ref()?;
        let now = self.now();
        let cost = wanted.cost(row.bucket.cost_per_call());
        match row.take(cost, now) {
            Take::Short { wait: Some(wait) } => {
                Some(Error::RetryIn(wait.max(Duration::from_millis(1))))
            }
            Take::Short { wait: None } => match known.short_until {
                Some(until) if until > now => Some(Error::RetryIn(
                    until.saturating_since(now).max(Duration::from_millis(1)),
                )),
                _ => None,
            },
            Take::ExceedsCapacity => Some(Error::CostExceedsCapacity {
                dimension: row.dimension.clone(),
                cost,
                capacity: row.bucket.capacity(),
            }),
            Take::Granted { .. } => None,
        }
    }

    /// Carries `batch`: one atomic write gives back the released `concurrent` slots and
    /// grants as many acquires as the bucket then allows; alongside it, the released rows
    /// that give nothing back are deleted in one batch (no condition needed: see
    /// [`Store::delete_leases`](crate::store::Store::delete_leases)), so they never lengthen
    /// the transaction holding the bucket row. Answers every job.
    async fn commit_batch(&self, lane: &Lane, batch: Vec<Queued>) {
        let mut acquires: Vec<AcquireJob> = Vec::new();
        let mut restoring: Vec<ReleaseJob> = Vec::new();
        let mut plain: Vec<ReleaseJob> = Vec::new();
        let mut later: Vec<Queued> = Vec::new();
        for queued in batch {
            match queued.job {
                Job::Acquire(a) if acquires.len() < MAX_BATCH => acquires.push(a),
                Job::Release(r) if !r.part.restores => plain.push(r),
                Job::Release(r) if restoring.len() < MAX_RELEASES => restoring.push(r),
                // The rest wait for the next write.
                job => later.push(Queued {
                    ticket: queued.ticket,
                    job,
                }),
            }
        }
        if !later.is_empty() {
            lock(&lane.queue).extend(later);
        }
        let deletes = async {
            if plain.is_empty() {
                return;
            }
            let keys: Vec<LeaseKey> = plain.iter().map(|r| r.part.key.clone()).collect();
            let deleted = self.store().delete_leases(&keys).await;
            for r in plain {
                let answer = match &deleted {
                    Ok(()) => Ok(()),
                    Err(e) => Err(Error::Store(e.clone_lossy())),
                };
                let _ = r.reply.send(answer);
            }
        };
        tokio::join!(deletes, self.commit_writes(lane, acquires, restoring));
    }

    /// The atomic write of [`commit_batch`](Self::commit_batch), retried from the current
    /// row when another writer got there first.
    async fn commit_writes(
        &self,
        lane: &Lane,
        mut acquires: Vec<AcquireJob>,
        mut releases: Vec<ReleaseJob>,
    ) {
        let Some(dimension) = acquires
            .first()
            .map(|a| a.wanted.dimension.clone())
            .or_else(|| releases.first().map(|r| r.part.dimension.clone()))
        else {
            return;
        };
        let max_retries = self.config().max_retries;
        let mut attempts: u32 = 0;
        let mut conflicts: u32 = 0;
        loop {
            attempts += 1;
            // The row is needed to grant, or to give slots back; plain deletes are not.
            let needs_row = !acquires.is_empty() || releases.iter().any(|r| r.part.restores);
            let known = lock(&lane.known).row.clone();
            let row = match known {
                Some(row) => Some(row),
                None if !needs_row => None,
                None => match self
                    .store()
                    .read_buckets(std::slice::from_ref(&dimension))
                    .await
                {
                    Ok(mut rows) => {
                        let row = rows.remove(0);
                        if row.is_none() {
                            // A deleted bucket grants nothing and has nothing to give
                            // back to; its lease rows are still deleted.
                            answer_each(
                                std::mem::take(&mut acquires),
                                |a| a.reply,
                                || Error::UnknownDimension(dimension.clone()),
                            );
                        }
                        lock(&lane.known).row.clone_from(&row);
                        row
                    }
                    Err(e) => {
                        fail_all(acquires, releases, || Error::Store(e.clone_lossy()));
                        return;
                    }
                },
            };
            let now = self.now();
            // The row as it stands after what this write decided so far: refilled, the
            // released slots given back, then each grant taken in order.
            let mut after = row.as_ref().map(|row| {
                let (tokens, last_refill_at) = row.refilled(now);
                BucketState {
                    tokens,
                    last_refill_at,
                    ..row.clone()
                }
            });
            let restored: Tokens = releases
                .iter()
                .filter(|r| r.part.restores)
                .map(|r| r.part.cost)
                .fold(Tokens::ZERO, |sum, cost| sum + cost);
            if let Some(after) = after.as_mut()
                && restored > Tokens::ZERO
            {
                (after.tokens, after.last_refill_at) = after.restored(restored, now);
            }
            let mut granted: Vec<(AcquireJob, Tokens)> = Vec::with_capacity(acquires.len());
            let mut short: Vec<AcquireJob> = Vec::new();
            if let (Some(row), Some(after)) = (row.as_ref(), after.as_mut()) {
                for a in std::mem::take(&mut acquires) {
                    let cost = a.wanted.cost(row.bucket.cost_per_call());
                    match after.take(cost, now) {
                        Take::Granted {
                            tokens,
                            last_refill_at,
                        } => {
                            (after.tokens, after.last_refill_at) = (tokens, last_refill_at);
                            granted.push((a, cost));
                        }
                        Take::ExceedsCapacity => {
                            let _ = a.reply.send(Err(Error::CostExceedsCapacity {
                                dimension: dimension.clone(),
                                cost,
                                capacity: row.bucket.capacity(),
                            }));
                        }
                        Take::Short { wait: Some(wait) } => {
                            let _ = a
                                .reply
                                .send(Err(Error::RetryIn(wait.max(Duration::from_millis(1)))));
                        }
                        Take::Short { wait: None } => short.push(a),
                    }
                }
            }
            if let (Some(row), false) = (row.as_ref(), short.is_empty()) {
                // A short `concurrent` bucket: look for expired leases to give back, or
                // learn when the next live one expires.
                match self.concurrent_wait(row, now).await {
                    Ok(Some(wait)) => {
                        lock(&lane.known).short_until = Some(now.saturating_add(wait));
                        answer_each(short, |a| a.reply, || Error::RetryIn(wait));
                    }
                    Ok(None) => {
                        // Expired leases were given back: everyone looks again.
                        lock(&lane.known).row = None;
                        acquires = granted.into_iter().map(|(a, _)| a).chain(short).collect();
                        continue;
                    }
                    Err(e) => {
                        let e = e.to_string();
                        answer_each(
                            short,
                            |a| a.reply,
                            || {
                                StoreError::Service {
                                    message: e.clone(),
                                    source: None,
                                }
                                .into()
                            },
                        );
                    }
                }
            }
            if granted.is_empty() && releases.is_empty() {
                return;
            }
            let lean = row.as_ref().is_some_and(|r| !r.bucket.keeps_leases());
            // Prefetch rides on a lean grant's write, and only from plenty: the bucket must
            // still hold as much again afterwards.
            let mut prefetched: Option<(Tokens, Duration)> = None;
            if let (true, false, Some(p), Some(after)) = (
                lean,
                granted.is_empty(),
                self.config().prefetch.get(&dimension),
                after.as_mut(),
            ) && let Take::Granted {
                tokens,
                last_refill_at,
            } = after.take(p.tokens(), now)
                && tokens >= p.tokens()
            {
                (after.tokens, after.last_refill_at) = (tokens, last_refill_at);
                prefetched = Some((p.tokens(), p.hold()));
            }
            let restores = row
                .as_ref()
                .is_some_and(|r| r.bucket.limit_type().restores_on_release());
            let caller = &self.config().caller;
            let mut leases = Vec::with_capacity(granted.len() + releases.len());
            let mut issued = Vec::with_capacity(granted.len());
            for (a, cost) in &granted {
                let key = LeaseKey::new(&dimension, &new_unique());
                let expires_at = now.saturating_add(a.ttl);
                if !lean {
                    leases.push(LeaseWrite::Create(LeaseRecord {
                        key: key.clone(),
                        dimension: dimension.clone(),
                        cost: *cost,
                        created_at: now,
                        expires_at,
                        caller: caller.clone(),
                    }));
                }
                issued.push((key, expires_at));
            }
            leases.extend(
                releases
                    .iter()
                    .map(|r| LeaseWrite::Delete(r.part.key.clone())),
            );
            let bucket = match (row.as_ref(), after.as_ref()) {
                (Some(row), Some(after)) if !granted.is_empty() || restored > Tokens::ZERO => {
                    Some(BucketWrite {
                        dimension: dimension.clone(),
                        expected_version: row.version,
                        tokens: after.tokens,
                        last_refill_at: after.last_refill_at,
                    })
                }
                _ => None,
            };
            let written = bucket.is_some();
            match self
                .store()
                .commit(Commit {
                    buckets: bucket.into_iter().collect(),
                    leases,
                })
                .await
            {
                Ok(()) => {
                    if let (true, Some(row), Some(mut after)) = (written, row, after) {
                        after.version = row.version + 1;
                        let mut known = lock(&lane.known);
                        known.row = Some(after);
                        if restored > Tokens::ZERO {
                            // A slot came back: the known shortage is over.
                            known.short_until = None;
                        }
                        // What is left of an older prefetch was too little for this write's
                        // requests, or is stale: dropped, and the new one replaces it.
                        known.reservoir = prefetched.map(|(tokens, hold)| Reservoir {
                            tokens,
                            until: now.saturating_add(hold),
                        });
                    }
                    if !granted.is_empty() {
                        crate::metrics::batch(granted.len());
                    }
                    for ((a, cost), (key, expires_at)) in granted.into_iter().zip(issued) {
                        let part = LeasePart {
                            key,
                            dimension: dimension.clone(),
                            cost,
                            restores,
                            has_row: !lean,
                        };
                        let lease = self.one_part_lease(part, now, expires_at, attempts);
                        // A caller gone meanwhile drops its lease, which releases it.
                        let _ = a.reply.send(Ok(lease));
                    }
                    for r in releases {
                        let _ = r.reply.send(Ok(()));
                    }
                    return;
                }
                Err(CommitError::Condition(ConditionFailure::BucketChanged {
                    current, ..
                })) => {
                    tracing::debug!(%dimension, attempts, "lost the race: retrying from the current row");
                    crate::metrics::contention_retry(dimension.as_str());
                    lock(&lane.known).row = current.map(|c| *c);
                    if attempts > MAX_FRESH_RETRIES + max_retries {
                        fail_all(acquires_of(granted), releases, || Error::Contention {
                            dimension: dimension.clone(),
                            attempts,
                        });
                        return;
                    }
                }
                Err(CommitError::Condition(ConditionFailure::LeaseExists(key))) => {
                    tracing::debug!(%key, "lease key already taken; drawing new ones");
                }
                Err(CommitError::Condition(ConditionFailure::LeaseMissing(key))) => {
                    match releases.iter().position(|r| r.part.key == key) {
                        Some(i) => {
                            // Released or reconciled elsewhere: its slot is back already.
                            tracing::debug!(%key, "lease row already gone (released or reconciled)");
                            let _ = releases.swap_remove(i).reply.send(Ok(()));
                        }
                        None => {
                            let message =
                                format!("store reported missing lease `{key}` while creating it");
                            fail_all(acquires_of(granted), releases, || {
                                Error::Store(StoreError::Service {
                                    message: message.clone(),
                                    source: None,
                                })
                            });
                            return;
                        }
                    }
                }
                Err(CommitError::TransactionConflict) => {
                    conflicts += 1;
                    crate::metrics::contention_retry(dimension.as_str());
                    if conflicts > max_retries {
                        fail_all(acquires_of(granted), releases, || Error::Contention {
                            dimension: dimension.clone(),
                            attempts,
                        });
                        return;
                    }
                    tokio::time::sleep(backoff_delay(conflicts)).await;
                }
                Err(CommitError::Store(e)) => {
                    // The row may or may not have changed: read it next time.
                    lock(&lane.known).row = None;
                    fail_all(acquires_of(granted), releases, || {
                        Error::Store(e.clone_lossy())
                    });
                    return;
                }
            }
            acquires = acquires_of(granted);
        }
    }
}

/// The answer when the write carrying a request went away without answering it.
fn abandoned() -> Error {
    StoreError::Service {
        message: "the write carrying this request was abandoned".to_owned(),
        source: None,
    }
    .into()
}

fn acquires_of(granted: Vec<(AcquireJob, Tokens)>) -> Vec<AcquireJob> {
    granted.into_iter().map(|(a, _)| a).collect()
}

/// Answers each job with an error made by `error`.
fn answer_each<J, T>(jobs: Vec<J>, reply: impl Fn(J) -> Reply<T>, error: impl Fn() -> Error) {
    for job in jobs {
        let _ = reply(job).send(Err(error()));
    }
}

/// Answers every acquire and release of a write with the same failure.
fn fail_all(acquires: Vec<AcquireJob>, releases: Vec<ReleaseJob>, error: impl Fn() -> Error) {
    answer_each(acquires, |a| a.reply, &error);
    answer_each(releases, |r| r.reply, &error);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acquire::Acquire;
    use crate::bucket::Bucket;
    use crate::clock::ManualClock;
    use crate::store::{LeaseFilter, MemoryStore};

    fn acquire_job(
        dimension: &str,
    ) -> (Queued, tokio::sync::oneshot::Receiver<Result<Lease, Error>>) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let wanted = Acquire::new(dimension).resolve().unwrap().remove(0);
        let job = Job::Acquire(AcquireJob {
            wanted,
            ttl: Duration::from_secs(60),
            reply,
        });
        (Queued { ticket: 0, job }, answer)
    }

    fn release_job(
        lease: &mut Lease,
    ) -> (Queued, tokio::sync::oneshot::Receiver<Result<(), Error>>) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let part = lease.take_rows().remove(0);
        (
            Queued {
                ticket: 0,
                job: Job::Release(ReleaseJob { part, reply }),
            },
            answer,
        )
    }

    #[tokio::test]
    async fn one_write_gives_back_released_slots_once_and_grants_from_them() {
        let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
        let sluice = Sluice::builder()
            .store(MemoryStore::new())
            .clock(clock.clone())
            .build()
            .unwrap();
        let dim = "vendor#concurrent";
        sluice.put_bucket(dim, Bucket::concurrent(3)).await.unwrap();
        let mut short_lived = sluice
            .acquire(Acquire::new(dim).ttl(Duration::from_secs(1)))
            .await
            .unwrap();
        let mut b = sluice.acquire(dim).await.unwrap();
        let held = sluice.acquire(dim).await.unwrap();
        // The first lease expires and the reconciler gives its slot back before its
        // release arrives, in the same write as another release and an acquire.
        clock.advance(Duration::from_secs(2));
        assert_eq!(sluice.reconcile().await.unwrap().leases_restored, 1);
        let (late, late_answer) = release_job(&mut short_lived);
        let (release_b, b_answer) = release_job(&mut b);
        let (acquire, acquired) = acquire_job(dim);
        let lane = sluice.lanes().lane(&Dimension::new(dim).unwrap());
        sluice
            .commit_batch(&lane, vec![late, release_b, acquire])
            .await;
        late_answer.await.unwrap().unwrap();
        b_answer.await.unwrap().unwrap();
        let new = acquired.await.unwrap().unwrap();
        // Three slots: `held` and the new lease out, one free. Giving the reconciled slot
        // back twice would show two.
        let row = sluice.bucket(dim).await.unwrap().unwrap();
        assert_eq!(row.tokens, Tokens::new(1));
        let mut live: Vec<LeaseKey> = sluice
            .leases(&LeaseFilter::default())
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.key)
            .collect();
        live.sort();
        let mut expected = vec![held.id().keys()[0].clone(), new.id().keys()[0].clone()];
        expected.sort();
        assert_eq!(live, expected);
    }

    #[tokio::test]
    async fn a_client_cycling_through_many_dimensions_keeps_a_bounded_number_of_lanes() {
        let sluice = Sluice::in_memory();
        let busy = sluice.lanes().lane(&Dimension::new("vendor#busy").unwrap());
        for i in 0..MAX_LANES + 10 {
            let dim = format!("vendor{i}#rpm");
            sluice
                .put_bucket(&dim, Bucket::requests(crate::RefillRate::per_second(10)))
                .await
                .unwrap();
            sluice
                .acquire(dim.as_str())
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }
        let lanes = lock(&sluice.lanes().lanes);
        assert!(lanes.len() <= MAX_LANES, "{} lanes", lanes.len());
        // A lane in use is never forgotten under its user.
        let kept = lanes.get(&Dimension::new("vendor#busy").unwrap()).unwrap();
        assert!(Arc::ptr_eq(kept, &busy));
    }

    #[tokio::test]
    async fn plain_releases_are_deleted_beside_the_write_and_overflow_waits() {
        let sluice = Sluice::builder()
            .store(MemoryStore::new())
            .clock(ManualClock::new(UnixMillis::from_secs(1_700_000_000)))
            .build()
            .unwrap();
        let dim = "vendor#rpm";
        sluice
            .put_bucket(dim, Bucket::requests(crate::RefillRate::per_second(1000)))
            .await
            .unwrap();
        let mut batch = Vec::new();
        let mut answers = Vec::new();
        for _ in 0..MAX_BATCH + 3 {
            let (job, answer) = acquire_job(dim);
            batch.push(job);
            answers.push(answer);
        }
        let lane = sluice.lanes().lane(&Dimension::new(dim).unwrap());
        sluice.commit_batch(&lane, batch).await;
        // One write grants MAX_BATCH; the rest wait in the queue for the next writer.
        assert_eq!(lock(&lane.queue).len(), 3);
        let mut leases = Vec::new();
        for answer in answers.iter_mut().take(MAX_BATCH) {
            leases.push(answer.try_recv().unwrap().unwrap());
        }
        assert!(answers[MAX_BATCH].try_recv().is_err());
        let rest = std::mem::take(&mut *lock(&lane.queue));
        sluice.commit_batch(&lane, rest).await;
        for answer in answers.iter_mut().skip(MAX_BATCH) {
            leases.push(answer.try_recv().unwrap().unwrap());
        }
        let releases: Vec<_> = leases.iter_mut().map(release_job).collect();
        let (jobs, answers): (Vec<_>, Vec<_>) = releases.into_iter().unzip();
        sluice.commit_batch(&lane, jobs).await;
        for answer in answers {
            answer.await.unwrap().unwrap();
        }
        assert!(
            sluice
                .leases(&LeaseFilter::default())
                .await
                .unwrap()
                .is_empty()
        );
        // Plain releases give nothing back.
        let row = sluice.bucket(dim).await.unwrap().unwrap();
        let granted = i64::try_from(MAX_BATCH + 3).unwrap();
        assert_eq!(row.tokens, row.bucket.capacity() - Tokens::new(granted));
    }
}
