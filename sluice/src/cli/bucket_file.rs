//! The bucket file `sluice apply` reads: one TOML table per dimension.
//!
//! ```toml
//! ["openai#rpm"]
//! type = "requests"
//! refill = "500/min"
//! capacity = 500        # optional for requests/tokens: one minute of refill
//! cost_per_call = 1     # optional
//! lean = true           # optional: no lease rows (requests/tokens only)
//! max_shards = 8        # optional: spread over 8 rows at most (`shards = 4`: always 4)
//!
//! ["openai#tpm"]
//! type = "tokens"
//! refill = "2000000/min"
//! # optional, highest priority first: tokens, or a share of the capacity
//! reserves = [{ priority = "interactive", reserve = "20%" }]
//!
//! ["elevenlabs#concurrent"]
//! type = "concurrent"
//! capacity = 10
//! ```

use std::collections::BTreeMap;

use crate::{Bucket, Dimension};

/// Reads a bucket file; every problem names the dimension and what was expected. Each entry
/// is read as [`Bucket`]'s `Deserialize` reads it (the `serde` feature).
pub fn parse(text: &str) -> Result<Vec<(Dimension, Bucket)>, String> {
    let entries: BTreeMap<String, toml::Value> = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut buckets = Vec::with_capacity(entries.len());
    for (name, entry) in entries {
        let dimension = Dimension::new(&name).map_err(|e| format!("[\"{name}\"]: {e}"))?;
        let bucket: Bucket = entry.try_into().map_err(|e: toml::de::Error| {
            format!(
                "[\"{name}\"]: {}",
                e.to_string().trim_end().replace('\n', " ")
            )
        })?;
        // A table named for a key is that key's own definition (an override).
        let bucket = match dimension.key() {
            Some(_) => bucket.overriding(),
            None => bucket,
        };
        buckets.push((dimension, bucket));
    }
    Ok(buckets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RefillRate;

    const FILE: &str = r#"
["anthropic#rpm"]
type = "requests"
refill = "50/min"
capacity = 50

["anthropic#tpm"]
type = "tokens"
refill = "400000/min"
cost_per_call = "500"
lean = true
shards = 4
reserves = [{ priority = "interactive", reserve = "20%" }, { priority = "standard", reserve = 100000 }]

["elevenlabs#concurrent"]
type = "concurrent"
capacity = 10
"#;

    #[test]
    fn a_file_reads_into_buckets() {
        let buckets = parse(FILE).unwrap();
        let get = |d: &str| {
            buckets
                .iter()
                .find(|(x, _)| x.as_str() == d)
                .unwrap()
                .1
                .clone()
        };
        assert_eq!(
            get("anthropic#rpm"),
            Bucket::requests(RefillRate::per_minute(50)).with_capacity(50)
        );
        assert_eq!(
            get("anthropic#tpm"),
            Bucket::tokens(RefillRate::per_minute(400_000))
                .with_cost_per_call(500)
                .lean()
                .with_reserve("interactive".parse().unwrap(), 80_000)
                .with_reserve("standard".parse().unwrap(), 100_000)
                .with_shards(crate::ShardLimit::Pinned(4))
        );
        assert_eq!(get("elevenlabs#concurrent"), Bucket::concurrent(10));
    }

    proptest::proptest! {
        /// Any rate, written as its text form in a bucket file, reads back as itself.
        #[test]
        fn a_rate_in_a_bucket_file_reads_back_exactly(
            rate in crate::bucket::testing::any_rate_in_nanos(),
        ) {
            let file = format!("[\"a#b\"]\ntype = \"tokens\"\ncapacity = 10\nrefill = \"{rate}\"\n");
            let read = parse(&file).unwrap();
            proptest::prop_assert_eq!(read[0].1.refill_rate(), rate, "{}", file);
        }
    }

    #[test]
    fn bad_files_say_where_and_what() {
        let cases = [
            (
                "[\"openai#rpm\"]\ntype = \"requests\"\n",
                "openai#rpm",
                "refill rate",
            ),
            (
                "[\"openai\"]\ntype = \"concurrent\"\ncapacity = 1\n",
                "openai",
                "exactly one `#`",
            ),
            (
                "[\"a#b\"]\ntype = \"bursty\"\n",
                "a#b",
                "unknown limit type",
            ),
            (
                "[\"a#b\"]\ntype = \"concurrent\"\ncapacty = 1\n",
                "a#b",
                "unknown field `capacty`",
            ),
            (
                "[\"a#b\"]\ntype = \"requests\"\nrefill = \"fast\"\n",
                "a#b",
                "`fast` is not a rate like 500/min, 10/s, 1000/h, 50000/day or 1/week in `refill`",
            ),
            (
                "[\"a#b\"]\ntype = \"concurrent\"\ncapacity = true\n",
                "a#b",
                "expected a number of tokens, as a number or a decimal string in `capacity`",
            ),
            (
                "[\"a#b\"]\ntype = \"concurrent\"\ncapacity = 2\nreserves = [{ priority = \"x y\", reserve = 1 }]\n",
                "a#b",
                "priority `x y`",
            ),
            (
                "[\"a#b\"]\ntype = \"concurrent\"\ncapacity = 2\nreserves = [{ priority = \"x\", reserve = 3 }]\n",
                "a#b",
                "more than the capacity",
            ),
            (
                "[\"a#b\"]\ntype = \"concurrent\"\ncapacity = 2\nreserves = [{ priority = \"x\", share = 1 }]\n",
                "a#b",
                "unknown field `share`",
            ),
            ("not toml [", "", ""),
        ];
        for (text, place, what) in cases {
            let e = parse(text).unwrap_err();
            assert!(e.contains(place) && e.contains(what), "{text:?}: {e}");
        }
    }
}
