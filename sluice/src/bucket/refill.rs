//! Lazy refill with drift compensation, and the exact wait until tokens are available.

use std::time::Duration;

use crate::clock::UnixMillis;
use crate::tokens::{RefillRate, Tokens};

fn gcd(mut a: i128, mut b: i128) -> i128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.abs()
}

/// The refill grid in milliseconds: the shortest span whose refill is a whole number of
/// billionths of a token. It is 1 ms for any rate with at most six decimal places.
pub(super) fn grid_ms(rate: RefillRate) -> i64 {
    // A span of g ms adds g * rate / 1000 nanotokens; that is whole when 1000 / gcd(rate, 1000)
    // divides g.
    (1_000 / gcd(rate.as_nanos_per_second(), 1_000)) as i64
}

/// Lazy refill with drift compensation.
///
/// Adds the refill earned since `last`, capped at `capacity`, and moves the timestamp only
/// by the time that produced whole units (so many small steps add exactly what one large
/// step adds). The timestamp never moves backwards: a clock behind `last` adds nothing.
pub fn refill(
    tokens: Tokens,
    last: UnixMillis,
    capacity: Tokens,
    rate: RefillRate,
    now: UnixMillis,
) -> (Tokens, UnixMillis) {
    if tokens >= capacity {
        // Full (or above a lowered capacity): nothing accrues while full.
        return (capacity, last.max(now));
    }
    let elapsed = now.as_millis().saturating_sub(last.as_millis());
    if rate <= RefillRate::ZERO || elapsed <= 0 {
        return (tokens, last);
    }
    let grid = grid_ms(rate);
    let steps = elapsed / grid;
    // The refill of the whole grid steps elapsed, unless it fills the bucket (or would
    // overflow, which fills any bucket many times over).
    let deficit = capacity.as_nanos().saturating_sub(tokens.as_nanos());
    match i128::from(steps).checked_mul(step_refill(rate, grid)) {
        Some(added) if added < deficit => (
            tokens + Tokens::from_nanos(added),
            UnixMillis::new(last.as_millis() + steps * grid),
        ),
        _ => (capacity, now),
    }
}

/// The refill of one grid step of `grid` ms at `rate`, in billionths of a token: whole, and
/// at least one for any positive rate (see [`grid_ms`]).
fn step_refill(rate: RefillRate, grid: i64) -> i128 {
    (i128::from(grid).saturating_mul(rate.as_nanos_per_second()) / 1_000).max(1)
}

/// The exact wait from `now` until a bucket holding `tokens` at `last` (already refilled to
/// `now`) holds `needed`, rounded up to the millisecond; `None` if it never refills.
pub(super) fn wait_until_available(
    tokens: Tokens,
    last: UnixMillis,
    rate: RefillRate,
    needed: Tokens,
    now: UnixMillis,
) -> Option<Duration> {
    if rate <= RefillRate::ZERO {
        return None;
    }
    let deficit = needed.as_nanos().saturating_sub(tokens.as_nanos());
    if deficit <= 0 {
        return Some(Duration::ZERO);
    }
    let grid = grid_ms(rate);
    let per_grid = step_refill(rate, grid);
    let steps = deficit.saturating_add(per_grid - 1) / per_grid;
    let ready_at =
        i128::from(last.as_millis()).saturating_add(steps.saturating_mul(i128::from(grid)));
    let wait = (ready_at - i128::from(now.as_millis())).max(1);
    Some(Duration::from_millis(
        u64::try_from(wait).unwrap_or(u64::MAX),
    ))
}
