//! The [`Sluice`] façade: acquiring, waiting, slots and administration, each handed to
//! the protocol the client was built with ([`protocol`](crate::protocol)).

mod admin;
mod builder;
mod global;
mod schedules;
mod wait;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use builder::SluiceBuilder;

use crate::acquire::{Acquire, Wanted};
use crate::clock::UnixMillis;
use crate::config::Config;
use crate::error::Error;
use crate::lease::Lease;
use crate::priority::Priority;
use crate::protocol;
use crate::protocol::peek::Peek;
use crate::shared::Core;
use crate::store::{MemoryStore, Store};

/// A client of the shared buckets: hands out leases or an exact [`Error::RetryIn`].
///
/// Cloning is cheap and clones share everything (store, clock, configuration), so one
/// quota is never split between clones.
///
/// ```
/// use std::time::Duration;
/// use sluice::{Bucket, RefillRate, Sluice};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let sluice = Sluice::in_memory();
/// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(500))).await?;
///
/// // Acquire and release by hand...
/// let lease = sluice.acquire("openai#rpm").await?;
/// lease.release().await?;
///
/// // ...or let a slot do it, whatever happens in the body.
/// let answer = sluice
///     .slot("openai#rpm", Duration::from_secs(30), async { "vendor response" })
///     .await?;
/// assert_eq!(answer, "vendor response");
/// # Ok::<(), sluice::Error>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct Sluice {
    core: Arc<Core>,
    /// Grants kept for waiting callers' next ask (see [`wait`]).
    parked: Arc<wait::Parked>,
}

impl fmt::Debug for Sluice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

impl Sluice {
    fn from_core(core: Core) -> Sluice {
        Sluice {
            core: Arc::new(core),
            parked: Arc::default(),
        }
    }

    /// The state this client shares with its clones and leases.
    #[cfg(test)]
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// A builder with default settings (not read from the environment).
    pub fn builder() -> SluiceBuilder {
        SluiceBuilder::default()
    }

    /// A client on a new, empty in-memory store with default settings.
    pub fn in_memory() -> Sluice {
        Sluice::builder()
            .store(MemoryStore::new())
            .build()
            .unwrap_or_else(|_| unreachable!("a memory store with the default TTL always builds"))
    }

    /// A client configured from the environment (`SLUICE_*`, see [`Config`]): the DynamoDB
    /// store of `SLUICE_TABLE_NAME`, or a new in-memory store when `SLUICE_STORE=memory`
    /// chose it. With neither, [`ConfigError::NoStore`](crate::ConfigError::NoStore): a
    /// forgotten variable fails here, not by each process limiting itself alone.
    pub async fn from_env() -> Result<Sluice, Error> {
        SluiceBuilder::from_env()?.connect().await
    }

    /// Finishes this client's background work within `deadline`: writes now the lease rows
    /// still waiting for their delay (a lease's row waits until it has been held a second),
    /// and waits until they
    /// and every release nobody waits for (a lease dropped, a release that failed and is
    /// retried) are settled. [`Error::Timeout`] when they are not by then (the store down,
    /// say): what is left goes on in the background, or expires and is reconciled.
    ///
    /// Call it before a Lambda handler returns (and at a graceful shutdown): a process
    /// frozen between invocations runs no background work, so its lease rows and retried
    /// releases would wait for the next invocation, or for the reconciler.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Bucket, RefillRate, Sluice};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let sluice = Sluice::in_memory();
    /// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(500))).await?;
    /// let lease = sluice.acquire("openai#rpm").await?;
    /// drop(lease); // released in the background
    /// sluice.flush(Duration::from_secs(1)).await?;
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub async fn flush(&self, deadline: Duration) -> Result<(), Error> {
        self.core.background.flush(deadline).await
    }

    /// The client's configuration.
    pub fn config(&self) -> &Config {
        &self.core.config
    }

    storage_fn! {
        /// The client's store.
        fn store(&self) -> &Arc<dyn Store> {
            &self.core.store
        }
    }

    /// The current time by the client's clock.
    pub fn now(&self) -> UnixMillis {
        self.core.now()
    }

