//! Administration: defining buckets, looking at them, releasing leases by id, tightening
//! and reconciling.

use crate::bucket::{Bucket, BucketState, LimitType, RecentWrites, RefillCarry, first_version};
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::grant::LeaseId;
use crate::ids::new_write_id;
use crate::protocol::reconcile::{self, ReconcileReport};
use crate::protocol::release;
use crate::protocol::restock::{self, Audit, Restock, Restocked};
use crate::protocol::tighten::{self, Tighten};
use crate::retry::Budget;
use crate::role::{self, Role};
use crate::snapshot::Snapshot;
use crate::store::{LeaseFilter, LeaseRecord};
use crate::tokens::Tokens;

use super::Sluice;

impl Sluice {
    /// What an operator wants to know about a dimension right now.
    pub async fn snapshot(&self, dimension: &str) -> Result<Snapshot, Error> {
        role::within(Role::Operator, self.snapshot_of(dimension)).await
    }

    async fn snapshot_of(&self, dimension: &str) -> Result<Snapshot, Error> {
        let dimension = Dimension::new(dimension)?;
        let (rows, _) = crate::protocol::reshard::rows_or_unwritten(&self.core, &dimension).await?;
        // A sharded bucket's leases are under its rows' names: one listing, kept by base.
        let filter = LeaseFilter {
            dimension: (rows.len() == 1).then(|| dimension.clone()),
            expired_before: None,
        };
        let mut leases = self.core.store.list_leases(&filter).await?;
        leases.retain(|l| l.dimension.base() == dimension);
        let now = self.now();
        Ok(Snapshot::of(&as_one(rows, now), &leases, now))
    }

    /// Snapshots of every bucket, sorted by dimension, from one listing of buckets and one
    /// of leases (the operator's `status`); a bucket spread over several rows is one
    /// snapshot of the whole.
    pub async fn snapshots(&self) -> Result<Vec<Snapshot>, Error> {
        role::within(Role::Operator, self.snapshots_of_all()).await
    }

