//! The storage abstraction: the few conditional operations the acquisition protocol needs.
//!
//! A [`Store`] keeps bucket rows and lease rows. Its operations map one-to-one onto
//! DynamoDB's: a consistent read of bucket rows (`BatchGetItem`/`GetItem`), one atomic
//! conditional [`Commit`] (`TransactWriteItems`, or a single conditional write when it
//! touches one row), an unconditional batch delete of lease rows that give nothing back
//! (`BatchWriteItem`), a read or scan of lease rows, a lookup of the leases holding a
//! dimension's slots (a secondary index), and bucket administration. The protocol itself
//! (refill, costs, retries, RetryIn) lives in the [`Sluice`](crate::Sluice) client, so
//! every store gives the same answers.
//!
//! A bucket write is conditioned on the whole row it was computed from
//! ([`BucketWrite::expected`]), not only on its version: versions repeat when a bucket is
//! deleted and created again, or re-seeded by another tool, and a write computed from the
//! old row must then fail.

#[cfg(feature = "dynamodb")]
mod dynamo;
mod memory;

#[cfg(feature = "dynamodb")]
pub use dynamo::{DynamoStats, DynamoStore, SLOTS_INDEX, TTL_GRACE_SECS};
pub use memory::MemoryStore;

use std::error::Error as StdError;
use std::fmt;

use crate::bucket::{BucketState, HeldLease};
use crate::clock::UnixMillis;
use crate::dimension::{Dimension, LEASE_PREFIX};
use crate::tokens::Tokens;

/// A boxed error from a store's underlying client.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The key of a lease row: `lease#{dimension}#{unique}`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseKey(String);

impl LeaseKey {
    /// The key of the lease row for `dimension` with the unique suffix `unique`.
    pub fn new(dimension: &Dimension, unique: &str) -> Self {
        LeaseKey(format!("{LEASE_PREFIX}{dimension}#{unique}"))
    }

    /// Reads a stored key, checking that it has the lease row shape.
    pub fn parse(key: &str) -> Option<Self> {
        let rest = key.strip_prefix(LEASE_PREFIX)?;
        let (dimension, unique) = rest.rsplit_once('#')?;
        (Dimension::new(dimension).is_ok() && !unique.is_empty()).then(|| LeaseKey(key.to_owned()))
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The unique suffix after the dimension.
    pub fn unique(&self) -> &str {
        self.0.rsplit_once('#').map_or("", |(_, u)| u)
    }

    /// The dimension named in the key, when it names a valid one.
    pub fn dimension(&self) -> Option<Dimension> {
        let rest = self.0.strip_prefix(LEASE_PREFIX)?;
        Dimension::new(rest.rsplit_once('#')?.0).ok()
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseKey({})", self.0)
    }
}

/// A lease row: tokens held on one dimension until released or expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Whether the lease holds slots of a `concurrent` bucket. sluice marks such rows so
    /// that a short bucket finds its leases, earliest expiry first, without scanning the
    /// table ([`Store::slot_leases`]); rows other SDKs write are not marked.
    pub slot: bool,
    /// The row's key.
    pub key: LeaseKey,
    /// The dimension whose tokens the lease holds.
    pub dimension: Dimension,
    /// The tokens taken.
    pub cost: Tokens,
    /// When the lease was taken.
    pub created_at: UnixMillis,
    /// When the lease expires and becomes the reconciler's to clean up.
    pub expires_at: UnixMillis,
    /// Who took it (`SLUICE_CALLER`).
    pub caller: String,
    /// Whether the lease is kept in its bucket's row ([`BucketState::held`]) rather than in
    /// a row of its own.
    pub in_bucket: bool,
}

impl LeaseRecord {
    /// The record of a lease kept in `row`.
    pub fn held_in(row: &BucketState, held: &crate::bucket::HeldLease) -> Self {
        LeaseRecord {
            slot: row.bucket.limit_type().restores_on_release(),
            key: LeaseKey::new(&row.dimension, &held.id),
            dimension: row.dimension.clone(),
            cost: held.cost,
            created_at: held.created_at,
            expires_at: held.expires_at,
            caller: held.caller.clone(),
            in_bucket: true,
        }
    }
}

