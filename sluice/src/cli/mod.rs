//! What the `sluice` operator binary reads from its users, kept in the library so the
//! fuzz harness reaches it too; not a public API.
//!
//! The binary's command-line definitions (`--type`, `--refill`, …) and its bucket file
//! (`sluice apply`) both end in [`bucket`]; refill rates are read by [`rate`]; the file is
//! read by [`parse`].

mod bucket_file;

use std::time::Duration;

pub use bucket_file::parse;

use crate::{Bucket, LimitType, RefillRate, Tokens};

/// Builds a bucket from its parts, saying what is missing or contradictory.
pub fn bucket(
    limit_type: LimitType,
    capacity: Option<Tokens>,
    refill: Option<RefillRate>,
    cost_per_call: Option<Tokens>,
    lean: bool,
) -> Result<Bucket, String> {
    let bucket = match (limit_type, refill, capacity) {
        (LimitType::Concurrent, Some(_), _) => {
            return Err("a concurrent bucket does not refill; drop the refill rate".into());
        }
        (LimitType::Concurrent, None, Some(slots)) => {
            Bucket::new(LimitType::Concurrent, slots, RefillRate::ZERO)
        }
        (LimitType::Concurrent, None, None) => {
            return Err("a concurrent bucket needs a capacity (its slots)".into());
        }
        (_, None, _) => {
            return Err(format!(
                "a {limit_type} bucket needs a refill rate, e.g. 500/min"
            ));
        }
        (LimitType::Requests, Some(rate), capacity) => {
            let b = Bucket::requests(rate);
            capacity.map_or(b.clone(), |c| b.with_capacity(c))
        }
        (LimitType::Tokens, Some(rate), capacity) => {
            let b = Bucket::tokens(rate);
            capacity.map_or(b.clone(), |c| b.with_capacity(c))
        }
    };
    let bucket = match cost_per_call {
        Some(cost) => bucket.with_cost_per_call(cost),
        None => bucket,
    };
    let bucket = if lean { bucket.lean() } else { bucket };
    bucket.validate().map_err(|e| e.to_string())?;
    Ok(bucket)
}

/// A refill rate: `AMOUNT/UNIT` with UNIT one of s, min, h, day (long names too).
pub fn rate(text: &str) -> Result<RefillRate, String> {
    let bad = || format!("`{text}` is not a rate like 500/min, 10/s, 1000/h or 50000/day");
    let (amount, unit) = text.split_once('/').ok_or_else(bad)?;
    let amount: Tokens = amount.trim().parse().map_err(|_| bad())?;
    if amount <= Tokens::ZERO {
        return Err(format!("`{text}`: the amount must be positive"));
    }
    let period = match unit.trim() {
        "s" | "sec" | "second" => Duration::from_secs(1),
        "m" | "min" | "minute" => Duration::from_secs(60),
        "h" | "hour" => Duration::from_secs(3_600),
        "d" | "day" => Duration::from_secs(86_400),
        _ => return Err(bad()),
    };
    Ok(RefillRate::new(amount, period))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_amounts_per_unit() {
        assert_eq!(rate("500/min"), Ok(RefillRate::per_minute(500)));
        assert_eq!(rate("10/s"), Ok(RefillRate::per_second(10)));
        assert_eq!(rate("1000 / hour"), Ok(RefillRate::per_hour(1000)));
        assert_eq!(rate("50000/day"), Ok(RefillRate::per_day(50_000)));
        assert_eq!(rate("1.5/s"), Ok("1.5".parse().unwrap()));
        for bad in ["500", "500/week", "x/min", "0/s", "-3/s", "/s"] {
            assert!(rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn definitions_say_what_is_missing() {
        let rpm = RefillRate::per_minute(500);
        assert_eq!(
            bucket(LimitType::Requests, None, Some(rpm), None, false),
            Ok(Bucket::requests(rpm))
        );
        assert_eq!(
            bucket(
                LimitType::Concurrent,
                Some(Tokens::new(5)),
                None,
                None,
                false
            ),
            Ok(Bucket::concurrent(5))
        );
        assert!(
            bucket(LimitType::Requests, None, None, None, false)
                .unwrap_err()
                .contains("refill rate")
        );
        assert!(
            bucket(LimitType::Concurrent, None, None, None, false)
                .unwrap_err()
                .contains("capacity")
        );
        assert!(
            bucket(
                LimitType::Concurrent,
                Some(Tokens::new(5)),
                Some(rpm),
                None,
                false
            )
            .unwrap_err()
            .contains("does not refill")
        );
        assert!(
            bucket(
                LimitType::Requests,
                Some(Tokens::new(2)),
                Some(rpm),
                Some(Tokens::new(3)),
                false
            )
            .is_err()
        );
        assert_eq!(
            bucket(LimitType::Requests, None, Some(rpm), None, true),
            Ok(Bucket::requests(rpm).lean())
        );
        assert!(
            bucket(
                LimitType::Concurrent,
                Some(Tokens::new(5)),
                None,
                None,
                true
            )
            .unwrap_err()
            .contains("cannot be lean")
        );
    }
}
