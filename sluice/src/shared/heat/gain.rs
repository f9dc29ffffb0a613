//! What a spread bought, as one client measured it: the bucket's total after its rows'
//! count changed, averaged over several measures, against the most it took on average
//! before.

use crate::dimension::Dimension;
use crate::shared::lanes::lock;

/// Measures at a count averaged (at most) for a gain: one row's one-second measure times
/// the rows is noisy (a row of eight on one partition takes a handful of writes a second).
const SPAN: u64 = 8;
/// Measures at the new count before a spread is judged: a quarter more is read from an
/// average, not from one lucky second.
const JUDGED_AFTER: u64 = 4;
/// Measures at a spread count left out of its average: they straddle the spread, whose
/// transaction holds the rows and throttles the takes racing it, and the seconds after it
/// spend the burst capacity that dip left on the rows' partitions (a bucket on one
/// partition takes a third more for a second or two, which no number of rows sustains).
const SETTLING: u64 = 2;

/// A bucket's total write rate (thousandths of a write a second, over all its rows) at
/// the count this client last measured it at: a moving average of its last measures and
/// the highest that average reached; and that highest at the count before, if it saw one.
/// The highest, not the last: a throttled lone row's seconds dip when its writers back
/// off, and a spread measured against a dip would seem to buy what it did not.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gain {
    count: u16,
    mean: u64,
    peak: u64,
    samples: u64,
    settling: u64,
    before: Option<(u16, u64)>,
}

impl Gain {
    /// A first measure: `total` at `count` rows; with `carried`, what the bucket's lone
    /// row took before it was spread (as its rows carry it), judged against.
    pub(crate) fn new(count: u16, total: u64, carried: Option<u64>) -> Gain {
        let mut gain = Gain {
            count,
            mean: 0,
            peak: 0,
            samples: 0,
            settling: settling_at(count),
            before: carried.filter(|_| count > 1).map(|then| (1, then)),
        };
        gain.note(count, total);
        gain
    }

    /// A measure of `total` at `count` rows; whether the bucket's rows together take at
    /// least a quarter more, averaged over at least [`JUDGED_AFTER`] measures, than the
    /// most they took on average at the fewer rows this client measured before the last
    /// spread (`None`: it measured none, or too few since).
    pub(crate) fn note(&mut self, count: u16, total: u64) -> Option<bool> {
        if count != self.count {
            self.before = Some((self.count, self.peak));
            self.count = count;
            self.samples = 0;
            self.mean = 0;
            self.peak = 0;
            self.settling = settling_at(count);
        }
        if self.settling > 0 {
            self.settling -= 1;
            return None;
        }
        self.samples = self.samples.saturating_add(1);
        // The mean of the first measures, then a moving average over the last few.
        let weight = self.samples.min(SPAN);
        self.mean = if total >= self.mean {
            self.mean + (total - self.mean) / weight
        } else {
            self.mean - (self.mean - total) / weight
        };
        self.peak = self.peak.max(self.mean);
        self.judged()
    }

    /// Whether the rows take a quarter more on average than before, once judged.
    pub(crate) fn judged(&self) -> Option<bool> {
        // Nothing averaged before (a count left while settling) proves nothing.
        let (_, then) = self
            .before
            .filter(|(fewer, then)| *fewer < self.count && *then > 0)?;
        (self.samples >= JUDGED_AFTER)
            .then(|| self.mean.saturating_mul(4) >= then.saturating_mul(5))
    }
}

impl super::Heat {
    /// Notes that `base`'s bucket, over `shards` rows, takes `total` thousandths of a write
    /// a second over all of them; whether that is a quarter more than at the fewer rows
    /// this client measured before they were spread (`None`: not known yet). A client
    /// that first measures the bucket already spread judges against the lone row's take
    /// the rows carry (`carried`, thousandths), if any.
    pub(crate) fn gained(
        &self,
        base: &Dimension,
        shards: u16,
        total: u64,
        carried: Option<u64>,
    ) -> Option<bool> {
        let mut gains = lock(&self.gains);
        let gain = match gains.get_mut(base) {
            Some(gain) => {
                gain.note(shards, total);
                *gain
            }
            None => {
                let gain = Gain::new(shards, total, carried);
                gains.insert(base.clone(), gain);
                gain
            }
        };
        drop(gains);
        let gained = gain.judged();
        if gained == Some(true) {
            tracing::debug!(dimension = %base, ?gain, "a spread measured as raising the bucket's take");
        }
        gained
    }
}

