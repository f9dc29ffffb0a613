use std::time::Duration;

use proptest::prelude::*;

use super::definition::MAX_TIMESTAMP;
use super::refill::grid_ms;
use super::*;
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::tokens::{RefillRate, Tokens};

fn dim() -> Dimension {
    Dimension::new("openai#rpm").unwrap()
}

fn state(capacity: i64, rate: RefillRate, tokens: Tokens) -> BucketState {
    BucketState {
        dimension: dim(),
        bucket: Bucket::new(LimitType::Requests, capacity, rate),
        tokens,
        last_refill_at: UnixMillis::new(1_000_000),
        version: 0,
        write_id: None,
        recent_writes: RecentWrites::default(),
        held: Vec::new(),
        burst: None,
    }
}

#[test]
fn refill_is_lazy_and_capped() {
    let s = state(100, RefillRate::per_second(10), Tokens::ZERO);
    let t0 = s.last_refill_at;
    assert_eq!(s.available(t0), Tokens::ZERO);
    assert_eq!(
        s.available(t0.saturating_add(Duration::from_millis(150))),
        Tokens::new(1) + "0.5".parse().unwrap()
    );
    assert_eq!(
        s.available(t0.saturating_add(Duration::from_secs(10))),
        Tokens::new(100)
    );
    assert_eq!(
        s.available(t0.saturating_add(Duration::from_secs(1000))),
        Tokens::new(100)
    );
}

#[test]
fn seed_rate_with_three_decimals_refills_per_millisecond() {
    let s = state(100, "1.667".parse().unwrap(), Tokens::ZERO);
    let t = s.last_refill_at.saturating_add(Duration::from_millis(3));
    assert_eq!(s.available(t), "0.005001".parse().unwrap());
}

#[test]
fn clock_behind_the_stored_timestamp_adds_nothing_and_never_moves_it_back() {
    let s = state(100, RefillRate::per_second(10), Tokens::new(5));
    let earlier = UnixMillis::new(s.last_refill_at.as_millis() - 5_000);
    assert_eq!(s.refilled(earlier), (Tokens::new(5), s.last_refill_at));
    let full = state(100, RefillRate::per_second(10), Tokens::new(100));
    assert_eq!(full.refilled(earlier).1, full.last_refill_at);
}

#[test]
fn retry_in_is_exact_and_rounded_up_to_the_millisecond() {
    // 3 tokens per second: one token takes 333.33 ms, reported as 334 ms.
    let s = state(10, RefillRate::per_second(3), Tokens::ZERO);
    let now = s.last_refill_at;
    assert_eq!(
        s.take(Tokens::new(1), now),
        Take::Short {
            wait: Some(Duration::from_millis(334))
        }
    );
    assert!(matches!(
        s.take(
            Tokens::new(1),
            now.saturating_add(Duration::from_millis(333))
        ),
        Take::Short { .. }
    ));
    assert!(matches!(
        s.take(
            Tokens::new(1),
            now.saturating_add(Duration::from_millis(334))
        ),
        Take::Granted { .. }
    ));
}

#[test]
fn a_refill_rate_too_large_for_a_default_capacity_is_refused_not_overflowed() {
    let huge = RefillRate::new(Tokens::MAX, Duration::from_nanos(1));
    for bucket in [Bucket::requests(huge), Bucket::tokens(huge)] {
        assert!(matches!(bucket.validate(), Err(BucketError::Capacity(_))));
    }
}

#[test]
fn debt_is_repaid_by_refill() {
    let s = state(100, RefillRate::per_second(10), Tokens::new(-15));
    let now = s.last_refill_at;
    assert_eq!(
        s.take(Tokens::new(5), now),
        Take::Short {
            wait: Some(Duration::from_secs(2))
        }
    );
    assert_eq!(
        s.available(now.saturating_add(Duration::from_millis(1_500))),
        Tokens::ZERO
    );
}

#[test]
fn concurrent_buckets_do_not_refill_even_if_a_row_says_so() {
    let mut s = state(3, RefillRate::per_second(100), Tokens::ZERO);
    s.bucket.limit_type = LimitType::Concurrent;
    let later = s.last_refill_at.saturating_add(Duration::from_secs(3600));
    assert_eq!(s.available(later), Tokens::ZERO);
    assert_eq!(s.take(Tokens::new(1), later), Take::Short { wait: None });
    assert_eq!(s.restored(Tokens::new(5), later).0, Tokens::new(3));
}

