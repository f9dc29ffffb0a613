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
use crate::grant::{Grant, Kept, LeasePart};
use crate::ids::new_unique;
use crate::shared::Core;
use crate::store::LeaseKey;

use super::adjust::charge;
use super::open::cannot_answer;
use super::seed;

/// An acquire of `wanted` with its buckets in shadow as they say (all of them with a
/// client in shadow).
pub(crate) async fn acquire(
    core: &Arc<Core>,
    wanted: &[Wanted],
    ttl: Duration,
) -> Result<Grant, Error> {
    let client = core.config.mode == Mode::Shadow;
    let _turn = core.turns.take(&wanted[0].dimension).await;
    let result = seed::acquire(core, wanted, ttl, client).await;
    let all_in_shadow = || client || wanted.iter().all(|w| in_shadow(core, w));
    let result = match result {
        Err(Error::Contention { .. }) if all_in_shadow() => charged(core, wanted, ttl).await,
        result => result,
    };
    match result {
        Err(Error::Store(e)) if cannot_answer(&e) && all_in_shadow() => {
            tracing::warn!(error = %e, "shadow mode: granted without recording it, the store could not answer");
            Ok(unrecorded(core, wanted, ttl))
        }
        result => result,
    }
}

/// A grant of `wanted` whose costs are charged with changes that commute with other
/// writers' (into debt if need be); whether each bucket would have refused is told from
/// its row as this client last saw it.
async fn charged(core: &Core, wanted: &[Wanted], ttl: Duration) -> Result<Grant, Error> {
    let now = core.now();
    let unique = new_unique();
    let mut parts = Vec::with_capacity(wanted.len());
    for w in wanted {
        let row = core.remembered_row(&w.dimension).await?;
        let cost = w.cost(row.bucket.cost_per_call());
        let part = LeasePart {
            key: LeaseKey::new(&w.dimension, &unique),
            dimension: w.dimension.clone(),
            cost,
            restores: row.bucket.limit_type().restores_on_release(),
            kept: Kept::Nowhere,
            recording: None,
        };
        charge(core, &part, cost).await?;
        if shadow_take(&row, cost, w.floor(&row.bucket), now).2 {
            super::seed::would_refuse(w);
        }
        parts.push(part);
    }
    tracing::debug!("shadow mode: charged a contended row with a commuting change");
    Ok(Grant::new(parts, now, now.saturating_add(ttl), 1))
}

/// Whether this client last saw `w`'s bucket in shadow.
fn in_shadow(core: &Core, w: &Wanted) -> bool {
    core.lane(&w.dimension)
        .memory()
        .row()
        .is_some_and(|row| row.bucket.mode() == Mode::Shadow)
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
            crate::metrics::shadow_unrecorded(w.dimension.as_str());
            LeasePart {
                key: LeaseKey::new(&w.dimension, &unique),
                dimension: w.dimension.clone(),
                cost: w.cost(per_call),
                restores: false,
                kept: Kept::Nowhere,
                recording: None,
            }
        })
        .collect();
    Grant::new(parts, now, now.saturating_add(ttl), 0)
}
