use proptest::prelude::*;

use super::*;
use crate::bucket::{Bucket, LimitType};
use crate::rate::RefillRate;

const T0: i64 = 1_700_000_000_000;

fn at(ms: i64) -> UnixMillis {
    UnixMillis::new(T0 + ms)
}

fn one_row(bucket: Bucket, tokens: i128) -> Vec<BucketState> {
    let mut row = BucketState::full("openai#rpm".parse().unwrap(), bucket, at(0));
    row.tokens = Tokens::from_nanos(tokens);
    vec![row]
}

fn total(rows: &[BucketState], now: UnixMillis) -> Tokens {
    rows.iter()
        .fold(Tokens::ZERO, |s, r| s.saturating_add(r.available(now)))
}

#[test]
fn shares_are_whole_tokens_and_the_rest_goes_to_the_first_shards() {
    let whole = Bucket::requests(RefillRate::per_minute(1_000))
        .with_capacity(10)
        .with_reserve("interactive".parse().unwrap(), 3);
    let d: Dimension = "openai#rpm".parse().unwrap();
    let caps: Vec<_> = (0..4)
        .map(|k| share(&d, &whole, 4, k).unwrap().capacity())
        .collect();
    assert_eq!(caps, [3, 3, 2, 2].map(Tokens::new));
    // The rate is split exactly: four shards refill what the whole does.
    let rate = share(&d, &whole, 4, 1).unwrap().refill_rate();
    assert_eq!(rate.scaled(4, 1), whole.refill_rate());
    assert_eq!(
        rate,
        RefillRate::new(250, std::time::Duration::from_secs(60))
    );
    // A shard that cannot hold one call is refused, with the reason.
    assert!(matches!(
        share(&d, &Bucket::requests(RefillRate::per_minute(3)), 4, 3),
        Err(ShardError::TooSmall { shards: 4, .. })
    ));
}

#[test]
fn a_bucket_spread_and_gathered_again_keeps_its_definition_and_tokens() {
    let whole = Bucket::tokens(RefillRate::per_minute(90_000)).with_capacity(90_000);
    let rows = one_row(whole.clone(), 12_345_678_901_234);
    let spread = reshard(&rows, 8, at(10)).unwrap();
    assert_eq!(spread.len(), 8);
    assert!(spread.iter().all(|r| r.shards == 8 && r.validate().is_ok()));
    assert_eq!(spread[3].dimension.as_str(), "openai#rpm#3");
    assert_eq!(self::whole(&spread).unwrap(), whole);
    assert_eq!(total(&spread, at(10)), total(&rows, at(10)));
    let back = reshard(&spread, 1, at(20)).unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].bucket, whole);
    assert_eq!(back[0].shards, 1);
    assert_eq!(total(&back, at(20)), total(&rows, at(20)));
    assert_eq!(back[0].version, rows[0].version + 2);
}

#[test]
fn concurrent_buckets_and_mismatched_rows_are_refused() {
    let rows = one_row(Bucket::concurrent(10), 10_000_000_000);
    assert!(matches!(
        reshard(&rows, 2, at(0)),
        Err(ShardError::Concurrent(_))
    ));
    let bucket = Bucket::requests(RefillRate::per_second(100));
    let mut spread = reshard(&one_row(bucket, 0), 4, at(0)).unwrap();
    assert!(matches!(
        reshard(&spread[..3], 2, at(1)),
        Err(ShardError::Inconsistent(..))
    ));
    spread[2].bucket = spread[2].bucket.clone().with_capacity(50);
    assert!(matches!(
        reshard(&spread, 2, at(1)),
        Err(ShardError::Inconsistent(..))
    ));
    assert!(matches!(
        reshard(&spread, 0, at(1)),
        Err(ShardError::Count(0))
    ));
    assert!(matches!(
        reshard(&spread, 33, at(1)),
        Err(ShardError::Count(33))
    ));
}

proptest! {
    #[test]
    fn parts_add_up_to_the_whole(nanos in -(1i128 << 100)..(1i128 << 100), n in 1u16..=32) {
        let sum: i128 = (0..n).map(|k| part(nanos, n, k)).sum();
        prop_assert_eq!(sum, nanos);
        let parts: Vec<i128> = (1..n).map(|k| part(nanos, n, k)).collect();
        // Shards other than 0 hold whole tokens, one apart at most.
        prop_assert!(parts.iter().all(|p| p % NANOS_PER_TOKEN == 0));
        if let (Some(lo), Some(hi)) = (parts.iter().min(), parts.iter().max()) {
            prop_assert!(hi - lo <= NANOS_PER_TOKEN);
        }
    }

    /// Rows spread, drained unevenly, left to refill and spread again, any number of
    /// times: the tokens of the whole are the same just before and just after every
    /// reshard, every row stays within its share, and together they refill at the
    /// whole's rate up to the whole's capacity.
    #[test]
    fn resharding_makes_and_loses_no_token(
        per_minute in 60u64..1_000_000,
        capacity in 100i64..1_000_000,
        start in 0i64..1_000_000,
        steps in prop::collection::vec((1u16..=32, 0u64..5_000, prop::collection::vec(0u8..=100, 1..32)), 1..6),
        kind in prop::bool::ANY,
    ) {
        let make = if kind { Bucket::requests } else { Bucket::tokens };
        let whole = make(RefillRate::per_minute(per_minute)).with_capacity(capacity);
        let mut rows = one_row(whole.clone(), i128::from(start.min(capacity)) * 1_000_000_000);
        let mut now = at(0);
        for (to, gap, drains) in steps {
            now = now.saturating_add(std::time::Duration::from_millis(gap));
            let next = reshard(&rows, to, now).unwrap();
            prop_assert_eq!(total(&next, now), total(&rows, now));
            prop_assert_eq!(self::whole(&next).unwrap(), whole.clone());
            for r in &next {
                prop_assert!(r.tokens <= r.holds());
                prop_assert!(r.validate().is_ok());
            }
            rows = next;
            // Uneven takes: each row loses the given percent of what it holds now.
            for (r, pct) in rows.iter_mut().zip(drains.iter().cycle()) {
                let level = r.refilled(now);
                let take = Tokens::from_nanos(level.tokens.as_nanos().max(0) * i128::from(*pct) / 100);
                r.set_level(crate::bucket::Level { tokens: level.tokens - take, ..level });
            }
        }
        prop_assert!(rows.iter().all(|r| r.bucket.limit_type() != LimitType::Concurrent));
    }
}
