//! A bucket as stored, and the pure arithmetic of taking, restoring and charging tokens.

use std::time::Duration;

use super::recent::{RECENT_WRITES, RecentWrites};
use super::refill::{Level, RefillCarry, level_reaching, refill, wait_until_available};
use super::{
    Bucket, BucketError, LimitType, MAX_VERSION, ShadowLedger, Waiting, timestamp_in_range,
};
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::priority::Priority;
use crate::tokens::Tokens;

/// A bucket as stored: its definition plus the changing state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketState {
    /// The dimension the bucket limits.
    pub dimension: Dimension,
    /// The bucket's definition.
    pub bucket: Bucket,
    /// Tokens at `last_refill_at` (may be negative: debt).
    pub tokens: Tokens,
    /// When refill was last accounted for.
    pub last_refill_at: UnixMillis,
    /// What refill had earned by `last_refill_at` beyond `tokens`: less than a billionth of
    /// a token (see [`RefillCarry`]).
    pub(crate) refill_carry: RefillCarry,
    /// When the writers of a fleet's start took their first grants from the row full (see
    /// [`Commute::herd`](crate::Commute::herd)): the refill timestamp the first of them
    /// set, which the others keep; `None` once any other write moved the refill
    /// timestamp. Other SDKs leave it as it is.
    pub(crate) herd_at: Option<UnixMillis>,
    /// Bumped by every write; writes are conditioned on it.
    pub version: u64,
    /// The id of the sluice write that produced this row (`None`: no sluice write has
    /// touched it since it was written whole by another tool). Every sluice write stamps a
    /// new random one; other SDKs leave it as it is and bump the version. The version and
    /// this id together name the row exactly: a write conditioned on both fails when the
    /// row is anything else, a bucket deleted and created again at a repeated version
    /// included.
    pub(crate) write_id: Option<u64>,
    /// The last sluice writes that produced this row and its predecessors: a writer whose
    /// answer was lost learns from it whether its write applied, even once other writers
    /// have moved the row on (see [`RecentWrites`]). Other SDKs leave it as it is; a row
    /// written whole by another tool has none.
    pub(crate) recent_writes: RecentWrites,
    /// The most a refilling bucket holds, as learned from the vendor's own reports (its
    /// burst: a vendor enforcing 600 a minute as 10 a second holds 10), or `None` for the
    /// bucket's capacity. Never above the capacity: it only ever makes the bucket
    /// stricter. Set by [`Tighten::Reported`](crate::Tighten::Reported); other SDKs
    /// leave it as it is and refill to the capacity.
    pub burst: Option<Tokens>,
    /// How many rows the bucket is spread over: 1 for a bucket in one row; for a sharded
    /// bucket, every one of its rows carries the count, and holds its share of the
    /// definition (see [`Sluice::reshard`](crate::Sluice::reshard)). Other SDKs leave it as
    /// it is.
    pub shards: u16,
    /// The most writes a second one row of the bucket took while the store throttled it,
    /// as the client that spread the bucket over its rows learned it (see
    /// [`Sharding`](crate::Sharding)), on every row; `None` until a client learns it. Every
    /// client measures the rows against it, so one that never saw the throttles does not
    /// gather rows that were spread because of them. Other SDKs leave it as it is.
    pub(crate) write_ceiling: Option<u32>,
    /// What shadow acquires left on the row (see [`ShadowLedger`]); empty unless the
    /// bucket, or a client of it, ran in [shadow mode](crate::Mode::Shadow). Other SDKs
    /// leave it as it is.
    pub(crate) shadow: ShadowLedger,
    /// The callers waiting for a slot, as the row counts them (see [`Waiting`]); empty
    /// unless the bucket is `concurrent` and callers waited on it. Other SDKs leave it as
    /// it is.
    pub(crate) waiting: Waiting,
}

