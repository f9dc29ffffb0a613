//! What the `sluice` operator binary reads from its users, kept in the library so the
//! fuzz harness reaches it too; not a public API.
//!
//! The binary's command-line definitions (`--type`, `--refill`, `--reserve`, …) and its
//! bucket file (`sluice apply`) both end in [`bucket`]; refill rates are read by [`rate`],
//! reserves by [`reserve`] and [`amount`]; the file is read by [`parse`].

mod bucket_file;

use std::time::Duration;

pub use bucket_file::parse;

use crate::{Bucket, LimitType, Priority, RefillRate, Reserve, Tokens};

/// A reserve's size as written: tokens, or a percentage of the bucket's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// So many tokens.
    Tokens(Tokens),
    /// This percentage of the capacity (a decimal, e.g. `12.5`).
    Percent(Tokens),
}

impl Amount {
    /// The tokens this amount is of a bucket holding `capacity`, rounded down to a
    /// billionth of a token.
    pub fn of(self, capacity: Tokens) -> Tokens {
        match self {
            Amount::Tokens(t) => t,
            Amount::Percent(p) => Tokens::from_nanos(
                capacity.as_nanos().saturating_mul(p.as_nanos()) / (100 * 1_000_000_000),
            ),
        }
    }
}

/// A reserve's size: `400000` (tokens) or `20%` (of the capacity, above 0 and at most 100).
pub fn amount(text: &str) -> Result<Amount, String> {
    let text = text.trim();
    let (number, percent) = match text.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None => (text, false),
    };
    let value: Tokens = number
        .parse()
        .map_err(|e| format!("`{text}` is not a number of tokens or a percentage ({e})"))?;
    if value <= Tokens::ZERO || (percent && value > Tokens::new(100)) {
        return Err(format!(
            "`{text}`: a reserve must be positive{}",
            if percent { " and at most 100%" } else { "" }
        ));
    }
    Ok(if percent {
        Amount::Percent(value)
    } else {
        Amount::Tokens(value)
    })
}

/// A reserve written `PRIORITY=AMOUNT`, e.g. `interactive=20%` (see [`amount`]).
pub fn reserve(text: &str) -> Result<(Priority, Amount), String> {
    let (name, size) = text.split_once('=').ok_or_else(|| {
        format!("`{text}` is not a reserve like interactive=20% or interactive=400000")
    })?;
    let priority = Priority::new(name.trim()).map_err(|e| e.to_string())?;
    Ok((priority, amount(size)?))
}

/// Builds a bucket from its parts, saying what is missing or contradictory. `reserves`
/// are listed highest priority first.
pub fn bucket(
    limit_type: LimitType,
    capacity: Option<Tokens>,
    refill: Option<RefillRate>,
    cost_per_call: Option<Tokens>,
    lean: bool,
    reserves: &[(Priority, Amount)],
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
    let capacity = bucket.capacity();
    let slots = limit_type == LimitType::Concurrent;
    let bucket = bucket.with_reserves(
        reserves
            .iter()
            .map(|(priority, amount)| Reserve {
                priority: priority.clone(),
                // A share of a `concurrent` bucket's slots is whole slots, rounded up.
                tokens: if slots {
                    whole_up(amount.of(capacity))
                } else {
                    amount.of(capacity)
                },
            })
            .collect(),
    );
    bucket.validate().map_err(|e| e.to_string())?;
    Ok(bucket)
}

/// `tokens` rounded up to a whole token.
fn whole_up(tokens: Tokens) -> Tokens {
    let one = crate::tokens::NANOS_PER_TOKEN;
    let n = tokens.as_nanos();
    Tokens::from_nanos(
        n.saturating_add(one - 1)
            .div_euclid(one)
            .saturating_mul(one),
    )
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
    fn reserves_are_tokens_or_shares_of_the_capacity() {
        let p = |s: &str| Priority::new(s).unwrap();
        assert_eq!(
            reserve("interactive=20%"),
            Ok((p("interactive"), Amount::Percent(Tokens::new(20))))
        );
        assert_eq!(
            reserve(" batch = 1.5 "),
            Ok((p("batch"), Amount::Tokens("1.5".parse().unwrap())))
        );
        for bad in [
            "interactive",
            "a b=3",
            "x=0",
            "x=-1%",
            "x=101%",
            "x=lots",
            "=3",
        ] {
            assert!(reserve(bad).is_err(), "{bad}");
        }
        let tpm = bucket(
            LimitType::Tokens,
            None,
            Some(RefillRate::per_minute(2_000_000)),
            None,
            false,
            &[
                (p("interactive"), Amount::Percent("12.5".parse().unwrap())),
                (p("standard"), Amount::Tokens(Tokens::new(100_000))),
            ],
        )
        .unwrap();
        assert_eq!(tpm.floor_for(Some(&p("standard"))), Tokens::new(250_000));
        assert_eq!(tpm.floor_for(Some(&p("batch"))), Tokens::new(350_000));
        let too_much = bucket(
            LimitType::Concurrent,
            Some(Tokens::new(4)),
            None,
            None,
            false,
            &[
                (p("a"), Amount::Percent(Tokens::new(60))),
                (p("b"), Amount::Percent(Tokens::new(60))),
            ],
        );
        assert!(too_much.unwrap_err().contains("more than the capacity"));
        // A quarter of 10 slots is 3 slots kept free, not 2.5.
        let voice = bucket(
            LimitType::Concurrent,
            Some(Tokens::new(10)),
            None,
            None,
            false,
            &[(p("live"), Amount::Percent(Tokens::new(25)))],
        )
        .unwrap();
        assert_eq!(voice.reserved(), Tokens::new(3));
    }

    #[test]
    fn definitions_say_what_is_missing() {
        let rpm = RefillRate::per_minute(500);
        assert_eq!(
            bucket(LimitType::Requests, None, Some(rpm), None, false, &[]),
            Ok(Bucket::requests(rpm))
        );
        assert_eq!(
            bucket(
                LimitType::Concurrent,
                Some(Tokens::new(5)),
                None,
                None,
                false,
                &[]
            ),
            Ok(Bucket::concurrent(5))
        );
        assert!(
            bucket(LimitType::Requests, None, None, None, false, &[])
                .unwrap_err()
                .contains("refill rate")
        );
        assert!(
            bucket(LimitType::Concurrent, None, None, None, false, &[])
                .unwrap_err()
                .contains("capacity")
        );
        assert!(
            bucket(
                LimitType::Concurrent,
                Some(Tokens::new(5)),
                Some(rpm),
                None,
                false,
                &[]
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
                false,
                &[]
            )
            .is_err()
        );
        assert_eq!(
            bucket(LimitType::Requests, None, Some(rpm), None, true, &[]),
            Ok(Bucket::requests(rpm).lean())
        );
        assert!(
            bucket(
                LimitType::Concurrent,
                Some(Tokens::new(5)),
                None,
                None,
                true,
                &[]
            )
            .unwrap_err()
            .contains("cannot be lean")
        );
    }
}
