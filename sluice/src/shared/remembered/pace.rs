//! How often other writers write a row, as one client sees it: every write bumps the row's
//! version, whoever makes it, so the versions the store hands this client, less this
//! client's own writes, count the others' (see [`Want::others_per_ks`](crate::bucket::Want)).

use crate::clock::UnixMillis;

/// The shortest span the pace is measured over: two rows learned within one write (a race
/// lost, then won) say little of a rate.
const SPAN_MILLIS: i64 = 100;

/// Other writers' pace on one row.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Pace {
    /// The version the current span began at, when, and this client's writes since.
    from: Option<(u64, UnixMillis, u64)>,
    /// Other writers' writes a second, in thousandths, over the last span measured.
    others_per_ks: u64,
}

impl Pace {
    /// Notes the row at `version`, learned at `now`, from this client's own write when
    /// `own`.
    pub(crate) fn note(&mut self, version: u64, now: UnixMillis, own: bool) {
        let own = u64::from(own);
        let Some((since, at, mine)) = self.from else {
            self.from = Some((version, now, 0));
            return;
        };
        let span = now.as_millis() - at.as_millis();
        // More writes than a row takes in ten times DynamoDB's ceiling of an item (a
        // thousand a second): a bucket created again under the same name, whose version
        // starts from its creation time.
        let jumped = (version.saturating_sub(since)) > span.unsigned_abs().saturating_mul(10);
        if version < since || span < 0 || jumped {
            // Another bucket under the same name, or a clock stepped back.
            *self = Pace {
                from: Some((version, now, 0)),
                others_per_ks: 0,
            };
            return;
        }
        if span < SPAN_MILLIS {
            self.from = Some((since, at, mine + own));
            return;
        }
        let others = (version - since).saturating_sub(mine + own);
        self.others_per_ks = others.saturating_mul(1_000_000) / span.unsigned_abs();
        self.from = Some((version, now, 0));
    }

    /// Other writers' writes a second, in thousandths, as last measured.
    pub(crate) fn others_per_ks(&self) -> u64 {
        self.others_per_ks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> UnixMillis {
        UnixMillis::new(1_700_000_000_000 + ms)
    }

    #[test]
    fn the_pace_counts_other_writers_over_a_span_of_a_tenth_of_a_second_or_more() {
        // Each row learned: its version, when, whether from this client's own write, and
        // the pace measured then.
        let steps: [(u64, i64, bool, u64); 11] = [
            (10, 0, true, 0),
            // This client's own write, too soon to measure.
            (11, 50, true, 0),
            // 48 writes in 200 ms, two of them this client's: 46 by others, 230 a second.
            (58, 200, true, 230_000),
            // Nobody else since: none.
            (59, 400, true, 0),
            // A row learned from a read counts every write since as another's.
            (79, 600, false, 100_000),
            // A bucket created again (its version went back) starts over.
            (3, 700, false, 0),
            (13, 800, false, 100_000),
            // A clock stepped back starts over too.
            (20, 100, false, 0),
            // So does a bucket created again at a version from its creation time, far
            // ahead.
            (30, 200, false, 100_000),
            (1_700_000_000_300_000, 300, false, 0),
            (1_700_000_000_300_010, 400, false, 100_000),
        ];
        let mut pace = Pace::default();
        for (version, ms, own, expected) in steps {
            pace.note(version, at(ms), own);
            assert_eq!(pace.others_per_ks(), expected, "at {ms} ms");
        }
    }
}
