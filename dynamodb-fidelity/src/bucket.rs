//! One item's token bucket for reads or writes, in exact integer arithmetic.

use std::time::{Duration, Instant};

/// Bucket units per half unit of capacity: a rate in thousandths of a half unit per
/// second then refills exactly `rate` bucket units per nanosecond.
const PER_HALF_UNIT: i128 = 1_000_000_000_000;

/// A ceiling (units per second) and the burst it may save up, both exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rate {
    /// Thousandths of a half unit per second (also bucket units per nanosecond).
    per_ns: i128,
    /// The most the bucket holds, in bucket units.
    capacity: i128,
}

impl Rate {
    /// `milli_units` thousandths of a unit per second, holding `burst`'s worth.
    pub(crate) fn new(milli_units: u64, burst: Duration) -> Rate {
        let per_ns = i128::from(milli_units) * 2;
        Rate {
            per_ns,
            capacity: per_ns * burst.as_nanos() as i128,
        }
    }
}

/// An item's bucket: full when first seen, refilling at its rate, possibly below zero
/// after a charge larger than what was left.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    level: i128,
    last: Instant,
}

impl Bucket {
    /// A full bucket.
    pub(crate) fn full(rate: Rate, now: Instant) -> Bucket {
        Bucket {
            level: rate.capacity,
            last: now,
        }
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        let nanos = now.saturating_duration_since(self.last).as_nanos() as i128;
        self.level = (self.level + nanos * rate.per_ns).min(rate.capacity);
        // Never backwards: an `Instant` taken before a later one was used must not
        // credit the same time twice.
        self.last = self.last.max(now);
    }

    /// Whether a request may start: something is left (more than zero).
    pub(crate) fn has_capacity(&mut self, rate: Rate, now: Instant) -> bool {
        self.refill(rate, now);
        self.level > 0
    }

    /// Takes `half_units`; the bucket may go below zero.
    pub(crate) fn take(&mut self, half_units: u64, rate: Rate, now: Instant) {
        self.refill(rate, now);
        self.level -= i128::from(half_units) * PER_HALF_UNIT;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_holds_its_burst_and_refills_at_its_rate() {
        let t0 = Instant::now();
        // 10 units per second, half a second of burst: 5 units, 10 halves.
        let rate = Rate::new(10_000, Duration::from_millis(500));
        let mut b = Bucket::full(rate, t0);
        b.take(9, rate, t0);
        assert!(b.has_capacity(rate, t0));
        b.take(1, rate, t0);
        assert!(!b.has_capacity(rate, t0));
        // Any part of a unit refilled lets a request start.
        let t1 = t0 + Duration::from_millis(1);
        assert!(b.has_capacity(rate, t1));
        // Five units (ten halves) refill in half a second.
        b.take(10, rate, t1);
        assert!(!b.has_capacity(rate, t0 + Duration::from_millis(499)));
        assert!(b.has_capacity(rate, t0 + Duration::from_millis(501)));
        // Never more than the burst.
        let later = t0 + Duration::from_secs(60);
        b.take(10, rate, later);
        assert!(!b.has_capacity(rate, later));
    }

    #[test]
    fn a_charge_larger_than_what_is_left_borrows_from_the_future() {
        let t0 = Instant::now();
        let rate = Rate::new(1_000, Duration::from_secs(1));
        let mut b = Bucket::full(rate, t0);
        b.take(6, rate, t0);
        // Two halves full, six taken: four halves (two seconds) below zero.
        assert!(!b.has_capacity(rate, t0 + Duration::from_millis(1_999)));
        assert!(b.has_capacity(rate, t0 + Duration::from_millis(2_001)));
    }

    #[test]
    fn an_earlier_instant_does_not_move_the_refill_back() {
        let t0 = Instant::now();
        let rate = Rate::new(1_000, Duration::from_secs(1));
        let mut b = Bucket::full(rate, t0);
        let t1 = t0 + Duration::from_secs(1);
        b.take(2, rate, t1);
        assert!(!b.has_capacity(rate, t0));
        assert!(!b.has_capacity(rate, t1));
    }
}