    /// Every bucket as one, sorted by dimension: a bucket spread over several rows is the
    /// whole its rows hold (its whole definition and the tokens of every row, refilled to
    /// now, with `shards` its count), where [`buckets`](Self::buckets) lists each row.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// use sluice::{Bucket, RefillRate, Sluice};
    ///
    /// let sluice = Sluice::in_memory();
    /// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(10_000))).await?;
    /// sluice.reshard("openai#rpm", 4).await?;
    /// assert_eq!(sluice.buckets().await?.len(), 4);
    /// let whole = sluice.whole_buckets().await?;
    /// assert_eq!((whole.len(), whole[0].shards), (1, 4));
    /// assert_eq!(whole[0].bucket.capacity(), 10_000.into());
    /// # Ok::<(), sluice::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn whole_buckets(&self) -> Result<Vec<BucketState>, Error> {
        role::within(Role::Operator, self.wholes()).await
    }

    pub(super) async fn wholes(&self) -> Result<Vec<BucketState>, Error> {
        Ok(self.wholes_of(self.core.store.list_buckets().await?))
    }

    /// The buckets `rows` (every row listed) make, each as one row (see [`as_one`]).
    pub(super) fn wholes_of(&self, rows: Vec<BucketState>) -> Vec<BucketState> {
        let mut buckets: std::collections::BTreeMap<String, Vec<BucketState>> =
            std::collections::BTreeMap::new();
        for row in rows {
            buckets
                .entry(row.dimension.base().as_str().to_owned())
                .or_default()
                .push(row);
        }
        let now = self.now();
        buckets
            .into_values()
            .map(|mut rows| {
                rows.sort_by_key(|r| r.dimension.shard_index());
                as_one(rows, now)
            })
            .collect()
    }

    async fn snapshots_of_all(&self) -> Result<Vec<Snapshot>, Error> {
        let buckets = self.wholes().await?;
        let mut leases: std::collections::HashMap<Dimension, Vec<LeaseRecord>> =
            std::collections::HashMap::new();
        for lease in self.core.store.list_leases(&LeaseFilter::default()).await? {
            leases
                .entry(lease.dimension.base())
                .or_default()
                .push(lease);
        }
        let now = self.now();
        Ok(buckets
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
    /// `MAX_VERSION`). Redefining a `requests` or `tokens` bucket keeps
    /// the tokens it holds now (capped at the new capacity), so changing a limit never hands
    /// out a fresh burst; redefining a `concurrent` one keeps the slots held, so its free
    /// slots move with the capacity (4 slots with 1 held, lowered to 2: 1 free). Other
    /// clients see the new definition at their next write or read of the row.
    ///
    /// A [keyed](Bucket::keyed) bucket is a template: each key's bucket is created by the
    /// key's first acquire. A bucket put on a key's dimension (`ingest#rpm#@big-customer`)
    /// is that key's own definition ([`Bucket::is_override`]), kept whatever the template
    /// becomes.
    pub async fn put_bucket(&self, dimension: &str, bucket: Bucket) -> Result<BucketState, Error> {
        // One put on a key's dimension is that key's own definition, over its template's
        // (a schedule's change to a key's row is not: it keeps the row's).
        let keyed = Dimension::new(dimension).is_ok_and(|d| d.key().is_some());
        let bucket = if keyed { bucket.overriding() } else { bucket };
        role::within(Role::Operator, self.define(dimension, bucket)).await
    }

    pub(super) async fn define(
        &self,
        dimension: &str,
        bucket: Bucket,
    ) -> Result<BucketState, Error> {
        let dimension = Dimension::new(dimension)?;
        bucket.validate().map_err(|source| Error::InvalidBucket {
            dimension: dimension.clone(),
            source,
        })?;
        // A scheduled bucket is stored with the limits its schedule has now.
        let bucket = bucket.at(self.now());
        let mut budget = Budget::new(self.core.config.max_retries);
        loop {
            let now = self.now();
            let current = self.core.read_one(&dimension).await?;
            if current.as_ref().is_some_and(|row| row.shards > 1) {
                if let Some(state) = self.redefine_shards(&dimension, &bucket).await? {
                    return Ok(state);
                }
            } else {
                let state = redefined(current.as_ref(), &dimension, &bucket, now);
                if self.core.store.put_bucket(&state, current.as_ref()).await? {
                    self.core.lanes.learn_written(state.clone(), now);
                    // A definition that keeps it over several rows spreads it now.
                    return match bucket.shard_limit().map(|l| l.clamp(1)) {
                        Some(to) if to > 1 => {
                            let rows =
                                crate::protocol::reshard::reshard(&self.core, &dimension, to)
                                    .await?;
                            Ok(rows.into_iter().next().unwrap_or(state))
                        }
                        _ => Ok(state),
                    };
                }
            }
            crate::protocol::lost_race(&mut budget, &dimension).await?;
        }
    }

    /// Spreads the bucket of `dimension` over `shards` rows, or gathers it into fewer
    /// (1: one row again), in one conditional transaction; returns its rows as it wrote
    /// them, shard 0 first. The rows that stay are moved by what they give or take, so
    /// the transaction lands while other clients write to them, and what those clients
    /// did stays on the rows besides.
    ///
    /// Each row holds its share of the capacity, refill and reserves, and of the tokens
    /// the bucket holds at that instant: none is made or lost. Shard 0 is the dimension's
    /// own row, so the seed's other SDKs see a bucket of its share. A `concurrent` bucket
    /// stays in one row ([`ShardError::Concurrent`](crate::ShardError::Concurrent)), and so
    /// does one whose shares could not each hold a call's cost.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// use sluice::{Bucket, RefillRate, Sluice};
    ///
    /// let sluice = Sluice::in_memory();
    /// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(10_000))).await?;
    /// let rows = sluice.reshard("openai#rpm", 4).await?;
    /// assert_eq!(rows.len(), 4);
    /// assert_eq!(rows[1].dimension.as_str(), "openai#rpm#1");
    /// assert_eq!(rows[1].bucket.capacity(), 2_500.into());
    /// # Ok::<(), sluice::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn reshard(&self, dimension: &str, shards: u16) -> Result<Vec<BucketState>, Error> {
        let dimension = Dimension::new(dimension)?;
        role::within(
            Role::Operator,
            crate::protocol::reshard::reshard(&self.core, &dimension, shards),
        )
        .await
    }

    /// Redefines a bucket spread over several rows: the whole bucket as it stands now
    /// redefined, spread again over as many rows, all of them replaced in one conditional
    /// transaction. Its shard 0 as it stands after; `None` when another writer moved a row
    /// in between.
    async fn redefine_shards(
        &self,
        dimension: &Dimension,
        bucket: &Bucket,
    ) -> Result<Option<BucketState>, Error> {
        use crate::bucket::shards::reshard;
        let rows = crate::protocol::reshard::rows_of(&self.core, dimension).await?;
        let now = self.now();
        let one = reshard(&rows, 1, now)?.remove(0);
        let defined = redefined(Some(&one), dimension, bucket, now);
        // As many rows as now, or the nearest count the new definition allows.
        let count = u16::try_from(rows.len()).unwrap_or(u16::MAX);
        let count = bucket.shard_limit().map_or(count, |l| l.clamp(count));
        let mut spread = reshard(&[defined], count, now)?;
        for (new, old) in spread.iter_mut().zip(&rows) {
            new.version = new.version.max(old.version.saturating_add(1));
        }
        if !self.core.store.replace_buckets(&rows, &spread).await? {
            return Ok(None);
        }
        for row in &spread {
            self.core.lanes.learn_written(row.clone(), now);
        }
        Ok(spread.into_iter().next())
    }

    /// The stored bucket of `dimension`, if any.
    pub async fn bucket(&self, dimension: &str) -> Result<Option<BucketState>, Error> {
        let dimension = Dimension::new(dimension)?;
        Ok(role::within(Role::Operator, self.core.read_one(&dimension)).await?)
    }

    /// Every stored bucket.
    pub async fn buckets(&self) -> Result<Vec<BucketState>, Error> {
        Ok(role::within(Role::Operator, self.core.store.list_buckets()).await?)
    }

    /// Deletes the bucket of `dimension`; returns whether it existed.
    pub async fn delete_bucket(&self, dimension: &str) -> Result<bool, Error> {
        let dimension = Dimension::new(dimension)?;
        role::within(Role::Operator, async {
            // The other shards first: a bucket whose own row is gone has no shards.
            let shards = self
                .core
                .read_one(&dimension)
                .await?
                .map_or(1, |r| r.shards);
            for k in (1..shards).rev() {
                self.core.lanes.forget(&dimension.shard(k));
                self.core.store.delete_bucket(&dimension.shard(k)).await?;
            }
            self.core.lanes.forget(&dimension);
            self.core.lanes.note_shards(&dimension, 1);
            Ok(self.core.store.delete_bucket(&dimension).await?)
        })
        .await
    }

    /// Lease rows matching `filter` (e.g. the expired ones).
    pub async fn leases(&self, filter: &LeaseFilter) -> Result<Vec<LeaseRecord>, Error> {
        Ok(role::within(Role::Operator, self.core.store.list_leases(filter)).await?)
    }

    /// Releases a lease by id, e.g. one taken by another process. Returns whether any of its
    /// rows still existed (`false`: already released or reconciled, or not written yet: a
    /// `requests`/`tokens` lease's row is written just after its grant, so pass an id on
    /// once [`Lease::recorded`](crate::Lease::recorded) returns).
    pub async fn release_id(&self, id: &LeaseId) -> Result<bool, Error> {
        release::release_id(&self.core, id).await
    }

    /// Makes the bucket of `dimension` stricter, for every process sharing it, with one
    /// conditional write. Returns whether the bucket changed (`false`: it was already at
    /// least this strict, the report does not apply to its limit type, or a
    /// [`Tighten::Reported`] lost its race to another writer: it is not sent again, the
    /// next answer's report is weighed instead). Tokens this
    /// client [prefetched](crate::Prefetch) for the dimension are dropped either way.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Bucket, clock::ManualClock, RefillRate, Sluice, admin::Tighten, clock::UnixMillis};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    /// let sluice = Sluice::builder().store(sluice::MemoryStore::new()).clock(clock).build()?;
    /// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_second(10))).await?;
    ///
    /// // The vendor answered 429 with `retry-after: 7`: every client now waits 7 s.
    /// assert!(sluice.tighten("openai#rpm", Tighten::PauseFor(Duration::from_secs(7))).await?);
    /// assert_eq!(
    ///     sluice.acquire("openai#rpm").await.unwrap_err().retry_in(),
    ///     Some(Duration::from_secs(7))
    /// );
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub async fn tighten(&self, dimension: &str, how: Tighten) -> Result<bool, Error> {
        tighten::tighten(&self.core, Dimension::new(dimension)?, how).await
    }

    /// Resets the bucket of `dimension` or tops it up, by hand (after an incident, a
    /// refund agreed with the vendor): one conditional write over every row of it, logged
    /// (`tracing`, at info) with `audit`'s who and why.
    ///
    /// A reset fills a `requests`/`tokens` bucket to the most it holds; a top-up adds up to
    /// it. A `concurrent` bucket is set from its lease rows: a reset to its capacity less
    /// the slots they hold (so a slot lost to a crash comes back, and a held one is not
    /// given twice: its holder's release still lands on a bucket that counts it), a top-up
    /// at most to that. With [`Audit::if_version`] the change is refused with
    /// [`Error::BucketChanged`] when anybody changed the bucket since that version was
    /// read; without, it applies to the bucket as it stands when written (read and computed
    /// again when another writer moved it in between: on a spread bucket every row must
    /// stay as read until the write, so under heavy load it may end in
    /// [`Error::Contention`]; ask again).
    ///
    /// ```
    /// use sluice::{Acquire, admin::Audit, Bucket, Error, clock::ManualClock, RefillRate, admin::Restock, Sluice, Tokens, clock::UnixMillis};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let sluice = Sluice::builder().store(sluice::MemoryStore::new()).clock(ManualClock::new(UnixMillis::from_secs(1_700_000_000))).build()?;
    /// sluice.put_bucket("openai#tpm", Bucket::tokens(RefillRate::per_day(1)).with_capacity(1_000)).await?;
    /// drop(sluice.acquire(Acquire::with_cost("openai#tpm", 900)).await?);
    ///
    /// let read = sluice.bucket("openai#tpm").await?.unwrap().version;
    /// let audit = Audit { who: "alice".into(), why: "INC-42: vendor refunded".into(), if_version: Some(read) };
    /// let done = sluice.restock("openai#tpm", Restock::TopUp(Tokens::new(500)), &audit).await?;
    /// assert_eq!(done.after, Tokens::new(600));
    /// // The same decision again is refused: the bucket moved on since `read`.
    /// let again = sluice.restock("openai#tpm", Restock::Reset, &audit).await;
    /// assert!(matches!(again, Err(Error::BucketChanged { .. })));
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub async fn restock(
        &self,
        dimension: &str,
        how: Restock,
        audit: &Audit,
    ) -> Result<Restocked, Error> {
        // A shard's key names its bucket: the change is the whole bucket's.
        let dimension = Dimension::new(dimension)?.base();
        role::within(
            Role::Operator,
            restock::restock(&self.core, dimension, how, audit),
        )
        .await
    }

    /// One reconcile pass, as the seed's scheduled reconciler runs it every 5 minutes.
    ///
    /// 1. Every lease past its expiry (a caller that crashed or overran) is ended with one
    ///    atomic write per lease: its cost goes back to its bucket, capped at capacity, and
    ///    the lease row is deleted on condition that it still exists. A release or another
    ///    reconciler racing on the same lease wins or loses as a whole, so the cost comes
    ///    back exactly once. Idempotent: a second pass finds nothing.
    /// 2. Every `concurrent` bucket is checked against its lease rows: its tokens must be
    ///    `capacity - sum of lease costs`. A lease deleted without giving its slot back
    ///    (DynamoDB's TTL sweeper, a manual delete) would otherwise lose that slot forever;
    ///    the bucket is rewritten on condition that its version has not moved since it was
    ///    read (any acquire or release moves it), so healing never races a grant. A bucket
    ///    with a lease row the store cannot read is only ever lowered, never raised.
    ///
    /// Returns `Err` only when the pass cannot start (e.g. a missing table); failures on
    /// single leases or buckets are in the report's `errors`. It also applies what bucket
    /// schedules have due (see [`Bucket::with_schedule`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Acquire, Bucket, clock::ManualClock, Sluice, clock::UnixMillis};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    /// let sluice = Sluice::builder().store(sluice::MemoryStore::new()).clock(clock.clone()).build()?;
    /// sluice.put_bucket("elevenlabs#concurrent", Bucket::concurrent(2)).await?;
    ///
    /// // A caller takes a slot and "crashes": the lease is never released.
    /// let lease = sluice.acquire(Acquire::new("elevenlabs#concurrent").ttl(Duration::from_secs(30))).await?;
    /// std::mem::forget(lease);
    ///
    /// clock.advance(Duration::from_secs(31));
    /// let report = sluice.reconcile().await?;
    /// assert_eq!(report.leases_restored, 1);
    /// assert!(sluice.reconcile().await?.is_noop());
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub async fn reconcile(&self) -> Result<ReconcileReport, Error> {
        role::within(Role::Reconciler, async {
            let (mut report, rows) = reconcile::reconcile(&self.core).await?;
            self.apply_schedules(&mut report, rows).await;
            Ok(report)
        })
        .await
    }
}