    /// Takes tokens from one or several dimensions, all or nothing, and returns the lease
    /// that holds them; or [`Error::RetryIn`] with the exact wait when a bucket is short
    /// (for several short buckets, the longest wait).
    ///
    /// Accepts a dimension (`"openai#rpm"`, taking its `cost_per_call`) or an [`Acquire`].
    /// What the RetryIn promises, with other processes sharing the bucket, is written in
    /// [`Error::RetryIn`]. An acquire dropped by its caller is never granted, or its grant
    /// is given back at once.
    pub async fn acquire(&self, request: impl Into<Acquire>) -> Result<Lease, Error> {
        self.acquire_after(&request.into(), None, Duration::ZERO)
            .await
    }

    /// Whether `request` is let through now, for code that only wants yes or no (a door
    /// answering `429`): `true` when it is granted (its tokens are taken and its lease
    /// ended at once), `false` when a bucket is short. The RetryIn's wait is dropped:
    /// [`acquire`](Self::acquire) keeps it, for a `Retry-After`. Any other error is
    /// returned.
    ///
    /// ```
    /// use sluice::{Bucket, RefillRate, Sluice, clock::{ManualClock, UnixMillis}};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    /// let sluice = Sluice::builder().store(sluice::MemoryStore::new()).clock(clock).build()?;
    /// // Two requests a second per tenant, each tenant's bucket created by its first call.
    /// let per_tenant = Bucket::requests(RefillRate::per_second(2)).with_capacity(2);
    /// sluice.put_bucket("ingest#rpm", per_tenant.keyed()).await?;
    /// assert!(sluice.allow("ingest#rpm#@tenant-42").await?);
    /// assert!(sluice.allow("ingest#rpm#@tenant-42").await?);
    /// assert!(!sluice.allow("ingest#rpm#@tenant-42").await?);
    /// assert!(sluice.allow("ingest#rpm#@tenant-7").await?, "every tenant has its own");
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub async fn allow(&self, request: impl Into<Acquire>) -> Result<bool, Error> {
        match self.acquire(request).await {
            // Dropped: released in the background (a `requests` or `tokens` lease released
            // this soon costs no call).
            Ok(lease) => {
                drop(lease);
                Ok(true)
            }
            Err(Error::RetryIn(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether `request` would be granted now, or its exact RetryIn, without taking
    /// anything: no write, and at most one read (of every row the request names, in one
    /// call).
    ///
    /// The freshness rules (in `shared/remembered.rs`) hold as for an acquire: a
    /// "granted" is never answered from memory (another process may have taken the
    /// tokens since), so it comes from a read; a refusal comes from memory, with no call,
    /// inside a denial window the store confirmed. A cost the bucket can never grant at
    /// the request's priority is the same error an acquire gets. Tokens this client
    /// prefetched count as an acquire would take them. Another client may take what was
    /// seen before this client acquires: the answer says what the bucket held when read.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Acquire, Bucket, clock::ManualClock, admin::Peek, RefillRate, Sluice, clock::UnixMillis};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    /// let sluice = Sluice::builder().store(sluice::MemoryStore::new()).clock(clock).build()?;
    /// let bucket = Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000);
    /// sluice.put_bucket("openai#tpm", bucket).await?;
    ///
    /// assert_eq!(sluice.peek(Acquire::with_cost("openai#tpm", 1_000)).await?, Peek::Granted);
    /// let _lease = sluice.acquire(Acquire::with_cost("openai#tpm", 900)).await?;
    /// // 200 more need 100 more tokens: one second of refill. Nothing was taken by peeking.
    /// assert_eq!(
    ///     sluice.peek(Acquire::with_cost("openai#tpm", 200)).await?,
    ///     Peek::RetryIn(Duration::from_secs(1))
    /// );
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub async fn peek(&self, request: impl Into<Acquire>) -> Result<Peek, Error> {
        let wanted = self.prioritized(&request.into())?;
        let label = DisplayDims(&wanted).to_string();
        let answer = protocol::peek::peek(&self.core, &wanted).await;
        crate::metrics::peeked(&self.core.lanes.labels, label, &answer);
        answer
    }

    /// `request` at its own priority, else this client's (see [`Config::priority`]), in
    /// shadow mode if this client is.
    fn prioritized(&self, request: &Acquire) -> Result<Vec<Wanted>, Error> {
        let mut wanted = request.resolve()?;
        if request.priority_value().is_none() {
            for w in &mut wanted {
                w.priority.clone_from(&self.core.config.priority);
            }
        }
        if self.core.config.mode == crate::Mode::Shadow {
            wanted.iter_mut().for_each(|w| w.shadow = true);
        }
        Ok(wanted)
    }

    /// An acquire that, with `fresh_after`, takes a denial only from a row learned since
    /// then (a waiting caller's retry: its wait began at that time), and that waits its
    /// turn for up to `queue` on the fast path (see [`Wanted::queue`]).
    pub(crate) async fn acquire_after(
        &self,
        request: &Acquire,
        fresh_after: Option<UnixMillis>,
        queue: Duration,
    ) -> Result<Lease, Error> {
        let wanted = self.prioritized(request)?;
        let priority = wanted.first().and_then(|w| w.priority.clone());
        let span = tracing::debug_span!(
            "sluice.acquire",
            dimensions = %DisplayDims(&wanted),
            priority = priority.as_ref().map_or("", Priority::as_str),
            outcome = tracing::field::Empty,
            attempts = tracing::field::Empty,
            retry_in_ms = tracing::field::Empty,
        );
        let started = std::time::Instant::now();
        let label = DisplayDims(&wanted).to_string();
        let ttl = request.ttl_value().unwrap_or(self.core.config.lease_ttl);
        let wanted = wanted.into_iter().map(|w| Wanted { queue, ..w }).collect();
        let result = self.take(request, wanted, ttl, fresh_after, &span).await;
        let result = result.map(|grant| Lease::new(self.core.clone(), grant));
        crate::metrics::acquired(
            &self.core.lanes.labels,
            label,
            priority.as_ref(),
            &result,
            started.elapsed(),
        );
        match &result {
            Ok(lease) => {
                span.record("outcome", "granted");
                span.record("attempts", lease.attempts());
            }
            Err(Error::RetryIn(d)) => {
                span.record("outcome", "retry_in");
                span.record("retry_in_ms", d.delay.as_millis() as u64);
            }
            Err(e) => {
                span.record("outcome", "error");
                tracing::debug!(parent: &span, error = %e, "acquire failed");
            }
        }
        result
    }

    /// An acquire of `wanted` (resolved from `request`), in whichever mode its buckets and
    /// this client are: a shadow acquire whose write could not be made (no answer, pushed
    /// back, every race lost) is granted all the same (see [`protocol::shadow`]).
    async fn take(
        &self,
        request: &Acquire,
        wanted: Vec<Wanted>,
        ttl: Duration,
        fresh_after: Option<UnixMillis>,
        span: &tracing::Span,
    ) -> Result<crate::grant::Grant, Error> {
        let result = if self.core.config.may_fail_open() {
            Box::pin(protocol::open::acquire(
                &self.core,
                wanted,
                ttl,
                fresh_after,
                span,
            ))
            .await
        } else {
            let path = protocol::Path::of(&self.core, wanted);
            protocol::acquire(&self.core, path, ttl, fresh_after, span).await
        };
        match result {
            Err(ref e) if protocol::shadow::may_answer(e) => {
                let wanted = self.prioritized(request)?;
                protocol::shadow::answer(&self.core, &wanted, ttl, result)
            }
            answer => answer,
        }
    }

    /// Runs `body` while holding capacity on `request`: acquires, runs, releases.
    ///
    /// `timeout` is both the lease's TTL and the body's deadline: a body still running then
    /// is dropped and the slot returns [`Error::Timeout`]. (A slot held for as long as its
    /// body runs, with no deadline: [`slot_within`](Self::slot_within) with `None`.) The
    /// lease is released on every path: when the body finishes, when it times out, when it
    /// panics (the panic then continues), and when the slot's future is dropped (released
    /// in the background).
    pub async fn slot<F>(
        &self,
        request: impl Into<Acquire>,
        timeout: Duration,
        body: F,
    ) -> Result<F::Output, Error>
    where
        F: Future,
    {
        self.slot_within(request, Some(timeout), Duration::ZERO, || body)
            .await
    }

    /// The one entry point for "acquire, run, release", which [`slot`](Self::slot), the
    /// `try_slot` forms, `#[rate_limited]` and the tower layer use (the reqwest middleware
    /// holds its lease past the call, with `acquire_within`): acquires `request`,
    /// waiting up to `max_wait` for capacity (see [`acquire_within`](Self::acquire_within)),
    /// then makes the body with `body` (only once granted: nothing of it starts on a
    /// refusal), runs it under the lease, and releases it on every path (see
    /// [`slot`](Self::slot)).
    ///
    /// `timeout`: the caller's own deadline for the body, which is also the lease's TTL.
    /// `None`: no deadline, and the TTL the request names (else the configured
    /// [`lease_ttl`](Config::lease_ttl)); a lease holding `concurrent` slots is then renewed
    /// while the body runs (see [`Lease::lost`]), so the TTL only bounds how long a slot
    /// stays taken after its holder dies or freezes, never how long a call may take.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Bucket, Sluice};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let sluice = Sluice::in_memory();
    /// sluice.put_bucket("elevenlabs#concurrent", Bucket::concurrent(1)).await?;
    /// let out = sluice
    ///     .slot_within("elevenlabs#concurrent", None, Duration::from_secs(1), || async { 7 })
    ///     .await?;
    /// assert_eq!(out, 7);
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub async fn slot_within<F>(
        &self,
        request: impl Into<Acquire>,
        timeout: Option<Duration>,
        max_wait: Duration,
        body: impl FnOnce() -> F,
    ) -> Result<F::Output, Error>
    where
        F: Future,
    {
        let request = request.into();
        let request = match timeout {
            Some(timeout) => request.ttl(timeout),
            None => request,
        };
        let lease = self.acquire_within(request, max_wait).await?;
        lease.run_until(timeout, body()).await
    }

    /// Like [`try_slot`](Self::try_slot), waiting up to `max_wait` for capacity first (see
    /// [`acquire_within`](Self::acquire_within)).
    pub async fn try_slot_within<F, T, E>(
        &self,
        request: impl Into<Acquire>,
        timeout: Duration,
        max_wait: Duration,
        body: F,
    ) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        self.slot_within(request, Some(timeout), max_wait, || body)
            .await?
    }

    /// Like [`slot`](Self::slot) for a body that returns `Result<T, E>`: sluice's own
    /// errors (RetryIn, timeout, …) are converted into `E`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Bucket, Sluice};
    ///
    /// #[derive(Debug)]
    /// enum AppError { Sluice(sluice::Error), Vendor(String) }
    /// impl From<sluice::Error> for AppError {
    ///     fn from(e: sluice::Error) -> Self { AppError::Sluice(e) }
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let sluice = Sluice::in_memory();
    /// sluice.put_bucket("elevenlabs#concurrent", Bucket::concurrent(2)).await.unwrap();
    /// let out: Result<u32, AppError> = sluice
    ///     .try_slot("elevenlabs#concurrent", Duration::from_secs(30), async { Ok(42) })
    ///     .await;
    /// assert_eq!(out.unwrap(), 42);
    /// # });
    /// ```
    pub async fn try_slot<F, T, E>(
        &self,
        request: impl Into<Acquire>,
        timeout: Duration,
        body: F,
    ) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        self.try_slot_within(request, timeout, Duration::ZERO, body)
            .await
    }
}

struct DisplayDims<'a>(&'a [Wanted]);

impl fmt::Display for DisplayDims<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, w) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(w.dimension.as_str())?;
        }
        Ok(())
    }
}

const _: () = {
    const fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<Sluice>();
    is_send_sync::<Lease>();
};
