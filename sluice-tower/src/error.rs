//! Errors of the sluice service.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// The error type at the service boundary, as in tower.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The shared quota is used up: retry after [`retry_in`](RetryIn::retry_in).
///
/// Returned (boxed) by [`SluiceService`](crate::SluiceService) instead of calling the inner
/// service. Find it in a [`BoxError`] with [`retry_in`](crate::retry_in) or
/// `downcast_ref::<RetryIn>()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryIn {
    delay: Duration,
}

impl RetryIn {
    pub(crate) fn new(delay: Duration) -> Self {
        RetryIn { delay }
    }

    /// The exact wait before the request can be granted (rounded up to the millisecond).
    pub fn retry_in(&self) -> Duration {
        self.delay
    }
}

impl fmt::Display for RetryIn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate limited: retry in {} ms", self.delay.as_millis())
    }
}

impl StdError for RetryIn {}

/// Converts a sluice error to the service's error: a RetryIn becomes [`RetryIn`], anything
/// else stays a `sluice::Error`.
pub(crate) fn from_sluice(e: sluice::Error) -> BoxError {
    match e.retry_in() {
        Some(delay) => Box::new(RetryIn::new(delay)),
        None => Box::new(e),
    }
}

/// The RetryIn delay in `error`, looking through wrapping errors' `source()` chains; also
/// finds a `sluice::Error::RetryIn`.
///
/// ```
/// use std::time::Duration;
/// use sluice_tower::BoxError;
///
/// let e: BoxError = Box::new(sluice::Error::RetryIn(Duration::from_millis(1_200)));
/// assert_eq!(sluice_tower::retry_in(&*e), Some(Duration::from_millis(1_200)));
/// ```
pub fn retry_in(error: &(dyn StdError + 'static)) -> Option<Duration> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(r) = e.downcast_ref::<RetryIn>() {
            return Some(r.retry_in());
        }
        if let Some(d) = e
            .downcast_ref::<sluice::Error>()
            .and_then(sluice::Error::retry_in)
        {
            return Some(d);
        }
        current = e.source();
    }
    None
}
