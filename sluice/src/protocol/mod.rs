//! The protocols, one file per path, as plain functions over the shared
//! [`Core`](crate::shared::Core):
//!
//! | file | what |
//! |---|---|
//! | [`seed`] | the seed's protocol: read, then one atomic write of every bucket and lease row |
//! | [`shadow`] | shadow mode's answer when its write cannot be made: it never fails a call (its takes are [`batch`]'s writes) |
//! | [`sharded`] | one dimension: a row of its bucket through [`fast`], the whole bucket when that row cannot serve |
//! | [`fast`] | one dimension, one conditional write per grant, from the remembered row |
//! | [`lane`], [`batch`] | the lanes' writers: requests on one row ride on one write |
//! | [`refusals`], [`slots`] | RetryIn and capacity errors; a short `concurrent` bucket's outlook |
//! | [`multi`] | several dimensions on the fast path, without a transaction |
//! | [`prefetch`] | lean buckets' tokens taken ahead |
//! | [`release`], [`ending`] | releasing, giving back and reclaiming leases |
//! | [`adjust`] | correcting a lease's cost |
//! | [`open`] | the `open` failure policy: local grants while the store cannot answer |
//! | [`tighten`] | making a bucket stricter from the vendor's report |
//! | [`peek`] | whether a request would be granted now, from one read and no write |
//! | [`restock`] | a bucket's tokens set by hand, conditioned on the version read |
//! | [`reconcile`] | the reconciler |
//! | [`reshard`] | a bucket spread over more rows, or gathered into fewer |

pub(crate) mod adjust;
mod batch;
pub(crate) mod ending;
pub(crate) mod fast;
mod lane;
mod multi;
pub(crate) mod open;
pub(crate) mod peek;
mod prefetch;
pub(crate) mod reconcile;
mod refusals;
pub(crate) mod release;
pub(crate) mod reshard;
pub(crate) mod restock;
mod seed;
pub(crate) mod shadow;
mod sharded;
mod slots;
pub(crate) mod tighten;

use std::sync::Arc;

use std::time::Duration;

use crate::acquire::Wanted;
use crate::clock::UnixMillis;
use crate::config::Protocol;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::grant::{Grant, Kept, LeasePart};
use crate::retry::Budget;
use crate::shared::Core;
use crate::store::LeaseKey;
use crate::tokens::Tokens;

/// The path an acquire takes, chosen once from the configured protocol and the number of
/// dimensions. The caller awaits each path's own future (see [`Path::acquire`]'s callers):
/// a future holding all three would be as large as the largest and cost its copy on every
/// acquire.
pub(crate) enum Path {
    /// One dimension on the fast path.
    Fast(Wanted),
    /// Several dimensions on the fast path.
    Multi(Vec<Wanted>),
    /// Any number of dimensions on the seed's protocol.
    Seed(Vec<Wanted>),
}

impl Path {
    /// The path of `wanted` on `core`'s protocol, whatever the buckets' and the client's
    /// mode (a shadow take is a write of the same path, see [`batch`]). Only the fast path queues a waiting caller (see [`Wanted::queue`]): the seed's
    /// protocol grants now or refuses.
    pub(crate) fn of(core: &Core, wanted: Vec<Wanted>) -> Path {
        match (core.config.protocol(), <[Wanted; 1]>::try_from(wanted)) {
            (Protocol::Fast, Ok([one])) => Path::Fast(one),
            (Protocol::Fast, Err(many)) => Path::Multi(many),
            (_, Ok([one])) => Path::Seed(vec![Wanted {
                queue: Duration::ZERO,
                ..one
            }]),
            (_, Err(many)) => Path::Seed(
                many.into_iter()
                    .map(|w| Wanted {
                        queue: Duration::ZERO,
                        ..w
                    })
                    .collect(),
            ),
        }
    }
}

/// Acquires on `path`; with `fresh_after`, a denial is taken only from a row learned since
/// then (a waiting caller's retry: its wait began at that time). Each arm is its own future,
/// instrumented with `span`.
pub(crate) async fn acquire(
    core: &Arc<Core>,
    path: Path,
    ttl: Duration,
    fresh_after: Option<UnixMillis>,
    span: &tracing::Span,
) -> Result<Grant, Error> {
    use tracing::Instrument as _;
    match path {
        Path::Fast(one) => {
            sharded::acquire(core, one, ttl, fresh_after, true)
                .instrument(span.clone())
                .await
        }
        // Boxed: the single-dimension fast path's future stays small.
        Path::Multi(many) => {
            Box::pin(multi::acquire(core, many, ttl, fresh_after))
                .instrument(span.clone())
                .await
        }
        Path::Seed(all) => {
            let shadow = all.iter().any(|w| w.shadow);
            Box::pin(seed::acquire(core, &all, ttl, shadow))
                .instrument(span.clone())
                .await
        }
    }
}

/// One part of a request taken on its own, as a request on several dimensions (or a
/// gather from several rows of a spread bucket) takes each: on any row of its bucket, or
/// (`on_row`: a part of a gather) on the row it names.
pub(crate) async fn take_part(
    core: &Arc<Core>,
    wanted: Wanted,
    ttl: Duration,
    fresh_after: Option<UnixMillis>,
    on_row: bool,
) -> Result<Grant, Error> {
    if on_row {
        fast::acquire(core, wanted, ttl, fresh_after, false).await
    } else {
        sharded::acquire(core, wanted, ttl, fresh_after, false).await
    }
}

/// Counts a write lost to another writer against `budget` and backs off before the next
/// attempt; the contention error on `dimension` once the budget is spent.
pub(crate) async fn lost_race(budget: &mut Budget, dimension: &Dimension) -> Result<(), Error> {
    if !budget.lose() {
        return Err(Error::Contention {
            dimension: dimension.clone(),
            attempts: budget.lost(),
        });
    }
    let lost = budget.lost();
    budget.back_off(lost).await;
    Ok(())
}

/// A lease part with no lease row that gives nothing back, kept as `kept` says: a grant
/// from tokens taken ahead, from the local buckets, or in shadow mode without a lease.
pub(crate) fn rowless_part(
    dimension: &Dimension,
    unique: &str,
    cost: Tokens,
    kept: Kept,
) -> LeasePart {
    LeasePart {
        key: LeaseKey::new(dimension, unique),
        dimension: dimension.clone(),
        cost,
        restores: false,
        kept,
        recording: None,
        expiring_at: None,
    }
}
