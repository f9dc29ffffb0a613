//! Which requests take capacity from which dimensions.

use std::fmt;
use std::sync::Arc;

use reqwest::{Request, Url};
use sluice::{Acquire, Dimension, Priority, Tokens, error::DimensionError};

use crate::headers::Signal;

type Estimate = dyn Fn(&Request) -> Option<Tokens> + Send + Sync;

/// What one request costs on a dimension.
#[derive(Clone)]
enum Cost {
    /// The bucket's `cost_per_call`.
    PerCall,
    Fixed(Tokens),
    Estimate(Arc<Estimate>),
}

impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cost::PerCall => f.write_str("PerCall"),
            Cost::Fixed(t) => f.debug_tuple("Fixed").field(t).finish(),
            Cost::Estimate(_) => f.write_str("Estimate(..)"),
        }
    }
}

/// One dimension a request takes capacity from: its cost, and which of the vendor's
/// reported limits (if any) describes it, so that the vendor's answers can tighten it.
///
/// ```
/// use sluice_reqwest::{Limit, Signal, estimate};
///
/// let rpm = Limit::parse("openai#rpm")?.signal(Signal::Requests);
/// let tpm = Limit::parse("openai#tpm")?.estimate(estimate::chat_tokens).signal(Signal::Tokens);
/// let images = Limit::parse("openai#images")?.cost(4);
/// # let _ = (rpm, tpm, images);
/// # Ok::<(), sluice::error::DimensionError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Limit {
    dimension: Dimension,
    cost: Cost,
    signal: Option<Signal>,
}

impl Limit {
    /// A limit on `dimension` costing its bucket's `cost_per_call` per request.
    pub fn new(dimension: Dimension) -> Limit {
        Limit {
            dimension,
            cost: Cost::PerCall,
            signal: None,
        }
    }

    /// [`Limit::new`] from a `{vendor}#{metric}` string.
    pub fn parse(dimension: &str) -> Result<Limit, DimensionError> {
        Dimension::new(dimension).map(Limit::new)
    }

    /// Every request costs `tokens`.
    pub fn cost(mut self, tokens: impl Into<Tokens>) -> Limit {
        self.cost = Cost::Fixed(tokens.into());
        self
    }

    /// Each request's cost is computed from the request (e.g. a token estimate from its
    /// body); `None` falls back to the bucket's `cost_per_call`.
    pub fn estimate(
        mut self,
        estimate: impl Fn(&Request) -> Option<Tokens> + Send + Sync + 'static,
    ) -> Limit {
        self.cost = Cost::Estimate(Arc::new(estimate));
        self
    }

    /// The vendor's reported limit that describes this dimension: its `remaining` count
    /// lowers the bucket. A 429 pauses every dimension of the route whatever its signal.
    pub fn signal(mut self, signal: Signal) -> Limit {
        self.signal = Some(signal);
        self
    }

    /// The dimension.
    pub fn dimension(&self) -> &Dimension {
        &self.dimension
    }

    /// The vendor signal that feeds this dimension, if any.
    pub fn signal_value(&self) -> Option<Signal> {
        self.signal
    }

    /// Adds this limit's part to `acquire`.
    pub(crate) fn add_to(&self, acquire: Acquire, request: &Request) -> Acquire {
        let cost = match &self.cost {
            Cost::PerCall => None,
            Cost::Fixed(t) => Some(*t),
            Cost::Estimate(f) => f(request),
        };
        match cost {
            Some(cost) => acquire.and_cost(self.dimension.as_str(), cost),
            None => acquire.and(self.dimension.as_str()),
        }
    }
}

/// Requests to `host` (optionally only under a path prefix) take capacity from its limits.
///
/// ```
/// use sluice_reqwest::{Limit, Route};
///
/// let embeddings = Route::new("api.openai.com")
///     .path_prefix("/v1/embeddings")
///     .limit(Limit::parse("openai#embeddings-rpm")?);
/// # let _ = embeddings;
/// # Ok::<(), sluice::error::DimensionError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Route {
    host: String,
    path_prefix: String,
    limits: Vec<Limit>,
    priority: Option<Priority>,
    models: Vec<(String, Vec<Limit>)>,
    usage: bool,
}

impl Route {
    /// A route for every request to `host` (compared case-insensitively, port ignored).
    pub fn new(host: impl Into<String>) -> Route {
        Route {
            host: host.into().to_ascii_lowercase(),
            path_prefix: String::new(),
            limits: Vec::new(),
            priority: None,
            models: Vec::new(),
            usage: true,
        }
    }

