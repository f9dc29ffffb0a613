//! Buckets: their definitions, their stored state, and the pure arithmetic on them.
//!
//! Nothing in this module does I/O. All arithmetic is on integers: tokens in billionths,
//! time in milliseconds, rates in billionths of a token per second.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::tokens::{NANOS_PER_TOKEN, RefillRate, Tokens};

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
    limit_type: LimitType,
    capacity: Tokens,
    refill_rate: RefillRate,
    cost_per_call: Tokens,
    leases: bool,
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
    /// A stored bucket's version is above [`MAX_VERSION`].
    #[error("version must be at most {max}, got {0}", max = MAX_VERSION)]
    Version(u64),
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
        }
    }
}

/// The largest version a bucket row may carry: 2^53 - 1, the largest integer every SDK
/// sharing the table (JavaScript's numbers included) holds exactly.
pub const MAX_VERSION: u64 = (1 << 53) - 1;

/// The latest refill timestamp a row may carry: the last millisecond of the year 9999.
const MAX_TIMESTAMP: UnixMillis = UnixMillis::new(253_402_300_799_999);

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

    /// Whether grants write lease rows (`false` in [lean mode](Self::lean)).
    pub fn keeps_leases(&self) -> bool {
        self.leases
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
    // One minute of refill, rounded to whole tokens, and never less than one token.
    let per_minute = rate.as_nanos_per_second() * 60;
    let rounded = (per_minute + NANOS_PER_TOKEN / 2) / NANOS_PER_TOKEN * NANOS_PER_TOKEN;
    Tokens::from_nanos(rounded.max(NANOS_PER_TOKEN))
}

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
    /// Bumped by every write; writes are conditioned on it.
    pub version: u64,
    /// The id of the sluice write that produced this row (`None`: no sluice write has
    /// touched it since it was written whole by another tool). Every sluice write stamps a
    /// new random one; other SDKs leave it as it is and bump the version. The version and
    /// this id together name the row exactly: a write conditioned on both fails when the
    /// row is anything else, a bucket deleted and created again at a repeated version
    /// included.
    pub write_id: Option<u64>,
    /// The leases kept in the row itself (sluice's fast path keeps a grant's lease where
    /// the grant's one write carries it), in id order. Their tokens are already
    /// taken from `tokens`, like those of lease rows. Releasing a lease that gives nothing
    /// back removes it without changing the version, so two rows that differ only here are
    /// the same row for a write's condition (see [`same_row`](Self::same_row)).
    pub held: Vec<HeldLease>,
}

/// A lease kept in its bucket's row (see [`BucketState::held`]): what a lease row would
/// say, without the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLease {
    /// The lease's unique id: its key is `lease#{dimension}#{id}`, as a lease row's would be.
    pub id: String,
    /// The tokens taken.
    pub cost: Tokens,
    /// When the lease was taken.
    pub created_at: UnixMillis,
    /// When the lease expires and becomes the reconciler's to give back.
    pub expires_at: UnixMillis,
    /// Who took it (`SLUICE_CALLER`).
    pub caller: String,
}

/// A new [`BucketState::write_id`]: distinct within the process (a counter through a
/// bijective mix), and unrelated to other processes' (the counter starts at random).
pub(crate) fn new_write_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let start = *START.get_or_init(rand::random);
    let n = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
    // SplitMix64's finalizer: a bijection, so distinct counters give distinct ids.
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The outcome of trying to take tokens from a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// Granted: the bucket's tokens and refill timestamp after the take.
    Granted {
        /// Tokens after the take.
        tokens: Tokens,
        /// Refill timestamp after the take.
        last_refill_at: UnixMillis,
    },
    /// Not enough tokens now; with a refill rate, the exact wait until there are.
    Short {
        /// The wait, rounded up to the millisecond; `None` when the bucket does not
        /// refill over time (`concurrent`), so only a release can help.
        wait: Option<Duration>,
    },
    /// The cost is above the bucket's capacity: it can never be granted.
    ExceedsCapacity,
}

impl BucketState {
    /// A new bucket, full, at `now`.
    pub fn full(dimension: Dimension, bucket: Bucket, now: UnixMillis) -> Self {
        BucketState {
            tokens: bucket.capacity(),
            dimension,
            bucket,
            last_refill_at: now,
            version: 0,
            write_id: None,
            held: Vec::new(),
        }
    }

