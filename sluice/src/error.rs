//! Errors: [`Error`], what every call of the limiter returns, with its [`RetryIn`]; and the
//! errors of reading or building the values a call takes (dimensions, priorities, bucket
//! definitions, schedules, configuration).

pub use crate::bucket::definition::{BucketError, UnknownLimitType};
pub use crate::bucket::limit::ShardLimitError;
pub use crate::bucket::mode::UnknownMode;
pub use crate::bucket::schedule::ScheduleError;
pub use crate::bucket::shards::ShardError;
pub use crate::config::ConfigError;
pub use crate::decimal::DecimalError;
pub use crate::dimension::DimensionError;
pub use crate::grant::LeaseIdError;
pub use crate::priority::PriorityError;
pub use crate::store::StoreError;
pub use refusal::{RetryIn, Short};

mod refusal;

use std::fmt;
use std::time::Duration;

use crate::dimension::Dimension;
use crate::priority::Priority;
use crate::tokens::Tokens;

/// Everything that can go wrong when asking sluice for capacity.
///
/// Only [`Error::RetryIn`] means "the quota is used up": it carries the exact wait until
/// the request can be granted. Every other case is a different cause and never poses as a
/// quota denial.
///
/// ```
/// use std::time::Duration;
///
/// fn requeue_delay(e: &sluice::Error) -> Option<Duration> {
///     e.retry_in()
/// }
/// let e = sluice::Error::RetryIn(sluice::RetryIn::after(Duration::from_millis(1500)));
/// assert_eq!(requeue_delay(&e), Some(Duration::from_millis(1500)));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Not enough tokens now: retry after [`RetryIn::delay`], rounded up to the
    /// millisecond, at [`RetryIn::at`] by the client's clock; [`RetryIn::short`] names the
    /// dimensions that were short, each with its own wait.
    ///
    /// It is exact for the bucket row it was computed from: one millisecond earlier that
    /// row could not serve the request, at the delay it can. That row is the store's, read
    /// for this answer or at the start of a denial window this client is in (see
    /// `remembered`). With other processes sharing the bucket, the
    /// delay may be **early** (they took tokens since: asking again gets a new, exact
    /// RetryIn), and it is never **late**, except when tokens came back other than by refill
    /// since that row was read (a refund, a reconciled lease, a raised limit, a lowered
    /// reserve). A request
    /// asked again once its RetryIn has passed is answered from the store, never from
    /// memory. For `concurrent` buckets the delay is the earliest expiry of the live leases,
    /// an upper bound (a release may free a slot sooner), or the slot poll interval when no
    /// live lease shows; [`Sluice::acquire_within`](crate::Sluice::acquire_within) and the
    /// waits built on it look again at most every poll interval.
    RetryIn(RetryIn),
    /// The cost is larger than the bucket's capacity, so the request can never be granted.
    CostExceedsCapacity {
        /// The dimension.
        dimension: Dimension,
        /// The cost asked for.
        cost: Tokens,
        /// The bucket's capacity.
        capacity: Tokens,
    },
    /// The cost fits the bucket's capacity, but not what the acquire's priority may ever
    /// take (the capacity less the reserves kept for the priorities above it), so it can
    /// never be granted at this priority.
    CostExceedsShare {
        /// The dimension.
        dimension: Dimension,
        /// The cost asked for.
        cost: Tokens,
        /// The acquire's priority.
        priority: Priority,
        /// The most that priority may take.
        share: Tokens,
    },
    /// The dimension's name is malformed.
    InvalidDimension(DimensionError),
    /// The priority's name is malformed.
    InvalidPriority(PriorityError),
    /// No bucket is defined for the dimension in the store the client uses.
    UnknownDimension {
        /// The dimension.
        dimension: Dimension,
        /// Where the client looked (`Store::describe`).
        store: String,
    },
    /// The dimension is a keyed bucket's, a template for a bucket per key (see
    /// [`Bucket::keyed`](crate::Bucket::keyed)): acquire on a key's dimension instead
    /// ([`Dimension::with_key`]).
    KeyRequired {
        /// The keyed bucket's dimension.
        dimension: Dimension,
    },
    /// A cost is negative.
    InvalidCost {
        /// The dimension.
        dimension: Dimension,
        /// The cost given.
        cost: Tokens,
    },
    /// A lease TTL (or a slot's timeout) is shorter than one millisecond.
    InvalidTtl(Duration),
    /// A request names no dimension, or too many for one atomic write.
    DimensionCount {
        /// How many were named.
        got: usize,
        /// The most allowed.
        max: usize,
    },
    /// A bucket definition is unusable.
    InvalidBucket {
        /// The dimension.
        dimension: Dimension,
        /// What is wrong.
        source: BucketError,
    },
    /// A deadline passed: a slot's body ran past the slot's timeout (its lease was
    /// released), or a wait for capacity ([`Sluice::acquire_within`](crate::Sluice::acquire_within)
    /// and every wait built on it) found the store still not answering at its deadline
    /// (nothing was taken).
    Timeout(Duration),
    /// Other clients kept winning the race for the same bucket, although it had tokens.
    /// This is contention, not a quota denial; retrying soon is reasonable.
    Contention {
        /// A dimension that kept changing.
        dimension: Dimension,
        /// Attempts made.
        attempts: u32,
    },
    /// The lease no longer exists: it was released, or it expired and was reconciled.
    LeaseNotFound(String),
    /// The store failed.
    Store(StoreError),
    /// The configuration is invalid.
    Config(ConfigError),
    /// A bucket cannot be spread over the rows asked for (see
    /// [`Sluice::reshard`](crate::Sluice::reshard)).
    Shards(crate::bucket::ShardError),
    /// A change by hand ([`Sluice::restock`](crate::Sluice::restock)) was made against a
    /// version of the bucket that is no longer the stored one: somebody changed it since
    /// it was read. Nothing was written.
    BucketChanged {
        /// The dimension.
        dimension: Dimension,
        /// The version the change was made against.
        read: u64,
        /// The version stored now.
        stored: u64,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::RetryIn(refusal) => write!(f, "rate limited: {refusal}"),
            Error::CostExceedsCapacity {
                dimension,
                cost,
                capacity,
            } => write!(
                f,
                "cost {cost} exceeds the capacity {capacity} of `{dimension}`; it can never be granted: lower the cost or raise the capacity"
            ),
            Error::CostExceedsShare {
                dimension,
                cost,
                priority,
                share,
            } => write!(
                f,
                "cost {cost} exceeds the {share} that priority `{priority}` may take of `{dimension}` (its capacity less the reserves above it); it can never be granted at this priority: lower the cost, use a higher priority or lower the reserves"
            ),
            Error::InvalidDimension(e) => fmt::Display::fmt(e, f),
            Error::InvalidPriority(e) => fmt::Display::fmt(e, f),
            Error::UnknownDimension { dimension, store } if dimension.key().is_some() => write!(
                f,
                "no keyed bucket is defined for `{}` (the template of `{dimension}`) in {store}, and no bucket for that key; define it with `Bucket::keyed` or `keyed = true` in a bucket file",
                dimension.template()
            ),
            Error::UnknownDimension { dimension, store } => write!(
                f,
                "no bucket is defined for `{dimension}` in {store}; define it with `Sluice::put_bucket` or `sluice bucket put`"
            ),
            Error::KeyRequired { dimension } => write!(
                f,
                "`{dimension}` is a keyed bucket, a template for a bucket per key: acquire on a key's dimension, e.g. `{dimension}#@tenant-42` (`Dimension::with_key`)"
            ),
            Error::InvalidCost { dimension, cost } => {
                write!(f, "cost {cost} for `{dimension}` is negative")
            }
            Error::InvalidTtl(ttl) => write!(f, "a lease TTL must be at least 1 ms, got {ttl:?}"),
            Error::DimensionCount { got, max } => write!(
                f,
                "an acquire must name between 1 and {max} dimensions, got {got}"
            ),
            Error::InvalidBucket { dimension, source } => {
                write!(f, "invalid bucket for `{dimension}`: {source}")
            }
            Error::Timeout(timeout) => write!(
                f,
                "the deadline of {} passed (a slot's body still running, or the store not answering a wait for capacity)",
                fmt_duration(*timeout)
            ),
            Error::Contention {
                dimension,
                attempts,
            } => write!(
                f,
                "lost the race for `{dimension}` {attempts} times in a row to other writers (contention, not a quota denial)"
            ),
            Error::LeaseNotFound(id) => write!(
                f,
                "lease `{id}` no longer exists: it was released, or it expired and was reconciled"
            ),
            Error::Store(e) => fmt::Display::fmt(e, f),
            Error::Config(e) => fmt::Display::fmt(e, f),
            Error::Shards(e) => fmt::Display::fmt(e, f),
            Error::BucketChanged {
                dimension,
                read,
                stored,
            } => write!(
                f,
                "`{dimension}` changed since it was read (version {read}, now {stored}); nothing was written: look at it again and decide from what it holds now"
            ),
        }
    }
}

