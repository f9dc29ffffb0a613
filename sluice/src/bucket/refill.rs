//! Lazy refill, exact for every rate, and the exact wait until tokens are available.

use std::time::Duration;

use ethnum::U256;

use crate::clock::UnixMillis;
use crate::rate::{PerMilli, RefillRate};
use crate::tokens::Tokens;

/// The part of a billionth of a token that refill has earned a bucket but not yet added to
/// its tokens: `units / per` of a billionth, where `per` is the denominator of the bucket's
/// rate in billionths per millisecond.
///
/// Kept beside the refill timestamp, it makes refill exact for every rate: a rate that
/// does not come to whole billionths per millisecond (500 a minute, one a day) loses
/// nothing to rounding, however often the bucket is written, and refilling in many small
/// steps adds exactly what one large step adds. A rate that does (10 a second) never
/// carries anything.
///
/// ```
/// use std::time::Duration;
/// use sluice::{Bucket, bucket::BucketState, RefillRate, Tokens, clock::UnixMillis};
///
/// let t0 = UnixMillis::from_secs(1_700_000_000);
/// let mut row = BucketState::full("mail#daily".parse()?, Bucket::requests(RefillRate::per_day(1)).with_capacity(10), t0);
/// row.tokens = Tokens::ZERO;
/// // Refilled every 9,973 ms for a day, or once at its end: exactly one token.
/// let end = t0.saturating_add(Duration::from_secs(86_400));
/// let (mut stepped, mut t) = (row.clone(), t0);
/// while t < end {
///     t = t.saturating_add(Duration::from_millis(9_973)).min(end);
///     stepped.set_level(stepped.refilled(t));
/// }
/// assert_eq!(stepped.tokens, Tokens::new(1));
/// assert_eq!(row.available(end), Tokens::new(1));
/// # Ok::<(), sluice::error::DimensionError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RefillCarry {
    units: u128,
    per: u128,
}

impl Default for RefillCarry {
    fn default() -> Self {
        RefillCarry::ZERO
    }
}

impl RefillCarry {
    /// Nothing carried.
    pub const ZERO: RefillCarry = RefillCarry { units: 0, per: 1 };

    /// `units / per` of a billionth of a token; `None` unless `units < per`.
    pub fn new(units: u128, per: u128) -> Option<Self> {
        (units < per).then_some(RefillCarry { units, per })
    }

    /// The numerator: how many `per`ths of a billionth are carried.
    pub fn units(self) -> u128 {
        self.units
    }

    /// The denominator: the rate's, in billionths per millisecond.
    pub fn per(self) -> u128 {
        self.per
    }

    /// Whether nothing is carried.
    pub fn is_zero(self) -> bool {
        self.units == 0
    }

    /// `units` (fewer than `rate`'s denominator) of a billionth, as carried at `rate`.
    pub(super) fn of(units: U256, rate: PerMilli) -> RefillCarry {
        RefillCarry {
            units: units.as_u128(),
            per: rate.den.as_u128(),
        }
    }

    /// The carry in `den`ths of a billionth: exact when it was kept for a rate with that
    /// denominator, rounded down otherwise (the bucket's rate changed since).
    pub(super) fn in_units_of(self, den: U256) -> U256 {
        let per = U256::from(self.per);
        if per == den {
            U256::from(self.units)
        } else {
            U256::from(self.units) * den / per
        }
    }
}

/// A bucket's level: its tokens as of its refill timestamp, and the part of a billionth of
/// a token refill had earned it by then beyond them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    /// Tokens at `last_refill_at` (negative: debt).
    pub tokens: Tokens,
    /// When refill was last accounted for.
    pub last_refill_at: UnixMillis,
    /// What refill had earned beyond `tokens` by then.
    pub carry: RefillCarry,
}

impl Level {
    /// Whether this level holds less than `other`, both at one refill timestamp: fewer
    /// tokens, or as many with less carried.
    pub(crate) fn is_below(&self, other: &Level) -> bool {
        match self.tokens.cmp(&other.tokens) {
            std::cmp::Ordering::Equal => {
                let mine = U256::from(self.carry.units) * U256::from(other.carry.per);
                mine < U256::from(other.carry.units) * U256::from(self.carry.per)
            }
            order => order.is_lt(),
        }
    }

    /// `tokens` at `at`, with nothing carried.
    pub fn new(tokens: Tokens, at: UnixMillis) -> Self {
        Level {
            tokens,
            last_refill_at: at,
            carry: RefillCarry::ZERO,
        }
    }
}

