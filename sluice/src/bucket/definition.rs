//! A bucket's definition: what it counts, how much it holds, how fast it refills.

use std::fmt;
use std::str::FromStr;

use crate::clock::UnixMillis;
use crate::priority::{MAX_RESERVES, Priority, Reserve, floor};
use crate::rate::RefillRate;
use crate::tokens::{NANOS_PER_TOKEN, Tokens};

/// What a bucket counts, which decides how its tokens come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitType {
    /// Requests per period: tokens refill over time and stay consumed on release.
    Requests,
    /// Tokens (e.g. LLM tokens) per period: like `Requests`, usually with a larger cost.
    Tokens,
    /// Calls in flight: tokens never refill over time; release gives them back.
    Concurrent,
}

impl LimitType {
    /// The name stored in rows: `requests`, `tokens` or `concurrent`.
    pub const fn as_str(self) -> &'static str {
        match self {
            LimitType::Requests => "requests",
            LimitType::Tokens => "tokens",
            LimitType::Concurrent => "concurrent",
        }
    }

    /// Whether release gives the lease's tokens back.
    pub const fn restores_on_release(self) -> bool {
        matches!(self, LimitType::Concurrent)
    }

    /// Whether tokens come back over time (`requests`, `tokens`), rather than only through
    /// releases (`concurrent`).
    pub const fn refills(self) -> bool {
        !matches!(self, LimitType::Concurrent)
    }
}

impl fmt::Display for LimitType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `limit_type` that is not one of `requests`, `tokens`, `concurrent`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown limit type `{0}`; expected `requests`, `tokens` or `concurrent`")]
pub struct UnknownLimitType(pub String);

impl FromStr for LimitType {
    type Err = UnknownLimitType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "requests" => Ok(LimitType::Requests),
            "tokens" => Ok(LimitType::Tokens),
            "concurrent" => Ok(LimitType::Concurrent),
            other => Err(UnknownLimitType(other.to_owned())),
        }
    }
}

/// The definition of a bucket: what an operator configures for a dimension.
///
/// ```
/// use sluice::{Bucket, LimitType, RefillRate, Tokens};
///
/// // OpenAI: 500 requests per minute, 2,000,000 tokens per minute.
/// let rpm = Bucket::requests(RefillRate::per_minute(500));
/// assert_eq!(rpm.capacity(), Tokens::new(500));
/// let tpm = Bucket::tokens(RefillRate::per_minute(2_000_000));
/// assert_eq!(tpm.limit_type(), LimitType::Tokens);
///
/// // ElevenLabs: 10 calls in flight.
/// let concurrent = Bucket::concurrent(10);
/// assert!(concurrent.refill_rate().is_zero());
///
/// // A burst of 50 on top of a sustained 10 per second, and a call that costs 2.
/// let burst = Bucket::requests(RefillRate::per_second(10))
///     .with_capacity(50)
///     .with_cost_per_call(2);
/// assert!(burst.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    pub(super) limit_type: LimitType,
    pub(super) capacity: Tokens,
    pub(super) refill_rate: RefillRate,
    pub(super) cost_per_call: Tokens,
    pub(super) leases: bool,
    pub(super) reserves: Vec<Reserve>,
    pub(super) shards: Option<super::ShardLimit>,
    pub(super) mode: super::Mode,
    pub(super) schedule: Option<std::sync::Arc<super::Schedule>>,
    pub(super) keyed: bool,
    pub(super) overrides: bool,
}

