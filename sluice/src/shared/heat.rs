//! How hot each bucket row is, as this client sees it: every write bumps a row's version,
//! whoever makes it, so two versions the store handed this client, a window apart, tell
//! how many writes a second the row took in between, at no cost (see
//! [`Sharding`](crate::Sharding)).

use crate::shared::recent::Recent;
use gain::Gain;
use std::sync::Mutex;

mod gain;
use std::time::Duration;

use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::shared::lanes::lock;

/// The most times a client's failed gathers of a bucket in a row halve its cool
/// measurements (see [`Heat::cool`]): its next gather then waits 32 times as long.
pub(crate) const MAX_GATHER_BACKOFF: u32 = 5;

/// The shortest span a row's write rate is measured over.
pub(crate) const WINDOW: Duration = Duration::from_secs(1);

/// How often a bucket's only row that the store throttled is measured within a window
/// (see [`Heat::observe`]): a fleet started one process after another meets the
/// throttles before its first windows end (each process's starts at its own first write),
/// and a lone row throttled refuses demand every moment it stays so.
pub(crate) const THROTTLED_WINDOW: Duration = Duration::from_millis(250);

/// One window's measure of a row (see [`Heat::observe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Measure {
    /// The row's writes a second, in thousandths.
    pub(crate) per_row: u64,
    /// This client's writes the window saw, and every client's (the versions it moved by).
    pub(crate) own: u64,
    pub(crate) all: u64,
    /// Whether the window ended (else the measure is a throttled lone row's within it, see
    /// [`Heat::observe`], and the window goes on).
    pub(crate) whole: bool,
}

impl Measure {
    /// Whether this client is the one of the row's writers that acts on the window, drawn
    /// with odds of twice its share of the writes: every writer of a row measures the
    /// same heat at about the same time, and each reshard that loses its race to
    /// another's fails an item per row (billed), where about two of them act on each
    /// window whatever their number. The odds double with each window it was sure of
    /// before (`passed`) in which nobody acted, so the row is spread within a few windows
    /// even where every writer's draw failed.
    pub(crate) fn drawn(&self, roll: u64, passed: u32) -> bool {
        let odds = 2u64.saturating_pow(passed.saturating_add(1));
        roll % self.all.max(1) < self.own.saturating_mul(odds)
    }
}

/// What this client saw of its rows' versions, and of its own reshards.
#[derive(Debug, Default)]
pub(crate) struct Heat {
    /// Per row: the current window.
    seen: Mutex<Recent<Window>>,
    /// Per bucket: the rows it had, and the cool measurements in a row at that count.
    cool: Mutex<Recent<(u16, u32)>>,
    /// Per bucket: the rows it had, and the hot measurements in a row at that count.
    hot: Mutex<Recent<(u16, u32)>>,
    /// Per bucket: when this client last resharded it (or saw it resharded), and whether
    /// it is resharding it now.
    moved: Mutex<Recent<(UnixMillis, bool)>>,
    /// Per bucket: this client's gathers in a row that failed (see [`Heat::cool`]).
    gathers_failed: Mutex<Recent<u32>>,
    /// Per bucket: when this client last read its first row to learn whether it was
    /// spread, its only row as this client knew it being throttled.
    looked: Mutex<Recent<UnixMillis>>,
    /// Per bucket: the writes a second one of its rows took while the store throttled it,
    /// the most a row took as the store says (see [`Heat::ceiling`]).
    learned_ceilings: Mutex<Recent<u32>>,
    /// Per bucket: its total rate at the count last measured, and at the count before.
    gains: Mutex<Recent<Gain>>,
}

