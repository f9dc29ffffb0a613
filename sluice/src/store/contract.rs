//! The trait every store implements (exported with the `unstable-store` feature).

use std::fmt;

use crate::bucket::BucketState;
use crate::clock::UnixMillis;
use crate::dimension::Dimension;

use super::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    StoreError,
};

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

    /// Reads lease rows by key; `None` for a key without a row.
    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError>;

    /// Lists the lease rows matching `filter`, and the keys of lease rows it cannot read.
    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError>;

    /// The leases holding slots of `dimension` (lease rows marked [`LeaseRecord::slot`]),
    /// earliest expiry first, at most `limit`. For a
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
    /// refused as [`StoreError::CorruptRow`].
    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError>;

    /// Replaces the rows of one bucket at once (a reshard, see
    /// [`Sluice::reshard`](crate::Sluice::reshard)): on condition that every row in
    /// `expected` is still stored exactly as read and that no row of `rows` outside
    /// `expected` exists, writes every row of `rows` whole and deletes the rows of
    /// `expected` that `rows` does not name; all or nothing. Returns `false` when a
    /// condition failed (or, on DynamoDB, another transaction held a row), with nothing
    /// written.
    ///
    /// Provided: [`respread_buckets`](Store::respread_buckets) with no moves.
    async fn replace_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
    ) -> Result<bool, StoreError> {
        self.respread_buckets(expected, rows, &[]).await
    }

    /// Replaces the rows of one bucket at once as [`replace_buckets`](Store::replace_buckets)
    /// does, except that a row `expected` and `rows` both have, at index `k`, with
    /// `moves[k]` given, is changed by that commuting change rather than conditioned on
    /// being as read: on condition that the stored row still has the definition and count
    /// it was read with and satisfies the change's conditions, its tokens and refill become
    /// what the change makes of them, its definition and count those of `rows[k]`, its
    /// version one more. So a reshard lands on rows that other writers change meanwhile,
    /// keeping what they did. All or nothing; `false` when a condition failed.
    ///
    /// A store may ignore `moves` and condition every row on being as read: also right,
    /// only refused more often.
    async fn respread_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
        moves: &[Option<crate::bucket::Commute>],
    ) -> Result<bool, StoreError>;

    /// Applies `change` to its bucket row when the row satisfies its conditions (see
    /// [`BucketChange`]: [`BucketChange::holds`] and [`BucketChange::applied`] say what,
    /// its shadow ledger's addition and condition included), atomically; returns the row
    /// as the change left it. A failed
    /// condition returns the row as it stands ([`ChangeError::Condition`]). A change that
    /// would leave the row beyond its bounds is refused as [`StoreError::CorruptRow`].
    ///
    /// The store must not send a change twice on its own: a change adds to the row, and
    /// a resend after an answer that was lost could apply it twice. An answer that is
    /// lost is an error that [may have applied](StoreError::may_have_applied).
    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError>;

    /// Writes new lease rows, without conditions (their keys are new). On DynamoDB this is
    /// `BatchWriteItem`, up to 25 rows per call.
    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError>;

    /// Deletes the lease row `key` if it exists and, with `expiring_at`, if it still expires
    /// then (a reclaim of an expired lease, which loses to its holder's renewal: see
    /// [`renew_lease`](Store::renew_lease)); whether this call deleted it. Whoever deletes
    /// a lease row gives its cost back (once: the delete is conditioned on the row
    /// existing). Never sent twice by the store: a failure whose answer was lost [may have
    /// deleted it](StoreError::may_have_applied).
    async fn end_lease(
        &self,
        key: &LeaseKey,
        expiring_at: Option<UnixMillis>,
    ) -> Result<bool, StoreError>;

    /// Moves the expiry of the lease row `key` from `from` to `to` (a holder's heartbeat:
    /// its slot stays its own while it lives), on condition that the row exists and
    /// expires at `from` or already at `to` (a resend of a renewal whose answer was lost
    /// applies nothing twice). False: the row is gone or was changed (the lease was
    /// ended or reclaimed), and its holder no longer holds it.
    async fn renew_lease(
        &self,
        key: &LeaseKey,
        from: UnixMillis,
        to: UnixMillis,
    ) -> Result<bool, StoreError>;

    /// Counts `weight` more callers waiting for a slot of `dimension`'s bucket in `epoch`
    /// and forgets the counts of the epochs `forget` (see
    /// [`Waiting`](super::Waiting)), changing nothing else in the row: not its
    /// version nor its write id, so that it never fails another writer's condition. The
    /// row as it stands after, or `None` when there is no bucket (none is created). A
    /// count is an estimate: one lost, or applied twice, only spaces the waiting callers'
    /// looks a little differently.
    ///
    /// The default counts nothing and reads the row: the waiting callers then look at the
    /// slot poll interval, however many wait.
    async fn count_waiting(
        &self,
        dimension: &Dimension,
        epoch: u64,
        weight: u64,
        forget: &[u64],
    ) -> Result<Option<BucketState>, StoreError> {
        let _ = (epoch, weight, forget);
        let mut rows = self.read_buckets(std::slice::from_ref(dimension)).await?;
        Ok(rows.pop().flatten())
    }

    /// The most writes a second one row takes, if the store bounds it: then a client
    /// spreads a bucket whose rows near it over more rows (see
    /// [`Sharding`](crate::Sharding)). DynamoDB: 1,000 (write units per item); none by
    /// default.
    fn item_write_ceiling(&self) -> Option<u32> {
        None
    }

    /// Whether the store may lose the answer to a write that applied (a network store):
    /// then the client reads the row after such a failure to learn whether it applied.
    fn loses_answers(&self) -> bool {
        true
    }

    /// Lists every bucket row.
    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError>;

    /// Deletes a bucket row; returns whether it existed.
    async fn delete_bucket(&self, dimension: &Dimension) -> Result<bool, StoreError>;

    /// Deletes the bucket row `expected` if it is still exactly that row (compared as
    /// [`put_bucket`](Self::put_bucket) compares its expected row); whether it did. The
    /// reconciler removes idle keys' rows so. A store that cannot compare and delete keeps
    /// the row (the default): a full row kept costs only its storage.
    async fn delete_bucket_as(&self, expected: &BucketState) -> Result<bool, StoreError> {
        let _ = expected;
        Ok(false)
    }

    /// Where the rows are, in words for error messages: which table, or that they are in
    /// this process's memory.
    fn describe(&self) -> String {
        format!("the store `{}`", std::any::type_name::<Self>())
    }
}
