//! How much a refill earns in a time, and how long it takes to earn an amount.

use ethnum::U256;

use crate::bucket::refill::{Level, RefillCarry};
use crate::clock::UnixMillis;
use crate::rate::PerMilli;
use crate::tokens::Tokens;

/// The refill `level` earns at `rate` by `at`, uncapped: the whole billionths and the
/// carry left.
pub(crate) fn earned(level: Level, rate: PerMilli, at: UnixMillis) -> (Tokens, RefillCarry) {
    let elapsed = at
        .as_millis()
        .saturating_sub(level.last_refill_at.as_millis());
    if elapsed <= 0 {
        return (Tokens::ZERO, level.carry);
    }
    let earned = U256::from(elapsed.unsigned_abs()) * rate.num + level.carry.in_units_of(rate.den);
    let whole = i128::try_from(earned / rate.den).unwrap_or(i128::MAX);
    (
        Tokens::from_nanos(whole.min(Tokens::MAX.as_nanos())),
        RefillCarry::of(earned % rate.den, rate),
    )
}

/// The billionths a refill at `rate` earns in `micros` microseconds, rounded up.
pub(super) fn earned_in_micros_ceil(micros: i64, rate: PerMilli) -> Tokens {
    let per = rate.den * 1_000;
    let earned = (U256::from(micros.max(0).unsigned_abs()) * rate.num + per - U256::ONE) / per;
    Tokens::from_nanos(
        i128::try_from(earned)
            .unwrap_or(i128::MAX)
            .min(Tokens::MAX.as_nanos()),
    )
}

/// The whole microseconds a refill at `rate` takes to earn `amount` with nothing carried;
/// `None` beyond any timestamp.
pub(super) fn micros_to_earn(amount: Tokens, rate: PerMilli) -> Option<i64> {
    time_to_earn(amount, rate, 1_000)
}

/// The whole milliseconds a refill at `rate` takes to earn `amount` with nothing carried;
/// `None` beyond any timestamp.
pub(super) fn millis_to_earn(amount: Tokens, rate: PerMilli) -> Option<i64> {
    time_to_earn(amount, rate, 1)
}

/// The whole `1/per_milli`ths of a millisecond a refill at `rate` takes to earn `amount`
/// with nothing carried; `None` beyond any timestamp.
fn time_to_earn(amount: Tokens, rate: PerMilli, per_milli: u32) -> Option<i64> {
    if amount <= Tokens::ZERO {
        return Some(0);
    }
    let owed = U256::from(amount.as_nanos().unsigned_abs()) * rate.den * U256::from(per_milli);
    i64::try_from((owed + rate.num - U256::ONE) / rate.num).ok()
}
