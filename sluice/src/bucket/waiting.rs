//! Callers waiting for a slot of a `concurrent` bucket, counted on its row, so that however
//! many wait, together they look at the row at a bounded rate (see [`Waiting`]).

// Public with the `unstable-store` feature (`sluice::store`), crate-private without it.
#![cfg_attr(not(feature = "unstable-store"), allow(unreachable_pub))]

use std::time::Duration;

use crate::clock::UnixMillis;

/// How long one count of waiting callers runs, in unix time: a client adds its waiting
/// callers at most once per epoch.
const EPOCH: Duration = Duration::from_secs(20);
/// How many of the clients waiting on a bucket add their callers to an epoch's count,
/// about: the others are counted by chance (see [`Waiting::addition`]).
const SAMPLED: u64 = 32;
/// How often the waiting callers of one bucket together look at its row, about: each
/// looks once every `waiting callers / LOOKS_PER_SECOND` seconds on average (never more
/// often than the slot poll interval, never less than once an epoch).
const LOOKS_PER_SECOND: u64 = 100;
/// The most epochs a row keeps a count of: the current one and the one before.
const KEPT: usize = 2;

/// Callers waiting for a slot of a `concurrent` bucket, as its row counts them: for the
/// last epochs (20 s of unix time each) in which one was counted, about how many waited.
///
/// A client refused a slot that looks at the row again adds its waiting callers once per
/// epoch (or, when many wait, one client in `n` does, adding `n` times its callers: about
/// 32 writes an epoch, however many wait), in a write that changes nothing else (no
/// version, no write id: it never fails another writer's condition). Every client reads
/// the count with the row, and each waiting caller spaces its looks so that together they
/// look about 100 times a second. A row written whole keeps the counts its writer read;
/// other SDKs leave them as they are.
///
/// ```
/// use sluice::store::Waiting;
///
/// assert_eq!(Waiting::default().counts().count(), 0);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Waiting {
    /// `(epoch, callers)`, by epoch.
    counts: Vec<(u64, u64)>,
}

// How a store reads and writes the counts: DynamoDB's rows, or a store of one's own.
#[cfg_attr(
    not(any(feature = "dynamodb", feature = "unstable-store")),
    allow(dead_code)
)]
impl Waiting {
    /// The counts as stored, `(epoch, callers)` by epoch, an epoch being the number of
    /// whole 20-second spans since the unix epoch.
    pub fn counts(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.counts.iter().copied()
    }

