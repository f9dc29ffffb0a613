//! Buckets: their definitions ([`Bucket`], its [`LimitType`], [`Mode`], [`Schedule`] and
//! reserves), the state a bucket is in ([`BucketState`]), and the pure arithmetic on them.
//!
//! Nothing in this module does I/O. All arithmetic is on integers: tokens in billionths,
//! time in milliseconds, rates in billionths of a token per second.

pub(crate) mod burst;
pub(crate) mod commute;
pub(crate) mod definition;
mod keyed;
pub(crate) mod limit;
pub(crate) mod mode;
pub(crate) mod recent;
pub(crate) mod refill;
pub(crate) mod schedule;
pub(crate) mod shards;
pub(crate) mod state;
mod storage;
pub(crate) mod waiting;

pub use burst::Report;
pub(crate) use commute::{Commute, Condition, TokensOp};
pub(crate) use commute::{Herd, Want, commute, full_by_refill};
pub use definition::{Bucket, LimitType};
pub(crate) use definition::{BucketError, MAX_VERSION, UnknownLimitType};
pub(crate) use definition::{first_version, timestamp_in_range};
pub use limit::ShardLimit;
pub(crate) use limit::ShardLimitError;
pub use mode::Mode;
pub(crate) use mode::shadow_take;
pub(crate) use mode::{LedgerChange, ShadowLedger, UnknownMode};
pub(crate) use recent::{RECENT_WRITES, RecentWrites};
pub(crate) use refill::{Level, RefillCarry, refill};
pub(crate) use schedule::ScheduleError;
pub use schedule::{Limits, Schedule, TimeOfDay, Window};
pub(crate) use shards::ShardError;
pub use state::BucketState;
pub(crate) use state::Take;
pub(crate) use state::WriteOutcome;
pub(crate) use waiting::Waiting;

pub use crate::decimal::Rounding;
pub use crate::priority::{MAX_RESERVES, Reserve};

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