/// Why a bucket definition is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BucketError {
    /// Capacity is zero, negative, or above [`Tokens::MAX`].
    #[error("capacity must be positive and at most 10^18, got {0}")]
    Capacity(Tokens),
    /// Refill rate is negative or above [`RefillRate::MAX`].
    #[error("refill rate must be between 0 and 10^15 per second, got {0}")]
    RefillRate(RefillRate),
    /// A requests or tokens bucket that never refills.
    #[error("a `{0}` bucket needs a positive refill rate")]
    NoRefill(LimitType),
    /// A concurrent bucket with a refill rate.
    #[error("a `concurrent` bucket does not refill over time; its refill rate must be 0")]
    ConcurrentRefill,
    /// A concurrent bucket in lean mode.
    #[error("a `concurrent` bucket cannot be lean: its slots come back through lease rows")]
    LeanConcurrent,
    /// Cost per call is negative or above capacity.
    #[error("cost per call must be between 0 and the capacity {capacity}, got {cost}")]
    CostPerCall {
        /// The cost per call given.
        cost: Tokens,
        /// The bucket's capacity.
        capacity: Tokens,
    },
    /// A stored bucket's tokens are beyond [`Tokens::MAX`] either way.
    #[error("tokens must be between -10^18 and 10^18, got {0}")]
    Tokens(Tokens),
    /// A stored bucket's refill timestamp is before the epoch or after the year 9999.
    #[error("the refill timestamp must be between 1970 and 9999, got {0}")]
    RefillTimestamp(UnixMillis),
    /// A stored bucket's version is above `MAX_VERSION`.
    #[error("version must be at most {max}, got {0}", max = MAX_VERSION)]
    Version(u64),
    /// A reserve of no tokens, fewer, or more than [`Tokens::MAX`].
    #[error("the reserve for `{priority}` must be positive, got {tokens}")]
    ReserveTokens {
        /// The priority.
        priority: Priority,
        /// The tokens given.
        tokens: Tokens,
    },
    /// A priority listed twice among the reserves.
    #[error("the priority `{0}` has two reserves; list each priority once")]
    DuplicateReserve(Priority),
    /// More reserves than [`MAX_RESERVES`].
    #[error("a bucket keeps at most {max} reserves, got {0}", max = MAX_RESERVES)]
    TooManyReserves(usize),
    /// Reserves that add up to more than the capacity.
    #[error("the reserves add up to {reserved}, more than the capacity {capacity}")]
    ReservesExceedCapacity {
        /// The reserves' sum.
        reserved: Tokens,
        /// The bucket's capacity.
        capacity: Tokens,
    },
    /// A stored burst (learned from the vendor) that is not positive, or above
    /// [`Tokens::MAX`].
    #[error("a learned burst must be positive and at most 10^18, got {0}")]
    Burst(Tokens),
    /// A shard limit beyond 1 to [`MAX_SHARDS`](crate::MAX_SHARDS) rows, or one over
    /// several rows for a `concurrent` bucket (whose slots stay in one row).
    #[error("a bucket is spread over 1 to 32 rows (a `concurrent` bucket over one), not {0}")]
    Shards(super::ShardLimit),
    /// A scheduled window (counted from 0) that begins where it ends, or past the day.
    #[error("schedule window {0} begins where it ends; give it a length")]
    EmptyWindow(usize),
    /// A scheduled window (counted from 0) whose limits are not a bucket's.
    #[error("schedule window {window}: {source}")]
    Window {
        /// The window, counted from 0.
        window: usize,
        /// What is wrong with its limits.
        source: Box<BucketError>,
    },
}

impl BucketError {
    /// The stored attribute the problem is in.
    pub fn attribute(&self) -> &'static str {
        match self {
            BucketError::Capacity(_) => "capacity",
            BucketError::RefillRate(_)
            | BucketError::NoRefill(_)
            | BucketError::ConcurrentRefill => "refill_rate",
            BucketError::LeanConcurrent => "lean",
            BucketError::CostPerCall { .. } => "cost_per_call",
            BucketError::Tokens(_) => "tokens",
            BucketError::RefillTimestamp(_) => "last_refill_at",
            BucketError::Version(_) => "version",
            BucketError::ReserveTokens { .. }
            | BucketError::DuplicateReserve(_)
            | BucketError::TooManyReserves(_)
            | BucketError::ReservesExceedCapacity { .. } => "reserves",
            BucketError::Burst(_) => "burst",
            BucketError::Shards(_) => "shard_limit",
            BucketError::EmptyWindow(_) | BucketError::Window { .. } => "schedule",
        }
    }
}

/// The largest version a bucket row may carry: 2^53 - 1, the largest integer every SDK
/// sharing the table (JavaScript's numbers included) holds exactly.
#[cfg_attr(not(feature = "unstable-store"), allow(unreachable_pub))]
pub const MAX_VERSION: u64 = (1 << 53) - 1;

/// The latest refill timestamp a row may carry: the last millisecond of the year 9999.
pub(super) const MAX_TIMESTAMP: UnixMillis = UnixMillis::new(253_402_300_799_999);

/// Whether a refill timestamp is one a row may carry: from 1970 to the year 9999.
pub(crate) fn timestamp_in_range(t: UnixMillis) -> bool {
    (UnixMillis::EPOCH..=MAX_TIMESTAMP).contains(&t)
}

/// The version a bucket sluice creates starts at: its creation time in milliseconds,
/// times 1,000. A bucket deleted and created again so continues above the versions its
/// predecessor reached (one row takes at most about 1,000 writes per second), and a
/// writer that remembers the old row never finds its version again.
pub(crate) fn first_version(now: UnixMillis) -> u64 {
    u64::try_from(now.as_millis())
        .unwrap_or(0)
        .saturating_mul(1_000)
        .min(MAX_VERSION / 2)
}

impl Bucket {
    /// A bucket of any type. Prefer the typed constructors.
    pub fn new(
        limit_type: LimitType,
        capacity: impl Into<Tokens>,
        refill_rate: RefillRate,
    ) -> Self {
        Bucket {
            limit_type,
            capacity: capacity.into(),
            refill_rate,
            cost_per_call: Tokens::new(1),
            leases: true,
            reserves: Vec::new(),
            shards: None,
            mode: super::Mode::Enforce,
            schedule: None,
            keyed: false,
            overrides: false,
        }
    }

