//! Refill's exactness: whole periods of any rate, many writes or one.

use std::time::Duration;

use proptest::prelude::*;

use super::Level;
use crate::bucket::{Bucket, BucketState, LimitType, Take, refill};
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::rate::RefillRate;
use crate::tokens::Tokens;

fn dim() -> Dimension {
    Dimension::new("mail#daily").unwrap()
}

/// A period from a second to a week, in whole milliseconds, or one of the named ones.
fn any_period_ms() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(1_000u64),
        Just(60_000),
        Just(3_600_000),
        Just(86_400_000),
        Just(604_800_000),
        1_000u64..=604_800_000,
    ]
}

/// The instants of other clients' writes: each of `offsets` from `t0`, modulo `span_ms`, in
/// order.
fn writes_within(t0: UnixMillis, span_ms: u64, offsets: &[u64]) -> Vec<UnixMillis> {
    let mut writes: Vec<UnixMillis> = offsets
        .iter()
        .map(|w| t0.saturating_add(Duration::from_millis(w % span_ms)))
        .collect();
    writes.sort();
    writes
}

/// A bucket `row`, refilled and written back at each of the instants `writes` (other
/// clients' writes that change nothing else), then read at `at`.
fn written_at(mut row: BucketState, writes: &[UnixMillis], at: UnixMillis) -> Level {
    for &t in writes {
        let level = row.refilled(t);
        row.set_level(level);
    }
    row.refilled(at)
}