#[test]
fn cost_above_capacity_is_never_short_but_impossible() {
    let s = state(10, RefillRate::per_second(1), Tokens::new(10));
    assert_eq!(
        s.take(Tokens::new(11), s.last_refill_at),
        Take::ExceedsCapacity
    );
}

#[test]
fn bucket_definitions_validate() {
    assert!(
        Bucket::requests(RefillRate::per_minute(500))
            .validate()
            .is_ok()
    );
    assert_eq!(
        Bucket::requests(RefillRate::per_minute(500)).capacity(),
        Tokens::new(500)
    );
    assert_eq!(
        Bucket::tokens(RefillRate::per_minute(2_000_000)).capacity(),
        Tokens::new(2_000_000)
    );
    assert_eq!(Bucket::concurrent(10).capacity(), Tokens::new(10));
    assert!(Bucket::concurrent(0).validate().is_err());
    assert_eq!(
        Bucket::requests(RefillRate::ZERO).validate(),
        Err(BucketError::NoRefill(LimitType::Requests))
    );
    assert_eq!(
        Bucket::new(LimitType::Concurrent, 5, RefillRate::per_second(1)).validate(),
        Err(BucketError::ConcurrentRefill)
    );
    assert!(
        Bucket::concurrent(2)
            .with_cost_per_call(3)
            .validate()
            .is_err()
    );
}

/// The deepest valid row: the largest debt, the fastest refill, the last version.
fn deepest() -> BucketState {
    BucketState {
        dimension: dim(),
        bucket: Bucket::new(LimitType::Tokens, Tokens::MAX, RefillRate::MAX),
        tokens: -Tokens::MAX,
        last_refill_at: UnixMillis::EPOCH,
        version: MAX_VERSION,
        write_id: None,
        recent_writes: RecentWrites::default(),
        held: Vec::new(),
        burst: None,
    }
}

#[test]
fn rows_at_the_bounds_never_overflow() {
    let deepest = deepest();
    assert!(deepest.validate().is_ok());
    // The fastest refill for ten thousand years fills it exactly.
    assert_eq!(
        deepest.refilled(MAX_TIMESTAMP),
        (Tokens::MAX, MAX_TIMESTAMP)
    );
    assert!(matches!(
        deepest.take(Tokens::MAX, MAX_TIMESTAMP),
        Take::Granted { .. }
    ));
    let (emptied, _) = deepest.emptied_for(Duration::MAX, MAX_TIMESTAMP).unwrap();
    assert!(emptied.is_within_bounds());
    assert_eq!(
        deepest.charged(Tokens::MAX, UnixMillis::EPOCH).0,
        -Tokens::MAX
    );
    // The slowest refill: waits saturate instead of wrapping.
    let slow = BucketState {
        bucket: Bucket::new(
            LimitType::Tokens,
            Tokens::MAX,
            RefillRate::from_nanos_per_second(1),
        ),
        ..deepest.clone()
    };
    let wait = slow.take(Tokens::MAX, UnixMillis::EPOCH);
    assert!(matches!(wait, Take::Short { wait: Some(w) } if w > Duration::from_secs(1 << 40)));
    assert!(slow.time_to_full(UnixMillis::EPOCH).is_some());
    // A refill function given values beyond every bound still answers.
    let (t, _) = refill(
        Tokens::from_nanos(i128::MIN / 2),
        UnixMillis::new(i64::MIN),
        Tokens::from_nanos(i128::MAX / 2),
        RefillRate::from_nanos_per_second(i128::MAX),
        UnixMillis::new(i64::MAX),
    );
    assert_eq!(t, Tokens::from_nanos(i128::MAX / 2));
}

