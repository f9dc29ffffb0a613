//! One dimension whose bucket may be spread over several rows
//! ([`shards`](crate::bucket::shards)).
//!
//! A bucket in one row takes the fast path as it always did. A sharded one sends each
//! acquire to one shard picked at random, on the fast path, so the writes of many
//! processes spread evenly over its rows. When that shard cannot serve it, the whole
//! bucket answers, from one read of every row: another shard that can serve it alone
//! takes it (one write); when only several together can, each gives its part by its own
//! lane write, all or nothing as the dimensions of one request are (see
//! [`multi::gather`]; one lease part per shard); when the whole is short, the RetryIn is
//! the whole bucket's: the first millisecond at which the shards together hold the cost.
//! So there is no per-request cap below the bucket's capacity, and a refusal means the
//! bucket as a whole is short.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use rand::RngExt as _;

use crate::acquire::Wanted;
use crate::bucket::{BucketState, Mode, ShardError};
use crate::clock::UnixMillis;
use crate::config::Sharding;
use crate::dimension::Dimension;
use crate::error::{Error, RetryIn};
use crate::grant::Grant;
use crate::shared::Core;
use crate::shared::lanes::Lane;
use crate::shared::remembered::Recall;
use crate::tokens::Tokens;

use super::{fast, multi, reshard};
pub(super) use seen::may_spread;
use seen::{
    Seen, drawn, gathers_short, learn_shards, remembered, spread_bought, spread_since,
    throttles_since, within_twice,
};

/// How many times the whole bucket is read again when its rows moved on between the read
/// and the write that relied on it.
const WHOLE_ATTEMPTS: u32 = 4;

/// A single-dimension acquire (see [`fast::acquire`] for `fresh_after` and `alone`),
/// spread over the bucket's shards when it has several.
pub(crate) async fn acquire(
    core: &Arc<Core>,
    wanted: Wanted,
    ttl: Duration,
    fresh_after: Option<UnixMillis>,
    alone: bool,
) -> Result<Grant, Error> {
    let base = wanted.dimension.clone();
    let shards = core.lanes.shards(&base);
    // The row's key is made, and its lane found, once per acquire.
    let (k, row, lane) = pick::row(core, &base, shards, None);
    let on_shard = Wanted {
        dimension: row,
        ..wanted.clone()
    };
    let throttles = || lane.throttles.load(Relaxed);
    let pushes = || lane.pushed_back.load(Relaxed);
    let (before, pushes_before) = (throttles(), pushes());
    let answer = fast::acquire(core, on_shard, ttl, fresh_after, alone).await;
    let (throttled, pushed) = (throttles() > before, pushes() > pushes_before);
    let known = learn_shards(core, &base, &lane);
    // A bucket in shadow is not spread automatically: its count of what an enforcing
    // bucket would refuse is a row's, exact only while the bucket is one row.
    let shadow = lane.memory().takes_in_shadow(&wanted);
    if core.config.sharding.automatic() && !shadow {
        watch(core, &base, &lane, known);
    }
    match answer {
        // The row pushed back, not short: another row takes it, with no read of them all
        // (which would press on rows already pressed).
        Err(Error::RetryIn(_)) if known > 1 && pushed => {
            let (other, row, _) = pick::row(core, &base, known, Some(k));
            let on_other = Wanted {
                dimension: row,
                ..wanted.clone()
            };
            match fast::acquire(core, on_other, ttl, fresh_after, alone).await {
                // Gathered into fewer rows since: ask the bucket.
                Err(gone @ Error::UnknownDimension { .. }) => {
                    whole(core, &wanted, ttl, fresh_after, (gone, other)).await
                }
                answer => answer,
            }
        }
        Err(
            refused @ (Error::RetryIn(_)
            | Error::CostExceedsCapacity { .. }
            | Error::CostExceedsShare { .. }),
        ) if known > 1 => whole(core, &wanted, ttl, fresh_after, (refused, k)).await,
        // A shard gathered into fewer rows since this client last heard: ask the bucket.
        Err(refused @ Error::UnknownDimension { .. }) if k > 0 => {
            whole(core, &wanted, ttl, fresh_after, (refused, k)).await
        }
        // The bucket's only row as this client knows it, throttled: other clients may
        // have spread it since, and a throttle's answer does not say.
        Err(refused @ Error::RetryIn(_))
            if known == 1 && throttled && may_spread(core, &lane, &base) =>
        {
            spread_since(core, &wanted, ttl, fresh_after, refused).await
        }
        answer => answer,
    }
}

