//! A table's own ceiling, over all its partitions: what an on-demand table sustains.
//!
//! A new on-demand table sustains 4,000 write and 12,000 read units a second; beyond that
//! it serves up to twice its previous peak at once, and a peak counts as previous once 30
//! minutes have passed since it was reached; a table pre-warmed (`WarmThroughput`)
//! sustains what it was warmed to; and no table exceeds the per-table account quota
//! (40,000 each by default). The proxy keeps these per table and direction, each second's
//! consumption making the peaks.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::bucket::{Bucket, Rate};

/// The rules of an on-demand table's ceiling, in units a second (AWS's numbers by
/// default; tests scale them down).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TableModel {
    /// What a new table sustains at once (AWS: 4,000 write units a second).
    pub initial_write: f64,
    /// What a new table sustains at once (AWS: 12,000 read units a second).
    pub initial_read: f64,
    /// How long after a peak is reached it counts as the previous peak, that twice of
    /// is served at once (AWS: 30 minutes).
    pub peak_window: Duration,
    /// The per-table account quota (AWS default: 40,000 write units a second).
    pub quota_write: f64,
    /// The per-table account quota (AWS default: 40,000 read units a second).
    pub quota_read: f64,
}

impl Default for TableModel {
    /// AWS's numbers.
    fn default() -> Self {
        TableModel {
            initial_write: 4_000.0,
            initial_read: 12_000.0,
            peak_window: Duration::from_secs(30 * 60),
            quota_write: 40_000.0,
            quota_read: 40_000.0,
        }
    }
}

/// One direction of one table: its bucket, the seconds it was busy in, and what it was
/// warmed to.
#[derive(Debug)]
pub(crate) struct TableBudget {
    /// Thousandths of a unit a second: what a new table sustains, and the quota.
    initial: u64,
    quota: u64,
    window: Duration,
    /// What the table was warmed to (thousandths a second), if anything.
    warm: u64,
    bucket: Bucket,
    rate: Rate,
    /// The second being counted and what was taken in it (thousandths).
    second: Instant,
    taken: u64,
    /// Seconds counted, oldest first, until they are older than the window.
    recent: VecDeque<(Instant, u64)>,
    /// The highest second at least a window old.
    previous_peak: u64,
}

const SECOND: Duration = Duration::from_secs(1);

impl TableBudget {
    /// A new table's budget: `initial` and `quota` in thousandths of a unit a second.
    pub(crate) fn new(initial: u64, quota: u64, window: Duration, now: Instant) -> TableBudget {
        let rate = Rate::new(initial.min(quota), SECOND);
        TableBudget {
            initial,
            quota,
            window,
            warm: 0,
            bucket: Bucket::full(rate, now),
            rate,
            second: now,
            taken: 0,
            recent: VecDeque::new(),
            previous_peak: 0,
        }
    }

    /// What the table sustains now, in thousandths of a unit a second.
    pub(crate) fn ceiling(&self) -> u64 {
        self.initial
            .max(self.warm)
            .max(self.previous_peak.saturating_mul(2))
            .min(self.quota)
    }

    /// Warms the table to `milli` thousandths a second (never cools it): from `now` it
    /// sustains that at once, a second's worth of it ready.
    pub(crate) fn warm(&mut self, milli: u64, now: Instant) {
        if milli <= self.warm {
            return;
        }
        let before = self.ceiling();
        self.warm = milli;
        if self.ceiling() > before {
            self.rate = Rate::new(self.ceiling(), SECOND);
            self.bucket = Bucket::full(self.rate, now);
        }
    }

    fn roll(&mut self, now: Instant) {
        while now.saturating_duration_since(self.second) >= SECOND {
            self.recent.push_back((self.second, self.taken));
            self.second += SECOND;
            self.taken = 0;
            // Catch up over a long quiet spell without a step per second.
            if now.saturating_duration_since(self.second) > self.window + SECOND {
                self.second = now;
            }
        }
        while let Some(&(at, taken)) = self.recent.front() {
            if now.saturating_duration_since(at) < self.window {
                break;
            }
            self.previous_peak = self.previous_peak.max(taken);
            self.recent.pop_front();
        }
        let rate = Rate::new(self.ceiling(), SECOND);
        if rate != self.rate {
            self.rate = rate;
        }
    }

    /// Whether a request may start now.
    pub(crate) fn has_capacity(&mut self, now: Instant) -> bool {
        self.roll(now);
        self.bucket.has_capacity(self.rate, now)
    }

    /// Takes `half_units` (halves of a unit) at `now`.
    pub(crate) fn take(&mut self, half_units: u64, now: Instant) {
        self.roll(now);
        self.bucket.take(half_units, self.rate, now);
        self.taken += half_units * 500;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MILLI: u64 = 1000;

    #[test]
    fn a_new_table_sustains_its_initial_rate_and_twice_a_peak_once_the_window_passed() {
        let t0 = Instant::now();
        // 40 units a second at first, 400 quota, a 10-second window.
        let mut t = TableBudget::new(40 * MILLI, 400 * MILLI, Duration::from_secs(10), t0);
        assert_eq!(t.ceiling(), 40 * MILLI);
        // A second's worth is there at once, then the bucket is spent.
        t.take(80, t0);
        assert!(!t.has_capacity(t0));
        // Each second from now on takes 40 units: the peak is 40.
        for s in 1..=12u32 {
            let now = t0 + SECOND * s;
            assert!(t.has_capacity(now), "second {s}");
            t.take(80, now);
            // Before the first peak is ten seconds old, the table stays at 40.
            if s < 10 {
                assert_eq!(t.ceiling(), 40 * MILLI, "second {s}");
            }
        }
        // Ten seconds after the first busy second, twice its peak is served.
        assert_eq!(t.ceiling(), 80 * MILLI);
        // Warming raises it at once; the quota bounds all.
        t.warm(300 * MILLI, t0);
        assert_eq!(t.ceiling(), 300 * MILLI);
        t.warm(1000 * MILLI, t0);
        assert_eq!(t.ceiling(), 400 * MILLI);
    }

    #[test]
    fn a_quiet_table_keeps_its_previous_peak() {
        let t0 = Instant::now();
        let mut t = TableBudget::new(40 * MILLI, 400 * MILLI, Duration::from_secs(10), t0);
        t.take(80, t0);
        // An hour later: the second of 40 is long a previous peak.
        let later = t0 + Duration::from_secs(3600);
        assert!(t.has_capacity(later));
        assert_eq!(t.ceiling(), 80 * MILLI);
    }
}