#[test]
fn rows_beyond_the_bounds_are_refused_naming_the_attribute() {
    let deepest = deepest();
    for (row, attribute) in [
        (
            BucketState {
                tokens: Tokens::MAX + Tokens::from_nanos(1),
                ..deepest.clone()
            },
            "tokens",
        ),
        (
            BucketState {
                version: MAX_VERSION + 1,
                ..deepest.clone()
            },
            "version",
        ),
        (
            BucketState {
                last_refill_at: UnixMillis::new(-1),
                ..deepest.clone()
            },
            "last_refill_at",
        ),
        (
            BucketState {
                bucket: Bucket::requests(RefillRate::ZERO),
                ..deepest.clone()
            },
            "refill_rate",
        ),
        (
            BucketState {
                bucket: Bucket::concurrent(2).lean(),
                ..deepest.clone()
            },
            "lean",
        ),
        (
            BucketState {
                bucket: Bucket::new(
                    LimitType::Tokens,
                    Tokens::MAX + Tokens::new(1),
                    RefillRate::MAX,
                ),
                ..deepest.clone()
            },
            "capacity",
        ),
    ] {
        assert_eq!(
            row.validate().unwrap_err().attribute(),
            attribute,
            "{row:?}"
        );
    }
}

#[test]
fn a_new_bucket_starts_above_any_version_a_predecessor_reached() {
    let t0 = UnixMillis::from_secs(1_700_000_000);
    let first = first_version(t0);
    // A second later, even after a thousand writes per second on the old row.
    let later = first_version(t0.saturating_add(Duration::from_secs(1)));
    assert!(later > first + 1_000);
    assert!(first_version(UnixMillis::new(i64::MAX)) <= MAX_VERSION);
    assert_eq!(first_version(UnixMillis::new(-5)), 0);
}

fn arb_rate() -> impl Strategy<Value = RefillRate> {
    prop_oneof![
        (1u64..10_000).prop_map(RefillRate::per_second),
        (1u64..3_000_000).prop_map(RefillRate::per_minute),
        (1u64..100_000).prop_map(RefillRate::per_hour),
        // Arbitrary nine-decimal rates, as a foreign row might carry.
        (1i128..50_000_000_000).prop_map(RefillRate::from_nanos_per_second),
    ]
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
        let mut tokens = start_tokens;
        let mut last = t0;
        let mut now = t0;
        for step in &steps {
            now = UnixMillis::new(now.as_millis() + step);
            let (t, l) = refill(tokens, last, cap, rate, now);
            prop_assert!(l >= last, "timestamp moved backwards");
            prop_assert!(l <= now.max(last));
            prop_assert!(t <= cap);
            tokens = t;
            last = l;
        }
        let (one_tokens, _) = refill(start_tokens, t0, cap, rate, now);
        prop_assert_eq!(tokens, one_tokens);
        // And the state reached by small steps keeps agreeing afterwards.
        let later = UnixMillis::new(now.as_millis() + 12_345);
        prop_assert_eq!(refill(tokens, last, cap, rate, later).0, refill(start_tokens, t0, cap, rate, later).0);
    }

    #[test]
    fn retry_in_is_the_first_millisecond_with_enough_tokens(
        rate in arb_rate(),
        capacity in 1i64..100_000,
        tokens_pct in -100i64..100,
        cost_pct in 1i64..=100,
        offset in 0i64..3_000,
    ) {
        let cap = Tokens::new(capacity);
        let s = BucketState {
            dimension: dim(),
            bucket: Bucket::new(LimitType::Tokens, cap, rate),
            tokens: Tokens::from_nanos(cap.as_nanos() * i128::from(tokens_pct) / 100),
            last_refill_at: UnixMillis::new(1_700_000_000_000),
            version: 3, write_id: None, recent_writes: RecentWrites::default(), held: Vec::new(), burst: None,
        };
        let cost = Tokens::from_nanos((cap.as_nanos() * i128::from(cost_pct) / 100).max(1));
        let now = UnixMillis::new(s.last_refill_at.as_millis() + offset);
        match s.take(cost, now) {
            Take::Granted { tokens, last_refill_at } => {
                prop_assert!(tokens >= Tokens::ZERO);
                prop_assert!(last_refill_at >= s.last_refill_at);
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
        rate in arb_rate(),
        capacity in 1i64..100_000,
        tokens_pct in -100i64..=100,
        offset in 0i64..3_000,
        pause_ms in 0u64..120_000,
    ) {
        let cap = Tokens::new(capacity);
        let s = BucketState {
            dimension: dim(),
            bucket: Bucket::new(LimitType::Requests, cap, rate),
            tokens: Tokens::from_nanos(cap.as_nanos() * i128::from(tokens_pct) / 100),
            last_refill_at: UnixMillis::new(1_700_000_000_000),
            version: 3, write_id: None, recent_writes: RecentWrites::default(), held: Vec::new(), burst: None,
        };
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
            Some((tokens, last_refill_at)) => {
                prop_assert!(tokens < s.available(now), "tightening raised the bucket");
                prop_assert!(last_refill_at <= now);
                let paused = BucketState { tokens, last_refill_at, ..s.clone() };
                if pause_ms > 0 {
                    let before = UnixMillis::new(ends.as_millis() - 1);
                    prop_assert!(matches!(paused.take(cpc, before), Take::Short { .. }), "granted before the pause ended");
                }
                // Granted at the end, or within one refill grid step of it.
                let grid = grid_ms(rate);
                let latest = UnixMillis::new(ends.as_millis() + grid - 1);
                prop_assert!(matches!(paused.take(cpc, latest), Take::Granted { .. }), "pause outlasted its end");
            }
        }
    }
}

