//! The `open` failure policy around an acquire ([`FailurePolicy::Open`]): when the store
//! cannot answer, a grant from this process's local buckets (see
//! [`shared::fallback`](crate::shared::fallback)).

use std::sync::Arc;
use std::time::Duration;

use crate::acquire::Wanted as Request;
use crate::bucket::Bucket;
use crate::clock::UnixMillis;
use crate::error::{Error, RetryIn};
use crate::grant::{Grant, Kept};
use crate::ids::new_unique;
use crate::shared::Core;
use crate::shared::fallback::{Local, Wanted};
use crate::tokens::Tokens;

use super::{Path, rowless_part};

/// Acquires `wanted` as [`super::acquire`] does, falling back to the local buckets when
/// the store cannot answer and every dimension fails open.
pub(crate) async fn acquire(
    core: &Arc<Core>,
    wanted: Vec<Request>,
    ttl: Duration,
    fresh_after: Option<UnixMillis>,
    span: &tracing::Span,
) -> Result<Grant, Error> {
    if core.fallback.skip_store(core.now())
        && let Some(local) = local(core, &wanted, ttl)
    {
        return local;
    }
    let path = Path::of(core, wanted.clone());
    let result = super::acquire(core, path, ttl, fresh_after, span).await;
    match &result {
        Err(Error::Store(e)) if e.cannot_answer() => {
            core.fallback.store_failed(core.now(), e);
            local(core, &wanted, ttl).unwrap_or(result)
        }
        // Granted, refused, or another answer: the store answers.
        _ => {
            core.fallback.store_answered();
            for w in &wanted {
                learn_whole(core, &w.dimension);
            }
            result
        }
    }
}

/// Gives the local buckets the bucket of `dimension` as this client remembers it: its one
/// row's (no copy: this runs after every acquire the store answered), or the whole that
/// every row of a spread bucket holds (nothing until it remembers them all: a row holds
/// only its share).
fn learn_whole(core: &Core, dimension: &crate::dimension::Dimension) {
    let lane = core.lane(dimension);
    let first = {
        let memory = lane.memory();
        let Some(row) = memory.row() else { return };
        if row.shards <= 1 {
            core.fallback.learn(dimension, &row.bucket);
            return;
        }
        row.clone()
    };
    let mut rows = vec![first];
    for k in 1..rows[0].shards {
        let Some(row) = core.lane(&dimension.shard(k)).memory().row().cloned() else {
            return;
        };
        rows.push(row);
    }
    if let Ok(whole) = crate::bucket::shards::whole(&rows) {
        core.fallback.learn(dimension, &whole);
    }
}

/// A grant (or an exact RetryIn) from the local buckets, or `None` when some dimension
/// cannot fail open. A dimension taken in shadow is no local bucket's: its part is granted
/// unrecorded (shadow mode never fails a call), and an acquire all in shadow is granted
/// so whatever the policy.
fn local(core: &Core, wanted: &[Request], ttl: Duration) -> Option<Result<Grant, Error>> {
    let now = core.now();
    let (shadow, enforcing): (Vec<&Request>, Vec<&Request>) = wanted
        .iter()
        .partition(|w| super::shadow::takes_in_shadow(core, w));
    if enforcing.is_empty() {
        return Some(Ok(super::shadow::unrecorded(core, wanted, ttl)));
    }
    let costs: Vec<_> = enforcing
        .iter()
        .map(|w| move |b: &Bucket| w.cost(b.cost_per_call()))
        .collect();
    let dimensions: Vec<Wanted<'_>> = enforcing
        .iter()
        .zip(&costs)
        .map(|(w, cost)| {
            let cost: &dyn Fn(&Bucket) -> Tokens = cost;
            (
                &w.dimension,
                core.config.failure_policy_of(&w.dimension),
                cost,
                w.priority.as_ref(),
            )
        })
        .collect();
    let answer = core.fallback.take(&dimensions, now);
    match answer {
        Local::Closed => None,
        Local::Short(wait, short) => {
            let wait = crate::shared::remembered::retry_in(wait);
            let refusal = short
                .iter()
                .fold(RetryIn::pressed(wait, now), |r, (d, own)| {
                    r.and(RetryIn::on(
                        d,
                        crate::shared::remembered::retry_in(*own),
                        now,
                    ))
                });
            Some(Err(Error::RetryIn(refusal)))
        }
        Local::Granted(costs) => {
            let unique = new_unique();
            let mut parts: Vec<_> = enforcing
                .iter()
                .zip(costs)
                .map(|(w, cost)| {
                    crate::metrics::fail_open_grant(&core.lanes.labels, w.dimension.as_str());
                    rowless_part(&w.dimension, &unique, cost, Kept::Local)
                })
                .collect();
            parts.extend(
                shadow
                    .iter()
                    .map(|w| super::shadow::unrecorded_part(core, w, &unique)),
            );
            Some(Ok(Grant::new(parts, now, now.saturating_add(ttl), 0)))
        }
    }
}