    /// Only requests whose path starts with `prefix` (the longest matching prefix wins).
    pub fn path_prefix(mut self, prefix: impl Into<String>) -> Route {
        self.path_prefix = prefix.into();
        self
    }

    /// Adds a dimension the route's requests take capacity from (all or nothing).
    pub fn limit(mut self, limit: Limit) -> Route {
        self.limits.push(limit);
        self
    }

    /// The priority of the route's requests, over the middleware's (see
    /// [`SluiceMiddleware::priority`](crate::SluiceMiddleware::priority)); a request's
    /// [`Override`] comes first.
    ///
    /// ```
    /// use sluice_reqwest::{Limit, Route};
    ///
    /// // Batch jobs leave what `openai#tpm` keeps for interactive products.
    /// let batches = Route::new("api.openai.com")
    ///     .path_prefix("/v1/batches")
    ///     .limit(Limit::parse("openai#tpm")?.cost(10_000))
    ///     .priority("batch".parse()?);
    /// assert_eq!(batches.priority_value().map(|p| p.as_str()), Some("batch"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn priority(mut self, priority: Priority) -> Route {
        self.priority = Some(priority);
        self
    }

    /// Requests for `model` (the JSON body's `model`) take capacity from `limits` instead of
    /// the route's own, which stay the fallback for every other model (and for bodies
    /// with no `model`). A pattern ending in `*` matches every model starting with what
    /// precedes it; an exact name wins over a pattern, and a longer pattern over a shorter.
    ///
    /// ```
    /// use sluice_reqwest::{Limit, Route, Signal, estimate};
    ///
    /// // OpenAI's limits are per model.
    /// let chat = Route::new("api.openai.com")
    ///     .limit(Limit::parse("openai#rpm")?.signal(Signal::Requests))
    ///     .model("gpt-4o-mini*", [
    ///         Limit::parse("openai#gpt-4o-mini-rpm")?.signal(Signal::Requests),
    ///         Limit::parse("openai#gpt-4o-mini-tpm")?.estimate(estimate::chat_tokens).signal(Signal::Tokens),
    ///     ])
    ///     .model("gpt-4o", [Limit::parse("openai#gpt-4o-rpm")?.signal(Signal::Requests)]);
    /// # let _ = chat;
    /// # Ok::<(), sluice::error::DimensionError>(())
    /// ```
    pub fn model(
        mut self,
        model: impl Into<String>,
        limits: impl IntoIterator<Item = Limit>,
    ) -> Route {
        let model = model.into();
        self.models.retain(|(m, _)| *m != model);
        self.models.push((model, limits.into_iter().collect()));
        self
    }

    /// Whether a response's reported usage corrects what its request was charged on the
    /// route's token dimensions (default: yes). See
    /// [`SluiceMiddleware`](crate::SluiceMiddleware) for what is read.
    pub fn correct_usage(mut self, on: bool) -> Route {
        self.usage = on;
        self
    }

    /// Whether responses on this route correct their token charges from reported usage.
    pub fn corrects_usage(&self) -> bool {
        self.usage
    }

    /// The limits a request on this route takes: its model's, else the route's.
    pub fn limits_for(&self, request: &Request) -> &[Limit] {
        if self.models.is_empty() {
            return &self.limits;
        }
        crate::estimate::model_of(request)
            .and_then(|model| crate::model::best(&self.models, &model))
            .map_or(&self.limits[..], Vec::as_slice)
    }

    /// The route's priority, if set.
    pub fn priority_value(&self) -> Option<&Priority> {
        self.priority.as_ref()
    }

    /// The host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The path prefix (empty: every path).
    pub fn prefix(&self) -> &str {
        &self.path_prefix
    }

    /// The route's limits.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    fn matches(&self, url: &Url) -> bool {
        url.host_str()
            .is_some_and(|h| h.eq_ignore_ascii_case(&self.host))
            && url.path().starts_with(&self.path_prefix)
    }
}

