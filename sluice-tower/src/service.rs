//! The service.

use std::task::{Context, Poll};

use futures::FutureExt as _;
use sluice::Sluice;
use tower_service::Service;

use crate::error::{BoxError, from_sluice};
use crate::future::ResponseFuture;
use crate::layer::{AcquireFor, SluiceLayer};

/// Takes capacity from a shared quota before calling the inner service.
///
/// The lease is acquired in `call`, not in `poll_ready` (which only asks the inner service),
/// so a service polled ready and never called holds nothing. The response future owns the
/// lease and releases it when the inner call finishes or the future is dropped. Clones share
/// the same quota: it lives in the shared store, not in the service.
#[derive(Debug)]
pub struct SluiceService<S, A> {
    inner: S,
    config: SluiceLayer<A>,
}

impl<S: Clone, A> Clone for SluiceService<S, A> {
    fn clone(&self) -> Self {
        SluiceService {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S, A> SluiceService<S, A> {
    pub(crate) fn new(inner: S, config: SluiceLayer<A>) -> Self {
        SluiceService { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, A, Req> Service<Req> for SluiceService<S, A>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    S::Response: Send + 'static,
    A: AcquireFor<Req>,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        // The instance polled ready is the one to call; leave a fresh clone in its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let acquire = self
            .config
            .acquire
            .acquire_for(&request)
            .or_priority(self.config.priority.clone());
        let client: Option<Sluice> = self.config.client.clone();
        let timeout = self.config.timeout;
        let wait = self.config.wait;
        ResponseFuture::new(
            async move {
                let client = match client {
                    Some(c) => c,
                    None => Sluice::global().await.map_err(from_sluice)?,
                };
                match client
                    .slot_within(acquire, timeout, wait, move || inner.call(request))
                    .await
                {
                    Ok(Ok(response)) => Ok(response),
                    Ok(Err(e)) => Err(e.into()),
                    Err(e) => Err(from_sluice(e)),
                }
            }
            .boxed(),
        )
    }
}
