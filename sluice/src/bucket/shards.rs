//! A bucket spread over several rows: each row (a *shard*) is a whole bucket row holding
//! its share of the capacity, the refill, the reserves and the tokens, so every write that
//! works on one row works on a shard unchanged, and one item's write ceiling no longer
//! bounds the bucket.
//!
//! Shard 0 is the dimension's own row: the seed's other SDKs, which know only that row,
//! see a bucket of its share and conserve tokens by construction. Shard `k` lives at
//! `{vendor}#{metric}#{k}`, a key no dimension can take. Every row carries the count
//! ([`BucketState::shards`]), so a writer learns of a reshard from any row it touches.
//!
//! Shares are split in whole tokens, the remainder one token each to the first shards and
//! what is below a token to shard 0; the refill rate is split exactly (rates are
//! rational). [`reshard`] computes the rows of a new count from every row of the old one,
//! refilled to the same instant: the tokens of the whole are kept, to the billionth.

use super::{Bucket, BucketState, RecentWrites, RefillCarry, ShadowLedger, first_version};
use crate::clock::UnixMillis;
use crate::dimension::{Dimension, MAX_SHARDS};
use crate::priority::Reserve;
use crate::tokens::{NANOS_PER_TOKEN, Tokens};

/// Why a bucket cannot be spread over a number of rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// A count outside 1 to [`MAX_SHARDS`].
    #[error("a bucket is spread over 1 to {max} rows, not {0}", max = MAX_SHARDS)]
    Count(u16),
    /// A share would not be a valid bucket (less than one call's cost, say).
    #[error("spread over {shards} rows, each row of `{dimension}` would be unusable: {reason}")]
    TooSmall {
        /// The bucket.
        dimension: Dimension,
        /// The count asked for.
        shards: u16,
        /// What the share breaks.
        reason: super::BucketError,
    },
    /// The refill rate cannot be split exactly.
    #[error("the refill rate of `{0}` cannot be split exactly over {1} rows")]
    Rate(Dimension, u16),
    /// A `concurrent` bucket: its slots come back to the row they were taken from.
    #[error(
        "`{0}` is a `concurrent` bucket: its slots come back to the row they were taken from, so it stays in one row"
    )]
    Concurrent(Dimension),
    /// A count the bucket's own bound on its rows does not allow.
    #[error(
        "the definition of `{dimension}` keeps it over {limit} rows (`=N`: exactly N, `<=N`: at most N), not {shards}"
    )]
    Limited {
        /// The bucket.
        dimension: Dimension,
        /// The count asked for.
        shards: u16,
        /// Its bound.
        limit: super::ShardLimit,
    },
    /// The rows read are not the shards of one bucket (a row missing, or redefined by
    /// hand).
    #[error("the rows of `{0}` are not the shards of one bucket: {1}")]
    Inconsistent(Dimension, &'static str),
}

/// Shard `k`'s part of `nanos` over `n` shards: whole tokens split evenly, the remainder
/// one each to the first shards, what is below a token to shard 0. The parts add up to
/// `nanos` exactly, debt included.
pub(crate) fn part(nanos: i128, n: u16, k: u16) -> i128 {
    let (whole, below) = (
        nanos.div_euclid(NANOS_PER_TOKEN),
        nanos.rem_euclid(NANOS_PER_TOKEN),
    );
    let n = i128::from(n.max(1));
    let mine = whole.div_euclid(n) + i128::from(i128::from(k) < whole.rem_euclid(n));
    mine * NANOS_PER_TOKEN + if k == 0 { below } else { 0 }
}

fn part_of(t: Tokens, n: u16, k: u16) -> Tokens {
    Tokens::from_nanos(part(t.as_nanos(), n, k))
}

/// Shard `k`'s share of `whole` spread over `n` rows: the capacity and every reserve
/// split by [`part`], the rate divided exactly; the cost per call, the limit type and
/// lean mode are the bucket's.
pub(crate) fn share(
    dimension: &Dimension,
    whole: &Bucket,
    n: u16,
    k: u16,
) -> Result<Bucket, ShardError> {
    let rate = whole.refill_rate.scaled(1, u32::from(n));
    let rate = Some(rate)
        .filter(|r| r.scaled(u32::from(n), 1) == whole.refill_rate)
        .ok_or_else(|| ShardError::Rate(dimension.clone(), n))?;
    let bucket = Bucket {
        capacity: part_of(whole.capacity, n, k),
        refill_rate: rate,
        reserves: whole
            .reserves
            .iter()
            .map(|r| Reserve {
                priority: r.priority.clone(),
                tokens: part_of(r.tokens, n, k),
            })
            .filter(|r| r.tokens > Tokens::ZERO)
            .collect(),
        ..whole.clone()
    };
    bucket.validate().map_err(|reason| ShardError::TooSmall {
        dimension: dimension.clone(),
        shards: n,
        reason,
    })?;
    Ok(bucket)
}