proptest! {
    /// A write whose answer was lost, settled from the row read afterwards: never said to
    /// have applied when it did not, nor not to have when it did, whatever the writers'
    /// clocks say; and known either way while fewer writes followed it than the row lists.
    #[test]
    fn a_row_tells_what_became_of_a_lost_write(
        writes in proptest::collection::vec((0i64..3, -50i64..50), 1..80),
        applied in any::<bool>(),
        lean in any::<bool>(),
        position in 0usize..80,
        skew in -50i64..50,
    ) {
        let position = position % writes.len();
        let mut row = state(10, RefillRate::per_second(1), Tokens::new(10));
        if lean {
            row.bucket = row.bucket.lean();
        }
        row.version = 1;
        let limit = row.recent_limit();
        let ours = u64::MAX;
        // Real time goes on; each writer's clock is off by its own amount.
        let mut real = 1_000i64;
        let mut ours_at = None;
        let mut after_ours = 0u64;
        for (i, (step, off)) in writes.iter().enumerate() {
            if i == position {
                let mine = UnixMillis::new(real + skew);
                ours_at = Some((row.version + 1, mine));
                if applied {
                    row.recent_writes = row.recent_after(ours, mine);
                    row.version += 1;
                }
            }
            real += step;
            row.recent_writes = row.recent_after(i as u64, UnixMillis::new(real + off));
            row.version += 1;
            if i >= position {
                after_ours += 1;
            }
            prop_assert!(row.recent_writes.writes.len() <= limit);
        }
        let (version, mine) = ours_at.unwrap();
        let outcome = row.outcome_of(ours, version, mine);
        if applied {
            prop_assert_ne!(outcome, WriteOutcome::NotApplied);
            if after_ours < limit as u64 {
                prop_assert_eq!(outcome, WriteOutcome::Applied);
            }
        } else {
            prop_assert_ne!(outcome, WriteOutcome::Applied);
            if after_ours < limit as u64 {
                prop_assert_eq!(outcome, WriteOutcome::NotApplied);
            }
        }
    }
}

#[test]
fn a_write_from_a_long_stale_row_is_known_not_to_have_applied() {
    let mut row = state(10, RefillRate::per_second(1), Tokens::new(10));
    // Our copy is at version 1; 100 writes by clocks behind ours follow it.
    for id in 0..100u64 {
        row.recent_writes = row.recent_after(id, UnixMillis::new(1_000 + id as i64));
        row.version += 1;
    }
    assert!(row.recent_writes.forgotten < UnixMillis::new(2_000));
    assert_eq!(
        row.outcome_of(u64::MAX, 2, UnixMillis::new(2_000)),
        WriteOutcome::NotApplied
    );
    // The same write at a time the forgotten writes reach: it may have been one of them.
    assert_eq!(
        row.outcome_of(u64::MAX, 2, UnixMillis::new(1_050)),
        WriteOutcome::Unknown
    );
}
