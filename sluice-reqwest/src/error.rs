//! How the middleware's own errors reach the caller.

/// What became of a request the middleware answers with a sluice error, as the first line of
/// that error.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fate {
    /// The shared quota could not take it: it was never sent.
    NotSent,
    /// The vendor answered 429 and the route is paused for every process sharing it.
    Paused,
    /// It was abandoned at its lease's deadline, after it was sent.
    Abandoned,
}

/// A sluice error as the middleware returns it: `reqwest_middleware::Error::Middleware`
/// holding an `anyhow` error whose context says what became of the request (and repeats
/// the error, for callers that print only the first line) and whose `source()` is the
/// [`sluice::Error`] itself.
///
/// [`sluice::Error::find_retry_in`] finds the delay through `reqwest_middleware::Error`,
/// async-openai's `OpenAIError::Boxed` and other transparent wrappers (which forward
/// `source()` past the error they hold), and `anyhow`'s `downcast_ref::<sluice::Error>()`
/// still finds the error itself.
pub(crate) fn middleware_error(fate: Fate, error: sluice::Error) -> reqwest_middleware::Error {
    let what = match fate {
        Fate::NotSent => "sluice held the request back",
        Fate::Paused => "the vendor answered 429; sluice paused the route for every process",
        Fate::Abandoned => "sluice abandoned the request at its lease's deadline",
    };
    let context = format!("{what}: {error}");
    reqwest_middleware::Error::Middleware(anyhow::Error::new(error).context(context))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn retry(ms: u64) -> reqwest_middleware::Error {
        middleware_error(
            Fate::NotSent,
            sluice::Error::RetryIn(sluice::RetryIn::after(Duration::from_millis(ms))),
        )
    }

    fn find(error: &(dyn std::error::Error + 'static)) -> Option<Duration> {
        sluice::Error::find_retry_in(error)
    }

    #[test]
    fn the_delay_is_found_directly_and_through_every_wrapping() {
        assert_eq!(find(&retry(1_500)), Some(Duration::from_millis(1_500)));
        let once = reqwest_middleware::Error::Middleware(
            reqwest_retry::RetryError::Error(retry(20)).into(),
        );
        assert_eq!(find(&once), Some(Duration::from_millis(20)));
        let retried = reqwest_middleware::Error::Middleware(
            reqwest_retry::RetryError::WithRetries {
                retries: 3,
                err: retry(30),
            }
            .into(),
        );
        assert_eq!(find(&retried), Some(Duration::from_millis(30)));
        // In an application's anyhow error, with context of its own.
        let app = anyhow::Error::new(retry(40)).context("calling the vendor");
        assert_eq!(find(app.as_ref()), Some(Duration::from_millis(40)));
        // Boxed, as a tower service's error.
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(retry(50));
        assert_eq!(find(&*boxed), Some(Duration::from_millis(50)));
    }

    #[test]
    fn the_sluice_error_is_still_what_anyhow_holds_and_says_why() {
        let error = retry(1_250);
        let reqwest_middleware::Error::Middleware(inner) = &error else {
            panic!("{error:?}");
        };
        assert!(matches!(
            inner.downcast_ref::<sluice::Error>(),
            Some(sluice::Error::RetryIn(_))
        ));
        let text = error.to_string();
        assert!(
            text.contains("held the request back") && text.contains("1.250s"),
            "{text}"
        );
        let paused = middleware_error(
            Fate::Paused,
            sluice::Error::RetryIn(sluice::RetryIn::after(Duration::from_secs(2))),
        );
        assert!(
            paused.to_string().starts_with("the vendor answered 429"),
            "{paused}"
        );
    }

    #[test]
    fn other_errors_carry_no_delay() {
        let timeout = middleware_error(
            Fate::Abandoned,
            sluice::Error::Timeout(Duration::from_secs(1)),
        );
        assert_eq!(find(&timeout), None);
        let other = reqwest_middleware::Error::Middleware(anyhow::anyhow!("boom"));
        assert_eq!(find(&other), None);
    }
}