    /// Whether `other` is the same row for a write's condition: everything but the
    /// [`held`](Self::held) leases, which a release that gives nothing back removes
    /// without a new version.
    pub fn same_row(&self, other: &BucketState) -> bool {
        self.dimension == other.dimension
            && self.bucket == other.bucket
            && self.tokens == other.tokens
            && self.last_refill_at == other.last_refill_at
            && self.version == other.version
            && self.write_id == other.write_id
    }

    /// The lease with the unique id `id` kept in the row, if any.
    pub fn held_lease(&self, id: &str) -> Option<&HeldLease> {
        self.held.iter().find(|h| h.id == id)
    }

    /// Checks a stored row: its definition is valid (see [`Bucket::validate`]) and its
    /// tokens, refill timestamp and version are within bounds. A store refuses to keep a
    /// row that fails this, and reports one it reads as corrupt.
    ///
    /// ```
    /// use sluice::{Bucket, BucketError, BucketState, RefillRate, Tokens, UnixMillis};
    ///
    /// let now = UnixMillis::from_secs(1_700_000_000);
    /// let mut row = BucketState::full("openai#rpm".parse()?, Bucket::requests(RefillRate::per_second(1)), now);
    /// assert!(row.validate().is_ok());
    /// row.tokens = Tokens::MAX + Tokens::new(1);
    /// assert_eq!(row.validate().unwrap_err().attribute(), "tokens");
    /// # Ok::<(), sluice::DimensionError>(())
    /// ```
    pub fn validate(&self) -> Result<(), BucketError> {
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
        Ok(())
    }

    /// Tokens and refill timestamp at `now`, after lazy refill.
    pub fn refilled(&self, now: UnixMillis) -> (Tokens, UnixMillis) {
        refill(
            self.tokens,
            self.last_refill_at,
            self.bucket.capacity(),
            self.bucket.effective_rate(),
            now,
        )
    }

    /// Tokens available at `now`.
    pub fn available(&self, now: UnixMillis) -> Tokens {
        self.refilled(now).0
    }

    /// Tries to take `cost` tokens at `now`.
    pub fn take(&self, cost: Tokens, now: UnixMillis) -> Take {
        if cost > self.bucket.capacity() {
            return Take::ExceedsCapacity;
        }
        let (tokens, last) = self.refilled(now);
        if tokens >= cost {
            return Take::Granted {
                tokens: tokens - cost,
                last_refill_at: last,
            };
        }
        Take::Short {
            wait: wait_until_available(tokens, last, self.bucket.effective_rate(), cost, now),
        }
    }

    /// Tokens and refill timestamp after giving back `amount` at `now` (release of a
    /// concurrent slot, or reconciliation), capped at capacity.
    pub fn restored(&self, amount: Tokens, now: UnixMillis) -> (Tokens, UnixMillis) {
        let (tokens, last) = self.refilled(now);
        (
            (tokens + amount).min(self.bucket.capacity()).max(tokens),
            last,
        )
    }

    /// Tokens and refill timestamp after charging `delta` more at `now` (a lease's
    /// adjustment). The result may be negative (debt); a negative `delta` refunds, capped at
    /// capacity.
    ///
    /// Debt stops at [`Tokens::MAX`] below zero.
    pub fn charged(&self, delta: Tokens, now: UnixMillis) -> (Tokens, UnixMillis) {
        let (tokens, last) = self.refilled(now);
        if delta >= Tokens::ZERO {
            (tokens.saturating_sub(delta), last)
        } else {
            (
                (tokens - delta).min(self.bucket.capacity()).max(tokens),
                last,
            )
        }
    }

