//! What a lane remembers of its row, as the sharded path measures how hot it is, how it
//! learns how many rows the bucket has, and which writer acts on a measure.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use rand::RngExt as _;

use crate::acquire::Wanted;
use crate::clock::UnixMillis;
use crate::config::Sharding;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::grant::Grant;
use crate::shared::Core;
use crate::shared::heat::Measure;
use crate::shared::lanes::Lane;
use crate::tokens::Tokens;

/// What `lane` remembers of its row, as [`watch`](super::watch) measures it.
pub(super) struct Seen {
    pub(super) row: Dimension,
    pub(super) version: u64,
    pub(super) shards: u16,
    pub(super) refills: bool,
    pub(super) bound: Option<crate::bucket::ShardLimit>,
    /// The ceiling the client that spread the bucket learned, as the row carries it.
    pub(super) write_ceiling: Option<u32>,
    /// A row its refill keeps short (callers queued in its debt, or refused), as last
    /// learned or now, grants what the refill brings however many rows the bucket has: its
    /// throttles (a burst) teach no ceiling, and it is not spread (it may be gathered).
    pub(super) short: bool,
    pub(super) learned_at: UnixMillis,
    /// What the bucket refills over a thousand seconds, and what one call costs (of late,
    /// see [`CallCosts`](crate::shared::lanes::CallCosts)).
    pub(super) refill_per_ks: Tokens,
    pub(super) cost: Tokens,
}

/// Whether a refill of `refill_per_ks` tokens over a thousand seconds is at most twice what
/// a row taking `per_row` thousandths of a call a second of `cost` each takes.
pub(super) fn within_twice(refill_per_ks: Tokens, cost: Tokens, per_row: u64) -> bool {
    let twice = u32::try_from(per_row.saturating_mul(2)).unwrap_or(u32::MAX);
    refill_per_ks <= cost.checked_mul(twice).unwrap_or(Tokens::MAX)
}

/// Whether a bucket over `n` rows, each refilling `refill_per_ks` tokens over a thousand
/// seconds, of calls costing `cost`, fits in half as many rows of `ceiling` writes a
/// second when its refill keeps it short: two writes per call the refill serves (a take,
/// and an adjustment or a give-back), each row under 40% of its ceiling. A short bucket
/// grants what its refill brings however many rows it has; rows beyond what those writes
/// need only cost it: each is a smaller bucket that refuses sooner, with fills racing on
/// it, and a refusal reads every row. It is gathered like a cool one, a halving at a time
/// after as many short measures in a row.
pub(super) fn gathers_short(n: u16, refill_per_ks: Tokens, cost: Tokens, ceiling: u32) -> bool {
    let calls_per_ks = refill_per_ks
        .as_nanos()
        .saturating_mul(i128::from(n))
        .checked_div(cost.as_nanos().max(1))
        .unwrap_or(i128::MAX);
    let writes_per_ks = calls_per_ks.saturating_mul(2);
    // Each of n / 2 rows under 40% of the ceiling, in thousandths of a write a second.
    let room = i128::from(n / 2) * i128::from(ceiling) * 400;
    writes_per_ks < room
}

pub(super) fn remembered(core: &Core, lane: &Lane) -> Option<Seen> {
    let memory = lane.memory();
    memory.row().map(|r| {
        // What a call costs: the mean of the lane's acquires (a `tokens` bucket's calls cost
        // what their requests say), at least the bucket's `cost_per_call`.
        let cost = lane.costs.mean().map_or(r.bucket.cost_per_call(), |mean| {
            mean.max(r.bucket.cost_per_call())
        });
        Seen {
            row: r.dimension.clone(),
            version: r.version,
            shards: r.shards,
            refills: r.bucket.limit_type().refills(),
            bound: r.bucket.shard_limit(),
            write_ceiling: r.write_ceiling,
            short: memory.seen_short() || r.available(core.now()) < cost,
            learned_at: memory.learned_at(),
            refill_per_ks: r
                .bucket
                .refill_rate()
                .refill_over(Duration::from_secs(1_000)),
            cost,
        }
    })
}

/// Whether this client may spread the bucket of `row`, its only row as the client knows it,
/// for its throttles: the row is the bucket's first and only one (or not yet known), it
/// refills and is not short (see [`Seen::short`]), its bound allows two rows, and the
/// client spreads buckets. Its throttles are then waited out briefly, and it is read to
/// learn of a spread (see [`spread_since`]); a short one is not spread by them, and its
/// waiters back off as on any row.
pub(in crate::protocol) fn may_spread(core: &Core, lane: &Lane, row: &Dimension) -> bool {
    let lone = remembered(core, lane).is_none_or(|seen| {
        seen.shards == 1
            && seen.refills
            && !seen.short
            && seen.bound.is_none_or(|bound| bound.allows(2))
    });
    lone && row.shard_index() == 0 && core.config.sharding.automatic()
}

/// Notes how many rows the bucket of `base` has, as the row of `lane` just told; the count.
pub(super) fn learn_shards(core: &Core, base: &Dimension, lane: &Lane) -> u16 {
    let told = lane.memory().row().map(|row| row.shards);
    match told {
        Some(n) => {
            core.lanes.note_shards(base, n);
            n
        }
        None => core.lanes.shards(base),
    }
}

