//! Building a client: from defaults, the environment or a [`Config`], with a store and a
//! clock.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::config::{Config, ConfigError, FailurePolicy, Prefetch};
use crate::dimension::Dimension;
use crate::error::Error;
use crate::shared::Core;
use crate::store::{MemoryStore, Store};

use super::Sluice;

/// Builds a [`Sluice`] client.
///
/// ```
/// use std::time::Duration;
/// use sluice::{clock::ManualClock, MemoryStore, Sluice, clock::UnixMillis};
///
/// let sluice = Sluice::builder()
///     .store(MemoryStore::new())
///     .clock(ManualClock::new(UnixMillis::from_secs(1_700_000_000)))
///     .lease_ttl(Duration::from_secs(30))
///     .max_retries(3)
///     .caller("audit-service")
///     .build()?;
/// # let _ = sluice;
/// # Ok::<(), sluice::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct SluiceBuilder {
    config: Config,
    store: Option<Arc<dyn Store>>,
    clock: Option<Arc<dyn Clock>>,
}

impl SluiceBuilder {
    /// A builder starting from the environment's configuration (see [`Config::from_env`]).
    pub fn from_env() -> Result<Self, ConfigError> {
        Ok(SluiceBuilder::from_config(Config::from_env()?))
    }

    /// A builder starting from `config`; the other methods change it from there.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Config, SluiceBuilder};
    ///
    /// let config = Config { max_retries: 2, ..Config::default() };
    /// let sluice = SluiceBuilder::from_config(config).store(sluice::MemoryStore::new()).lease_ttl(Duration::from_secs(5)).build()?;
    /// assert_eq!((sluice.config().max_retries, sluice.config().lease_ttl), (2, Duration::from_secs(5)));
    /// # Ok::<(), sluice::Error>(())
    /// ```
    pub fn from_config(config: Config) -> Self {
        SluiceBuilder {
            config,
            ..SluiceBuilder::default()
        }
    }

    /// The store to use (default: a new [`MemoryStore`]): a [`MemoryStore`], a
    /// `DynamoStore` (feature `dynamodb`), or, with the `unstable-store` feature, a store
    /// of one's own.
    pub fn store(self, store: impl Store) -> Self {
        self.store_arc(Arc::new(store))
    }

    storage_fn! {
        /// The store to use, already shared.
        fn store_arc(mut self, store: Arc<dyn Store>) -> Self {
            self.store = Some(store);
            self
        }
    }

