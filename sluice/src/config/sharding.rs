//! When a bucket spreads itself over more rows, or gathers back into fewer.

use super::ConfigError;

/// When this client spreads a hot bucket over more rows (shards), or gathers a cool one
/// back (see [`Sluice::reshard`](crate::Sluice::reshard)).
///
/// Every write bumps a row's version, whoever makes it, so the versions this client's own
/// writes hand back tell it how many writes a second a row takes, at no cost. When a row
/// of a `requests` or `tokens` bucket takes more than half of one row's write ceiling for
/// two measures in a row (or the store throttled it while it took 40% or more; one
/// measure is enough for a bucket's only row at 80% or more and throttled), the client
/// spreads the bucket over enough rows, in powers of two (at least twice as many, four
/// times when throttled, eight rows for a lone row throttled at 80% or more), for each to
/// take about 40% of it (with no ceiling told, one learned from the store's throttles
/// spreads only a throttled row, and not a bucket refilling within twice that ceiling).
/// A bucket already spread and throttled twice or more within a measure is spread
/// further, whatever its rows' rates, only if the client measured its last spread raising
/// what the bucket takes over all its rows by a quarter or more, on average (leaving out
/// the two measures right after the spread, whose dip leaves the partitions burst capacity
/// to spend; rows that share a partition or the table gain nothing from more rows); when
/// each row takes less than 10% of it for [`COOL_WINDOWS`](Sharding::COOL_WINDOWS) measurements in a row, it
/// gathers the bucket into half as many rows, one halving at a time. Every client may do
/// it; one conditional transaction decides, and the others see the new count on their
/// next write.
///
/// ```
/// use sluice::{Config, Sharding};
///
/// // At most 16 rows per bucket; each row's ceiling the store's own (DynamoDB: 1,000).
/// let config = Config { sharding: Sharding { max_shards: 16, ..Sharding::default() }, ..Config::default() };
/// assert_eq!(config.sharding.item_write_ceiling, None);
/// // At most one row turns automatic sharding off.
/// let off = Config { sharding: Sharding { max_shards: 1, ..Sharding::default() }, ..Config::default() };
/// assert!(!off.sharding.automatic());
/// # Ok::<(), sluice::error::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharding {
    /// Writes a second one row takes at most (at least 1);
    /// `None`: the store's own (`Store::item_write_ceiling`:
    /// 1,000 on DynamoDB, none in memory, where no bucket is spread on its own).
    pub item_write_ceiling: Option<u32>,
    /// The most rows this client spreads a bucket over (1 to
    /// [`MAX_SHARDS`](crate::MAX_SHARDS)); 1 never spreads one, nor gathers one back.
    pub max_shards: u16,
}

impl Default for Sharding {
    fn default() -> Self {
        Sharding {
            item_write_ceiling: None,
            max_shards: crate::dimension::MAX_SHARDS,
        }
    }
}

impl Sharding {
    /// Measurements in a row that must each find a bucket's rows cool before it is
    /// gathered into fewer (half a minute at least): a lull does not undo a spread. A
    /// gather is never urgent (rows to spare cost an ample bucket nothing per grant), and
    /// every client measures the same rows at about the same time: one that gathers soon
    /// after a spread gathers with many others, all but one losing a transaction over
    /// every row.
    pub const COOL_WINDOWS: u32 = 30;

    /// The rows a lone row throttled at its ceiling is spread over at once.
    pub(crate) const FIRST_SPREAD: u16 = 8;

    /// Measurements in a row that must each find a bucket's rows hot before it is spread
    /// over more: one measure of a row that takes few writes is noisy. One measure is
    /// enough for a bucket's only row, throttled meanwhile at 80% of the ceiling.
    pub const HOT_WINDOWS: u32 = 2;

    /// Whether this client reshards buckets on its own.
    pub fn automatic(&self) -> bool {
        self.max_shards > 1
    }

    /// The rows a bucket now over `n` rows should have, when one of them takes
    /// `per_row` thousandths of a write a second, of `ceiling` writes a second (and was
    /// `throttled`), after `cool` cool measurements in a row; `None` to leave it.
    pub(crate) fn target(
        &self,
        n: u16,
        per_row: u64,
        ceiling: u32,
        throttled: bool,
        cool: u32,
    ) -> Option<u16> {
        let limit = ceiling.max(1);
        let ceiling = u64::from(limit) * 1_000;
        // Enough rows, a power of two, for each to take about 40% of the ceiling.
        let fit = |total: u64| {
            let rows = total.saturating_mul(10).div_ceil(ceiling * 4).max(1);
            u16::try_from(rows.next_power_of_two()).unwrap_or(u16::MAX)
        };
        let total = per_row.saturating_mul(u64::from(n));
        let max = self.max_shards.clamp(1, crate::dimension::MAX_SHARDS);
        if per_row.saturating_mul(2) > ceiling || throttled {
            // A throttled row's measure is capped by its ceiling, not by the demand behind
            // it: at least four times as many rows then, twice as many otherwise. A lone
            // row at its ceiling takes every client's writes, so its demand is a ceiling or
            // more: eight rows, the most that each take over a tenth of it (none measures
            // cool and gathers back), and room for twice the ceiling at a quarter per row.
            let step = match (throttled, n == 1 && Self::at_ceiling(per_row, limit)) {
                (true, true) => Self::FIRST_SPREAD,
                (true, false) => 4,
                (false, _) => 2,
            };
            let to = fit(total).max(n.saturating_mul(step)).min(max);
            return (to > n).then_some(to);
        }
        // Gathered one halving at a time: a measure of one row is noisy, and half as many
        // rows take twice as much, still under the split point.
        if Self::cool(per_row, limit) && cool >= Self::COOL_WINDOWS && n > 1 {
            return (fit(total) <= n / 2).then_some((n / 2).max(1));
        }
        None
    }

