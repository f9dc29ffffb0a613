//! The `Sluice` client: the acquisition protocol over any [`Store`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng as _;
use tracing::Instrument as _;

use crate::acquire::{Acquire, Wanted};
use crate::bucket::{Bucket, BucketState, LimitType, Take, first_version, new_write_id};
use crate::clock::{Clock, SystemClock, UnixMillis};
use crate::config::{Config, ConfigError, Prefetch, Protocol};
use crate::detach::Detached;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::fast::Lanes;
use crate::lease::{Kept, Lease, LeaseId, LeasePart};
use crate::remembered::MIN_RETRY_IN;
use crate::snapshot::Snapshot;
use crate::store::{
    BucketWrite, Commit, CommitError, ConditionFailure, HeldWrite, LeaseFilter, LeaseKey,
    LeaseRecord, LeaseWrite, MemoryStore, Store, StoreError,
};
use crate::tokens::Tokens;

/// Backoff after a lost race: exponential from 25 ms, capped at 200 ms, with jitter.
const BACKOFF_BASE: Duration = Duration::from_millis(25);
const BACKOFF_MAX: Duration = Duration::from_millis(200);

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
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: Config,
    /// What this client knows of each dimension's row (the fast path).
    lanes: Lanes,
}

impl fmt::Debug for Sluice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sluice")
            .field("store", &self.inner.store)
            .field("clock", &self.inner.clock)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// Builds a [`Sluice`] client.
///
/// ```
/// use std::time::Duration;
/// use sluice::{ManualClock, MemoryStore, Sluice, UnixMillis};
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
        Ok(SluiceBuilder {
            config: Config::from_env()?,
            ..SluiceBuilder::default()
        })
    }

    /// Replaces the whole configuration, including what this builder's other methods
    /// ([`lease_ttl`](Self::lease_ttl), [`prefetch`](Self::prefetch), …) set before: call it
    /// first.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// The store to use (default: a new [`MemoryStore`]).
    pub fn store(self, store: impl Store) -> Self {
        self.store_arc(Arc::new(store))
    }

    /// The store to use, already shared.
    pub fn store_arc(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// The clock to use (default: [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The default lease TTL (`SLUICE_LEASE_TTL`).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.config.lease_ttl = ttl;
        self
    }

    /// Retries of a write lost to another writer (`SLUICE_MAX_RETRIES`).
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.config.max_retries = retries;
        self
    }

    /// The `caller` written on lease rows (`SLUICE_CALLER`).
    pub fn caller(mut self, caller: impl Into<String>) -> Self {
        self.config.caller = caller.into();
        self
    }

    /// How long a short `concurrent` bucket is remembered, and the longest a waiting caller
    /// sleeps on one before looking again (`SLUICE_SLOT_POLL_MS`, see
    /// [`Config::slot_poll`]).
    pub fn slot_poll(mut self, interval: Duration) -> Self {
        self.config.slot_poll = interval;
        self
    }

    /// Sets the most live leases a bucket row keeps itself on the fast path (see
    /// [`Config::leases_per_row`]; `0`: every lease in a row of its own).
    ///
    /// ```
    /// let sluice = sluice::Sluice::builder().leases_per_row(0).build()?;
    /// assert_eq!(sluice.config().leases_per_row, 0);
    /// # Ok::<(), sluice::Error>(())
    /// ```
    pub fn leases_per_row(mut self, leases: usize) -> Self {
        self.config.leases_per_row = leases;
        self
    }

    /// Prefetches tokens of the lean bucket `dimension` (see [`Prefetch`] for the
    /// overshoot bound this accepts).
    pub fn prefetch(mut self, dimension: Dimension, prefetch: Prefetch) -> Self {
        self.config.prefetch.insert(dimension, prefetch);
        self
    }

    /// The configuration as set so far.
    pub fn config_ref(&self) -> &Config {
        &self.config
    }

    /// Builds the client, connecting to DynamoDB when the configuration names a table and
    /// no store was given (credentials and region from the standard AWS chain).
    pub async fn connect(self) -> Result<Sluice, Error> {
        #[cfg(feature = "dynamodb")]
        if self.store.is_none() && self.config.table_name.is_some() {
            let store = crate::store::DynamoStore::from_config(&self.config).await?;
            return self.store(store).build();
        }
        self.build()
    }

    /// Builds the client without I/O.
    ///
    /// Without an explicit store, a new [`MemoryStore`] is used; a table name in the
    /// configuration then asks for [`connect`](Self::connect) instead.
    pub fn build(self) -> Result<Sluice, Error> {
        if self.config.lease_ttl < Duration::from_millis(1) {
            return Err(ConfigError::Invalid {
                variable: "SLUICE_LEASE_TTL",
                value: format!("{:?}", self.config.lease_ttl),
                reason: "the lease TTL must be at least one millisecond",
            }
            .into());
        }
        if self.config.leases_per_row > crate::config::MAX_LEASES_PER_ROW {
            return Err(ConfigError::Invalid {
                variable: "SLUICE_LEASES_PER_ROW",
                value: self.config.leases_per_row.to_string(),
                reason: "at most 1000 leases per bucket row",
            }
            .into());
        }
        if self.config.slot_poll < Duration::from_millis(1) {
            return Err(ConfigError::Invalid {
                variable: "SLUICE_SLOT_POLL_MS",
                value: format!("{:?}", self.config.slot_poll),
                reason: "the slot poll interval must be at least one millisecond",
            }
            .into());
        }
        for (dimension, p) in &self.config.prefetch {
            if p.tokens() <= Tokens::ZERO
                || p.tokens() > Tokens::MAX
                || p.hold() < Duration::from_millis(1)
            {
                return Err(ConfigError::Invalid {
                    variable: "prefetch",
                    value: format!("{dimension}: {} tokens, hold {:?}", p.tokens(), p.hold()),
                    reason: "prefetch needs a positive number of tokens and a hold of at least one millisecond",
                }
                .into());
            }
        }
        let store = match (self.store, &self.config.table_name) {
            (Some(store), _) => store,
            (None, Some(table)) if cfg!(feature = "dynamodb") => {
                return Err(ConfigError::NeedsConnect(table.clone()).into());
            }
            (None, Some(table)) => return Err(ConfigError::NoDynamoDb(table.clone()).into()),
            (None, None) => Arc::new(MemoryStore::new()),
        };
        Ok(Sluice {
            inner: Arc::new(Inner {
                store,
                clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
                config: self.config,
                lanes: Lanes::default(),
            }),
        })
    }
}