impl Heat {
    /// Notes that `row`, of a bucket over `shards` rows, was at `version` at `now`, as one
    /// of this client's writes left it: the row's writes a second since the window began,
    /// once at least a [`WINDOW`] has passed (the next window begins then). A reshard in
    /// between starts the window again: it rewrites the rows, and a new row starts at a
    /// version of its own.
    ///
    /// A bucket's only row is also measured within the window once the store `throttled`
    /// it, every [`THROTTLED_WINDOW`], over the span since this client first saw it
    /// throttled: what it took then is what the store let it take (a measure over the
    /// whole window would count the burst before the throttles too).
    pub(crate) fn observe(
        &self,
        row: &Dimension,
        version: u64,
        (shards, throttled): (u16, bool),
        now: UnixMillis,
    ) -> Option<Measure> {
        let mut seen = lock(&self.seen);
        let fresh = Window {
            since: version,
            shards,
            at: now,
            own: 1,
            throttled_from: None,
            looked_in: now,
        };
        // Updated in place: this runs on every acquire of a spread bucket.
        let Some(window) = seen.get_mut(row) else {
            seen.insert(row.clone(), fresh);
            return None;
        };
        let span = now.as_millis() - window.at.as_millis();
        if version < window.since || span < 0 || window.shards != shards {
            // Resharded, another bucket under the same name, or a clock stepped back.
            *window = fresh;
            return None;
        }
        let all = version - window.since;
        if u128::try_from(span).unwrap_or(0) >= WINDOW.as_millis() {
            let own = window.own;
            *window = fresh;
            return Some(Measure {
                per_row: all.saturating_mul(1_000_000) / span.unsigned_abs(),
                own,
                all,
                whole: true,
            });
        }
        let own = window.own;
        window.own = own.saturating_add(1);
        if !throttled || shards != 1 {
            return None;
        }
        let (from, from_at) = *window.throttled_from.get_or_insert((version, now));
        let over = now.as_millis() - from_at.as_millis();
        let looked = now.as_millis() - window.looked_in.as_millis();
        let due = THROTTLED_WINDOW.as_millis() as i64;
        if over < due || looked < due || version < from {
            return None;
        }
        window.looked_in = now;
        Some(Measure {
            per_row: (version - from).saturating_mul(1_000_000) / over.unsigned_abs(),
            own,
            all,
            whole: false,
        })
    }

    /// Counts one more measurement of `base`, over `shards` rows, that found it cool (or
    /// starts again at none); the count. A measure at another count starts again: what
    /// the bucket did over other rows says nothing of it now.
    ///
    /// Each gather of this client's that failed in a row (it lost its race: the rows it
    /// would remove were written meanwhile, by takes or by another client gathering them)
    /// halves the count, up to [`MAX_GATHER_BACKOFF`] times: every client measures the
    /// same rows, and a gather is never urgent, while each attempt reads every row and
    /// sends a transaction over all of them that fails the takes it meets.
    pub(crate) fn cool(&self, base: &Dimension, shards: u16, cool: bool) -> u32 {
        let count = in_a_row(&self.cool, base, shards, cool);
        let failed = lock(&self.gathers_failed).get(base).copied().unwrap_or(0);
        count >> failed.min(MAX_GATHER_BACKOFF)
    }

    /// Counts one more measurement of `base`, over `shards` rows, that found it hot (or
    /// starts again at none); the count, again from none at another count.
    pub(crate) fn hot(&self, base: &Dimension, shards: u16, hot: bool) -> u32 {
        in_a_row(&self.hot, base, shards, hot)
    }

    /// Whether this client is resharding any bucket now.
    #[cfg(test)]
    pub(crate) fn resharding(&self) -> bool {
        lock(&self.moved).values().any(|(_, running)| *running)
    }

    /// Claims `base` for a reshard by this client at `now`: `false` while it is resharding
    /// it, or did within two windows (its rows' rates still reflect the old count).
    pub(crate) fn claim(&self, base: &Dimension, now: UnixMillis) -> bool {
        let mut moved = lock(&self.moved);
        match moved.get(base) {
            Some((_, true)) => false,
            Some((at, false))
                if now.as_millis() - at.as_millis() < 2 * WINDOW.as_millis() as i64 =>
            {
                false
            }
            _ => {
                // A reshard under way is never forgotten (its claim would be lost).
                moved.insert_keeping(base.clone(), (now, true), |(_, running)| *running);
                true
            }
        }
    }

