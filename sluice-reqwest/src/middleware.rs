//! The middleware.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Extensions, StatusCode};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use sluice::{Acquire, Priority, Sluice, Tighten, Tokens};

use crate::headers::VendorLimits;
use crate::route::{Limit, Override, Route, Routes};

/// The pause applied after a vendor 429 that gave no delay at all.
pub const DEFAULT_PAUSE: Duration = Duration::from_secs(1);

/// reqwest middleware: every request to a routed vendor host runs in a sluice slot, and the
/// vendor's own rate-limit answers tighten the shared buckets.
///
/// - **Routing**: [`Routes`] maps hosts (and path prefixes) to dimensions; requests to other
///   hosts pass through untouched. An [`Override`] request extension replaces the route for
///   one request.
/// - **Slot**: capacity is acquired before sending and released when the response headers
///   arrive or the request fails. The lease TTL is also the request's deadline (a request
///   still running then is abandoned with [`sluice::Error::Timeout`]), so a slot can never
///   outlive its lease. A RetryIn is returned as
///   `reqwest_middleware::Error::Middleware` carrying [`sluice::Error::RetryIn`]; find it with
///   [`retry_in`](crate::retry_in).
/// - **Vendor feedback**: a 429 pauses the route's dimensions for the vendor's delay
///   (`retry-after`, else the reset of what ran out, else [`DEFAULT_PAUSE`]) for every
///   process sharing the store, and the caller gets that delay as a RetryIn. When the
///   headers say which limit ran out (a [`Signal`](crate::Signal) with none remaining),
///   only the dimensions fed by it pause; otherwise all of the route's do. A reported
///   remaining count lower than a bucket holds lowers that bucket. Feedback never loosens
///   a bucket.
///
/// Put it *inside* `reqwest-retry`'s `RetryTransientMiddleware` (add the retry middleware
/// first): every attempt is a vendor call and takes its own capacity, and a RetryIn is a
/// middleware error, which the retry middleware does not retry.
///
/// ```
/// use std::time::Duration;
/// use reqwest_middleware::ClientBuilder;
/// use reqwest_retry::{RetryTransientMiddleware, policies::ExponentialBackoff};
/// use sluice_reqwest::SluiceMiddleware;
///
/// let client = ClientBuilder::new(reqwest::Client::new())
///     .with(RetryTransientMiddleware::new_with_policy(
///         ExponentialBackoff::builder().build_with_max_retries(3),
///     ))
///     .with(SluiceMiddleware::default().wait(Duration::from_secs(2)))
///     .build();
/// # let _ = client;
/// ```
#[derive(Debug, Clone)]
pub struct SluiceMiddleware {
    routes: Arc<Routes>,
    client: Option<Sluice>,
    lease_ttl: Option<Duration>,
    wait: Duration,
    feedback: bool,
    default_pause: Duration,
    pass_unknown: bool,
    priority: Option<Priority>,
}

impl Default for SluiceMiddleware {
    /// The well-known vendors ([`Routes::vendors`]) on the process-wide client.
    fn default() -> Self {
        SluiceMiddleware::new(Routes::vendors())
    }
}

impl SluiceMiddleware {
    /// A middleware routing with `routes`, on the process-wide client ([`Sluice::global`])
    /// unless [`client`](Self::client) says otherwise.
    pub fn new(routes: Routes) -> Self {
        SluiceMiddleware {
            routes: Arc::new(routes),
            client: None,
            lease_ttl: None,
            wait: Duration::ZERO,
            feedback: true,
            default_pause: DEFAULT_PAUSE,
            pass_unknown: false,
            priority: None,
        }
    }

    /// Uses this client instead of the process-wide one.
    pub fn client(mut self, client: Sluice) -> Self {
        self.client = Some(client);
        self
    }

