//! The fast path: one conditional write per grant, and none for a denial already known.
//!
//! Each client keeps, per dimension, a *lane*: what it remembers of the bucket row (see
//! [`remembered`](crate::remembered) for when that may answer), and the requests waiting
//! for the lane's next write. A single-dimension acquire goes straight to the conditional
//! write computed from the remembered row, without reading it first. When another writer
//! got there first, the failed condition hands back the current row (`ALL_OLD`): the lane
//! takes it and the write is recomputed and retried at once, without a read and without
//! backoff (backoff stays for transaction conflicts). A denial is computed from a row the
//! store just confirmed (the write's own, or one read or handed back) and, for as long as
//! that denial runs, later ones come from memory without a call.
//!
//! Acquires and releases waiting on the same lane are committed together: while one write
//! is in flight, the requests behind it queue (at most [`MAX_QUEUED`]; more wait for
//! room), and the next write carries them all in one atomic write: the bucket update
//! (slots given back first, then as many grants as the bucket allows), the new lease rows,
//! and the deleted ones. Under load, calls per grant drop well below one; a single caller
//! pays exactly one write to acquire and one to release. A release does not read the
//! bucket either: a `concurrent` slot goes back through the same conditional write.
//!
//! A caller that goes away is never granted: its request leaves the queue with it, a
//! write skips requests whose caller is gone, and a grant whose caller went while its write
//! was in flight is given back at once. A write never stops half-way because its caller
//! went away: it finishes in a task of its own ([`Detached`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::acquire::Wanted;
use crate::bucket::{BucketState, HeldLease, Take};
use crate::client::{Sluice, backoff_delay, new_unique};
use crate::clock::UnixMillis;
use crate::detach::Detached;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::lease::{Kept, Lease, LeaseId, LeasePart};
use crate::remembered::{MIN_RETRY_IN, Recall, Remembered};
use crate::store::{
    BucketWrite, Commit, CommitError, ConditionFailure, HeldWrite, LeaseKey, LeaseRecord,
    LeaseWrite, StoreError,
};
use crate::tokens::Tokens;

/// The most requests one write grants: one bucket update plus their lease rows and the
/// released ones stay within DynamoDB's 100 items per transaction.
const MAX_BATCH: usize = 64;

/// The most releases one write carries (`1 + MAX_BATCH + MAX_RELEASES` = 100 items).
const MAX_RELEASES: usize = 35;

/// The most expired kept leases one write gives back.
const MAX_RECLAIMED: usize = 32;

/// The most requests waiting on one lane; a caller beyond it waits for room.
pub(crate) const MAX_QUEUED: usize = 1_024;

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
    pub(crate) fn lane(&self, dimension: &Dimension) -> Arc<Lane> {
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

    /// Whether `dimension` is, as far as this client knows, a `concurrent` bucket.
    pub(crate) fn holds_slots(&self, dimension: &Dimension) -> bool {
        lock(&self.lanes)
            .get(dimension)
            .is_some_and(|lane| lane.memory().holds_slots())
    }
}

/// One request waiting on a lane.
struct Queued {
    /// Which caller queued it.
    ticket: u64,
    job: Job,
    /// Its place in the lane's bounded queue.
    _room: tokio::sync::OwnedSemaphorePermit,
}

enum Job {
    Acquire(AcquireJob),
    Release(ReleaseJob),
}

struct AcquireJob {
    wanted: Wanted,
    ttl: Duration,
    /// A waiting caller's wait began then: it takes a denial only from a row learned since.
    fresh_after: Option<UnixMillis>,
    /// Whether this is the whole request (not one dimension of several).
    alone: bool,
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

#[derive(Debug)]
pub(crate) struct Lane {
    tickets: std::sync::atomic::AtomicU64,
    memory: Mutex<Remembered>,
    queue: Mutex<Vec<Queued>>,
    /// Room in the queue, so that it stays bounded.
    room: Arc<tokio::sync::Semaphore>,
    writer: Arc<tokio::sync::Mutex<()>>,
}

impl Default for Lane {
    fn default() -> Self {
        Lane {
            tickets: std::sync::atomic::AtomicU64::default(),
            memory: Mutex::default(),
            queue: Mutex::default(),
            room: Arc::new(tokio::sync::Semaphore::new(MAX_QUEUED)),
            writer: Arc::default(),
        }
    }
}

impl Lane {
    /// What this client remembers of the lane's bucket row.
    pub(crate) fn memory(&self) -> MutexGuard<'_, Remembered> {
        lock(&self.memory)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Takes a caller's job out of its lane's queue when the caller goes away before a writer
/// took it.
struct Dequeue<'a> {
    lane: &'a Lane,
    ticket: u64,
    /// Whether the job may still be in the queue (not once it was answered).
    queued: bool,
}

impl Drop for Dequeue<'_> {
    fn drop(&mut self) {
        if self.queued {
            lock(&self.lane.queue).retain(|q| q.ticket != self.ticket);
        }
    }
}