    /// The clock to use (default: [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The default lease TTL (`SLUICE_LEASE_TTL_MS`).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.config.lease_ttl = ttl;
        self
    }

    /// Retries of a write lost to another writer, on the seed protocol.
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.config.max_retries = retries;
        self
    }

    /// The `caller` written on lease rows (`SLUICE_CALLER`).
    pub fn caller(mut self, caller: impl Into<String>) -> Self {
        self.config.caller = caller.into();
        self
    }

    /// The priority of this client's acquires that name none (`SLUICE_PRIORITY`, see
    /// [`Config::priority`]).
    ///
    /// ```
    /// let sluice = sluice::Sluice::builder().store(sluice::MemoryStore::new()).priority("batch".parse()?).build()?;
    /// assert_eq!(sluice.config().priority.as_ref().map(|p| p.as_str()), Some("batch"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn priority(mut self, priority: crate::Priority) -> Self {
        self.config.priority = Some(priority);
        self
    }

    /// Takes every acquire of this client in [shadow mode](crate::Mode::Shadow) (or, with
    /// [`Mode::Enforce`](crate::Mode::Enforce), only on buckets defined in shadow):
    /// `SLUICE_MODE`.
    ///
    /// ```
    /// use sluice::{Acquire, Bucket, Mode, RefillRate, Sluice};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let sluice = Sluice::builder().store(sluice::MemoryStore::new()).mode(Mode::Shadow).build()?;
    /// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(1)).with_capacity(1)).await?;
    /// // Never refused: the second is counted as one an enforcing client would have refused.
    /// let _first = sluice.acquire("openai#rpm").await?;
    /// let _second = sluice.acquire("openai#rpm").await?;
    /// assert_eq!(sluice.bucket("openai#rpm").await?.unwrap().shadow_refused(), 1);
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub fn mode(mut self, mode: crate::Mode) -> Self {
        self.config.mode = mode;
        self
    }

    /// How acquires talk to the store (see [`Protocol`](crate::config::Protocol)): the
    /// seed's protocol is a client for testing a store against the interoperability
    /// contract, not for production.
    ///
    /// ```
    /// use sluice::config::Protocol;
    ///
    /// let sluice = sluice::Sluice::builder().store(sluice::MemoryStore::new()).protocol(Protocol::Seed).build()?;
    /// assert_eq!(sluice.config().protocol, Protocol::Seed);
    /// # Ok::<(), sluice::Error>(())
    /// ```
    #[cfg(feature = "unstable-store")]
    #[cfg_attr(docsrs, doc(cfg(feature = "unstable-store")))]
    pub fn protocol(mut self, protocol: crate::config::Protocol) -> Self {
        self.config.protocol = protocol;
        self
    }

    /// How long a short `concurrent` bucket is remembered, and the longest a waiting caller
    /// sleeps on one before looking again (`SLUICE_SLOT_POLL_MS`, see
    /// [`Config::slot_poll`]).
    pub fn slot_poll(mut self, interval: Duration) -> Self {
        self.config.slot_poll = interval;
        self
    }

    /// Sets how old a bucket row's refill timestamp may get before a grant that counts the
    /// refill since folds it into the row (see [`Config::fold_after`]).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let sluice = sluice::Sluice::builder().store(sluice::MemoryStore::new()).fold_after(Duration::from_secs(10)).build()?;
    /// assert_eq!(sluice.config().fold_after, Duration::from_secs(10));
    /// # Ok::<(), sluice::Error>(())
    /// ```
    pub fn fold_after(mut self, interval: Duration) -> Self {
        self.config.fold_after = interval;
        self
    }

    /// Sets how long a `concurrent` bucket that does not match its lease rows must stay
    /// unchanged before the reconciler corrects it (see [`Config::heal_settle`]).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let sluice = sluice::Sluice::builder().store(sluice::MemoryStore::new()).heal_settle(Duration::from_secs(30)).build()?;
    /// assert_eq!(sluice.config().heal_settle, Duration::from_secs(30));
    /// # Ok::<(), sluice::Error>(())
    /// ```
    pub fn heal_settle(mut self, interval: Duration) -> Self {
        self.config.heal_settle = interval;
        self
    }

    /// The longest one store call may take, its retries included, and one attempt of it
    /// (`SLUICE_STORE_TIMEOUT_MS` sets the first; see
    /// [`Config::store_timeout`]). Applied to the DynamoDB client
    /// [`connect`](Self::connect) builds.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let sluice = sluice::Sluice::builder().store(sluice::MemoryStore::new())
    ///     .store_timeouts(Duration::from_millis(800), Duration::from_millis(300))
    ///     .build()?;
    /// assert_eq!(sluice.config().store_timeout, Duration::from_millis(800));
    /// # Ok::<(), sluice::Error>(())
    /// ```
    pub fn store_timeouts(mut self, call: Duration, attempt: Duration) -> Self {
        self.config.store_timeout = call;
        self.config.store_attempt_timeout = attempt;
        self
    }

    /// Sets the most two hosts' clocks may disagree (`SLUICE_CLOCK_SKEW_MS`, see
    /// [`Config::clock_skew`]): expired leases are given back only this long after their
    /// expiry.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::Sluice;
    ///
    /// let sluice = Sluice::builder().store(sluice::MemoryStore::new()).clock_skew(Duration::from_millis(250)).build()?;
    /// assert_eq!(sluice.config().clock_skew, Duration::from_millis(250));
    /// # Ok::<(), sluice::Error>(())
    /// ```
    pub fn clock_skew(mut self, skew: Duration) -> Self {
        self.config.clock_skew = skew;
        self
    }

    /// Prefetches tokens of the lean bucket `dimension` (see [`Prefetch`] for the
    /// overshoot bound this accepts).
    pub fn prefetch(mut self, dimension: Dimension, prefetch: Prefetch) -> Self {
        self.config.prefetch.insert(dimension, prefetch);
        self
    }

    /// What acquires do when the store cannot answer (see [`FailurePolicy`];
    /// `SLUICE_FAILURE_POLICY`).
    ///
    /// ```
    /// use sluice::{FailurePolicy, Sluice};
    ///
    /// let sluice = Sluice::builder().store(sluice::MemoryStore::new())
    ///     .failure_policy(FailurePolicy::Open { percent: 20 })
    ///     .failure_policy_for("openai#tpm".parse()?, FailurePolicy::Closed)
    ///     .build()?;
    /// assert_eq!(sluice.config().failure_policy_of(&"openai#rpm".parse()?), FailurePolicy::Open { percent: 20 });
    /// assert_eq!(sluice.config().failure_policy_of(&"openai#tpm".parse()?), FailurePolicy::Closed);
    /// # Ok::<(), sluice::Error>(())
    /// ```
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.config.failure_policy = policy;
        self
    }

    /// The failure policy of one dimension, over the client's.
    pub fn failure_policy_for(mut self, dimension: Dimension, policy: FailurePolicy) -> Self {
        self.config.failure_policies.insert(dimension, policy);
        self
    }

    /// The configuration as set so far.
    pub fn config_ref(&self) -> &Config {
        &self.config
    }

    /// Builds the client, connecting to DynamoDB when the configuration names a table and
    /// no store was given (credentials and region from the standard AWS chain). A global
    /// table (replicas in other Regions, by `DescribeTable`) is refused with
    /// [`ConfigError::GlobalTable`].
    pub async fn connect(self) -> Result<Sluice, Error> {
        #[cfg(feature = "dynamodb")]
        if self.store.is_none() && self.config.table_name.is_some() {
            let store = crate::store::DynamoStore::from_config(&self.config).await?;
            store.refuse_replicas().await?;
            return self.store(store).build();
        }
        self.build()
    }

    /// Builds the client without I/O.
    ///
    /// Without an explicit store, a configuration that chose the in-memory store
    /// ([`Config::in_memory`]) gets a new [`MemoryStore`]; one that names a table asks for
    /// [`connect`](Self::connect) instead; one that chose neither is refused with
    /// [`ConfigError::NoStore`].
    ///
    /// ```
    /// use sluice::{error::ConfigError, Error, Sluice};
    ///
    /// assert!(matches!(Sluice::builder().build(), Err(Error::Config(ConfigError::NoStore))));
    /// ```
    pub fn build(self) -> Result<Sluice, Error> {
        self.config.validate()?;
        let store = match (self.store, &self.config.table_name) {
            (Some(store), _) => store,
            (None, Some(table)) if cfg!(feature = "dynamodb") => {
                return Err(ConfigError::NeedsConnect(table.clone()).into());
            }
            (None, Some(table)) => return Err(ConfigError::NoDynamoDb(table.clone()).into()),
            (None, None) if self.config.in_memory => Arc::new(MemoryStore::new()),
            (None, None) => return Err(ConfigError::NoStore.into()),
        };
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        Ok(Sluice::from_core(Core::new(store, clock, self.config)))
    }
}