    /// Tokens and refill timestamp after lowering the bucket to at most `limit` tokens at
    /// `now` (a vendor said only that many remain), or `None` when it already holds no more
    /// than that: tightening never makes a bucket looser.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Bucket, BucketState, RefillRate, Tokens, UnixMillis};
    ///
    /// let now = UnixMillis::from_secs(1_700_000_000);
    /// let bucket = Bucket::requests(RefillRate::per_second(10)).with_capacity(10);
    /// let full = BucketState::full("openai#rpm".parse()?, bucket, now);
    /// assert_eq!(full.lowered_to(Tokens::new(3), now), Some((Tokens::new(3), now)));
    /// assert_eq!(full.lowered_to(Tokens::new(20), now), None);
    /// # Ok::<(), sluice::DimensionError>(())
    /// ```
    pub fn lowered_to(&self, limit: Tokens, now: UnixMillis) -> Option<(Tokens, UnixMillis)> {
        let (tokens, last) = self.refilled(now);
        (limit < tokens).then_some((limit, last))
    }

    /// Tokens and refill timestamp after emptying a refilling bucket for `pause` from `now`
    /// (a vendor answered 429 with that delay): nothing is granted before `now + pause`, when
    /// exactly `cost_per_call` is available, and refill goes on at the bucket's rate after
    /// that. `None` for a bucket that does not refill, or one already at least this strict.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Bucket, BucketState, RefillRate, Take, UnixMillis};
    ///
    /// let now = UnixMillis::from_secs(1_700_000_000);
    /// let mut state = BucketState::full("openai#rpm".parse()?, Bucket::requests(RefillRate::per_second(10)), now);
    /// (state.tokens, state.last_refill_at) = state.emptied_for(Duration::from_secs(7), now).unwrap();
    /// assert_eq!(state.take(1.into(), now), Take::Short { wait: Some(Duration::from_secs(7)) });
    /// # Ok::<(), sluice::DimensionError>(())
    /// ```
    pub fn emptied_for(&self, pause: Duration, now: UnixMillis) -> Option<(Tokens, UnixMillis)> {
        let rate = self.bucket.effective_rate();
        if rate <= RefillRate::ZERO {
            return None;
        }
        let (tokens, last) = self.refilled(now);
        let ready_at = now.saturating_add(pause);
        // Refill only counts whole grid steps: round the span up so that the bucket holds
        // `cost_per_call` no earlier than `ready_at`.
        let grid = grid_ms(rate);
        let span = i128::from(ready_at.as_millis().saturating_sub(last.as_millis()).max(0));
        let grid = i128::from(grid);
        let span = (span + grid - 1) / grid * grid;
        // A pause so long that its refill overflows refills any bucket many times over.
        let refill_by_then = span
            .checked_mul(rate.as_nanos_per_second())
            .map_or(Tokens::MAX, |n| {
                Tokens::from_nanos(n / 1_000).min(Tokens::MAX)
            });
        let target = self.bucket.cost_per_call().saturating_sub(refill_by_then);
        (target < tokens).then_some((target, last))
    }

    /// The time until the bucket is full, if it refills over time; zero when full.
    pub fn time_to_full(&self, now: UnixMillis) -> Option<Duration> {
        let (tokens, last) = self.refilled(now);
        if tokens >= self.bucket.capacity() {
            return Some(Duration::ZERO);
        }
        wait_until_available(
            tokens,
            last,
            self.bucket.effective_rate(),
            self.bucket.capacity(),
            now,
        )
    }
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.abs()
}

/// The refill grid in milliseconds: the shortest span whose refill is a whole number of
/// billionths of a token. It is 1 ms for any rate with at most six decimal places.
fn grid_ms(rate: RefillRate) -> i64 {
    // A span of g ms adds g * rate / 1000 nanotokens; that is whole when 1000 / gcd(rate, 1000)
    // divides g.
    (1_000 / gcd(rate.as_nanos_per_second(), 1_000)) as i64
}

/// Lazy refill with drift compensation.
///
/// Adds the refill earned since `last`, capped at `capacity`, and moves the timestamp only
/// by the time that produced whole units (so many small steps add exactly what one large
/// step adds). The timestamp never moves backwards: a clock behind `last` adds nothing.
pub fn refill(
    tokens: Tokens,
    last: UnixMillis,
    capacity: Tokens,
    rate: RefillRate,
    now: UnixMillis,
) -> (Tokens, UnixMillis) {
    if tokens >= capacity {
        // Full (or above a lowered capacity): nothing accrues while full.
        return (capacity, last.max(now));
    }
    let elapsed = now.as_millis().saturating_sub(last.as_millis());
    if rate <= RefillRate::ZERO || elapsed <= 0 {
        return (tokens, last);
    }
    let grid = grid_ms(rate);
    let steps = elapsed / grid;
    // The refill of the whole grid steps elapsed, unless it fills the bucket (or would
    // overflow, which fills any bucket many times over).
    let deficit = capacity.as_nanos().saturating_sub(tokens.as_nanos());
    match i128::from(steps).checked_mul(step_refill(rate, grid)) {
        Some(added) if added < deficit => (
            tokens + Tokens::from_nanos(added),
            UnixMillis::new(last.as_millis() + steps * grid),
        ),
        _ => (capacity, now),
    }
}