    /// The lease TTL, which is also each request's deadline (default: the client's lease
    /// TTL).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = Some(ttl);
        self
    }

    /// Waits inline up to `max_wait` for capacity before answering RetryIn (default: do not
    /// wait).
    pub fn wait(mut self, max_wait: Duration) -> Self {
        self.wait = max_wait;
        self
    }

    /// Whether the vendor's answers tighten the shared buckets (default: yes).
    pub fn feedback(mut self, on: bool) -> Self {
        self.feedback = on;
        self
    }

    /// The pause after a 429 that carries no delay (default [`DEFAULT_PAUSE`]).
    pub fn default_pause(mut self, pause: Duration) -> Self {
        self.default_pause = pause;
        self
    }

    /// The priority of requests whose route and [`Override`] name none (default: the
    /// client's, see [`sluice::Config::priority`]).
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Sends requests whose dimension has no bucket defined, with a warning, instead of
    /// failing them with [`sluice::Error::UnknownDimension`] (the default: a missing bucket
    /// is a configuration mistake that should be seen, not an unlimited vendor).
    pub fn pass_unknown_dimensions(mut self, pass: bool) -> Self {
        self.pass_unknown = pass;
        self
    }

    async fn sluice(&self) -> Result<Sluice, sluice::Error> {
        match &self.client {
            Some(client) => Ok(client.clone()),
            None => Sluice::global().await,
        }
    }

    /// Tells the shared buckets what the vendor said; returns the pause after a 429.
    ///
    /// A 429 pauses the route's limits whose vendor signal is reported exhausted (none
    /// remaining), or every limit of the route when the vendor does not say which ran out.
    /// Every other limit with a reported remaining count is lowered to it.
    async fn learn(
        &self,
        client: &Sluice,
        limits: &[Limit],
        status: StatusCode,
        vendor: &VendorLimits,
    ) -> Option<Duration> {
        let remaining = |limit: &Limit| limit.signal_value().and_then(|s| vendor.remaining(s));
        let pause = (status == StatusCode::TOO_MANY_REQUESTS)
            .then(|| ceil_millis(vendor.pause().unwrap_or(self.default_pause)));
        let named = limits.iter().any(|l| remaining(l) == Some(0));
        for limit in limits {
            let how = match (pause, remaining(limit)) {
                (Some(pause), Some(0)) => Tighten::PauseFor(pause),
                (Some(pause), _) if !named => Tighten::PauseFor(pause),
                (_, Some(left)) => {
                    Tighten::AtMost(Tokens::new(i64::try_from(left).unwrap_or(i64::MAX)))
                }
                (_, None) => continue,
            };
            self.tighten(client, limit, how).await;
        }
        pause
    }

    async fn tighten(&self, client: &Sluice, limit: &Limit, how: Tighten) {
        let dimension = limit.dimension().as_str();
        match client.tighten(dimension, how).await {
            Ok(changed) => {
                tracing::debug!(dimension, ?how, changed, "vendor feedback");
            }
            Err(error) => {
                tracing::warn!(dimension, ?how, %error, "could not apply the vendor's rate-limit report");
            }
        }
    }
}

#[async_trait::async_trait]
impl Middleware for SluiceMiddleware {
    async fn handle(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let route = self.routes.find(request.url());
        let route_priority = route.and_then(Route::priority_value).cloned();
        let (limits, priority): (Vec<Limit>, Option<Priority>) =
            match (extensions.get::<Override>(), route) {
                (Some(Override::Bypass), _) => return next.run(request, extensions).await,
                (Some(Override::Limits(limits)), _) => (limits.clone(), route_priority),
                (Some(Override::LimitsAt(limits, p)), _) => (limits.clone(), Some(p.clone())),
                (Some(Override::Priority(p)), Some(route)) => {
                    (route.limits().to_vec(), Some(p.clone()))
                }
                (None, Some(route)) => (route.limits().to_vec(), route_priority),
                // No route, and no limits of the request's own: not a vendor call.
                (Some(Override::Priority(_)) | None, None) => {
                    return next.run(request, extensions).await;
                }
            };
        if limits.is_empty() {
            return next.run(request, extensions).await;
        }
        let client = self
            .sluice()
            .await
            .map_err(reqwest_middleware::Error::middleware)?;
        let acquire = limits
            .iter()
            .fold(Acquire::default(), |a, l| l.add_to(a, &request))
            .or_priority(priority)
            .or_priority(self.priority.clone());
        // The request is handed on only once granted; kept here until then, so that a
        // dimension without a bucket can still let it through (`pass_unknown`).
        let mut unsent = Some(request);
        let unknown_next = next.clone();
        let body_extensions = &mut *extensions;
        let sent = client
            .slot_within(acquire, self.lease_ttl, self.wait, || {
                let request = unsent.take();
                async move {
                    match request {
                        Some(request) => next.run(request, body_extensions).await,
                        None => Err(reqwest_middleware::Error::middleware(HandedOn)),
                    }
                }
            })
            .await;
        // The slot is released as soon as the response headers are in (or the request
        // failed or ran past the lease), before the feedback below.
        let response = match (sent, unsent) {
            (Ok(response), _) => response?,
            (Err(sluice::Error::UnknownDimension(dimension)), Some(request))
                if self.pass_unknown =>
            {
                tracing::warn!(%dimension, url = %request.url(), "no bucket defined; sending without a slot");
                return unknown_next.run(request, extensions).await;
            }
            (Err(error), _) => return Err(reqwest_middleware::Error::middleware(error)),
        };
        if self.feedback {
            let vendor = VendorLimits::from_headers(response.headers(), SystemTime::now());
            if let Some(pause) = self
                .learn(&client, &limits, response.status(), &vendor)
                .await
            {
                return Err(reqwest_middleware::Error::middleware(
                    sluice::Error::RetryIn(pause),
                ));
            }
        }
        Ok(response)
    }
}

/// The request was handed on already: a slot's body is made once, so this never happens.
#[derive(Debug)]
struct HandedOn;

impl std::fmt::Display for HandedOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request was already handed on")
    }
}

impl std::error::Error for HandedOn {}

/// A delay rounded up to the millisecond, at least 1 ms (as every RetryIn is).
fn ceil_millis(d: Duration) -> Duration {
    let millis = d.as_nanos().div_ceil(1_000_000).max(1);
    Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}
