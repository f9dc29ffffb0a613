//! What the vendor served, second by second.

use std::time::Duration;

/// One second of the vendor's answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Second {
    /// Requests admitted.
    pub accepted: u64,
    /// Requests answered 429.
    pub rejected: u64,
}

/// What the vendor served since it started (or was [reset](crate::VendorSim::reset)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests admitted.
    pub accepted: u64,
    /// Requests answered 429.
    pub rejected: u64,
    /// Tokens charged for admitted requests, as corrected by their usage.
    pub tokens: u64,
    /// The most calls in flight at once for one key (a streamed call counts until its
    /// body ends).
    pub max_in_flight: u64,
    /// Counts per second since the start: index `i` is second `i`.
    pub seconds: Vec<Second>,
    /// When each admitted request was admitted, in milliseconds since the start.
    pub admitted_ms: Vec<u64>,
    /// When each refused request was refused (milliseconds since the start), and which
    /// limit refused it: `requests`, `tokens` or `concurrency`.
    pub refused: Vec<(u64, &'static str)>,
    /// Time since the start.
    pub elapsed: Duration,
}

impl Stats {
    pub(crate) fn second(&mut self, at: Duration) -> &mut Second {
        let i = usize::try_from(at.as_secs()).unwrap_or(usize::MAX);
        if self.seconds.len() <= i {
            self.seconds.resize(i + 1, Second::default());
        }
        &mut self.seconds[i]
    }
}
