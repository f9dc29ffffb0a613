//! A quota denial as data: how long to wait, until when, and which dimensions were short.

use std::fmt;
use std::time::Duration;

use crate::clock::{Clock as _, SystemClock, UnixMillis};
use crate::dimension::Dimension;

use super::fmt_duration;

/// A quota denial: the request can be granted after [`delay`](Self::delay) (at
/// [`at`](Self::at) by the client's clock), and these dimensions were short
/// ([`short`](Self::short)).
///
/// The answer of [`Error::RetryIn`](crate::Error::RetryIn), and that error's
/// [`source`](std::error::Error::source), so that [`Error::find_refusal`](crate::Error::find_refusal)
/// reaches it through any wrapper. An acquire is all or nothing: its delay is the longest
/// of its short dimensions'; each names its own, so a caller can requeue by the dimension
/// that decides (a job short of tokens per minute waits for tokens, not for requests).
///
/// ```
/// use std::time::Duration;
///
/// // What an error handler of one's own can be tested with: a refusal naming no dimension.
/// let refusal = sluice::RetryIn::after(Duration::from_millis(250));
/// assert_eq!(refusal.delay, Duration::from_millis(250));
/// assert!(refusal.short.is_empty());
/// assert_eq!(refusal.to_string(), "retry in 250ms");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryIn {
    /// The wait before the whole request can be granted, rounded up to the millisecond:
    /// the longest of [`short`](Self::short)'s.
    pub delay: Duration,
    /// When that is, by the clock of the client that answered (`now + delay`).
    pub at: UnixMillis,
    /// The dimensions that were short, each with its own wait (for a spread bucket, the
    /// bucket's dimension, not its rows'). Empty when the refusal is back-pressure (the
    /// store throttled the bucket's row, or a reshard holds it) rather than a short
    /// bucket, or when it was not made by a client.
    pub short: Vec<Short>,
}

/// One dimension of a [`RetryIn`] that was short, and when it will serve.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Short {
    /// The dimension.
    pub dimension: Dimension,
    /// Its wait, rounded up to the millisecond.
    pub delay: Duration,
    /// When that is, by the clock of the client that answered.
    pub at: UnixMillis,
}

impl RetryIn {
    /// A refusal of `delay` naming no dimension, from now by the system clock: what a
    /// test of one's own error handling can build.
    pub fn after(delay: Duration) -> Self {
        RetryIn {
            delay,
            at: SystemClock.now().saturating_add(delay),
            short: Vec::new(),
        }
    }

    /// `dimension` short for `delay`, answered at `now` (a row of a spread bucket names the
    /// bucket).
    pub(crate) fn on(dimension: &Dimension, delay: Duration, now: UnixMillis) -> Self {
        let at = now.saturating_add(delay);
        RetryIn {
            delay,
            at,
            short: vec![Short {
                dimension: dimension.base(),
                delay,
                at,
            }],
        }
    }

    /// Back-pressure of `delay` at `now`: no dimension was short.
    pub(crate) fn pressed(delay: Duration, now: UnixMillis) -> Self {
        RetryIn {
            delay,
            at: now.saturating_add(delay),
            short: Vec::new(),
        }
    }

    /// Both refusals of one all-or-nothing request: the longer wait, every dimension short
    /// (a dimension in both with its longer wait).
    pub(crate) fn and(mut self, other: RetryIn) -> Self {
        self.delay = self.delay.max(other.delay);
        self.at = self.at.max(other.at);
        for s in other.short {
            match self.short.iter_mut().find(|o| o.dimension == s.dimension) {
                Some(o) if o.delay < s.delay => *o = s,
                Some(_) => {}
                None => self.short.push(s),
            }
        }
        self
    }

    /// This refusal `elapsed` later: every wait shorter by it, at least `least`; the
    /// instants stay.
    pub(crate) fn since(mut self, elapsed: Duration, least: Duration) -> Self {
        self.delay = self.delay.saturating_sub(elapsed).max(least);
        for s in &mut self.short {
            s.delay = s.delay.saturating_sub(elapsed).max(least);
        }
        self
    }

    /// The wait of `dimension`, when it was short.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let refusal = sluice::RetryIn::after(Duration::from_secs(1));
    /// assert_eq!(refusal.delay_of("openai#tpm"), None);
    /// ```
    pub fn delay_of(&self, dimension: &str) -> Option<Duration> {
        self.short
            .iter()
            .find(|s| s.dimension.as_str() == dimension)
            .map(|s| s.delay)
    }
}

impl fmt::Display for RetryIn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.short.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}`{}`", s.dimension)?;
        }
        if !self.short.is_empty() {
            f.write_str(" short: ")?;
        }
        write!(f, "retry in {}", fmt_duration(self.delay))
    }
}

impl std::error::Error for RetryIn {}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(name: &str) -> Dimension {
        Dimension::new(name).unwrap()
    }

    #[test]
    fn refusals_of_one_request_keep_every_short_dimension_and_the_longest_wait() {
        let now = UnixMillis::from_secs(1_700_000_000);
        let rpm = RetryIn::on(&d("openai#rpm"), Duration::from_millis(120), now);
        let tpm = RetryIn::on(&d("openai#tpm"), Duration::from_secs(3), now);
        let both = rpm.clone().and(tpm.clone());
        assert_eq!(both.delay, Duration::from_secs(3));
        assert_eq!(both.at, now.saturating_add(Duration::from_secs(3)));
        assert_eq!(
            (both.delay_of("openai#rpm"), both.delay_of("openai#tpm")),
            (
                Some(Duration::from_millis(120)),
                Some(Duration::from_secs(3))
            )
        );
        assert_eq!(
            both.to_string(),
            "`openai#rpm`, `openai#tpm` short: retry in 3s"
        );
        // A dimension refused twice keeps its longer wait; back-pressure adds none.
        let again = both
            .and(RetryIn::on(
                &d("openai#rpm"),
                Duration::from_millis(500),
                now,
            ))
            .and(RetryIn::pressed(Duration::from_millis(15), now));
        assert_eq!(
            again.delay_of("openai#rpm"),
            Some(Duration::from_millis(500))
        );
        assert_eq!(again.short.len(), 2);
        // Counted down: every wait shorter, never below the least; the instants stay.
        let counted = again.since(Duration::from_secs(1), Duration::from_millis(1));
        assert_eq!(counted.at, now.saturating_add(Duration::from_secs(3)));
        assert_eq!(counted.delay_of("openai#tpm"), Some(Duration::from_secs(2)));
        assert_eq!(
            counted.delay_of("openai#rpm"),
            Some(Duration::from_millis(1))
        );
        assert_eq!(tpm.to_string(), "`openai#tpm` short: retry in 3s");
    }
}