proptest! {
    /// Drained to zero, a bucket holds exactly `min(capacity, k·n)` after `k` whole
    /// periods of `n` per period, however often other writes refilled it in between; and
    /// the wait it gives for one more token is exact to the millisecond.
    #[test]
    fn whole_periods_refill_exactly_and_the_next_token_waits_exactly(
        n in 1u64..10_000,
        period_ms in any_period_ms(),
        capacity in 1u64..1_000_000,
        k in 1u32..20,
        writes in proptest::collection::vec(0u64..1_000_000, 0..40),
    ) {
        let period = Duration::from_millis(period_ms);
        let rate = RefillRate::new(n, period);
        let t0 = UnixMillis::new(1_700_000_000_000);
        let mut row = BucketState::full(
            dim(),
            Bucket::tokens(rate).with_capacity(capacity),
            t0,
        );
        // Drained: everything taken at once.
        let Take::Granted { level } = row.take(row.bucket.capacity(), t0) else {
            panic!("a full bucket grants its capacity");
        };
        prop_assert_eq!(level.tokens, Tokens::ZERO);
        row.set_level(level);
        let end = t0.saturating_add(period * k);
        let writes = writes_within(t0, period_ms * u64::from(k), &writes);
        let expected = Tokens::from(n * u64::from(k)).min(Tokens::from(capacity));
        let level = written_at(row.clone(), &writes, end);
        prop_assert_eq!(level.tokens, expected);
        // One more token than that: exact, if the bucket is not full.
        if expected < Tokens::from(capacity) {
            let mut at_end = row.clone();
            at_end.set_level(level);
            let wait = match at_end.take(expected + Tokens::new(1), end) {
                Take::Short { wait: Some(wait) } => wait,
                other => panic!("{other:?}"),
            };
            // n per period: the next token comes period / n after the last whole period.
            let exact_ns = period.as_nanos() / u128::from(n);
            let exact_ms = exact_ns.div_ceil(1_000_000).max(1);
            prop_assert_eq!(wait.as_millis(), exact_ms);
            let before = end.saturating_add(wait - Duration::from_millis(1));
            let one_more = expected + Tokens::new(1);
            prop_assert!(matches!(at_end.take(one_more, before), Take::Short { .. }), "granted early");
            prop_assert!(
                matches!(at_end.take(one_more, end.saturating_add(wait)), Take::Granted { .. }),
                "not granted at its RetryIn"
            );
        }
    }

    /// The same for any rate `RefillRate::new` builds, over whole periods that end on a
    /// millisecond.
    #[test]
    fn any_amount_over_any_period_refills_exactly_per_period(
        amount in 1i128..1_000_000_000_000,
        period_ns in 1u64..1_000_000_000_000,
        k in 1u32..5,
        writes in proptest::collection::vec(0u64..1_000_000_000, 0..20),
    ) {
        let period = Duration::from_nanos(period_ns);
        let amount = Tokens::from_nanos(amount);
        let rate = RefillRate::new(amount, period);
        // Enough whole periods to end on a millisecond.
        let per_ms = 1_000_000 / gcd(period_ns, 1_000_000);
        let periods = u32::try_from(per_ms).unwrap() * k;
        let t0 = UnixMillis::new(1_700_000_000_000);
        let mut row = BucketState::full(dim(), Bucket::tokens(rate).with_capacity(Tokens::MAX), t0);
        row.tokens = Tokens::ZERO;
        let span_ms = (period * periods).as_millis() as u64;
        let writes = writes_within(t0, span_ms.max(1), &writes);
        let end = t0.saturating_add(period * periods);
        let level = written_at(row, &writes, end);
        prop_assert_eq!(level.tokens, Tokens::from_nanos(amount.as_nanos() * i128::from(periods)));
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn arb_rate() -> impl Strategy<Value = RefillRate> {
    prop_oneof![
        (1u64..10_000).prop_map(RefillRate::per_second),
        (1u64..3_000_000).prop_map(RefillRate::per_minute),
        (1u64..100_000).prop_map(RefillRate::per_hour),
        (1u64..100_000).prop_map(RefillRate::per_day),
        (1u64..100_000).prop_map(RefillRate::per_week),
        // Any amount over any period.
        (1i128..10_000_000_000_000, 1u64..1_000_000_000_000_000)
            .prop_map(|(a, p)| { RefillRate::new(Tokens::from_nanos(a), Duration::from_nanos(p)) }),
        // Decimals of up to 18 places, as another SDK may write them (at most 10^15 a
        // second, the fastest valid rate).
        (1i128..1_000_000_000_000_000_000, 3u32..=18).prop_map(|(digits, places)| {
            crate::decimal::format(digits, places)
                .parse::<RefillRate>()
                .unwrap()
        }),
    ]
}

/// A stored row of `limit_type` (version 3) refilling at any rate, of a capacity below
/// 100,000, holding `tokens_pct` percent of it (negative: in debt).
fn any_row(
    limit_type: LimitType,
    tokens_pct: impl Strategy<Value = i64>,
) -> impl Strategy<Value = BucketState> {
    (arb_rate(), 1i64..100_000, tokens_pct).prop_map(move |(rate, capacity, pct)| {
        let cap = Tokens::new(capacity);
        let bucket = Bucket::new(limit_type, cap, rate);
        BucketState {
            tokens: Tokens::from_nanos(cap.as_nanos() * i128::from(pct) / 100),
            version: 3,
            ..BucketState::full(dim(), bucket, UnixMillis::new(1_700_000_000_000))
        }
    })
}

proptest! {
    #[test]
    fn many_small_refill_steps_equal_one_large_step(
        rate in arb_rate(),
        capacity in 1i64..1_000_000,
        start_fraction in 0u32..=100,
        steps in proptest::collection::vec(0i64..2_500, 1..200),
    ) {
        let cap = Tokens::new(capacity);
        let start_tokens = Tokens::from_nanos(cap.as_nanos() * i128::from(start_fraction) / 100);
        let t0 = UnixMillis::new(1_700_000_000_000);
        let start = Level::new(start_tokens, t0);
        let mut level = start;
        let mut now = t0;
        for step in &steps {
            now = UnixMillis::new(now.as_millis() + step);
            let next = refill(level, cap, rate, now);
            prop_assert!(next.last_refill_at >= level.last_refill_at, "timestamp moved backwards");
            prop_assert!(next.last_refill_at <= now.max(level.last_refill_at));
            prop_assert!(next.tokens <= cap);
            level = next;
        }
        prop_assert_eq!(level, refill(start, cap, rate, now));
        // And the state reached by small steps keeps agreeing afterwards.
        let later = UnixMillis::new(now.as_millis() + 12_345);
        prop_assert_eq!(refill(level, cap, rate, later), refill(start, cap, rate, later));
    }

    #[test]
    fn retry_in_is_the_first_millisecond_with_enough_tokens(
        s in any_row(LimitType::Tokens, -100i64..100),
        cost_pct in 1i64..=100,
        offset in 0i64..3_000,
    ) {
        let cap = s.bucket.capacity();
        let cost = Tokens::from_nanos((cap.as_nanos() * i128::from(cost_pct) / 100).max(1));
        let now = UnixMillis::new(s.last_refill_at.as_millis() + offset);
        match s.take(cost, now) {
            Take::Granted { level } => {
                prop_assert!(level.tokens >= Tokens::ZERO);
                prop_assert!(level.last_refill_at >= s.last_refill_at);
            }
            Take::Short { wait: Some(wait) } => {
                prop_assert!(wait >= Duration::from_millis(1));
                let ms = wait.as_millis() as i64;
                let before = UnixMillis::new(now.as_millis() + ms - 1);
                let at = UnixMillis::new(now.as_millis() + ms);
                prop_assert!(matches!(s.take(cost, before), Take::Short { .. }), "granted 1 ms early");
                prop_assert!(matches!(s.take(cost, at), Take::Granted { .. }), "not granted at the promised time");
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    #[test]
    fn a_pause_grants_nothing_before_it_ends_and_never_loosens(
        s in any_row(LimitType::Requests, -100i64..=100),
        offset in 0i64..3_000,
        pause_ms in 0u64..120_000,
    ) {
        let now = UnixMillis::new(s.last_refill_at.as_millis() + offset);
        let pause = Duration::from_millis(pause_ms);
        let ends = now.saturating_add(pause);
        let cpc = s.bucket.cost_per_call();
        match s.emptied_for(pause, now) {
            None => {
                // Already at least as strict: nothing would be granted before the end.
                if pause_ms > 0 {
                    let before = UnixMillis::new(ends.as_millis() - 1);
                    prop_assert!(s.available(before) < cpc, "left a looser bucket alone");
                }
            }
            Some(level) => {
                prop_assert!(level.is_below(&s.refilled(now)), "tightening raised the bucket");
                prop_assert!(level.last_refill_at <= now);
                let mut paused = s.clone();
                paused.set_level(level);
                if pause_ms > 0 {
                    let before = UnixMillis::new(ends.as_millis() - 1);
                    prop_assert!(matches!(paused.take(cpc, before), Take::Short { .. }), "granted before the pause ended");
                }
                // Granted exactly at the end.
                prop_assert!(matches!(paused.take(cpc, ends), Take::Granted { .. }), "pause outlasted its end");
            }
        }
    }
}