    /// Whether this client may read `base`'s first row at `now` to learn whether other
    /// clients spread the bucket: once a [`THROTTLED_WINDOW`] at most (noted as done when
    /// `true`), as often as its throttles are measured.
    pub(crate) fn look(&self, base: &Dimension, now: UnixMillis) -> bool {
        let mut looked = lock(&self.looked);
        let due = looked.get(base).is_none_or(|at| {
            let since = now.as_millis() - at.as_millis();
            !(0..THROTTLED_WINDOW.as_millis() as i64).contains(&since)
        });
        if due {
            looked.insert(base.clone(), now);
        }
        due
    }

    /// The writes a second one row of `base`'s bucket takes at most: `told` (configured,
    /// or the store's own), or less when the store said so. A row the store throttled
    /// took what it could, so its measure then (`per_row` thousandths of a write a second,
    /// over a window with `throttles` throttled writes; two at least, so that one
    /// throttled burst teaches nothing) is its ceiling as the store enforces it: a spread
    /// then needs no hint, at whatever ceiling the table has. The highest such measure
    /// stands: a row throttled while it took less (a burst within the window, or writes
    /// that failed their condition, billed but not counted in the version) says less of
    /// the ceiling, not that it fell. What the client that spread the bucket learned so
    /// (`row_says`, carried by its rows) counts as this client's own. Also whether the
    /// ceiling is the one learned.
    pub(crate) fn ceiling(
        &self,
        base: &Dimension,
        told: Option<u32>,
        row_says: Option<u32>,
        (per_row, throttles): (u64, u32),
    ) -> Option<(u32, bool)> {
        let mut learned = lock(&self.learned_ceilings);
        let measured = (throttles >= 2 && per_row > 0)
            .then(|| u32::try_from(per_row.div_ceil(1_000)).unwrap_or(u32::MAX));
        for rate in measured.into_iter().chain(row_says) {
            let highest = learned.get_or_insert_with(base, || rate);
            *highest = (*highest).max(rate);
        }
        match (told, learned.get(base).copied()) {
            (Some(told), Some(learned)) if learned < told => Some((learned, true)),
            (Some(told), _) => Some((told, false)),
            (None, learned) => learned.map(|learned| (learned, true)),
        }
    }

    /// The ceiling this client learned for `base`'s rows (see [`Heat::ceiling`]), if any:
    /// what a spread writes on the rows, for every other client to measure against.
    pub(crate) fn learned(&self, base: &Dimension) -> Option<u32> {
        lock(&self.learned_ceilings).get(base).copied()
    }

    /// Ends this client's reshard of `base` at `now`. A gather that failed backs this
    /// client's next one off (see [`Heat::cool`]); any other outcome ends that.
    pub(crate) fn done(&self, base: &Dimension, now: UnixMillis, failed_gather: bool) {
        let mut failed = lock(&self.gathers_failed);
        if failed_gather {
            *failed.get_or_insert_with(base, || 0) += 1;
        } else {
            failed.remove(base);
        }
        drop(failed);
        lock(&self.moved).insert(base.clone(), (now, false));
        lock(&self.cool).remove(base);
        lock(&self.hot).remove(base);
        lock(&self.seen).retain(|row, _| row.base() != *base);
    }
}

/// A row's current window, as one client measures it.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// The row's version when the window began, and the rows its bucket had.
    since: u64,
    shards: u16,
    /// When the window began, and how many of this client's writes it has seen since.
    at: UnixMillis,
    own: u64,
    /// The row's version when this client first saw it throttled in the window, and when.
    throttled_from: Option<(u64, UnixMillis)>,
    /// When it was last measured within the window, if it was; else when it began.
    looked_in: UnixMillis,
}