/// The refill of one grid step of `grid` ms at `rate`, in billionths of a token: whole, and
/// at least one for any positive rate (see [`grid_ms`]).
fn step_refill(rate: RefillRate, grid: i64) -> i128 {
    (i128::from(grid).saturating_mul(rate.as_nanos_per_second()) / 1_000).max(1)
}

/// The exact wait from `now` until a bucket holding `tokens` at `last` (already refilled to
/// `now`) holds `needed`, rounded up to the millisecond; `None` if it never refills.
fn wait_until_available(
    tokens: Tokens,
    last: UnixMillis,
    rate: RefillRate,
    needed: Tokens,
    now: UnixMillis,
) -> Option<Duration> {
    if rate <= RefillRate::ZERO {
        return None;
    }
    let deficit = needed.as_nanos().saturating_sub(tokens.as_nanos());
    if deficit <= 0 {
        return Some(Duration::ZERO);
    }
    let grid = grid_ms(rate);
    let per_grid = step_refill(rate, grid);
    let steps = deficit.saturating_add(per_grid - 1) / per_grid;
    let ready_at =
        i128::from(last.as_millis()).saturating_add(steps.saturating_mul(i128::from(grid)));
    let wait = (ready_at - i128::from(now.as_millis())).max(1);
    Some(Duration::from_millis(
        u64::try_from(wait).unwrap_or(u64::MAX),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn dim() -> Dimension {
        Dimension::new("openai#rpm").unwrap()
    }

    fn state(capacity: i64, rate: RefillRate, tokens: Tokens) -> BucketState {
        BucketState {
            dimension: dim(),
            bucket: Bucket::new(LimitType::Requests, capacity, rate),
            tokens,
            last_refill_at: UnixMillis::new(1_000_000),
            version: 0,
            write_id: None,
            held: Vec::new(),
        }
    }

    #[test]
    fn refill_is_lazy_and_capped() {
        let s = state(100, RefillRate::per_second(10), Tokens::ZERO);
        let t0 = s.last_refill_at;
        assert_eq!(s.available(t0), Tokens::ZERO);
        assert_eq!(
            s.available(t0.saturating_add(Duration::from_millis(150))),
            Tokens::new(1) + "0.5".parse().unwrap()
        );
        assert_eq!(
            s.available(t0.saturating_add(Duration::from_secs(10))),
            Tokens::new(100)
        );
        assert_eq!(
            s.available(t0.saturating_add(Duration::from_secs(1000))),
            Tokens::new(100)
        );
    }

    #[test]
    fn seed_rate_with_three_decimals_refills_per_millisecond() {
        let s = state(100, "1.667".parse().unwrap(), Tokens::ZERO);
        let t = s.last_refill_at.saturating_add(Duration::from_millis(3));
        assert_eq!(s.available(t), "0.005001".parse().unwrap());
    }

    #[test]
    fn clock_behind_the_stored_timestamp_adds_nothing_and_never_moves_it_back() {
        let s = state(100, RefillRate::per_second(10), Tokens::new(5));
        let earlier = UnixMillis::new(s.last_refill_at.as_millis() - 5_000);
        assert_eq!(s.refilled(earlier), (Tokens::new(5), s.last_refill_at));
        let full = state(100, RefillRate::per_second(10), Tokens::new(100));
        assert_eq!(full.refilled(earlier).1, full.last_refill_at);
    }

    #[test]
    fn retry_in_is_exact_and_rounded_up_to_the_millisecond() {
        // 3 tokens per second: one token takes 333.33 ms, reported as 334 ms.
        let s = state(10, RefillRate::per_second(3), Tokens::ZERO);
        let now = s.last_refill_at;
        assert_eq!(
            s.take(Tokens::new(1), now),
            Take::Short {
                wait: Some(Duration::from_millis(334))
            }
        );
        assert!(matches!(
            s.take(
                Tokens::new(1),
                now.saturating_add(Duration::from_millis(333))
            ),
            Take::Short { .. }
        ));
        assert!(matches!(
            s.take(
                Tokens::new(1),
                now.saturating_add(Duration::from_millis(334))
            ),
            Take::Granted { .. }
        ));
    }

    #[test]
    fn debt_is_repaid_by_refill() {
        let s = state(100, RefillRate::per_second(10), Tokens::new(-15));
        let now = s.last_refill_at;
        assert_eq!(
            s.take(Tokens::new(5), now),
            Take::Short {
                wait: Some(Duration::from_secs(2))
            }
        );
        assert_eq!(
            s.available(now.saturating_add(Duration::from_millis(1_500))),
            Tokens::ZERO
        );
    }

    #[test]
    fn concurrent_buckets_do_not_refill_even_if_a_row_says_so() {
        let mut s = state(3, RefillRate::per_second(100), Tokens::ZERO);
        s.bucket.limit_type = LimitType::Concurrent;
        let later = s.last_refill_at.saturating_add(Duration::from_secs(3600));
        assert_eq!(s.available(later), Tokens::ZERO);
        assert_eq!(s.take(Tokens::new(1), later), Take::Short { wait: None });
        assert_eq!(s.restored(Tokens::new(5), later).0, Tokens::new(3));
    }

    #[test]
    fn cost_above_capacity_is_never_short_but_impossible() {
        let s = state(10, RefillRate::per_second(1), Tokens::new(10));
        assert_eq!(
            s.take(Tokens::new(11), s.last_refill_at),
            Take::ExceedsCapacity
        );
    }

    #[test]
    fn bucket_definitions_validate() {
        assert!(
            Bucket::requests(RefillRate::per_minute(500))
                .validate()
                .is_ok()
        );
        assert_eq!(
            Bucket::requests(RefillRate::per_minute(500)).capacity(),
            Tokens::new(500)
        );
        assert_eq!(
            Bucket::tokens(RefillRate::per_minute(2_000_000)).capacity(),
            Tokens::new(2_000_000)
        );
        assert_eq!(Bucket::concurrent(10).capacity(), Tokens::new(10));
        assert!(Bucket::concurrent(0).validate().is_err());
        assert_eq!(
            Bucket::requests(RefillRate::ZERO).validate(),
            Err(BucketError::NoRefill(LimitType::Requests))
        );
        assert_eq!(
            Bucket::new(LimitType::Concurrent, 5, RefillRate::per_second(1)).validate(),
            Err(BucketError::ConcurrentRefill)
        );
        assert!(
            Bucket::concurrent(2)
                .with_cost_per_call(3)
                .validate()
                .is_err()
        );
    }

    #[test]
    fn rows_at_the_bounds_never_overflow() {
        let deepest = BucketState {
            dimension: dim(),
            bucket: Bucket::new(LimitType::Tokens, Tokens::MAX, RefillRate::MAX),
            tokens: -Tokens::MAX,
            last_refill_at: UnixMillis::EPOCH,
            version: MAX_VERSION,
            write_id: None,
            held: Vec::new(),
        };
        assert!(deepest.validate().is_ok());
        // The fastest refill for ten thousand years fills it exactly.
        assert_eq!(
            deepest.refilled(MAX_TIMESTAMP),
            (Tokens::MAX, MAX_TIMESTAMP)
        );
        assert!(matches!(
            deepest.take(Tokens::MAX, MAX_TIMESTAMP),
            Take::Granted { .. }
        ));
        let (emptied, _) = deepest.emptied_for(Duration::MAX, MAX_TIMESTAMP).unwrap();
        assert!(emptied.is_within_bounds());
        assert_eq!(
            deepest.charged(Tokens::MAX, UnixMillis::EPOCH).0,
            -Tokens::MAX
        );
        // The slowest refill: waits saturate instead of wrapping.
        let slow = BucketState {
            bucket: Bucket::new(
                LimitType::Tokens,
                Tokens::MAX,
                RefillRate::from_nanos_per_second(1),
            ),
            ..deepest.clone()
        };
        let wait = slow.take(Tokens::MAX, UnixMillis::EPOCH);
        assert!(matches!(wait, Take::Short { wait: Some(w) } if w > Duration::from_secs(1 << 40)));
        assert!(slow.time_to_full(UnixMillis::EPOCH).is_some());
        // Beyond the bounds, rows are refused, naming the attribute.
        for (row, attribute) in [
            (
                BucketState {
                    tokens: Tokens::MAX + Tokens::from_nanos(1),
                    ..deepest.clone()
                },
                "tokens",
            ),
            (
                BucketState {
                    version: MAX_VERSION + 1,
                    ..deepest.clone()
                },
                "version",
            ),
            (
                BucketState {
                    last_refill_at: UnixMillis::new(-1),
                    ..deepest.clone()
                },
                "last_refill_at",
            ),
            (
                BucketState {
                    bucket: Bucket::requests(RefillRate::ZERO),
                    ..deepest.clone()
                },
                "refill_rate",
            ),
            (
                BucketState {
                    bucket: Bucket::concurrent(2).lean(),
                    ..deepest.clone()
                },
                "lean",
            ),
            (
                BucketState {
                    bucket: Bucket::new(
                        LimitType::Tokens,
                        Tokens::MAX + Tokens::new(1),
                        RefillRate::MAX,
                    ),
                    ..deepest.clone()
                },
                "capacity",
            ),
        ] {
            assert_eq!(
                row.validate().unwrap_err().attribute(),
                attribute,
                "{row:?}"
            );
        }
        // A refill function given values beyond every bound still answers.
        let (t, _) = refill(
            Tokens::from_nanos(i128::MIN / 2),
            UnixMillis::new(i64::MIN),
            Tokens::from_nanos(i128::MAX / 2),
            RefillRate::from_nanos_per_second(i128::MAX),
            UnixMillis::new(i64::MAX),
        );
        assert_eq!(t, Tokens::from_nanos(i128::MAX / 2));
    }

    #[test]
    fn write_ids_never_repeat_within_a_process() {
        let ids: std::collections::HashSet<u64> = (0..100_000).map(|_| new_write_id()).collect();
        assert_eq!(ids.len(), 100_000);
    }

    #[test]
    fn a_new_bucket_starts_above_any_version_a_predecessor_reached() {
        let t0 = UnixMillis::from_secs(1_700_000_000);
        let first = first_version(t0);
        // A second later, even after a thousand writes per second on the old row.
        let later = first_version(t0.saturating_add(Duration::from_secs(1)));
        assert!(later > first + 1_000);
        assert!(first_version(UnixMillis::new(i64::MAX)) <= MAX_VERSION);
        assert_eq!(first_version(UnixMillis::new(-5)), 0);
    }

    fn arb_rate() -> impl Strategy<Value = RefillRate> {
        prop_oneof![
            (1u64..10_000).prop_map(RefillRate::per_second),
            (1u64..3_000_000).prop_map(RefillRate::per_minute),
            (1u64..100_000).prop_map(RefillRate::per_hour),
            // Arbitrary nine-decimal rates, as a foreign row might carry.
            (1i128..50_000_000_000).prop_map(RefillRate::from_nanos_per_second),
        ]
    }

    proptest! {
        #[test]
        fn many_small_refill_steps_equal_one_large_step(
            rate in arb_rate(),
            capacity in 1i64..1_000_000,
            start_fraction in 0u32..=100,
            steps in proptest::collection::vec(0i64..2_500, 1..200),
        ) {
            let cap = Tokens::new(capacity);
            let start_tokens = Tokens::from_nanos(cap.as_nanos() * i128::from(start_fraction) / 100);
            let t0 = UnixMillis::new(1_700_000_000_000);
            let mut tokens = start_tokens;
            let mut last = t0;
            let mut now = t0;
            for step in &steps {
                now = UnixMillis::new(now.as_millis() + step);
                let (t, l) = refill(tokens, last, cap, rate, now);
                prop_assert!(l >= last, "timestamp moved backwards");
                prop_assert!(l <= now.max(last));
                prop_assert!(t <= cap);
                tokens = t;
                last = l;
            }
            let (one_tokens, _) = refill(start_tokens, t0, cap, rate, now);
            prop_assert_eq!(tokens, one_tokens);
            // And the state reached by small steps keeps agreeing afterwards.
            let later = UnixMillis::new(now.as_millis() + 12_345);
            prop_assert_eq!(refill(tokens, last, cap, rate, later).0, refill(start_tokens, t0, cap, rate, later).0);
        }

        #[test]
        fn retry_in_is_the_first_millisecond_with_enough_tokens(
            rate in arb_rate(),
            capacity in 1i64..100_000,
            tokens_pct in -100i64..100,
            cost_pct in 1i64..=100,
            offset in 0i64..3_000,
        ) {
            let cap = Tokens::new(capacity);
            let s = BucketState {
                dimension: dim(),
                bucket: Bucket::new(LimitType::Tokens, cap, rate),
                tokens: Tokens::from_nanos(cap.as_nanos() * i128::from(tokens_pct) / 100),
                last_refill_at: UnixMillis::new(1_700_000_000_000),
                version: 3, write_id: None, held: Vec::new(),
            };
            let cost = Tokens::from_nanos((cap.as_nanos() * i128::from(cost_pct) / 100).max(1));
            let now = UnixMillis::new(s.last_refill_at.as_millis() + offset);
            match s.take(cost, now) {
                Take::Granted { tokens, last_refill_at } => {
                    prop_assert!(tokens >= Tokens::ZERO);
                    prop_assert!(last_refill_at >= s.last_refill_at);
                }
                Take::Short { wait: Some(wait) } => {
                    prop_assert!(wait >= Duration::from_millis(1));
                    let ms = wait.as_millis() as i64;
                    let before = UnixMillis::new(now.as_millis() + ms - 1);
                    let at = UnixMillis::new(now.as_millis() + ms);
                    prop_assert!(matches!(s.take(cost, before), Take::Short { .. }), "granted 1 ms early");
                    prop_assert!(matches!(s.take(cost, at), Take::Granted { .. }), "not granted at the promised time");
                }
                other => prop_assert!(false, "unexpected {:?}", other),
            }
        }

        #[test]
        fn a_pause_grants_nothing_before_it_ends_and_never_loosens(
            rate in arb_rate(),
            capacity in 1i64..100_000,
            tokens_pct in -100i64..=100,
            offset in 0i64..3_000,
            pause_ms in 0u64..120_000,
        ) {
            let cap = Tokens::new(capacity);
            let s = BucketState {
                dimension: dim(),
                bucket: Bucket::new(LimitType::Requests, cap, rate),
                tokens: Tokens::from_nanos(cap.as_nanos() * i128::from(tokens_pct) / 100),
                last_refill_at: UnixMillis::new(1_700_000_000_000),
                version: 3, write_id: None, held: Vec::new(),
            };
            let now = UnixMillis::new(s.last_refill_at.as_millis() + offset);
            let pause = Duration::from_millis(pause_ms);
            let ends = now.saturating_add(pause);
            let cpc = s.bucket.cost_per_call();
            match s.emptied_for(pause, now) {
                None => {
                    // Already at least as strict: nothing would be granted before the end.
                    if pause_ms > 0 {
                        let before = UnixMillis::new(ends.as_millis() - 1);
                        prop_assert!(s.available(before) < cpc, "left a looser bucket alone");
                    }
                }
                Some((tokens, last_refill_at)) => {
                    prop_assert!(tokens < s.available(now), "tightening raised the bucket");
                    prop_assert!(last_refill_at <= now);
                    let paused = BucketState { tokens, last_refill_at, ..s.clone() };
                    if pause_ms > 0 {
                        let before = UnixMillis::new(ends.as_millis() - 1);
                        prop_assert!(matches!(paused.take(cpc, before), Take::Short { .. }), "granted before the pause ended");
                    }
                    // Granted at the end, or within one refill grid step of it.
                    let grid = grid_ms(rate);
                    let latest = UnixMillis::new(ends.as_millis() + grid - 1);
                    prop_assert!(matches!(paused.take(cpc, latest), Take::Granted { .. }), "pause outlasted its end");
                }
            }
        }
    }
}
