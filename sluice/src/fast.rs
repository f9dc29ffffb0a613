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
//! Acquires waiting on the same lane are committed together: while one write is in flight,
//! the requests behind it queue, and the next write grants as many of them as the bucket
//! allows, in one conditional write (one bucket update plus their lease rows). Under load,
//! calls per grant drop below one; a single caller pays exactly one write.

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

/// The most requests one write grants: one bucket update plus their lease rows stay within
/// DynamoDB's 100 items per transaction.
const MAX_BATCH: usize = 64;

/// Condition failures with a fresh row in hand are retried at once; this bounds them. Every
/// lost race is another writer's grant, so the row keeps moving; a writer much slower than
/// its rivals (an overloaded host) can still lose many times in a row before it wins.
const MAX_FRESH_RETRIES: u32 = 256;

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
}

/// One request waiting on a lane.
struct Pending {
    /// Which caller queued it.
    ticket: u64,
    wanted: Wanted,
    ttl: Duration,
    reply: tokio::sync::oneshot::Sender<Result<Lease, Error>>,
}

#[derive(Debug, Default)]
struct Lane {
    tickets: std::sync::atomic::AtomicU64,
    known: Mutex<Known>,
    queue: Mutex<Vec<PendingSlot>>,
    writer: Arc<tokio::sync::Mutex<()>>,
}

/// `Pending` is not `Debug` (it holds a channel); the queue only needs to be drained.
struct PendingSlot(Pending);