/// Lazy refill, exact for every rate.
///
/// Adds the refill earned from `level`'s timestamp to `now`, capped at `capacity`: the
/// whole billionths of a token to the tokens, the rest to the carry. A full bucket earns
/// nothing (and carries nothing). The timestamp never moves backwards: a clock behind it
/// adds nothing.
#[cfg_attr(not(feature = "unstable-store"), allow(unreachable_pub))]
pub fn refill(level: Level, capacity: Tokens, rate: RefillRate, now: UnixMillis) -> Level {
    if level.tokens >= capacity {
        // Full (or above a lowered capacity): nothing accrues while full.
        return Level::new(capacity, level.last_refill_at.max(now));
    }
    let elapsed = now
        .as_millis()
        .saturating_sub(level.last_refill_at.as_millis());
    let Some(rate) = rate.per_milli() else {
        return level;
    };
    if elapsed <= 0 {
        return level;
    }
    let earned = U256::from(elapsed.unsigned_abs()) * rate.num + level.carry.in_units_of(rate.den);
    let deficit = capacity.as_nanos() - level.tokens.as_nanos();
    if earned >= U256::from(deficit.unsigned_abs()) * rate.den {
        return Level::new(capacity, now);
    }
    // Less than the deficit, which is at most 2·10^27 billionths.
    let added = (earned / rate.den).as_i128();
    Level {
        tokens: level.tokens + Tokens::from_nanos(added),
        last_refill_at: now,
        carry: RefillCarry::of(earned % rate.den, rate),
    }
}

/// The exact wait from `now` until a bucket at `level` (already refilled to `now`) holds
/// `needed`, rounded up to the millisecond; `None` if it never refills.
pub(super) fn wait_until_available(
    level: Level,
    rate: RefillRate,
    needed: Tokens,
    now: UnixMillis,
) -> Option<Duration> {
    let rate = rate.per_milli()?;
    let deficit = needed.as_nanos().saturating_sub(level.tokens.as_nanos());
    if deficit <= 0 {
        return Some(Duration::ZERO);
    }
    // The carry is less than one billionth: what is still to be earned is positive.
    let owed = U256::from(deficit.unsigned_abs()) * rate.den - level.carry.in_units_of(rate.den);
    let millis = (owed + rate.num - U256::ONE) / rate.num;
    let ready_at = i128::from(level.last_refill_at.as_millis())
        .saturating_add(i128::try_from(millis).unwrap_or(i128::MAX));
    let wait = ready_at.saturating_sub(i128::from(now.as_millis())).max(1);
    Some(Duration::from_millis(
        u64::try_from(wait).unwrap_or(u64::MAX),
    ))
}

/// The level at `now` from which a bucket refilling at `rate` holds exactly `target` at
/// `ready_at` and less at every millisecond before (`None` if it never refills).
pub(super) fn level_reaching(
    target: Tokens,
    ready_at: UnixMillis,
    rate: RefillRate,
    now: UnixMillis,
) -> Option<Level> {
    let rate = rate.per_milli()?;
    let span = ready_at.as_millis().saturating_sub(now.as_millis()).max(0);
    // In `den`ths of a billionth: target·den − span·num, split into whole billionths (rounded
    // down) and a carry.
    let earned = U256::from(span.unsigned_abs()) * rate.num;
    let goal = U256::from(target.as_nanos().unsigned_abs()) * rate.den;
    let (negative, units) = match (target.as_nanos() < 0, goal >= earned) {
        (false, true) => (false, goal - earned),
        (false, false) => (true, earned - goal),
        (true, _) => (true, goal + earned),
    };
    let (whole, rest) = (units / rate.den, units % rate.den);
    let max = Tokens::MAX.as_nanos();
    let whole = i128::try_from(whole).unwrap_or(max);
    let (nanos, carry) = if !negative {
        (whole, rest)
    } else if whole >= max {
        // A pause so long that its refill fills any bucket many times over.
        (-max, U256::ZERO)
    } else if rest == U256::ZERO {
        (-whole, rest)
    } else {
        // −(whole + rest/den) = −(whole + 1) + (den − rest)/den.
        (-(whole + 1), rate.den - rest)
    };
    let tokens = Tokens::from_nanos(nanos.min(max));
    Some(Level {
        tokens,
        last_refill_at: now,
        carry: RefillCarry::of(carry, rate),
    })
}

#[cfg(test)]
mod tests;
