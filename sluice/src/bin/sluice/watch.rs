//! `sluice status --watch`: each dimension's availability as a bar, and a sparkline of its
//! last samples, under the status table.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::time::Duration;

use sluice::{Tokens, admin::Snapshot};

/// Samples kept per dimension: two minutes at the default 2 s refresh.
pub(crate) const HISTORY: usize = 60;
/// The bar's width in characters.
const BAR: usize = 20;
/// Sparkline levels, empty to full.
const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// What the bars show of one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Level {
    pub(crate) dimension: String,
    pub(crate) available: Tokens,
    pub(crate) capacity: Tokens,
}

impl Level {
    pub(crate) fn of(s: &Snapshot) -> Level {
        Level {
            dimension: s.dimension.to_string(),
            available: s.available,
            capacity: s.capacity,
        }
    }

    /// Available over capacity, in thousandths, within 0..=1000.
    fn permille(&self) -> u16 {
        let capacity = self.capacity.as_nanos();
        if capacity <= 0 {
            return 0;
        }
        let share = self.available.as_nanos().clamp(0, capacity) * 1_000 / capacity;
        u16::try_from(share).unwrap_or(1_000)
    }
}

/// Each dimension's recent samples, oldest first.
#[derive(Debug, Default)]
pub(crate) struct History {
    samples: BTreeMap<String, VecDeque<u16>>,
}

impl History {
    /// Adds one sample per bucket shown; forgets buckets no longer shown.
    pub(crate) fn record(&mut self, levels: &[Level]) {
        self.samples
            .retain(|d, _| levels.iter().any(|l| &l.dimension == d));
        for level in levels {
            let samples = self.samples.entry(level.dimension.clone()).or_default();
            samples.push_back(level.permille());
            while samples.len() > HISTORY {
                samples.pop_front();
            }
        }
    }

    /// The bars and sparklines of `levels`, refreshed every `every`.
    pub(crate) fn frame(&self, levels: &[Level], every: Duration) -> String {
        let width = levels
            .iter()
            .map(|l| l.dimension.chars().count())
            .chain(["DIMENSION".len()])
            .max()
            .unwrap_or(0);
        let amounts: Vec<String> = levels
            .iter()
            .map(|l| format!("{}/{}", l.available, l.capacity))
            .collect();
        let amount_width = amounts.iter().map(String::len).max().unwrap_or(0);
        let span = humantime::format_duration(every.saturating_mul(HISTORY as u32));
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<width$}  {:<bar$}  {:>amount_width$}  {:>4}  LAST {span}",
            "DIMENSION",
            "AVAILABLE",
            "",
            "",
            bar = BAR,
        );
        for (level, amount) in levels.iter().zip(&amounts) {
            let permille = level.permille();
            let spark: String = self
                .samples
                .get(&level.dimension)
                .into_iter()
                .flatten()
                .map(|p| LEVELS[usize::from(*p) * (LEVELS.len() - 1) / 1_000])
                .collect();
            let line = format!(
                "{:<width$}  {}  {amount:>amount_width$}  {:>3}%  {spark}",
                level.dimension,
                bar(permille),
                permille / 10,
            );
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// A bar `BAR` characters wide, filled to `permille` thousandths (rounded down, so a bar
/// is full only when the bucket is).
fn bar(permille: u16) -> String {
    let filled = usize::from(permille) * BAR / 1_000;
    let mut bar = "█".repeat(filled);
    bar.push_str(&"░".repeat(BAR - filled));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(dimension: &str, available: i64, capacity: i64) -> Level {
        Level {
            dimension: dimension.to_owned(),
            available: Tokens::new(available),
            capacity: Tokens::new(capacity),
        }
    }

    #[test]
    fn a_watched_frame_draws_bars_and_the_history_as_a_sparkline() {
        let mut history = History::default();
        // The rpm bucket drains and refills; the slots fill up; tpm stays full.
        let rpm = [500, 400, 250, 100, 0, 0, 125, 300, 450, 500];
        let slots = [10, 10, 8, 6, 4, 2, 1, 0, 0, 3];
        for (r, s) in rpm.iter().zip(slots) {
            history.record(&[
                level("openai#rpm", *r, 500),
                level("openai#tpm", 2_000_000, 2_000_000),
                level("eleven#concurrent", s, 10),
            ]);
        }
        let now = [
            level("openai#rpm", 500, 500),
            level("openai#tpm", 2_000_000, 2_000_000),
            level("eleven#concurrent", 3, 10),
        ];
        let frame = history.frame(&now, Duration::from_secs(2));
        let expected = "\
DIMENSION          AVAILABLE                                    LAST 2m
openai#rpm         ████████████████████          500/500  100%  █▆▄▂▁▁▂▅▇█
openai#tpm         ████████████████████  2000000/2000000  100%  ██████████
eleven#concurrent  ██████░░░░░░░░░░░░░░             3/10   30%  ██▆▅▃▂▁▁▁▃
";
        assert_eq!(frame, expected, "\n{frame}");
    }

    #[test]
    fn history_is_bounded_and_forgets_buckets_no_longer_shown() {
        let mut history = History::default();
        for i in 0..(HISTORY + 15) {
            let i = i64::try_from(i).unwrap();
            history.record(&[level("a#rpm", i % 10, 10), level("b#rpm", 1, 10)]);
        }
        assert_eq!(history.samples["a#rpm"].len(), HISTORY);
        history.record(&[level("a#rpm", 10, 10)]);
        assert!(!history.samples.contains_key("b#rpm"));
        let frame = history.frame(&[level("a#rpm", 10, 10)], Duration::from_secs(1));
        let line = frame.lines().nth(1).unwrap();
        let (_, spark) = line.rsplit_once("%  ").unwrap();
        assert_eq!(spark.chars().count(), HISTORY);
        assert!(spark.chars().all(|c| LEVELS.contains(&c)), "{spark}");
    }

    #[test]
    fn an_overdrawn_or_capacityless_bucket_draws_an_empty_bar() {
        assert_eq!(level("a#rpm", -5, 10).permille(), 0);
        assert_eq!(level("a#rpm", 5, 0).permille(), 0);
        assert_eq!(level("a#rpm", 15, 10).permille(), 1_000);
        assert_eq!(bar(999), format!("{}░", "█".repeat(19)));
    }
}