/// The whole bucket the rows of one sharded bucket (every shard, in order) hold together,
/// checked to be exactly what spreading it gives each row.
pub(crate) fn whole(rows: &[BucketState]) -> Result<Bucket, ShardError> {
    let first = rows.first().ok_or(ShardError::Count(0))?;
    let dimension = first.dimension.base();
    let n = u16::try_from(rows.len()).map_err(|_| ShardError::Count(u16::MAX))?;
    let broken = |why| ShardError::Inconsistent(dimension.clone(), why);
    if rows
        .iter()
        .enumerate()
        .any(|(k, r)| r.shards != n || r.dimension != dimension.shard(k as u16))
    {
        return Err(broken("a row is missing or counts other shards"));
    }
    let sum = |f: &dyn Fn(&Bucket) -> Tokens| {
        rows.iter()
            .fold(Tokens::ZERO, |s, r| s.saturating_add(f(&r.bucket)))
    };
    let mut reserves: Vec<Reserve> = Vec::new();
    for r in rows.iter().flat_map(|r| &r.bucket.reserves) {
        match reserves.iter_mut().find(|o| o.priority == r.priority) {
            Some(o) => o.tokens = o.tokens.saturating_add(r.tokens),
            None => reserves.push(r.clone()),
        }
    }
    let whole = Bucket {
        capacity: sum(&|b| b.capacity),
        refill_rate: first.bucket.refill_rate.scaled(u32::from(n), 1),
        reserves,
        ..first.bucket.clone()
    };
    for (k, r) in rows.iter().enumerate() {
        if share(&dimension, &whole, n, k as u16).ok().as_ref() != Some(&r.bucket) {
            return Err(broken("a row's definition is not its share"));
        }
    }
    Ok(whole)
}

/// The rows of `dimension`'s bucket spread over `to` rows at `now`, from every row it has
/// now (`rows`, shard 0 first; a bucket in one row is its one row): the tokens of the
/// whole, refilled to `now`, split by [`part`] and moved between rows only where a row
/// would hold more than its share. Rows that stay get their next version; new rows start
/// at a version no earlier row of theirs reached. No token is made or lost: what is below
/// a billionth (the rows' refill carries) is the only thing dropped.
pub(crate) fn reshard(
    rows: &[BucketState],
    to: u16,
    now: UnixMillis,
) -> Result<Vec<BucketState>, ShardError> {
    let Some(first) = rows.first() else {
        return Err(ShardError::Count(0));
    };
    let dimension = first.dimension.base();
    // A row refilled later than `now` (a fill stamped ahead, or another writer's clock
    // ahead of this one's) counts what it holds, and the new rows refill nothing until its
    // timestamp: refilled from an earlier instant they would earn again the refill such a
    // row counted or dropped, and the others' refill until then, counted now, would be
    // granted before it came.
    let latest = rows
        .iter()
        .map(|r| r.last_refill_at)
        .fold(now, UnixMillis::max);
    if !(1..=MAX_SHARDS).contains(&to) {
        return Err(ShardError::Count(to));
    }
    if first.bucket.limit_type() == super::LimitType::Concurrent {
        return Err(ShardError::Concurrent(dimension));
    }
    let whole = whole(rows)?;
    let total = rows
        .iter()
        .fold(Tokens::ZERO, |s, r| s.saturating_add(r.available(now)));
    let burst = rows.iter().any(|r| r.burst.is_some()).then(|| {
        rows.iter()
            .fold(Tokens::ZERO, |s, r| s.saturating_add(r.holds()))
    });
    let write_ceiling = rows.iter().filter_map(|r| r.write_ceiling).max();
    let mut out = Vec::with_capacity(usize::from(to));
    for k in 0..to {
        let bucket = share(&dimension, &whole, to, k)?;
        let write_id = crate::ids::new_write_id();
        let (version, recent_writes) = match rows.get(usize::from(k)) {
            Some(old) => (
                old.version.saturating_add(1),
                old.recent_after(write_id, latest),
            ),
            None => (first_version(latest), RecentWrites::default()),
        };
        out.push(BucketState {
            dimension: dimension.shard(k),
            tokens: part_of(total, to, k),
            burst: burst.map(|b| part_of(b, to, k)),
            bucket,
            last_refill_at: latest,
            refill_carry: RefillCarry::ZERO,
            herd_at: None,
            version,
            write_id: Some(write_id),
            recent_writes,
            shards: to,
            write_ceiling,
            // What shadow acquires left on the rows goes with the first row (where a shadow
            // acquire takes a spread bucket).
            shadow: if k == 0 {
                ShadowLedger {
                    owed: rows.iter().map(|r| r.shadow.owed).sum(),
                    refused: rows.iter().map(|r| r.shadow.refused).sum(),
                }
            } else {
                ShadowLedger::default()
            },
            // The count of waiting callers goes with the row of the same place.
            waiting: rows
                .get(usize::from(k))
                .map(|r| r.waiting.clone())
                .unwrap_or_default(),
        });
    }
    level_out(&mut out);
    Ok(out)
}

/// Moves what a row holds beyond its share to rows with room: the whole holds no more
/// than the shares add up to, so everything finds a place.
fn level_out(rows: &mut [BucketState]) {
    let mut spare = Tokens::ZERO;
    for r in rows.iter_mut() {
        let over = r.tokens.saturating_sub(r.holds());
        if over > Tokens::ZERO {
            r.tokens = r.holds();
            spare = spare.saturating_add(over);
        }
    }
    for r in rows.iter_mut() {
        let room = r.holds().saturating_sub(r.tokens).min(spare);
        if room > Tokens::ZERO {
            r.tokens = r.tokens.saturating_add(room);
            spare = spare.saturating_sub(room);
        }
    }
}

mod moves;
pub(crate) use moves::moves;

#[cfg(test)]
mod tests;
