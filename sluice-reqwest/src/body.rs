//! A response body that keeps the call's lease until the caller has read it to the end (or
//! dropped it), and corrects the charge from the usage the body reports.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, ready};

use http_body::{Body as HttpBody, Frame, SizeHint};
use reqwest::{Body, Response, ResponseBuilderExt as _};
use sluice::{Dimension, Lease, Tokens};

use crate::headers::Signal;
use crate::usage::Scan;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Ending = Pin<Box<dyn Future<Output = ()> + Send>>;
type Lost = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What to do at the end of a body: each dimension whose charge the reported usage
/// replaces, with the vendor count that replaces it.
pub(crate) type Corrections = Vec<(Dimension, Signal)>;

/// `response` with a body that holds `lease` until it ends: then the usage it reported
/// corrects the charges in `corrections` and the lease is released, before the caller sees
/// the end. A body dropped before its end releases the lease in the background (the
/// estimate stays). A body is never cut for time: a lease holding slots is renewed while
/// it is held, and the body fails, with [`sluice::Error::LeaseNotFound`], and its
/// connection is dropped, only once the slot is no longer its own
/// ([`Lease::lost`](sluice::Lease::lost)), since from then it may be another caller's.
/// Everything else on the response (status, headers, URL, extensions) stays as it was.
pub(crate) fn hold_until_read(
    response: Response,
    lease: Lease,
    corrections: Corrections,
) -> Response {
    let url = response.url().clone();
    let scan = if corrections.is_empty() {
        Scan::Off
    } else {
        Scan::for_content_type(
            response
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
        )
    };
    // Only a slot must end once lost (it may be another caller's from then); a stream held
    // only for its usage may run as long as the vendor streams it.
    let lost = lease
        .holds_slots()
        .then(|| Mutex::new(Box::pin(lease.lost()) as Lost));
    let id = lease.id().to_string();
    let (mut parts, body) = http::Response::<Body>::from(response).into_parts();
    // The way back to a reqwest response reads the URL from an extension the way there
    // drops: put it back.
    if let Ok(marked) = http::response::Builder::new().url(url).body(()) {
        parts.extensions.extend(marked.into_parts().0.extensions);
    }
    let guarded = Guarded {
        inner: body,
        lost,
        id,
        scan,
        corrections,
        lease: Some(lease),
        ending: None,
        cut: false,
    };
    Response::from(http::Response::from_parts(parts, Body::wrap(guarded)))
}

struct Guarded {
    inner: Body,
    /// Resolves once the lease's slots are no longer its own, for a lease holding slots (a
    /// mutex only to be `Sync`; never contended).
    lost: Option<Mutex<Lost>>,
    /// The lease's id, for the error of a body cut.
    id: String,
    scan: Scan,
    corrections: Vec<(Dimension, Signal)>,
    /// Held until the body ends; `None` once ended.
    lease: Option<Lease>,
    /// The correction and release, run when the body has ended and awaited before the
    /// caller sees the end (a mutex only to be `Sync`; never contended).
    ending: Option<Mutex<Ending>>,
    /// Cut at the lease's expiry: nothing more is read.
    cut: bool,
}

impl Guarded {
    /// The correction and release of the lease, now that the body has ended.
    fn end(&mut self) -> Option<Ending> {
        let mut lease = self.lease.take()?;
        let usage = std::mem::replace(&mut self.scan, Scan::Off).finish();
        let corrections = std::mem::take(&mut self.corrections);
        Some(Box::pin(async move {
            if let Some(usage) = usage {
                for (dimension, signal) in corrections {
                    let Some(used) = usage.of(signal) else {
                        continue;
                    };
                    let used = Tokens::new(i64::try_from(used).unwrap_or(i64::MAX));
                    match lease.adjust(dimension.as_str(), used).await {
                        Ok(()) => {
                            tracing::debug!(%dimension, %used, "charge corrected from the reported usage");
                        }
                        Err(error) => {
                            tracing::warn!(%dimension, %used, %error, "could not correct the charge from the reported usage");
                        }
                    }
                }
            }
            if let Err(error) = lease.release().await {
                tracing::warn!(%error, "release after the response body failed; retried in the background");
            }
        }))
    }
}

impl HttpBody for Guarded {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(ending) = this.ending.as_mut() {
            let ending = ending.get_mut().unwrap_or_else(|p| p.into_inner());
            ready!(ending.as_mut().poll(cx));
            this.ending = None;
            return Poll::Ready(None);
        }
        if this.cut {
            return Poll::Ready(None);
        }
        let lost = this.lost.as_mut().is_some_and(|l| {
            let l = l.get_mut().unwrap_or_else(|p| p.into_inner());
            l.as_mut().poll(cx).is_ready()
        });
        if this.lease.is_some() && lost {
            // The slot is no longer this call's: it may be handed on, so the call stops here.
            tracing::warn!(lease = %this.id, "response body still open when its slot was lost; cut");
            this.lease = None;
            this.cut = true;
            // The connection goes too: the vendor must stop counting the call.
            this.inner = Body::from(Vec::new());
            let lost = format!(
                "{}: its slot was reclaimed while the body was read",
                this.id
            );
            return Poll::Ready(Some(Err(Box::new(sluice::Error::LeaseNotFound(lost)))));
        }
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.scan.feed(data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(error)) => {
                // The body failed: what it used is unknown, the estimate stays; the lease
                // is released in the background.
                this.lease = None;
                Poll::Ready(Some(Err(error.into())))
            }
            None => match this.end() {
                Some(ending) => {
                    this.ending = Some(Mutex::new(ending));
                    Pin::new(this).poll_frame(cx)
                }
                None => Poll::Ready(None),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        // Not before the lease is dealt with: the reader must poll once more to see it.
        self.cut || (self.lease.is_none() && self.ending.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
