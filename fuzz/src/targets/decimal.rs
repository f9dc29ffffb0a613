//! The decimal parser under every number sluice reads (`decimal::parse` and `format`),
//! and the public parsers built on it (`Tokens`, `RefillRate`, `UnixMillis`).
//!
//! Input: the first byte is the number of decimal places (`'0'` + n, modulo 39, so `'9'`
//! is 9), the second the rounding (`e` exact, `f` floor, `c` ceil; other bytes modulo 3),
//! the rest the text.

use sluice::__fuzz::{format_decimal, parse_decimal};
use sluice::{RefillRate, Tokens, bucket::Rounding, clock::UnixMillis};

use crate::Target;

/// The decimal target.
pub const TARGET: Target = Target {
    name: "decimal",
    dictionary: &[
        b"e",
        b"E",
        b"e+",
        b"e-",
        b".",
        b"-",
        b"+",
        b"0",
        b"9",
        b"170141183460469231731687303715884105727",
        b"1e38",
        b"1e-9",
        b"999999999999999999",
        b"0.000000001",
        b"e2147483647",
        b"e-2147483648",
        b" ",
        b"\t",
        b"\xc2\xa0",
    ],
    check,
};

fn check(data: &[u8]) -> u64 {
    let decimals = u32::from(data.first().map_or(0, |b| b.wrapping_sub(b'0')) % 39);
    let rounding = match data.get(1).copied().unwrap_or(0) {
        b'e' => Rounding::Exact,
        b'f' => Rounding::Floor,
        b'c' => Rounding::Ceil,
        b => [Rounding::Exact, Rounding::Floor, Rounding::Ceil][usize::from(b % 3)],
    };
    let text = String::from_utf8_lossy(data.get(2..).unwrap_or_default());
    let parsed = parse_decimal(&text, decimals, rounding);
    if let Ok(value) = parsed {
        let written = format_decimal(value, decimals);
        assert_eq!(
            parse_decimal(&written, decimals, Rounding::Exact),
            Ok(value),
            "{text:?} read as {value} at {decimals} places, written as {written:?}"
        );
    }
    roundings_agree(&text, decimals);
    public_parsers(&text);
    // Which rounding, and the size of the value or the kind of error.
    let outcome = match parsed {
        Ok(value) => {
            u64::from(value.unsigned_abs().checked_ilog10().unwrap_or(0)) << 1
                | u64::from(value < 0)
        }
        Err(e) => super::words(&e.to_string()),
    };
    outcome ^ u64::from(decimals) << 56 ^ (rounding as u64) << 62
}

/// Floor and ceil differ by at most one unit, and equal the exact value when there is one.
fn roundings_agree(text: &str, decimals: u32) {
    let exact = parse_decimal(text, decimals, Rounding::Exact);
    let floor = parse_decimal(text, decimals, Rounding::Floor);
    let ceil = parse_decimal(text, decimals, Rounding::Ceil);
    if let Ok(e) = exact {
        assert_eq!((floor.clone(), ceil.clone()), (Ok(e), Ok(e)), "{text:?}");
    }
    if let (Ok(f), Ok(c)) = (floor, ceil) {
        assert!(c - f == 0 || c - f == 1, "{text:?}: floor {f}, ceil {c}");
        if c == f {
            assert_eq!(exact, Ok(f), "{text:?}");
        }
    }
}

/// The public parsers: never a panic, and what they read they write back the same.
fn public_parsers(text: &str) {
    for rounding in [Rounding::Floor, Rounding::Ceil] {
        if let Ok(t) = Tokens::parse_rounded(text, rounding) {
            assert_eq!(t.to_string().parse::<Tokens>(), Ok(t), "{text:?}");
        }
        if let Ok(r) = RefillRate::parse_rounded(text, rounding) {
            assert_eq!(r.to_string().parse::<RefillRate>(), Ok(r), "{text:?}");
        }
        if let Ok(at) = UnixMillis::parse_secs(text, rounding) {
            let written = at.to_string();
            assert_eq!(
                UnixMillis::parse_secs(&written, Rounding::Exact),
                Ok(at),
                "{text:?} written as {written:?}"
            );
        }
    }
}