impl std::fmt::Debug for PendingSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("dimension", &self.0.wanted.dimension)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Sluice {
    /// A single-dimension acquire on the fast path.
    pub(crate) async fn acquire_fast(&self, wanted: Wanted, ttl: Duration) -> Result<Lease, Error> {
        let lane = self.lanes().lane(&wanted.dimension);
        if let Some(answer) = self.known_answer(&lane, &wanted) {
            return Err(answer);
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let ticket = lane
            .tickets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&lane.queue).push(PendingSlot(Pending {
            ticket,
            wanted,
            ttl,
            reply,
        }));
        let mut answer = answer;
        // Either an earlier writer takes this request along (and answers it), or this
        // caller becomes the writer: waiting for the answer and for the writer's turn at
        // once keeps callers whose request is already answered out of the writers' line.
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
        let batch: Vec<Pending> = std::mem::take(&mut *lock(&lane.queue))
            .into_iter()
            .map(|p| p.0)
            .collect();
        if batch.is_empty() {
            // An earlier writer took this request along.
            drop(writer);
        } else if batch.len() == 1 && batch[0].ticket == ticket {
            // Only this caller's own request: write inline. Cancelling it affects no one
            // else (requests arriving meanwhile wait in the queue for the next writer). The
            // answer comes through a fresh channel nobody waits on, so answering costs no
            // wake-up of this very task.
            let mut batch = batch;
            let (reply, mut inline) = tokio::sync::oneshot::channel();
            batch[0].reply = reply;
            self.commit_batch(&lane, batch).await;
            drop(writer);
            return inline.try_recv().unwrap_or_else(|_| Err(abandoned()));
        } else {
            // The write runs in its own task: a caller dropping its acquire must not cancel
            // a write whose grants other callers are waiting for.
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

    /// Grants as many of `batch` as the bucket allows with one conditional write, and
    /// answers the rest.
    async fn commit_batch(&self, lane: &Lane, mut batch: Vec<Pending>) {
        // Later requests wait for the next write.
        if batch.len() > MAX_BATCH {
            let rest = batch.split_off(MAX_BATCH);
            lock(&lane.queue).extend(rest.into_iter().map(PendingSlot));
        }
        let dimension = batch[0].wanted.dimension.clone();
        let max_retries = self.config().max_retries;
        let mut attempts: u32 = 0;
        let mut conflicts: u32 = 0;
        loop {
            attempts += 1;
            let known = lock(&lane.known).row.clone();
            let row = match known {
                Some(row) => row,
                None => match self
                    .store()
                    .read_buckets(std::slice::from_ref(&dimension))
                    .await
                {
                    Ok(mut rows) => match rows.remove(0) {
                        Some(row) => {
                            lock(&lane.known).row = Some(row.clone());
                            row
                        }
                        None => {
                            answer_all(batch, |_| Error::UnknownDimension(dimension.clone()));
                            return;
                        }
                    },
                    Err(e) => {
                        answer_all(batch, |_| Error::Store(e.clone_lossy()));
                        return;
                    }
                },
            };
            let now = self.now();
            // The row as it stands after the grants decided so far in this batch.
            let mut after = row.clone();
            (after.tokens, after.last_refill_at) = row.refilled(now);
            let mut granted: Vec<(Pending, Tokens)> = Vec::with_capacity(batch.len());
            let mut short: Vec<(Pending, Tokens)> = Vec::new();
            for p in batch {
                let cost = p.wanted.cost(row.bucket.cost_per_call());
                match after.take(cost, now) {
                    Take::Granted {
                        tokens,
                        last_refill_at,
                    } => {
                        (after.tokens, after.last_refill_at) = (tokens, last_refill_at);
                        granted.push((p, cost));
                    }
                    Take::ExceedsCapacity => {
                        let _ = p.reply.send(Err(Error::CostExceedsCapacity {
                            dimension: dimension.clone(),
                            cost,
                            capacity: row.bucket.capacity(),
                        }));
                    }
                    Take::Short { wait: Some(wait) } => {
                        let _ = p
                            .reply
                            .send(Err(Error::RetryIn(wait.max(Duration::from_millis(1)))));
                    }
                    Take::Short { wait: None } => short.push((p, cost)),
                }
            }
            if !short.is_empty() {
                // A short `concurrent` bucket: look for expired leases to give back, or
                // learn when the next live one expires.
                match self.concurrent_wait(&row, now).await {
                    Ok(Some(wait)) => {
                        lock(&lane.known).short_until = Some(now.saturating_add(wait));
                        for (p, _) in short {
                            let _ = p.reply.send(Err(Error::RetryIn(wait)));
                        }
                    }
                    Ok(None) => {
                        // Expired leases were given back: everyone looks again.
                        lock(&lane.known).row = None;
                        batch = granted.into_iter().chain(short).map(|(p, _)| p).collect();
                        continue;
                    }
                    Err(e) => {
                        let e = e.to_string();
                        for (p, _) in short {
                            let _ = p.reply.send(Err(StoreError::Service {
                                message: e.clone(),
                                source: None,
                            }
                            .into()));
                        }
                    }
                }
            }
            if granted.is_empty() {
                return;
            }
            let lean = !row.bucket.keeps_leases();
            let restores = row.bucket.limit_type().restores_on_release();
            let caller = &self.config().caller;
            let mut leases = Vec::new();
            let mut issued = Vec::with_capacity(granted.len());
            for (p, cost) in &granted {
                let key = LeaseKey::new(&dimension, &new_unique());
                let expires_at = now.saturating_add(p.ttl);
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
            let write = BucketWrite {
                dimension: dimension.clone(),
                expected_version: row.version,
                tokens: after.tokens,
                last_refill_at: after.last_refill_at,
            };
            match self
                .store()
                .commit(Commit {
                    buckets: vec![write],
                    leases,
                })
                .await
            {
                Ok(()) => {
                    after.version = row.version + 1;
                    lock(&lane.known).row = Some(after);
                    crate::metrics::batch(granted.len());
                    for ((p, cost), (key, expires_at)) in granted.into_iter().zip(issued) {
                        let lease = Lease {
                            client: self.clone(),
                            id: LeaseId::new(vec![key.clone()]),
                            parts: vec![LeasePart {
                                key,
                                dimension: dimension.clone(),
                                cost,
                                restores,
                                has_row: !lean,
                            }],
                            created_at: now,
                            expires_at,
                            attempts,
                        };
                        // A caller gone meanwhile drops its lease, which releases it.
                        let _ = p.reply.send(Ok(lease));
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
                        answer_all(pendings(granted), |_| Error::Contention {
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
                    let message = format!("store reported missing lease `{key}` while creating it");
                    answer_all(pendings(granted), |_| {
                        Error::Store(StoreError::Service {
                            message: message.clone(),
                            source: None,
                        })
                    });
                    return;
                }
                Err(CommitError::TransactionConflict) => {
                    conflicts += 1;
                    crate::metrics::contention_retry(dimension.as_str());
                    if conflicts > max_retries {
                        answer_all(pendings(granted), |_| Error::Contention {
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
                    answer_all(pendings(granted), |_| Error::Store(e.clone_lossy()));
                    return;
                }
            }
            batch = pendings(granted);
        }
    }
}

/// The answer when the write carrying a request went away without answering it.
fn abandoned() -> Error {
    StoreError::Service {
        message: "the write carrying this acquire was abandoned".to_owned(),
        source: None,
    }
    .into()
}

fn pendings(granted: Vec<(Pending, Tokens)>) -> Vec<Pending> {
    granted.into_iter().map(|(p, _)| p).collect()
}

fn answer_all(batch: Vec<Pending>, error: impl Fn(&Pending) -> Error) {
    for p in batch {
        let e = error(&p);
        let _ = p.reply.send(Err(e));
    }
}
