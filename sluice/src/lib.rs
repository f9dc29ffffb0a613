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
//!     Err(sluice::Error::RetryIn(delay)) => { /* requeue after `delay` */ }
//!     Err(other) => return Err(other),
//! }
//! # Ok::<(), sluice::Error>(()) }).unwrap();
//! ```
//!
//! The pieces, from the bottom up: exact fixed-point [`Tokens`] and [`RefillRate`]s; the
//! pure bucket arithmetic on [`BucketState`]; the [`Store`] trait with its embedded
//! [`MemoryStore`]; the [`Sluice`] client that runs the acquisition protocol.
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

mod acquire;
mod bucket;
mod client;
mod clock;
mod config;
mod decimal;
mod detach;
mod dimension;
mod error;
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

pub use acquire::{Acquire, MAX_DIMENSIONS};
pub use bucket::{
    Bucket, BucketError, BucketState, Commute, Condition, Level, LimitType, Limits, MAX_VERSION,
    Mode, RECENT_WRITES, RecentWrites, RefillCarry, Report, Schedule, ScheduleError, ShadowLedger,
    ShardError, ShardLimit, ShardLimitError, Take, TimeOfDay, TokensOp, UnknownLimitType,
    UnknownMode, Window, refill,
};
pub use client::{Sluice, SluiceBuilder};
pub use clock::{Clock, ManualClock, SystemClock, TokioClock, UnixMillis};
pub use config::{
    COOLDOWN_CALLER, Config, ConfigError, DEFAULT_CLOCK_SKEW, DEFAULT_FOLD_AFTER,
    DEFAULT_HEAL_SETTLE, DEFAULT_LEASE_RECORD_AFTER, DEFAULT_LEASE_TTL, DEFAULT_MAX_RETRIES,
    DEFAULT_OPEN_PERCENT, DEFAULT_SLOT_POLL, DEFAULT_STORE_ATTEMPT_TIMEOUT, DEFAULT_STORE_TIMEOUT,
    FailurePolicy, MAX_CLOCK_SKEW, Prefetch, Protocol, RELEASE_GRACE, Sharding,
};
pub use decimal::{DecimalError, Rounding};
pub use dimension::{Dimension, DimensionError, MAX_SHARDS};
pub use error::{Delay, Error};
pub use grant::{LeaseId, LeaseIdError};
pub use lease::Lease;
pub use priority::{MAX_RESERVES, Priority, PriorityError, Reserve};
pub use protocol::peek::Peek;
pub use protocol::reconcile::{ReconcileError, ReconcileReport};
pub use protocol::restock::{Audit, Restock, Restocked};
pub use protocol::tighten::Tighten;
pub use rate::RefillRate;
pub use shared::remembered;
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
pub use snapshot::Snapshot;
#[cfg(feature = "dynamodb")]
pub use store::{DynamoStats, DynamoStore, SLOTS_INDEX};
pub use store::{MemoryStore, Store};
pub use tokens::Tokens;

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