/// One more measurement of `base` over `shards` rows in `counts`: the measurements in a
/// row at that count that said `yes`, none once one says no or the count changed.
fn in_a_row(counts: &Mutex<Recent<(u16, u32)>>, base: &Dimension, shards: u16, yes: bool) -> u32 {
    let mut all = lock(counts);
    let (at, count) = all.get_or_insert_with(base, || (shards, 0));
    if *at != shards {
        (*at, *count) = (shards, 0);
    }
    *count = if yes { count.saturating_add(1) } else { 0 };
    *count
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row the tests measure.
    fn rpm() -> Dimension {
        "openai#rpm".parse().unwrap()
    }

    /// `ms` milliseconds after the tests' start.
    fn t(ms: i64) -> UnixMillis {
        UnixMillis::new(1_700_000_000_000 + ms)
    }

    #[test]
    fn a_row_s_rate_is_its_version_s_rise_over_a_window_or_more() {
        let heat = Heat::default();
        let row = rpm();
        let at = |v: u64, shards: u16, ms: i64| {
            heat.observe(&row, v, (shards, false), t(ms))
                .map(|m| m.per_row)
        };
        assert_eq!(at(100, 1, 0), None);
        assert_eq!(at(150, 1, 500), None);
        assert_eq!(at(340, 1, 1_200), Some(200_000));
        assert_eq!(at(350, 1, 3_200), Some(5_000));
        // A version that went down is another bucket: measured afresh.
        assert_eq!(at(7, 1, 5_000), None);
        assert_eq!(at(9, 1, 6_000), Some(2_000));
        // Resharded since: measured afresh, whatever the versions.
        assert_eq!(at(90_000, 4, 7_000), None);
        assert_eq!(at(90_010, 4, 8_000), Some(10_000));
        let base = row.base();
        assert!(heat.claim(&base, t(8_000)));
        assert!(!heat.claim(&base, t(8_001)));
        heat.done(&base, t(8_100), false);
        assert!(!heat.claim(&base, t(9_000)));
        assert!(heat.claim(&base, t(10_100)));
        // Each failed gather in a row halves the cool measures, five times at most; any
        // other reshard ends that.
        let cool = |n: u32| (0..n).map(|_| heat.cool(&base, 4, true)).last().unwrap();
        assert_eq!(cool(30), 30);
        heat.done(&base, t(10_200), true);
        assert_eq!(heat.cool(&base, 4, false), 0);
        assert_eq!(cool(30), 15);
        for _ in 0..9 {
            heat.done(&base, t(10_300), true);
        }
        assert_eq!(cool(64), 2);
        heat.done(&base, t(10_400), false);
        assert_eq!(cool(1), 1);
        assert_eq!(heat.cool(&base, 4, false), 0);
        // A look at the first row: once a throttled window, again after one (or a clock
        // stepped back).
        assert!(heat.look(&base, t(10_000)) && !heat.look(&base, t(10_249)));
        assert!(heat.look(&base, t(10_250)) && heat.look(&base, t(9_000)));
        assert_eq!(
            (heat.cool(&base, 4, true), heat.cool(&base, 4, true)),
            (1, 2)
        );
        assert_eq!(heat.cool(&base, 4, false), 0);
        // Measures in a row count at one count only: a hot measure over 4 rows and one
        // over 16 are not two in a row.
        assert_eq!((heat.hot(&base, 4, true), heat.hot(&base, 4, true)), (1, 2));
        assert_eq!(
            (heat.hot(&base, 16, true), heat.hot(&base, 16, true)),
            (1, 2)
        );
    }

    #[test]
    fn a_lone_row_throttled_is_measured_within_its_window_from_the_first_throttle_seen() {
        let heat = Heat::default();
        let row = rpm();
        let at = |v: u64, throttled: bool, ms: i64| {
            heat.observe(&row, v, (1, throttled), t(ms))
                .map(|m| (m.per_row, m.all, m.whole))
        };
        assert_eq!(at(0, false, 0), None);
        // A burst of 40 writes before the first throttle this client saw, at 100 ms.
        assert_eq!(at(40, true, 100), None);
        assert_eq!(at(60, true, 300), None);
        // 25 writes in the 250 ms since: 100 a second, not the burst's 650.
        assert_eq!(at(65, true, 350), Some((100_000, 65, false)));
        // Again a quarter-window later at the soonest, over the span since the throttle.
        assert_eq!(at(80, true, 500), None);
        assert_eq!(at(90, true, 600), Some((100_000, 90, false)));
        assert_eq!(at(95, false, 900), None);
        // The window goes on to its end, and the whole of it is measured as ever.
        assert_eq!(at(130, true, 1_000), Some((130_000, 130, true)));
        // A row of a spread bucket is measured over whole windows only.
        let shard = row.shard(1);
        assert_eq!(heat.observe(&shard, 0, (4, true), t(0)), None);
        assert_eq!(heat.observe(&shard, 50, (4, true), t(500)), None);
        assert_eq!(heat.observe(&shard, 90, (4, true), t(900)), None);
    }

    #[test]
    fn a_window_counts_this_clients_writes_among_all_and_about_two_writers_act_on_it() {
        let heat = Heat::default();
        let row = rpm();
        assert_eq!(heat.observe(&row, 0, (1, false), t(0)), None);
        for v in 1..5 {
            assert_eq!(
                heat.observe(&row, v * 10, (1, false), t(v as i64 * 100)),
                None
            );
        }
        let m = heat.observe(&row, 100, (1, false), t(1_000)).unwrap();
        assert_eq!((m.per_row, m.own, m.all), (100_000, 5, 100));
        // Twice its share: 10 of every 100 draws.
        assert_eq!((0..100).filter(|roll| m.drawn(*roll, 0)).count(), 10);
        // Twice those odds after a window nobody acted on, and so on.
        assert_eq!((0..100).filter(|roll| m.drawn(*roll, 1)).count(), 20);
        assert_eq!((0..100).filter(|roll| m.drawn(*roll, 4)).count(), 100);
        assert!((0..100).all(|roll| m.drawn(roll, u32::MAX)));
        // The next window counts afresh.
        let next = heat.observe(&row, 300, (1, false), t(2_000)).unwrap();
        assert_eq!((next.own, next.all), (1, 200));
        // A row's only writer always acts, and so does one that wrote half.
        let alone = Measure {
            per_row: 3_000,
            own: 3,
            all: 3,
            whole: true,
        };
        let half = Measure {
            own: 2,
            all: 4,
            ..alone
        };
        assert!((0..100).all(|roll| alone.drawn(roll, 0) && half.drawn(roll, 0)));
    }

    #[test]
    fn a_rows_ceiling_is_what_it_took_while_throttled_unless_told_lower() {
        let heat = Heat::default();
        let base: Dimension = "openai#rpm".parse().unwrap();
        // Nothing told, nothing throttled: no ceiling known.
        assert_eq!(heat.ceiling(&base, None, None, (80_000, 0)), None);
        // One throttled write in a window teaches nothing; two do.
        assert_eq!(heat.ceiling(&base, None, None, (80_000, 1)), None);
        assert_eq!(
            heat.ceiling(&base, None, None, (80_500, 2)),
            Some((81, true))
        );
        // Learned, it stays without throttles; a told ceiling below it wins.
        assert_eq!(
            heat.ceiling(&base, Some(1_000), None, (10_000, 0)),
            Some((81, true))
        );
        assert_eq!(
            heat.ceiling(&base, Some(50), None, (10_000, 0)),
            Some((50, false))
        );
        // A later throttled measure raises it, never lowers it.
        assert_eq!(
            heat.ceiling(&base, Some(1_000), None, (400_000, 3)),
            Some((400, true))
        );
        assert_eq!(
            heat.ceiling(&base, None, None, (30_000, 5)),
            Some((400, true))
        );
        // Other buckets learn their own.
        let other: Dimension = "openai#tpm".parse().unwrap();
        assert_eq!(
            heat.ceiling(&other, Some(1_000), None, (0, 0)),
            Some((1_000, false))
        );
        // What the rows say another client learned counts as learned here, and the
        // highest still stands.
        let third: Dimension = "openai#images".parse().unwrap();
        assert_eq!(heat.learned(&third), None);
        assert_eq!(
            heat.ceiling(&third, Some(1_000), Some(120), (10_000, 0)),
            Some((120, true))
        );
        assert_eq!(heat.learned(&third), Some(120));
        assert_eq!(
            heat.ceiling(&third, Some(1_000), Some(90), (150_000, 2)),
            Some((150, true))
        );
    }
}
