//! Finding a RetryIn in a `reqwest_middleware::Error`.

use std::time::Duration;

/// The delay of a sluice RetryIn inside `error`, however it is wrapped: directly by this
/// crate's middleware, or by `reqwest-retry`'s `RetryError::{Error, WithRetries}` around it
/// (also through `anyhow` context). `None` for any other error.
///
/// ```
/// use std::time::Duration;
///
/// let error = reqwest_middleware::Error::middleware(sluice::Error::RetryIn(Duration::from_secs(7)));
/// assert_eq!(sluice_reqwest::retry_in(&error), Some(Duration::from_secs(7)));
/// ```
pub fn retry_in(error: &reqwest_middleware::Error) -> Option<Duration> {
    match error {
        reqwest_middleware::Error::Reqwest(_) => None,
        reqwest_middleware::Error::Middleware(inner) => inner.chain().find_map(in_link),
    }
}

/// A RetryIn carried by one link of an error chain.
fn in_link(link: &(dyn std::error::Error + 'static)) -> Option<Duration> {
    if let Some(e) = link.downcast_ref::<sluice::Error>() {
        return e.retry_in();
    }
    if let Some(e) = link.downcast_ref::<reqwest_middleware::Error>() {
        return retry_in(e);
    }
    if let Some(e) = link.downcast_ref::<reqwest_retry::RetryError>() {
        return match e {
            reqwest_retry::RetryError::Error(inner)
            | reqwest_retry::RetryError::WithRetries { err: inner, .. } => retry_in(inner),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry(ms: u64) -> reqwest_middleware::Error {
        reqwest_middleware::Error::middleware(sluice::Error::RetryIn(Duration::from_millis(ms)))
    }

    #[test]
    fn found_directly_and_through_every_wrapping() {
        assert_eq!(retry_in(&retry(1_500)), Some(Duration::from_millis(1_500)));
        let once = reqwest_middleware::Error::Middleware(
            reqwest_retry::RetryError::Error(retry(20)).into(),
        );
        assert_eq!(retry_in(&once), Some(Duration::from_millis(20)));
        let retried = reqwest_middleware::Error::Middleware(
            reqwest_retry::RetryError::WithRetries {
                retries: 3,
                err: retry(30),
            }
            .into(),
        );
        assert_eq!(retry_in(&retried), Some(Duration::from_millis(30)));
        let with_context = reqwest_middleware::Error::Middleware(
            anyhow::Error::new(sluice::Error::RetryIn(Duration::from_millis(40)))
                .context("calling the vendor"),
        );
        assert_eq!(retry_in(&with_context), Some(Duration::from_millis(40)));
    }

    #[test]
    fn other_errors_carry_no_delay() {
        let timeout =
            reqwest_middleware::Error::middleware(sluice::Error::Timeout(Duration::from_secs(1)));
        assert_eq!(retry_in(&timeout), None);
        let other = reqwest_middleware::Error::Middleware(anyhow::anyhow!("boom"));
        assert_eq!(retry_in(&other), None);
    }
}