/// The rows of one bucket (shard 0 first) as one row, for an operator's view: the whole
/// they hold at `now`, at shard 0's version. Rows read across a reshard (not the shards of
/// one bucket) show as shard 0's.
pub(super) fn as_one(rows: Vec<BucketState>, now: UnixMillis) -> BucketState {
    let whole = (rows.len() > 1)
        .then(|| crate::bucket::shards::reshard(&rows, 1, now).ok())
        .flatten()
        .and_then(|mut one| one.pop());
    let mut rows = rows;
    match whole {
        Some(mut row) => {
            row.version = rows[0].version;
            row.shards = rows[0].shards;
            row
        }
        None => rows.swap_remove(0),
    }
}

/// The row that defines `bucket` on `dimension` over `current`. A new bucket starts full,
/// above any version a predecessor reached. A redefinition keeps the tokens held now,
/// capped at the new capacity; for a `concurrent` bucket, the slots held stay held and the
/// free ones move with the capacity (below zero when more are held than it allows).
pub(super) fn redefined(
    current: Option<&BucketState>,
    dimension: &Dimension,
    bucket: &Bucket,
    now: UnixMillis,
) -> BucketState {
    let Some(cur) = current else {
        let write_id = new_write_id();
        return BucketState {
            version: first_version(now),
            write_id: Some(write_id),
            recent_writes: RecentWrites::default().after(write_id, now, 1),
            ..BucketState::full(dimension.clone(), bucket.clone(), now)
        };
    };
    let level = cur.refilled(now);
    let (tokens, last_refill_at) = (level.tokens, level.last_refill_at);
    let write_id = new_write_id();
    let tokens = if cur.bucket.limit_type() == LimitType::Concurrent
        && bucket.limit_type() == LimitType::Concurrent
    {
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
        // What was carried stays with the tokens it was earned beside (read in the new
        // rate's terms, rounded down, if the rate changed); a bucket cut down carries none.
        refill_carry: if tokens == level.tokens {
            level.carry
        } else {
            RefillCarry::ZERO
        },
        herd_at: None,
        version: cur.version.saturating_add(1),
        write_id: Some(write_id),
        recent_writes: cur.recent_after(write_id, last_refill_at),
        // The vendor's burst stays with the same limit; a new capacity or rate (a tier
        // upgrade, say) is learned afresh from the vendor's next answers.
        burst: cur
            .burst
            .filter(|_| cur.bucket.capacity() == bucket.capacity())
            .filter(|_| cur.bucket.refill_rate() == bucket.refill_rate()),
        shards: cur.shards,
        // What the store allows a row is the table's, not the definition's.
        write_ceiling: cur.write_ceiling,
        // A new mode starts a new count.
        shadow: if cur.bucket.mode() == bucket.mode() {
            cur.shadow
        } else {
            crate::ShadowLedger::default()
        },
        waiting: cur.waiting.clone(),
    }
}
