//! One lane write: what it grants and gives back, computed from the remembered row, and
//! how it is retried when the row is not what it remembered.
//!
//! The write is computed from the row this client remembers, without reading it, and sent
//! as one [`BucketChange`]: an addition to the stored tokens on conditions that make it
//! right whatever other writers did since (see [`Commute`](crate::Commute)), so that other
//! processes' grants do not make it fail. When a condition fails all the same (the bucket
//! is shorter than remembered, or another writer folded its refill or filled it), the
//! failure hands back the current row (`ALL_OLD`): the lane takes it and the write is
//! computed again and sent at once, without a read. The grants' lease rows are written
//! after the change applied (never in a transaction with the bucket row). A throttled
//! write is back-pressure: acquires hear a RetryIn, which a waiting caller waits out and
//! asks again; releases are retried with backoff. Refusals are answered only from a row the
//! store confirmed (this write's own, or one read or handed back), or from memory where
//! the freshness rules allow it ([`remembered`](crate::shared::remembered)).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::bucket::{BucketState, Herd};
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::grant::{Grant, LeasePart};
use crate::shared::Core;
use crate::shared::lanes::{
    AcquireJob, Lane, ReleaseJob, answer_all, answer_each, fail_all, join_queued,
};
use crate::store::{BucketChange, ChangeError, StoreError};

use super::ending::give_back_in_background;
use super::refusals;

mod keyed;
mod plan;
mod record;
#[cfg(test)]
mod tests;
mod throttle;

use self::plan::{Plan, jobs_of};
use self::record::{record_in_background, record_leases};

/// Condition failures with a fresh row in hand are retried (a lane write's at once for the
/// first few, then after a growing pause); this bounds them. A change fails only when the
/// bucket is shorter than remembered or another writer moved its refill timestamp, so a
/// writer loses few in a row.
pub(crate) const MAX_FRESH_RETRIES: u32 = 256;

/// Whether a write goes on with another attempt.
pub(super) enum Next {
    Again,
    Done,
}

/// A lane write in progress, across its attempts.
pub(super) struct Write<'a> {
    pub(super) core: &'a Arc<Core>,
    pub(super) lane: &'a Lane,
    pub(super) dimension: Dimension,
    pub(super) acquires: Vec<AcquireJob>,
    pub(super) releases: Vec<ReleaseJob>,
    attempts: u32,
    throttled: u32,
    pub(super) looked_again: u32,
    /// Whether the remembered row was confirmed by the store during this write.
    pub(super) fresh: bool,
    /// Races this write lost (an attempt's condition failed: the row was not as
    /// remembered). When the row handed back is barely full (its refill since its last
    /// fill no more than two calls past what it holds: callers draining it as fast as it
    /// refills), the first retry guesses it is being drained, not full: it takes rather
    /// than fills (see [`Want`](crate::bucket::Want)), which a fill by another caller of the
    /// same storm does not make fail; if the bucket is full after all, that take fails once
    /// and the next attempt fills.
    lost: u32,
    /// The refill timestamp of the row that beat the last attempt, when another writer
    /// moved it since the row that attempt was computed from, to an instant since this
    /// write began: a fill (or fold) landed first (see [`Write::instant`]).
    beaten_at: Option<UnixMillis>,
    /// Whether an attempt was computed as a take from a row filled ahead (see
    /// [`Want::behind`](crate::bucket::Want)): when it failed, the row handed back is not
    /// guessed drained.
    tried_behind: bool,
    /// The instant this write began (its first attempt's).
    began: UnixMillis,
    /// The refill timestamp of the row the attempt in flight was computed from.
    computed_from: UnixMillis,
    /// When the attempt is computed from a key's row this client never saw (see
    /// [`Write::unknown_key`]): the instant that row is full at, which the write creates
    /// if there is none.
    creates: Option<UnixMillis>,
}

/// Writes `acquires` and `releases`, all on one dimension, retrying until each is
/// answered.
pub(super) async fn write(
    core: &Arc<Core>,
    lane: &Lane,
    acquires: Vec<AcquireJob>,
    releases: Vec<ReleaseJob>,
) {
    let Some(dimension) = acquires
        .first()
        .map(|a| a.wanted.dimension.clone())
        .or_else(|| releases.first().map(|r| r.part.dimension.clone()))
    else {
        return;
    };
    let mut write = Write {
        core,
        lane,
        dimension,
        acquires,
        releases,
        attempts: 0,
        throttled: 0,
        looked_again: 0,
        fresh: false,
        lost: 0,
        beaten_at: None,
        tried_behind: false,
        began: UnixMillis::new(0),
        computed_from: UnixMillis::new(0),
        creates: None,
    };
    while let Next::Again = write.attempt().await {}
}

