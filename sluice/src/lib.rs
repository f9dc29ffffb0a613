//! Cooperative, distributed rate limiting of outbound vendor API calls.
//!
//! Many processes share one vendor quota (OpenAI requests and tokens per minute,
//! Anthropic limits, ElevenLabs concurrent calls). Sluice coordinates them through one
//! shared table: each caller asks for capacity on a [`Dimension`] such as `openai#rpm`
//! and gets either a [`Lease`] or an exact [`Error::RetryIn`], then calls the vendor
//! directly. No proxy, no sidecar, no queue.
//!
//! ```
//! use std::time::Duration;
//! use sluice::{Acquire, Bucket, RefillRate, Sluice};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let sluice = Sluice::in_memory();
//! sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(500))).await?;
//! sluice.put_bucket("openai#tpm", Bucket::tokens(RefillRate::per_minute(2_000_000))).await?;
//!
//! // One request plus an estimated 1,500 tokens, all or nothing.
//! let mut lease = sluice.acquire(Acquire::new("openai#rpm").and_cost("openai#tpm", 1_500)).await?;
//! // ... call the vendor; it reports 2,100 tokens used ...
//! lease.adjust("openai#tpm", 2_100).await?;
//! lease.release().await?;
//!
//! // Or wrap the call in a slot: released on every path, with a hard deadline.
//! match sluice.slot("openai#rpm", Duration::from_secs(30), async { /* vendor call */ }).await {
//!     Ok(()) => {}
//!     Err(sluice::Error::RetryIn(refusal)) => { /* requeue after `refusal.delay` */ }
//!     Err(other) => return Err(other),
//! }
//! # Ok::<(), sluice::Error>(()) }).unwrap();
//! ```
//!
//! The pieces, from the bottom up: exact fixed-point [`Tokens`] and [`RefillRate`]s; the
//! pure bucket arithmetic on [`BucketState`]; the `Store` trait with its embedded
//! `MemoryStore`; the [`Sluice`] client that runs the acquisition protocol.
//!
//! The guide, one page per subject (its examples compiled and run as tests):
//! [concepts and the RetryIn contract](https://github.com/sluice-rs/sluice/blob/main/docs/concepts.md),
//! [the layers](https://github.com/sluice-rs/sluice/blob/main/docs/layers.md),
//! [adopting without risk](https://github.com/sluice-rs/sluice/blob/main/docs/adoption.md),
//! [operating](https://github.com/sluice-rs/sluice/blob/main/docs/operating.md),
//! [DynamoDB](https://github.com/sluice-rs/sluice/blob/main/docs/dynamodb.md),
//! [failures and freshness](https://github.com/sluice-rs/sluice/blob/main/docs/failures.md),
//! [performance](https://github.com/sluice-rs/sluice/blob/main/docs/performance.md),
//! [testing](https://github.com/sluice-rs/sluice/blob/main/docs/testing.md).

#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs` on nightly: items behind a feature say which.
#![cfg_attr(docsrs, feature(doc_cfg))]

