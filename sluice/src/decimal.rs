//! Exact conversion between DynamoDB-style decimal strings and fixed-point integers.
//!
//! DynamoDB numbers travel as decimal strings (`"47"`, `"47.0"`, `"1.667"`,
//! `"1709550002.125"`, sometimes with an exponent). Accounting never goes through `f64`:
//! a string is read digit by digit into an integer scaled by `10^decimals`, and digits
//! beyond that precision are rounded in the direction the caller chooses.

use std::fmt;

/// How to treat digits beyond the target precision when parsing a decimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Refuse a value that cannot be represented exactly.
    Exact,
    /// Round toward negative infinity.
    Floor,
    /// Round toward positive infinity.
    Ceil,
}

/// Why a decimal string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecimalError {
    /// The text is not a decimal number.
    #[error("`{0}` is not a decimal number")]
    Malformed(String),
    /// The number has more fractional digits than can be kept exactly.
    #[error("`{text}` has more than {decimals} decimal places")]
    TooPrecise {
        /// The text that was read.
        text: String,
        /// The number of decimal places that can be kept.
        decimals: u32,
    },
    /// The number is too large to represent.
    #[error("`{0}` is out of range")]
    OutOfRange(String),
}

/// Parses `text` into an integer scaled by `10^decimals`.
pub(crate) fn parse(text: &str, decimals: u32, rounding: Rounding) -> Result<i128, DecimalError> {
    let malformed = || DecimalError::Malformed(text.to_owned());
    let out_of_range = || DecimalError::OutOfRange(text.to_owned());
    let s = text.trim();
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(at) => {
            let exp: i32 = s[at + 1..].parse().map_err(|_| malformed())?;
            (&s[..at], exp)
        }
        None => (s, 0),
    };
    let (int_part, frac_part) = match mantissa.split_once('.') {
        Some((i, f)) => (i, f),
        None => (mantissa, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(malformed());
    }
    if !int_part
        .bytes()
        .chain(frac_part.bytes())
        .all(|b| b.is_ascii_digit())
    {
        return Err(malformed());
    }
    // All digits as one integer, with the position of the decimal point expressed as a
    // power of ten relative to the target scale.
    let digits = int_part.bytes().chain(frac_part.bytes());
    let shift = i64::from(exponent) + i64::from(decimals) - frac_part.len() as i64;
    let mut value: i128 = 0;
    let mut dropped_nonzero = false;
    // Digits that fall below the target precision are only inspected for being non-zero.
    let total = int_part.len() + frac_part.len();
    let kept = if shift >= 0 {
        total
    } else {
        total.saturating_sub(usize::try_from(-shift).unwrap_or(usize::MAX))
    };
    for (i, b) in digits.enumerate() {
        let d = i128::from(b - b'0');
        if i < kept {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(d))
                .ok_or_else(out_of_range)?;
        } else if d != 0 {
            dropped_nonzero = true;
        }
    }
    if shift > 0 {
        for _ in 0..shift {
            if value == 0 {
                break;
            }
            value = value.checked_mul(10).ok_or_else(out_of_range)?;
        }
    }
    if dropped_nonzero {
        let away = match (rounding, negative) {
            (Rounding::Exact, _) => {
                return Err(DecimalError::TooPrecise {
                    text: text.to_owned(),
                    decimals,
                });
            }
            (Rounding::Floor, negative) => negative,
            (Rounding::Ceil, negative) => !negative,
        };
        if away {
            value = value.checked_add(1).ok_or_else(out_of_range)?;
        }
    }
    Ok(if negative { -value } else { value })
}

/// Parses `text` exactly as `digits / 10^scale`, with as few decimal places as its value
/// needs, at most `max_scale`; digits beyond that are rounded as asked.
pub(crate) fn parse_fraction(
    text: &str,
    max_scale: u32,
    rounding: Rounding,
) -> Result<(i128, u32), DecimalError> {
    let scale = places_needed(text).clamp(0, i64::from(max_scale));
    let scale = u32::try_from(scale).unwrap_or(max_scale);
    parse(text, scale, rounding).map(|digits| (digits, scale))
}

/// The decimal places the value written `text` needs (its fraction's significant digits,
/// moved by its exponent), or 0 for text [`parse`] refuses anyway.
fn places_needed(text: &str) -> i64 {
    let s = text.trim().trim_start_matches(['-', '+']);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(at) => (&s[..at], s[at + 1..].parse::<i64>().unwrap_or(0)),
        None => (s, 0),
    };
    let fraction = mantissa.split_once('.').map_or("", |(_, f)| f);
    let significant = fraction.trim_end_matches('0').len() as i64;
    significant.saturating_sub(exponent).max(0)
}

/// Formats an integer scaled by `10^decimals` as a plain decimal string, without
/// trailing zeros in the fraction and without an exponent.
pub(crate) fn format(value: i128, decimals: u32) -> String {
    Display { value, decimals }.to_string()
}

