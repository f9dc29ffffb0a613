//! A fleet's start on a full row: many processes, each with the row it read before any of
//! them wrote, each making its first write to it.
//!
//! Each of those writes would be a fill (the row it read is full), and a fill sets the
//! stored tokens and the refill timestamp: once the first lands, the others' conditions
//! ("the bucket is full now") fail on any bucket that takes longer than a few milliseconds
//! to refill a call, and every one is sent again from the row handed back. On a bucket
//! with a per-item write ceiling those lost races spend it, and its throttles cost reads.
//!
//! A herd write makes the first write of each of them commute with the others instead:
//!
//! | set | conditions | change |
//! |---|---|---|
//! | lead | no `herd_at`, `last_refill_at ≤ s`, `tokens = holds - restored - refill(s → now)` (as remembered) | `tokens += restored - taken`; `last_refill_at` and `herd_at` set to `s` |
//! | join (one per window `k`) | `last_refill_at = herd_at`, `herd_at ≥ now - k`, `tokens ≤ holds - restored - refill(k)`, `tokens ≥ need - restored` | `tokens += restored - taken`; both left as they are |
//!
//! It is one update (`last_refill_at = if_not_exists(herd_at, s)`, likewise `herd_at`), so
//! whichever set holds when it lands decides what it is. The lead takes from the stored
//! tokens and stamps the row at `s`, as far before `now` as the refill of what the stored
//! tokens were short of full takes (whole milliseconds of it, else there is no lead): the
//! stored tokens plus the refill since `s` are then exactly what the bucket holds, so it
//! leaves what a fill would, at every later instant. A join is a take from the stored
//! tokens on a row refilled at most `k` ago, short of full by at least that refill: the
//! level is the stored tokens plus the refill since, uncapped, so adding to them is exact. Every other
//! write that moves the refill timestamp clears `herd_at`, so a row's next herd has a lead
//! again; none of the sets depends on `herd_at` for being right, only on the refill
//! timestamp, so a row whose `herd_at` another SDK left behind is only a row with no herd.
//! Both drop the row's refill carry (less than a billionth: the bucket holds less, never
//! more), which the joins' conditions do not count. Only a write's first attempt is a herd
//! write: one refused (the row was not as remembered, or its stored tokens carry digits
//! beyond a billionth that another SDK's floats left) is computed again as a fill.
//!
//! A process that read the row after the lead (its `herd_at` set) and writes once the row
//! as read has refilled to full sends the joins alone (see [`join`]), as does the first
//! attempt of a later write whose own last write showed others taking from the herd.

use super::{Commute, Condition, Herd, TokensOp, Want, earned, micros_to_earn, millis_to_earn};
use crate::bucket::refill::Level;
use crate::bucket::state::BucketState;
use crate::clock::UnixMillis;
use crate::rate::PerMilli;
use crate::tokens::Tokens;

/// The shortest a bucket takes to refill one call for a herd: a faster one is full again
/// within the few milliseconds that a fill accepts another writer's fill in.
const SLOW_MICROS: i64 = 5_000;

/// The windows a join accepts the lead's refill timestamp within, beyond how far back the
/// lead stamps it, in halves of the time one call takes to refill: the shorter the window,
/// the fuller a row it accepts.
const JOIN_HALVES: [i64; 5] = [1, 2, 4, 8, 16];

/// How long after a herd's timestamp (its lead's instant, set back by the refill of what
/// the row was short of full) a write's first attempt guesses that the herd is still under
/// way, and joins it (see [`join`]): about how long a fleet takes to start.
const JOIN_AFTER_MILLIS: i64 = 1_000;