/// What a short `concurrent` bucket's leases say.
pub(crate) enum SlotOutlook {
    /// Expired leases were given back (by this call or, meanwhile, another client): the
    /// bucket changed, look again.
    LookAgain,
    /// A slot comes back for sure when the earliest live lease expires (`None`: no live
    /// lease showed).
    BackBy(Option<UnixMillis>),
}

/// Slot leases read per page when a short `concurrent` bucket looks for expired ones.
const SLOT_PAGE: usize = 100;
/// Pages read at most per look: a bucket with more expired leases than this gives the
/// rest back at its next shortage (or the reconciler does).
const SLOT_PAGES: usize = 10;
/// How many times one acquire looks again at a short `concurrent` bucket because another
/// client gave back the expired leases it found (the bucket changed under it); after that
/// it answers from the leases it sees. A lagging index may show deleted leases for a moment.
const MAX_LOOKS_AGAIN: u32 = 3;
/// DynamoDB takes at most 100 items per transaction (and 4 MB; lease deletes and bucket
/// updates are far below 40 KB each).
const MAX_TRANSACTION_ITEMS: usize = 100;

impl Sluice {
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
    /// store when `SLUICE_TABLE_NAME` is set, else a new in-memory store.
    pub async fn from_env() -> Result<Sluice, Error> {
        SluiceBuilder::from_env()?.connect().await
    }

    /// The client's configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The client's store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The fast path's lanes, with what this client remembers of each dimension's row.
    pub(crate) fn lanes(&self) -> &Lanes {
        &self.inner.lanes
    }

    /// The current time by the client's clock.
    pub fn now(&self) -> UnixMillis {
        self.inner.clock.now()
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
        self.acquire_after(request.into(), None).await
    }

    /// An acquire that, with `fresh_after`, takes a denial only from a row learned since
    /// then (a waiting caller's retry: its wait began at that time).
    pub(crate) async fn acquire_after(
        &self,
        request: Acquire,
        fresh_after: Option<UnixMillis>,
    ) -> Result<Lease, Error> {
        let wanted = request.resolve()?;
        let ttl = request.ttl_value().unwrap_or(self.inner.config.lease_ttl);
        let span = tracing::debug_span!(
            "sluice.acquire",
            dimensions = %DisplayDims(&wanted),
            outcome = tracing::field::Empty,
            attempts = tracing::field::Empty,
            retry_in_ms = tracing::field::Empty,
        );
        let started = std::time::Instant::now();
        let label = DisplayDims(&wanted).to_string();
        let fast = self.inner.config.protocol == Protocol::Fast;
        let result = match <[Wanted; 1]>::try_from(wanted) {
            Ok([one]) if fast => {
                self.acquire_fast(one, ttl, fresh_after, true)
                    .instrument(span.clone())
                    .await
            }
            Ok(one) => {
                self.acquire_resolved(&one, ttl)
                    .instrument(span.clone())
                    .await
            }
            Err(many) if fast => {
                self.acquire_many_fast(many, ttl, fresh_after)
                    .instrument(span.clone())
                    .await
            }
            Err(many) => {
                self.acquire_resolved(&many, ttl)
                    .instrument(span.clone())
                    .await
            }
        };
        crate::metrics::acquired(label, &result, started.elapsed());
        match &result {
            Ok(lease) => {
                span.record("outcome", "granted");
                span.record("attempts", lease.attempts);
            }
            Err(Error::RetryIn(d)) => {
                span.record("outcome", "retry_in");
                span.record("retry_in_ms", d.as_millis() as u64);
            }
            Err(e) => {
                span.record("outcome", "error");
                tracing::debug!(parent: &span, error = %e, "acquire failed");
            }
        }
        result
    }

