//! Refill rates: so many tokens per period, kept as the exact fraction their owner wrote.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use ethnum::{I256, U256};

use crate::decimal::{self, DecimalError, Rounding};
use crate::tokens::{NANOS_PER_TOKEN, TOKEN_DECIMALS, Tokens};

/// The largest numerator or denominator a rate keeps once reduced: 10^38, as many digits
/// as a DynamoDB number holds.
const MAX_PART: i128 = 10_i128.pow(38);
/// The decimal places a rate written as a bare decimal (tokens per second, the seed's
/// `refill_rate`) is read with exactly; digits beyond are rounded as the reader asks.
pub(crate) const RATE_DECIMALS: u32 = 38;
/// The significant digits of the decimal stored as a row's `refill_rate`: a DynamoDB number's.
const STORED_DIGITS: usize = 38;
const NANOS_PER_SECOND: i128 = 1_000_000_000;
const NANOS_PER_MILLI: i128 = 1_000_000;

/// The periods the text form names, shortest first, in seconds.
const UNITS: [(&str, i128); 5] = [
    ("s", 1),
    ("min", 60),
    ("h", 3_600),
    ("day", 86_400),
    ("week", 604_800),
];

/// How fast a bucket refills: an amount of tokens per period, kept exactly.
///
/// The constructors take an amount per period and are unambiguous:
/// `RefillRate::per_minute(500)` refills exactly 500 tokens every minute, and
/// `RefillRate::per_day(1)` exactly one a day, however the period divides into seconds or
/// milliseconds. A rate is kept as the reduced fraction of billionths of a token per
/// nanosecond, so nothing is rounded: refill, the wait until a request can be served, and a
/// rate read back from a row or from its text are exact.
///
/// Its text form names its period (`500/min`, `10/s`, `1/day`, `7/7.001s`) and reads back as
/// the same rate; a bare decimal is read as tokens per second, the way the seed's
/// `refill_rate` attribute stores it.
///
/// ```
/// use std::time::Duration;
/// use sluice::{RefillRate, Tokens};
///
/// let rpm = RefillRate::per_minute(500);
/// assert_eq!(rpm.to_string(), "500/min");
/// assert_eq!(rpm.refill_over(Duration::from_secs(60)), Tokens::new(500));
/// assert_eq!(RefillRate::per_day(1).refill_over(Duration::from_secs(86_400)), Tokens::new(1));
/// assert_eq!("500/min".parse::<RefillRate>()?, rpm);
/// assert_eq!("1.667".parse::<RefillRate>()?.to_string(), "1.667/s");
/// assert_eq!("0.5/s".parse::<RefillRate>()?, "30/min".parse()?);
/// # Ok::<(), sluice::error::DecimalError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RefillRate {
    /// Billionths of a token refilled every `period` (negative only as read from a row
    /// that [validation](crate::Bucket::validate) refuses).
    amount: i128,
    /// Nanoseconds: positive, and coprime with `amount`.
    period: i128,
}

/// A positive rate as billionths of a token per millisecond: `num / den`, reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PerMilli {
    pub(crate) num: U256,
    pub(crate) den: U256,
}

impl RefillRate {
    /// No refill at all.
    pub const ZERO: RefillRate = RefillRate {
        amount: 0,
        period: 1,
    };

    /// The fastest refill sluice accepts: 10^15 tokens per second.
    pub const MAX: RefillRate = RefillRate {
        amount: 1_000_000_000_000_000,
        period: 1,
    };

    /// `amount` tokens every `period`, exactly.
    ///
    /// A zero `period` or an amount of no tokens gives [`RefillRate::ZERO`]; a negative
    /// amount is taken as none.
    pub fn new(amount: impl Into<Tokens>, period: Duration) -> Self {
        let amount = amount.into().as_nanos().max(0);
        // At most 10^38 by 1.8·10^28: reduced, always within bounds, except an amount too
        // large for any rate, which saturates to one `validate` refuses.
        reduced(
            U256::from(amount.unsigned_abs()),
            U256::from(period.as_nanos()),
            false,
        )
        .unwrap_or(RefillRate {
            amount: MAX_PART,
            period: 1,
        })
    }

    /// `amount` tokens per second.
    pub fn per_second(amount: u64) -> Self {
        Self::new(amount, Duration::from_secs(1))
    }

    /// `amount` tokens per minute.
    pub fn per_minute(amount: u64) -> Self {
        Self::new(amount, Duration::from_secs(60))
    }

    /// `amount` tokens per hour.
    pub fn per_hour(amount: u64) -> Self {
        Self::new(amount, Duration::from_secs(3_600))
    }

    /// `amount` tokens per day.
    pub fn per_day(amount: u64) -> Self {
        Self::new(amount, Duration::from_secs(86_400))
    }

