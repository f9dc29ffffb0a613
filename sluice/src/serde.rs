//! `Serialize` and `Deserialize` for the configuration types (feature `serde`), in the words
//! people write them: names as strings, token amounts as exact decimal strings (numbers are
//! read too), refill rates as `AMOUNT/UNIT`, and a [`Bucket`] as one entry of
//! `sluice apply`'s file. Every value is checked as it is read, with the same rules and
//! messages as the constructors; as in that file, a `concurrent` bucket's reserves are whole
//! slots (a fraction is rounded up).
//!
//! ```
//! use sluice::{Bucket, RefillRate};
//!
//! let bucket: Bucket = serde_json::from_str(
//!     r#"{"type": "requests", "refill": "500/min", "capacity": 500,
//!         "reserves": [{"priority": "interactive", "reserve": "20%"}]}"#,
//! )?;
//! assert_eq!(bucket.refill_rate(), RefillRate::per_minute(500));
//! assert_eq!(bucket.reserves()[0].tokens, 100.into());
//!
//! // Written back as itself (the reserve as the tokens it came to).
//! let text = serde_json::to_string(&bucket)?;
//! assert_eq!(serde_json::from_str::<Bucket>(&text)?, bucket);
//! # Ok::<(), serde_json::Error>(())
//! ```

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::text::{Amount, amount, bucket, rate};
use crate::{Bucket, Dimension, LimitType, Mode, Priority, RefillRate, ShardLimit, Tokens};

mod schedule;
use schedule::{
    WindowDefinition, reserve_amounts, reserve_definitions, window_definitions, windows,
};

/// Serializes as the value's `Display` text.
macro_rules! as_text {
    ($($ty:ty),*) => {$(
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }
    )*};
}

as_text!(Dimension, Priority, LimitType, Tokens);

/// Deserializes from a string, through the type's checked parser.
macro_rules! from_text {
    ($($ty:ty),*) => {$(
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(de::Error::custom)
            }
        }
    )*};
}

from_text!(Dimension, Priority, LimitType);

/// A number or a decimal string, as its exact decimal text.
struct Decimal;

impl Visitor<'_> for Decimal {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number of tokens, as a number or a decimal string")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        // The shortest text that reads back as this float, e.g. `0.5`.
        Ok(v.to_string())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }
}

/// A decimal's text from a number or a string; from a string only in formats that do not
/// describe themselves (bincode, postcard), where every decimal is written as a string.
fn decimal<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    if deserializer.is_human_readable() {
        deserializer.deserialize_any(Decimal)
    } else {
        deserializer.deserialize_str(Decimal)
    }
}

impl<'de> Deserialize<'de> for Tokens {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        decimal(deserializer)?.parse().map_err(de::Error::custom)
    }
}

impl Serialize for RefillRate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RefillRate {
    /// `AMOUNT/UNIT` (`500/min`, `10/s`, `1000/h`, `50000/day`); a bare number is refused,
    /// as its unit would be a guess.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // A number is read too, to be refused with what a rate looks like.
        rate(&decimal(deserializer)?).map_err(de::Error::custom)
    }
}

/// A bucket as written in `sluice apply`'s file.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Definition {
    #[serde(rename = "type")]
    limit_type: LimitType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    capacity: Option<Tokens>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refill: Option<RefillRate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cost_per_call: Option<Tokens>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    lean: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    reserves: Vec<ReserveDefinition>,
    /// Pinned to this many rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shards: Option<u16>,
    /// Spread over this many rows at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_shards: Option<u16>,
    /// `shadow`: never refuse, count what would have been refused.
    #[serde(default, skip_serializing_if = "is_enforce")]
    mode: Mode,
    /// Other limits in daily windows (UTC).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    schedule: Vec<WindowDefinition>,
    /// A template: a bucket per key (see [`Bucket::keyed`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    keyed: bool,
}

fn is_enforce(mode: &Mode) -> bool {
    *mode == Mode::Enforce
}

impl Serialize for Mode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(de::Error::custom)
    }
}

/// One reserve: tokens, or `"20%"` of the capacity.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveDefinition {
    priority: Priority,
    reserve: ReserveAmount,
}

/// A reserve's size as written: a number of tokens or a percentage string.
struct ReserveAmount(Amount);

impl Serialize for ReserveAmount {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Amount::Tokens(t) => t.serialize(serializer),
            Amount::Percent(p) => serializer.collect_str(&format_args!("{p}%")),
        }
    }
}