/// Measures left out at `count` rows: none for a lone row (a fleet may spread it within
/// its first two seconds, and what it took then is what the spread is judged against).
fn settling_at(count: u16) -> u64 {
    if count > 1 { SETTLING } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `g` after the measures a spread count leaves out, each at `total`.
    fn settled(g: &mut Gain, count: u16, total: u64) {
        for _ in 0..SETTLING {
            assert_eq!(g.note(count, total), None);
        }
    }

    #[test]
    fn a_spread_gained_when_the_rows_take_a_quarter_more_on_average_than_before() {
        let mut g = Gain::new(1, 50_000, None);
        assert_eq!(g.note(1, 50_000), None);
        // Spread to 8: judged after four measures past the settling ones, on their average.
        settled(&mut g, 8, 200_000);
        assert_eq!(g.note(8, 90_000), None);
        assert_eq!(g.note(8, 70_000), None);
        assert_eq!(g.note(8, 50_000), None);
        assert_eq!(g.note(8, 70_000), Some(true));
        // One lucky second does not make a gain of a spread that bought nothing.
        let mut g = Gain::new(8, 50_000, None);
        for _ in 0..8 {
            assert_ne!(g.note(8, 50_000), Some(true));
        }
        settled(&mut g, 32, 45_000);
        assert_eq!(g.note(32, 100_000), None);
        for _ in 0..8 {
            g.note(32, 45_000);
        }
        assert_eq!(g.note(32, 45_000), Some(false));
        // A second at twice the rate moves the average by an eighth of it.
        assert_eq!(g.note(32, 100_000), Some(false));
        // Sustained, it is a gain.
        for _ in 0..8 {
            g.note(32, 80_000);
        }
        assert_eq!(g.note(32, 80_000), Some(true));
        // Gathered back to fewer rows: no spread to judge.
        assert_eq!(g.note(16, 60_000), None);
    }

    #[test]
    fn the_seconds_right_after_a_spread_are_not_averaged() {
        // One partition: the lone row took 50 a second; the spread's own dip leaves burst
        // capacity that eight rows spend in the next two measures (90 a second), then 50.
        let mut g = Gain::new(1, 50_000, None);
        g.note(1, 50_000);
        for total in [90_000, 90_000, 50_000, 50_000, 50_000] {
            assert_eq!(g.note(8, total), None);
        }
        assert_eq!(g.note(8, 50_000), Some(false));
        // A count left before any measure was averaged proves nothing at the next.
        let mut g = Gain::new(1, 50_000, None);
        g.note(8, 50_000);
        settled(&mut g, 32, 200_000);
        for _ in 0..8 {
            assert_eq!(g.note(32, 200_000), None);
        }
    }

    #[test]
    fn a_client_that_joins_after_the_first_spread_judges_against_the_lone_row_carried() {
        // Eight rows taking 80 a second against the lone row's 50: a gain, once settled
        // (the first measure is one of the settling ones) and averaged.
        let mut g = Gain::new(8, 200_000, Some(50_000));
        assert_eq!(g.judged(), None);
        assert_eq!(g.note(8, 200_000), None);
        for _ in 0..3 {
            assert_eq!(g.note(8, 80_000), None);
        }
        assert_eq!(g.note(8, 80_000), Some(true));
        // Sixty is not a quarter more.
        let mut g = Gain::new(8, 60_000, Some(50_000));
        for _ in 0..5 {
            g.note(8, 60_000);
        }
        assert_eq!(g.judged(), Some(false));
        // A lone row has nothing before it.
        assert_eq!(Gain::new(1, 60_000, Some(50_000)).judged(), None);
    }

    #[test]
    fn the_count_before_is_the_most_its_average_reached() {
        // A throttled lone row at 60 a second, then a dip to 23 as its writers back off:
        // eight rows taking 50 on one partition bought nothing.
        let mut g = Gain::new(1, 60_000, None);
        g.note(1, 23_000);
        settled(&mut g, 8, 50_000);
        for _ in 0..3 {
            g.note(8, 50_000);
        }
        assert_eq!(g.note(8, 50_000), Some(false));
        // A lone row warming up from 10 to 50 a second: the spread is judged against the
        // 50 it reached, not the ramp.
        let mut g = Gain::new(1, 10_000, None);
        for _ in 0..20 {
            g.note(1, 50_000);
        }
        settled(&mut g, 8, 55_000);
        for _ in 0..3 {
            g.note(8, 55_000);
        }
        assert_eq!(g.note(8, 55_000), Some(false));
    }
}
