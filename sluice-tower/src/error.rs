//! Errors of the sluice service.

use std::error::Error as StdError;

/// The error type at the service boundary, as in tower.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Converts a sluice error to the service's error: the `sluice::Error` itself, boxed. A
/// refusal is its `sluice::Error::RetryIn`, whose source is the [`sluice::RetryIn`]:
/// `sluice::Error::find_refusal(&*e)` reaches it directly, and through a client that
/// wraps the error again (async-openai's `OpenAIError::Boxed` forwards `source()` past
/// what it holds, to the `sluice::RetryIn`).
pub(crate) fn from_sluice(e: sluice::Error) -> BoxError {
    Box::new(e)
}