impl Sluice {
    /// A single-dimension acquire on the fast path; with `alone` false, one dimension of a
    /// several-dimension acquire (which neither prefetches nor takes prefetched tokens:
    /// prefetch is for single-dimension acquires, see [`Prefetch`](crate::Prefetch)).
    pub(crate) async fn acquire_fast(
        &self,
        wanted: Wanted,
        ttl: Duration,
        fresh_after: Option<UnixMillis>,
        alone: bool,
    ) -> Result<Lease, Error> {
        let lane = self.lanes().lane(&wanted.dimension);
        {
            let now = self.now();
            let mut memory = lane.memory();
            if alone && let Some(cost) = memory.take_prefetched(&wanted, now) {
                return Ok(self.prefetched_lease(&wanted, cost, now, ttl));
            }
            if let Recall::Denied(wait) = memory.recall(&wanted, now, fresh_after) {
                memory.answered(now.saturating_add(wait));
                return Err(Error::RetryIn(wait));
            }
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job::Acquire(AcquireJob {
            wanted,
            ttl,
            fresh_after,
            alone,
            reply,
        });
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
    /// job along, or this caller becomes the writer, as many times as it takes (a write
    /// carries at most [`MAX_BATCH`] acquires; the rest wait for the next turn). Waiting
    /// for the answer and for the writer's turn at once keeps callers whose job is already
    /// done out of the writers' line.
    async fn on_lane<T>(
        &self,
        lane: &Arc<Lane>,
        job: Job,
        mut answer: tokio::sync::oneshot::Receiver<Result<T, Error>>,
    ) -> Result<T, Error> {
        let room = match lane.room.clone().try_acquire_owned() {
            Ok(room) => room,
            Err(_) => lane
                .room
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| abandoned())?,
        };
        let ticket = lane
            .tickets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&lane.queue).push(Queued {
            ticket,
            job,
            _room: room,
        });
        let mut dequeue = Dequeue {
            lane,
            ticket,
            queued: true,
        };
        loop {
            let writer = match lane.writer.clone().try_lock_owned() {
                // No write in flight: this caller writes (without registering a wake-up on
                // the answer, which would cost a needless reschedule).
                Ok(writer) => writer,
                Err(_) => tokio::select! {
                    biased;
                    reply = &mut answer => {
                        dequeue.queued = false;
                        return reply.unwrap_or_else(|_| Err(abandoned()));
                    }
                    writer = lane.writer.clone().lock_owned() => writer,
                },
            };
            let batch = std::mem::take(&mut *lock(&lane.queue));
            if batch.is_empty() {
                // An earlier writer carried this job: its answer is in.
                drop(writer);
            } else if batch.len() == 1 && batch[0].ticket == ticket {
                // Only this caller's own job: written in place. Should the caller go away
                // meanwhile, the write finishes on its own and gives its grant back; jobs
                // arriving meanwhile wait in the queue for the next writer.
                let client = self.clone();
                let lane = lane.clone();
                Detached::new(async move {
                    client.commit_batch(&lane, batch).await;
                    drop(writer);
                })
                .await;
            } else {
                // The write runs in its own task: a caller dropping its acquire or release
                // must not cancel a write other callers are waiting for.
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
            match answer.try_recv() {
                Ok(reply) => {
                    dequeue.queued = false;
                    return reply;
                }
                // The write had no room for this job: it is back in the queue.
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                    return Err(abandoned());
                }
            }
        }
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

    /// The lease of a grant from prefetched tokens.
    fn prefetched_lease(
        &self,
        wanted: &Wanted,
        cost: Tokens,
        now: UnixMillis,
        ttl: Duration,
    ) -> Lease {
        let part = LeasePart {
            key: LeaseKey::new(&wanted.dimension, &new_unique()),
            dimension: wanted.dimension.clone(),
            cost,
            restores: false,
            kept: Kept::Nowhere,
        };
        self.one_part_lease(part, now, now.saturating_add(ttl), 0)
    }

    /// Carries `batch`: one atomic write gives back the released `concurrent` slots and
    /// grants as many acquires as the bucket then allows; alongside it, the released rows
    /// that give nothing back are deleted in one batch (no condition needed: see
    /// [`Store::delete_leases`](crate::store::Store::delete_leases)), so they never lengthen
    /// the transaction holding the bucket row. Acquires whose caller is gone are dropped
    /// unanswered: never granted. Answers every other job, or puts it back in the queue.
    async fn commit_batch(&self, lane: &Lane, batch: Vec<Queued>) {
        let mut acquires: Vec<AcquireJob> = Vec::new();
        // Releases that ride on the bucket write (those that give slots back, and those
        // whose lease the row keeps).
        let mut carried: Vec<ReleaseJob> = Vec::new();
        let mut plain: Vec<ReleaseJob> = Vec::new();
        let mut later: Vec<Queued> = Vec::new();
        for Queued { ticket, job, _room } in batch {
            match job {
                Job::Acquire(a) if a.reply.is_closed() => {}
                Job::Acquire(a) if acquires.len() < MAX_BATCH => acquires.push(a),
                Job::Release(r) if !r.part.restores && r.part.kept == Kept::Row => plain.push(r),
                Job::Release(r) if carried.len() < MAX_RELEASES => carried.push(r),
                // The rest wait for the next write.
                job => later.push(Queued { ticket, job, _room }),
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
        tokio::join!(deletes, self.commit_writes(lane, acquires, carried));
    }

    /// The atomic write of [`commit_batch`](Self::commit_batch), retried from the current
    /// row when another writer got there first. Refusals are answered only from a row the
    /// store confirmed (this write's own, or one read or handed back), or from memory where
    /// the freshness rules allow it.
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
        let mut looked_again: u32 = 0;
        // Whether the remembered row was confirmed by the store during this write.
        let mut fresh = false;
        // Whether the last attempt lost a race to another writer.
        let mut lost = false;
        loop {
            attempts += 1;
            // The row is needed to grant, or to give slots back; releases that give nothing
            // back are not.
            let needs_row = !acquires.is_empty() || releases.iter().any(|r| r.part.restores);
            if !needs_row {
                self.forget_released(lane, &dimension, releases).await;
                return;
            }
            let remembered = lane.memory().row().cloned();
            let row = match remembered {
                Some(row) => row,
                None => match self.read_into(lane, &dimension).await {
                    Ok(Some(row)) => {
                        fresh = true;
                        row
                    }
                    Ok(None) => {
                        // A deleted bucket grants nothing and has nothing to give back to;
                        // its lease rows are deleted all the same.
                        answer_each(
                            std::mem::take(&mut acquires),
                            |a| a.reply,
                            || Error::UnknownDimension(dimension.clone()),
                        );
                        self.delete_released(releases).await;
                        return;
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
            let base = {
                let (tokens, last_refill_at) = row.refilled(now);
                BucketState {
                    tokens,
                    last_refill_at,
                    ..row.clone()
                }
            };
            let after = base.clone();
            let released: Tokens = releases
                .iter()
                .filter(|r| r.part.restores)
                .map(|r| r.part.cost)
                .fold(Tokens::ZERO, |sum, cost| sum + cost);
            let (mut after, mut granted, mut refused) =
                take_in_order(&row, after, released, std::mem::take(&mut acquires), now);
            // A `concurrent` row short for some of them gives its expired kept leases back
            // in the same write (exactly once: each removal is conditioned on the lease
            // still being there), then grants again.
            let mut reclaimed: Vec<&HeldLease> = Vec::new();
            if !refused.is_empty() && row.bucket.limit_type().restores_on_release() {
                reclaimed = row
                    .held
                    .iter()
                    .filter(|h| h.expires_at <= now)
                    .filter(|h| !releases.iter().any(|r| r.part.key.unique() == h.id))
                    .collect();
                // The earliest first, and a bounded number per write (the write's
                // expressions must stay within DynamoDB's limits; the rest come back in
                // later writes or from the reconciler).
                reclaimed.sort_by_key(|h| h.expires_at);
                reclaimed.truncate(MAX_RECLAIMED);
                if !reclaimed.is_empty() {
                    let back = reclaimed.iter().fold(released, |sum, h| sum + h.cost);
                    (after, granted, refused) =
                        take_in_order(&row, base, back, jobs_of(granted, refused), now);
                }
            }
            let restored = reclaimed.iter().fold(released, |sum, h| sum + h.cost);
            if granted.is_empty()
                && reclaimed.is_empty()
                && !releases.is_empty()
                && releases.iter().all(|r| !r.part.restores)
            {
                // Only releases that give nothing back: no new version for them.
                self.forget_released(lane, &dimension, std::mem::take(&mut releases))
                    .await;
            }
            if granted.is_empty() && releases.is_empty() && reclaimed.is_empty() {
                // Nothing to write: only refusals.
                if !fresh {
                    match self.answer_from_memory(lane, refused, now) {
                        Ok(()) => return,
                        Err(unconfirmed) => {
                            // A refusal memory may not give: read the row, then decide.
                            acquires = unconfirmed;
                            lane.memory().forget();
                            continue;
                        }
                    }
                }
                match self
                    .answer_refusals(lane, &row, refused, now, looked_again)
                    .await
                {
                    Some(again) if !again.is_empty() => {
                        // Expired leases were given back: look again.
                        looked_again += 1;
                        acquires = again;
                        fresh = false;
                        continue;
                    }
                    _ => return,
                }
            }
            let lean = !row.bucket.keeps_leases();
            // Prefetch rides on a lean grant's write, and only from plenty: the bucket must
            // still hold as much again afterwards.
            let mut prefetched: Option<(Tokens, UnixMillis)> = None;
            if let (true, true, Some(p)) = (
                lean,
                granted.iter().any(|(a, _)| a.alone),
                self.config().prefetch.get(&dimension),
            ) && let Take::Granted {
                tokens,
                last_refill_at,
            } = after.take(p.tokens(), now)
                && tokens >= p.tokens()
            {
                (after.tokens, after.last_refill_at) = (tokens, last_refill_at);
                prefetched = Some((p.tokens(), now.saturating_add(p.hold())));
            }
            let restores = row.bucket.limit_type().restores_on_release();
            let caller = &self.config().caller;
            let mut leases = Vec::with_capacity(granted.len() + releases.len());
            let mut held = Vec::with_capacity(granted.len() + releases.len());
            // What the row keeps after this write's releases; new leases join while there
            // is room, the rest get rows of their own.
            let released_from_row = releases
                .iter()
                .filter(|r| r.part.kept == Kept::InBucket)
                .count();
            let mut kept_in_row = row
                .held
                .len()
                .saturating_sub(released_from_row + reclaimed.len());
            // The row may keep fewer than remembered (releases elsewhere remove leases
            // without a new version, so memory only ever counts too many): before giving a
            // grant a lease row of its own, look at the row.
            let room = self.config().leases_per_row;
            if !lean && !fresh && room > 0 && kept_in_row + granted.len() > room {
                match self.read_into(lane, &dimension).await {
                    Ok(row) => {
                        fresh = row.is_some();
                        acquires = jobs_of(granted, refused);
                        continue;
                    }
                    Err(e) => {
                        fail_all(jobs_of(granted, refused), releases, || {
                            Error::Store(e.clone_lossy())
                        });
                        return;
                    }
                }
            }
            let mut issued = Vec::with_capacity(granted.len());
            for (a, cost) in &granted {
                let expires_at = now.saturating_add(a.ttl);
                let kept = if lean {
                    Kept::Nowhere
                } else if kept_in_row < room {
                    kept_in_row += 1;
                    Kept::InBucket
                } else {
                    Kept::Row
                };
                let key = match kept {
                    Kept::InBucket => {
                        let id = new_held_id(&row, &held);
                        held.push(HeldWrite::Add(HeldLease {
                            id: id.clone(),
                            cost: *cost,
                            created_at: now,
                            expires_at,
                            caller: caller.clone(),
                        }));
                        LeaseKey::new(&dimension, &id)
                    }
                    Kept::Row => {
                        let key = LeaseKey::new(&dimension, &new_unique());
                        leases.push(LeaseWrite::Create(LeaseRecord {
                            slot: restores,
                            key: key.clone(),
                            dimension: dimension.clone(),
                            cost: *cost,
                            created_at: now,
                            expires_at,
                            caller: caller.clone(),
                            in_bucket: false,
                        }));
                        key
                    }
                    Kept::Nowhere => LeaseKey::new(&dimension, &new_unique()),
                };
                issued.push((key, expires_at, kept));
            }
            for r in &releases {
                let id = r.part.key.unique().to_owned();
                match (r.part.kept, r.part.restores) {
                    (Kept::InBucket, true) => held.push(HeldWrite::Remove(id)),
                    (Kept::InBucket, false) => held.push(HeldWrite::Forget(id)),
                    (Kept::Row, _) => leases.push(LeaseWrite::Delete(r.part.key.clone())),
                    // A grant given back that had no lease (lean, or prefetched).
                    (Kept::Nowhere, _) => {}
                }
            }
            held.extend(reclaimed.iter().map(|h| HeldWrite::Remove(h.id.clone())));
            // Releases of slots that hold nothing (adjusted to zero) kept in rows of their
            // own only delete those rows.
            let writes_bucket = !granted.is_empty()
                || restored > Tokens::ZERO
                || held.iter().any(|h| matches!(h, HeldWrite::Remove(_)));
            if !writes_bucket {
                // No bucket write to ride on.
                held.clear();
                let (forgets, rest): (Vec<ReleaseJob>, Vec<ReleaseJob>) = releases
                    .into_iter()
                    .partition(|r| r.part.kept == Kept::InBucket && !r.part.restores);
                releases = rest;
                self.forget_released(lane, &dimension, forgets).await;
            }
            let write =
                BucketWrite::new(row.clone(), after.tokens, after.last_refill_at).with_held(held);
            let written = write.after();
            match self
                .store()
                .commit(Commit {
                    buckets: if writes_bucket {
                        vec![write]
                    } else {
                        Vec::new()
                    },
                    leases,
                })
                .await
            {
                Ok(()) if !writes_bucket => {
                    for r in releases {
                        let _ = r.reply.send(Ok(()));
                    }
                    if refused.is_empty() {
                        return;
                    }
                    // The bucket row was not written, so not confirmed: decide again.
                    acquires = refused;
                    releases = Vec::new();
                    continue;
                }
                Ok(()) => {
                    {
                        let mut memory = lane.memory();
                        memory.learn_written(written.clone(), now);
                        if lean && granted.iter().any(|(a, _)| a.alone) {
                            // What is left of an older prefetch was too little for this
                            // write's requests, or is stale: the new one replaces it.
                            memory.set_prefetched(prefetched);
                        }
                    }
                    if !granted.is_empty() {
                        crate::metrics::batch(granted.len());
                    }
                    for ((a, cost), (key, expires_at, kept)) in granted.into_iter().zip(issued) {
                        let part = LeasePart {
                            key,
                            dimension: dimension.clone(),
                            cost,
                            restores,
                            kept,
                        };
                        let lease = self.one_part_lease(part, now, expires_at, attempts);
                        if let Err(Ok(lease)) = a.reply.send(Ok(lease)) {
                            // The caller went away while the write was in flight.
                            self.give_back_in_background(lease);
                        }
                    }
                    for r in releases {
                        let _ = r.reply.send(Ok(()));
                    }
                    // This write confirmed the row the refusals were computed from.
                    match self
                        .answer_refusals(lane, &written, refused, now, looked_again)
                        .await
                    {
                        Some(again) if !again.is_empty() => {
                            looked_again += 1;
                            acquires = again;
                            releases = Vec::new();
                            fresh = false;
                            continue;
                        }
                        _ => return,
                    }
                }
                Err(CommitError::Condition(ConditionFailure::BucketChanged {
                    current, ..
                })) => {
                    tracing::debug!(%dimension, attempts, "lost the race: retrying from the current row");
                    crate::metrics::contention_retry(dimension.as_str());
                    lost = true;
                    match current {
                        Some(current) => {
                            lane.memory().learn(*current, now);
                            fresh = true;
                        }
                        None => {
                            lane.memory().forget();
                            fresh = false;
                        }
                    }
                    if attempts > MAX_FRESH_RETRIES + max_retries {
                        fail_all(jobs_of(granted, refused), releases, || Error::Contention {
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
                            tracing::debug!(%key, "lease already gone (released or reconciled)");
                            let _ = releases.swap_remove(i).reply.send(Ok(()));
                        }
                        None if reclaimed.iter().any(|h| h.id == key.unique()) => {
                            // Another client reclaimed it first: read the row again.
                            lane.memory().forget();
                            fresh = false;
                        }
                        None => {
                            fail_all(jobs_of(granted, refused), releases, || {
                                StoreError::missing_lease(&key).into()
                            });
                            return;
                        }
                    }
                }
                Err(CommitError::TransactionConflict) => {
                    conflicts += 1;
                    crate::metrics::contention_retry(dimension.as_str());
                    if conflicts > max_retries {
                        fail_all(jobs_of(granted, refused), releases, || Error::Contention {
                            dimension: dimension.clone(),
                            attempts,
                        });
                        return;
                    }
                    tokio::time::sleep(backoff_delay(conflicts)).await;
                }
                Err(CommitError::Store(e)) => {
                    // The row may or may not have changed: read it next time.
                    lane.memory().forget();
                    fail_all(jobs_of(granted, refused), releases, || {
                        Error::Store(e.clone_lossy())
                    });
                    return;
                }
            }
            acquires = jobs_of(granted, refused);
            if std::mem::take(&mut lost) {
                // Requests that queued while this write lost a race join its retry: under
                // contention from other processes, each write carries more.
                join_queued(lane, &mut acquires, &mut releases);
            }
        }
    }

    /// Reads the bucket row of `dimension` and takes it as what `lane` remembers.
    async fn read_into(
        &self,
        lane: &Lane,
        dimension: &Dimension,
    ) -> Result<Option<BucketState>, StoreError> {
        // As of when the read was sent: nothing later is known of the row.
        let sent = self.now();
        let row = self
            .store()
            .read_buckets(std::slice::from_ref(dimension))
            .await?
            .remove(0);
        let mut memory = lane.memory();
        match &row {
            Some(row) => memory.learn(row.clone(), sent),
            None => memory.forget(),
        }
        Ok(row)
    }

    /// Deletes the lease rows of releases whose bucket is gone (the leases it kept went
    /// with it), and answers them.
    async fn delete_released(&self, releases: Vec<ReleaseJob>) {
        if releases.is_empty() {
            return;
        }
        let keys: Vec<LeaseKey> = releases
            .iter()
            .filter(|r| r.part.kept == Kept::Row)
            .map(|r| r.part.key.clone())
            .collect();
        let deleted = self.store().delete_leases(&keys).await;
        for r in releases {
            let _ = r.reply.send(
                deleted
                    .as_ref()
                    .map_err(|e| Error::Store(e.clone_lossy()))
                    .copied(),
            );
        }
    }

    /// Removes the leases of releases that give nothing back from the row that keeps them,
    /// with no condition and no new version (see
    /// [`Store::forget_held`](crate::store::Store::forget_held)), and answers them.
    async fn forget_released(&self, lane: &Lane, dimension: &Dimension, releases: Vec<ReleaseJob>) {
        if releases.is_empty() {
            return;
        }
        let ids: Vec<String> = releases
            .iter()
            .map(|r| r.part.key.unique().to_owned())
            .collect();
        let forgotten = self.store().forget_held(dimension, &ids).await;
        if forgotten.is_ok() {
            lane.memory().drop_held(&ids);
        }
        for r in releases {
            let _ = r.reply.send(
                forgotten
                    .as_ref()
                    .map_err(|e| Error::Store(e.clone_lossy()))
                    .copied(),
            );
        }
    }

    /// Answers refusals computed from a remembered row, where memory may give them all;
    /// otherwise hands every job back, to be decided from the store.
    fn answer_from_memory(
        &self,
        lane: &Lane,
        refused: Vec<AcquireJob>,
        now: UnixMillis,
    ) -> Result<(), Vec<AcquireJob>> {
        let mut memory = lane.memory();
        let recalled: Vec<Recall> = refused
            .iter()
            .map(|a| memory.recall(&a.wanted, now, a.fresh_after))
            .collect();
        if !recalled.iter().all(|r| matches!(r, Recall::Denied(_))) {
            return Err(refused);
        }
        for (a, recall) in refused.into_iter().zip(recalled) {
            if let Recall::Denied(wait) = recall {
                memory.answered(now.saturating_add(wait));
                let _ = a.reply.send(Err(Error::RetryIn(wait)));
            }
        }
        Ok(())
    }

    /// Answers refusals from `row`, which the store just confirmed (as it stands after this
    /// write's grants), and opens the denial window. A short `concurrent` bucket looks up
    /// its leases (reclaiming expired ones): when some were given back, the jobs to try
    /// again are returned.
    async fn answer_refusals(
        &self,
        lane: &Lane,
        row: &BucketState,
        refused: Vec<AcquireJob>,
        now: UnixMillis,
        looked_again: u32,
    ) -> Option<Vec<AcquireJob>> {
        let mut slots = Vec::new();
        let mut again = Vec::new();
        for a in refused {
            let cost = a.wanted.cost(row.bucket.cost_per_call());
            match row.take(cost, now) {
                Take::Short { wait: Some(wait) } => {
                    let wait = wait.max(MIN_RETRY_IN);
                    let mut memory = lane.memory();
                    memory.confirm_short(now, wait);
                    memory.answered(now.saturating_add(wait));
                    let _ = a.reply.send(Err(Error::RetryIn(wait)));
                }
                Take::ExceedsCapacity => {
                    let _ = a.reply.send(Err(Error::CostExceedsCapacity {
                        dimension: row.dimension.clone(),
                        cost,
                        capacity: row.bucket.capacity(),
                    }));
                }
                Take::Short { wait: None } => slots.push(a),
                // Never after this write's grants; tried again all the same.
                Take::Granted { .. } => again.push(a),
            }
        }
        if slots.is_empty() {
            return Some(again);
        }
        let known = lane.memory().slots_back(now, self.config().slot_poll);
        let back = match known {
            Some(back) => back,
            None => match self.slot_outlook(row, now, looked_again).await {
                Ok(crate::client::SlotOutlook::LookAgain) => {
                    lane.memory().forget();
                    again.extend(slots);
                    return Some(again);
                }
                Ok(crate::client::SlotOutlook::BackBy(back)) => back,
                Err(e) => {
                    let e = e.to_string();
                    answer_each(slots, |a| a.reply, || StoreError::service(&e).into());
                    return Some(again);
                }
            },
        };
        let wait = {
            let mut memory = lane.memory();
            let wait = memory.confirm_slots_short(now, back, self.config().slot_poll);
            memory.answered(now.saturating_add(wait));
            wait
        };
        answer_each(slots, |a| a.reply, || Error::RetryIn(wait));
        Some(again)
    }
}

/// Moves the requests waiting in `lane`'s queue that can ride on the bucket write into
/// this write's batch, as far as it has room; the others stay queued.
fn join_queued(lane: &Lane, acquires: &mut Vec<AcquireJob>, releases: &mut Vec<ReleaseJob>) {
    let mut queue = lock(&lane.queue);
    if queue.is_empty() {
        return;
    }
    let mut stay = Vec::with_capacity(queue.len());
    for Queued { ticket, job, _room } in queue.drain(..) {
        match job {
            Job::Acquire(a) if a.reply.is_closed() => {}
            Job::Acquire(a) if acquires.len() < MAX_BATCH => acquires.push(a),
            Job::Release(r)
                if (r.part.restores || r.part.kept != Kept::Row)
                    && releases.len() < MAX_RELEASES =>
            {
                releases.push(r);
            }
            job => stay.push(Queued { ticket, job, _room }),
        }
    }
    *queue = stay;
}

/// `after` (the row refilled to `now`) with `restored` given back, then as many of
/// `acquires` taken as it can serve, in order: the row as it then stands, the grants and the
/// refusals.
fn take_in_order(
    row: &BucketState,
    mut after: BucketState,
    restored: Tokens,
    acquires: Vec<AcquireJob>,
    now: UnixMillis,
) -> (BucketState, Vec<(AcquireJob, Tokens)>, Vec<AcquireJob>) {
    if restored > Tokens::ZERO {
        (after.tokens, after.last_refill_at) = after.restored(restored, now);
    }
    let mut granted = Vec::with_capacity(acquires.len());
    let mut refused = Vec::new();
    for a in acquires {
        let cost = a.wanted.cost(row.bucket.cost_per_call());
        match after.take(cost, now) {
            Take::Granted {
                tokens,
                last_refill_at,
            } => {
                (after.tokens, after.last_refill_at) = (tokens, last_refill_at);
                granted.push((a, cost));
            }
            _ => refused.push(a),
        }
    }
    (after, granted, refused)
}

/// A new id for a lease kept in `row`: 64 random bits, none of the row's or this write's.
fn new_held_id(row: &BucketState, adding: &[HeldWrite]) -> String {
    loop {
        let id = format!("{:016x}", rand::random::<u64>());
        if row.held_lease(&id).is_none() && !adding.iter().any(|h| h.id() == id) {
            return id;
        }
    }
}

/// The answer when the write carrying a request went away without answering it.
fn abandoned() -> Error {
    StoreError::service("the write carrying this request was abandoned").into()
}

fn jobs_of(granted: Vec<(AcquireJob, Tokens)>, refused: Vec<AcquireJob>) -> Vec<AcquireJob> {
    granted.into_iter().map(|(a, _)| a).chain(refused).collect()
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
            fresh_after: None,
            alone: true,
            reply,
        });
        (queued(job), answer)
    }

    fn release_job(
        lease: &mut Lease,
    ) -> (Queued, tokio::sync::oneshot::Receiver<Result<(), Error>>) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let part = lease.take_rows().remove(0);
        (queued(Job::Release(ReleaseJob { part, reply })), answer)
    }

    fn queued(job: Job) -> Queued {
        Queued {
            ticket: 0,
            job,
            _room: Arc::new(tokio::sync::Semaphore::new(1))
                .try_acquire_owned()
                .unwrap(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_pushed_back_by_a_full_write_takes_the_writers_turn_again() {
        let sluice = Sluice::builder()
            .store(MemoryStore::new())
            .clock(ManualClock::new(UnixMillis::from_secs(1_700_000_000)))
            .build()
            .unwrap();
        let dim = "vendor#rpm";
        sluice
            .put_bucket(
                dim,
                Bucket::requests(crate::RefillRate::per_second(1)).with_capacity(500),
            )
            .await
            .unwrap();
        let lane = sluice.lanes().lane(&Dimension::new(dim).unwrap());
        lane.tickets
            .fetch_add(1_000, std::sync::atomic::Ordering::Relaxed);
        // More acquires than one write carries are queued ahead of this caller, by callers
        // that are not taking the writer's turn themselves (they wait for their answers).
        let mut ahead = Vec::new();
        for _ in 0..MAX_BATCH + 6 {
            let (job, answer) = acquire_job(dim);
            lock(&lane.queue).push(job);
            ahead.push(answer);
        }
        // The caller writes the first batch, finds its own job back in the queue, and must
        // write again: no one else will.
        let lease = tokio::time::timeout(Duration::from_secs(60), sluice.acquire(dim))
            .await
            .expect("answered without other traffic")
            .unwrap();
        lease.release().await.unwrap();
        for mut answer in ahead {
            answer.try_recv().unwrap().unwrap().release().await.unwrap();
        }
        let row = sluice.bucket(dim).await.unwrap().unwrap();
        assert_eq!(row.tokens, Tokens::new(500 - (MAX_BATCH as i64 + 7)));
    }

    #[tokio::test]
    async fn a_lane_queue_is_bounded_and_drains() {
        let sluice = Sluice::builder()
            .store(MemoryStore::new())
            .clock(ManualClock::new(UnixMillis::from_secs(1_700_000_000)))
            .build()
            .unwrap();
        let dim = "vendor#rpm";
        sluice
            .put_bucket(
                dim,
                Bucket::requests(crate::RefillRate::per_second(1)).with_capacity(5_000),
            )
            .await
            .unwrap();
        let lane = sluice.lanes().lane(&Dimension::new(dim).unwrap());
        // A write in flight holds the writer's turn.
        let turn = lane.writer.clone().try_lock_owned().unwrap();
        let tasks: Vec<_> = (0..MAX_QUEUED + 50)
            .map(|_| {
                let sluice = sluice.clone();
                tokio::spawn(async move { sluice.acquire(dim).await })
            })
            .collect();
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            lock(&lane.queue).len(),
            MAX_QUEUED,
            "the rest wait for room"
        );
        drop(turn);
        for task in tasks {
            task.await.unwrap().unwrap().release().await.unwrap();
        }
        assert!(lock(&lane.queue).is_empty());
        let row = sluice.bucket(dim).await.unwrap().unwrap();
        assert_eq!(row.tokens, Tokens::new(5_000 - (MAX_QUEUED as i64 + 50)));
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
