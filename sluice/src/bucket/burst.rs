//! What a vendor's own report (remaining count, time until full) says about a bucket: how
//! many tokens it may hold now, and how many it ever holds at once (its burst).

use std::time::Duration;

use super::{BucketState, Level, LimitType};
use crate::clock::UnixMillis;
use crate::rate::RefillRate;
use crate::tokens::Tokens;

const NANOS_PER_TOKEN: i128 = 1_000_000_000;
/// How precisely vendors give their resets: OpenAI to the millisecond (`12ms`).
const RESET_PRECISION: Duration = Duration::from_millis(1);
/// The least excess (a hundredth of a token) worth a write to lower a bucket.
const TOLERANCE_NANOS: i128 = 10_000_000;

/// A vendor's report on one of its limits, as a successful response's headers give it.
///
/// A token-bucket vendor that says it has `remaining` left and will be full again in
/// `full_in` holds `remaining + rate × full_in` when full: that is its burst, whatever it
/// calls its limit (OpenAI enforces 600 requests a minute as 10 a second: it reports at
/// most 10 remaining, full within a second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// What the vendor said is left.
    pub remaining: Tokens,
    /// How long until the vendor's limit is full again (its "reset").
    pub full_in: Duration,
    /// The earliest the vendor can have counted: when the request was sent, by this
    /// host's clock. Between then and now the vendor's own bucket has refilled, at most
    /// by the bucket's rate.
    pub counted_after: UnixMillis,
}

impl BucketState {
    storage_fn! {
        /// The level and [burst](Self::burst) the row gets from the vendor's `report` at
        /// `now`, or `None` when it changes nothing.
        ///
        /// - **Now**: a bucket holding more than the vendor can hold now (what it held when it
        ///   counted, plus what the bucket's rate refills since `counted_after`) has drifted,
        ///   and is lowered to what the vendor held when it counted: its whole `remaining`
        ///   count, made exact to the reset's millisecond by the burst less the refill the
        ///   reset waits for (never more than one above the count). A bucket within a
        ///   hundredth of a token (or two milliseconds of refill) of it is left as it is.
        /// - **Burst**: `remaining + rate × full_in`, to the nearest whole token and at least
        ///   `cost_per_call`: the most the bucket refills to from now on. A report at or above
        ///   the capacity lifts the burst (the bucket holds its capacity again); nothing ever
        ///   makes it hold more than its capacity, and no report adds tokens.
        ///
        /// With the bucket's rate at the vendor's, both are exact; with a lower rate (the
        /// bucket is a share of the vendor's limit), both are lower than the vendor's: stricter.
        /// `concurrent` buckets (which do not refill) take no report.
        ///
        /// ```
        /// use std::time::Duration;
        /// use sluice::{Bucket, bucket::BucketState, RefillRate, bucket::Report, Tokens, clock::UnixMillis};
        ///
        /// let now = UnixMillis::from_secs(1_700_000_000);
        /// let row = BucketState::full("openai#rpm".parse()?, Bucket::requests(RefillRate::per_minute(600)), now);
        /// // The vendor has 7 left and is full in 300 ms: it holds 7 + 10/s x 0.3 s = 10 at once,
        /// // and had 10 - 3 = 7 when it counted (7.01 with a reset rounded up to the millisecond).
        /// let report = Report { remaining: Tokens::new(7), full_in: Duration::from_millis(300), counted_after: now };
        /// let (level, burst) = row.reported(&report, now).unwrap();
        /// assert_eq!((level.tokens, burst), (Tokens::from_nanos(7_010_000_000), Some(Tokens::new(10))));
        /// # Ok::<(), sluice::error::DimensionError>(())
        /// ```
        fn reported(&self, report: &Report, now: UnixMillis) -> Option<(Level, Option<Tokens>)> {
            if self.bucket.limit_type() == LimitType::Concurrent {
                return None;
            }
            let rate = self.bucket.effective_rate();
            let capacity = self.bucket.capacity();
            let burst = self.burst_from(report);
            let held = self.vendor_held(report);
            let can_hold_now = held.saturating_add(refill_over(
                rate,
                now.saturating_since(report.counted_after),
            ));
            // From what the bucket holds now: a burst raised is refilled to from now on, never
            // as if it had been there all along.
            let level = self.refilled(now);
            let was = level.tokens;
            let holds = burst.unwrap_or(capacity);
            // A bucket above what the vendor can possibly hold now has drifted from it (another
            // tool's calls, a grant the vendor counted later than sluice): it goes back to what
            // the vendor held when it counted, which leaves it no more than the vendor whatever
            // was in flight. Within a tolerance it is left alone: a report per call must not
            // cost a write per call.
            let tolerance =
                Tokens::from_nanos(TOLERANCE_NANOS).max(refill_over(rate, RESET_PRECISION * 2));
            let tokens = if was > can_hold_now.saturating_add(tolerance) {
                held
            } else {
                was
            }
            .min(holds);
            let level = if tokens < was {
                Level::new(tokens, level.last_refill_at)
            } else {
                level
            };
            (tokens < was || burst != self.burst).then_some((level, burst))
        }
    }