/// Measures how hot the row of `lane` (of `base`'s bucket, over `n` rows) is, from the
/// version the row has now as this client knows it, and reshards the bucket when the
/// measure says so (see [`Sharding`](crate::Sharding)), in a task of its own (see
/// [`reshard::in_background`]). One that fails is logged, and a later measure tries again
/// (a gather, much later).
fn watch(core: &Arc<Core>, base: &Dimension, lane: &Lane, n: u16) {
    let Some((to, per_row, throttled)) = decide(core, base, lane, n) else {
        return;
    };
    if !core.heat.claim(base, core.now()) {
        return;
    }
    tracing::info!(dimension = %base, from = n, to, writes_per_ks = per_row, throttled, "resharding a bucket");
    reshard::in_background(core, base, n, to);
}

/// What [`watch`] decides for the row of `lane`, on a fresh measure: the rows the bucket
/// should have, with the measure (writes a second, in thousandths) and whether the store
/// throttled the row since the last one; `None` to leave it.
fn decide(core: &Core, base: &Dimension, lane: &Lane, n: u16) -> Option<(u16, u64, bool)> {
    // The row as last learned, and when: an answer that did not come from this row (a
    // throttle waited out, a refusal from memory, a grant from another row) leaves it as
    // it was, and measures nothing.
    let Seen {
        row,
        version,
        shards,
        refills,
        bound,
        write_ceiling,
        short,
        learned_at,
        refill_per_ks,
        cost,
    } = remembered(core, lane)?;
    let sharding = &core.config.sharding;
    let told = sharding
        .item_write_ceiling
        .or_else(|| core.store.item_write_ceiling());
    if !refills {
        return None;
    }
    // Decided on a fresh measure only; the throttles since the last whole one count with
    // it, and two or more on a lone row not short have it measured within its window.
    let so_far = lane.throttles.load(Relaxed) * u32::from(!short);
    let seen_as = (shards, so_far >= 2);
    let measure = core.heat.observe(&row, version, seen_as, learned_at)?;
    let per_row = measure.per_row;
    let ample = told.is_some_and(|c| !within_twice(refill_per_ks, cost, u64::from(c) * 1_000));
    let (throttles, teaching) = throttles_since(lane, short, measure.whole, (measure.own, ample));
    let throttled = throttles > 0;
    // The ceiling told (configured, or the store's own), or the lower one the store's
    // throttles showed (see `Heat::ceiling`).
    let (limit, learned) = core
        .heat
        .ceiling(base, told, write_ceiling, (per_row, teaching))?;
    // A bucket its refill keeps short is gathered like a cool one (see `gathers_short`).
    let gather_short = short && n > 1 && gathers_short(n, refill_per_ks, cost, limit);
    let cool_now = Sharding::cool(per_row, limit) || gather_short;
    let cool = core.heat.cool(base, n, cool_now);
    let judged = (write_ceiling, learned, limit);
    let (hot, proven) = spread_bought(core, base, (n, &measure), judged, throttles);
    let target = (gather_short && cool >= Sharding::COOL_WINDOWS)
        .then(|| (n / 2).max(1))
        .or_else(|| sharding.target(n, per_row, limit, hot, cool));
    // Within the bucket's own bound on its rows; a count outside it (the bound set since)
    // is moved into it.
    let target = match bound {
        Some(bound) if !bound.allows(n) => Some(bound.clamp(n)),
        Some(bound) => target.map(|to| bound.clamp(to)).filter(|to| *to != n),
        None => target,
    };
    // A spread needs two hot measures in a row, or one of a bucket's only row at its
    // ceiling that the store throttled: one measure of one row over a second is noisy
    // where a row takes few writes (a spread costs every client a failed write per row),
    // and over several rows picked at random one row takes a burst now and then, while a
    // lone row at its ceiling and throttled refuses demand every second it stays so.
    // A learned ceiling does not spread a bucket whose refill, in calls, is within twice
    // that ceiling (or what its row already takes): more rows would raise its grants by
    // little, and its throttles are the excess of a burst (a fleet starting on a bucket
    // it soon empties, lost races billed but not counted in the version, which is also
    // why a learned ceiling is low).
    let takes = per_row.max(u64::from(limit) * 1_000);
    let refill_bound = learned && within_twice(refill_per_ks, cost, takes);
    // Nor does it spread a row the store did not throttle: what one client's measures
    // taught (a window that straddled a spread, the writes of clients not yet told of it)
    // says too little of a row's ceiling to spread a row below it.
    let founded = !learned || throttled;
    let spreads = target.is_some_and(|to| to > n);
    let heated = core.heat.hot(base, n, spreads && founded);
    let at_ceiling = Sharding::at_ceiling(per_row, limit);
    let lone = hot && n == 1 && at_ceiling;
    let sure = lone || heated >= Sharding::HOT_WINDOWS;
    let drawn = drawn(&measure, heated, lone);
    let spread = founded && proven && sure && !short && !refill_bound && drawn;
    let to = target.filter(|_| !spreads || spread)?;
    Some((to, per_row, throttled))
}