    /// An acquire on the seed's protocol: every attempt reads the rows, then writes every
    /// bucket it names and the lease rows in one atomic write. A refusal comes from the rows
    /// just read (or handed back by a failed condition), never from memory, so a waiting
    /// caller's rows are always fresh.
    async fn acquire_resolved(&self, wanted: &[Wanted], ttl: Duration) -> Result<Lease, Error> {
        let dimensions: Vec<Dimension> = wanted.iter().map(|w| w.dimension.clone()).collect();
        let mut unique = new_unique();
        let max_retries = self.inner.config.max_retries;
        let give_up_after = max_retries;
        let mut attempt: u32 = 0;
        let mut conflicts: u32 = 0;
        let mut looked_again: u32 = 0;
        let mut contended = None;
        // The rows in hand, each confirmed by the store during this acquire.
        let mut rows = self.read_rows(&dimensions).await?;
        loop {
            attempt += 1;
            let now = self.now();
            let expires_at = now.saturating_add(ttl);
            let mut writes = Vec::with_capacity(rows.len());
            let mut leases = Vec::with_capacity(rows.len());
            let mut parts = Vec::with_capacity(rows.len());
            let mut refused = Vec::new();
            for (i, (w, row)) in wanted.iter().zip(&rows).enumerate() {
                let cost = w.cost(row.bucket.cost_per_call());
                let Take::Granted {
                    tokens,
                    last_refill_at,
                } = row.take(cost, now)
                else {
                    refused.push(i);
                    continue;
                };
                let key = LeaseKey::new(&row.dimension, &unique);
                writes.push(BucketWrite::new(row.clone(), tokens, last_refill_at));
                let restores = row.bucket.limit_type().restores_on_release();
                let has_row = row.bucket.keeps_leases();
                if has_row {
                    leases.push(LeaseWrite::Create(LeaseRecord {
                        slot: restores,
                        key: key.clone(),
                        dimension: row.dimension.clone(),
                        cost,
                        created_at: now,
                        expires_at,
                        caller: self.inner.config.caller.clone(),
                        in_bucket: false,
                    }));
                }
                parts.push(LeasePart {
                    key,
                    dimension: row.dimension.clone(),
                    cost,
                    restores,
                    kept: if has_row { Kept::Row } else { Kept::Nowhere },
                });
            }
            if !refused.is_empty() {
                match self
                    .refusal(wanted, &rows, &refused, now, looked_again)
                    .await?
                {
                    Some(refusal) => return Err(refusal),
                    None => {
                        // Expired leases were given back: read the rows again.
                        looked_again += 1;
                        rows = self.read_rows(&dimensions).await?;
                        continue;
                    }
                }
            }
            if attempt > give_up_after + 1 {
                let dimension = contended.unwrap_or_else(|| dimensions[0].clone());
                tracing::warn!(%dimension, attempts = attempt - 1, "giving up after repeated contention");
                return Err(Error::Contention {
                    dimension,
                    attempts: attempt - 1,
                });
            }
            let written: Vec<BucketState> = writes.iter().map(BucketWrite::after).collect();
            let commit = Commit {
                buckets: writes,
                leases,
            };
            let backoff = match self.commit_grant(commit, &parts).await {
                Ok(()) => {
                    for row in written {
                        self.inner.lanes.learn_written(row, now);
                    }
                    let keys = parts.iter().map(|p| p.key.clone()).collect();
                    return Ok(Lease {
                        client: self.clone(),
                        id: LeaseId::new(keys),
                        parts,
                        created_at: now,
                        expires_at,
                        attempts: attempt,
                    });
                }
                Err(CommitError::Condition(ConditionFailure::BucketChanged {
                    dimension,
                    current,
                })) => {
                    tracing::debug!(%dimension, attempt, "lost the race: the bucket changed since it was read");
                    crate::metrics::contention_retry(dimension.as_str());
                    let i = dimensions.iter().position(|d| *d == dimension);
                    let handed_back = match (i, current) {
                        (Some(i), Some(current)) => {
                            self.inner.lanes.learn((*current).clone(), now);
                            rows[i] = *current;
                            true
                        }
                        _ => false,
                    };
                    contended = Some(dimension);
                    // When the row handed back is already short for a
                    // single dimension, that is the exact answer, with no backoff and no
                    // second read; otherwise back off and read again.
                    if let ([w], [row], true) = (wanted, rows.as_slice(), handed_back)
                        && !matches!(
                            row.take(w.cost(row.bucket.cost_per_call()), self.now()),
                            Take::Granted { .. }
                        )
                    {
                        continue;
                    }
                    true
                }
                Err(CommitError::Condition(ConditionFailure::LeaseExists(key))) => {
                    tracing::debug!(%key, "lease key already taken; drawing a new one");
                    unique = new_unique();
                    continue;
                }
                Err(CommitError::Condition(ConditionFailure::LeaseMissing(key))) => {
                    // Creating leases never requires one to exist: a store reporting this is
                    // broken.
                    return Err(StoreError::missing_lease(&key).into());
                }
                Err(CommitError::TransactionConflict) => {
                    tracing::debug!(attempt, "transaction conflict");
                    conflicts += 1;
                    if conflicts > max_retries {
                        return Err(Error::Contention {
                            dimension: dimensions[0].clone(),
                            attempts: attempt,
                        });
                    }
                    crate::metrics::contention_retry(dimensions[0].as_str());
                    contended = Some(dimensions[0].clone());
                    true
                }
                Err(CommitError::Store(e)) => {
                    for d in &dimensions {
                        self.inner.lanes.forget(d);
                    }
                    return Err(e.into());
                }
            };
            if backoff && attempt <= max_retries {
                tokio::time::sleep(backoff_delay(attempt)).await;
            }
            // The next attempt reads the rows first.
            rows = self.read_rows(&dimensions).await?;
        }
    }

    /// The refusal of a seed-protocol acquire, from rows the store just confirmed: the
    /// capacity error, or the longest wait. `None`: expired leases of a short `concurrent`
    /// bucket were given back, and the acquire should look again.
    async fn refusal(
        &self,
        wanted: &[Wanted],
        rows: &[BucketState],
        refused: &[usize],
        now: UnixMillis,
        looked_again: u32,
    ) -> Result<Option<Error>, Error> {
        for &i in refused {
            let (row, cost) = (&rows[i], wanted[i].cost(rows[i].bucket.cost_per_call()));
            if let Take::ExceedsCapacity = row.take(cost, now) {
                return Ok(Some(Error::CostExceedsCapacity {
                    dimension: row.dimension.clone(),
                    cost,
                    capacity: row.bucket.capacity(),
                }));
            }
        }
        let mut retry_in = MIN_RETRY_IN;
        for &i in refused {
            let row = &rows[i];
            let lane = self.inner.lanes.lane(&row.dimension);
            let wait = match row.take(wanted[i].cost(row.bucket.cost_per_call()), now) {
                Take::Short { wait: Some(wait) } => {
                    let wait = wait.max(MIN_RETRY_IN);
                    lane.memory().confirm_short(now, wait);
                    wait
                }
                Take::Short { wait: None } => {
                    let known = lane.memory().slots_back(now, self.inner.config.slot_poll);
                    let back = match known {
                        Some(back) => back,
                        None => match self.slot_outlook(row, now, looked_again).await? {
                            SlotOutlook::LookAgain => return Ok(None),
                            SlotOutlook::BackBy(back) => back,
                        },
                    };
                    lane.memory()
                        .confirm_slots_short(now, back, self.inner.config.slot_poll)
                }
                _ => MIN_RETRY_IN,
            };
            retry_in = retry_in.max(wait);
        }
        // The caller may be back when the answer runs out, asking every dimension again.
        for row in rows {
            self.inner
                .lanes
                .lane(&row.dimension)
                .memory()
                .answered(now.saturating_add(retry_in));
        }
        Ok(Some(Error::RetryIn(retry_in)))
    }