    /// The most the vendor held when it counted: its whole `remaining` count hides less
    /// than a token, and its reset tells the rest to the millisecond (when full it holds
    /// its burst, whole, less the refill the reset still waits for).
    fn vendor_held(&self, report: &Report) -> Tokens {
        let rate = self.bucket.effective_rate();
        let remaining = report.remaining.clamp(Tokens::ZERO, self.bucket.capacity());
        let to_full = refill_over(rate, report.full_in);
        let precision = refill_over(rate, RESET_PRECISION);
        let whole = whole_up(remaining.saturating_add(to_full).saturating_sub(precision));
        let from_reset = whole.saturating_sub(to_full).saturating_add(precision);
        remaining
            .saturating_add(Tokens::new(1))
            .min(from_reset)
            .max(remaining)
    }

    /// The burst `report` shows: `remaining + rate × full_in`, less the error of a reset
    /// rounded up to the millisecond, rounded up to a whole token, at least `cost_per_call`;
    /// `None` at or above the capacity. A burst already learned is lowered by any lower
    /// one, but raised only by one more than a token above it, so that the whole counts
    /// of a vendor whose burst is not whole do not flip it at every answer.
    fn burst_from(&self, report: &Report) -> Option<Tokens> {
        let rate = self.bucket.effective_rate();
        let capacity = self.bucket.capacity();
        let shown = report
            .remaining
            .clamp(Tokens::ZERO, capacity)
            .saturating_add(refill_over(rate, report.full_in))
            .saturating_sub(refill_over(rate, RESET_PRECISION));
        let whole = whole_up(shown)
            .max(self.bucket.cost_per_call())
            .max(Tokens::new(1));
        match self.burst {
            Some(learned)
                if whole >= learned && whole <= learned.saturating_add(Tokens::new(1)) =>
            {
                Some(learned)
            }
            _ => (whole < capacity).then_some(whole),
        }
    }
}

/// `tokens` rounded up to a whole token (never below zero).
fn whole_up(tokens: Tokens) -> Tokens {
    Tokens::from_nanos(
        (tokens.as_nanos().max(0) + NANOS_PER_TOKEN - 1) / NANOS_PER_TOKEN * NANOS_PER_TOKEN,
    )
}

