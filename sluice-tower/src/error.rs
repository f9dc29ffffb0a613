//! Errors of the sluice service.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// The error type at the service boundary, as in tower.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The shared quota is used up: retry after [`retry_in`](RetryIn::retry_in).
///
/// Returned (boxed) by [`SluiceService`](crate::SluiceService) instead of calling the inner
/// service. Find its delay with [`sluice::Error::find_retry_in`] (in a [`BoxError`] `e`:
/// `find_retry_in(&*e)`), however a client wraps the error afterwards, or with
/// `downcast_ref::<RetryIn>()`.
///
/// Its [`source`](StdError::source) is the [`sluice::Error::RetryIn`] it stands for: a
/// wrapper that forwards `source()` past what it holds (async-openai's
/// `OpenAIError::Boxed`) still leads to it.
#[derive(Debug)]
pub struct RetryIn {
    /// Always a [`sluice::Error::RetryIn`].
    source: sluice::Error,
}

impl RetryIn {
    pub(crate) fn new(delay: Duration) -> Self {
        RetryIn {
            source: sluice::Error::RetryIn(delay),
        }
    }

    /// The exact wait before the request can be granted (rounded up to the millisecond).
    pub fn retry_in(&self) -> Duration {
        self.source.retry_in().unwrap_or_default()
    }
}

impl Clone for RetryIn {
    fn clone(&self) -> Self {
        RetryIn::new(self.retry_in())
    }
}

impl PartialEq for RetryIn {
    fn eq(&self, other: &Self) -> bool {
        self.retry_in() == other.retry_in()
    }
}

impl Eq for RetryIn {}

impl fmt::Display for RetryIn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rate limited: retry in {} ms",
            self.retry_in().as_millis()
        )
    }
}

impl StdError for RetryIn {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.source)
    }
}

/// Converts a sluice error to the service's error: a RetryIn becomes [`RetryIn`], anything
/// else stays a `sluice::Error`.
pub(crate) fn from_sluice(e: sluice::Error) -> BoxError {
    match e.retry_in() {
        Some(delay) => Box::new(RetryIn::new(delay)),
        None => Box::new(e),
    }
}
