//! The protocols, one file per path, as plain functions over the shared
//! [`Core`](crate::shared::Core):
//!
//! | file | what |
//! |---|---|
//! | [`seed`] | the seed's protocol: read, then one atomic write of every bucket and lease row |
//! | [`shadow`] | shadow mode: the seed's protocol taking whatever the buckets hold, never failing a call |
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
mod shadow;
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
    /// Any number of dimensions, some or all of them in shadow mode: the seed's protocol,
    /// each bucket in shadow taken whatever it holds.
    Shadow(Vec<Wanted>),
}

impl Path {
    /// The path of `wanted` on `core`'s protocol (shadow mode is decided before: see
    /// [`look_before`]).
    /// Only the fast path queues a waiting caller (see [`Wanted::queue`]): the seed's
    /// protocol grants now or refuses.
    pub(crate) fn of(core: &Core, wanted: Vec<Wanted>) -> Path {
        match (core.config.protocol, <[Wanted; 1]>::try_from(wanted)) {
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

/// Whether an acquire of `wanted` is taken in shadow mode: the client is in shadow, or
/// a bucket it names is, as this client last saw its row.
pub(crate) fn in_shadow(core: &Core, wanted: &[Wanted]) -> bool {
    core.config.mode == crate::Mode::Shadow
        || wanted.iter().any(|w| bucket_in_shadow(core, &w.dimension))
}

/// What an acquire of `wanted` learns before it runs, with one look at each dimension's
/// memory: whether it is taken in shadow mode, and the rows this client never saw, read
/// first (one call for them all) so that the first acquire of a bucket in shadow is taken
/// in shadow (an enforcing write would leave the row's shadow ledger behind). The acquire
/// would read them first anyway; a row seen and forgotten since (in an outage) is not read
/// here, and callers of one process meeting a row at once read it once. A failed read is
/// the acquire's answer (an unknown dimension, a store that cannot
/// answer: the acquire would have met it reading, after as long again), except
/// back-pressure, which the acquire's own path answers with a short RetryIn.
pub(crate) async fn look_before(core: &Core, wanted: &[Wanted]) -> Result<bool, Error> {
    let client = core.config.mode == crate::Mode::Shadow;
    let mut shadow = client;
    let mut unseen = Vec::new();
    for w in wanted {
        let lane = core.lane(&w.dimension);
        let memory = lane.memory();
        match memory.row() {
            Some(row) => shadow |= row.bucket.mode() == crate::Mode::Shadow,
            None if memory.seen() => shadow |= core.turns.was_shadow(&w.dimension),
            None if !client => unseen.push(w.dimension.clone()),
            None => {}
        }
    }
    if unseen.is_empty() {
        return Ok(shadow);
    }
    // Many callers of one process meeting a dimension at once read it once: the others
    // wait for that read (they would wait for their lane's) and find the row seen.
    let _turn = core.turns.take(&unseen[0]).await;
    unseen.retain(|d| !core.lane(d).memory().seen());
    if unseen.is_empty() {
        return Ok(shadow || wanted.iter().any(|w| bucket_in_shadow(core, &w.dimension)));
    }
    match core.read_rows(&unseen).await {
        Ok(rows) => Ok(shadow || rows.iter().any(|r| r.bucket.mode() == crate::Mode::Shadow)),
        Err(Error::Store(e)) if e.is_back_pressure() => Ok(shadow),
        Err(e) => Err(e),
    }
}

/// Whether this client last saw `dimension`'s bucket in shadow: its row, or when the row
/// was forgotten, what the shadow path last noted of it.
pub(crate) fn bucket_in_shadow(core: &Core, dimension: &crate::dimension::Dimension) -> bool {
    match core.lane(dimension).memory().row() {
        Some(row) => row.bucket.mode() == crate::Mode::Shadow,
        None => core.turns.was_shadow(dimension),
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
            Box::pin(seed::acquire(core, &all, ttl, false))
                .instrument(span.clone())
                .await
        }
        Path::Shadow(all) => {
            Box::pin(shadow::acquire(core, &all, ttl))
                .instrument(span.clone())
                .await
        }
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