    /// `amount` tokens per week.
    pub fn per_week(amount: u64) -> Self {
        Self::new(amount, Duration::from_secs(604_800))
    }

    /// A rate given in billionths of a token per second.
    pub fn from_nanos_per_second(nanos: i128) -> Self {
        let magnitude = U256::from(nanos.unsigned_abs());
        reduced(magnitude, U256::from(NANOS_PER_SECOND as u128), nanos < 0).unwrap_or(RefillRate {
            amount: if nanos < 0 { -MAX_PART } else { MAX_PART },
            period: 1,
        })
    }

    /// Whether the rate refills nothing.
    pub const fn is_zero(self) -> bool {
        self.amount == 0
    }

    /// The tokens this rate refills over `span`, rounded down to a billionth of a token
    /// (and kept within [`Tokens::MAX`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{RefillRate, Tokens};
    ///
    /// let hourly = RefillRate::per_hour(1);
    /// assert_eq!(hourly.refill_over(Duration::from_secs(1_800)), "0.5".parse()?);
    /// assert_eq!(hourly.refill_over(Duration::from_secs(3_600)), Tokens::new(1));
    /// # Ok::<(), sluice::error::DecimalError>(())
    /// ```
    pub fn refill_over(self, span: Duration) -> Tokens {
        let product = U256::from(self.amount.unsigned_abs()) * U256::from(span.as_nanos());
        let nanos = clamp_nanos(product / U256::from(self.period.unsigned_abs()));
        Tokens::from_nanos(if self.amount < 0 { -nanos } else { nanos })
    }

    /// This rate times `numerator / denominator`, exactly (e.g. a share in percent).
    pub(crate) fn scaled(self, numerator: u32, denominator: u32) -> RefillRate {
        if denominator == 0 {
            return RefillRate::ZERO;
        }
        let amount = U256::from(self.amount.unsigned_abs()) * U256::from(numerator);
        let period = U256::from(self.period.unsigned_abs()) * U256::from(denominator);
        reduced(amount, period, self.amount < 0).unwrap_or(RefillRate::ZERO)
    }

    /// The rate as billionths of a token per millisecond, reduced (`None` unless positive).
    pub(crate) fn per_milli(self) -> Option<PerMilli> {
        if self.amount <= 0 {
            return None;
        }
        // `amount` and `period` are coprime, so what the factor 10^6 shares with the period
        // is all the fraction can lose.
        let common = gcd_u128(
            NANOS_PER_MILLI as u128,
            (self.period % NANOS_PER_MILLI) as u128,
        );
        Some(PerMilli {
            num: U256::from(self.amount as u128) * U256::from(NANOS_PER_MILLI as u128 / common),
            den: U256::from(self.period as u128 / common),
        })
    }

    /// Reads a bare decimal of tokens per second (a row's `refill_rate`), exact to
    /// 38 decimal places and rounded as asked beyond; the text form with a unit is
    /// read too.
    pub fn parse_rounded(text: &str, rounding: Rounding) -> Result<Self, DecimalError> {
        parse(text, true, rounding)
    }

    /// The tokens per second as a decimal, the way a row's `refill_rate` stores them:
    /// exact when the rate is a decimal of at most 38 significant digits, else rounded
    /// toward zero to 38 digits.
    ///
    /// ```
    /// use sluice::RefillRate;
    ///
    /// assert_eq!(RefillRate::per_second(10).tokens_per_second(), "10");
    /// assert_eq!(RefillRate::per_minute(90).tokens_per_second(), "1.5");
    /// assert_eq!(RefillRate::per_minute(500).tokens_per_second(), format!("8.{}", "3".repeat(37)));
    /// ```
    pub fn tokens_per_second(self) -> String {
        self.stored_decimal().0
    }

    /// [`tokens_per_second`](Self::tokens_per_second), and whether it is exact.
    pub(crate) fn stored_decimal(self) -> (String, bool) {
        let sign = if self.amount < 0 { "-" } else { "" };
        let period = self.period.unsigned_abs();
        let mut amount = self.amount.unsigned_abs();
        let mut text = format!("{sign}{}", amount / period);
        let mut digits = if amount / period == 0 {
            0
        } else {
            text.len() - sign.len()
        };
        amount %= period;
        if amount == 0 {
            return (text, true);
        }
        text.push('.');
        let mut rest = U256::from(amount);
        let period = U256::from(period);
        while rest != U256::ZERO && digits < STORED_DIGITS {
            rest *= U256::from(10_u8);
            let digit = (rest / period).as_u8();
            rest %= period;
            if digit != 0 || digits > 0 {
                digits += 1;
            }
            text.push(char::from(b'0' + digit));
        }
        (text, rest == U256::ZERO)
    }

