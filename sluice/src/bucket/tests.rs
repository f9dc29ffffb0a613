use std::time::Duration;

use proptest::prelude::*;

use super::definition::MAX_TIMESTAMP;
use super::*;
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::rate::RefillRate;
use crate::tokens::Tokens;

fn dim() -> Dimension {
    Dimension::new("openai#rpm").unwrap()
}

fn state(capacity: i64, rate: RefillRate, tokens: Tokens) -> BucketState {
    let bucket = Bucket::new(LimitType::Requests, capacity, rate);
    BucketState {
        tokens,
        ..BucketState::full(dim(), bucket, UnixMillis::new(1_000_000))
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
    assert_eq!(
        s.refilled(earlier),
        Level::new(Tokens::new(5), s.last_refill_at)
    );
    let full = state(100, RefillRate::per_second(10), Tokens::new(100));
    assert_eq!(full.refilled(earlier).last_refill_at, full.last_refill_at);
}

#[test]
fn retry_in_is_exact_and_rounded_up_to_the_millisecond() {
    // 3 tokens per second: one token takes 333.33 ms, reported as 334 ms.
    let s = state(10, RefillRate::per_second(3), Tokens::ZERO);
    let one_after = |ms| {
        s.take(
            Tokens::new(1),
            s.last_refill_at.saturating_add(Duration::from_millis(ms)),
        )
    };
    assert_eq!(
        one_after(0),
        Take::Short {
            wait: Some(Duration::from_millis(334))
        }
    );
    assert!(matches!(one_after(333), Take::Short { .. }));
    assert!(matches!(one_after(334), Take::Granted { .. }));
}

#[test]
fn a_refill_rate_too_large_for_a_default_capacity_is_refused_not_overflowed() {
    let huge = RefillRate::new(Tokens::MAX, Duration::from_nanos(1));
    for bucket in [Bucket::requests(huge), Bucket::tokens(huge)] {
        assert!(matches!(
            bucket.validate(),
            Err(BucketError::Capacity(_) | BucketError::RefillRate(_))
        ));
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
    assert_eq!(s.restored(Tokens::new(5), later).tokens, Tokens::new(3));
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
    let bucket = Bucket::new(LimitType::Tokens, Tokens::MAX, RefillRate::MAX);
    BucketState {
        tokens: -Tokens::MAX,
        version: MAX_VERSION,
        ..BucketState::full(dim(), bucket, UnixMillis::EPOCH)
    }
}

#[test]
fn rows_at_the_bounds_never_overflow() {
    let deepest = deepest();
    assert!(deepest.validate().is_ok());
    // The fastest refill for ten thousand years fills it exactly.
    assert_eq!(
        deepest.refilled(MAX_TIMESTAMP),
        Level::new(Tokens::MAX, MAX_TIMESTAMP)
    );
    assert!(matches!(
        deepest.take(Tokens::MAX, MAX_TIMESTAMP),
        Take::Granted { .. }
    ));
    let emptied = deepest.emptied_for(Duration::MAX, MAX_TIMESTAMP).unwrap();
    assert!(emptied.tokens.is_within_bounds());
    assert_eq!(
        deepest.charged(Tokens::MAX, UnixMillis::EPOCH).tokens,
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
    let level = refill(
        Level::new(Tokens::from_nanos(i128::MIN / 2), UnixMillis::new(i64::MIN)),
        Tokens::from_nanos(i128::MAX / 2),
        RefillRate::from_nanos_per_second(i128::MAX),
        UnixMillis::new(i64::MAX),
    );
    assert_eq!(level.tokens, Tokens::from_nanos(i128::MAX / 2));
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
        let limit = RECENT_WRITES;
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

#[test]
fn a_pause_on_a_row_filled_ahead_is_written_only_where_it_is_stricter_at_every_instant() {
    let now = UnixMillis::from_secs(1_700_000_000);
    let bucket = Bucket::requests(RefillRate::per_second(10)).with_capacity(10);
    // Half a token, refilling from 800 ms on: its first token comes at 850 ms.
    let mut row = BucketState::full("openai#rpm".parse().unwrap(), bucket, now);
    row.tokens = Tokens::from_nanos(500_000_000);
    row.last_refill_at = now.saturating_add(Duration::from_millis(800));
    // A pause of 60 ms is looser than that: not written.
    assert_eq!(row.emptied_for(Duration::from_millis(60), now), None);
    // A pause of 2 s is stricter at every instant: written, its first token at 2 s.
    let level = row.emptied_for(Duration::from_secs(2), now).unwrap();
    row.set_level(level);
    assert_eq!(
        row.take(1.into(), now),
        Take::Short {
            wait: Some(Duration::from_secs(2))
        }
    );
}
