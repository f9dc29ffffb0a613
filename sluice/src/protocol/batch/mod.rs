//! One lane write: what it grants, gives back and ends, computed from the remembered row,
//! and how it is retried when another writer got there first.
//!
//! The write is computed from the row this client remembers, without reading it. When
//! another writer got there first, the failed condition hands back the current row
//! (`ALL_OLD`): the lane takes it and the write is recomputed and retried at once, without
//! a read and without backoff (backoff stays for transaction conflicts). Refusals are
//! answered only from a row the store confirmed (this write's own, or one read or handed
//! back), or from memory where the freshness rules allow it
//! ([`remembered`](crate::shared::remembered)).

use std::sync::Arc;

use crate::bucket::{BucketState, HeldLease};
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::grant::{Grant, Kept, LeasePart};
use crate::retry::Budget;
use crate::shared::Core;
use crate::shared::lanes::{
    AcquireJob, Lane, ReleaseJob, answer_all, answer_each, fail_all, join_queued,
};
use crate::store::{BucketWrite, Commit, CommitError, ConditionFailure, LeaseKey, StoreError};

use super::ending::give_back_in_background;
use super::refusals;

mod plan;

use self::plan::{Plan, Writes, jobs_of};

/// Condition failures with a fresh row in hand are retried at once; this bounds them. Every
/// lost race is another writer's grant, so the row keeps moving; a writer much slower than
/// its rivals (an overloaded host) can still lose many times in a row before it wins.
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
    conflicts: Budget,
    pub(super) looked_again: u32,
    /// Whether the remembered row was confirmed by the store during this write.
    pub(super) fresh: bool,
    /// Whether the last attempt lost a race to another writer.
    lost: bool,
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
        conflicts: Budget::new(core.config.max_retries),
        looked_again: 0,
        fresh: false,
        lost: false,
    };
    while let Next::Again = write.attempt().await {}
}

