//! The fast path for one dimension: one conditional write per grant, and none for a
//! denial already known.
//!
//! Each client keeps, per dimension, a lane ([`lanes`](crate::shared::lanes)): what it
//! remembers of the bucket row, and the requests waiting for the lane's next write. An
//! acquire goes straight to the conditional write computed from the remembered row,
//! without reading it first ([`batch`](super::batch)); requests waiting on the same lane
//! ride on one write ([`lane`](super::lane)). A denial is computed from a row the store just
//! confirmed and, for as long as that denial runs, later ones come from memory without a
//! call. Under load, calls per grant drop well below one; a single caller pays exactly one
//! write to acquire and one to release. A release does not read the bucket either: a
//! `concurrent` slot goes back through the same conditional write.

use std::sync::Arc;
use std::time::Duration;

use crate::acquire::Wanted;
use crate::clock::UnixMillis;
use crate::error::Error;
use crate::grant::{Grant, LeasePart};
use crate::shared::Core;
use crate::shared::lanes::{AcquireJob, Job, ReleaseJob};
use crate::shared::remembered::Recall;

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
        if alone && let Some(grant) = prefetch::take(&mut memory, &wanted, now, ttl) {
            return Ok(grant);
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
    on_lane(core, &lane, job, answer).await
}

/// Releases one lease part on the fast path: its end (and, for a `concurrent` bucket, the
/// slot given back) rides on the lane's next write, without reading the bucket.
pub(crate) async fn release(core: &Arc<Core>, part: LeasePart) -> Result<(), Error> {
    let lane = core.lane(&part.dimension);
    let (reply, answer) = tokio::sync::oneshot::channel();
    on_lane(
        core,
        &lane,
        Job::Release(ReleaseJob { part, reply }),
        answer,
    )
    .await
}