/// A throttle's `refused` on the only row this client knows of `wanted`'s bucket: one
/// read of that row, at most once a
/// [`THROTTLED_WINDOW`](crate::shared::heat::THROTTLED_WINDOW), learns whether the bucket
/// was spread since; when it was, the whole bucket answers at once (a client with one
/// caller would otherwise learn it only from a write the hot row takes, after a throttle's
/// wait each). A read has its own ceiling, apart from the writes'.
pub(super) async fn spread_since(
    core: &Arc<Core>,
    wanted: &Wanted,
    ttl: Duration,
    fresh_after: Option<UnixMillis>,
    refused: Error,
) -> Result<Grant, Error> {
    let base = &wanted.dimension;
    if !core.heat.look(base, core.now()) {
        return Err(refused);
    }
    let row = match core.read_one(base).await {
        Ok(Some(row)) => row,
        Ok(None) => return Err(refused),
        Err(e) => {
            tracing::debug!(dimension = %base, error = %e, "reading a throttled row failed");
            return Err(refused);
        }
    };
    let shards = row.shards;
    core.lanes.learn(row, core.now());
    if shards <= 1 {
        return Err(refused);
    }
    core.lanes.note_shards(base, shards);
    super::whole(core, wanted, ttl, fresh_after, (refused, 0)).await
}

/// The extra doublings of a writer's odds to act on a measure of a lone row throttled at
/// its ceiling (see [`Measure::drawn`](crate::shared::heat::Measure::drawn)): about four
/// writers spread it, not two. Each writer measures it at its own instant, and in a fleet
/// of 48 processes started one after another every draw of the first 0.3 s was lost, the
/// row refusing demand all the while; a spread that loses its race to another's costs one
/// cancelled transaction, since it moves the rows by what they hold.
const LONE_ODDS: u32 = 1;

/// Whether this client is the writer that acts on `measure` of a row it found hot `heated`
/// times in a row (see [`Measure::drawn`]): every writer measured the same heat, and about
/// two spread it; four a `lone` row throttled at its ceiling (see [`LONE_ODDS`]).
pub(super) fn drawn(measure: &Measure, heated: u32, lone: bool) -> bool {
    let (first, odds) = if lone {
        (1, LONE_ODDS)
    } else {
        (Sharding::HOT_WINDOWS, 0)
    };
    measure.drawn(rand::rng().random(), heated.saturating_sub(first) + odds)
}

/// The throttles of `lane`'s row since its heat was last measured whole (taken, when the
/// measure is `whole`), none for a `short` row; and those of them that teach the row's
/// ceiling: none when this client's own writes of the row failed their condition
/// meanwhile. Those lost races were billed and pressed on the ceiling, but the row's
/// version does not count them, so what it took then says less than the store let it
/// take (in the 48-process demo behind the proxy at 100 write units a second, while the
/// fleet's fills of the `rpm` row failed on others' takes, a client measured 1.9 writes
/// a second there while throttled, and set out to spread a bucket its refill binds).
/// Except on an `ample` bucket (its refill, in calls, more than twice what one row takes
/// at the ceiling told: no refill binds it), where a few (no more than applied, of the
/// client's `own` acquires of the row less those throttled; two fills of a full row at
/// once) leave the measure close to what the row took: there they are how a hot full
/// row's writes meet, and a `tpm` row so could wait seconds for a measure without one.
pub(super) fn throttles_since(
    lane: &Lane,
    short: bool,
    whole: bool,
    (own, ample): (u64, bool),
) -> (u32, u32) {
    let count = |n: &std::sync::atomic::AtomicU32| {
        if whole {
            n.swap(0, Relaxed)
        } else {
            n.load(Relaxed)
        }
    };
    let throttles = count(&lane.throttles);
    let lost = u64::from(count(&lane.lost_races));
    let applied = own.saturating_sub(u64::from(throttles));
    let few = lost == 0 || (ample && lost <= applied);
    let throttles = throttles * u32::from(!short);
    (throttles, if few { throttles } else { 0 })
}

/// Whether `base`'s bucket, now over `n` rows and `measure`d with `throttles` throttles
/// since the last one, is hot for them, and whether a spread is proven worth it at all.
///
/// A bucket's only row is hot when throttled at 40% of its ceiling (`limit`) or more. A
/// spread bucket's rows are hot, throttled twice or more (whatever their rate: the ceiling
/// they share, a partition's, is not one row's), only if the last spread raised what the
/// bucket takes together by a quarter or more, as this client measured it before and
/// after ([`Heat::gained`](crate::shared::heat::Heat::gained)), averaged over several
/// measures (not the two right after it); a client that first saw the bucket spread over
/// at most [`Sharding::FIRST_SPREAD`] rows judges against the lone row's take the rows
/// carry (`alone`), and one that first saw it over more has no proof and does not spread
/// it. Rows measured against a ceiling `learned` from throttles, which they may share (a
/// partition, the table), are spread again only on that proof, never on one row's share
/// of it.
pub(super) fn spread_bought(
    core: &Core,
    base: &Dimension,
    (n, measure): (u16, &Measure),
    (alone, learned, limit): (Option<u32>, bool, u32),
    throttles: u32,
) -> (bool, bool) {
    let per_row = measure.per_row;
    let total = per_row.saturating_mul(u64::from(n));
    let carried = alone
        .filter(|_| n <= Sharding::FIRST_SPREAD)
        .map(|alone| u64::from(alone) * 1_000);
    let bought = measure.whole && core.heat.gained(base, n, total, carried) == Some(true);
    let hot = if n == 1 {
        throttles > 0 && Sharding::throttled_hot(per_row, limit)
    } else {
        throttles >= 2 && bought
    };
    (hot, n == 1 || !learned || bought)
}
