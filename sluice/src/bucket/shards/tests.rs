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

/// `whole` in one row holding `start` tokens, or its capacity when that is less.
fn holding(whole: &Bucket, start: i64) -> Vec<BucketState> {
    let capacity = whole.capacity().as_nanos() / NANOS_PER_TOKEN;
    one_row(
        whole.clone(),
        i128::from(start).min(capacity) * NANOS_PER_TOKEN,
    )
}

/// Drains each of `rows` by its percent of `drains` (taken in turn) of what it holds at `now`.
fn drain(rows: &mut [BucketState], drains: &[u8], now: UnixMillis) {
    for (r, pct) in rows.iter_mut().zip(drains.iter().cycle()) {
        let level = r.refilled(now);
        let take = Tokens::from_nanos(level.tokens.as_nanos().max(0) * i128::from(*pct) / 100);
        r.set_level(crate::bucket::Level {
            tokens: level.tokens - take,
            ..level
        });
    }
}

/// A requests or tokens bucket of 100 to a million, refilling 60 to a million a minute, and
/// the tokens it starts with (up to a million: see [`holding`]).
fn any_whole() -> impl Strategy<Value = (Bucket, i64)> {
    (
        60u64..1_000_000,
        100i64..1_000_000,
        prop::bool::ANY,
        0i64..1_000_000,
    )
        .prop_map(|(per_minute, capacity, requests, start)| {
            let make = if requests {
                Bucket::requests
            } else {
                Bucket::tokens
            };
            (
                make(RefillRate::per_minute(per_minute)).with_capacity(capacity),
                start,
            )
        })
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
        (whole, start) in any_whole(),
        steps in prop::collection::vec((1u16..=32, 0u64..5_000, prop::collection::vec(0u8..=100, 1..32)), 1..6),
    ) {
        let mut rows = holding(&whole, start);
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
            drain(&mut rows, &drains, now);
        }
        prop_assert!(rows.iter().all(|r| r.bucket.limit_type() != LimitType::Concurrent));
    }
}

/// Rows spread over `first` rows from a bucket holding `start` tokens, each drained by its
/// percent of `drains` at `drained`.
fn spread_and_drained(
    whole: &Bucket,
    start: i64,
    first: u16,
    drains: &[u8],
    drained: UnixMillis,
) -> Vec<BucketState> {
    let mut rows = reshard(&holding(whole, start), first, at(0)).unwrap();
    drain(&mut rows, drains, drained);
    rows
}

#[test]
fn a_move_is_refused_once_its_row_was_refilled_since_the_read() {
    let whole = Bucket::requests(RefillRate::per_second(100)).with_capacity(1_000);
    let rows = spread_and_drained(&whole, 1_000, 4, &[50, 10, 90, 0], at(100));
    let next = reshard(&rows, 8, at(150)).unwrap();
    let moves = moves(&rows, &next, at(150), false);
    assert_eq!(moves.len(), 4);
    let mut folded = rows[2].clone();
    folded.set_level(folded.refilled(at(120)));
    let m = moves[2].as_ref().unwrap();
    assert!(m.holds(&rows[2]) && !m.holds(&folded));
    // A row another SDK wrote (no write id) is moved as a sluice row is; one with a
    // vendor-learned burst is left to the exact condition.
    let mut seed = rows.clone();
    seed[1].write_id = None;
    assert_eq!(super::moves(&seed, &next, at(150), false)[1], moves[1]);
    seed[1].burst = Some(seed[1].holds());
    assert!(super::moves(&seed, &next, at(150), false)[1].is_none());
}

