//! Buckets: their definitions, their stored state, and the pure arithmetic on them.
//!
//! Nothing in this module does I/O. All arithmetic is on integers: tokens in billionths,
//! time in milliseconds, rates in billionths of a token per second.

mod burst;
mod definition;
mod recent;
mod refill;
mod state;

pub use burst::Report;
pub use definition::{Bucket, BucketError, LimitType, MAX_VERSION, UnknownLimitType};
pub(crate) use definition::{first_version, timestamp_in_range};
pub use recent::{RECENT_WRITES, RECENT_WRITES_WITH_LEASES, RecentWrites};
pub use refill::{Level, RefillCarry, refill};
pub(crate) use state::WriteOutcome;
pub use state::{BucketState, HeldLease, Take};

#[cfg(test)]
mod tests;