    /// Commits a grant so that it is never lost to a caller that went away: should the
    /// caller drop the future while the commit is in flight, the commit finishes on its own
    /// and, if it granted, gives the grant back at once.
    async fn commit_grant(&self, commit: Commit, parts: &[LeasePart]) -> Result<(), CommitError> {
        let (sent, outcome) = tokio::sync::oneshot::channel();
        let client = self.clone();
        let parts = parts.to_vec();
        Detached::new(async move {
            let result = client.inner.store.commit(commit).await;
            if let Err(Ok(())) = sent.send(result) {
                tracing::debug!("the caller went away while its grant was written; giving it back");
                if let Err(error) = client.give_back(parts).await {
                    tracing::warn!(%error, "giving back an abandoned grant failed; its leases expire and are reconciled");
                }
            }
        })
        .await;
        outcome
            .await
            .unwrap_or_else(|_| Err(StoreError::service("the commit was abandoned").into()))
    }

    /// Gives a grant nobody will use back to its buckets, whatever their limit type, and
    /// deletes its lease rows (each exactly once, like a reclaimed lease).
    pub(crate) async fn give_back(&self, mut parts: Vec<LeasePart>) -> Result<usize, Error> {
        for part in &mut parts {
            part.restores = true;
        }
        self.end_parts(parts, None).await
    }

    /// [`give_back`](Self::give_back) for a lease its caller never received.
    pub(crate) fn give_back_in_background(&self, lease: Lease) {
        let parts = lease.into_parts();
        let client = self.clone();
        tokio::spawn(async move {
            if let Err(error) = client.give_back(parts).await {
                tracing::warn!(%error, "giving back an abandoned grant failed; its leases expire and are reconciled");
            }
        });
    }

    /// The rows of `dimensions` as this client remembers them, with those it does not
    /// remember read (in one call); and which of them the store just confirmed.
    async fn remembered_rows(
        &self,
        dimensions: &[Dimension],
    ) -> Result<(Vec<BucketState>, Vec<bool>), Error> {
        let remembered: Vec<Option<BucketState>> = dimensions
            .iter()
            .map(|d| self.inner.lanes.lane(d).memory().row().cloned())
            .collect();
        let fresh: Vec<bool> = remembered.iter().map(Option::is_none).collect();
        let missing: Vec<Dimension> = dimensions
            .iter()
            .zip(&fresh)
            .filter(|(_, read)| **read)
            .map(|(d, _)| d.clone())
            .collect();
        let mut read = if missing.is_empty() {
            Vec::new()
        } else {
            self.read_rows(&missing).await?
        }
        .into_iter();
        let rows = remembered
            .into_iter()
            .map(|row| row.or_else(|| read.next()))
            .zip(dimensions)
            .map(|(row, d)| row.ok_or_else(|| Error::UnknownDimension(d.clone())))
            .collect::<Result<_, _>>()?;
        Ok((rows, fresh))
    }

    /// Reads the buckets of `dimensions`, all of which must exist, and remembers them (as
    /// of when the read was sent: nothing later is known of them). A bucket found missing
    /// is forgotten.
    async fn read_rows(&self, dimensions: &[Dimension]) -> Result<Vec<BucketState>, Error> {
        let sent = self.now();
        let rows = self.inner.store.read_buckets(dimensions).await?;
        let mut found = Vec::with_capacity(rows.len());
        for (row, d) in rows.into_iter().zip(dimensions) {
            let Some(row) = row else {
                self.inner.lanes.forget(d);
                return Err(Error::UnknownDimension(d.clone()));
            };
            self.inner.lanes.learn(row.clone(), sent);
            found.push(row);
        }
        Ok(found)
    }

    /// Reads the buckets of `dimensions`, all of which must exist.
    async fn read_existing(&self, dimensions: &[Dimension]) -> Result<Vec<BucketState>, Error> {
        let rows = self.inner.store.read_buckets(dimensions).await?;
        rows.into_iter()
            .zip(dimensions)
            .map(|(row, d)| row.ok_or_else(|| Error::UnknownDimension(d.clone())))
            .collect()
    }