/// What became of a write whose answer was lost (see [`BucketState::outcome_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteOutcome {
    /// It applied: its effect is in the row.
    Applied,
    /// It did not apply, and never will.
    NotApplied,
    /// The row no longer tells: too many writes since.
    Unknown,
}

/// The outcome of trying to take tokens from a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(not(feature = "unstable-store"), allow(unreachable_pub))]
pub enum Take {
    /// Granted: the bucket's level after the take.
    Granted {
        /// Tokens, refill timestamp and carry after the take.
        level: Level,
    },
    /// Not enough tokens now; with a refill rate, the exact wait until there are.
    Short {
        /// The wait, rounded up to the millisecond; `None` when the bucket does not
        /// refill over time (`concurrent`), so only a release can help.
        wait: Option<Duration>,
    },
    /// The cost is above the bucket's capacity: it can never be granted.
    ExceedsCapacity,
    /// The cost is within the capacity but above the most the acquire's priority may ever
    /// take, `share` (the capacity less the reserves it must leave): it can never be granted
    /// at this priority.
    ExceedsShare {
        /// The most the priority may take.
        share: Tokens,
    },
}

impl BucketState {
    storage_fn! {
        /// A new bucket, full, at `now`.
        fn full(dimension: Dimension, bucket: Bucket, now: UnixMillis) -> Self {
            BucketState {
                tokens: bucket.capacity(),
                dimension,
                bucket,
                last_refill_at: now,
                refill_carry: RefillCarry::ZERO,
                herd_at: None,
                version: 0,
                write_id: None,
                recent_writes: RecentWrites::default(),
                burst: None,
                shards: 1,
                write_ceiling: None,
                shadow: ShadowLedger::default(),
                waiting: Waiting::default(),
            }
        }
    }

    storage_fn! {
        /// Whether `other` is the same row for a write's condition: everything but the
        /// [`recent_writes`](Self::recent_writes), which follow from the write id.
        fn same_row(&self, other: &BucketState) -> bool {
            self.dimension == other.dimension
                && self.bucket == other.bucket
                && self.tokens == other.tokens
                && self.last_refill_at == other.last_refill_at
                && self.refill_carry == other.refill_carry
                && self.herd_at == other.herd_at
                && self.version == other.version
                && self.write_id == other.write_id
                && self.burst == other.burst
                && self.shards == other.shards
                && self.write_ceiling == other.write_ceiling
                && self.shadow == other.shadow
        }
    }

    storage_fn! {
        /// Whether the sluice write `write_id` is listed among the last that led to this row:
        /// it applied (see [`RecentWrites`]).
        fn wrote(&self, write_id: u64) -> bool {
            self.recent_writes.contains(write_id)
        }
    }

    /// The [`recent_writes`](Self::recent_writes) of the row a write `write_id` made at
    /// `at` over this one leaves.
    pub(crate) fn recent_after(&self, write_id: u64, at: UnixMillis) -> RecentWrites {
        self.recent_writes.after(write_id, at, RECENT_WRITES)
    }

    /// What became of the write `write_id`, made at `at` to give this bucket `version`,
    /// judged from this row, read after it (see [`RecentWrites`]).
    pub(crate) fn outcome_of(&self, write_id: u64, version: u64, at: UnixMillis) -> WriteOutcome {
        let listed = self.recent_writes.writes.len() as u64;
        if self.wrote(write_id) {
            WriteOutcome::Applied
        } else if self.version < version
            || self.version - version < listed.min(RECENT_WRITES as u64)
            || self.recent_writes.forgotten < at
        {
            WriteOutcome::NotApplied
        } else {
            WriteOutcome::Unknown
        }
    }