    /// `amount` billionths of a token per `period` nanoseconds (as a row's extra
    /// attributes store it); `None` for a period that is not positive or parts beyond 10^38.
    #[cfg(any(feature = "dynamodb", test))]
    pub(crate) fn from_parts(amount: i128, period: i128) -> Option<RefillRate> {
        if period <= 0 {
            return None;
        }
        reduced(
            U256::from(amount.unsigned_abs()),
            U256::from(period.unsigned_abs()),
            amount < 0,
        )
    }

    /// The interval of decimals a row's `refill_rate` holds when it was read as this rate:
    /// the decimal itself when it is exact, else from it (rounded toward zero) to the next
    /// one up at its last digit.
    #[cfg(any(feature = "dynamodb", test))]
    pub(crate) fn stored_interval(self) -> (String, String) {
        let (text, exact) = self.stored_decimal();
        if exact {
            return (text.clone(), text);
        }
        let next = next_up(&text);
        (text, next)
    }

    /// The rate as an amount of tokens (in billionths) per period (in nanoseconds), the
    /// way a person reads it: whole tokens per named period where there is one, else exact
    /// billionths per named period, else whole tokens per however many seconds.
    pub(crate) fn amount_per_period(self) -> (i128, i128) {
        if let Some((nanos, seconds)) = self.per_named_unit(true).or(self.per_named_unit(false)) {
            return (nanos, seconds * NANOS_PER_SECOND);
        }
        // Scaled so that the amount is whole tokens, when that fits.
        let scale =
            NANOS_PER_TOKEN / gcd_u128(self.amount.unsigned_abs(), NANOS_PER_TOKEN as u128) as i128;
        match (
            self.amount.checked_mul(scale),
            self.period.checked_mul(scale),
        ) {
            (Some(amount), Some(period)) => (amount, period),
            _ => (self.amount, self.period),
        }
    }

    /// The first named period (shortest first) over which this rate refills whole tokens
    /// (`whole`) or an exact number of billionths, with that amount and the period's
    /// seconds.
    fn per_named_unit(self, whole: bool) -> Option<(i128, i128)> {
        let quantum = if whole { NANOS_PER_TOKEN } else { 1 };
        UNITS.iter().find_map(|&(_, seconds)| {
            let nanos = U256::from(self.amount.unsigned_abs())
                * U256::from((seconds * NANOS_PER_SECOND) as u128);
            let period = U256::from(self.period.unsigned_abs());
            let exact = nanos % period == U256::ZERO
                && (nanos / period) % U256::from(quantum as u128) == U256::ZERO;
            let amount = i128::try_from(nanos / period).ok().filter(|_| exact)?;
            Some((if self.amount < 0 { -amount } else { amount }, seconds))
        })
    }

    /// The tokens per second as an exact decimal of at most [`RATE_DECIMALS`] places, if
    /// there is one.
    fn exact_decimal(self) -> Option<String> {
        let (text, exact) = self.stored_decimal();
        let places = text.split_once('.').map_or(0, |(_, f)| f.len());
        (exact && places <= RATE_DECIMALS as usize).then_some(text)
    }
}

/// The decimal `text` (digits, an optional point, no exponent) one unit up at its last
/// digit, away from zero.
#[cfg(any(feature = "dynamodb", test))]
fn next_up(text: &str) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for i in (0..bytes.len()).rev() {
        match bytes[i] {
            b'9' => bytes[i] = b'0',
            b'0'..=b'8' => {
                bytes[i] += 1;
                return String::from_utf8(bytes).unwrap_or_default();
            }
            _ => {}
        }
    }
    // All nines: one more digit in front (after the sign).
    let at = usize::from(text.starts_with('-'));
    bytes.insert(at, b'1');
    String::from_utf8(bytes).unwrap_or_default()
}

/// `amount / period` reduced, negative if asked; `None` when a reduced part is beyond
/// 10^38. A zero period or amount is [`RefillRate::ZERO`].
fn reduced(amount: U256, period: U256, negative: bool) -> Option<RefillRate> {
    if period == U256::ZERO || amount == U256::ZERO {
        return Some(RefillRate::ZERO);
    }
    let common = gcd(amount, period);
    let amount = i128::try_from(amount / common).ok()?;
    let period = i128::try_from(period / common).ok()?;
    (amount <= MAX_PART && period <= MAX_PART).then_some(RefillRate {
        amount: if negative { -amount } else { amount },
        period,
    })
}

fn gcd(mut a: U256, mut b: U256) -> U256 {
    while b != U256::ZERO {
        (a, b) = (b, a % b);
    }
    a
}