    /// What the leases of a short `concurrent` bucket say: when a slot comes back for sure
    /// (the earliest live lease expiry), after giving back, exactly once each, the expired
    /// leases found on the way (the reconciler's work). Reads the dimension's slot leases
    /// earliest expiry first, a page at a time, never the whole table.
    ///
    /// `looked_again`: how many times this acquire already looked again; from
    /// [`MAX_LOOKS_AGAIN`] on, expired leases another client gave back first no longer
    /// send it looking again.
    pub(crate) async fn slot_outlook(
        &self,
        row: &BucketState,
        now: UnixMillis,
        looked_again: u32,
    ) -> Result<SlotOutlook, Error> {
        let dimension = &row.dimension;
        let mut reclaimed = 0;
        let mut found_expired = false;
        let mut back = None;
        // Every lease on the dimension, those the row keeps and lease rows alike (another
        // SDK's, one from before the bucket was created again), earliest expiry first.
        for _ in 0..SLOT_PAGES {
            let page = self.inner.store.slot_leases(dimension, SLOT_PAGE).await?;
            let more = page.len() >= SLOT_PAGE;
            let (expired, live): (Vec<_>, Vec<_>) =
                page.into_iter().partition(|l| l.expires_at <= now);
            if !expired.is_empty() {
                found_expired = true;
                reclaimed += self.reclaim(expired).await?;
            }
            if !live.is_empty() || !more {
                back = live.first().map(|l| l.expires_at);
                break;
            }
        }
        if reclaimed > 0 {
            return Ok(SlotOutlook::LookAgain);
        }
        if found_expired && looked_again < MAX_LOOKS_AGAIN {
            // Another client gave them back first: the bucket may hold their slots now.
            let current = self
                .inner
                .store
                .read_buckets(std::slice::from_ref(dimension))
                .await?
                .remove(0);
            if current.as_ref() != Some(row) {
                return Ok(SlotOutlook::LookAgain);
            }
        }
        Ok(SlotOutlook::BackBy(back))
    }

    /// Ends expired lease rows, giving their cost back to their buckets whatever the limit
    /// type. Exactly once: each row's deletion is conditioned on it still existing, so a
    /// concurrent release or reconciler wins or loses as a whole.
    pub(crate) async fn reclaim(&self, records: Vec<LeaseRecord>) -> Result<usize, Error> {
        let parts = records
            .into_iter()
            .map(|r| LeasePart {
                kept: Kept::of(&r),
                key: r.key,
                dimension: r.dimension,
                cost: r.cost,
                restores: true,
            })
            .collect();
        self.end_parts(parts, None).await
    }

    /// Releases a lease's parts. On the fast path each part goes through its dimension's
    /// lane, all at once (no read; the release rides on the lane's next write); a part
    /// whose write keeps losing races falls back to [`end_parts`](Self::end_parts), which
    /// keeps trying until the lease expires. The seed's protocol ends them all in one
    /// transaction.
    pub(crate) async fn release_parts(
        &self,
        parts: Vec<LeasePart>,
        expires_at: UnixMillis,
    ) -> Result<(), Error> {
        if self.inner.config.protocol != Protocol::Fast {
            return self.end_parts(parts, Some(expires_at)).await.map(drop);
        }
        let released = futures::future::join_all(parts.into_iter().map(|part| async move {
            match self.release_fast(part.clone()).await {
                Err(Error::Contention { .. }) => {
                    self.end_parts(vec![part], Some(expires_at)).await.map(drop)
                }
                done => done,
            }
        }))
        .await;
        released.into_iter().collect()
    }

    /// Ends lease parts: deletes their rows and gives back the cost of those that restore
    /// (a part without a row, from a lean bucket, only gives back). Returns how many parts
    /// this call ended (rows already gone are skipped, and give nothing back). Parts go in
    /// transactions DynamoDB accepts (at most 100 items each), each one atomic: a part
    /// ends exactly once whatever else races on it.
    ///
    /// A release lost to other writers is retried at least `max_retries` times and, while
    /// the lease is alive, until it expires: a slot given up early would stay lost until
    /// the reconciler found it.
    pub(crate) async fn end_parts(
        &self,
        parts: Vec<LeasePart>,
        keep_trying_until: Option<UnixMillis>,
    ) -> Result<usize, Error> {
        let mut ended = 0;
        for chunk in transaction_chunks(parts) {
            ended += self.end_chunk(chunk, keep_trying_until).await?;
        }
        Ok(ended)
    }

