//! The fast path for one dimension: one conditional write per grant, and none for a
//! denial already known.
//!
//! Each client keeps, per dimension, a lane ([`lanes`](crate::shared::lanes)): what it
//! remembers of the bucket row, and the requests waiting for the lane's next write. An
//! acquire goes straight to the conditional write computed from the remembered row,
//! without reading it first ([`batch`](super::batch)); requests waiting on the same lane
//! ride on one write ([`lane`](super::lane)). A denial is computed from a row the store just
//! confirmed and, for as long as that denial runs, later ones come from memory without a
//! call. Under load, calls per grant drop well below one; a single caller pays one write
//! to the bucket to acquire (plus its lease row's), and a `concurrent` slot's release one
//! to the bucket (plus its lease row's delete). Each write to the bucket is a
//! [`BucketChange`](crate::store::BucketChange): it commutes with other processes' writes,
//! so they do not make it fail.

use std::sync::Arc;
use std::time::Duration;

use crate::acquire::Wanted;
use crate::clock::UnixMillis;
use crate::error::{Error, RetryIn};
use crate::grant::{Grant, Kept, LeasePart};
use crate::retry::Backoff;
use crate::shared::Core;
use crate::shared::lanes::{AcquireJob, Job, ReleaseJob};
use crate::shared::remembered::Recall;

use super::ending::{Ended, end_lease_row};
use super::lane::on_lane;
use super::prefetch;

/// A single-dimension acquire on the fast path; with `alone` false, one dimension of a
/// several-dimension acquire (which neither prefetches nor takes prefetched tokens:
/// prefetch is for single-dimension acquires, see [`Prefetch`](crate::Prefetch)).
pub(crate) async fn acquire(
    core: &Arc<Core>,
    wanted: Wanted,
    ttl: Duration,
    fresh_after: Option<UnixMillis>,
    alone: bool,
) -> Result<Grant, Error> {
    let lane = core.lane(&wanted.dimension);
    {
        let now = core.now();
        let mut memory = lane.memory();
        // A shadow take is never refused, and counts what an enforcing bucket would have
        // refused: it is always written (see `batch`).
        let shadow = memory.takes_in_shadow(&wanted);
        if let Some(row) = memory.row() {
            lane.costs.note(wanted.cost(row.bucket.cost_per_call()));
        }
        if !shadow {
            if alone && let Some(grant) = prefetch::take(&mut memory, &wanted, now, ttl) {
                return Ok(grant);
            }
            if let Recall::Denied(wait) = memory.recall(&wanted, now, fresh_after) {
                memory.answered(now.saturating_add(wait));
                return Err(Error::RetryIn(RetryIn::on(&wanted.dimension, wait, now)));
            }
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
    on_lane(core, &lane, job, answer).await
}

/// Releases one lease part that gives its cost back (a `concurrent` slot, or a grant given
/// back): its lease row deleted, on condition that it still exists, then, if this call
/// deleted it, its cost given back riding on its lane's next change, without reading the
/// bucket. Once the row is gone nobody else gives the cost back: a give-back that fails for
/// a passing reason is tried again with backoff while the lease is its holder's to end.
pub(crate) async fn release(
    core: &Arc<Core>,
    part: LeasePart,
    expires_at: UnixMillis,
) -> Result<(), Error> {
    let holder_until = core.config.reclaimable_at(expires_at, true);
    match part.kept {
        Kept::Row => {
            if end_lease_row(core, &part.key, Some(holder_until), None).await? == Ended::Elsewhere {
                tracing::debug!(key = %part.key, "lease already gone (released or reconciled)");
                return Ok(());
            }
        }
        Kept::Nowhere => {}
        Kept::Local | Kept::Unrecorded => return Ok(()),
    }
    if part.cost <= crate::tokens::Tokens::ZERO {
        return Ok(());
    }
    let mut part = part;
    let mut lane = core.lane(&part.dimension);
    let mut backoff = Backoff::new();
    let mut failures: u32 = 0;
    loop {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job::Release(ReleaseJob {
            part: part.clone(),
            reply,
        });
        match on_lane(core, &lane, job, answer).await {
            Err(Error::UnknownDimension { .. }) if part.dimension.shard_index() > 0 => {
                // A shard gathered away: give it back to its bucket's row that took its
                // place, if any.
                let Some(moved) = core.moved_shard(&part.dimension).await? else {
                    return Ok(());
                };
                part.dimension = moved;
                lane = core.lane(&part.dimension);
            }
            Err(Error::Store(e)) if e.is_transient() && core.now() < holder_until => {
                failures += 1;
                tracing::debug!(error = %e, failures, "giving a slot back failed; retrying");
                backoff.sleep(failures.min(8)).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, key = %part.key, "giving a slot back failed after its lease row was deleted; the reconciler heals the bucket");
                return Err(e);
            }
            Ok(()) => return Ok(()),
        }
    }
}