/// The herd write that does `want` to the full `row` at `at` (see the module
/// documentation), or `None` when the bucket refills a call too fast for one, when the
/// row has a herd the write does not join (a fill then applies, and clears it), or when
/// the row itself would refuse a lead.
pub(super) fn herd(
    row: &BucketState,
    want: &Want,
    rate: PerMilli,
    at: UnixMillis,
) -> Option<Commute> {
    if row.last_refill_at > at {
        return None;
    }
    let call = want.taken.max(row.bucket.cost_per_call());
    if micros_to_earn(call, rate)? < SLOW_MICROS {
        return None;
    }
    let top = want.ceiling - want.restored;
    if let Some(lead) = row.herd_at {
        return join(row, want, (rate, call, top), (lead, at));
    }
    if want.herd != Herd::First {
        return None;
    }
    let gap = top - row.tokens;
    if gap < Tokens::ZERO {
        return None;
    }
    // Stamped back by the whole milliseconds whose refill is the gap: the stored tokens
    // plus the refill since are then exactly what the bucket holds, and what a fill would
    // leave, at every later instant. A gap no whole number of milliseconds refills (a row
    // some credit or fold left at a fraction) is filled instead.
    let back = millis_to_earn(gap, rate)?;
    let stamp = UnixMillis::new(at.as_millis().checked_sub(back)?);
    let (refill, carry) = earned(Level::new(Tokens::ZERO, stamp), rate, at);
    if refill != gap || !carry.is_zero() {
        return None;
    }
    let floor = want.need.map(|need| need - want.restored);
    let lead = vec![
        Condition::HerdAbsent,
        Condition::RefilledBy(stamp),
        Condition::TokensAtLeast(floor.map_or(row.tokens, |f| row.tokens.max(f - refill))),
        Condition::TokensAtMost(row.tokens),
    ];
    let change = Commute {
        tokens: TokensOp::Add(want.restored - want.taken),
        refill: None,
        herd: Some(stamp),
        when: lead,
        or_when: joins(floor, (rate, call, top), (back, at))?,
    };
    change.holds(row).then_some(change)
}

/// A write's first attempt on a row whose herd is under way (its refill timestamp is its
/// `herd_at`, at most [`JOIN_AFTER_MILLIS`] before `at`): a join only, for a first write,
/// or for a later one whose own last write left the stored tokens at least two calls (of
/// this write's) below full, most often because others took from the herd since its lead
/// (a lone writer whose lead stamped back a row short of full guesses wrong, once). It is
/// sent whether or not the remembered row satisfies it: that row was read before the
/// herd's other writers took from it, and a join holds on the row they leave (drained
/// below full by more than the refill since the lead), where a fill computed from the
/// remembered row would fail on their every take. A row that is full after all refuses
/// it, once, and the write is computed again as a fill.
fn join(
    row: &BucketState,
    want: &Want,
    bucket: (PerMilli, Tokens, Tokens),
    (lead, at): (UnixMillis, UnixMillis),
) -> Option<Commute> {
    let back = at.as_millis().checked_sub(lead.as_millis())?;
    if row.herd_at != Some(row.last_refill_at) || !(0..=JOIN_AFTER_MILLIS).contains(&back) {
        return None;
    }
    // A later write's own row shows only its own call taken: this writer may be alone.
    let (_, call, top) = bucket;
    if want.herd == Herd::Later && row.tokens > top - call - call {
        return None;
    }
    let floor = want.need.map(|need| need - want.restored);
    let mut sets = joins(floor, bucket, (back, at))?.into_iter();
    Some(Commute {
        tokens: TokensOp::Add(want.restored - want.taken),
        refill: None,
        herd: Some(lead),
        when: sets.next()?,
        or_when: sets.collect(),
    })
}

/// The join sets of a herd whose lead stamped the row `back` milliseconds before `at`:
/// one per window that some row at least `floor` satisfies (see the module
/// documentation).
fn joins(
    floor: Option<Tokens>,
    (rate, call, top): (PerMilli, Tokens, Tokens),
    (back, at): (i64, UnixMillis),
) -> Option<Vec<Vec<Condition>>> {
    let call_millis = millis_to_earn(call, rate)?;
    Some(
        JOIN_HALVES
            .iter()
            .filter_map(|halves| {
                let k = back.checked_add((call_millis.checked_mul(*halves)? + 1) / 2)?;
                let since = UnixMillis::new(at.as_millis().checked_sub(k)?);
                let at_most = top - refill_since(since, rate, at);
                // A window whose refill leaves less than the floor: no row satisfies it.
                if floor.is_some_and(|floor| floor > at_most) {
                    return None;
                }
                let mut set = vec![
                    Condition::StampIsHerd,
                    Condition::HerdSince(since),
                    Condition::TokensAtMost(at_most),
                ];
                set.extend(floor.map(Condition::TokensAtLeast));
                Some(set)
            })
            .collect(),
    )
}

/// The refill from `since` to `at`, with nothing carried.
fn refill_since(since: UnixMillis, rate: PerMilli, at: UnixMillis) -> Tokens {
    earned(Level::new(Tokens::ZERO, since), rate, at).0
}