    /// A `requests` bucket refilling at `rate`, with a capacity of one minute's refill
    /// (at least one second's), rounded to whole tokens. Change it with
    /// [`with_capacity`](Self::with_capacity).
    pub fn requests(rate: RefillRate) -> Self {
        Bucket::new(LimitType::Requests, default_capacity(rate), rate)
    }

    /// A `tokens` bucket refilling at `rate`, with a capacity of one minute's refill,
    /// rounded to whole tokens. Change it with [`with_capacity`](Self::with_capacity).
    pub fn tokens(rate: RefillRate) -> Self {
        Bucket::new(LimitType::Tokens, default_capacity(rate), rate)
    }

    /// A `concurrent` bucket: at most `slots` calls in flight.
    pub fn concurrent(slots: u64) -> Self {
        Bucket::new(LimitType::Concurrent, slots, RefillRate::ZERO)
    }

    /// Sets the capacity (the burst size).
    pub fn with_capacity(mut self, capacity: impl Into<Tokens>) -> Self {
        self.capacity = capacity.into();
        self
    }

    /// Sets the tokens an acquire takes when it names no cost.
    pub fn with_cost_per_call(mut self, cost: impl Into<Tokens>) -> Self {
        self.cost_per_call = cost.into();
        self
    }

    /// Lean mode, for `requests` and `tokens` buckets: a grant is one conditional write of
    /// the bucket row and nothing else: no lease row, and releasing costs no call.
    ///
    /// The trade-off: a caller that crashes after a grant is never refunded (there is no
    /// lease for the reconciler to find), which for `requests` and `tokens` only means the
    /// quota it took stays used, as it would have if the call had gone out. `concurrent`
    /// buckets cannot be lean: their slots come back through leases.
    ///
    /// ```
    /// use sluice::{Bucket, RefillRate};
    ///
    /// let rpm = Bucket::requests(RefillRate::per_minute(500)).lean();
    /// assert!(!rpm.keeps_leases());
    /// assert!(Bucket::concurrent(10).lean().validate().is_err());
    /// ```
    pub fn lean(mut self) -> Self {
        self.leases = false;
        self
    }

    /// Bounds the rows the bucket is spread over, for every client (see [`ShardLimit`](super::ShardLimit)).
    pub fn with_shards(mut self, limit: super::ShardLimit) -> Self {
        self.shards = Some(limit);
        self
    }

    /// The bucket's bound on its rows, if it sets one.
    pub fn shard_limit(&self) -> Option<super::ShardLimit> {
        self.shards
    }

