//! The vendor's own token bucket, in exact integer arithmetic.

use std::time::{Duration, Instant};

/// Units per token: a limit of `L` per minute refills exactly `L` units per microsecond.
const UNITS: i128 = 60_000_000;

/// A token bucket refilling at a per-minute limit, holding a minute's or a second's worth.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    units: i128,
    capacity: i128,
    /// Units per microsecond: the per-minute limit.
    rate: i128,
    last: Instant,
}

impl Bucket {
    /// A full bucket for `per_minute`, holding `per_minute / divisor` (1: a minute's worth,
    /// 60: a second's).
    pub(crate) fn new(per_minute: u64, divisor: u64, now: Instant) -> Bucket {
        let capacity = i128::from(per_minute) * UNITS / i128::from(divisor.max(1));
        Bucket {
            units: capacity,
            capacity,
            rate: i128::from(per_minute),
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let micros = now.saturating_duration_since(self.last).as_micros() as i128;
        self.units = (self.units + micros * self.rate).min(self.capacity);
        self.last = self.last.max(now);
    }

    /// The wait until `tokens` fit, or `None` when they do now (nothing is taken).
    pub(crate) fn wait_for(&mut self, tokens: u64, now: Instant) -> Option<Duration> {
        self.refill(now);
        let need = i128::from(tokens) * UNITS - self.units;
        if need <= 0 {
            return None;
        }
        let micros = (need + self.rate - 1) / self.rate.max(1);
        Some(Duration::from_micros(
            u64::try_from(micros).unwrap_or(u64::MAX),
        ))
    }

    /// Takes `tokens` (may go below zero: a charge corrected upwards).
    pub(crate) fn take(&mut self, tokens: u64, now: Instant) {
        self.refill(now);
        self.units -= i128::from(tokens) * UNITS;
    }

    /// Gives `tokens` back, up to the capacity.
    pub(crate) fn give_back(&mut self, tokens: u64, now: Instant) {
        self.refill(now);
        self.units = (self.units + i128::from(tokens) * UNITS).min(self.capacity);
    }

    /// Whole tokens left.
    pub(crate) fn remaining(&mut self, now: Instant) -> u64 {
        self.refill(now);
        u64::try_from(self.units.max(0) / UNITS).unwrap_or(u64::MAX)
    }

    /// The time until the bucket is full again.
    pub(crate) fn full_in(&mut self, now: Instant) -> Duration {
        self.refill(now);
        let micros = (self.capacity - self.units + self.rate - 1) / self.rate.max(1);
        Duration::from_micros(u64::try_from(micros.max(0)).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_per_second_bucket_holds_a_second_and_refills_at_the_minute_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(600, 60, t0);
        assert_eq!(b.remaining(t0), 10);
        b.take(10, t0);
        assert_eq!(b.wait_for(1, t0), Some(Duration::from_millis(100)));
        assert_eq!(b.full_in(t0), Duration::from_secs(1));
        let later = t0 + Duration::from_millis(250);
        assert_eq!(b.remaining(later), 2);
        assert_eq!(b.wait_for(2, later), None);
        b.give_back(100, later);
        assert_eq!(b.remaining(later), 10);
    }
}
