//! The middleware.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use std::future::Future;

use http::{Extensions, StatusCode};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use sluice::{
    Acquire, Lease, Priority, Sluice, Tokens, admin::Tighten, bucket::Report, clock::UnixMillis,
};

use crate::body::{Corrections, hold_until_read};
use crate::error::{Fate, middleware_error};
use crate::headers::{Signal, VendorLimits};
use crate::route::{Limit, Override, Route, Routes};

/// The pause applied after a vendor 429 that gave no delay at all.
pub const DEFAULT_PAUSE: Duration = Duration::from_secs(1);

/// reqwest middleware: every request to a routed vendor host runs in a sluice slot, and the
/// vendor's own rate-limit answers tighten the shared buckets.
///
/// - **Routing**: [`Routes`] maps hosts (and path prefixes) to dimensions; requests to other
///   hosts pass through untouched. An [`Override`] request extension replaces the route for
///   one request.
/// - **Slot**: capacity is acquired before sending. A lease on `requests`/`tokens`
///   dimensions only ends when the response headers arrive or the request fails; a lease
///   holding a `concurrent` slot lasts until the response body has been read to its end
///   or dropped (the vendor counts a streamed call until then). The response is handed
///   back whole, its body wrapped: status, headers, [`url`](reqwest::Response::url) and
///   extensions stay as they were. The call is the caller's: sluice never cuts or
///   abandons it (a deadline is reqwest's own `timeout`). The lease TTL only bounds how
///   long a slot stays taken after its process dies: a lease holding a slot is renewed
///   while it is held ([`Lease::lost`](sluice::Lease::lost)), and a body is cut, with
///   [`sluice::Error::LeaseNotFound`], only if its slot is no longer its own (its process
///   was frozen, or the store failed every renewal, for a whole TTL). A RetryIn is returned as `reqwest_middleware::Error::Middleware` carrying
///   [`sluice::Error::RetryIn`]; find its delay with [`sluice::Error::find_retry_in`] (and the short dimensions with [`sluice::Error::find_refusal`]),
///   however the error is wrapped afterwards.
/// - **Usage**: on a successful JSON or event-stream response, the vendor's reported
///   `usage` (OpenAI's `total_tokens`, Anthropic's `input_tokens + output_tokens`, a
///   stream's last usage event) replaces the estimate charged to each dimension fed by a
///   token [`Signal`](crate::Signal), when the body ends and before the caller sees its end.
///   A body dropped early or reporting no usage keeps the estimate;
///   [`Route::correct_usage`] opts a route out.
/// - **Vendor feedback**: a 429 pauses the route's dimensions for the vendor's delay
///   (`retry-after`, else the reset of what ran out, else [`DEFAULT_PAUSE`]) for every
///   process sharing the store, and the caller gets that delay as a RetryIn. When the
///   headers say which limit ran out (a [`Signal`](crate::Signal) with none remaining),
///   only the dimensions fed by it pause; otherwise all of the route's do. On other
///   answers, a remaining count with its reset bounds the bucket's burst to what the
///   vendor holds when full and lowers it to what the vendor can hold now
///   ([`Tighten::Reported`]); a remaining count alone lowers the bucket to it. Feedback
///   never loosens a bucket beyond its definition.
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

    /// The lease TTL (default: the client's lease TTL): how long after its process dies a
    /// request's slot is given back, never a deadline of the request.
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
    /// Every other limit with a reported remaining count is lowered to what the vendor can
    /// hold now, and, when the vendor also says when it is full again, bounded to the
    /// vendor's burst ([`Tighten::Reported`]). `sent_at` is when the request left, by the
    /// client's clock: the vendor counted no earlier.
    async fn learn(
        &self,
        client: &Sluice,
        limits: &[Limit],
        status: StatusCode,
        vendor: &VendorLimits,
        sent_at: UnixMillis,
    ) -> Option<Duration> {
        let remaining = |limit: &Limit| limit.signal_value().and_then(|s| vendor.remaining(s));
        let pause = (status == StatusCode::TOO_MANY_REQUESTS)
            .then(|| ceil_millis(vendor.pause().unwrap_or(self.default_pause)));
        let named = limits.iter().any(|l| remaining(l) == Some(0));
        for limit in limits {
            let left = |n: u64| Tokens::new(i64::try_from(n).unwrap_or(i64::MAX));
            let reset = limit.signal_value().and_then(|s| vendor.reset(s));
            let how = match (pause, remaining(limit), reset) {
                (Some(pause), Some(0), _) => Tighten::PauseFor(pause),
                (Some(pause), _, _) if !named => Tighten::PauseFor(pause),
                (_, Some(n), Some(full_in)) => Tighten::Reported(Report {
                    remaining: left(n),
                    full_in,
                    counted_after: sent_at,
                }),
                (_, Some(n), None) => Tighten::AtMost(left(n)),
                (_, None, _) => continue,
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
                    (route.limits_for(&request).to_vec(), Some(p.clone()))
                }
                (None, Some(route)) => (route.limits_for(&request).to_vec(), route_priority),
                // No route, and no limits of the request's own: not a vendor call.
                (Some(Override::Priority(_)) | None, None) => {
                    return next.run(request, extensions).await;
                }
            };
        if limits.is_empty() {
            return next.run(request, extensions).await;
        }
        let correct_usage = route.is_none_or(Route::corrects_usage);
        let client = self
            .sluice()
            .await
            .map_err(|e| middleware_error(Fate::NotSent, e))?;
        let ttl = self.lease_ttl.unwrap_or(client.config().lease_ttl);
        let acquire = limits
            .iter()
            .fold(Acquire::default(), |a, l| l.add_to(a, &request))
            .or_priority(priority)
            .or_priority(self.priority.clone())
            .ttl(ttl);
        let lease = match client.acquire_within(acquire, self.wait).await {
            Ok(lease) => lease,
            Err(sluice::Error::UnknownDimension { dimension, .. }) if self.pass_unknown => {
                tracing::warn!(%dimension, url = %request.url(), "no bucket defined; sending without a slot");
                return next.run(request, extensions).await;
            }
            Err(error) => return Err(middleware_error(Fate::NotSent, error)),
        };
        let sent_at = client.now();
        let sent_system = SystemTime::now();
        let (response, lease) = send(lease, next.run(request, extensions)).await?;
        // Held dimensions (`concurrent`) stay held while the vendor streams the body, and
        // token charges wait for the usage the body reports; anything else ends now.
        let corrections = if correct_usage && response.status().is_success() {
            usage_corrections(&limits)
        } else {
            Corrections::new()
        };
        // A 429 answered with a pause never reaches the caller: its slot ends now.
        let pausing = self.feedback && response.status() == StatusCode::TOO_MANY_REQUESTS;
        let hold = !pausing && (lease.holds_slots() || !corrections.is_empty());
        let lease = if hold {
            Some(lease)
        } else {
            if let Err(error) = lease.release().await {
                tracing::warn!(%error, "release after the response failed; retried in the background");
            }
            None
        };
        if self.feedback {
            // Absolute resets (Anthropic's) are read from when the request left: the
            // vendor counted no earlier.
            let vendor = VendorLimits::from_headers(response.headers(), sent_system);
            if let Some(pause) = self
                .learn(&client, &limits, response.status(), &vendor, sent_at)
                .await
            {
                return Err(middleware_error(
                    Fate::Paused,
                    sluice::Error::RetryIn(sluice::RetryIn::after(pause)),
                ));
            }
        }
        let response = match lease {
            Some(lease) => hold_until_read(response, lease, corrections),
            None => response,
        };
        Ok(response)
    }
}

