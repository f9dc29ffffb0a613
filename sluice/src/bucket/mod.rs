//! Buckets: their definitions, their stored state, and the pure arithmetic on them.
//!
//! Nothing in this module does I/O. All arithmetic is on integers: tokens in billionths,
//! time in milliseconds, rates in billionths of a token per second.

mod burst;
mod commute;
mod definition;
mod limit;
mod mode;
mod recent;
mod refill;
mod schedule;
pub(crate) mod shards;
mod state;
mod waiting;

pub use burst::Report;
pub use commute::{Commute, Condition, TokensOp};
pub(crate) use commute::{Herd, Want, commute};
pub use definition::{Bucket, BucketError, LimitType, MAX_VERSION, UnknownLimitType};
pub(crate) use definition::{first_version, timestamp_in_range};
pub use limit::{ShardLimit, ShardLimitError};
pub(crate) use mode::shadow_take;
pub use mode::{Mode, ShadowLedger, UnknownMode};
pub use recent::{RECENT_WRITES, RecentWrites};
pub use refill::{Level, RefillCarry, refill};
pub use schedule::{Limits, Schedule, ScheduleError, TimeOfDay, Window};
pub use shards::ShardError;
pub(crate) use state::WriteOutcome;
pub use state::{BucketState, Take};
pub use waiting::Waiting;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