    /// [`end_parts`](Self::end_parts) for parts that fit in one transaction.
    async fn end_chunk(
        &self,
        mut parts: Vec<LeasePart>,
        keep_trying_until: Option<UnixMillis>,
    ) -> Result<usize, Error> {
        let max_retries = self.inner.config.max_retries;
        let give_up = |attempt: u32| {
            attempt > max_retries && keep_trying_until.is_none_or(|t| self.now() >= t)
        };
        let mut attempt: u32 = 0;
        // Leases kept in a bucket row that give nothing back are removed without any
        // condition (see `Store::forget_held`).
        let mut forgotten = 0;
        let (forget, rest): (Vec<LeasePart>, Vec<LeasePart>) = std::mem::take(&mut parts)
            .into_iter()
            .partition(|p| p.kept == Kept::InBucket && !p.restores);
        parts = rest;
        let mut by_dimension: Vec<(Dimension, Vec<String>)> = Vec::new();
        for p in forget {
            let id = p.key.unique().to_owned();
            match by_dimension.iter_mut().find(|(d, _)| *d == p.dimension) {
                Some((_, ids)) => ids.push(id),
                None => by_dimension.push((p.dimension, vec![id])),
            }
        }
        for (dimension, ids) in by_dimension {
            self.inner.store.forget_held(&dimension, &ids).await?;
            forgotten += ids.len();
        }
        loop {
            attempt += 1;
            if parts.is_empty() {
                return Ok(forgotten);
            }
            // Aggregate what goes back to each restoring bucket.
            let mut restore: Vec<(Dimension, Tokens)> = Vec::new();
            for p in parts.iter().filter(|p| p.restores) {
                match restore.iter_mut().find(|(d, _)| *d == p.dimension) {
                    Some((_, amount)) => *amount += p.cost,
                    None => restore.push((p.dimension.clone(), p.cost)),
                }
            }
            let dims: Vec<Dimension> = restore.iter().map(|(d, _)| d.clone()).collect();
            let rows = if dims.is_empty() {
                Vec::new()
            } else {
                self.inner.store.read_buckets(&dims).await?
            };
            let now = self.now();
            // A deleted bucket has nothing to give back to (and the leases it kept went with
            // it).
            let buckets: Vec<BucketWrite> = restore
                .iter()
                .zip(rows)
                .filter_map(|((dimension, amount), row)| {
                    let row = row?;
                    let (tokens, last_refill_at) = row.restored(*amount, now);
                    let held = parts
                        .iter()
                        .filter(|p| p.kept == Kept::InBucket && p.dimension == *dimension)
                        .map(|p| HeldWrite::Remove(p.key.unique().to_owned()))
                        .collect();
                    Some(BucketWrite::new(row, tokens, last_refill_at).with_held(held))
                })
                .collect();
            // Kept leases of a bucket that is gone are gone too.
            let existing: Vec<&Dimension> = buckets.iter().map(BucketWrite::dimension).collect();
            let gone = parts
                .iter()
                .filter(|p| p.kept == Kept::InBucket && !existing.contains(&&p.dimension))
                .count();
            if gone > 0 {
                let existing: Vec<Dimension> = existing.into_iter().cloned().collect();
                parts.retain(|p| p.kept != Kept::InBucket || existing.contains(&p.dimension));
            }
            let written: Vec<BucketState> = buckets.iter().map(BucketWrite::after).collect();
            let commit = Commit {
                buckets,
                leases: parts
                    .iter()
                    .filter(|p| p.kept == Kept::Row)
                    .map(|p| LeaseWrite::Delete(p.key.clone()))
                    .collect(),
            };
            match self.inner.store.commit(commit).await {
                Ok(()) => {
                    for row in written {
                        self.inner.lanes.learn_written(row, now);
                    }
                    return Ok(forgotten + parts.len());
                }
                Err(CommitError::Condition(ConditionFailure::LeaseMissing(key))) => {
                    tracing::debug!(%key, "lease row already gone (released or reconciled)");
                    parts.retain(|p| p.key != key);
                    // Another client may have ended many of them (two reclaiming the same
                    // expired leases): drop every one already gone at once, not one per
                    // failed transaction.
                    let keys: Vec<LeaseKey> = parts
                        .iter()
                        .filter(|p| p.is_kept())
                        .map(|p| p.key.clone())
                        .collect();
                    if keys.len() > 1 {
                        let present = self.inner.store.read_leases(&keys).await?;
                        let gone: Vec<LeaseKey> = keys
                            .into_iter()
                            .zip(present)
                            .filter(|(_, row)| row.is_none())
                            .map(|(k, _)| k)
                            .collect();
                        parts.retain(|p| !gone.contains(&p.key));
                    }
                    continue;
                }
                Err(CommitError::Condition(ConditionFailure::LeaseExists(key))) => {
                    return Err(StoreError::service(format!(
                        "store reported existing lease `{key}` while deleting it"
                    ))
                    .into());
                }
                Err(CommitError::Condition(ConditionFailure::BucketChanged {
                    dimension, ..
                })) => {
                    if give_up(attempt) {
                        return Err(Error::Contention {
                            dimension,
                            attempts: attempt,
                        });
                    }
                }
                Err(CommitError::TransactionConflict) => {
                    if give_up(attempt) {
                        return Err(Error::Contention {
                            dimension: parts[0].dimension.clone(),
                            attempts: attempt,
                        });
                    }
                }
                Err(CommitError::Store(e)) => return Err(e.into()),
            }
            tokio::time::sleep(backoff_delay(attempt)).await;
        }
    }

    /// Changes one part's cost to `actual`, charging or refunding the difference.
    ///
    /// On the fast path the row comes from memory (no read) and a lost race retries at
    /// once from the row the store hands back.
    pub(crate) async fn adjust_part(&self, part: &LeasePart, actual: Tokens) -> Result<(), Error> {
        let delta = actual - part.cost;
        let max_retries = self.inner.config.max_retries;
        let fast = self.inner.config.protocol == Protocol::Fast;
        let dimensions = std::slice::from_ref(&part.dimension);
        // Writes lost to contention so far; a lost race that handed back the current row
        // (fast path) is retried at once and does not count.
        let mut attempt: u32 = 0;
        let mut fresh_retries: u32 = 0;
        loop {
            let row = if fast {
                self.remembered_rows(dimensions).await?.0
            } else {
                self.read_existing(dimensions).await?
            }
            .remove(0);
            let now = self.now();
            let (tokens, last_refill_at) = row.charged(delta, now);
            let mut write = BucketWrite::new(row, tokens, last_refill_at);
            let mut leases = Vec::new();
            match part.kept {
                Kept::Row => leases.push(LeaseWrite::SetCost {
                    key: part.key.clone(),
                    cost: actual,
                }),
                Kept::InBucket => write.held.push(HeldWrite::SetCost {
                    id: part.key.unique().to_owned(),
                    cost: actual,
                }),
                Kept::Nowhere => {}
            }
            let written = write.after();
            let commit = Commit {
                buckets: vec![write],
                leases,
            };
            match self.inner.store.commit(commit).await {
                Ok(()) => {
                    self.inner.lanes.learn_written(written, now);
                    return Ok(());
                }
                Err(CommitError::Condition(ConditionFailure::LeaseMissing(key))) => {
                    return Err(Error::LeaseNotFound(key.to_string()));
                }
                Err(CommitError::Condition(ConditionFailure::BucketChanged {
                    current: Some(current),
                    ..
                })) if fast && fresh_retries < crate::fast::MAX_FRESH_RETRIES => {
                    fresh_retries += 1;
                    self.inner.lanes.learn(*current, now);
                    continue;
                }
                Err(CommitError::Condition(_)) | Err(CommitError::TransactionConflict) => {
                    self.inner.lanes.forget(&part.dimension);
                    attempt += 1;
                    if attempt > max_retries {
                        return Err(Error::Contention {
                            dimension: part.dimension.clone(),
                            attempts: attempt,
                        });
                    }
                }
                Err(CommitError::Store(e)) => {
                    self.inner.lanes.forget(&part.dimension);
                    return Err(e.into());
                }
            }
            tokio::time::sleep(backoff_delay(attempt)).await;
        }
    }