/// A change to the leases kept in a bucket row ([`BucketState::held`]), part of a
/// [`BucketWrite`] and applied with it, on the same condition plus its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldWrite {
    /// Keep a new lease in the row. Its id must be none of the expected row's: since every
    /// new lease comes with a new version, the write's own condition then guarantees that
    /// the stored row has none with it either (a store may check it as well).
    Add(HeldLease),
    /// Remove a lease, on condition that it is still there (a release that gives its cost
    /// back, a reclaimed lease: exactly once).
    Remove(String),
    /// Remove a lease if it is still there, with no condition (a release that gives
    /// nothing back).
    Forget(String),
    /// Change a lease's cost, on condition that it is still there (an adjustment).
    SetCost {
        /// The lease's id.
        id: String,
        /// The new cost.
        cost: Tokens,
    },
}

impl HeldWrite {
    /// The id of the lease this change touches.
    pub fn id(&self) -> &str {
        match self {
            HeldWrite::Add(h) => &h.id,
            HeldWrite::Remove(id) | HeldWrite::Forget(id) | HeldWrite::SetCost { id, .. } => id,
        }
    }

    /// The condition of this change that `row` fails, if any.
    pub fn failure(&self, row: &BucketState) -> Option<ConditionFailure> {
        let exists = row.held_lease(self.id()).is_some();
        let key = || LeaseKey::new(&row.dimension, self.id());
        match self {
            HeldWrite::Add(_) if exists => Some(ConditionFailure::LeaseExists(key())),
            HeldWrite::Remove(_) | HeldWrite::SetCost { .. } if !exists => {
                Some(ConditionFailure::LeaseMissing(key()))
            }
            _ => None,
        }
    }

    /// Applies this change to `held`.
    pub fn apply(&self, held: &mut Vec<HeldLease>) {
        match self {
            HeldWrite::Add(h) => {
                // Kept in id order, as a store reads them.
                match held.binary_search_by(|x| x.id.cmp(&h.id)) {
                    Ok(i) => held[i] = h.clone(),
                    Err(i) => held.insert(i, h.clone()),
                }
            }
            HeldWrite::Remove(id) | HeldWrite::Forget(id) => held.retain(|x| x.id != *id),
            HeldWrite::SetCost { id, cost } => {
                if let Some(h) = held.iter_mut().find(|h| h.id == *id) {
                    h.cost = *cost;
                }
            }
        }
    }
}

/// One bucket row's part of a [`Commit`]: set the new tokens and refill timestamp, on
/// condition that the stored row is still exactly `expected`, the row the write was
/// computed from. The stored version becomes `expected.version + 1`, and the row's
/// [`write_id`](BucketState::write_id) this write's own.
///
/// What "exactly" means is the store's to check: the in-memory store compares the whole
/// row; DynamoDB compares the version and the write id, or, for a row no sluice write has
/// touched, the version, tokens, refill timestamp and definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketWrite {
    /// The row as the writer saw it.
    pub expected: BucketState,
    /// The new token count.
    pub tokens: Tokens,
    /// The new refill timestamp.
    pub last_refill_at: UnixMillis,
    /// The id this write stamps on the row.
    pub write_id: u64,
    /// Changes to the leases kept in the row, applied with the write.
    pub held: Vec<HeldWrite>,
}

impl BucketWrite {
    /// A write of `tokens` and `last_refill_at` over the row `expected`.
    pub fn new(expected: BucketState, tokens: Tokens, last_refill_at: UnixMillis) -> Self {
        BucketWrite {
            expected,
            tokens,
            last_refill_at,
            write_id: crate::bucket::new_write_id(),
            held: Vec::new(),
        }
    }

    /// This write, also making `changes` to the leases kept in the row.
    pub fn with_held(mut self, changes: Vec<HeldWrite>) -> Self {
        self.held = changes;
        self
    }

