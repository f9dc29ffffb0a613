//! The response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use crate::error::BoxError;

/// The response future of [`SluiceService`](crate::SluiceService). It owns the lease: the
/// lease is released when the inner call finishes, fails, or this future is dropped.
pub struct ResponseFuture<R> {
    inner: BoxFuture<'static, Result<R, BoxError>>,
}

impl<R> ResponseFuture<R> {
    pub(crate) fn new(inner: BoxFuture<'static, Result<R, BoxError>>) -> Self {
        ResponseFuture { inner }
    }
}

impl<R> Future for ResponseFuture<R> {
    type Output = Result<R, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<R> fmt::Debug for ResponseFuture<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
