//! RetryIn as `429 Too Many Requests`, for `http` services.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::BoxError;

/// Turns a RetryIn from the services below into a `429 Too Many Requests` response with a
/// `Retry-After` header in whole seconds, rounded **up** (1.2 s becomes `2`; a wait is
/// never advertised as shorter than it is). Other errors pass through.
///
/// Useful when sluice guards an inbound route: put it *outside* [`SluiceLayer`](crate::SluiceLayer).
#[derive(Debug, Clone, Copy, Default)]
pub struct TooManyRequestsLayer;

impl<S> Layer<S> for TooManyRequestsLayer {
    type Service = TooManyRequests<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TooManyRequests { inner }
    }
}

/// The service of [`TooManyRequestsLayer`].
#[derive(Debug, Clone)]
pub struct TooManyRequests<S> {
    inner: S,
}

/// `Retry-After` in whole seconds, rounded up.
pub(crate) fn retry_after_secs(delay: Duration) -> u64 {
    let secs = delay.as_secs();
    if delay.subsec_nanos() > 0 {
        secs + 1
    } else {
        secs
    }
}

impl<S, Req, B> Service<Req> for TooManyRequests<S>
where
    S: Service<Req, Response = http::Response<B>>,
    S::Error: Into<BoxError> + Send,
    S::Future: Send + 'static,
    B: Default + Send + 'static,
{
    type Response = http::Response<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<B>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let future = self.inner.call(request);
        let mapped: BoxFuture<'static, Result<http::Response<B>, BoxError>> = async move {
            match future.await.map_err(Into::into) {
                Ok(response) => Ok(response),
                Err(error) => match sluice::Error::find_retry_in(&*error) {
                    Some(delay) => {
                        let mut response = http::Response::new(B::default());
                        *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                        response.headers_mut().insert(
                            http::header::RETRY_AFTER,
                            http::HeaderValue::from(retry_after_secs(delay)),
                        );
                        Ok(response)
                    }
                    None => Err(error),
                },
            }
        }
        .boxed();
        mapped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::from_millis(1_200)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(3)), 3);
    }
}
