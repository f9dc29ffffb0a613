//! Fixed-point token amounts.

use std::fmt;
use std::str::FromStr;

use crate::decimal::{self, DecimalError, Rounding};

/// Decimal places kept for token amounts: a billionth of a token.
pub(crate) const TOKEN_DECIMALS: u32 = 9;
pub(crate) const NANOS_PER_TOKEN: i128 = 1_000_000_000;

/// An exact amount of tokens, kept as an integer count of billionths of a token.
///
/// Amounts may be negative: a bucket in debt after [`Lease::adjust`](crate::Lease::adjust)
/// holds a negative amount that refill pays back.
///
/// ```
/// use sluice::Tokens;
///
/// let t: Tokens = "1.5".parse()?;
/// assert_eq!(t + Tokens::from(2), "3.5".parse()?);
/// assert_eq!(t.to_string(), "1.5");
/// # Ok::<(), sluice::error::DecimalError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Tokens(i128);

impl Tokens {
    /// No tokens.
    pub const ZERO: Tokens = Tokens(0);

    /// The largest amount sluice accepts anywhere, either way of zero (a capacity, a cost, a
    /// bucket's tokens or its debt): 10^18 tokens. Far above any vendor's quota, and small
    /// enough that no arithmetic on such amounts can overflow.
    pub const MAX: Tokens = Tokens(1_000_000_000 * NANOS_PER_TOKEN * NANOS_PER_TOKEN);

    /// A whole number of tokens.
    pub const fn new(whole: i64) -> Self {
        Tokens(whole as i128 * NANOS_PER_TOKEN)
    }

    /// An amount given in billionths of a token.
    pub const fn from_nanos(nanos: i128) -> Self {
        Tokens(nanos)
    }

    /// The amount in billionths of a token.
    pub const fn as_nanos(self) -> i128 {
        self.0
    }

    /// Reads a decimal string, rounding digits beyond nine decimal places as asked.
    pub fn parse_rounded(text: &str, rounding: Rounding) -> Result<Self, DecimalError> {
        decimal::parse(text, TOKEN_DECIMALS, rounding).map(Tokens)
    }

    /// Whether the amount is below zero (a bucket in debt).
    pub const fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// The smaller of two amounts.
    pub fn min(self, other: Self) -> Self {
        Tokens(self.0.min(other.0))
    }

    /// The larger of two amounts.
    pub fn max(self, other: Self) -> Self {
        Tokens(self.0.max(other.0))
    }

    /// `self + other`, or `None` when the sum leaves `-MAX..=MAX`.
    pub fn checked_add(self, other: Self) -> Option<Self> {
        self.0
            .checked_add(other.0)
            .map(Tokens)
            .filter(|t| t.is_within_bounds())
    }

    /// `self × n`, or `None` when the product leaves `-MAX..=MAX`.
    pub fn checked_mul(self, n: u32) -> Option<Self> {
        self.0
            .checked_mul(i128::from(n))
            .map(Tokens)
            .filter(|t| t.is_within_bounds())
    }

    /// `self + other` kept within `-MAX..=MAX`.
    pub fn saturating_add(self, other: Self) -> Self {
        Tokens(self.0.saturating_add(other.0)).clamped()
    }

    /// `self - other` kept within `-MAX..=MAX`.
    pub fn saturating_sub(self, other: Self) -> Self {
        Tokens(self.0.saturating_sub(other.0)).clamped()
    }

    /// Whether the amount is within `-MAX..=MAX`.
    pub fn is_within_bounds(self) -> bool {
        self.0.unsigned_abs() <= Tokens::MAX.0.unsigned_abs()
    }

    /// The amount moved into `-MAX..=MAX`.
    pub(crate) fn clamped(self) -> Self {
        Tokens(self.0.clamp(-Tokens::MAX.0, Tokens::MAX.0))
    }
}

impl FromStr for Tokens {
    type Err = DecimalError;

    /// Reads a decimal string exactly; more than nine decimal places is an error.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_rounded(s, Rounding::Exact)
    }
}

impl fmt::Display for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        decimal::Display {
            value: self.0,
            decimals: TOKEN_DECIMALS,
        }
        .fmt(f)
    }
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tokens({self})")
    }
}

macro_rules! tokens_from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Tokens {
            fn from(whole: $t) -> Self {
                Tokens(i128::from(whole) * NANOS_PER_TOKEN)
            }
        }
    )*};
}
tokens_from_int!(u8, u16, u32, i8, i16, i32, i64);

impl From<u64> for Tokens {
    fn from(whole: u64) -> Self {
        Tokens(i128::from(whole) * NANOS_PER_TOKEN)
    }
}

impl From<usize> for Tokens {
    /// A whole number of tokens, e.g. a length used as a cost estimate.
    fn from(whole: usize) -> Self {
        // usize is at most 64 bits on every supported target, so this is lossless.
        Tokens(whole as i128 * NANOS_PER_TOKEN)
    }
}

impl std::ops::Add for Tokens {
    type Output = Tokens;
    fn add(self, rhs: Self) -> Self {
        Tokens(self.0 + rhs.0)
    }
}

impl std::ops::Sub for Tokens {
    type Output = Tokens;
    fn sub(self, rhs: Self) -> Self {
        Tokens(self.0 - rhs.0)
    }
}

impl std::ops::AddAssign for Tokens {
    fn add_assign(&mut self, rhs: Self) {
        self.0 += rhs.0;
    }
}

impl std::ops::SubAssign for Tokens {
    fn sub_assign(&mut self, rhs: Self) {
        self.0 -= rhs.0;
    }
}

impl std::ops::Neg for Tokens {
    type Output = Tokens;
    fn neg(self) -> Self {
        Tokens(-self.0)
    }
}

impl std::iter::Sum for Tokens {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Tokens::ZERO, |a, b| a + b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_arithmetic_stays_within_the_bounds() {
        assert_eq!(Tokens::MAX.to_string(), "1000000000000000000");
        assert_eq!(Tokens::MAX.checked_add(Tokens::from_nanos(1)), None);
        assert_eq!(
            Tokens::MAX.checked_add(-Tokens::new(1)),
            Some(Tokens::MAX - Tokens::new(1))
        );
        assert_eq!(
            Tokens::from_nanos(i128::MAX).checked_add(Tokens::ZERO),
            None
        );
        assert_eq!(Tokens::new(3).checked_mul(4), Some(Tokens::new(12)));
        assert_eq!(Tokens::MAX.checked_mul(2), None);
        assert_eq!((-Tokens::MAX).saturating_sub(Tokens::new(5)), -Tokens::MAX);
        assert!(!Tokens::from_nanos(i128::MIN).is_within_bounds());
    }

    #[test]
    fn token_amounts_parse_and_print_exactly() {
        assert_eq!("47.0".parse::<Tokens>().unwrap(), Tokens::new(47));
        assert_eq!(Tokens::from_nanos(1).to_string(), "0.000000001");
        assert_eq!((Tokens::new(1) - Tokens::new(3)).to_string(), "-2");
        assert!("0.0000000001".parse::<Tokens>().is_err());
        assert_eq!(
            Tokens::parse_rounded("0.0000000001", Rounding::Ceil).unwrap(),
            Tokens::from_nanos(1)
        );
    }
}