    /// Releases a lease by id, e.g. one taken by another process. Returns whether any of its
    /// rows still existed (`false`: already released or reconciled).
    pub async fn release_id(&self, id: &LeaseId) -> Result<bool, Error> {
        let records = self.inner.store.read_leases(id.keys()).await?;
        let records: Vec<LeaseRecord> = records.into_iter().flatten().collect();
        if records.is_empty() {
            return Ok(false);
        }
        let dims: Vec<Dimension> = records.iter().map(|r| r.dimension.clone()).collect();
        let rows = self.inner.store.read_buckets(&dims).await?;
        let parts = records
            .into_iter()
            .zip(rows)
            .map(|(r, row)| LeasePart {
                restores: row.is_some_and(|b| b.bucket.limit_type() == LimitType::Concurrent),
                kept: Kept::of(&r),
                key: r.key,
                dimension: r.dimension,
                cost: r.cost,
            })
            .collect();
        Ok(self.end_parts(parts, None).await? > 0)
    }

    /// Runs `body` while holding capacity on `request`: acquires, runs, releases.
    ///
    /// `timeout` is both the lease's TTL and the body's deadline: a body still running then
    /// is dropped and the slot returns [`Error::Timeout`]. The lease is released on every
    /// path: when the body finishes, when it times out, when it panics (the panic then
    /// continues), and when the slot's future is dropped (released in the background).
    pub async fn slot<F>(
        &self,
        request: impl Into<Acquire>,
        timeout: Duration,
        body: F,
    ) -> Result<F::Output, Error>
    where
        F: Future,
    {
        let lease = self.acquire(request.into().ttl(timeout)).await?;
        lease.run(timeout, body).await
    }

    /// Like [`acquire`](Self::acquire), but on [`Error::RetryIn`] sleeps the exact delay
    /// and asks again, as long as the total time slept stays within `max_wait`. The last
    /// RetryIn is returned when the next wait would go past the bound.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Bucket, RefillRate, Sluice};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
    /// let sluice = Sluice::builder().clock(sluice::TokioClock::starting_at(sluice::UnixMillis::from_secs(1_700_000_000))).build()?;
    /// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_second(10)).with_capacity(1)).await?;
    /// sluice.acquire("openai#rpm").await?.release().await?;
    /// // The next token is 100 ms away: waiting up to a second gets it.
    /// let lease = sluice.acquire_within("openai#rpm", Duration::from_secs(1)).await?;
    /// # lease.release().await?;
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub async fn acquire_within(
        &self,
        request: impl Into<Acquire>,
        max_wait: Duration,
    ) -> Result<Lease, Error> {
        let request = request.into();
        let dimensions: Vec<Dimension> = request
            .resolve()?
            .into_iter()
            .map(|w| w.dimension)
            .collect();
        let mut waited = Duration::ZERO;
        let mut fresh_after = None;
        loop {
            match self.acquire_after(request.clone(), fresh_after).await {
                Err(Error::RetryIn(delay)) => {
                    // A slot may come back before its RetryIn (released elsewhere): look
                    // again after at most a jittered poll interval.
                    let slots = dimensions.iter().any(|d| self.inner.lanes.holds_slots(d));
                    let nap = if slots {
                        delay.min(self.poll_nap())
                    } else {
                        delay
                    };
                    if waited + nap > max_wait {
                        return Err(Error::RetryIn(delay));
                    }
                    tracing::debug!(delay_ms = nap.as_millis() as u64, "waiting for capacity");
                    // What the store says after the wait, not what was remembered before it.
                    fresh_after = Some(self.now());
                    tokio::time::sleep(nap).await;
                    waited += nap;
                }
                other => return other,
            }
        }
    }

    /// A wait of half to all of the slot poll interval, drawn at random so that waiting
    /// processes do not look at the store all at once.
    fn poll_nap(&self) -> Duration {
        let poll = self.inner.config.slot_poll;
        let half = poll / 2;
        let jitter = rand::rng().random_range(0..=(poll - half).as_micros() as u64);
        (half + Duration::from_micros(jitter)).max(Duration::from_millis(1))
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
        let lease = self
            .acquire_within(request.into().ttl(timeout), max_wait)
            .await?;
        lease.run(timeout, body).await?
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
        self.slot(request, timeout, body).await?
    }

    /// What an operator wants to know about a dimension right now.
    pub async fn snapshot(&self, dimension: &str) -> Result<Snapshot, Error> {
        let dimension = Dimension::new(dimension)?;
        let row = self
            .read_existing(std::slice::from_ref(&dimension))
            .await?
            .remove(0);
        let leases = self
            .inner
            .store
            .list_leases(&LeaseFilter {
                dimension: Some(dimension),
                expired_before: None,
            })
            .await?;
        Ok(Snapshot::of(&row, &leases, self.now()))
    }

    /// Snapshots of every bucket, sorted by dimension, from one listing of buckets and one
    /// of leases (the operator's `status`).
    pub async fn snapshots(&self) -> Result<Vec<Snapshot>, Error> {
        let mut rows = self.inner.store.list_buckets().await?;
        rows.sort_by(|a, b| a.dimension.as_str().cmp(b.dimension.as_str()));
        let mut leases: std::collections::HashMap<Dimension, Vec<LeaseRecord>> =
            std::collections::HashMap::new();
        for lease in self
            .inner
            .store
            .list_leases(&LeaseFilter::default())
            .await?
        {
            leases
                .entry(lease.dimension.clone())
                .or_default()
                .push(lease);
        }
        let now = self.now();
        Ok(rows
            .iter()
            .map(|row| {
                let held = leases.get(&row.dimension).map_or(&[][..], Vec::as_slice);
                Snapshot::of(row, held, now)
            })
            .collect())
    }