impl Write<'_> {
    async fn attempt(&mut self) -> Next {
        self.attempts += 1;
        if self.acquires.is_empty() && self.releases.is_empty() {
            return Next::Done;
        }
        let row = match self.row().await {
            Ok(row) if row.bucket.is_keyed() => return self.key_required(),
            Ok(row) => row,
            Err(next) => return next,
        };
        let now = self.core.now();
        let acquires = std::mem::take(&mut self.acquires);
        let (at, mut plan) = self.instant(&row, acquires, now);
        if self.attempts == 1 {
            self.began = now;
        }
        self.computed_from = row.last_refill_at;
        if plan.granted.is_empty() && self.releases.is_empty() {
            // Nothing to write: only refusals.
            return self.refuse(&row, plan.refused, now).await;
        }
        if !plan.shadow && plan.granted.iter().any(|(a, _)| a.alone) {
            plan.prefetched = super::prefetch::ride(self.core, &row, &mut plan.after, now);
        }
        let micros = if at < now {
            at.as_millis().saturating_mul(1_000)
        } else {
            self.core.now_micros()
        };
        let guess = self.lost == 1 && !self.tried_behind && barely_full(&row, at);
        let (short, others_per_ks, wrote) = {
            let memory = self.lane.memory();
            (memory.seen_short(), memory.others_per_ks(), memory.wrote())
        };
        let reading = plan::Reading {
            now: (at, micros),
            fill: !(guess || short),
            short,
            others_per_ks,
            behind: self.lost == 0 && !self.fresh, // a stale row's first try
            herd: Herd::of(self.lost == 0, wrote), // a refused one fills
        };
        let reading = self.first_use(reading);
        let Some(change) = plan::change(&row, &plan, &reading, self.core.config.fold_after) else {
            // The remembered row cannot do what it was planned to (a rounding edge): decide
            // again from the store's row.
            self.acquires = jobs_of(plan.granted, plan.refused);
            return self.look_at_row().await;
        };
        let change = self.creating(change, &row, at);
        self.tried_behind |= change.commute.needs_later_refill(&row);
        self.commit(change, plan, now).await
    }

    /// The instant the attempt's change is computed at, and its plan. Usually `now`. After
    /// a race lost to another writer's fill (or fold: the refill timestamp moved since the
    /// row the lost attempt was computed from), the instant is that fill's refill
    /// timestamp: the change is then a take on that row's level as it stands (its refill
    /// timestamp or a later one, no refill counted), which commutes with every other take
    /// and is accepted by later fills too, where a fill computed at a fresh `now` would
    /// race the next fill again (many callers draining a bucket faster than it refills,
    /// each fill taking what the refill since the last one brought). A grant taken at
    /// that instant is taken within this write's time (no earlier than it began), so
    /// within its callers' acquires. When anything
    /// would be refused at that instant, the plan is made at `now` instead, so that a
    /// RetryIn stays exact.
    fn instant(
        &mut self,
        row: &BucketState,
        acquires: Vec<AcquireJob>,
        now: UnixMillis,
    ) -> (UnixMillis, Plan) {
        // The jobs of one lane are one client's: all of them in shadow, or none.
        let shadow = acquires.first().is_some_and(|a| a.wanted.shadow);
        if let Some(at) = self.beaten_at.take().filter(|at| *at < now) {
            let plan = plan::plan(row, acquires, &self.releases, (at, shadow));
            if plan.refused.is_empty() {
                return (at, plan);
            }
            let acquires = jobs_of(plan.granted, plan.refused);
            return (
                now,
                plan::plan(row, acquires, &self.releases, (now, shadow)),
            );
        }
        (
            now,
            plan::plan(row, acquires, &self.releases, (now, shadow)),
        )
    }

    /// The row to write from: the remembered one, or read. Else what comes next: the write
    /// is over (the bucket is gone, or the read failed; every job is answered), or a
    /// throttled read is waited out.
    async fn row(&mut self) -> Result<BucketState, Next> {
        // Only a row this attempt computes from the template creates (see `unknown_key`).
        self.creates = None;
        let remembered = self.lane.memory().row_to_write().cloned();
        if let Some(row) = remembered {
            return Ok(row);
        }
        if let Some(row) = self.unknown_key().await? {
            return Ok(row);
        }
        match self.core.read_into(self.lane, &self.dimension).await {
            Ok(Some(row)) => {
                self.fresh = true;
                Ok(row)
            }
            Ok(None) => {
                // A deleted bucket grants nothing, and has nothing to give back to.
                let (core, dimension) = (self.core, &self.dimension);
                answer_each(
                    std::mem::take(&mut self.acquires),
                    |a| a.reply,
                    || core.unknown(dimension),
                );
                answer_all(std::mem::take(&mut self.releases), |r| r.reply, &Ok(()));
                Err(Next::Done)
            }
            Err(e) if e.is_back_pressure() => {
                self.count_throttle(&e);
                Err(self.throttled(&e).await)
            }
            Err(e) => {
                self.fail_store(&e);
                Err(Next::Done)
            }
        }
    }

    /// Reads the row before deciding again.
    async fn look_at_row(&mut self) -> Next {
        if self.attempts > MAX_FRESH_RETRIES {
            return self.contention();
        }
        match self.core.read_into(self.lane, &self.dimension).await {
            Ok(row) => {
                self.fresh = row.is_some();
                Next::Again
            }
            Err(e) if e.is_back_pressure() => {
                self.count_throttle(&e);
                self.throttled(&e).await
            }
            Err(e) => {
                self.fail_store(&e);
                Next::Done
            }
        }
    }

    /// Answers refusals computed from `row` with nothing to write: from memory where it
    /// may give them all, else from the store.
    async fn refuse(
        &mut self,
        row: &BucketState,
        refused: Vec<AcquireJob>,
        now: UnixMillis,
    ) -> Next {
        if self.creates.is_some() {
            return self.refused_by_template(row, refused, now).await;
        }
        if !self.fresh {
            match refusals::from_memory(self.lane, refused, now) {
                Ok(()) => return Next::Done,
                Err(unconfirmed) => {
                    // A refusal memory may not give: read the row, then decide.
                    self.acquires = unconfirmed;
                    self.lane.memory().forget();
                    return Next::Again;
                }
            }
        }
        self.refuse_confirmed(row, refused, now).await
    }

    /// Answers refusals from `row`, which the store just confirmed; when expired leases
    /// were given back meanwhile, looks again.
    pub(super) async fn refuse_confirmed(
        &mut self,
        row: &BucketState,
        refused: Vec<AcquireJob>,
        now: UnixMillis,
    ) -> Next {
        let again =
            refusals::confirmed(self.core, self.lane, row, refused, now, self.looked_again).await;
        if again.is_empty() {
            return Next::Done;
        }
        // Expired leases were given back: look again.
        self.looked_again += 1;
        self.acquires = again;
        self.fresh = false;
        Next::Again
    }

    /// Sends the attempt's change and answers from its outcome.
    async fn commit(&mut self, change: BucketChange, plan: Plan, now: UnixMillis) -> Next {
        let sent = tracing::enabled!(tracing::Level::DEBUG).then(|| change.commute.clone());
        match self.core.change(change).await {
            Ok(after) => self.written(after, plan, now).await,
            Err(ChangeError::Condition(current)) => {
                let failed = sent.zip(current.as_deref()).map(|(c, row)| {
                    let when: Vec<_> = c.when.into_iter().filter(|w| !w.holds(row)).collect();
                    format!(
                        "{when:?} of {:?} on {} at {}",
                        c.tokens, row.tokens, row.last_refill_at
                    )
                });
                tracing::debug!(dimension = %self.dimension, attempts = self.attempts, ?failed, "the row was not as remembered: computing the write again from it");
                self.lane
                    .lost_race(&self.core.lanes.labels, self.dimension.as_str());
                self.lost += 1;
                self.creates = None;
                self.beaten_at = current
                    .as_ref()
                    .map(|c| c.last_refill_at)
                    .filter(|at| *at > self.computed_from && *at >= self.began);
                match current {
                    Some(current) => {
                        self.lane.memory().learn(*current, now);
                        self.fresh = true;
                    }
                    None => {
                        self.lane.memory().forget();
                        self.fresh = false;
                    }
                }
                self.acquires = jobs_of(plan.granted, plan.refused);
                if self.attempts > MAX_FRESH_RETRIES {
                    return self.contention();
                }
                // Requests that queued meanwhile join the retry: under contention from
                // other processes, each write carries more.
                self.after_lost_race(self.lost).await;
                join_queued(self.lane, &mut self.acquires, &mut self.releases);
                Next::Again
            }
            Err(ChangeError::Store(e)) if e.is_back_pressure() => {
                if matches!(e, StoreError::Throttled { .. }) {
                    // The item's own throughput, not a transaction holding it: a sign the
                    // row is hot (see `Sharding`).
                    self.lane
                        .throttles
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                self.acquires = jobs_of(plan.granted, plan.refused);
                self.throttled(&e).await
            }
            Err(ChangeError::Store(e)) => {
                // The row may or may not have changed: read it next time.
                self.lane.memory().forget();
                self.acquires = jobs_of(plan.granted, plan.refused);
                if e.may_have_applied() {
                    // Given back or not, it is not sent again: twice could give back what
                    // was never taken. A slot it may not have given back is healed.
                    answer_all(std::mem::take(&mut self.releases), |r| r.reply, &Ok(()));
                }
                self.fail_store(&e);
                Next::Done
            }
        }
    }

    /// Answers a write that applied: the row it left, the grants (their lease rows written
    /// first), the releases, then the refusals from the row this write confirmed.
    async fn written(&mut self, written: BucketState, plan: Plan, now: UnixMillis) -> Next {
        let _ = self
            .lane
            .throttled
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n / 2));
        {
            let mut memory = self.lane.memory();
            memory.learn_written(written.clone(), now);
            if !written.bucket.keeps_leases() && plan.granted.iter().any(|(a, _)| a.alone) {
                // What is left of an older prefetch was too little for this write's
                // requests, or is stale: the new one replaces it.
                memory.set_prefetched(plan.prefetched);
            }
        }
        if !plan.granted.is_empty() {
            crate::metrics::batch(plan.granted.len());
        }
        for ((a, _), _) in plan
            .granted
            .iter()
            .zip(&plan.would_refuse)
            .filter(|(_, r)| **r)
        {
            super::shadow::would_refuse(self.core, &a.wanted);
        }
        // A shadow take never waits: it is ready however deep the row is in debt.
        let ready = if plan.shadow {
            vec![now; plan.granted.len()]
        } else {
            plan::ready(&written, &plan.granted, now)
        };
        let (records, issued) =
            plan::leases(&self.core.config, &written, &plan.granted, (now, &ready));
        let restores = written.bucket.limit_type().restores_on_release();
        let parts: Vec<(AcquireJob, LeasePart, UnixMillis)> = plan
            .granted
            .into_iter()
            .zip(issued)
            .map(|((a, cost), (key, expires_at, kept))| {
                let part = LeasePart::new(key, self.dimension.clone(), cost, restores, kept);
                (a, part, expires_at)
            })
            .collect();
        let parts = if restores {
            // A slot's row is written before the slot is handed out: without it, only its
            // holder could ever give the slot back.
            match record_leases(self.core, &records).await {
                Ok(()) => parts,
                Err(e) => self.unrecorded(parts, restores, e).await,
            }
        } else {
            let first = ready.iter().copied().min().unwrap_or(now);
            record_in_background(self.core, records, parts, (now, first))
        };
        for ((a, part, expires_at), ready) in parts.into_iter().zip(ready) {
            let grant = Grant::new(vec![part], now, expires_at, self.attempts).ready_at(ready);
            if let Err(Ok(grant)) = a.reply.send(Ok(grant)) {
                // The caller went away while the write was in flight.
                give_back_in_background(self.core, grant.parts);
            }
        }
        answer_all(std::mem::take(&mut self.releases), |r| r.reply, &Ok(()));
        // This write confirmed the row the refusals were computed from.
        self.refuse_confirmed(&written, plan.refused, now).await
    }

    /// Answers every acquire and release left: too many attempts lost.
    fn contention(&mut self) -> Next {
        let (dimension, attempts) = (self.dimension.clone(), self.attempts);
        self.fail(|| Error::Contention {
            dimension: dimension.clone(),
            attempts,
        });
        Next::Done
    }

    /// Answers every acquire and release left with the store's failure. When the store
    /// cannot answer, the requests that queued meanwhile hear so now too, rather than
    /// after another write's full deadline.
    fn fail_store(&mut self, e: &StoreError) {
        if e.is_transient() || e.answer_lost() {
            join_queued(self.lane, &mut self.acquires, &mut self.releases);
        }
        self.fail(|| Error::Store(e.clone_lossy()));
    }

    /// Answers every acquire and release left with the same failure.
    fn fail(&mut self, error: impl Fn() -> Error) {
        fail_all(
            std::mem::take(&mut self.acquires),
            std::mem::take(&mut self.releases),
            error,
        );
    }
}

/// Whether `row`'s refill by `at` reaches what it holds by less than two calls.
fn barely_full(row: &BucketState, at: UnixMillis) -> bool {
    let two = row.bucket.cost_per_call() + row.bucket.cost_per_call();
    row.refilled_to(crate::tokens::Tokens::MAX, at).tokens < row.holds() + two
}