    /// Whether a row taking `per_row` thousandths of a write a second is cool: under 10%
    /// of `ceiling` writes a second (a quarter of the 40% a spread aims at: halving the
    /// rows leaves them well inside the band, however noisy one measure of one row is).
    pub(crate) fn cool(per_row: u64, ceiling: u32) -> bool {
        per_row.saturating_mul(10) < u64::from(ceiling) * 1_000
    }

    /// Whether a row taking `per_row` thousandths of a write a second and throttled is
    /// hot: at 40% of `ceiling` or more (the store's throttles say the ceiling is set too
    /// high; a throttle of a row well inside it is a burst, a transaction, or the table).
    pub(crate) fn throttled_hot(per_row: u64, ceiling: u32) -> bool {
        per_row.saturating_mul(10) >= u64::from(ceiling) * 4 * 1_000
    }

    /// Whether a row taking `per_row` thousandths of a write a second is at its ceiling of
    /// `ceiling` writes a second: 80% of it or more (a throttled row's measure is capped
    /// there, and falls a little short of it by the measure's own edges).
    pub(crate) fn at_ceiling(per_row: u64, ceiling: u32) -> bool {
        per_row.saturating_mul(10) >= u64::from(ceiling) * 8 * 1_000
    }

    /// Checks the settings: a ceiling of at least one write a second, and 1 to
    /// [`MAX_SHARDS`](super::MAX_SHARDS) rows.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.item_write_ceiling == Some(0) {
            return Err(ConfigError::Invalid {
                variable: "sharding.item_write_ceiling",
                value: "0".to_owned(),
                reason: "expected a whole number of writes a second, 1 or more",
            });
        }
        if !(1..=crate::dimension::MAX_SHARDS).contains(&self.max_shards) {
            return Err(ConfigError::Invalid {
                variable: "sharding.max_shards",
                value: self.max_shards.to_string(),
                reason: "expected a whole number from 1 to 32",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hot_row_is_spread_for_each_to_take_about_forty_percent_and_a_cool_one_gathered() {
        let s = Sharding {
            item_write_ceiling: None,
            max_shards: 32,
        };
        // 240 writes a second on one row of a 50-a-second ceiling: 240 / 20 = 12, so 16.
        assert_eq!(s.target(1, 240_000, 50, false, 0), Some(16));
        // Within half the ceiling: left alone, whatever the count.
        assert_eq!(s.target(8, 24_000, 50, false, 9), None);
        // Throttled (its measure capped by the ceiling): at least four times as many rows.
        assert_eq!(s.target(2, 10_000, 50, true, 0), Some(8));
        assert_eq!(s.target(2, 45_000, 50, true, 0), Some(8));
        // A lone row throttled at its ceiling: eight rows at once; under 80% of it, four.
        assert_eq!(s.target(1, 45_000, 50, true, 0), Some(8));
        assert_eq!(s.target(1, 39_000, 50, true, 0), Some(4));
        assert_eq!(s.target(1, 45_000, 50, false, 0), Some(4));
        // Capped by the configured most.
        assert_eq!(
            Sharding { max_shards: 4, ..s }.target(1, 240_000, 50, false, 0),
            Some(4)
        );
        assert_eq!(
            Sharding { max_shards: 1, ..s }.target(1, 240_000, 50, false, 0),
            None
        );
        // Cool (under 5 a second per row) for long enough: half as many rows.
        assert_eq!(
            s.target(16, 2_000, 50, false, Sharding::COOL_WINDOWS),
            Some(8)
        );
        assert_eq!(
            s.target(16, 2_000, 50, false, Sharding::COOL_WINDOWS - 1),
            None
        );
        assert_eq!(s.target(2, 0, 50, false, Sharding::COOL_WINDOWS), Some(1));
        assert_eq!(s.target(1, 0, 50, false, 99), None);
        // Just gathered, the rows take what the many took: within the band, left alone.
        assert_eq!(s.target(2, 16_000, 50, false, 0), None);
        // Throttled: hot from 40% of the ceiling, at it (one measure is enough) from 80%.
        assert!(!Sharding::throttled_hot(19_999, 50) && Sharding::throttled_hot(20_000, 50));
        assert!(!Sharding::at_ceiling(39_999, 50) && Sharding::at_ceiling(40_000, 50));
        assert!(Sharding::at_ceiling(1_000_000, 1_000) && !Sharding::at_ceiling(799_999, 1_000));
    }

    #[test]
    fn settings_are_checked() {
        let with = |item_write_ceiling, max_shards| Sharding {
            item_write_ceiling,
            max_shards,
        };
        assert_eq!(Sharding::default().validate(), Ok(()));
        assert_eq!(with(Some(50), 8).validate(), Ok(()));
        assert_eq!(with(None, 1).validate(), Ok(()));
        for bad in [with(Some(0), 8), with(None, 33), with(None, 0)] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
