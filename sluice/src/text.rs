//! Bucket definitions as people write them (`500/min`, `interactive=20%`, a type with a
//! capacity and a refill): read by the operator binary's flags and bucket file, and by the
//! `serde` feature's `Deserialize` for [`Bucket`].

// Public through the operator binary's hidden `__cli` module; without it, only what the
// `serde` feature reads is used.
#![cfg_attr(not(feature = "cli"), allow(unreachable_pub, dead_code))]

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

/// A refill rate: `AMOUNT/UNIT` with UNIT one of ms, s, min, h, day, week (long names
/// too), optionally a multiple of it (`7/7.001s`, `1/2h`), kept exactly.
pub fn rate(text: &str) -> Result<RefillRate, String> {
    let bad = || format!("`{text}` is not a rate like 500/min, 10/s, 1000/h, 50000/day or 1/week");
    let rate = crate::rate::parse(text, false, crate::Rounding::Exact).map_err(|e| match e {
        crate::DecimalError::Malformed(_) => bad(),
        other => format!("`{text}`: {other}"),
    })?;
    if rate <= RefillRate::ZERO {
        return Err(format!("`{text}`: the amount must be positive"));
    }
    Ok(rate)
}