impl<'de> Deserialize<'de> for ReserveAmount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        amount(&decimal(deserializer)?)
            .map(ReserveAmount)
            .map_err(de::Error::custom)
    }
}

impl Serialize for Bucket {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let limited = self.limit_type() != LimitType::Concurrent;
        // A scheduled bucket is written with its own limits, whichever window holds now.
        let own = self
            .schedule()
            .map(|s| self.clone().with_limits_of(s.base()));
        let own = own.as_ref().unwrap_or(self);
        Definition {
            limit_type: self.limit_type(),
            capacity: Some(own.capacity()),
            refill: limited.then(|| own.refill_rate()),
            cost_per_call: Some(self.cost_per_call()),
            lean: !self.keeps_leases(),
            reserves: reserve_definitions(own.reserves()),
            schedule: self
                .schedule()
                .map_or_else(Vec::new, |s| window_definitions(s, limited)),
            shards: match self.shard_limit() {
                Some(ShardLimit::Pinned(n)) => Some(n),
                _ => None,
            },
            max_shards: match self.shard_limit() {
                Some(ShardLimit::AtMost(n)) => Some(n),
                _ => None,
            },
            mode: self.mode(),
            keyed: self.is_keyed(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Bucket {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let d = Definition::deserialize(deserializer)?;
        let reserves = reserve_amounts(&d.reserves);
        let windows = windows(&d, &reserves).map_err(de::Error::custom)?;
        let bucket = bucket(
            d.limit_type,
            d.capacity,
            d.refill,
            d.cost_per_call,
            d.lean,
            &reserves,
        )
        .map_err(de::Error::custom)?
        .with_mode(d.mode)
        .with_schedule(windows);
        let bucket = if d.keyed { bucket.keyed() } else { bucket };
        bucket.validate().map_err(de::Error::custom)?;
        let limit = match (d.shards, d.max_shards) {
            (None, None) => return Ok(bucket),
            (Some(n), None) => ShardLimit::Pinned(n),
            (None, Some(n)) => ShardLimit::AtMost(n),
            (Some(_), Some(_)) => {
                return Err(de::Error::custom(
                    "give `shards` (pinned) or `max_shards` (at most), not both",
                ));
            }
        };
        let bucket = bucket.with_shards(limit);
        bucket.validate().map_err(de::Error::custom)?;
        Ok(bucket)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn read<T: for<'de> Deserialize<'de>>(json: &str) -> Result<T, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn names_are_strings_checked_as_they_are_read() {
        let d: Dimension = read(r#""openai#rpm""#).unwrap();
        assert_eq!(serde_json::to_string(&d).unwrap(), r#""openai#rpm""#);
        assert!(
            read::<Dimension>(r#""openai""#)
                .unwrap_err()
                .contains("exactly one `#`")
        );
        assert!(read::<Priority>(r#""a b""#).is_err());
        let t: LimitType = read(r#""concurrent""#).unwrap();
        assert_eq!(t, LimitType::Concurrent);
        assert!(read::<LimitType>(r#""slots""#).is_err());
    }

    #[test]
    fn tokens_and_rates_are_exact_decimals() {
        assert_eq!(read::<Tokens>("500").unwrap(), Tokens::new(500));
        assert_eq!(read::<Tokens>("0.5").unwrap(), "0.5".parse().unwrap());
        assert_eq!(
            read::<Tokens>(r#""8.333333""#).unwrap(),
            "8.333333".parse().unwrap()
        );
        assert!(read::<Tokens>(r#""lots""#).is_err());
        assert_eq!(
            serde_json::to_string(&"1.25".parse::<Tokens>().unwrap()).unwrap(),
            r#""1.25""#
        );
        assert_eq!(
            read::<RefillRate>(r#""500/min""#).unwrap(),
            RefillRate::per_minute(500)
        );
        assert!(
            read::<RefillRate>("10").is_err(),
            "a bare number has no unit"
        );
        // Exactly, whatever the period.
        let fine: RefillRate = read(r#""0.000000001/s""#).unwrap();
        assert_eq!(fine, RefillRate::from_nanos_per_second(1));
        let json = serde_json::to_string(&fine).unwrap();
        assert_eq!(read::<RefillRate>(&json).unwrap(), fine);
        assert_eq!(
            serde_json::to_string(&RefillRate::per_minute(500)).unwrap(),
            r#""500/min""#
        );
        assert_eq!(
            read::<RefillRate>(r#""3/week""#).unwrap(),
            RefillRate::per_week(3)
        );
        assert!(read::<RefillRate>(r#""500/fortnight""#).is_err());
    }

    #[test]
    fn buckets_are_read_as_in_the_apply_file_and_checked() {
        let slots: Bucket = read(r#"{"type": "concurrent", "capacity": 10}"#).unwrap();
        assert_eq!(slots, Bucket::concurrent(10));
        let rpm: Bucket =
            read(r#"{"type": "requests", "refill": "60/min", "lean": true}"#).unwrap();
        assert_eq!(rpm, Bucket::requests(RefillRate::per_minute(60)).lean());
        let pinned: Bucket =
            read(r#"{"type": "requests", "refill": "60/min", "shards": 4}"#).unwrap();
        assert_eq!(pinned.shard_limit(), Some(ShardLimit::Pinned(4)));
        let capped: Bucket =
            read(r#"{"type": "tokens", "refill": "60/min", "max_shards": 8}"#).unwrap();
        assert_eq!(capped.shard_limit(), Some(ShardLimit::AtMost(8)));
        let json = serde_json::to_string(&capped).unwrap();
        assert_eq!(read::<Bucket>(&json).unwrap(), capped);
        let cases = [
            (r#"{"type": "requests"}"#, "needs a refill rate"),
            (
                r#"{"type": "concurrent", "capacity": 2, "refill": "1/s"}"#,
                "does not refill",
            ),
            (
                r#"{"type": "tokens", "refill": "1/s", "capacty": 5}"#,
                "unknown field `capacty`",
            ),
            (
                r#"{"type": "tokens", "refill": "10/s", "capacity": 5, "cost_per_call": 6}"#,
                "cost per call",
            ),
            (
                r#"{"type": "concurrent", "capacity": 4, "reserves": [{"priority": "x", "reserve": "150%"}]}"#,
                "at most 100%",
            ),
            (
                r#"{"type": "requests", "refill": "1/s", "shards": 2, "max_shards": 4}"#,
                "not both",
            ),
            (
                r#"{"type": "requests", "refill": "1/s", "max_shards": 33}"#,
                "1 to 32 rows",
            ),
            (
                r#"{"type": "concurrent", "capacity": 4, "shards": 2}"#,
                "1 to 32 rows",
            ),
        ];
        for (json, message) in cases {
            let error = read::<Bucket>(json).unwrap_err();
            assert!(error.contains(message), "{json}: {error}");
        }
    }

    fn any_bucket() -> impl Strategy<Value = Bucket> {
        let limit = prop_oneof![
            Just(LimitType::Requests),
            Just(LimitType::Tokens),
            Just(LimitType::Concurrent)
        ];
        // Any amount (in billionths) per any period (in nanoseconds).
        let rate = (1i128..1_000_000_000_000_000, 1u64..1_000_000_000_000_000).prop_map(
            |(amount, period)| {
                RefillRate::new(
                    Tokens::from_nanos(amount),
                    std::time::Duration::from_nanos(period),
                )
            },
        );
        (
            limit,
            1u64..1_000_000,
            rate,
            (any::<bool>(), any::<bool>()),
            0u8..3,
            1u64..40,
        )
            .prop_map(|(limit, capacity, rate, (lean, keyed), reserves, share)| {
                let b = match limit {
                    LimitType::Concurrent => Bucket::concurrent(capacity),
                    LimitType::Requests => Bucket::requests(rate).with_capacity(capacity),
                    LimitType::Tokens => Bucket::tokens(rate).with_capacity(capacity),
                };
                let mut b = if lean && limit != LimitType::Concurrent {
                    b.lean()
                } else {
                    b
                };
                // Reserves of `share` percent of the capacity each: fractional tokens, or
                // whole slots (as a slot reserve is read).
                let mut reserve = b.capacity().as_nanos() * i128::from(share) / 100;
                if limit == LimitType::Concurrent {
                    reserve = reserve.div_euclid(1_000_000_000).max(1) * 1_000_000_000;
                }
                let reserve = Tokens::from_nanos(reserve);
                for name in ["interactive", "standard"]
                    .iter()
                    .take(usize::from(reserves))
                {
                    b = b.with_reserve(name.parse().unwrap(), reserve);
                }
                if keyed { b.keyed() } else { b }
            })
    }

    proptest! {
        #[test]
        fn any_valid_bucket_reads_back_as_itself(bucket in any_bucket()) {
            prop_assume!(bucket.validate().is_ok());
            let json = serde_json::to_string(&bucket).unwrap();
            let back: Bucket = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(back, bucket, "{}", json);
        }
    }
}