/// The acquire answered by the whole bucket: from what this client remembers of every
/// row when each of them refuses it from memory and together they are short too (no
/// call), else from one read of all its rows. When every attempt lost its race, or the
/// read was throttled, the refusal of the shard tried (`refused`, and the shard) stands.
async fn whole(
    core: &Arc<Core>,
    wanted: &Wanted,
    ttl: Duration,
    fresh_after: Option<UnixMillis>,
    (refused, tried): (Error, u16),
) -> Result<Grant, Error> {
    if let Some(refusal) = remembered_refusal(core, wanted, fresh_after) {
        return Err(refusal);
    }
    let base = wanted.dimension.clone();
    let mut last = None;
    for _ in 0..WHOLE_ATTEMPTS {
        let rows = match reshard::rows_of(core, &base).await {
            Ok(rows) => rows,
            Err(Error::Store(e)) if e.is_back_pressure() => {
                return Err(back_pressure(refused, core.now()));
            }
            // Rows read across a reshard that landed between the reads: read again.
            Err(Error::Shards(ShardError::Inconsistent(..))) => continue,
            // A key's rows gone since this client saw it spread (gathered, then removed
            // when idle): the key is one row again, which its next write creates.
            Err(Error::UnknownDimension { .. }) if base.key().is_some() => {
                core.lanes.note_shards(&base, 1);
                return fast::acquire(core, wanted.clone(), ttl, fresh_after, false).await;
            }
            Err(e) => return Err(e),
        };
        let now = core.now();
        core.lanes.learn_rows(&base, &rows, now);
        let shadow = wanted.shadow || rows.iter().any(|r| r.bucket.mode() == Mode::Shadow);
        let cost = match within_bucket(&rows, wanted) {
            Err(Error::Shards(ShardError::Inconsistent(..))) => continue,
            Err(_) if shadow => wanted.cost(rows[0].bucket.cost_per_call()),
            cost => cost?,
        };
        let free = free_at(&rows, wanted, now);
        let on = |k: usize, cost: Tokens| Wanted {
            dimension: rows[k].dimension.clone(),
            explicit: cost,
            default_calls: 0,
            priority: wanted.priority.clone(),
            // The whole bucket's answer is a grant or a refusal; a reservation waits its
            // turn on one row.
            queue: Duration::ZERO,
            shadow: wanted.shadow,
        };
        let answer = if shadow {
            // A shadow take is never refused: the fullest row takes it whole.
            let fullest = (0..free.len()).max_by_key(|&k| free[k]).unwrap_or(0);
            fast::acquire(core, on(fullest, cost), ttl, None, false).await
        } else if let Some(k) = serving(&free, cost, tried) {
            fast::acquire(core, on(k, cost), ttl, None, false).await
        } else if total(&free) >= cost {
            Box::pin(multi::gather(core, gathered(&free, cost, on), ttl)).await
        } else {
            return Err(short(core, &rows, wanted, cost, now));
        };
        match answer {
            // A row the store throttled or a transaction held: back-pressure, at once (a
            // read of every row again would press on rows already pressed).
            Err(Error::RetryIn(r)) if r.short.is_empty() => {
                return Err(back_pressure(refused, core.now()));
            }
            Err(refusal @ Error::RetryIn(_)) => last = Some(refusal),
            // A reshard landed since the read (a row gone, or its share of the bucket
            // smaller than the part asked of it): read again.
            Err(
                Error::UnknownDimension { .. }
                | Error::CostExceedsCapacity { .. }
                | Error::CostExceedsShare { .. },
            ) => {}
            Err(Error::Store(e)) if e.is_back_pressure() => {
                return Err(back_pressure(refused, core.now()));
            }
            answer => return answer,
        }
    }
    Err(last.unwrap_or_else(|| back_pressure(refused, core.now())))
}