/// What `rate` refills over `span`, rounded down to the billionth of a token.
fn refill_over(rate: RefillRate, span: Duration) -> Tokens {
    rate.max(RefillRate::ZERO).refill_over(span)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::bucket::Bucket;

    const NOW: UnixMillis = UnixMillis::from_secs(1_700_000_000);

    fn row(capacity: i64, per_minute: u64, tokens: i64, burst: Option<i64>) -> BucketState {
        BucketState {
            tokens: Tokens::new(tokens),
            burst: burst.map(Tokens::new),
            ..BucketState::full(
                "openai#rpm".parse().unwrap(),
                Bucket::requests(RefillRate::per_minute(per_minute)).with_capacity(capacity),
                NOW,
            )
        }
    }

    fn report(remaining: i64, full_in_ms: u64, sent_ms_ago: u64) -> Report {
        Report {
            remaining: Tokens::new(remaining),
            full_in: Duration::from_millis(full_in_ms),
            counted_after: NOW.saturating_sub(Duration::from_millis(sent_ms_ago)),
        }
    }

    /// A row of a requests bucket of up to 1,000 refilling up to 100,000 a minute, holding up
    /// to its capacity (or in debt), with a learned burst or none.
    fn any_row() -> impl Strategy<Value = BucketState> {
        (
            1i64..1_000,
            1u64..100_000,
            -50i64..1_000,
            proptest::option::of(1i64..1_000),
        )
            .prop_map(|(capacity, per_minute, tokens, burst)| {
                row(capacity, per_minute, tokens.min(capacity), burst)
            })
    }

    /// A report of up to 2,000 remaining, full within two minutes, for a request sent up to
    /// five seconds ago.
    fn any_report() -> impl Strategy<Value = Report> {
        (0i64..2_000, 0u64..120_000, 0u64..5_000).prop_map(
            |(remaining, full_in_ms, sent_ms_ago)| report(remaining, full_in_ms, sent_ms_ago),
        )
    }

    #[test]
    fn a_per_second_vendor_bounds_a_per_minute_bucket_to_its_second() {
        let full = row(600, 600, 600, None);
        let (level, burst) = full.reported(&report(9, 100, 0), NOW).unwrap();
        let tokens = level.tokens;
        // 9 remaining, full in 100 ms: 9.01 at most (the reset rounded up to the ms).
        assert_eq!(
            (tokens, burst),
            (Tokens::from_nanos(9_010_000_000), Some(Tokens::new(10)))
        );
        let learned = BucketState {
            tokens,
            burst,
            ..full.clone()
        };
        // An hour later the bucket holds the vendor's second, not the whole minute.
        let later = NOW.saturating_add(Duration::from_secs(3_600));
        assert_eq!(learned.available(later), Tokens::new(10));
        assert_eq!(learned.time_to_full(later), Some(Duration::ZERO));
        // The same report again changes nothing: no write.
        assert_eq!(learned.reported(&report(9, 100, 0), NOW), None);
    }

    #[test]
    fn refill_since_the_request_was_sent_is_not_taken_away() {
        // Sent 200 ms ago with nothing left, full in a second: the vendor held at most 0.01
        // then and 2.01 now. A bucket within that is left alone (the calls sluice granted
        // since may still be on their way to the vendor).
        let within = row(600, 600, 2, Some(10));
        assert_eq!(within.reported(&report(0, 1_000, 200), NOW), None);
        // One above it has drifted: back to what the vendor held when it counted.
        let (level, burst) = row(600, 600, 5, Some(10))
            .reported(&report(0, 1_000, 200), NOW)
            .unwrap();
        assert_eq!(
            (level.tokens, burst),
            (Tokens::from_nanos(10_000_000), Some(Tokens::new(10)))
        );
        // Within the tolerance of what the vendor may hold: nothing to write.
        let close = BucketState {
            tokens: Tokens::from_nanos(1_020_000_000),
            ..row(600, 600, 0, Some(10))
        };
        assert_eq!(close.reported(&report(1, 900, 0), NOW), None);
    }

    #[test]
    fn a_burst_that_is_not_whole_does_not_flip_at_every_answer() {
        // 1,000 a minute as a second's worth: 16.67 at once. Whole counts show 16 or 17.
        let learned = row(1_000, 1_000, 0, Some(16));
        // 16 left, full in 40 ms: 16.67 shown, rounded up to 17: within a token, kept.
        assert_eq!(learned.reported(&report(16, 40, 0), NOW), None);
        // A vendor that really takes more: raised.
        let (_, burst) = learned.reported(&report(30, 0, 0), NOW).unwrap();
        assert_eq!(burst, Some(Tokens::new(30)));
        // Any lower count: lowered.
        let (_, burst) = learned.reported(&report(10, 0, 0), NOW).unwrap();
        assert_eq!(burst, Some(Tokens::new(10)));
    }

    #[test]
    fn a_report_at_or_above_capacity_lifts_the_burst_but_adds_no_token() {
        let (level, burst) = row(600, 600, 3, Some(10))
            .reported(&report(600, 0, 0), NOW)
            .unwrap();
        assert_eq!((level.tokens, burst), (Tokens::new(3), None));
    }

    #[test]
    fn a_take_larger_than_the_burst_waits_for_a_bucket_of_its_size() {
        let learned = row(600, 600, 0, Some(10));
        let take = learned.take(Tokens::new(30), NOW);
        assert_eq!(
            take,
            super::super::Take::Short {
                wait: Some(Duration::from_secs(3))
            }
        );
        let later = NOW.saturating_add(Duration::from_secs(3));
        assert!(matches!(
            learned.take(Tokens::new(30), later),
            super::super::Take::Granted { .. }
        ));
    }

    #[test]
    fn concurrent_buckets_take_no_report() {
        let slots = BucketState::full(
            "elevenlabs#concurrent".parse().unwrap(),
            Bucket::concurrent(4),
            NOW,
        );
        assert_eq!(slots.reported(&report(0, 1_000, 0), NOW), None);
    }

    proptest! {
        /// No report ever makes a bucket looser than its definition: it never holds more
        /// than it held before the report, nor, at any later time, more than the same
        /// bucket without any report would.
        #[test]
        fn reports_never_loosen_a_bucket(
            before in any_row(),
            report in any_report(),
            later_ms in 0u64..600_000,
        ) {
            let plain = BucketState { burst: None, ..before.clone() };
            if let Some((level, burst)) = before.reported(&report, NOW) {
                let mut after = BucketState { burst, ..before.clone() };
                after.set_level(level);
                prop_assert!(after.available(NOW) <= before.available(NOW));
                prop_assert!(after.holds() <= after.bucket.capacity());
                let later = NOW.saturating_add(Duration::from_millis(later_ms));
                prop_assert!(after.available(later) <= plain.available(later));
            }
        }
    }
}