    storage_fn! {
        /// Checks a stored row: its definition is valid (see [`Bucket::validate`]) and its
        /// tokens, refill timestamp and version are within bounds. A store refuses to keep a
        /// row that fails this, and reports one it reads as corrupt.
        ///
        /// ```
        /// use sluice::{Bucket, error::BucketError, bucket::BucketState, RefillRate, Tokens, clock::UnixMillis};
        ///
        /// let now = UnixMillis::from_secs(1_700_000_000);
        /// let mut row = BucketState::full("openai#rpm".parse()?, Bucket::requests(RefillRate::per_second(1)), now);
        /// assert!(row.validate().is_ok());
        /// row.tokens = Tokens::MAX + Tokens::new(1);
        /// assert_eq!(row.validate().unwrap_err().attribute(), "tokens");
        /// # Ok::<(), sluice::error::DimensionError>(())
        /// ```
        fn validate(&self) -> Result<(), BucketError> {
            self.bucket.validate()?;
            if !self.tokens.is_within_bounds() {
                return Err(BucketError::Tokens(self.tokens));
            }
            if !timestamp_in_range(self.last_refill_at) {
                return Err(BucketError::RefillTimestamp(self.last_refill_at));
            }
            if self.version > MAX_VERSION {
                return Err(BucketError::Version(self.version));
            }
            if let Some(burst) = self
                .burst
                .filter(|b| *b <= Tokens::ZERO || *b > Tokens::MAX)
            {
                return Err(BucketError::Burst(burst));
            }
            Ok(())
        }
    }

    storage_fn! {
        /// The most the bucket holds: its capacity, or the vendor's [burst](Self::burst) when
        /// that is lower (`concurrent` buckets do not refill and always hold their capacity).
        ///
        /// ```
        /// use sluice::{Bucket, bucket::BucketState, RefillRate, Tokens, clock::UnixMillis};
        ///
        /// let now = UnixMillis::from_secs(1_700_000_000);
        /// let mut row = BucketState::full("openai#rpm".parse()?, Bucket::requests(RefillRate::per_minute(600)), now);
        /// assert_eq!(row.holds(), Tokens::new(600));
        /// row.burst = Some(Tokens::new(10)); // the vendor takes 10 at once
        /// assert_eq!(row.holds(), Tokens::new(10));
        /// assert_eq!(row.available(now), Tokens::new(10));
        /// # Ok::<(), sluice::error::DimensionError>(())
        /// ```
        fn holds(&self) -> Tokens {
            let capacity = self.bucket.capacity();
            match self.burst {
                Some(burst) if self.bucket.limit_type() != LimitType::Concurrent => {
                    burst.clamp(Tokens::ZERO, capacity)
                }
                _ => capacity,
            }
        }
    }

    storage_fn! {
        /// The row's level: its tokens, refill timestamp and carry.
        fn level(&self) -> Level {
            Level {
                tokens: self.tokens,
                last_refill_at: self.last_refill_at,
                carry: self.refill_carry,
            }
        }
    }

    storage_fn! {
        /// Sets the row's tokens, refill timestamp and carry.
        fn set_level(&mut self, level: Level) {
            self.tokens = level.tokens;
            self.last_refill_at = level.last_refill_at;
            self.refill_carry = level.carry;
        }
    }

    storage_fn! {
        /// The level at `now`, after lazy refill up to what the bucket
        /// [holds](Self::holds).
        fn refilled(&self, now: UnixMillis) -> Level {
            self.refilled_to(self.holds(), now)
        }
    }

    pub(crate) fn refilled_to(&self, cap: Tokens, now: UnixMillis) -> Level {
        refill(self.level(), cap, self.bucket.effective_rate(), now)
    }

    storage_fn! {
        /// This row as it stands at `now`: refilled, nothing else changed.
        fn refilled_row(&self, now: UnixMillis) -> BucketState {
            let mut row = self.clone();
            row.set_level(self.refilled(now));
            row
        }
    }

    /// Tokens available at `now`.
    pub fn available(&self, now: UnixMillis) -> Tokens {
        self.refilled(now).tokens
    }

    storage_fn! {
        /// Tries to take `cost` tokens at `now`, at the highest priority (no reserve kept).
        fn take(&self, cost: Tokens, now: UnixMillis) -> Take {
            self.take_as(cost, None, now)
        }
    }

