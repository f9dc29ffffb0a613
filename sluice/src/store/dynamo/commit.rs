//! Conditional writes: a [`Commit`] touching one row is a single conditional write, one
//! touching several a `TransactWriteItems`. Both are built from the same descriptions of
//! each write, and their failures map to the same [`ConditionFailure`]s.

use std::future::Future;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    CancellationReason, Delete, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};

use super::billed::Billed;
use super::billed::TOTAL;
use super::error::{Cancelled, cancelled};
use super::parts::Conditional;
use super::row::{self, Item};
use super::{DynamoStore, EXISTS, NOT_EXISTS, Unanswered, Units, build_error};
use crate::bucket::WriteOutcome;
use crate::store::{BucketWrite, Commit, CommitError, ConditionFailure, LeaseWrite, StoreError};

const BUCKET_UPDATE: &str = "SET #t = :tokens, #l = :last, #v = :next, #w = :wid, #rw = :rw";
const SET_COST: &str = "SET #cost = :cost";

/// Sets a write's parts on an SDK builder. A single-item call (`UpdateItem`, `PutItem`,
/// `DeleteItem`) and a transaction's item (`Update`, `Put`, `Delete`) have the same setters
/// but no common type: each write is described once, here.
macro_rules! bucket_update {
    ($builder:expr, $table:expr, $u:expr) => {
        conditional!($builder, $table, $u)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
    };
}

/// See [`bucket_update`]: a new lease row, which must not exist yet.
macro_rules! lease_create {
    ($builder:expr, $table:expr, $record:expr) => {
        $builder
            .table_name($table)
            .set_item(Some(row::lease_item($record)))
            .condition_expression(NOT_EXISTS)
    };
}

/// See [`bucket_update`]: a lease row's new cost, on condition that it still exists.
macro_rules! lease_set_cost {
    ($builder:expr, $table:expr, $key:expr, $cost:expr) => {
        $builder
            .table_name($table)
            .set_key(Some(row::key($key.as_str())))
            .update_expression(SET_COST)
            .condition_expression(EXISTS)
            .expression_attribute_names("#cost", row::COST)
            .expression_attribute_values(":cost", row::n($cost))
    };
}

/// The condition a lease write failed on, whichever way it was sent.
fn lease_failure(w: &LeaseWrite) -> ConditionFailure {
    match w {
        LeaseWrite::Create(r) => ConditionFailure::LeaseExists(r.key.clone()),
        LeaseWrite::Delete(k) | LeaseWrite::SetCost { key: k, .. } => {
            ConditionFailure::LeaseMissing(k.clone())
        }
    }
}

impl DynamoStore {
    /// The parts of a bucket write's `UpdateItem`: key, update, condition (the stored row
    /// is exactly the expected one), names and values. A write whose row would not be
    /// valid is refused before anything is sent.
    fn bucket_update(w: &BucketWrite) -> Result<Conditional, StoreError> {
        let key = w.dimension().as_str();
        StoreError::check_write(w)?;
        let (condition, mut values, mut names) = row::same_row(&w.expected);
        names.insert("#t".to_owned(), row::TOKENS.to_owned());
        names.insert("#l".to_owned(), row::LAST_REFILL_AT.to_owned());
        names.insert("#v".to_owned(), row::VERSION.to_owned());
        names.insert("#w".to_owned(), row::WRITE_ID.to_owned());
        values.insert(":tokens".to_owned(), row::n(w.tokens));
        values.insert(":last".to_owned(), row::n(w.last_refill_at));
        values.insert(":next".to_owned(), row::n(w.expected.version + 1));
        values.insert(":wid".to_owned(), row::write_id(w.write_id));
        names.insert("#rw".to_owned(), row::RECENT_WRITES.to_owned());
        values.insert(
            ":rw".to_owned(),
            row::recent_writes(&w.expected.recent_after(w.write_id, w.written_at)),
        );
        let mut update = BUCKET_UPDATE.to_owned();
        let mut removes = Vec::new();
        match row::carry_value(w.refill_carry, w.last_refill_at) {
            Some(carry) => {
                names.insert("#rc".to_owned(), row::REFILL_CARRY.to_owned());
                update.push_str(", #rc = :rc");
                values.insert(":rc".to_owned(), carry);
            }
            None if !w.expected.refill_carry.is_zero() => {
                names.insert("#rc".to_owned(), row::REFILL_CARRY.to_owned());
                removes.push("#rc".to_owned());
            }
            None => {}
        }
        if w.expected.herd_at.is_some() {
            names.insert("#h".to_owned(), row::HERD_AT.to_owned());
            removes.push("#h".to_owned());
        }
        if w.burst != w.expected.burst {
            names.insert("#b".to_owned(), row::BURST.to_owned());
            match w.burst {
                Some(burst) => {
                    update.push_str(", #b = :burst");
                    values.insert(":burst".to_owned(), row::n(burst));
                }
                None => removes.push("#b".to_owned()),
            }
        }
        if w.shadow != w.expected.shadow {
            names.insert("#so".to_owned(), row::SHADOW_OWED.to_owned());
            names.insert("#sr".to_owned(), row::SHADOW_REFUSED.to_owned());
            let attributes = row::ledger_attributes(&w.shadow);
            if attributes.is_empty() {
                removes.extend(["#so".to_owned(), "#sr".to_owned()]);
            }
            for (name, value) in attributes {
                let (alias, placeholder) = if name == row::SHADOW_OWED {
                    ("#so", ":so")
                } else {
                    ("#sr", ":sr")
                };
                update.push_str(&format!(", {alias} = {placeholder}"));
                values.insert(placeholder.to_owned(), value);
            }
        }
        if !removes.is_empty() {
            update.push_str(" REMOVE ");
            update.push_str(&removes.join(", "));
        }
        Ok(Conditional::new(key, update, (condition, values, names)))
    }