    /// Sets the bucket's [`Mode`](super::Mode), for every client: in shadow, acquires are
    /// never refused and what would have been is counted.
    ///
    /// ```
    /// use sluice::{Bucket, Mode, RefillRate};
    ///
    /// let trial = Bucket::requests(RefillRate::per_minute(500)).with_mode(Mode::Shadow);
    /// assert_eq!(trial.mode(), Mode::Shadow);
    /// ```
    pub fn with_mode(mut self, mode: super::Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The bucket's [`Mode`](super::Mode).
    pub fn mode(&self) -> super::Mode {
        self.mode
    }

    /// Whether grants write lease rows (`false` in [lean mode](Self::lean)).
    pub fn keeps_leases(&self) -> bool {
        self.leases
    }

    /// Keeps `tokens` of the capacity for `priority` and the priorities listed before it:
    /// a priority listed after it, or not listed at all, is granted only while the bucket
    /// keeps them (see [`Priority`]). Reserves are listed highest priority first, in the
    /// order of these calls; the first listed priority, and an acquire with no priority,
    /// may take everything. For a `concurrent` bucket the tokens are slots kept free.
    ///
    /// ```
    /// use sluice::{Bucket, Priority, RefillRate, Tokens};
    ///
    /// // 2,000,000 tokens per minute; 400,000 of them kept for `interactive`.
    /// let tpm = Bucket::tokens(RefillRate::per_minute(2_000_000))
    ///     .with_reserve("interactive".parse()?, 400_000);
    /// assert_eq!(tpm.floor_for(Some(&"batch".parse()?)), Tokens::new(400_000));
    /// assert_eq!(tpm.floor_for(Some(&"interactive".parse()?)), Tokens::ZERO);
    /// assert_eq!(tpm.floor_for(None), Tokens::ZERO);
    /// # Ok::<(), sluice::error::PriorityError>(())
    /// ```
    pub fn with_reserve(mut self, priority: Priority, tokens: impl Into<Tokens>) -> Self {
        self.reserves.push(Reserve {
            priority,
            tokens: tokens.into(),
        });
        self
    }

    /// Replaces the reserves with `reserves`, highest priority first.
    pub fn with_reserves(mut self, reserves: Vec<Reserve>) -> Self {
        self.reserves = reserves;
        self
    }

    /// The reserves, highest priority first.
    pub fn reserves(&self) -> &[Reserve] {
        &self.reserves
    }

    /// The tokens an acquire at `priority` must leave in the bucket: the reserves of the
    /// priorities listed before it (all of them for a priority not listed; none for the
    /// first listed, or for no priority).
    pub fn floor_for(&self, priority: Option<&Priority>) -> Tokens {
        floor(&self.reserves, priority)
    }

    /// The sum of the reserves: what the lowest priorities must leave.
    pub fn reserved(&self) -> Tokens {
        self.reserves
            .iter()
            .fold(Tokens::ZERO, |sum, r| sum.saturating_add(r.tokens))
    }

    /// The most one acquire at `priority` can ever take: the capacity less its
    /// [floor](Self::floor_for).
    pub fn share_for(&self, priority: Option<&Priority>) -> Tokens {
        self.capacity.saturating_sub(self.floor_for(priority))
    }

    /// What the bucket counts.
    pub fn limit_type(&self) -> LimitType {
        self.limit_type
    }

    /// The most tokens the bucket holds.
    pub fn capacity(&self) -> Tokens {
        self.capacity
    }

    /// Tokens added per second (zero for `concurrent` buckets).
    pub fn refill_rate(&self) -> RefillRate {
        self.refill_rate
    }

    /// Tokens an acquire takes when it names no cost.
    pub fn cost_per_call(&self) -> Tokens {
        self.cost_per_call
    }

    /// Checks the definition for values that cannot work.
    pub fn validate(&self) -> Result<(), BucketError> {
        if self.capacity <= Tokens::ZERO || self.capacity > Tokens::MAX {
            return Err(BucketError::Capacity(self.capacity));
        }
        if self.refill_rate < RefillRate::ZERO || self.refill_rate > RefillRate::MAX {
            return Err(BucketError::RefillRate(self.refill_rate));
        }
        match self.limit_type {
            LimitType::Concurrent if !self.refill_rate.is_zero() => {
                return Err(BucketError::ConcurrentRefill);
            }
            LimitType::Concurrent if !self.leases => {
                return Err(BucketError::LeanConcurrent);
            }
            LimitType::Requests | LimitType::Tokens if self.refill_rate.is_zero() => {
                return Err(BucketError::NoRefill(self.limit_type));
            }
            _ => {}
        }
        if self.cost_per_call < Tokens::ZERO || self.cost_per_call > self.capacity {
            return Err(BucketError::CostPerCall {
                cost: self.cost_per_call,
                capacity: self.capacity,
            });
        }
        if let Some(limit) = self.shards {
            let one_row = limit.range().0 == 1;
            if !limit.valid() || (self.limit_type == LimitType::Concurrent && !one_row) {
                return Err(BucketError::Shards(limit));
            }
        }
        self.validate_reserves()?;
        self.validate_schedule()
    }

    fn validate_reserves(&self) -> Result<(), BucketError> {
        if self.reserves.len() > MAX_RESERVES {
            return Err(BucketError::TooManyReserves(self.reserves.len()));
        }
        let mut reserved = Tokens::ZERO;
        for (i, r) in self.reserves.iter().enumerate() {
            if r.tokens <= Tokens::ZERO || r.tokens > Tokens::MAX {
                return Err(BucketError::ReserveTokens {
                    priority: r.priority.clone(),
                    tokens: r.tokens,
                });
            }
            if self.reserves[..i].iter().any(|o| o.priority == r.priority) {
                return Err(BucketError::DuplicateReserve(r.priority.clone()));
            }
            reserved = reserved.saturating_add(r.tokens);
        }
        if reserved > self.capacity {
            return Err(BucketError::ReservesExceedCapacity {
                reserved,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// The refill rate that actually applies: `concurrent` buckets never refill over time,
    /// whatever a row says.
    pub(crate) fn effective_rate(&self) -> RefillRate {
        match self.limit_type {
            LimitType::Concurrent => RefillRate::ZERO,
            _ => self.refill_rate.max(RefillRate::ZERO),
        }
    }
}

fn default_capacity(rate: RefillRate) -> Tokens {
    // One minute of refill, rounded to whole tokens, and never less than one token. A rate
    // too large for that saturates, and `validate` refuses the bucket.
    let per_minute = rate
        .refill_over(std::time::Duration::from_secs(60))
        .as_nanos();
    let rounded =
        per_minute.saturating_add(NANOS_PER_TOKEN / 2) / NANOS_PER_TOKEN * NANOS_PER_TOKEN;
    Tokens::from_nanos(rounded.max(NANOS_PER_TOKEN))
}