    /// The counts `counts` (any order; a repeated epoch keeps its largest count).
    pub fn from_counts(counts: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut counts: Vec<(u64, u64)> = counts.into_iter().collect();
        counts.sort_unstable();
        counts.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                earlier.1 = earlier.1.max(later.1);
            }
            same
        });
        Waiting { counts }
    }

    /// The epoch `now` falls in.
    pub(crate) fn epoch(now: UnixMillis) -> u64 {
        let millis = u64::try_from(now.as_millis()).unwrap_or(0);
        millis / EPOCH.as_millis() as u64
    }

    /// About how many callers wait at `now`: the larger of the current epoch's count and
    /// the last one's (the current one is still filling).
    pub(crate) fn callers(&self, now: UnixMillis) -> u64 {
        let epoch = Self::epoch(now);
        self.counts
            .iter()
            .filter(|(e, _)| *e == epoch || e.saturating_add(1) == epoch)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    }

    /// What a client with `mine` waiting callers adds to the count at `now`, if it counts
    /// this epoch: when the count is under [`SAMPLED`] times its callers, them; else it
    /// counts with a chance of `SAMPLED × mine / callers` (`roll(n)` draws in `0..n`),
    /// adding `callers / SAMPLED`: as many in expectation, in about [`SAMPLED`] writes an
    /// epoch however many wait.
    pub(crate) fn addition(
        &self,
        now: UnixMillis,
        mine: u64,
        roll: impl FnOnce(u64) -> u64,
    ) -> Option<u64> {
        let callers = self.callers(now);
        let chances = SAMPLED.saturating_mul(mine.max(1));
        if callers <= chances {
            return Some(mine.max(1));
        }
        (roll(callers) < chances).then(|| callers.div_ceil(SAMPLED))
    }

    /// The epochs whose counts a client counting at `now` forgets: all but the current and
    /// the last one (and any later one, from a clock ahead of this one).
    pub(crate) fn stale(&self, now: UnixMillis) -> Vec<u64> {
        let last = Self::epoch(now).saturating_sub(1);
        self.counts
            .iter()
            .map(|(e, _)| *e)
            .filter(|e| *e < last)
            .collect()
    }

    /// Adds `weight` callers to `epoch`'s count and forgets the `stale` epochs: what the
    /// store does (see [`Store::count_waiting`](crate::store::Store::count_waiting)).
    pub(crate) fn add(&mut self, epoch: u64, weight: u64, stale: &[u64]) {
        self.counts
            .retain(|(e, _)| *e == epoch || !stale.contains(e));
        match self.counts.iter_mut().find(|(e, _)| *e == epoch) {
            Some((_, n)) => *n = n.saturating_add(weight),
            None => {
                self.counts.push((epoch, weight));
                self.counts.sort_unstable();
            }
        }
        // A row never keeps more than a few: a bucket waited on now and then keeps none
        // from long ago.
        let excess = self.counts.len().saturating_sub(KEPT + 1);
        self.counts.drain(..excess);
    }

    /// The poll interval of a waiting caller at `now`, at least `poll`: a waiting caller
    /// looks at the row after a random half to all of it (three quarters on average), so
    /// it is spaced so that the waiting callers together look about [`LOOKS_PER_SECOND`]
    /// times a second, and at most an epoch (so that each client counts in every epoch its
    /// callers wait through).
    pub(crate) fn spacing(&self, now: UnixMillis, poll: Duration) -> Duration {
        let callers = u32::try_from(self.callers(now)).unwrap_or(u32::MAX);
        let each = Duration::from_micros(4_000_000 / (3 * LOOKS_PER_SECOND));
        poll.max(each.saturating_mul(callers).min(EPOCH))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_epoch(epoch: u64, plus_ms: i64) -> UnixMillis {
        UnixMillis::new(epoch as i64 * EPOCH.as_millis() as i64 + plus_ms)
    }

    #[test]
    fn the_count_is_the_larger_of_this_epoch_and_the_last() {
        let w = Waiting::from_counts([(9, 500), (10, 40), (11, 7)]);
        assert_eq!(w.callers(at_epoch(11, 0)), 40);
        assert_eq!(w.callers(at_epoch(10, 19_999)), 500);
        assert_eq!(w.callers(at_epoch(12, 0)), 7);
        assert_eq!(
            w.callers(at_epoch(13, 0)),
            0,
            "two epochs on, nobody counted"
        );
        assert_eq!(w.stale(at_epoch(11, 5)), vec![9]);
    }

    #[test]
    fn looks_are_spaced_by_the_waiting_callers() {
        let poll = Duration::from_millis(300);
        let now = at_epoch(10, 0);
        assert_eq!(Waiting::default().spacing(now, poll), poll);
        let spacing = |n| Waiting::from_counts([(10, n)]).spacing(now, poll);
        assert_eq!(spacing(10), poll, "ten callers look 44 times a second");
        assert_eq!(spacing(60), Duration::from_micros(799_980));
        assert_eq!(spacing(1_000), Duration::from_micros(13_333_000));
        assert_eq!(
            spacing(1_000_000),
            EPOCH,
            "every caller looks once an epoch"
        );
    }

    #[test]
    fn many_clients_count_their_callers_by_chance() {
        let now = at_epoch(10, 0);
        let none = Waiting::default();
        assert_eq!(none.addition(now, 20, |_| unreachable!()), Some(20));
        let few = Waiting::from_counts([(10, 640)]);
        assert_eq!(few.addition(now, 20, |_| unreachable!()), Some(20));
        // 3,200 waiting: a client of 20 counts with a chance of 640 in 3,200, adding 100.
        let many = Waiting::from_counts([(9, 3_200)]);
        assert_eq!(many.addition(now, 20, |n| n - 1), None);
        assert_eq!(many.addition(now, 20, |_| 639), Some(100));
        assert_eq!(many.addition(now, 20, |_| 640), None);
        // In expectation, its 20.
        let expected: u64 = (0..3_200)
            .filter_map(|r| many.addition(now, 20, |_| r))
            .sum::<u64>()
            / 3_200;
        assert_eq!(expected, 20);
    }

    #[test]
    fn adding_forgets_the_stale_epochs_and_keeps_a_few() {
        let mut w = Waiting::from_counts([(1, 3), (9, 5)]);
        w.add(10, 2, &[1]);
        assert_eq!(w.counts().collect::<Vec<_>>(), vec![(9, 5), (10, 2)]);
        w.add(10, 4, &[]);
        assert_eq!(w.counts().collect::<Vec<_>>(), vec![(9, 5), (10, 6)]);
        let mut crowded = Waiting::from_counts([(1, 1), (2, 1), (3, 1), (4, 1)]);
        crowded.add(5, 1, &[]);
        assert_eq!(crowded.counts().count(), 3);
    }

    #[test]
    fn a_repeated_epoch_keeps_its_largest_count() {
        let w = Waiting::from_counts([(4, 1), (3, 2), (4, 9)]);
        assert_eq!(w.counts().collect::<Vec<_>>(), vec![(3, 2), (4, 9)]);
    }
}