proptest! {
    /// A reshard racing other writers: the rows are read, then takes and gives land on the
    /// rows that stay (commuting changes: the tokens move, the refill timestamps do not)
    /// before the moves do. With nothing landed, every move holds and leaves its row
    /// exactly at its part. Otherwise, wherever every move still holds, the rows end with
    /// exactly the tokens the whole has at the reshard's instant (what the others did
    /// included), each within its new bounds.
    #[test]
    fn moves_keep_the_whole_whatever_other_writers_did(
        (whole, start) in any_whole(),
        first in 1u16..=32,
        to in 1u16..=32,
        gaps in (0u64..5_000, 0u64..5_000),
        drains in prop::collection::vec(0u8..=100, 1..32),
        others in prop::collection::vec(-2_000i64..2_000, 1..32),
        raced in prop::bool::ANY,
        seeded in prop::bool::ANY,
    ) {
        let drained = at(0).saturating_add(std::time::Duration::from_millis(gaps.0));
        let mut rows = spread_and_drained(&whole, start, first, &drains, drained);
        if seeded {
            // Written whole by another SDK since: no write id.
            for r in &mut rows {
                r.write_id = None;
                r.recent_writes = RecentWrites::default();
            }
        }
        let now = drained.saturating_add(std::time::Duration::from_millis(gaps.1));
        let next = reshard(&rows, to, now).unwrap();
        let moves = moves(&rows, &next, now, raced);
        let staying = rows.len().min(next.len());
        prop_assert_eq!(moves.len(), staying);
        // What a move after a lost race may drop: 1% of each row it moves.
        let mut may_drop = Tokens::ZERO;
        for (k, m) in moves.iter().enumerate() {
            let m = m.as_ref().expect("every row is moved");
            prop_assert!(m.holds(&rows[k]));
            let level = m.applied(&rows[k]);
            prop_assert_eq!(level.last_refill_at, now);
            if raced {
                may_drop += Tokens::from_nanos(rows[k].holds().as_nanos() / 100);
                prop_assert!(level.tokens <= next[k].tokens);
                prop_assert!(next[k].tokens - level.tokens <= Tokens::from_nanos(rows[k].holds().as_nanos() / 100));
            } else {
                prop_assert_eq!(level.tokens, next[k].tokens);
            }
        }
        // Others' takes and gives, in thousandths of a token, on the rows that stay.
        let mut stored = rows.clone();
        for (r, d) in stored.iter_mut().take(staying).zip(others.iter().cycle()) {
            r.tokens += Tokens::from_nanos(i128::from(*d) * 1_000_000);
        }
        let all_hold = (0..staying).all(|k| moves[k].as_ref().is_some_and(|m| m.holds(&stored[k])));
        if all_hold {
            let mut after = Tokens::ZERO;
            for (k, new) in next.iter().enumerate() {
                let tokens = match moves.get(k) {
                    Some(m) => m.as_ref().unwrap().applied(&stored[k]).tokens,
                    None => new.tokens,
                };
                prop_assert!(tokens <= new.holds(), "row {} over its bounds", k);
                prop_assert!(tokens >= new.tokens.min(Tokens::ZERO), "row {} under its bounds", k);
                after = after.saturating_add(tokens);
            }
            // Never more than the whole holds; exactly it, or (after a lost race) at most
            // 1% of each moved row less.
            let whole_now = total(&stored, now);
            prop_assert!(after <= whole_now);
            prop_assert!(whole_now - after <= may_drop);
            if !raced {
                prop_assert_eq!(after, whole_now);
            }
        }
    }
}

#[test]
fn a_reshard_by_a_clock_behind_the_rows_refill_earns_nothing_twice() {
    // Refilled by another writer at 2 s; the resharding clock says 0 s.
    let whole = Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000);
    let mut rows = one_row(whole, 350 * 1_000_000_000);
    rows[0].last_refill_at = at(2_000);
    for to in [4, 1] {
        let spread = reshard(&rows, to, at(0)).unwrap();
        for t in [2_000, 3_000, 9_000] {
            assert_eq!(
                total(&spread, at(t)),
                total(&rows, at(t)),
                "{to} rows at {t} ms"
            );
        }
        assert!(spread.iter().all(|r| r.last_refill_at >= at(2_000)));
    }
}

#[test]
fn a_row_filled_ahead_makes_the_others_refill_nothing_early() {
    // Two rows of 100 a second: one refilled to now (0 s), one filled ahead to 1 s.
    let whole = Bucket::tokens(RefillRate::per_second(200)).with_capacity(1_000);
    let mut rows = reshard(&one_row(whole, 600 * 1_000_000_000), 2, at(0)).unwrap();
    rows[0].tokens = Tokens::new(100);
    rows[1].tokens = Tokens::new(400);
    rows[1].last_refill_at = at(1_000);
    let moved = moves(&rows, &reshard(&rows, 2, at(0)).unwrap(), at(0), false);
    assert!(moved.iter().all(Option::is_some), "{moved:?}");
    for to in [1, 2, 4] {
        let spread = reshard(&rows, to, at(0)).unwrap();
        // No more at any instant than the rows had (the first row's refill until 1 s is
        // dropped, not granted before it comes), and the same from 1 s on.
        for t in [0, 500, 999] {
            assert_eq!(
                total(&spread, at(t)),
                Tokens::new(500),
                "{to} rows at {t} ms"
            );
            assert!(total(&spread, at(t)) <= total(&rows, at(t)));
        }
        assert_eq!(total(&spread, at(2_000)), Tokens::new(700), "{to} rows");
        assert!(spread.iter().all(|r| r.last_refill_at == at(1_000)));
    }
}
