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

use super::{Commute, Condition, TokensOp, Want, earned, micros_to_earn, millis_to_earn};
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

/// The herd write that does `want` to the full `row` at `at` (see the module
/// documentation), or `None` when the bucket refills a call too fast for one, when the
/// row has a `herd_at` already (a fill then applies, and clears it), or when the row
/// itself would refuse it.
pub(super) fn herd(
    row: &BucketState,
    want: &Want,
    rate: PerMilli,
    at: UnixMillis,
) -> Option<Commute> {
    if row.herd_at.is_some() || row.last_refill_at > at {
        return None;
    }
    let call = want.taken.max(row.bucket.cost_per_call());
    if micros_to_earn(call, rate)? < SLOW_MICROS {
        return None;
    }
    let top = want.ceiling - want.restored;
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
    let call_millis = millis_to_earn(call, rate)?;
    let joins = JOIN_HALVES
        .iter()
        .filter_map(|halves| {
            let k = back.checked_add((call_millis.checked_mul(*halves)? + 1) / 2)?;
            let since = UnixMillis::new(at.as_millis().checked_sub(k)?);
            let mut set = vec![
                Condition::StampIsHerd,
                Condition::HerdSince(since),
                Condition::TokensAtMost(top - refill_since(since, rate, at)),
            ];
            set.extend(floor.map(Condition::TokensAtLeast));
            Some(set)
        })
        .collect();
    let change = Commute {
        tokens: TokensOp::Add(want.restored - want.taken),
        refill: None,
        herd: Some(stamp),
        when: lead,
        or_when: joins,
    };
    change.holds(row).then_some(change)
}

/// The refill from `since` to `at`, with nothing carried.
fn refill_since(since: UnixMillis, rate: PerMilli, at: UnixMillis) -> Tokens {
    earned(Level::new(Tokens::ZERO, since), rate, at).0
}
