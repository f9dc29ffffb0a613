//! What a spread bought, as one client measured it: the bucket's total before and after
//! its rows' count changed.

/// A bucket's total write rate (thousandths of a write a second, over all its rows) at
/// the count this client last measured it at, and at the count before, if it saw one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gain {
    count: u16,
    total: u64,
    before: Option<(u16, u64)>,
}

impl Gain {
    /// A first measure: `total` at `count` rows.
    pub(crate) fn new(count: u16, total: u64) -> Gain {
        Gain {
            count,
            total,
            before: None,
        }
    }

    /// A measure of `total` at `count` rows; whether the bucket's rows together take at
    /// least a quarter more than they did at the fewer rows this client measured before
    /// the last spread (`None`: it measured none).
    pub(crate) fn note(&mut self, count: u16, total: u64) -> Option<bool> {
        if count != self.count {
            self.before = Some((self.count, self.total));
            self.count = count;
        }
        self.total = total;
        let (_, then) = self.before.filter(|(fewer, _)| *fewer < count)?;
        Some(total.saturating_mul(4) >= then.saturating_mul(5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_gained_when_the_rows_take_a_quarter_more_than_before() {
        let mut g = Gain::new(1, 50_000);
        assert_eq!(g.note(1, 50_000), None);
        // Spread to 8: 70 a second against 50 is more than a quarter more.
        assert_eq!(g.note(8, 70_000), Some(true));
        // Still 8 rows, less now: measured against the count before, not the last measure.
        assert_eq!(g.note(8, 55_000), Some(false));
        // Spread again to 32: against what 8 rows took last.
        assert_eq!(g.note(32, 60_000), Some(false));
        assert_eq!(g.note(32, 69_000), Some(true));
        // Gathered back to fewer rows: no spread to judge.
        assert_eq!(g.note(16, 60_000), None);
    }
}
