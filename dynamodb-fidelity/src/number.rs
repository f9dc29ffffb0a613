//! DynamoDB numbers as decimal text: their significant digits (which size them) and one
//! canonical spelling (so `1.50` and `1.5` name the same key, as they do in DynamoDB).

/// A number's sign, significant digits (no leading or trailing zeros) and the power of ten
/// of the first digit's place plus one: the value is `0.d1d2… × 10^exponent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decimal {
    negative: bool,
    digits: String,
    exponent: i64,
}

impl Decimal {
    /// Reads DynamoDB number text (`-12.5`, `1E+3`, `.5`); `None` if it is not a number.
    pub(crate) fn parse(text: &str) -> Option<Decimal> {
        let text = text.trim();
        let (negative, unsigned) = match text.as_bytes().first()? {
            b'-' => (true, &text[1..]),
            b'+' => (false, &text[1..]),
            _ => (false, text),
        };
        let (mantissa, exp) = match unsigned.find(['e', 'E']) {
            Some(at) => (&unsigned[..at], unsigned[at + 1..].parse::<i64>().ok()?),
            None => (unsigned, 0),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if int.is_empty() && frac.is_empty() || !all_digits(int) || !all_digits(frac) {
            return None;
        }
        let joined = format!("{int}{frac}");
        let leading = joined.len() - joined.trim_start_matches('0').len();
        let digits = joined.trim_matches('0').to_owned();
        let int_len = i64::try_from(int.len()).ok()?;
        let leading = i64::try_from(leading).ok()?;
        if digits.is_empty() {
            return Some(Decimal {
                negative: false,
                digits,
                exponent: 0,
            });
        }
        Some(Decimal {
            negative,
            digits,
            exponent: exp.checked_add(int_len)?.checked_sub(leading)?,
        })
    }

    /// Significant digits: none for zero.
    pub(crate) fn significant_digits(&self) -> u64 {
        self.digits.len() as u64
    }

    /// Plain decimal text without exponent, leading or trailing zeros (`0` for zero).
    pub(crate) fn canonical(&self) -> String {
        if self.digits.is_empty() {
            return "0".to_owned();
        }
        let len = self.digits.len() as i64;
        let sign = if self.negative { "-" } else { "" };
        let body = if self.exponent >= len {
            format!(
                "{}{}",
                self.digits,
                "0".repeat((self.exponent - len) as usize)
            )
        } else if self.exponent > 0 {
            let (int, frac) = self.digits.split_at(self.exponent as usize);
            format!("{int}.{frac}")
        } else {
            format!(
                "0.{}{}",
                "0".repeat(self.exponent.unsigned_abs() as usize),
                self.digits
            )
        };
        format!("{sign}{body}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> String {
        Decimal::parse(text).unwrap().canonical()
    }

    #[test]
    fn equal_numbers_spelled_differently_have_one_canonical_text() {
        assert_eq!(canonical("1.50"), "1.5");
        assert_eq!(canonical("001.5"), "1.5");
        assert_eq!(canonical("15E-1"), "1.5");
        assert_eq!(canonical("1000"), "1000");
        assert_eq!(canonical("1e3"), "1000");
        assert_eq!(canonical("-0.0012"), "-0.0012");
        assert_eq!(canonical(".5"), "0.5");
        assert_eq!(canonical("-0"), "0");
        assert_eq!(canonical("0.000"), "0");
    }

    #[test]
    fn significant_digits_ignore_leading_and_trailing_zeros() {
        let digits = |t: &str| Decimal::parse(t).unwrap().significant_digits();
        assert_eq!(digits("123.4500"), 5);
        assert_eq!(digits("0.0012"), 2);
        assert_eq!(digits("1000"), 1);
        assert_eq!(digits("0"), 0);
        assert_eq!(digits("-98765432109876543210"), 19);
    }

    #[test]
    fn text_that_is_not_a_number_is_refused() {
        for text in ["", "-", ".", "1.2.3", "abc", "1e", "1e+x", "NaN"] {
            assert_eq!(Decimal::parse(text), None, "{text:?}");
        }
    }
}
