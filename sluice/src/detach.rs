//! Writes that finish even when their caller goes away.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Runs a future to completion even if the caller stops waiting: polled in place while the
/// caller awaits it, moved to a task of its own if the caller drops it first.
///
/// A conditional write dropped half-way may or may not have been applied; finishing it
/// means whoever sent it learns the outcome, and can give back a grant nobody will use.
pub(crate) struct Detached<F: Future<Output = ()> + Send + 'static> {
    future: Option<Pin<Box<F>>>,
}

impl<F: Future<Output = ()> + Send + 'static> Detached<F> {
    pub(crate) fn new(future: F) -> Self {
        Detached {
            future: Some(Box::pin(future)),
        }
    }
}

impl<F: Future<Output = ()> + Send + 'static> Future for Detached<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(future) = self.future.as_mut() else {
            return Poll::Ready(());
        };
        let poll = future.as_mut().poll(cx);
        if poll.is_ready() {
            self.future = None;
        }
        poll
    }
}

impl<F: Future<Output = ()> + Send + 'static> Drop for Detached<F> {
    fn drop(&mut self) {
        if let Some(future) = self.future.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(future);
                }
                Err(_) => tracing::warn!(
                    "a write in flight was dropped outside a tokio runtime; a lease it may have \
                     granted expires and is reconciled"
                ),
            }
        }
    }
}

impl<F: Future<Output = ()> + Send + 'static> std::fmt::Debug for Detached<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detached")
            .field("done", &self.future.is_none())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn a_dropped_future_finishes_in_a_task_of_its_own() {
        let done = Arc::new(AtomicBool::new(false));
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let work = Detached::new({
            let done = done.clone();
            async move {
                let _ = wait.await;
                done.store(true, Ordering::SeqCst);
            }
        });
        // Polled once (it waits), then dropped by its caller.
        let mut work = Box::pin(work);
        assert!(futures::poll!(work.as_mut()).is_pending());
        drop(work);
        go.send(()).unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(done.load(Ordering::SeqCst));
    }
}
