//! A bucket's refill rate and carry as stored: `refill_rate`, with `refill_amount` and
//! `refill_period` when it cannot hold the rate exactly, and `refill_carry` (see the
//! parent module's documentation).

use aws_sdk_dynamodb::types::AttributeValue;

use super::{REFILL_AMOUNT, REFILL_CARRY, REFILL_PERIOD, REFILL_RATE, Reader, kind, n, s};
use crate::bucket::RefillCarry;
use crate::clock::UnixMillis;
use crate::decimal::{self, Rounding};
use crate::rate::RefillRate;
use crate::store::StoreError;

/// The attributes that store `rate`: `refill_rate`, and the exact `refill_amount` and
/// `refill_period` when `refill_rate` cannot hold it.
pub(crate) fn rate_attributes(rate: RefillRate) -> Vec<(String, AttributeValue)> {
    let (decimal, exact) = rate.stored_decimal();
    let mut attributes = vec![(REFILL_RATE.to_owned(), AttributeValue::N(decimal))];
    if !exact {
        let (amount, period) = rate.amount_per_period();
        attributes.push((REFILL_AMOUNT.to_owned(), n(decimal::format(amount, 9))));
        attributes.push((REFILL_PERIOD.to_owned(), n(decimal::format(period, 9))));
    }
    attributes
}

/// The stored `refill_carry` of a row refilled to `at` with `carry` (`None`: nothing
/// carried).
pub(crate) fn carry_value(carry: RefillCarry, at: UnixMillis) -> Option<AttributeValue> {
    (!carry.is_zero()).then(|| {
        s(format!(
            "{}/{}@{}",
            carry.units(),
            carry.per(),
            at.as_millis()
        ))
    })
}

/// Reads a bucket row's refill rate: the exact `refill_amount` per `refill_period` while
/// they agree with `refill_rate`, else `refill_rate` (rounded down beyond 38 places).
pub(super) fn read_rate(r: &Reader<'_>) -> Result<RefillRate, StoreError> {
    let text = r.required_number(REFILL_RATE)?;
    let stored = RefillRate::parse_rounded(text, Rounding::Floor)
        .map_err(|e| r.corrupt(format!("`{REFILL_RATE}`: {e}")))?;
    let (Some(amount), Some(period)) = (r.number(REFILL_AMOUNT)?, r.number(REFILL_PERIOD)?) else {
        return Ok(stored);
    };
    let part = |name: &str, text: &str| {
        decimal::parse(text, 9, Rounding::Exact).map_err(|e| r.corrupt(format!("`{name}`: {e}")))
    };
    let exact = RefillRate::from_parts(part(REFILL_AMOUNT, amount)?, part(REFILL_PERIOD, period)?)
        .ok_or_else(|| {
            r.corrupt(format!(
                "`{REFILL_AMOUNT}` per `{REFILL_PERIOD}` is not a rate: {amount} per {period}"
            ))
        })?;
    let agrees = RefillRate::parse_rounded(&exact.stored_decimal().0, Rounding::Floor)
        .is_ok_and(|r| r == stored);
    Ok(if agrees { exact } else { stored })
}

/// Reads a bucket row's `refill_carry`, kept only if it was carried as of the row's
/// `last_refill_at`.
pub(super) fn read_carry(
    r: &Reader<'_>,
    last_refill_at: UnixMillis,
) -> Result<RefillCarry, StoreError> {
    let text = match r.item.get(REFILL_CARRY) {
        None => return Ok(RefillCarry::ZERO),
        Some(AttributeValue::S(text)) => text,
        Some(other) => {
            return Err(r.corrupt(format!(
                "`{REFILL_CARRY}` must be a string (S), found {}",
                kind(other)
            )));
        }
    };
    let parsed = text.split_once('@').and_then(|(fraction, at)| {
        let (units, per) = fraction.split_once('/')?;
        let carry = RefillCarry::new(units.parse().ok()?, per.parse().ok()?)?;
        Some((carry, at.parse::<i64>().ok()?))
    });
    match parsed {
        Some((carry, at)) if at == last_refill_at.as_millis() => Ok(carry),
        Some(_) => Ok(RefillCarry::ZERO),
        None => Err(r.corrupt(format!(
            "`{REFILL_CARRY}` must be `units/per@millis` with units < per, found {text:?}"
        ))),
    }
}