    storage_fn! {
        /// Tries to take `cost` tokens at `now` for an acquire at `priority`: granted only if
        /// the bucket still holds the priority's [floor](Bucket::floor_for) afterwards; when
        /// short, the wait is exact to the moment it will.
        ///
        /// ```
        /// use std::time::Duration;
        /// use sluice::{Bucket, bucket::BucketState, RefillRate, store::Take, Tokens, clock::UnixMillis};
        ///
        /// let now = UnixMillis::from_secs(1_700_000_000);
        /// let bucket = Bucket::requests(RefillRate::per_second(10))
        ///     .with_capacity(10)
        ///     .with_reserve("interactive".parse()?, 4);
        /// let mut row = BucketState::full("openai#rpm".parse()?, bucket, now);
        /// row.tokens = Tokens::new(5);
        /// let batch = "batch".parse()?;
        /// // `batch` must leave 4: one more is granted, the second waits for a refill.
        /// assert!(matches!(row.take_as(1.into(), Some(&batch), now), Take::Granted { .. }));
        /// assert_eq!(
        ///     row.take_as(2.into(), Some(&batch), now),
        ///     Take::Short { wait: Some(Duration::from_millis(100)) }
        /// );
        /// assert!(matches!(row.take_as(5.into(), Some(&"interactive".parse()?), now), Take::Granted { .. }));
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        fn take_as(&self, cost: Tokens, priority: Option<&Priority>, now: UnixMillis) -> Take {
            self.take_above(cost, self.bucket.floor_for(priority), now)
        }
    }

    /// [`take_as`](Self::take_as) for a priority whose floor is `floor`.
    pub(crate) fn take_above(&self, cost: Tokens, floor: Tokens, now: UnixMillis) -> Take {
        let capacity = self.bucket.capacity();
        if cost > capacity {
            return Take::ExceedsCapacity;
        }
        let need = cost.saturating_add(floor);
        if need > capacity {
            return Take::ExceedsShare {
                share: capacity.saturating_sub(floor),
            };
        }
        // A take larger than the vendor's burst waits until the bucket has refilled to it
        // (never past the capacity): the bucket then holds exactly it, at once.
        let level = self.refilled_to(self.holds().max(need).min(capacity), now);
        if level.tokens >= need {
            return Take::Granted {
                level: Level {
                    tokens: level.tokens - cost,
                    ..level
                },
            };
        }
        Take::Short {
            wait: wait_until_available(level, self.bucket.effective_rate(), need, now),
        }
    }

    /// Tokens available at `now` to one acquire at `priority`: what it may take without
    /// touching the reserves above it (never negative).
    pub fn available_to(&self, priority: Option<&Priority>, now: UnixMillis) -> Tokens {
        crate::priority::above(self.available(now), self.bucket.floor_for(priority))
    }

    storage_fn! {
        /// The level after giving back `amount` at `now` (release of a concurrent slot, or
        /// reconciliation), capped at capacity.
        fn restored(&self, amount: Tokens, now: UnixMillis) -> Level {
            let level = self.refilled(now);
            let tokens = (level.tokens + amount).min(self.holds()).max(level.tokens);
            self.at_most_full(Level { tokens, ..level })
        }
    }

    storage_fn! {
        /// The level after charging `delta` more at `now` (a lease's adjustment). The result
        /// may be negative (debt); a negative `delta` refunds, capped at capacity.
        ///
        /// Debt stops at [`Tokens::MAX`] below zero.
        fn charged(&self, delta: Tokens, now: UnixMillis) -> Level {
            let level = self.refilled(now);
            let tokens = if delta >= Tokens::ZERO {
                level.tokens.saturating_sub(delta)
            } else {
                (level.tokens - delta).min(self.holds()).max(level.tokens)
            };
            self.at_most_full(Level { tokens, ..level })
        }
    }