impl std::error::Error for Error {
    /// A RetryIn's source is its [`RetryIn`]: even a wrapper that forwards `source()` past
    /// the `sluice::Error` it holds (`#[error(transparent)]`) leads to it.
    /// Transparent variants (a malformed name, a store or configuration error) forward
    /// their inner error's source, as `#[error(transparent)]` does.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::RetryIn(refusal) => Some(refusal),
            Error::InvalidDimension(e) => e.source(),
            Error::InvalidPriority(e) => e.source(),
            Error::Store(e) => e.source(),
            Error::Config(e) => e.source(),
            Error::InvalidBucket { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<DimensionError> for Error {
    fn from(e: DimensionError) -> Self {
        Error::InvalidDimension(e)
    }
}

impl From<PriorityError> for Error {
    fn from(e: PriorityError) -> Self {
        Error::InvalidPriority(e)
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        Error::Store(e)
    }
}

impl From<crate::bucket::ShardError> for Error {
    fn from(e: crate::bucket::ShardError) -> Self {
        Error::Shards(e)
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

impl Error {
    /// The delay to wait before retrying, when this error is a quota denial.
    pub fn retry_in(&self) -> Option<Duration> {
        self.refusal().map(|r| r.delay)
    }

    /// The refusal, when this error is a quota denial: its delay, its instant and the
    /// dimensions that were short.
    pub fn refusal(&self) -> Option<&RetryIn> {
        match self {
            Error::RetryIn(refusal) => Some(refusal),
            _ => None,
        }
    }

    /// The one way to get the delay back from any error that carries a sluice RetryIn,
    /// however it was wrapped on the way to you: searches `error` and its whole `source()`
    /// chain.
    ///
    /// Every layer of sluice puts its RetryIn where this search reaches it, including
    /// behind wrappers that forward `source()` past themselves (`#[error(transparent)]`):
    ///
    /// - the `#[rate_limited]` attribute and [`Sluice::acquire`](crate::Sluice::acquire):
    ///   a [`sluice::Error`](Error) itself, or your error wrapping it as its `source`;
    /// - `sluice_tower::SluiceLayer`: a `tower::BoxError` holding the `sluice::Error`, also
    ///   once a client wraps it again (async-openai's `OpenAIError::Boxed`);
    /// - `sluice_reqwest::SluiceMiddleware`: a `reqwest_middleware::Error`, also inside
    ///   reqwest-retry's `RetryError`, async-openai's `OpenAIError` or an `anyhow::Error`.
    ///
    /// Pass a reference to the error (`&e`), a boxed error's contents (`&*e`), or an
    /// `anyhow::Error` as `e.as_ref()`. `None` when the error is not a quota denial.
    ///
    /// A `sluice::Error` held *directly* by a transparent wrapper
    /// (`#[error(transparent)] Sluice(#[from] sluice::Error)`, or
    /// `reqwest_middleware::Error::middleware(sluice_error)` in a middleware of your own) is
    /// found too: such a wrapper's `source()` is the RetryIn's own source, its [`RetryIn`].
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// #[derive(Debug, thiserror::Error)]
    /// enum AppError {
    ///     #[error("summarizing failed")]
    ///     Summarize(#[source] sluice::Error),
    /// }
    ///
    /// let refusal = sluice::RetryIn::after(Duration::from_millis(1_500));
    /// let e = AppError::Summarize(sluice::Error::RetryIn(refusal));
    /// assert_eq!(sluice::Error::find_retry_in(&e), Some(Duration::from_millis(1_500)));
    ///
    /// let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
    /// assert_eq!(sluice::Error::find_retry_in(&*boxed), Some(Duration::from_millis(1_500)));
    ///
    /// let other = sluice::Error::Timeout(Duration::from_secs(1));
    /// assert_eq!(sluice::Error::find_retry_in(&other), None);
    /// ```
    pub fn find_retry_in(error: &(dyn std::error::Error + 'static)) -> Option<Duration> {
        Self::find_refusal(error).map(|r| r.delay)
    }

    /// The refusal any error carrying a sluice RetryIn holds, however it was wrapped (see
    /// [`find_retry_in`](Self::find_retry_in)): which dimensions were short, and when each
    /// will serve.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// use sluice::clock::{ManualClock, UnixMillis};
    /// use sluice::{Acquire, Bucket, RefillRate, Sluice};
    /// // A clock that stands still, so that the wait below is exact to the millisecond.
    /// let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    /// let sluice = Sluice::builder().store(sluice::MemoryStore::new()).clock(clock).build()?;
    /// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(500))).await?;
    /// sluice.put_bucket("openai#tpm", Bucket::tokens(RefillRate::per_minute(1_000))).await?;
    /// let request = || Acquire::new("openai#rpm").and_cost("openai#tpm", 1_000);
    /// let _held = sluice.acquire(request()).await?;
    /// let e = sluice.acquire(request()).await.unwrap_err();
    /// let refusal = sluice::Error::find_refusal(&e).unwrap();
    /// // Tokens were short, not requests: requeue by tokens.
    /// let short: Vec<&str> = refusal.short.iter().map(|s| s.dimension.as_str()).collect();
    /// assert_eq!(short, ["openai#tpm"]);
    /// assert_eq!(refusal.delay, Duration::from_secs(60));
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub fn find_refusal<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a RetryIn> {
        let mut current = Some(error);
        // A RetryIn's source is its `RetryIn`: the walk reaches it from the error itself
        // and from any wrapper, transparent ones included.
        while let Some(e) = current {
            if let Some(refusal) = e.downcast_ref::<RetryIn>() {
                return Some(refusal);
            }
            current = e.source();
        }
        None
    }
}

pub(crate) fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms >= 1_000 && ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else if ms >= 1_000 {
        format!("{}.{:03}s", ms / 1_000, ms % 1_000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_texts_say_what_to_do() {
        assert_eq!(
            Error::RetryIn(RetryIn::after(Duration::from_millis(1_250))).to_string(),
            "rate limited: retry in 1.250s"
        );
        assert_eq!(
            Error::RetryIn(RetryIn::after(Duration::from_millis(7))).to_string(),
            "rate limited: retry in 7ms"
        );
        let d = Dimension::new("openai#tpm").unwrap();
        let e = Error::CostExceedsCapacity {
            dimension: d.clone(),
            cost: Tokens::new(5),
            capacity: Tokens::new(4),
        };
        assert!(e.to_string().contains("can never be granted"));
        assert_eq!(e.retry_in(), None);
        let unknown = Error::UnknownDimension {
            dimension: d,
            store: crate::store::Store::describe(&crate::MemoryStore::new()),
        }
        .to_string();
        assert!(unknown.contains("sluice bucket put"), "{unknown}");
        assert!(unknown.contains("in-memory store") && unknown.contains("SLUICE_TABLE_NAME"));
    }

    #[test]
    fn retry_in_is_found_even_under_a_transparent_wrapper() {
        #[derive(Debug, thiserror::Error)]
        enum App {
            #[error(transparent)]
            Sluice(#[from] Error),
        }
        let app = App::from(Error::RetryIn(RetryIn::after(Duration::from_millis(1_250))));
        assert_eq!(app.to_string(), "rate limited: retry in 1.250s");
        assert_eq!(
            Error::find_retry_in(&app),
            Some(Duration::from_millis(1_250))
        );
        // Twice transparent, then boxed.
        #[derive(Debug, thiserror::Error)]
        #[error(transparent)]
        struct Outer(#[from] App);
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(Outer(app));
        assert_eq!(
            Error::find_retry_in(&*boxed),
            Some(Duration::from_millis(1_250))
        );
        let timeout = App::from(Error::Timeout(Duration::from_secs(1)));
        assert_eq!(Error::find_retry_in(&timeout), None);
    }

    #[test]
    fn retry_in_is_found_through_wrapping_errors() {
        #[derive(Debug, thiserror::Error)]
        #[error("app failed")]
        struct App(#[source] Error);
        let app = App(Error::RetryIn(RetryIn::after(Duration::from_secs(2))));
        assert_eq!(Error::find_retry_in(&app), Some(Duration::from_secs(2)));
        let other = App(Error::Timeout(Duration::from_secs(1)));
        assert_eq!(Error::find_retry_in(&other), None);
    }
}
