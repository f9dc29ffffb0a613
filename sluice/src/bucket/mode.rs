//! Shadow mode: a bucket (or a client) that never refuses, and counts what it would have
//! refused.

use std::fmt;
use std::str::FromStr;

use super::{BucketState, Level, Take};
use crate::clock::UnixMillis;
use crate::tokens::Tokens;

/// Whether a bucket's acquires are refused when it is short, or only counted.
///
/// In [`Mode::Shadow`] an acquire is never refused and never waits: its tokens are still
/// taken (the vendor sees the call, so the bucket must too), the bucket may go into debt,
/// and enforcing clients on the same bucket see that usage. What an enforcing bucket would
/// have refused is counted (the metric `sluice_shadow_refusals_total`, a `tracing` event
/// and the row, shown by `sluice status`). Set per bucket ([`Bucket::with_mode`](crate::Bucket::with_mode),
/// `mode: shadow` in a bucket file) or per client ([`SluiceBuilder::mode`](crate::SluiceBuilder::mode),
/// `SLUICE_MODE=shadow`).
///
/// ```
/// use sluice::Mode;
///
/// assert_eq!("shadow".parse(), Ok(Mode::Shadow));
/// assert_eq!(Mode::default(), Mode::Enforce);
/// assert_eq!(Mode::Shadow.to_string(), "shadow");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Refuse what the bucket cannot grant (the default).
    #[default]
    Enforce,
    /// Grant everything, take the tokens, count what would have been refused.
    Shadow,
}

impl Mode {
    /// `enforce` or `shadow`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mode that is neither `enforce` nor `shadow`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown mode `{0}`; expected `enforce` or `shadow`")]
pub struct UnknownMode(pub String);

impl FromStr for Mode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "enforce" => Ok(Mode::Enforce),
            "shadow" => Ok(Mode::Shadow),
            other => Err(UnknownMode(other.to_owned())),
        }
    }
}

/// What shadow acquires left on a bucket row: how far below an enforcing bucket's level
/// the row is, and how many acquires an enforcing bucket would have refused.
///
/// The row's `tokens` are the real level, every shadow take included. An enforcing bucket
/// on the same schedule would hold `min(full, tokens + owed)`: a refused take is charged
/// to the row all the same, and adds its cost to `owed`. Shadow acquires decide against
/// that level, so they count the refusals an enforcing run would have had, however deep
/// in debt the row went: exactly for the writes of one client, and across clients as each
/// write's writer last saw the row (a shadow take is the fast path's write, computed from
/// the remembered row; see [`LedgerChange`]). Written only by shadow acquires (other
/// writes leave it as it is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ShadowLedger {
    /// How many tokens an enforcing bucket would hold above the row's level.
    pub owed: Tokens,
    /// How many acquires an enforcing bucket would have refused, since the bucket was
    /// created or its mode last changed.
    pub refused: u64,
}

impl ShadowLedger {
    /// Whether it holds nothing (the row then stores no shadow attributes).
    pub fn is_empty(&self) -> bool {
        *self == ShadowLedger::default()
    }
}

/// What a write does to a row's [`ShadowLedger`]: adds to what is owed and to the refusals
/// counted, which commutes with other writers' additions. A shadow take after which an
/// enforcing bucket would be full owes less than before (the refill it did not get): that
/// write sets what is owed from the row it was computed from, so it applies only to a row
/// that owes what that one did (`owed_was`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerChange {
    /// Added to what is owed (what is stored never goes below zero).
    pub owed: Tokens,
    /// Added to the refusals counted.
    pub refused: u64,
    /// The row must owe exactly this much, if set.
    pub owed_was: Option<Tokens>,
}

impl LedgerChange {
    /// The change that takes a row whose ledger was `before` to `after`, where the writes
    /// in between would have been refused for `refused_costs` in all: additions, unless
    /// what is owed went down on the way (then conditioned on `before`).
    pub(crate) fn between(
        before: &ShadowLedger,
        after: &ShadowLedger,
        refused_costs: Tokens,
    ) -> Self {
        LedgerChange {
            owed: after.owed - before.owed,
            refused: after.refused.saturating_sub(before.refused),
            owed_was: (after.owed != before.owed + refused_costs).then_some(before.owed),
        }
    }