    /// Defines or redefines the bucket of `dimension`.
    ///
    /// A new bucket starts full, at a version above any its dimension had before (see
    /// [`MAX_VERSION`](crate::MAX_VERSION)). Redefining a `requests` or `tokens` bucket keeps
    /// the tokens it holds now (capped at the new capacity), so changing a limit never hands
    /// out a fresh burst; redefining a `concurrent` one keeps the slots held, so its free
    /// slots move with the capacity (4 slots with 1 held, lowered to 2: 1 free). Other
    /// clients see the new definition at their next write or read of the row.
    pub async fn put_bucket(&self, dimension: &str, bucket: Bucket) -> Result<BucketState, Error> {
        let dimension = Dimension::new(dimension)?;
        bucket.validate().map_err(|source| Error::InvalidBucket {
            dimension: dimension.clone(),
            source,
        })?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let now = self.now();
            let current = self
                .inner
                .store
                .read_buckets(std::slice::from_ref(&dimension))
                .await?
                .remove(0);
            let state = match &current {
                // A new bucket continues above any version a predecessor reached.
                None => BucketState {
                    version: first_version(now),
                    write_id: Some(new_write_id()),
                    ..BucketState::full(dimension.clone(), bucket.clone(), now)
                },
                Some(cur) => {
                    let (tokens, last_refill_at) = cur.refilled(now);
                    let tokens = if cur.bucket.limit_type() == LimitType::Concurrent
                        && bucket.limit_type() == LimitType::Concurrent
                    {
                        // The slots held stay held: the free ones move with the capacity
                        // (below zero when more are held than the new capacity allows).
                        (tokens + bucket.capacity() - cur.bucket.capacity())
                            .min(bucket.capacity())
                            .max(-Tokens::MAX)
                    } else {
                        tokens.min(bucket.capacity())
                    };
                    BucketState {
                        dimension: dimension.clone(),
                        tokens,
                        bucket: bucket.clone(),
                        last_refill_at,
                        version: cur.version.saturating_add(1),
                        write_id: Some(new_write_id()),
                        held: Vec::new(),
                    }
                }
            };
            if self
                .inner
                .store
                .put_bucket(&state, current.as_ref())
                .await?
            {
                self.inner.lanes.learn_written(state.clone(), now);
                return Ok(state);
            }
            if attempt > self.inner.config.max_retries {
                return Err(Error::Contention {
                    dimension,
                    attempts: attempt,
                });
            }
            tokio::time::sleep(backoff_delay(attempt)).await;
        }
    }

    /// The stored bucket of `dimension`, if any.
    pub async fn bucket(&self, dimension: &str) -> Result<Option<BucketState>, Error> {
        let dimension = Dimension::new(dimension)?;
        Ok(self
            .inner
            .store
            .read_buckets(std::slice::from_ref(&dimension))
            .await?
            .remove(0))
    }

    /// Every stored bucket.
    pub async fn buckets(&self) -> Result<Vec<BucketState>, Error> {
        Ok(self.inner.store.list_buckets().await?)
    }

    /// Deletes the bucket of `dimension`; returns whether it existed.
    pub async fn delete_bucket(&self, dimension: &str) -> Result<bool, Error> {
        let dimension = Dimension::new(dimension)?;
        self.inner.lanes.forget(&dimension);
        Ok(self.inner.store.delete_bucket(&dimension).await?)
    }

    /// Lease rows matching `filter` (e.g. the expired ones).
    pub async fn leases(&self, filter: &LeaseFilter) -> Result<Vec<LeaseRecord>, Error> {
        Ok(self.inner.store.list_leases(filter).await?)
    }
}

/// Splits lease parts into groups that each fit in one transaction: at most
/// [`MAX_TRANSACTION_ITEMS`] items, counting one per lease row and one per bucket that
/// gets something back.
fn transaction_chunks(mut parts: Vec<LeasePart>) -> Vec<Vec<LeasePart>> {
    parts.sort_by(|a, b| a.dimension.cmp(&b.dimension));
    let mut chunks: Vec<Vec<LeasePart>> = Vec::new();
    let mut chunk: Vec<LeasePart> = Vec::new();
    let mut items = 0;
    for part in parts {
        let new_bucket = |chunk: &[LeasePart]| {
            part.restores
                && !chunk
                    .iter()
                    .any(|p| p.restores && p.dimension == part.dimension)
        };
        let mut adds = usize::from(part.is_kept()) + usize::from(new_bucket(&chunk));
        if items + adds > MAX_TRANSACTION_ITEMS && !chunk.is_empty() {
            chunks.push(std::mem::take(&mut chunk));
            items = 0;
            adds = usize::from(part.is_kept()) + usize::from(part.restores);
        }
        items += adds;
        chunk.push(part);
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    chunks
}

/// Exponential backoff with jitter: the `attempt`-th delay is drawn from
/// `[d/2, d]` with `d = min(25 ms * 2^(attempt-1), 200 ms)`.
pub(crate) fn backoff_delay(attempt: u32) -> Duration {
    let exp = BACKOFF_BASE.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
    let cap = exp.min(BACKOFF_MAX);
    let half = cap / 2;
    let jitter_ms = rand::rng().random_range(0..=half.as_millis() as u64);
    half + Duration::from_millis(jitter_ms)
}

/// 128 random bits in hex: the unique suffix of a lease's rows.
pub(crate) fn new_unique() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_from_25ms_to_a_200ms_cap_with_jitter() {
        for _ in 0..200 {
            let first = backoff_delay(1);
            assert!(first >= Duration::from_micros(12_500) && first <= Duration::from_millis(25));
            let later = backoff_delay(10);
            assert!(later >= Duration::from_millis(100) && later <= Duration::from_millis(200));
        }
    }
}