impl Write<'_> {
    async fn attempt(&mut self) -> Next {
        self.attempts += 1;
        // The row is needed to grant, or to give slots back; releases that give nothing
        // back are not.
        if self.acquires.is_empty() && !self.releases.iter().any(|r| r.part.restores) {
            let releases = std::mem::take(&mut self.releases);
            self.forget_released(releases).await;
            return Next::Done;
        }
        let Some(row) = self.row().await else {
            return Next::Done;
        };
        let now = self.core.now();
        let acquires = std::mem::take(&mut self.acquires);
        let mut plan = plan::plan(&row, acquires, &self.releases, now, &self.core.config);
        if plan.granted.is_empty()
            && plan.reclaimed.is_empty()
            && !self.releases.is_empty()
            && self.releases.iter().all(|r| !r.part.restores)
        {
            // Only releases that give nothing back: no new version for them.
            let releases = std::mem::take(&mut self.releases);
            self.forget_released(releases).await;
        }
        if plan.granted.is_empty() && self.releases.is_empty() && plan.reclaimed.is_empty() {
            // Nothing to write: only refusals.
            return self.refuse(&row, plan.refused, now).await;
        }
        if plan.granted.iter().any(|(a, _)| a.alone) {
            plan.prefetched = super::prefetch::ride(self.core, &row, &mut plan.after, now);
        }
        if self.must_look_at_row(&row, &plan) {
            return self.look_at_row(plan).await;
        }
        let writes = plan::writes(&self.core.config, &row, &self.releases, &plan, now);
        let writes = self.ride_without_bucket(writes).await;
        self.commit(row, plan, writes, now).await
    }

    /// The row to write from: the remembered one, or read. `None`: the write is over (the
    /// bucket is gone, or the read failed; every job is answered).
    async fn row(&mut self) -> Option<BucketState> {
        let remembered = self.lane.memory().row().cloned();
        if let Some(row) = remembered {
            return Some(row);
        }
        match self.core.read_into(self.lane, &self.dimension).await {
            Ok(Some(row)) => {
                self.fresh = true;
                Some(row)
            }
            Ok(None) => {
                // A deleted bucket grants nothing and has nothing to give back to; its
                // lease rows are deleted all the same.
                let (core, dimension) = (self.core, &self.dimension);
                answer_each(
                    std::mem::take(&mut self.acquires),
                    |a| a.reply,
                    || core.unknown(dimension),
                );
                self.delete_released().await;
                None
            }
            Err(e) => {
                self.fail_store(&e);
                None
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
    async fn refuse_confirmed(
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
        self.releases = Vec::new();
        self.fresh = false;
        Next::Again
    }

    /// Whether grants that would overflow the leases the row keeps should first look at
    /// the row: it may keep fewer than remembered (releases elsewhere remove leases without
    /// a new version, so memory only ever counts too many).
    fn must_look_at_row(&self, row: &BucketState, plan: &Plan) -> bool {
        let room = self.core.config.leases_per_row;
        row.bucket.keeps_leases()
            && !self.fresh
            && room > 0
            && plan::kept_in_row(row, &self.releases, plan) + plan.granted.len() > room
    }

    /// Reads the row before deciding again.
    async fn look_at_row(&mut self, plan: Plan) -> Next {
        let jobs = jobs_of(plan.granted, plan.refused);
        match self.core.read_into(self.lane, &self.dimension).await {
            Ok(row) => {
                self.fresh = row.is_some();
                self.acquires = jobs;
                Next::Again
            }
            Err(e) => {
                self.acquires = jobs;
                self.fail_store(&e);
                Next::Done
            }
        }
    }

    /// With no bucket write to ride on, the kept leases that give nothing back are
    /// removed on their own.
    async fn ride_without_bucket(&mut self, mut writes: Writes) -> Writes {
        if !writes.bucket {
            writes.held.clear();
            let (forgets, rest): (Vec<ReleaseJob>, Vec<ReleaseJob>) =
                std::mem::take(&mut self.releases)
                    .into_iter()
                    .partition(|r| r.part.kept == Kept::InBucket && !r.part.restores);
            self.releases = rest;
            self.forget_released(forgets).await;
        }
        writes
    }

    /// Commits the attempt and answers from its outcome.
    async fn commit(
        &mut self,
        row: BucketState,
        plan: Plan,
        writes: Writes,
        now: UnixMillis,
    ) -> Next {
        let write = BucketWrite::new(row, plan.after.level()).with_held(writes.held);
        let written = write.after();
        let commit = Commit {
            buckets: if writes.bucket {
                vec![write]
            } else {
                Vec::new()
            },
            leases: writes.leases,
        };
        match self.core.commit(commit).await {
            Ok(()) if !writes.bucket => {
                answer_all(std::mem::take(&mut self.releases), |r| r.reply, &Ok(()));
                if plan.refused.is_empty() {
                    return Next::Done;
                }
                // The bucket row was not written, so not confirmed: decide again.
                self.acquires = plan.refused;
                Next::Again
            }
            Ok(()) => self.written(written, plan, writes.issued, now).await,
            Err(failure) => {
                if matches!(&failure, CommitError::Store(e) if e.unsure()) {
                    self.give_back_unsure(&plan, &writes.issued);
                }
                let lost_from = plan.reclaimed;
                self.acquires = jobs_of(plan.granted, plan.refused);
                let next = self.failed(failure, &lost_from, now).await;
                if let Next::Again = next
                    && std::mem::take(&mut self.lost)
                {
                    // Requests that queued while this write lost a race join its retry:
                    // under contention from other processes, each write carries more.
                    join_queued(self.lane, &mut self.acquires, &mut self.releases);
                }
                next
            }
        }
    }

    /// Answers a committed write: the grants, the releases, then the refusals from the
    /// row this write confirmed.
    async fn written(
        &mut self,
        written: BucketState,
        plan: Plan,
        issued: Vec<(LeaseKey, UnixMillis, Kept)>,
        now: UnixMillis,
    ) -> Next {
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
        let restores = written.bucket.limit_type().restores_on_release();
        for ((a, cost), (key, expires_at, kept)) in plan.granted.into_iter().zip(issued) {
            let part = LeasePart {
                key,
                dimension: self.dimension.clone(),
                cost,
                restores,
                kept,
            };
            let grant = Grant::new(vec![part], now, expires_at, self.attempts);
            if let Err(Ok(grant)) = a.reply.send(Ok(grant)) {
                // The caller went away while the write was in flight.
                give_back_in_background(self.core, grant.parts);
            }
        }
        answer_all(std::mem::take(&mut self.releases), |r| r.reply, &Ok(()));
        // This write confirmed the row the refusals were computed from.
        self.refuse_confirmed(&written, plan.refused, now).await
    }

    /// Handles a commit that did not apply; the acquires are back in `self.acquires`.
    async fn failed(
        &mut self,
        failure: CommitError,
        reclaimed: &[HeldLease],
        now: UnixMillis,
    ) -> Next {
        let dimension = self.dimension.clone();
        match failure {
            CommitError::Condition(ConditionFailure::BucketChanged { current, .. }) => {
                tracing::debug!(%dimension, attempts = self.attempts, "lost the race: retrying from the current row");
                crate::metrics::contention_retry(dimension.as_str());
                self.lost = true;
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
                if self.attempts > MAX_FRESH_RETRIES + self.core.config.max_retries {
                    let attempts = self.attempts;
                    self.fail(|| Error::Contention {
                        dimension: dimension.clone(),
                        attempts,
                    });
                    return Next::Done;
                }
            }
            CommitError::Condition(ConditionFailure::LeaseExists(key)) => {
                tracing::debug!(%key, "lease key already taken; drawing new ones");
            }
            CommitError::Condition(ConditionFailure::LeaseMissing(key)) => {
                return self.lease_missing(key, reclaimed);
            }
            CommitError::TransactionConflict => {
                crate::metrics::contention_retry(dimension.as_str());
                if !self.conflicts.lose() {
                    let attempts = self.attempts;
                    self.fail(|| Error::Contention {
                        dimension: dimension.clone(),
                        attempts,
                    });
                    return Next::Done;
                }
                let lost = self.conflicts.lost();
                self.conflicts.back_off(lost).await;
            }
            CommitError::Store(e) => {
                // The row may or may not have changed: read it next time.
                self.lane.memory().forget();
                self.fail_store(&e);
                return Next::Done;
            }
        }
        Next::Again
    }

    /// The grants of a write that may have applied although its caller hears it failed:
    /// those with leases are given back in the background (each exactly once, and not at
    /// all if the write did not apply: its leases are not there). Lean grants cannot be:
    /// their tokens may be lost, never granted twice.
    fn give_back_unsure(&self, plan: &Plan, issued: &[(LeaseKey, UnixMillis, Kept)]) {
        let restores = plan.after.bucket.limit_type().restores_on_release();
        let parts: Vec<LeasePart> = plan
            .granted
            .iter()
            .zip(issued)
            .filter(|(_, (_, _, kept))| !matches!(kept, Kept::Nowhere | Kept::Local))
            .map(|((_, cost), (key, _, kept))| LeasePart {
                key: key.clone(),
                dimension: self.dimension.clone(),
                cost: *cost,
                restores,
                kept: *kept,
            })
            .collect();
        if !parts.is_empty() {
            give_back_in_background(self.core, parts);
        }
    }

    /// A lease this write ends was gone.
    fn lease_missing(&mut self, key: LeaseKey, reclaimed: &[HeldLease]) -> Next {
        if let Some(i) = self.releases.iter().position(|r| r.part.key == key) {
            // Released or reconciled elsewhere: its slot is back already.
            tracing::debug!(%key, "lease already gone (released or reconciled)");
            let _ = self.releases.swap_remove(i).reply.send(Ok(()));
        } else if reclaimed.iter().any(|h| h.id == key.unique()) {
            // Another client reclaimed it first: read the row again.
            self.lane.memory().forget();
            self.fresh = false;
        } else {
            let failure = ConditionFailure::LeaseMissing(key);
            self.fail(|| StoreError::impossible(&failure).into());
            return Next::Done;
        }
        Next::Again
    }

    /// Answers every acquire and release left with the store's failure. When the store
    /// cannot answer, the requests that queued meanwhile hear so now too, rather than
    /// after another write's full deadline.
    fn fail_store(&mut self, e: &StoreError) {
        if e.is_transient() || e.may_have_applied() {
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

    /// Deletes the lease rows of releases whose bucket is gone (the leases it kept went
    /// with it), and answers them.
    async fn delete_released(&mut self) {
        let releases = std::mem::take(&mut self.releases);
        if releases.is_empty() {
            return;
        }
        let keys: Vec<LeaseKey> = releases
            .iter()
            .filter(|r| r.part.kept == Kept::Row)
            .map(|r| r.part.key.clone())
            .collect();
        let deleted = self.core.store.delete_leases(&keys).await;
        answer_all(releases, |r| r.reply, &deleted);
    }

    /// Removes the leases of releases that give nothing back from the row that keeps them,
    /// with no condition and no new version (see
    /// [`Store::forget_held`](crate::store::Store::forget_held)), and answers them.
    async fn forget_released(&self, releases: Vec<ReleaseJob>) {
        if releases.is_empty() {
            return;
        }
        let ids: Vec<String> = releases
            .iter()
            .map(|r| r.part.key.unique().to_owned())
            .collect();
        let forgotten = self.core.store.forget_held(&self.dimension, &ids).await;
        if forgotten.is_ok() {
            self.lane.memory().drop_held(&ids);
        }
        answer_all(releases, |r| r.reply, &forgotten);
    }
}