    /// The bucket's dimension.
    pub fn dimension(&self) -> &Dimension {
        &self.expected.dimension
    }

    /// The version the row gets, or `None` when the expected one is already at
    /// [`MAX_VERSION`](crate::bucket::MAX_VERSION) (a store refuses such a write).
    pub fn next_version(&self) -> Option<u64> {
        self.expected
            .version
            .checked_add(1)
            .filter(|v| *v <= crate::bucket::MAX_VERSION)
    }

    /// Checks that the row this write leaves is one a store may keep (the definition is the
    /// expected row's): its version, tokens and refill timestamp within bounds.
    pub fn validate(&self) -> Result<(), crate::bucket::BucketError> {
        use crate::bucket::BucketError;
        if self.next_version().is_none() {
            return Err(BucketError::Version(
                self.expected.version.saturating_add(1),
            ));
        }
        if !self.tokens.is_within_bounds() {
            return Err(BucketError::Tokens(self.tokens));
        }
        if !crate::bucket::timestamp_in_range(self.last_refill_at) {
            return Err(BucketError::RefillTimestamp(self.last_refill_at));
        }
        Ok(())
    }

    /// The row as it stands once this write is applied.
    pub fn after(&self) -> BucketState {
        let mut held = self.expected.held.clone();
        for change in &self.held {
            change.apply(&mut held);
        }
        BucketState {
            tokens: self.tokens,
            last_refill_at: self.last_refill_at,
            version: self.expected.version.saturating_add(1),
            write_id: Some(self.write_id),
            held,
            ..self.expected.clone()
        }
    }

    /// The condition `stored` fails for this write, if any: a different row, or a change to
    /// its kept leases whose own condition does not hold.
    pub fn failure(&self, stored: Option<&BucketState>) -> Option<ConditionFailure> {
        match stored {
            Some(row) if row.same_row(&self.expected) => {
                self.held.iter().find_map(|c| c.failure(row))
            }
            current => Some(ConditionFailure::BucketChanged {
                dimension: self.dimension().clone(),
                current: current.cloned().map(Box::new),
            }),
        }
    }
}

/// One lease row's part of a [`Commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseWrite {
    /// Create the row, on condition that it does not exist.
    Create(LeaseRecord),
    /// Delete the row, on condition that it exists.
    Delete(LeaseKey),
    /// Change the row's cost, on condition that it exists.
    SetCost {
        /// The row's key.
        key: LeaseKey,
        /// The new cost.
        cost: Tokens,
    },
}

impl LeaseWrite {
    /// The key of the row this write touches.
    pub fn key(&self) -> &LeaseKey {
        match self {
            LeaseWrite::Create(r) => &r.key,
            LeaseWrite::Delete(k) | LeaseWrite::SetCost { key: k, .. } => k,
        }
    }
}

/// An all-or-nothing set of conditional writes: every condition holds and every write is
/// applied, or nothing changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Commit {
    /// Bucket rows to update.
    pub buckets: Vec<BucketWrite>,
    /// Lease rows to create, delete or change.
    pub leases: Vec<LeaseWrite>,
}

impl Commit {
    /// The number of rows the commit touches.
    pub fn len(&self) -> usize {
        self.buckets.len() + self.leases.len()
    }

    /// Whether the commit touches nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The condition of a [`Commit`] that did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConditionFailure {
    /// The bucket's version changed (another writer won) or the bucket is gone.
    BucketChanged {
        /// The bucket's dimension.
        dimension: Dimension,
        /// The row as it stands now, when the store returns it (`None`: gone, or unknown).
        current: Option<Box<BucketState>>,
    },
    /// A lease row to create already exists.
    LeaseExists(LeaseKey),
    /// A lease row to delete or change no longer exists.
    LeaseMissing(LeaseKey),
}