/// A method of a stored row that a store of one's own needs and a user of the limiter does
/// not: public with the `unstable-store` feature, crate-private without it.
macro_rules! storage_fn {
    ($(#[$meta:meta])* fn $($rest:tt)*) => {
        #[cfg(feature = "unstable-store")]
        #[cfg_attr(docsrs, doc(cfg(feature = "unstable-store")))]
        $(#[$meta])* pub fn $($rest)*
        #[cfg(not(feature = "unstable-store"))]
        #[allow(dead_code)]
        $(#[$meta])* pub(crate) fn $($rest)*
    };
}

mod acquire;
pub mod admin;
pub mod bucket;
mod client;
pub mod clock;
pub mod config;
mod decimal;
mod detach;
mod dimension;
pub mod error;
mod grant;
mod ids;
mod keep;
mod lease;
pub mod metrics;
mod priority;
mod protocol;
mod rate;
mod retry;
mod role;
#[cfg(feature = "serde")]
mod serde;
mod shared;
mod snapshot;
pub mod store;
#[cfg(any(feature = "cli", feature = "serde"))]
mod text;
mod tokens;

// The root holds what a user of the limiter needs; the rest lives in the modules above,
// named for what it is (see `api/sluice-limiter.txt`, which CI compares with the code).
pub use acquire::Acquire;
pub use bucket::{Bucket, LimitType, Mode};
pub use client::{Sluice, SluiceBuilder};
pub use config::{Config, FailurePolicy, Prefetch, Sharding};
pub use dimension::Dimension;
pub use error::{Error, RetryIn};
pub use grant::LeaseId;
pub use lease::Lease;
pub use priority::Priority;
pub use rate::RefillRate;
#[cfg(feature = "dynamodb")]
pub use store::DynamoStore;
pub use store::MemoryStore;
pub use tokens::Tokens;

// The same names inside the crate, where they were at the root before.
#[allow(unused_imports)]
pub(crate) use bucket::{
    BucketError, BucketState, Commute, Condition, Level, Limits, MAX_VERSION, RECENT_WRITES,
    RecentWrites, RefillCarry, Report, Schedule, ScheduleError, ShadowLedger, ShardError,
    ShardLimit, ShardLimitError, Take, TimeOfDay, TokensOp, UnknownLimitType, UnknownMode, Window,
    refill,
};
#[allow(unused_imports)]
pub(crate) use clock::{Clock, ManualClock, SystemClock, TokioClock, UnixMillis};
#[allow(unused_imports)]
pub(crate) use config::{
    COOLDOWN_CALLER, ConfigError, DEFAULT_CLOCK_SKEW, DEFAULT_FOLD_AFTER, DEFAULT_HEAL_SETTLE,
    DEFAULT_LEASE_TTL, DEFAULT_MAX_RETRIES, DEFAULT_OPEN_PERCENT, DEFAULT_SLOT_POLL,
    DEFAULT_STORE_ATTEMPT_TIMEOUT, DEFAULT_STORE_TIMEOUT, MAX_CLOCK_SKEW, Protocol, RELEASE_GRACE,
};
#[allow(unused_imports)]
pub(crate) use decimal::{DecimalError, Rounding};
#[allow(unused_imports)]
pub(crate) use dimension::{DimensionError, MAX_SHARDS};
#[allow(unused_imports)]
pub(crate) use grant::LeaseIdError;
#[allow(unused_imports)]
pub(crate) use priority::{MAX_RESERVES, PriorityError, Reserve};
#[allow(unused_imports)]
pub(crate) use protocol::peek::Peek;
#[allow(unused_imports)]
pub(crate) use protocol::reconcile::{ReconcileError, ReconcileReport};
#[allow(unused_imports)]
pub(crate) use protocol::restock::{Audit, Restock, Restocked};
#[allow(unused_imports)]
pub(crate) use protocol::tighten::Tighten;
/// Runs an `async fn` in a slot of a shared quota.
///
/// ```
/// use std::time::Duration;
/// use sluice::{Bucket, RefillRate, Sluice};
///
/// #[derive(Debug)]
/// enum AppError {
///     RateLimited(Duration),
///     Sluice(sluice::Error),
/// }
///
/// impl From<sluice::Error> for AppError {
///     fn from(e: sluice::Error) -> Self {
///         match e.retry_in() {
///             Some(delay) => AppError::RateLimited(delay),
///             None => AppError::Sluice(e),
///         }
///     }
/// }
///
/// #[sluice::rate_limited("openai#rpm", "openai#tpm" = doc.len() / 4, timeout = 30)]
/// async fn summarize(doc: &str) -> Result<String, AppError> {
///     Ok(format!("summary of {} bytes", doc.len()))
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let sluice = Sluice::in_memory();
/// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(500))).await.unwrap();
/// sluice.put_bucket("openai#tpm", Bucket::tokens(RefillRate::per_minute(2_000_000))).await.unwrap();
/// Sluice::set_global(sluice);
/// assert_eq!(summarize("hello").await.unwrap(), "summary of 5 bytes");
/// # });
/// ```
///
/// The arguments are described in [`sluice_macros::rate_limited`].
#[cfg(feature = "macros")]
pub use sluice_macros::rate_limited;
#[allow(unused_imports)]
pub(crate) use snapshot::Snapshot;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

#[cfg(feature = "cli")]
#[doc(hidden)]
#[path = "cli/mod.rs"]
pub mod __cli;

#[cfg(feature = "fuzzing")]
#[doc(hidden)]
#[path = "fuzz.rs"]
pub mod __fuzz;