/// The routing table: vendor hosts (and path prefixes) to dimensions. Requests to hosts it
/// does not know pass through untouched.
///
/// [`Routes::vendors`] (also the [`Default`]) knows the well-known vendor APIs:
///
/// | host | dimension | vendor signal |
/// |---|---|---|
/// | `api.openai.com` | `openai#rpm` | requests |
/// | `api.anthropic.com` | `anthropic#rpm` | requests |
/// | `api.elevenlabs.io` | `elevenlabs#concurrent` | |
/// | `api.mistral.ai` | `mistral#rpm` | |
/// | `generativelanguage.googleapis.com` | `gemini#rpm` | |
/// | `api.cohere.com` | `cohere#rpm` | |
/// | `api.groq.com` | `groq#rpm` | |
/// | `api.deepgram.com` | `deepgram#concurrent` | |
///
/// ```
/// use sluice_reqwest::{Limit, Route, Routes, Signal, estimate};
///
/// // Also charge OpenAI's tokens-per-minute from each chat body, and add an in-house API.
/// let routes = Routes::vendors()
///     .route(
///         Route::new("api.openai.com")
///             .limit(Limit::parse("openai#rpm")?.signal(Signal::Requests))
///             .limit(Limit::parse("openai#tpm")?.estimate(estimate::chat_tokens).signal(Signal::Tokens)),
///     )
///     .route(Route::new("search.internal").limit(Limit::parse("search#concurrent")?))
///     .without("api.groq.com");
/// assert_eq!(routes.routes().len(), 8);
/// # Ok::<(), sluice::error::DimensionError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Routes {
    routes: Vec<Route>,
}

impl Routes {
    /// No routes: every request passes through.
    pub fn empty() -> Routes {
        Routes::default()
    }

    /// The well-known vendor APIs (see the table above).
    pub fn vendors() -> Routes {
        let vendor = |host: &str, dimension: &str, signal: Option<Signal>| {
            let mut limit = Limit::new(
                Dimension::new(dimension).expect("the built-in dimensions are well formed"),
            );
            limit.signal = signal;
            Route::new(host).limit(limit)
        };
        let requests = Some(Signal::Requests);
        [
            vendor("api.openai.com", "openai#rpm", requests),
            vendor("api.anthropic.com", "anthropic#rpm", requests),
            vendor("api.elevenlabs.io", "elevenlabs#concurrent", None),
            vendor("api.mistral.ai", "mistral#rpm", None),
            vendor("generativelanguage.googleapis.com", "gemini#rpm", None),
            vendor("api.cohere.com", "cohere#rpm", None),
            vendor("api.groq.com", "groq#rpm", None),
            vendor("api.deepgram.com", "deepgram#concurrent", None),
        ]
        .into_iter()
        .fold(Routes::empty(), Routes::route)
    }

    /// Adds `route`, replacing any route for the same host and path prefix.
    pub fn route(mut self, route: Route) -> Routes {
        self.routes
            .retain(|r| !(r.host == route.host && r.path_prefix == route.path_prefix));
        self.routes.push(route);
        self
    }

    /// Removes every route for `host`.
    pub fn without(mut self, host: &str) -> Routes {
        self.routes.retain(|r| !r.host.eq_ignore_ascii_case(host));
        self
    }

    /// The routes.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The route for `url`: its host's route with the longest matching path prefix.
    pub fn find(&self, url: &Url) -> Option<&Route> {
        self.routes
            .iter()
            .filter(|r| r.matches(url))
            .max_by_key(|r| r.path_prefix.len())
    }
}

/// A per-request override of the routing table, set as a request extension.
///
/// ```
/// use reqwest_middleware::ClientBuilder;
/// use sluice_reqwest::{Limit, Override, SluiceMiddleware};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = ClientBuilder::new(reqwest::Client::new())
///     .with(SluiceMiddleware::default())
///     .build();
/// // A health check that must not take quota:
/// client.get("https://api.openai.com/v1/models").with_extension(Override::Bypass).send().await?;
/// // A batch call charged to another dimension:
/// client
///     .post("https://api.openai.com/v1/batches")
///     .with_extension(Override::Limits(vec![Limit::parse("openai#batch")?.cost(10)]))
///     .send()
///     .await?;
/// // A user waiting on this one: the route's limits, at the highest priority.
/// client
///     .post("https://api.openai.com/v1/chat/completions")
///     .with_extension(Override::Priority("interactive".parse()?))
///     .send()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Override {
    /// Send this request without taking capacity.
    Bypass,
    /// Take capacity from these limits instead of the route's.
    Limits(Vec<Limit>),
    /// Take capacity from the route's limits at this priority (a request no route matches
    /// passes untouched, as it would without the override).
    Priority(Priority),
    /// Take capacity from these limits, at this priority.
    LimitsAt(Vec<Limit>, Priority),
}

#[cfg(test)]
mod tests;
