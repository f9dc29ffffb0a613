//! Shadow mode's one rule of its own: it never fails a call. A shadow take is the fast
//! path's write with no floor on the level and the ledger's additions
//! ([`batch`](super::batch)); what is left here is the answer when that write cannot be
//! made. When every bucket an acquire names is in shadow (or the client is), an acquire
//! that the store could not answer, pushed back (a throttled row, or one a transaction
//! held), or that lost every race for a row, is granted without a write, counted
//! (`sluice_shadow_unrecorded_total`) and logged. So is a shadow dimension of an acquire
//! on several (see [`multi`](super::multi)), and one while the store is out under the
//! `open` failure policy (see [`open`](super::open)): a local bucket never refuses it.

use std::time::Duration;

use crate::acquire::Wanted;
use crate::error::Error;
use crate::grant::{Grant, Kept, LeasePart};
use crate::ids::new_unique;
use crate::shared::Core;

use super::rowless_part;

/// The answer to an acquire of `wanted` that ended with `result`: a grant nothing recorded
/// in place of a failure to write, when every bucket named is in shadow as this client last
/// saw it.
pub(crate) fn answer(
    core: &Core,
    wanted: &[Wanted],
    ttl: Duration,
    result: Result<Grant, Error>,
) -> Result<Grant, Error> {
    let Some(failed) = result.as_ref().err().and_then(failure) else {
        return result;
    };
    if !wanted.iter().all(|w| takes_in_shadow(core, w)) {
        return result;
    }
    if let Err(error) = &result {
        tracing::warn!(%error, "shadow mode: granted without recording it, {failed}");
    }
    Ok(unrecorded(core, wanted, ttl))
}

/// Whether `error` is a write that could not be made, which a take in shadow is granted
/// in spite of (see [`answer`]).
pub(crate) fn may_answer(error: &Error) -> bool {
    failure(error).is_some()
}

/// What `error` says of a write that could not be made, if it is one.
fn failure(error: &Error) -> Option<&'static str> {
    match error {
        Error::Contention { .. } => Some("the row stayed contended"),
        Error::Store(e) if e.cannot_answer() => Some("the store could not answer"),
        Error::RetryIn(refusal) if refusal.short.is_empty() => Some("the store pushed back"),
        _ => None,
    }
}

/// Reports a grant in shadow mode that `w`'s bucket would have refused.
pub(crate) fn would_refuse(core: &Core, w: &Wanted) {
    crate::metrics::shadow_refused(
        &core.lanes.labels,
        w.dimension.as_str(),
        w.priority.as_ref(),
    );
    tracing::info!(
        dimension = %w.dimension,
        priority = w.priority.as_ref().map_or("", |p| p.as_str()),
        "shadow mode: granted what the bucket would have refused"
    );
}

/// Whether `w` is taken in shadow (see [`Remembered::takes_in_shadow`](crate::shared::remembered::Remembered::takes_in_shadow)),
/// as this client last saw any row of its bucket (a spread bucket's take goes to any of
/// them). A bucket this client has not seen yet is taken as enforcing until it has.
pub(crate) fn takes_in_shadow(core: &Core, w: &Wanted) -> bool {
    let rows = core.lanes.shards(&w.dimension).max(1);
    w.shadow || (0..rows).any(|k| core.lane(&w.dimension.shard(k)).memory().takes_in_shadow(w))
}

/// A grant of `wanted` that nothing recorded: no lease to end, nothing to give back.
pub(crate) fn unrecorded(core: &Core, wanted: &[Wanted], ttl: Duration) -> Grant {
    let now = core.now();
    let unique = new_unique();
    let parts = wanted
        .iter()
        .map(|w| unrecorded_part(core, w, &unique))
        .collect();
    Grant::new(parts, now, now.saturating_add(ttl), 0)
}

/// The part of `w` in a grant (`unique`) that nothing recorded, counted.
pub(crate) fn unrecorded_part(core: &Core, w: &Wanted, unique: &str) -> LeasePart {
    let per_call = core
        .lane(&w.dimension)
        .memory()
        .row()
        .map_or(crate::tokens::Tokens::ZERO, |row| {
            row.bucket.cost_per_call()
        });
    crate::metrics::shadow_unrecorded(&core.lanes.labels, w.dimension.as_str());
    rowless_part(&w.dimension, unique, w.cost(per_call), Kept::Unrecorded)
}

#[cfg(test)]
mod tests;