/// What a shard's refusal becomes when the whole bucket could not be read for
/// back-pressure: its RetryIn, or (a cost beyond the shard, which the whole might serve)
/// a short wait to ask again.
fn back_pressure(refused: Error, now: UnixMillis) -> Error {
    match refused {
        refusal @ Error::RetryIn(_) => refusal,
        _ => Error::RetryIn(RetryIn::pressed(Duration::from_millis(100), now)),
    }
}

/// `wanted`'s cost, checked against the whole bucket `rows` hold: its capacity, and the
/// share its priority may take.
pub(super) fn within_bucket(rows: &[BucketState], wanted: &Wanted) -> Result<Tokens, Error> {
    let base = wanted.dimension.clone();
    let whole = match rows {
        [one] => one.bucket.clone(),
        _ => crate::bucket::shards::whole(rows)?,
    };
    let cost = wanted.cost(whole.cost_per_call());
    let (capacity, share) = (whole.capacity(), whole.share_for(wanted.priority.as_ref()));
    if cost <= share {
        return Ok(cost);
    }
    Err(match &wanted.priority {
        Some(priority) if cost <= capacity => Error::CostExceedsShare {
            dimension: base,
            cost,
            priority: priority.clone(),
            share,
        },
        _ => Error::CostExceedsCapacity {
            dimension: base,
            cost,
            capacity,
        },
    })
}

/// The whole bucket's RetryIn from `rows`, just read: each row's lane opens the denial
/// window its own shortness allows (rule 2 of [`remembered`](crate::remembered)), and
/// notes the RetryIn answered, so that the refusals until then come from memory.
fn short(
    core: &Core,
    rows: &[BucketState],
    wanted: &Wanted,
    cost: Tokens,
    now: UnixMillis,
) -> Error {
    let wait = wait_for(rows, wanted, cost, now);
    for row in rows {
        let floor = wanted.floor(&row.bucket);
        let lane = core.lane(&row.dimension);
        let mut memory = lane.memory();
        if let crate::bucket::Take::Short { wait: Some(own) } = row.take_above(cost, floor, now) {
            memory.confirm_short(now, own, floor);
        }
        memory.answered(now.saturating_add(wait));
    }
    Error::RetryIn(RetryIn::on(&wanted.dimension, wait, now))
}

/// The whole bucket's refusal from memory alone: every row this client remembers refuses
/// `wanted` under the freshness rules ([`remembered`](crate::remembered)), and together
/// they hold less than it too. `None` when any row may serve it or is not known.
fn remembered_refusal(
    core: &Core,
    wanted: &Wanted,
    fresh_after: Option<UnixMillis>,
) -> Option<Error> {
    let now = core.now();
    let (rows, wait) = remembered_short(core, wanted, fresh_after, now)?;
    for row in &rows {
        core.lane(&row.dimension)
            .memory()
            .answered(now.saturating_add(wait));
    }
    Some(Error::RetryIn(RetryIn::on(&wanted.dimension, wait, now)))
}