/// Why a [`Commit`] was not applied.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// A condition did not hold; nothing was written.
    #[error("commit condition failed: {0:?}")]
    Condition(ConditionFailure),
    /// The store refused the write because another transaction on the same rows was in
    /// progress (DynamoDB's `TransactionConflict`); nothing was written, retrying may work.
    #[error("another transaction on the same rows was in progress")]
    TransactionConflict,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Which lease rows to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseFilter {
    /// Only leases on this dimension.
    pub dimension: Option<Dimension>,
    /// Only leases that expired strictly before this time.
    pub expired_before: Option<UnixMillis>,
}

/// The lease rows a scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseScan {
    /// The rows that match the filter.
    pub leases: Vec<LeaseRecord>,
    /// The keys of lease rows the store could not read (written by a foreign or broken
    /// writer): whatever they hold is unknown.
    pub unreadable: Vec<String>,
}

/// A failure of the store itself (as opposed to a condition that did not hold).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The table does not exist.
    #[error(
        "table `{table}` does not exist; create it with `sluice table create` or `DynamoStore::create_table`"
    )]
    TableNotFound {
        /// The table's name.
        table: String,
    },
    /// The store is throttling requests.
    #[error(
        "the store is throttling requests (provisioned throughput or request rate exceeded); retry later"
    )]
    Throttled {
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The store did not answer in time.
    #[error("the store did not answer in time")]
    Timeout {
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// A row exists but cannot be read as a bucket or lease.
    #[error("row `{key}` is not a valid sluice row: {reason}")]
    CorruptRow {
        /// The row's key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store could not be reached.
    #[error("the store could not be reached: {message}")]
    Unavailable {
        /// What happened.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The store answered with an error.
    #[error("the store failed: {message}")]
    Service {
        /// What happened.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
}

impl StoreError {
    /// Whether retrying the same request later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Throttled { .. }
                | StoreError::Timeout { .. }
                | StoreError::Unavailable { .. }
        )
    }
}

impl StoreError {
    /// A failure the store reported in words.
    pub(crate) fn service(message: impl Into<String>) -> StoreError {
        StoreError::Service {
            message: message.into(),
            source: None,
        }
    }

    /// A store that reports a lease missing while creating it is broken.
    pub(crate) fn missing_lease(key: &LeaseKey) -> StoreError {
        StoreError::service(format!(
            "store reported missing lease `{key}` while creating it"
        ))
    }

    /// A bucket row that fails [`BucketState::validate`], naming the attribute.
    pub(crate) fn invalid_bucket(key: &str, error: &crate::bucket::BucketError) -> StoreError {
        StoreError::CorruptRow {
            key: key.to_owned(),
            reason: format!("`{}`: {error}", error.attribute()),
        }
    }

    /// The same error for another waiter: same variant and fields, the underlying source
    /// kept as its message.
    pub(crate) fn clone_lossy(&self) -> StoreError {
        let source = |s: &Option<BoxError>| -> Option<BoxError> {
            s.as_ref()
                .map(|e| Box::new(Message(e.to_string())) as BoxError)
        };
        match self {
            StoreError::TableNotFound { table } => StoreError::TableNotFound {
                table: table.clone(),
            },
            StoreError::Throttled { source: s } => StoreError::Throttled { source: source(s) },
            StoreError::Timeout { source: s } => StoreError::Timeout { source: source(s) },
            StoreError::CorruptRow { key, reason } => StoreError::CorruptRow {
                key: key.clone(),
                reason: reason.clone(),
            },
            StoreError::Unavailable { message, source: s } => StoreError::Unavailable {
                message: message.clone(),
                source: source(s),
            },
            StoreError::Service { message, source: s } => StoreError::Service {
                message: message.clone(),
                source: source(s),
            },
        }
    }
}

/// An error carried as its message.
#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Message {}

/// Where sluice keeps bucket and lease rows.
///
/// Implementations must make [`commit`](Store::commit) atomic and check every condition
/// in it, and must make [`read_buckets`](Store::read_buckets) strongly consistent. The
/// conformance suite in the repository runs against every implementation.
#[async_trait::async_trait]
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Reads bucket rows, strongly consistent; `None` for a dimension without a bucket.
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError>;

    /// Applies all of `commit` atomically, or nothing.
    async fn commit(&self, commit: Commit) -> Result<(), CommitError>;

    /// Deletes lease rows without any condition; keys without a row are skipped.
    ///
    /// Only for leases whose release gives nothing back (`requests` and `tokens` buckets):
    /// the reconciler's own deletion is conditioned on the row existing, so whichever of
    /// the two goes first wins and a lease is never refunded after its release. On DynamoDB
    /// this is `BatchWriteItem`, up to 25 rows per call.
    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError>;

    /// Reads leases by key, whether kept in a row of their own or in their bucket's row;
    /// `None` for a key without a lease.
    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError>;

    /// Lists the leases matching `filter` (lease rows and leases kept in bucket rows), and
    /// the keys of lease rows it cannot read.
    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError>;

    /// The leases holding slots of `dimension` (lease rows marked [`LeaseRecord::slot`],
    /// and the leases the bucket row keeps), earliest expiry first, at most `limit`. For a
    /// short `concurrent` bucket: when a slot comes back for sure, and which leases expired.
    ///
    /// Its cost must not grow with the table (DynamoDB: a query of a sparse secondary
    /// index, so it may lag a just-written or just-deleted lease row by a moment, beside a
    /// read of the bucket row; callers treat the answer as a hint). The default lists
    /// every lease of the dimension and sorts them: stores with an index override it.
    async fn slot_leases(
        &self,
        dimension: &Dimension,
        limit: usize,
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        let mut leases = self
            .list_leases(&LeaseFilter {
                dimension: Some(dimension.clone()),
                expired_before: None,
            })
            .await?;
        leases.retain(|l| l.slot);
        leases.sort_by_key(|l| l.expires_at);
        leases.truncate(limit);
        Ok(leases)
    }

    /// Lists the readable lease rows matching `filter` (a row that cannot be read is
    /// skipped with a warning; [`scan_leases`](Store::scan_leases) names them).
    async fn list_leases(&self, filter: &LeaseFilter) -> Result<Vec<LeaseRecord>, StoreError> {
        let scan = self.scan_leases(filter).await?;
        for key in &scan.unreadable {
            tracing::warn!(%key, "skipping a lease row sluice cannot read");
        }
        Ok(scan.leases)
    }

    /// Writes a whole bucket row, on condition that the stored row is exactly `expected`
    /// (`None`: that the row does not exist; see [`BucketState::same_row`]). Returns
    /// `false` when the condition failed. A row that fails [`BucketState::validate`] is
    /// refused as [`StoreError::CorruptRow`]. The leases kept in an existing row stay as
    /// they are (`state.held` is not written): they still hold their tokens.
    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError>;

    /// Removes leases kept in `dimension`'s bucket row ([`BucketState::held`]) if they are
    /// still there, without any other condition and without a new version: the release of
    /// leases that give nothing back (`requests` and `tokens` buckets), like
    /// [`delete_leases`](Store::delete_leases) for lease rows. A missing bucket or lease is
    /// skipped.
    async fn forget_held(&self, dimension: &Dimension, ids: &[String]) -> Result<(), StoreError>;

    /// Lists every bucket row.
    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError>;

    /// Deletes a bucket row; returns whether it existed.
    async fn delete_bucket(&self, dimension: &Dimension) -> Result<bool, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_keys_carry_dimension_and_unique_suffix() {
        let d = Dimension::new("openai#rpm").unwrap();
        let k = LeaseKey::new(&d, "a3f8c910");
        assert_eq!(k.as_str(), "lease#openai#rpm#a3f8c910");
        assert_eq!(k.unique(), "a3f8c910");
        assert_eq!(LeaseKey::parse("lease#openai#rpm#a3f8c910"), Some(k));
        assert_eq!(LeaseKey::parse("openai#rpm"), None);
        assert_eq!(LeaseKey::parse("lease#openai#a3f8"), None);
    }
}
