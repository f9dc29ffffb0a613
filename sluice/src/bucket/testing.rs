//! Test support shared by the tests of buckets and of what reads and writes them.

use std::time::Duration;

use proptest::prelude::*;

use crate::rate::RefillRate;
use crate::tokens::Tokens;

/// Any refill rate of up to 10^15 billionths of a token over up to 10^15 nanoseconds.
pub(crate) fn any_rate_in_nanos() -> impl Strategy<Value = RefillRate> {
    (1i128..1_000_000_000_000_000, 1u64..1_000_000_000_000_000).prop_map(|(amount, period)| {
        RefillRate::new(Tokens::from_nanos(amount), Duration::from_nanos(period))
    })
}
