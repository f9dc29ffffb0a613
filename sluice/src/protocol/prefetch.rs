//! Prefetch: a lean bucket's grant may take tokens ahead for this client, and later
//! single-dimension acquires take from them with no call (see [`Prefetch`](crate::Prefetch)
//! for the overshoot bound this accepts).

use std::time::Duration;

use crate::acquire::Wanted;
use crate::bucket::{BucketState, Take};
use crate::clock::UnixMillis;
use crate::grant::{Grant, Kept};
use crate::ids::new_unique;
use crate::shared::Core;
use crate::shared::remembered::Remembered;
use crate::tokens::Tokens;

use super::rowless_part;

/// A grant from the tokens this client prefetched for `wanted`'s lean bucket, if they are
/// fresh and enough.
pub(super) fn take(
    memory: &mut Remembered,
    wanted: &Wanted,
    now: UnixMillis,
    ttl: Duration,
) -> Option<Grant> {
    let cost = memory.take_prefetched(wanted, now)?;
    let part = rowless_part(&wanted.dimension, &new_unique(), cost, Kept::Nowhere);
    Some(Grant::new(vec![part], now, now.saturating_add(ttl), 0))
}

/// Takes the prefetch configured for `row`'s dimension from `after` (the row as a lean
/// grant's write leaves it), only from plenty: the bucket must still hold as much again
/// afterwards, above all of its reserves (so that the tokens may serve any priority).
/// The tokens taken and until when they may be used.
pub(super) fn ride(
    core: &Core,
    row: &BucketState,
    after: &mut BucketState,
    now: UnixMillis,
) -> Option<(Tokens, UnixMillis)> {
    if row.bucket.keeps_leases() || core.config.prefetch.is_empty() {
        return None;
    }
    // Configured for the dimension: a row of a spread bucket prefetches as its own row.
    let p = core.config.prefetch.get(&row.dimension.base())?;
    let Take::Granted { level } = after.take(p.tokens(), now) else {
        return None;
    };
    if level.tokens < p.tokens().saturating_add(row.bucket.reserved()) {
        return None;
    }
    after.set_level(level);
    Some((p.tokens(), now.saturating_add(p.hold())))
}