/// The rows of `wanted`'s bucket as this client remembers them and the whole bucket's
/// wait at `now`, when memory may refuse `wanted` (see [`remembered_refusal`]); this
/// only looks.
pub(super) fn remembered_short(
    core: &Core,
    wanted: &Wanted,
    fresh_after: Option<UnixMillis>,
    now: UnixMillis,
) -> Option<(Vec<BucketState>, Duration)> {
    let base = &wanted.dimension;
    let mut rows = Vec::new();
    for k in 0..core.lanes.shards(base) {
        let on = Wanted {
            dimension: base.shard(k),
            ..wanted.clone()
        };
        let lane = core.lane(&on.dimension);
        let memory = lane.memory();
        if !matches!(memory.recall(&on, now, fresh_after), Recall::Denied(_)) {
            return None;
        }
        rows.push(memory.row()?.clone());
    }
    let whole = crate::bucket::shards::whole(&rows).ok()?;
    let cost = wanted.cost(whole.cost_per_call());
    if total(&free_at(&rows, wanted, now)) >= cost {
        return None;
    }
    let wait = wait_for(&rows, wanted, cost, now);
    Some((rows, wait))
}

/// A row that can serve `cost` alone, of what each can give (`free`): one picked at
/// random, so that clients sent to the whole bucket at once do not all write the same
/// row, and another than the one `tried` (a throttled row has tokens, and no room for
/// the write) when there is one.
fn serving(free: &[Tokens], cost: Tokens, tried: u16) -> Option<usize> {
    let mut from: Vec<usize> = (0..free.len()).filter(|k| free[*k] >= cost).collect();
    if from.len() > 1 {
        from.retain(|k| *k != usize::from(tried));
    }
    (!from.is_empty()).then(|| from[rand::rng().random_range(0..from.len())])
}

/// What the rows can give together.
pub(super) fn total(free: &[Tokens]) -> Tokens {
    free.iter().fold(Tokens::ZERO, |s, f| s.saturating_add(*f))
}

/// What each row can give an acquire at `wanted`'s priority at `now`: its tokens above
/// its share of the reserves the priority must leave.
pub(super) fn free_at(rows: &[BucketState], wanted: &Wanted, now: UnixMillis) -> Vec<Tokens> {
    rows.iter()
        .map(|r| r.available_to(wanted.priority.as_ref(), now))
        .collect()
}

/// `cost` taken from the rows that can give most, each giving what it can, fewest rows
/// first.
fn gathered(free: &[Tokens], cost: Tokens, on: impl Fn(usize, Tokens) -> Wanted) -> Vec<Wanted> {
    let mut order: Vec<usize> = (0..free.len()).collect();
    order.sort_by_key(|k| std::cmp::Reverse(free[*k]));
    let mut left = cost;
    let mut parts = Vec::new();
    for k in order {
        if left <= Tokens::ZERO {
            break;
        }
        let part = free[k].min(left);
        if part > Tokens::ZERO {
            parts.push(on(k, part));
            left = left.saturating_sub(part);
        }
    }
    parts
}

/// The whole bucket's RetryIn: the first millisecond after `now` at which its rows
/// together can give `cost` (each refilling at its share of the rate, up to its share of
/// the capacity), found by bisection over a function that only grows. At least 1 ms.
pub(super) fn wait_for(
    rows: &[BucketState],
    wanted: &Wanted,
    cost: Tokens,
    now: UnixMillis,
) -> Duration {
    let enough = |ms: u64| {
        let at = now.saturating_add(Duration::from_millis(ms));
        total(&free_at(rows, wanted, at)) >= cost
    };
    // Every row is full by the latest of their times to full; a day bounds a bucket that
    // never gets there (a learned burst below the cost, say): the caller asks again then.
    let full = rows
        .iter()
        .filter_map(|r| r.time_to_full(now))
        .max()
        .unwrap_or(Duration::ZERO);
    let mut hi = u64::try_from(full.as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
        .min(86_400_000);
    if !enough(hi) {
        return Duration::from_millis(hi);
    }
    let mut lo = 0;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if enough(mid) { hi = mid } else { lo = mid }
    }
    Duration::from_millis(hi)
}

mod pick;
mod seen;
#[cfg(test)]
mod tests;