    /// Why `w`'s condition failed, from the row as it stood (`old`): another row.
    fn changed(&self, w: &BucketWrite, old: Option<&Item>) -> ConditionFailure {
        let current = old.and_then(|item| row::bucket_state(item).ok());
        w.failure(current.as_ref())
            .unwrap_or_else(|| ConditionFailure::BucketChanged {
                dimension: w.dimension().clone(),
                current: current.map(Box::new),
            })
    }

    pub(super) async fn commit_writes(&self, mut commit: Commit) -> Result<(), CommitError> {
        match (commit.buckets.len(), commit.leases.len()) {
            (0, 0) => Ok(()),
            (1, 0) => self.commit_one_bucket(commit.buckets.remove(0)).await,
            (0, 1) => self.commit_one_lease(commit.leases.remove(0)).await,
            _ => self.commit_transaction(commit).await,
        }
    }

    async fn commit_one_bucket(&self, w: BucketWrite) -> Result<(), CommitError> {
        let u = Self::bucket_update(&w)?;
        let unanswered = Unanswered::default();
        let request = bucket_update!(self.client.update_item(), self.table.as_ref(), u)
            .return_consumed_capacity(TOTAL)
            .customize()
            .interceptor(unanswered.clone())
            .send();
        let Err(e) = self.billed(Units::Write, request).await else {
            return Ok(());
        };
        match e.as_service_error() {
            Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                self.condition_failed(&w, c.item(), unanswered.happened())
            }
            _ => Err(self.single_item_error(e, None)),
        }
    }

    /// A single bucket write whose condition failed. When the SDK resent it after an
    /// attempt whose answer was lost (`resent`), the first may have applied: the row tells
    /// (a lease the write added or changed, its recent write ids), even when other writers
    /// moved it on since, unless the write changed no lease and they moved it too far
    /// ([`StoreError::OutcomeUnknown`]). A write id is new for every write, so only the
    /// write itself can be among the recent ones.
    fn condition_failed(
        &self,
        w: &BucketWrite,
        item: Option<&Item>,
        resent: bool,
    ) -> Result<(), CommitError> {
        let current = item.and_then(|item| row::bucket_state(item).ok());
        if let Some(row) = &current {
            if row.wrote(w.write_id) {
                tracing::debug!(dimension = %w.dimension(), "a resent write had applied");
                return Ok(());
            }
            match w.probe().outcome(row) {
                WriteOutcome::Applied if resent => {
                    tracing::debug!(dimension = %w.dimension(), "a resent write had applied");
                    return Ok(());
                }
                WriteOutcome::Unknown if resent => {
                    tracing::warn!(dimension = %w.dimension(), "a resent write's outcome is unknown");
                    return Err(StoreError::OutcomeUnknown {
                        dimension: w.dimension().to_string(),
                    }
                    .into());
                }
                _ => {}
            }
        }
        Err(CommitError::Condition(self.changed(w, item)))
    }

    /// A single-item write's failure other than its bucket's condition: `failure` when
    /// the condition did not hold, a transaction conflict, or the store's error.
    fn single_item_error<E, R>(
        &self,
        e: SdkError<E, R>,
        failure: Option<ConditionFailure>,
    ) -> CommitError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        match (e.code(), failure) {
            (Some("ConditionalCheckFailedException"), Some(failure)) => {
                CommitError::Condition(failure)
            }
            (Some("TransactionConflictException"), _) => CommitError::TransactionConflict,
            _ => self.err(e).into(),
        }
    }

    async fn commit_one_lease(&self, w: LeaseWrite) -> Result<(), CommitError> {
        let table = self.table.as_ref();
        match &w {
            LeaseWrite::Create(record) => {
                let put = lease_create!(self.client.put_item(), table, record);
                self.lease_write(&w, put.return_consumed_capacity(TOTAL).send())
                    .await
            }
            LeaseWrite::Delete(key) => {
                let delete = lease_delete!(self.client.delete_item(), table, key);
                self.lease_write(&w, delete.return_consumed_capacity(TOTAL).send())
                    .await
            }
            LeaseWrite::SetCost { key, cost } => {
                let update = lease_set_cost!(self.client.update_item(), table, key, cost);
                self.lease_write(&w, update.return_consumed_capacity(TOTAL).send())
                    .await
            }
        }
    }

    /// Sends the single write of lease `w`.
    async fn lease_write<O: Billed, E, R>(
        &self,
        w: &LeaseWrite,
        request: impl Future<Output = Result<O, SdkError<E, R>>>,
    ) -> Result<(), CommitError>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        match self.billed(Units::Write, request).await {
            Ok(_) => Ok(()),
            Err(e) => Err(self.single_item_error(e, Some(lease_failure(w)))),
        }
    }

    /// The transaction item of a bucket write.
    fn bucket_item(&self, w: &BucketWrite) -> Result<TransactWriteItem, StoreError> {
        let u = Self::bucket_update(w)?;
        let update = bucket_update!(Update::builder(), self.table.as_ref(), u)
            .build()
            .map_err(build_error)?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// The transaction item of a lease write.
    fn lease_item(&self, w: &LeaseWrite) -> Result<TransactWriteItem, StoreError> {
        let table = self.table.as_ref();
        let item = TransactWriteItem::builder();
        Ok(match w {
            LeaseWrite::Create(record) => item.put(
                lease_create!(Put::builder(), table, record)
                    .build()
                    .map_err(build_error)?,
            ),
            LeaseWrite::Delete(key) => item.delete(
                lease_delete!(Delete::builder(), table, key)
                    .build()
                    .map_err(build_error)?,
            ),
            LeaseWrite::SetCost { key, cost } => item.update(
                lease_set_cost!(Update::builder(), table, key, cost)
                    .build()
                    .map_err(build_error)?,
            ),
        }
        .build())
    }

    async fn commit_transaction(&self, commit: Commit) -> Result<(), CommitError> {
        let mut items = Vec::with_capacity(commit.len());
        for w in &commit.buckets {
            items.push(self.bucket_item(w)?);
        }
        for w in &commit.leases {
            items.push(self.lease_item(w)?);
        }
        let Err(e) = self.transact(items, request_token()).await else {
            return Ok(());
        };
        let reasons = match e.as_service_error() {
            Some(TransactWriteItemsError::TransactionCanceledException(c)) => {
                c.cancellation_reasons().to_vec()
            }
            Some(TransactWriteItemsError::TransactionInProgressException(_)) => {
                return Err(CommitError::TransactionConflict);
            }
            _ => return Err(self.err(e).into()),
        };
        Err(self.cancelled(&commit, &reasons, e))
    }

    /// Why a transaction was cancelled, from its reasons.
    fn cancelled(
        &self,
        commit: &Commit,
        reasons: &[CancellationReason],
        e: SdkError<TransactWriteItemsError, aws_sdk_dynamodb::config::http::HttpResponse>,
    ) -> CommitError {
        match cancelled(reasons) {
            Cancelled::Condition(i) if i < commit.buckets.len() => {
                CommitError::Condition(self.changed(&commit.buckets[i], reasons[i].item()))
            }
            Cancelled::Condition(i) => match commit.leases.get(i - commit.buckets.len()) {
                Some(lease) => CommitError::Condition(lease_failure(lease)),
                None => StoreError::service(format!(
                    "transaction cancelled on item {i}, beyond the {} sent",
                    commit.len()
                ))
                .into(),
            },
            Cancelled::Conflict => CommitError::TransactionConflict,
            Cancelled::Throttled => StoreError::Throttled {
                source: Some(Box::new(e)),
            }
            .into(),
            Cancelled::Other(why) => StoreError::Service {
                message: format!("transaction cancelled: {why}"),
                source: Some(Box::new(e)),
            }
            .into(),
        }
    }
}

/// The idempotency token of one transaction call: random, and reused by the SDK for every
/// resend of that call. When a transaction committed but its answer was lost, DynamoDB
/// recognises the resent token and reports success instead of a failed condition, so the
/// caller never takes tokens twice or leaves an orphan lease row. Another caller (or a
/// later call) committing the same content gets a token of its own, so DynamoDB never
/// mistakes it for a resend: two reconcilers racing on one lease are told apart.
fn request_token() -> String {
    crate::ids::new_unique()
}