fn gcd_u128(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A count of billionths, kept within [`Tokens::MAX`].
fn clamp_nanos(nanos: U256) -> i128 {
    let max = Tokens::MAX.as_nanos();
    i128::try_from(nanos).map_or(max, |n| n.min(max))
}

/// Reads a rate: `AMOUNT/UNIT` with an optional multiple of the unit (`500/min`,
/// `7/7.001s`, `1/2h`), or, where `bare` allows it, a decimal of tokens per second.
pub(crate) fn parse(
    text: &str,
    bare: bool,
    rounding: Rounding,
) -> Result<RefillRate, DecimalError> {
    let malformed = || DecimalError::Malformed(text.to_owned());
    let Some((amount, unit)) = text.split_once('/') else {
        if !bare {
            return Err(malformed());
        }
        let (digits, scale) = decimal::parse_fraction(text, RATE_DECIMALS, rounding)?;
        return reduced(
            U256::from(digits.unsigned_abs()),
            U256::from(10_u8).pow(scale),
            digits < 0,
        )
        .ok_or_else(|| DecimalError::OutOfRange(text.to_owned()));
    };
    let (digits, scale) = decimal::parse_fraction(amount.trim(), RATE_DECIMALS, Rounding::Exact)?;
    let unit = unit.trim();
    let split = unit
        .find(|c: char| c.is_ascii_alphabetic())
        .ok_or_else(malformed)?;
    let (times, name) = (unit[..split].trim(), &unit[split..]);
    let (times, times_scale) = if times.is_empty() {
        (1, 0)
    } else {
        decimal::parse_fraction(times, RATE_DECIMALS, Rounding::Exact)?
    };
    let unit_nanos = unit_nanos(name).ok_or_else(malformed)?;
    if times <= 0 {
        return Err(malformed());
    }
    // digits / 10^scale tokens per times / 10^times_scale units.
    let out_of_range = || DecimalError::OutOfRange(text.to_owned());
    let ten = U256::from(10_u8);
    let numerator = U256::from(digits.unsigned_abs())
        .checked_mul(ten.pow(TOKEN_DECIMALS + times_scale))
        .ok_or_else(out_of_range)?;
    let denominator = ten
        .pow(scale)
        .checked_mul(U256::from(times as u128))
        .and_then(|d| d.checked_mul(U256::from(unit_nanos as u128)))
        .ok_or_else(out_of_range)?;
    reduced(numerator, denominator, digits < 0).ok_or_else(out_of_range)
}

/// The nanoseconds of a unit named in the text form.
fn unit_nanos(name: &str) -> Option<i128> {
    let seconds = match name {
        "ms" | "millisecond" | "milliseconds" => return Some(NANOS_PER_MILLI),
        "s" | "sec" | "secs" | "second" | "seconds" => 1,
        "m" | "min" | "mins" | "minute" | "minutes" => 60,
        "h" | "hr" | "hour" | "hours" => 3_600,
        "d" | "day" | "days" => 86_400,
        "w" | "wk" | "week" | "weeks" => 604_800,
        _ => return None,
    };
    Some(seconds * NANOS_PER_SECOND)
}

impl PartialOrd for RefillRate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for RefillRate {
    fn cmp(&self, other: &Self) -> Ordering {
        // Each part is at most 10^38: the cross products fit in 256 bits.
        (I256::from(self.amount) * I256::from(other.period))
            .cmp(&(I256::from(other.amount) * I256::from(self.period)))
    }
}

impl Default for RefillRate {
    fn default() -> Self {
        RefillRate::ZERO
    }
}

impl FromStr for RefillRate {
    type Err = DecimalError;

    /// Reads the text form (`500/min`, `7/7.001s`) or a bare decimal of tokens per second,
    /// exactly.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s, true, Rounding::Exact)
    }
}

impl fmt::Display for RefillRate {
    /// The text form: whole tokens per named period where there is one (`500/min`,
    /// `1/day`), else an exact decimal per named period or per second (`0.5/s`,
    /// `0.000011574074074074/s`), else tokens per so many seconds (`7/7.001s`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let named = |(nanos, seconds): (i128, i128)| {
            let unit = UNITS.iter().find(|u| u.1 == seconds).map_or("s", |u| u.0);
            (Tokens::from_nanos(nanos), unit)
        };
        if let Some((tokens, unit)) = self.per_named_unit(true).map(named) {
            return write!(f, "{tokens}/{unit}");
        }
        if let Some((tokens, unit)) = self.per_named_unit(false).map(named) {
            return write!(f, "{tokens}/{unit}");
        }
        if let Some(text) = self.exact_decimal() {
            return write!(f, "{text}/s");
        }
        let (amount, period) = self.amount_per_period();
        let period = decimal::format(period, 9);
        write!(f, "{}/{period}s", Tokens::from_nanos(amount))
    }
}

impl fmt::Debug for RefillRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RefillRate({self})")
    }
}

#[cfg(test)]
mod tests;