pub(crate) struct Display {
    pub(crate) value: i128,
    pub(crate) decimals: u32,
}

impl fmt::Display for Display {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scale = 10_i128.pow(self.decimals);
        let magnitude = self.value.unsigned_abs();
        let scale_u = scale.unsigned_abs();
        let int = magnitude / scale_u;
        let mut frac = magnitude % scale_u;
        let sign = if self.value < 0 { "-" } else { "" };
        if frac == 0 {
            return write!(f, "{sign}{int}");
        }
        let mut width = self.decimals as usize;
        while frac.is_multiple_of(10) {
            frac /= 10;
            width -= 1;
        }
        write!(f, "{sign}{int}.{frac:0width$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_shapes_dynamodb_and_other_sdks_write() {
        assert_eq!(parse("47", 3, Rounding::Exact), Ok(47_000));
        assert_eq!(parse("47.0", 3, Rounding::Exact), Ok(47_000));
        assert_eq!(parse("1.667", 3, Rounding::Exact), Ok(1_667));
        assert_eq!(
            parse("1709550002.125", 3, Rounding::Exact),
            Ok(1_709_550_002_125)
        );
        assert_eq!(parse("-1.5", 3, Rounding::Exact), Ok(-1_500));
        assert_eq!(parse(".5", 3, Rounding::Exact), Ok(500));
        assert_eq!(parse("5.", 3, Rounding::Exact), Ok(5_000));
        assert_eq!(parse("1E+2", 3, Rounding::Exact), Ok(100_000));
        assert_eq!(parse("1.5e-2", 3, Rounding::Exact), Ok(15));
        assert_eq!(parse("0", 9, Rounding::Exact), Ok(0));
        assert_eq!(parse("0e400", 9, Rounding::Exact), Ok(0));
    }

    #[test]
    fn rounds_extra_digits_in_the_requested_direction() {
        assert_eq!(parse("1.0004", 3, Rounding::Floor), Ok(1_000));
        assert_eq!(parse("1.0004", 3, Rounding::Ceil), Ok(1_001));
        assert_eq!(parse("-1.0004", 3, Rounding::Floor), Ok(-1_001));
        assert_eq!(parse("-1.0004", 3, Rounding::Ceil), Ok(-1_000));
        assert_eq!(parse("1.0000", 3, Rounding::Exact), Ok(1_000));
        assert!(matches!(
            parse("1.0004", 3, Rounding::Exact),
            Err(DecimalError::TooPrecise { .. })
        ));
        assert_eq!(
            parse("46.666666666666664", 9, Rounding::Floor),
            Ok(46_666_666_666)
        );
    }

    #[test]
    fn rejects_what_is_not_a_number() {
        for bad in [
            "", "-", ".", "abc", "1.2.3", "1,5", "1e", "e5", "--1", "1 2", "NaN", "inf",
        ] {
            assert!(
                matches!(
                    parse(bad, 3, Rounding::Exact),
                    Err(DecimalError::Malformed(_))
                ),
                "{bad:?} should be malformed"
            );
        }
        assert!(matches!(
            parse("1e60", 9, Rounding::Exact),
            Err(DecimalError::OutOfRange(_))
        ));
    }

    #[test]
    fn fractions_keep_the_places_their_value_needs() {
        assert_eq!(parse_fraction("47", 38, Rounding::Exact), Ok((47, 0)));
        assert_eq!(parse_fraction("47.500", 38, Rounding::Exact), Ok((475, 1)));
        assert_eq!(
            parse_fraction("0.000011574074074074", 38, Rounding::Exact),
            Ok((11_574_074_074_074, 18))
        );
        assert_eq!(
            parse_fraction("1.1574074074074073e-05", 38, Rounding::Exact),
            Ok((11_574_074_074_074_073, 21))
        );
        assert_eq!(parse_fraction("1.5e3", 38, Rounding::Exact), Ok((1_500, 0)));
        assert_eq!(parse_fraction("0.125", 2, Rounding::Floor), Ok((12, 2)));
        assert!(parse_fraction("0.125", 2, Rounding::Exact).is_err());
    }

    #[test]
    fn formats_without_trailing_zeros() {
        assert_eq!(format(47_000, 3), "47");
        assert_eq!(format(1_667, 3), "1.667");
        assert_eq!(format(1_500, 3), "1.5");
        assert_eq!(format(-1_500, 3), "-1.5");
        assert_eq!(format(-500, 3), "-0.5");
        assert_eq!(format(5, 3), "0.005");
        assert_eq!(format(0, 9), "0");
    }

    proptest::proptest! {
        #[test]
        fn format_then_parse_is_the_identity(v in proptest::num::i128::ANY.prop_map(|v| v / 1_000_000_000_000), d in 0u32..10) {
            proptest::prop_assert_eq!(parse(&format(v, d), d, Rounding::Exact), Ok(v));
        }
    }
    use proptest::strategy::Strategy as _;
}