    /// `level`, carrying nothing once it is full: a full bucket earns no part of a token.
    fn at_most_full(&self, level: Level) -> Level {
        if level.tokens >= self.holds() {
            Level::new(level.tokens, level.last_refill_at)
        } else {
            level
        }
    }

    storage_fn! {
        /// The level after lowering the bucket to at most `limit` tokens at `now` (a vendor
        /// said only that many remain), or `None` when it already holds no more than that:
        /// tightening never makes a bucket looser.
        ///
        /// ```
        /// use std::time::Duration;
        /// use sluice::{Bucket, bucket::BucketState, store::Level, RefillRate, Tokens, clock::UnixMillis};
        ///
        /// let now = UnixMillis::from_secs(1_700_000_000);
        /// let bucket = Bucket::requests(RefillRate::per_second(10)).with_capacity(10);
        /// let full = BucketState::full("openai#rpm".parse()?, bucket, now);
        /// assert_eq!(full.lowered_to(Tokens::new(3), now), Some(Level::new(Tokens::new(3), now)));
        /// assert_eq!(full.lowered_to(Tokens::new(20), now), None);
        /// # Ok::<(), sluice::error::DimensionError>(())
        /// ```
        fn lowered_to(&self, limit: Tokens, now: UnixMillis) -> Option<Level> {
            let level = self.refilled(now);
            (limit < level.tokens || (limit == level.tokens && !level.carry.is_zero()))
                .then_some(Level::new(limit, level.last_refill_at))
        }
    }

    storage_fn! {
        /// The level after emptying a refilling bucket for `pause` from `now` (a vendor
        /// answered 429 with that delay): nothing is granted before `now + pause`, when exactly
        /// `cost_per_call` is available, and refill goes on at the bucket's rate after that.
        /// `None` for a bucket that does not refill, or one already at least this strict.
        ///
        /// ```
        /// use std::time::Duration;
        /// use sluice::{Bucket, bucket::BucketState, RefillRate, store::Take, clock::UnixMillis};
        ///
        /// let now = UnixMillis::from_secs(1_700_000_000);
        /// let mut state = BucketState::full("openai#rpm".parse()?, Bucket::requests(RefillRate::per_minute(7)), now);
        /// state.set_level(state.emptied_for(Duration::from_secs(7), now).unwrap());
        /// assert_eq!(state.take(1.into(), now), Take::Short { wait: Some(Duration::from_secs(7)) });
        /// # Ok::<(), sluice::error::DimensionError>(())
        /// ```
        fn emptied_for(&self, pause: Duration, now: UnixMillis) -> Option<Level> {
            self.holding_after(self.bucket.cost_per_call(), pause, now)
        }
    }

    /// The level at which the row holds `amount` exactly when `pause` has passed (and less
    /// until then), or `None` when it already holds no more than that at every instant:
    /// [`emptied_for`](Self::emptied_for) for a share of a call (a row of a spread bucket,
    /// whose rows together hold one call's cost then).
    pub(crate) fn holding_after(
        &self,
        amount: Tokens,
        pause: Duration,
        now: UnixMillis,
    ) -> Option<Level> {
        let rate = self.bucket.effective_rate();
        let level = self.refilled(now);
        let ready_at = now.saturating_add(pause);
        let target = level_reaching(amount, ready_at, rate, now)?;
        // Compared where the row's refill begins, which may be later than `now` (a fill
        // stamped ahead): stricter then, the target is stricter at every instant.
        let then = refill(target, self.holds(), rate, level.last_refill_at.max(now));
        then.is_below(&level).then_some(target)
    }

    /// The time until the bucket is full, if it refills over time; zero when full.
    pub fn time_to_full(&self, now: UnixMillis) -> Option<Duration> {
        let level = self.refilled(now);
        if level.tokens >= self.holds() {
            return Some(Duration::ZERO);
        }
        wait_until_available(level, self.bucket.effective_rate(), self.holds(), now)
    }
}