/// Sends the request under `lease`: the response (with the lease, still held), or the
/// request's error (the lease released). Never cut for a lease holding no slot; a request
/// under a slot lease is abandoned, with [`sluice::Error::LeaseNotFound`], only if the
/// slot stops being its own while it waits for its headers (see
/// [`Lease::lost`](sluice::Lease::lost)); a lease granted with no time left sends nothing.
async fn send(
    lease: Lease,
    request: impl Future<Output = reqwest_middleware::Result<Response>>,
) -> reqwest_middleware::Result<(Response, Lease)> {
    let release = |lease: Lease| async move {
        if let Err(error) = lease.release().await {
            tracing::warn!(%error, "release after a failed request failed; retried in the background");
        }
    };
    if lease.remaining().is_zero() {
        let ttl = lease.expires_at().saturating_since(lease.created_at());
        release(lease).await;
        return Err(middleware_error(Fate::NotSent, sluice::Error::Timeout(ttl)));
    }
    let lost = lease.lost();
    tokio::select! {
        outcome = request => match outcome {
            Ok(response) => Ok((response, lease)),
            Err(error) => {
                release(lease).await;
                Err(error)
            }
        },
        () = lost => {
            let id = lease.id().to_string();
            release(lease).await;
            Err(middleware_error(
                Fate::Abandoned,
                sluice::Error::LeaseNotFound(format!("{id}: its slot was reclaimed before the response came")),
            ))
        }
    }
}

/// The limits whose charge the reported usage replaces: those fed by a token count.
fn usage_corrections(limits: &[Limit]) -> Corrections {
    limits
        .iter()
        .filter_map(|l| match l.signal_value()? {
            Signal::Requests => None,
            signal => Some((l.dimension().clone(), signal)),
        })
        .collect()
}

/// A delay rounded up to the millisecond, at least 1 ms (as every RetryIn is).
fn ceil_millis(d: Duration) -> Duration {
    let millis = d.as_nanos().div_ceil(1_000_000).max(1);
    Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}
