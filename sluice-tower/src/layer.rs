//! The layer.

use std::sync::Arc;
use std::time::Duration;

use sluice::{Acquire, Priority, Sluice};
use tower_layer::Layer;

use crate::service::SluiceService;

/// What to acquire for a request.
pub trait AcquireFor<Req>: Send + Sync + 'static {
    /// The dimensions and costs `request` needs.
    fn acquire_for(&self, request: &Req) -> Acquire;
}

/// The same dimensions, at their buckets' `cost_per_call`, for every request.
#[derive(Debug, Clone)]
pub struct Fixed(Vec<String>);

impl<Req> AcquireFor<Req> for Fixed {
    fn acquire_for(&self, _: &Req) -> Acquire {
        self.0.iter().fold(Acquire::default(), |a, d| a.and(d))
    }
}

impl<Req, F> AcquireFor<Req> for F
where
    F: Fn(&Req) -> Acquire + Send + Sync + 'static,
{
    fn acquire_for(&self, request: &Req) -> Acquire {
        self(request)
    }
}

/// Applies [`SluiceService`]: every call first takes capacity from a shared quota.
///
/// ```
/// use std::time::Duration;
/// use sluice_tower::SluiceLayer;
///
/// // openai#rpm from the process-wide client; inline waits up to 2 s.
/// let layer = SluiceLayer::new("openai#rpm").wait(Duration::from_secs(2));
///
/// // Costs computed from each request.
/// let per_request = SluiceLayer::per_request(|prompt: &String| {
///     sluice::Acquire::new("openai#rpm").and_cost("openai#tpm", prompt.len() / 4)
/// })
/// .timeout(Duration::from_secs(30));
///
/// // A batch worker: every call leaves the reserves kept for higher priorities.
/// let batch = SluiceLayer::new("openai#rpm").priority("batch".parse()?);
///
/// // The priority chosen per request, with its costs.
/// let tiered = SluiceLayer::per_request(|job: &(bool, String)| {
///     let tier = if job.0 { "interactive" } else { "batch" };
///     sluice::Acquire::with_cost("openai#tpm", job.1.len() / 4).priority(tier.parse().unwrap())
/// });
/// # let _ = (layer, per_request, batch, tiered);
/// # Ok::<(), sluice::error::PriorityError>(())
/// ```
#[derive(Debug)]
pub struct SluiceLayer<A = Fixed> {
    pub(crate) acquire: Arc<A>,
    pub(crate) client: Option<Sluice>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) wait: Duration,
    pub(crate) priority: Option<Priority>,
}

impl<A> Clone for SluiceLayer<A> {
    fn clone(&self) -> Self {
        SluiceLayer {
            acquire: self.acquire.clone(),
            client: self.client.clone(),
            timeout: self.timeout,
            wait: self.wait,
            priority: self.priority.clone(),
        }
    }
}

impl SluiceLayer<Fixed> {
    /// Every request takes `dimension`'s `cost_per_call`, from the process-wide client
    /// ([`Sluice::global`]) unless [`client`](Self::client) says otherwise.
    pub fn new(dimension: impl Into<String>) -> Self {
        SluiceLayer {
            acquire: Arc::new(Fixed(vec![dimension.into()])),
            client: None,
            timeout: None,
            wait: Duration::ZERO,
            priority: None,
        }
    }

    /// Every request also takes `dimension`'s `cost_per_call` (all or nothing).
    pub fn and(self, dimension: impl Into<String>) -> Self {
        let mut dims = self.acquire.0.clone();
        dims.push(dimension.into());
        SluiceLayer {
            acquire: Arc::new(Fixed(dims)),
            ..self
        }
    }
}

impl<A> SluiceLayer<A> {
    /// What each request acquires is computed from the request.
    pub fn per_request<Req>(acquire: A) -> Self
    where
        A: AcquireFor<Req>,
    {
        SluiceLayer {
            acquire: Arc::new(acquire),
            client: None,
            timeout: None,
            wait: Duration::ZERO,
            priority: None,
        }
    }

    /// Uses `client` instead of the process-wide default.
    pub fn client(mut self, client: Sluice) -> Self {
        self.client = Some(client);
        self
    }

    /// The inner call's deadline, opt-in, also the lease's TTL (default: no deadline, the
    /// client's lease TTL; a `concurrent` slot is renewed for as long as the call runs).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// On RetryIn, wait inline for capacity while the total wait stays within `max_wait`
    /// (default: do not wait).
    pub fn wait(mut self, max_wait: Duration) -> Self {
        self.wait = max_wait;
        self
    }

    /// The priority of every request whose [`Acquire`] names none (default: the client's,
    /// see [`sluice::Config::priority`]).
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = Some(priority);
        self
    }
}

impl<S, A> Layer<S> for SluiceLayer<A> {
    type Service = SluiceService<S, A>;

    fn layer(&self, inner: S) -> Self::Service {
        SluiceService::new(inner, self.clone())
    }
}
