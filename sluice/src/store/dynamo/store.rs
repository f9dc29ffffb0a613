//! The [`Store`] over one DynamoDB table: each operation's DynamoDB calls.

use super::billed::{TOTAL, Units};
use super::define::{Refused, wrote};
use super::{DynamoStore, error, reshard, row};
use crate::bucket::BucketState;
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::role::{self, Role};
use crate::store::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    Store, StoreError,
};

#[async_trait::async_trait]
impl Store for DynamoStore {
    fn describe(&self) -> String {
        format!("DynamoDB table `{}`", self.table())
    }

    fn item_write_ceiling(&self) -> Option<u32> {
        Some(1_000)
    }

    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        if let [only] = dimensions {
            let request = self
                .client
                .get_item()
                .table_name(self.table.as_ref())
                .set_key(Some(row::key(only.as_str())))
                .consistent_read(true)
                .return_consumed_capacity(TOTAL)
                .send();
            let out = self.answer(Units::Read, request).await?;
            return Ok(vec![out.item().map(row::bucket_state).transpose()?]);
        }
        let found = self
            .batch_get(dimensions.iter().map(Dimension::as_str))
            .await?;
        dimensions
            .iter()
            .map(|d| found.get(d.as_str()).map(row::bucket_state).transpose())
            .collect()
    }

    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        self.commit_writes(commit).await
    }

    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        self.delete_lease_rows(keys).await
    }

    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        self.read_lease_rows(keys).await
    }

    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        self.change_row(change).await
    }

    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        self.put_lease_rows(leases).await
    }

    async fn end_lease(
        &self,
        key: &LeaseKey,
        expiring_at: Option<UnixMillis>,
    ) -> Result<bool, StoreError> {
        self.end_lease_row(key, expiring_at).await
    }

    async fn count_waiting(
        &self,
        dimension: &Dimension,
        epoch: u64,
        weight: u64,
        forget: &[u64],
    ) -> Result<Option<BucketState>, StoreError> {
        self.count_waiting_row(dimension, epoch, weight, forget)
            .await
    }

    async fn renew_lease(
        &self,
        key: &LeaseKey,
        from: UnixMillis,
        to: UnixMillis,
    ) -> Result<bool, StoreError> {
        self.renew_lease_row(key, from, to).await
    }

    // A query of the sparse index [`row::SLOTS_INDEX`]: one page of at most `limit` slot
    // lease rows of `dimension`, earliest expiry first, whatever else the table holds: the
    // first `limit` of each of the dimension's index keys ([`row::SLOT_KEYS`], asked at
    // once), merged. The index is eventually consistent (a lease row written or deleted a
    // moment ago may be missing or still listed): callers use the answer as a hint and
    // condition every write on the rows themselves. A table without the index (created by
    // another tool) answers no lease row, with a warning saying how to add it, and is
    // asked again a minute later.
    async fn slot_leases(
        &self,
        dimension: &Dimension,
        limit: usize,
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        if self.slots_index_missing() {
            return Ok(Vec::new());
        }
        let limit = limit.clamp(1, 1_000);
        let query = |k| {
            let query = self
                .client
                .query()
                .table_name(self.table.as_ref())
                .index_name(row::SLOTS_INDEX)
                .key_condition_expression("#d = :d")
                .expression_attribute_names("#d", row::SLOT_DIMENSION)
                .expression_attribute_values(
                    ":d",
                    row::s(row::slot_index_key(dimension.as_str(), k)),
                )
                .scan_index_forward(true)
                .limit(i32::try_from(limit).unwrap_or(1_000))
                .return_consumed_capacity(TOTAL)
                .send();
            self.billed(Units::Read, query)
        };
        let pages = futures::future::try_join_all((0..row::SLOT_KEYS).map(query)).await;
        let pages = match pages {
            Ok(pages) => pages,
            Err(e) => {
                use aws_sdk_dynamodb::error::ProvideErrorMetadata as _;
                // A query of an index still being built fails on DynamoDB Local with an
                // internal failure: the index's status says whether that is the cause.
                let unbuilt = error::is_missing_index(&e)
                    || (matches!(e.code(), Some("InternalFailure" | "InternalServerError"))
                        && self.slots_index_building().await?);
                if unbuilt {
                    tracing::debug!(error = %e, "the slots index cannot be queried (yet)");
                    self.note_slots_index_missing();
                    return Ok(Vec::new());
                }
                return Err(self.err(e));
            }
        };
        let mut leases = Vec::with_capacity(limit);
        for item in pages.iter().flat_map(|out| out.items()) {
            match row::lease_record(item) {
                Ok(lease) if lease.dimension == *dimension => leases.push(lease),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "a slot lease row sluice cannot read"),
            }
        }
        leases.sort_by_key(|l| l.expires_at);
        leases.truncate(limit);
        Ok(leases)
    }

    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError> {
        // Table-wide scans are the reconciler's (and the operator's, who scopes its own).
        role::within(Role::Reconciler, self.scan_lease_rows(filter)).await
    }

    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError> {
        // Writes `state` over `expected` (`None`: a row that must not exist yet).
        let define = async {
            StoreError::check_row(state)?;
            // The row remembers the write that defines it, so that a resend recognises it.
            let recent_writes = match state.write_id {
                Some(id) if !state.wrote(id) => state.recent_after(id, state.last_refill_at),
                _ => state.recent_writes.clone(),
            };
            let item = row::bucket_item(&BucketState {
                recent_writes,
                ..state.clone()
            });
            let sent = match expected {
                None => self.create(item).await,
                Some(expected) => self.redefine(state, expected, item).await,
            };
            match sent {
                Ok(()) => Ok(true),
                // A resend of a write that had applied finds the row it wrote.
                Err(Refused::Condition(Some(item))) if wrote(&item, state.write_id) => Ok(true),
                Err(Refused::Condition(_)) => Ok(false),
                Err(Refused::Store(e)) => Err(e),
            }
        };
        role::within(Role::Operator, define).await
    }

    async fn respread_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
        moves: &[Option<crate::bucket::Commute>],
    ) -> Result<bool, StoreError> {
        let items = reshard::items(self.table.as_ref(), expected, rows, moves)?;
        let sent = self.transact(items, crate::ids::new_unique()).await;
        self.resharded(sent)
    }

    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError> {
        role::within(Role::Operator, self.bucket_rows()).await
    }

    async fn delete_bucket(&self, dimension: &Dimension) -> Result<bool, StoreError> {
        role::within(Role::Operator, self.delete_bucket_row(dimension)).await
    }

    async fn delete_bucket_as(&self, expected: &BucketState) -> Result<bool, StoreError> {
        self.delete_bucket_row_as(expected).await
    }
}
