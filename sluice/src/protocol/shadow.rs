//! Shadow mode's acquire: the seed's protocol, each bucket in shadow taken whatever it
//! holds ([`seed`](super::seed)), one at a time per dimension in this client. Shadow mode
//! must never fail a call. When every bucket named is in shadow:
//!
//! - a row that stays too contended for the read-then-write (other processes keep writing
//!   it) is charged with a change that commutes with theirs, as a lease's correction is:
//!   the tokens are taken all the same, and whether it would have been refused is told from
//!   the row as last read (counted in the metric and the log, not in the row);
//! - when the store cannot answer, the acquire is granted without a write, counted
//!   (`sluice_shadow_unrecorded_total`) and logged.

use std::sync::Arc;
use std::time::Duration;

use crate::acquire::Wanted;
use crate::bucket::{Mode, shadow_take};
use crate::error::Error;
use crate::grant::{Grant, Kept};
use crate::ids::new_unique;
use crate::shared::Core;

use super::adjust::charge;
use super::open::cannot_answer;
use super::{rowless_part, seed};

/// An acquire of `wanted` with its buckets in shadow as they say (all of them with a
/// client in shadow).
pub(crate) async fn acquire(
    core: &Arc<Core>,
    wanted: &[Wanted],
    ttl: Duration,
) -> Result<Grant, Error> {
    let client = core.config.mode == Mode::Shadow;
    let _turn = core.turns.take(&wanted[0].dimension).await;
    // Which buckets are in shadow, as this acquire found them (a failed write forgets the
    // rows: what was seen before stands).
    let seen: Vec<bool> = wanted.iter().map(|w| in_shadow(core, w)).collect();
    let result = seed::acquire(core, wanted, ttl, client).await;
    for (w, before) in wanted.iter().zip(&seen) {
        let now = core
            .lane(&w.dimension)
            .memory()
            .row()
            .map(|r| r.bucket.mode() == Mode::Shadow);
        core.turns.saw(&w.dimension, now.unwrap_or(*before));
    }
    let all_in_shadow = || client || wanted.iter().all(|w| in_shadow(core, w));
    match result {
        Err(Error::Contention { .. }) if all_in_shadow() => {
            match charged(core, wanted, ttl).await {
                Ok(grant) => Ok(grant),
                Err(error) => {
                    tracing::warn!(%error, "shadow mode: granted without recording it, the row stayed contended");
                    Ok(unrecorded(core, wanted, ttl))
                }
            }
        }
        Err(Error::Store(e)) if cannot_answer(&e) && all_in_shadow() => {
            tracing::warn!(error = %e, "shadow mode: granted without recording it, the store could not answer");
            Ok(unrecorded(core, wanted, ttl))
        }
        result => result,
    }
}

/// A grant of `wanted` whose costs are charged with changes that commute with other
/// writers' (into debt if need be); whether each bucket would have refused is told from
/// its row as this client last saw it. Not for `concurrent` buckets: a slot needs its
/// lease row, or the reconciler would give it back while it is held.
async fn charged(core: &Core, wanted: &[Wanted], ttl: Duration) -> Result<Grant, Error> {
    let now = core.now();
    let unique = new_unique();
    let mut rows = Vec::with_capacity(wanted.len());
    for w in wanted {
        let row = core.remembered_row(&w.dimension).await?;
        if row.bucket.limit_type().restores_on_release() {
            return Err(Error::Contention {
                dimension: w.dimension.clone(),
                attempts: 0,
            });
        }
        rows.push(row);
    }
    let mut parts = Vec::with_capacity(wanted.len());
    for (w, row) in wanted.iter().zip(rows) {
        let cost = w.cost(row.bucket.cost_per_call());
        let part = rowless_part(&w.dimension, &unique, cost, Kept::Nowhere);
        charge(core, &part, cost).await?;
        if shadow_take(&row, cost, w.floor(&row.bucket), now).2 {
            super::seed::would_refuse(core, w);
        }
        parts.push(part);
    }
    tracing::debug!("shadow mode: charged a contended row with a commuting change");
    Ok(Grant::new(parts, now, now.saturating_add(ttl), 1))
}

/// Whether this client last saw `w`'s bucket in shadow.
fn in_shadow(core: &Core, w: &Wanted) -> bool {
    super::bucket_in_shadow(core, &w.dimension)
}

/// A grant of `wanted` that nothing recorded: no lease to end, nothing to give back.
fn unrecorded(core: &Core, wanted: &[Wanted], ttl: Duration) -> Grant {
    let now = core.now();
    let unique = new_unique();
    let parts = wanted
        .iter()
        .map(|w| {
            let per_call = core
                .lane(&w.dimension)
                .memory()
                .row()
                .map_or(crate::tokens::Tokens::ZERO, |row| {
                    row.bucket.cost_per_call()
                });
            crate::metrics::shadow_unrecorded(&core.lanes.labels, w.dimension.as_str());
            rowless_part(&w.dimension, &unique, w.cost(per_call), Kept::Nowhere)
        })
        .collect();
    Grant::new(parts, now, now.saturating_add(ttl), 0)
}