    /// Whether it changes nothing and asks nothing.
    pub fn is_none(&self) -> bool {
        *self == LedgerChange::default()
    }

    /// Whether a row whose ledger is `ledger` satisfies its condition.
    pub fn holds(&self, ledger: &ShadowLedger) -> bool {
        self.owed_was.is_none_or(|was| ledger.owed == was)
    }

    /// `ledger` once the change is applied to it.
    pub fn applied(&self, ledger: &ShadowLedger) -> ShadowLedger {
        ShadowLedger {
            owed: (ledger.owed + self.owed).max(Tokens::ZERO),
            refused: ledger.refused.saturating_add(self.refused),
        }
    }
}

/// A shadow take of `cost` above `floor` from `row` at `now`: the row's new level (always
/// charged, debt allowed), its new ledger, and whether an enforcing bucket would have
/// refused it.
pub(crate) fn shadow_take(
    row: &BucketState,
    cost: Tokens,
    floor: Tokens,
    now: UnixMillis,
) -> (Level, ShadowLedger, bool) {
    // The enforcing bucket as of the row's last write: the row's level and what it owes,
    // taken from as an enforcing acquire takes (a take beyond a learned burst waits for
    // the refill up to it, as there).
    let mut would = row.clone();
    would.tokens = row.tokens.saturating_add(row.shadow.owed);
    let (would_after, real, refused) = match would.take_above(cost, floor, now) {
        Take::Granted { level } => {
            let top = row
                .holds()
                .max(cost.saturating_add(floor))
                .min(row.bucket.capacity());
            (level.tokens, row.refilled_to(top, now), false)
        }
        _ => (would.refilled(now).tokens, row.refilled(now), true),
    };
    let charged = Level {
        tokens: real.tokens.saturating_sub(cost),
        ..real
    };
    let ledger = ShadowLedger {
        owed: would_after.saturating_sub(charged.tokens).max(Tokens::ZERO),
        refused: row.shadow.refused.saturating_add(u64::from(refused)),
    };
    (charged, ledger, refused)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::bucket::Bucket;
    use crate::dimension::Dimension;
    use crate::rate::RefillRate;

    fn row(capacity: u64, per_second: u64) -> BucketState {
        let bucket = Bucket::tokens(RefillRate::per_second(per_second)).with_capacity(capacity);
        BucketState::full(
            Dimension::new("v#shadow").unwrap(),
            bucket,
            UnixMillis::new(0),
        )
    }

    /// A full row of a tokens bucket of up to 50 refilling up to 20 a second, with a burst
    /// learned from the vendor below its capacity (takes beyond it wait) or none.
    fn any_full_row() -> impl Strategy<Value = BucketState> {
        (1u64..50, 0u64..20, prop::option::of(1i64..50)).prop_map(
            |(capacity, per_second, burst)| {
                let mut full = row(capacity, per_second);
                full.burst = burst
                    .map(Tokens::new)
                    .filter(|b| *b < full.bucket.capacity());
                full.tokens = full.holds();
                full
            },
        )
    }

    proptest! {
        /// Shadow takes refuse exactly what an enforcing bucket refuses on the same
        /// schedule, while the row is charged every take.
        #[test]
        fn shadow_refusals_equal_an_enforcing_runs_refusals(
            mut enforcing in any_full_row(),
            schedule in prop::collection::vec((0u64..400, 0i64..12), 1..120),
        ) {
            let mut shadow = enforcing.clone();
            let mut refusals = 0u64;
            let mut now = UnixMillis::new(0);
            for (gap, cost) in schedule {
                now = now.saturating_add(std::time::Duration::from_millis(gap));
                // No take beyond a learned burst: such a take waits for refill beyond it,
                // which a refusal in between does not keep (see the docs).
                let cost = Tokens::new(cost).min(enforcing.holds());
                match enforcing.take(cost, now) {
                    Take::Granted { level } => enforcing.set_level(level),
                    _ => refusals += 1,
                }
                let (level, ledger, _) = shadow_take(&shadow, cost, Tokens::ZERO, now);
                shadow.set_level(level);
                shadow.shadow = ledger;
            }
            prop_assert_eq!(shadow.shadow.refused, refusals);
            // The row is an enforcing bucket's level less what it owes, and took more.
            let real = shadow.available(now);
            prop_assert!(real <= enforcing.available(now));
            prop_assert_eq!(
                real.saturating_add(shadow.shadow.owed).min(shadow.holds()),
                enforcing.available(now).min(enforcing.holds())
            );
        }
    }

    proptest! {
        /// A writer's shadow takes written in batches, each as the [`LedgerChange`] between
        /// the ledger it computed from and the one it left, leave the row's ledger exactly as
        /// taking them one by one does; what is owed is never negative.
        #[test]
        fn ledger_changes_of_batches_add_up_to_the_takes(
            full in any_full_row(),
            batches in prop::collection::vec(
                (0u64..400, prop::collection::vec(0i64..12, 1..5)),
                1..40,
            ),
        ) {
            let (mut stored, mut one_by_one) = (full.clone(), full);
            let mut now = UnixMillis::new(0);
            for (gap, costs) in batches {
                now = now.saturating_add(std::time::Duration::from_millis(gap));
                let mut after = stored.clone();
                let mut refused_costs = Tokens::ZERO;
                for cost in costs {
                    let cost = Tokens::new(cost).min(stored.holds());
                    let (level, ledger, refused) = shadow_take(&after, cost, Tokens::ZERO, now);
                    after.set_level(level);
                    after.shadow = ledger;
                    if refused {
                        refused_costs += cost;
                    }
                    let (level, ledger, _) = shadow_take(&one_by_one, cost, Tokens::ZERO, now);
                    one_by_one.set_level(level);
                    one_by_one.shadow = ledger;
                }
                let change = LedgerChange::between(&stored.shadow, &after.shadow, refused_costs);
                prop_assert!(change.holds(&stored.shadow));
                stored.shadow = change.applied(&stored.shadow);
                stored.set_level(after.level());
                prop_assert!(!stored.shadow.owed.is_negative());
            }
            prop_assert_eq!(stored.shadow, one_by_one.shadow);
        }
    }

    /// Additions commute: two writers' refusals computed from one row both count. What is
    /// owed going down is conditioned on the row it was computed from: of two such writes
    /// from one row, the second does not apply (its writer computes it again).
    #[test]
    fn additions_commute_and_a_lower_debt_is_conditioned() {
        let before = ShadowLedger {
            owed: Tokens::new(5),
            refused: 2,
        };
        let refusal = LedgerChange::between(
            &before,
            &ShadowLedger {
                owed: Tokens::new(8),
                refused: 3,
            },
            Tokens::new(3),
        );
        assert_eq!(refusal.owed_was, None);
        let twice = refusal.applied(&refusal.applied(&before));
        assert_eq!((twice.owed, twice.refused), (Tokens::new(11), 4));
        let lower = ShadowLedger {
            owed: Tokens::new(1),
            refused: 2,
        };
        let paid = LedgerChange::between(&before, &lower, Tokens::ZERO);
        assert_eq!(paid.owed_was, Some(Tokens::new(5)));
        let once = paid.applied(&before);
        assert_eq!(once, lower);
        assert!(!paid.holds(&once), "a second write from the same row");
        assert!(
            !paid.holds(&refusal.applied(&before)),
            "a refusal landed first"
        );
    }

    #[test]
    fn a_refused_take_is_charged_and_owed() {
        let full = row(10, 0);
        let (level, ledger, refused) =
            shadow_take(&full, Tokens::new(4), Tokens::ZERO, UnixMillis::new(0));
        assert!(!refused);
        assert_eq!((level.tokens, ledger.owed), (Tokens::new(6), Tokens::ZERO));
        let mut short = full.clone();
        short.set_level(level);
        short.shadow = ledger;
        let (level, ledger, refused) =
            shadow_take(&short, Tokens::new(8), Tokens::ZERO, UnixMillis::new(0));
        assert!(refused);
        assert_eq!(level.tokens, Tokens::new(-2));
        assert_eq!((ledger.owed, ledger.refused), (Tokens::new(8), 1));
    }
}
