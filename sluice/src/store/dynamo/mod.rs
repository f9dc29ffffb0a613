//! The DynamoDB store: the seed's schema and protocol over `aws-sdk-dynamodb`.

mod error;
mod row;

pub use row::{SLOTS_INDEX, TTL_GRACE_SECS};
mod table;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConsumedCapacity, Delete, DeleteRequest, KeysAndAttributes, Put,
    ReturnConsumedCapacity, ReturnValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
    Update, WriteRequest,
};

use self::error::{Cancelled, cancelled, store_error};
use self::row::Item;
use super::{
    BucketWrite, Commit, CommitError, ConditionFailure, HeldWrite, LeaseFilter, LeaseKey,
    LeaseRecord, LeaseScan, LeaseWrite, Store, StoreError,
};
use crate::bucket::BucketState;
use crate::config::Config;
use crate::dimension::{Dimension, LEASE_PREFIX};

/// BatchGetItem reads at most 100 keys per request.
const BATCH_GET_MAX: usize = 100;
/// `BatchWriteItem` takes at most 25 requests.
const BATCH_WRITE_MAX: usize = 25;
/// Rounds of `UnprocessedItems` resent (with backoff) before a batch delete is reported
/// as throttled.
const BATCH_WRITE_ROUNDS: u32 = 8;

/// Kept leases removed by one `UpdateItem` of [`Store::forget_held`].
const FORGET_MAX: usize = 100;

const BUCKET_UPDATE: &str = "SET #t = :tokens, #l = :last, #v = :next, #w = :wid";
const EXISTS: &str = "attribute_exists(vendor_dimension)";
const NOT_EXISTS: &str = "attribute_not_exists(vendor_dimension)";

/// Buckets and leases in one DynamoDB table, in the schema the seed defines, so that
/// sluice shares the table with other SDKs that follow it.
///
/// Every operation maps to one DynamoDB call: bucket reads are strongly consistent
/// `GetItem`/`BatchGetItem`; a [`Commit`] touching one row is a single conditional write,
/// and one touching several is a `TransactWriteItems` with a condition per item.
///
/// ```no_run
/// use sluice::{DynamoStore, Sluice};
///
/// # async fn run() -> Result<(), sluice::Error> {
/// let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
/// let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&aws), "vendor-buckets-prod");
/// store.create_table().await?;
/// let sluice = Sluice::builder().store(store).build()?;
/// # let _ = sluice; Ok(()) }
/// ```
#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    table: Arc<str>,
    stats: Arc<Counters>,
}

impl fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Counters {
    calls: AtomicU64,
    read_milliunits: AtomicU64,
    write_milliunits: AtomicU64,
    transaction_write_milliunits: AtomicU64,
    /// Until when the table is known to lack the slots index.
    slots_index_missing_until: std::sync::Mutex<Option<std::time::Instant>>,
}

/// DynamoDB calls made by a [`DynamoStore`] and the capacity units DynamoDB reported for
/// them (`ReturnConsumedCapacity`), since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DynamoStats {
    /// Requests sent.
    pub calls: u64,
    /// Read capacity units consumed, in thousandths.
    pub read_milliunits: u64,
    /// Write capacity units consumed, in thousandths.
    pub write_milliunits: u64,
    /// The part of `write_milliunits` consumed by transactions. DynamoDB Local reports one
    /// unit per transactional item where real DynamoDB charges two: add this to
    /// `write_milliunits` for what real DynamoDB would bill.
    pub transaction_write_milliunits: u64,
}

impl DynamoStore {
    /// A store on `table` through `client`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        DynamoStore {
            client,
            table: Arc::from(table.into()),
            stats: Arc::default(),
        }
    }

    /// A store on `config.table_name`, with credentials and region from the standard AWS
    /// chain and `config.endpoint_url` as the endpoint override (a local DynamoDB gets the
    /// region `us-east-1` when none is configured).
    pub async fn from_config(config: &Config) -> Result<Self, crate::ConfigError> {
        let table = config
            .table_name
            .clone()
            .ok_or(crate::ConfigError::Invalid {
                variable: "SLUICE_TABLE_NAME",
                value: String::new(),
                reason: "a DynamoDB table name is required",
            })?;
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(url) = &config.endpoint_url {
            let region = aws_config::meta::region::RegionProviderChain::default_provider()
                .or_else(aws_config::Region::new("us-east-1"));
            loader = loader.endpoint_url(url).region(region);
        }
        let aws = loader.load().await;
        Ok(DynamoStore::new(Client::new(&aws), table))
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The underlying DynamoDB client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Calls made and capacity consumed so far.
    pub fn stats(&self) -> DynamoStats {
        DynamoStats {
            calls: self.stats.calls.load(Ordering::Relaxed),
            read_milliunits: self.stats.read_milliunits.load(Ordering::Relaxed),
            write_milliunits: self.stats.write_milliunits.load(Ordering::Relaxed),
            transaction_write_milliunits: self
                .stats
                .transaction_write_milliunits
                .load(Ordering::Relaxed),
        }
    }

    fn slots_index_missing(&self) -> bool {
        let until = self
            .stats
            .slots_index_missing_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        until.is_some_and(|t| std::time::Instant::now() < t)
    }

    fn note_slots_index_missing(&self) {
        let mut until = self
            .stats
            .slots_index_missing_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if until.is_none() {
            tracing::warn!(
                table = %self.table,
                index = row::SLOTS_INDEX,
                "the table has no slots index (yet): a short `concurrent` bucket cannot find its \
                 leases, so its RetryIn is the slot poll interval and expired slots wait for the \
                 reconciler; add the index with `sluice table create` or `DynamoStore::create_table`"
            );
        }
        *until = Some(std::time::Instant::now() + std::time::Duration::from_secs(60));
    }

    /// Whether the table's slots index is missing or not active yet.
    async fn slots_index_building(&self) -> Result<bool, StoreError> {
        self.count_call();
        let out = self
            .client
            .describe_table()
            .table_name(self.table.as_ref())
            .send()
            .await
            .map_err(|e| self.err(e))?;
        let active = out
            .table()
            .map(|t| t.global_secondary_indexes())
            .unwrap_or_default()
            .iter()
            .any(|i| {
                i.index_name() == Some(row::SLOTS_INDEX)
                    && i.index_status() == Some(&aws_sdk_dynamodb::types::IndexStatus::Active)
            });
        Ok(!active)
    }

    fn count_call(&self) {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
    }

    fn count_capacity<'a>(
        &self,
        units: Units,
        consumed: impl IntoIterator<Item = &'a ConsumedCapacity>,
    ) {
        let total: u64 = consumed.into_iter().map(capacity_milliunits).sum();
        let counter = match units {
            Units::Read => &self.stats.read_milliunits,
            Units::Write => &self.stats.write_milliunits,
            Units::TransactionWrite => &self.stats.transaction_write_milliunits,
        };
        counter.fetch_add(total, Ordering::Relaxed);
    }

    fn err<E, R>(&self, e: aws_sdk_dynamodb::error::SdkError<E, R>) -> StoreError
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata
            + std::error::Error
            + Send
            + Sync
            + 'static,
        R: fmt::Debug + Send + Sync + 'static,
    {
        store_error(e, &self.table)
    }

    async fn batch_get(&self, keys: Vec<String>) -> Result<HashMap<String, Item>, StoreError> {
        let mut found = HashMap::with_capacity(keys.len());
        for chunk in keys.chunks(BATCH_GET_MAX) {
            let mut pending = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(chunk.iter().map(|k| row::key(k)).collect()))
                    .consistent_read(true)
                    .build()
                    .map_err(build_error)?,
            );
            while let Some(request) = pending.take() {
                self.count_call();
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(self.table.as_ref(), request)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await
                    .map_err(|e| self.err(e))?;
                self.count_capacity(Units::Read, out.consumed_capacity());
                for item in out
                    .responses()
                    .and_then(|r| r.get(self.table.as_ref()))
                    .into_iter()
                    .flatten()
                {
                    if let Some(AttributeValue::S(k)) = item.get(row::KEY) {
                        found.insert(k.clone(), item.clone());
                    }
                }
                pending = out
                    .unprocessed_keys()
                    .and_then(|u| u.get(self.table.as_ref()))
                    .filter(|k| !k.keys().is_empty())
                    .cloned();
            }
        }
        Ok(found)
    }

    async fn scan(
        &self,
        filter: &str,
        values: HashMap<String, AttributeValue>,
        names: HashMap<String, String>,
    ) -> Result<Vec<Item>, StoreError> {
        let mut items = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            self.count_call();
            let out = self
                .client
                .scan()
                .table_name(self.table.as_ref())
                .consistent_read(true)
                .filter_expression(filter)
                .set_expression_attribute_values(Some(values.clone()))
                .set_expression_attribute_names((!names.is_empty()).then(|| names.clone()))
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(|e| self.err(e))?;
            self.count_capacity(Units::Read, out.consumed_capacity());
            items.extend(out.items().iter().cloned());
            match out.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => return Ok(items),
            }
        }
    }

    /// The parts of a bucket write's `UpdateItem`: key, update, condition (the stored row
    /// is exactly the expected one), names and values. A write whose row would not be
    /// valid is refused before anything is sent.
    fn bucket_update(w: &BucketWrite) -> Result<BucketUpdate, StoreError> {
        let key = w.dimension().as_str();
        w.validate()
            .map_err(|e| StoreError::invalid_bucket(key, &e))?;
        let next = w.expected.version + 1;
        let (mut condition, mut values, mut names) = row::same_row(&w.expected);
        names.insert("#t".to_owned(), row::TOKENS.to_owned());
        names.insert("#l".to_owned(), row::LAST_REFILL_AT.to_owned());
        names.insert("#v".to_owned(), row::VERSION.to_owned());
        names.insert("#w".to_owned(), row::WRITE_ID.to_owned());
        values.insert(":tokens".to_owned(), row::n(w.tokens));
        values.insert(":last".to_owned(), row::n(w.last_refill_at));
        values.insert(":next".to_owned(), row::n(next));
        values.insert(":wid".to_owned(), row::write_id(w.write_id));
        let mut update = BUCKET_UPDATE.to_owned();
        let mut removes = Vec::new();
        for (i, change) in w.held.iter().enumerate() {
            let name = format!("#h{i}");
            names.insert(name.clone(), row::held_name(change.id()));
            match change {
                // No condition of its own: the row is exactly the one the write was computed
                // from (adds always come with a new version), and the id is none of its.
                HeldWrite::Add(h) => {
                    update.push_str(&format!(", {name} = :h{i}"));
                    values.insert(format!(":h{i}"), row::held_value(h));
                }
                HeldWrite::Remove(_) => {
                    removes.push(name.clone());
                    condition.push_str(&format!(" AND attribute_exists({name})"));
                }
                HeldWrite::Forget(_) => removes.push(name),
                HeldWrite::SetCost { cost, .. } => {
                    update.push_str(&format!(", {name}[0] = :h{i}"));
                    values.insert(format!(":h{i}"), row::n(cost));
                    condition.push_str(&format!(" AND attribute_exists({name})"));
                }
            }
        }
        if !removes.is_empty() {
            update.push_str(" REMOVE ");
            update.push_str(&removes.join(", "));
        }
        Ok(BucketUpdate {
            key: row::key(key),
            update,
            condition,
            names,
            values,
        })
    }

    /// Why `w`'s condition failed, from the row as it stood (`old`): another row, or a kept
    /// lease that was not as the write expected.
    fn changed(&self, w: &BucketWrite, old: Option<&Item>) -> ConditionFailure {
        let current = old.and_then(|item| row::bucket_state(item).ok());
        w.failure(current.as_ref())
            .unwrap_or_else(|| ConditionFailure::BucketChanged {
                dimension: w.dimension().clone(),
                current: current.map(Box::new),
            })
    }

    async fn commit_one_bucket(&self, w: BucketWrite) -> Result<(), CommitError> {
        let BucketUpdate {
            key,
            update,
            condition,
            names,
            values,
        } = Self::bucket_update(&w)?;
        self.count_call();
        let result = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(key))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match result {
            Ok(out) => {
                self.count_capacity(Units::Write, out.consumed_capacity());
                Ok(())
            }
            Err(e) => match e.as_service_error() {
                // The SDK resent this write after losing the answer to one that applied:
                // the row the condition found is the one this write produced.
                Some(UpdateItemError::ConditionalCheckFailedException(c))
                    if c.item().is_some_and(|item| is_own_write(item, &w.after())) =>
                {
                    tracing::debug!(dimension = %w.dimension(), "a resent write had applied");
                    Ok(())
                }
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                    Err(CommitError::Condition(self.changed(&w, c.item())))
                }
                Some(UpdateItemError::TransactionConflictException(_)) => {
                    Err(CommitError::TransactionConflict)
                }
                _ => Err(self.err(e).into()),
            },
        }
    }

    async fn commit_one_lease(&self, w: LeaseWrite) -> Result<(), CommitError> {
        self.count_call();
        match w {
            LeaseWrite::Create(record) => {
                let result = self
                    .client
                    .put_item()
                    .table_name(self.table.as_ref())
                    .set_item(Some(row::lease_item(&record)))
                    .condition_expression(NOT_EXISTS)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await;
                match result {
                    Ok(out) => {
                        self.count_capacity(Units::Write, out.consumed_capacity());
                        Ok(())
                    }
                    Err(e) => match e.as_service_error() {
                        Some(PutItemError::ConditionalCheckFailedException(_)) => Err(
                            CommitError::Condition(ConditionFailure::LeaseExists(record.key)),
                        ),
                        Some(PutItemError::TransactionConflictException(_)) => {
                            Err(CommitError::TransactionConflict)
                        }
                        _ => Err(self.err(e).into()),
                    },
                }
            }
            LeaseWrite::Delete(key) => {
                let result = self
                    .client
                    .delete_item()
                    .table_name(self.table.as_ref())
                    .set_key(Some(row::key(key.as_str())))
                    .condition_expression(EXISTS)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await;
                match result {
                    Ok(out) => {
                        self.count_capacity(Units::Write, out.consumed_capacity());
                        Ok(())
                    }
                    Err(e) => match e.as_service_error() {
                        Some(DeleteItemError::ConditionalCheckFailedException(_)) => {
                            Err(CommitError::Condition(ConditionFailure::LeaseMissing(key)))
                        }
                        Some(DeleteItemError::TransactionConflictException(_)) => {
                            Err(CommitError::TransactionConflict)
                        }
                        _ => Err(self.err(e).into()),
                    },
                }
            }
            LeaseWrite::SetCost { key, cost } => {
                let result = self
                    .client
                    .update_item()
                    .table_name(self.table.as_ref())
                    .set_key(Some(row::key(key.as_str())))
                    .update_expression("SET #cost = :cost")
                    .condition_expression(EXISTS)
                    .expression_attribute_names("#cost", row::COST)
                    .expression_attribute_values(":cost", row::n(cost))
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await;
                match result {
                    Ok(out) => {
                        self.count_capacity(Units::Write, out.consumed_capacity());
                        Ok(())
                    }
                    Err(e) => match e.as_service_error() {
                        Some(UpdateItemError::ConditionalCheckFailedException(_)) => {
                            Err(CommitError::Condition(ConditionFailure::LeaseMissing(key)))
                        }
                        Some(UpdateItemError::TransactionConflictException(_)) => {
                            Err(CommitError::TransactionConflict)
                        }
                        _ => Err(self.err(e).into()),
                    },
                }
            }
        }
    }

    async fn commit_transaction(&self, commit: Commit) -> Result<(), CommitError> {
        let mut items = Vec::with_capacity(commit.len());
        for w in &commit.buckets {
            let BucketUpdate {
                key,
                update,
                condition,
                names,
                values,
            } = Self::bucket_update(w)?;
            let update = Update::builder()
                .table_name(self.table.as_ref())
                .set_key(Some(key))
                .update_expression(update)
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(Some(values))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .build()
                .map_err(build_error)?;
            items.push(TransactWriteItem::builder().update(update).build());
        }
        for w in &commit.leases {
            let item = match w {
                LeaseWrite::Create(record) => TransactWriteItem::builder()
                    .put(
                        Put::builder()
                            .table_name(self.table.as_ref())
                            .set_item(Some(row::lease_item(record)))
                            .condition_expression(NOT_EXISTS)
                            .build()
                            .map_err(build_error)?,
                    )
                    .build(),
                LeaseWrite::Delete(key) => TransactWriteItem::builder()
                    .delete(
                        Delete::builder()
                            .table_name(self.table.as_ref())
                            .set_key(Some(row::key(key.as_str())))
                            .condition_expression(EXISTS)
                            .build()
                            .map_err(build_error)?,
                    )
                    .build(),
                LeaseWrite::SetCost { key, cost } => TransactWriteItem::builder()
                    .update(
                        Update::builder()
                            .table_name(self.table.as_ref())
                            .set_key(Some(row::key(key.as_str())))
                            .update_expression("SET #cost = :cost")
                            .condition_expression(EXISTS)
                            .expression_attribute_names("#cost", row::COST)
                            .expression_attribute_values(":cost", row::n(cost))
                            .build()
                            .map_err(build_error)?,
                    )
                    .build(),
            };
            items.push(item);
        }
        self.count_call();
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(request_token())
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        let e = match result {
            Ok(out) => {
                self.count_capacity(Units::Write, out.consumed_capacity());
                self.count_capacity(Units::TransactionWrite, out.consumed_capacity());
                return Ok(());
            }
            Err(e) => e,
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
        match cancelled(&reasons) {
            Cancelled::Condition(i) if i < commit.buckets.len() => Err(CommitError::Condition(
                self.changed(&commit.buckets[i], reasons[i].item()),
            )),
            Cancelled::Condition(i) => {
                let lease = commit.leases.get(i - commit.buckets.len()).ok_or_else(|| {
                    StoreError::Service {
                        message: format!(
                            "transaction cancelled on item {i}, beyond the {} sent",
                            commit.len()
                        ),
                        source: None,
                    }
                })?;
                Err(CommitError::Condition(match lease {
                    LeaseWrite::Create(r) => ConditionFailure::LeaseExists(r.key.clone()),
                    LeaseWrite::Delete(k) | LeaseWrite::SetCost { key: k, .. } => {
                        ConditionFailure::LeaseMissing(k.clone())
                    }
                }))
            }
            Cancelled::Conflict => Err(CommitError::TransactionConflict),
            Cancelled::Throttled => Err(StoreError::Throttled {
                source: Some(Box::new(e)),
            }
            .into()),
            Cancelled::Other(why) => Err(StoreError::Service {
                message: format!("transaction cancelled: {why}"),
                source: Some(Box::new(e)),
            }
            .into()),
        }
    }

    /// Creates a bucket row that must not exist yet.
    async fn create_bucket(&self, state: &BucketState) -> Result<bool, StoreError> {
        self.count_call();
        let result = self
            .client
            .put_item()
            .table_name(self.table.as_ref())
            .set_item(Some(row::bucket_item(&BucketState {
                held: Vec::new(),
                ..state.clone()
            })))
            .condition_expression(NOT_EXISTS)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match result {
            Ok(out) => {
                self.count_capacity(Units::Write, out.consumed_capacity());
                Ok(true)
            }
            Err(e) => match e.as_service_error() {
                // A resend of a put that had applied finds the row it wrote.
                Some(PutItemError::ConditionalCheckFailedException(c))
                    if c.item().is_some_and(|item| is_own_write(item, state)) =>
                {
                    Ok(true)
                }
                Some(PutItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(self.err(e)),
            },
        }
    }

    /// The lease rows holding slots of `dimension`, from the sparse index.
    async fn slot_lease_rows(
        &self,
        dimension: &Dimension,
        limit: usize,
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        if self.slots_index_missing() {
            return Ok(Vec::new());
        }
        self.count_call();
        let out = self
            .client
            .query()
            .table_name(self.table.as_ref())
            .index_name(row::SLOTS_INDEX)
            .key_condition_expression("#d = :d")
            .expression_attribute_names("#d", row::SLOT_DIMENSION)
            .expression_attribute_values(":d", row::s(dimension.as_str()))
            .scan_index_forward(true)
            .limit(i32::try_from(limit.clamp(1, 1_000)).unwrap_or(1_000))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        let out = match out {
            Ok(out) => out,
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
        self.count_capacity(Units::Read, out.consumed_capacity());
        let mut leases = Vec::with_capacity(out.items().len());
        for item in out.items() {
            match row::lease_record(item) {
                Ok(lease) if lease.dimension == *dimension => leases.push(lease),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "a slot lease row sluice cannot read"),
            }
        }
        Ok(leases)
    }
}

/// Whether `item` is the row `written` describes, stamped by the very write that produced
/// it: same write id and version. A write id is new for every write, so only a resend of
/// that write can find it (DynamoDB applies conditional single-item writes at most once per
/// call, but the SDK resends a call whose answer was lost).
fn is_own_write(item: &Item, written: &BucketState) -> bool {
    written.write_id.is_some()
        && row::bucket_state(item)
            .is_ok_and(|row| row.write_id == written.write_id && row.version == written.version)
}

/// The parts of a bucket write's `UpdateItem`.
struct BucketUpdate {
    key: Item,
    update: String,
    condition: String,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

/// Consumed capacity in thousandths of a unit (statistics only, never accounting).
#[allow(
    clippy::float_arithmetic,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
fn capacity_milliunits(c: &ConsumedCapacity) -> u64 {
    c.capacity_units()
        .map_or(0, |v| (v * 1_000.0).round().max(0.0) as u64)
}

#[derive(Clone, Copy)]
enum Units {
    Read,
    Write,
    /// Also counted as `Write`.
    TransactionWrite,
}

/// The idempotency token of one transaction call: random, and reused by the SDK for every
/// resend of that call. When a transaction committed but its answer was lost, DynamoDB
/// recognises the resent token and reports success instead of a failed condition, so the
/// caller never takes tokens twice or leaves an orphan lease row. Another caller (or a
/// later call) committing the same content gets a token of its own, so DynamoDB never
/// mistakes it for a resend: two reconcilers racing on one lease are told apart.
fn request_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn build_error(e: aws_sdk_dynamodb::error::BuildError) -> StoreError {
    StoreError::Service {
        message: format!("could not build the DynamoDB request: {e}"),
        source: Some(Box::new(e)),
    }
}

#[async_trait::async_trait]
impl Store for DynamoStore {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        if let [only] = dimensions {
            self.count_call();
            let out = self
                .client
                .get_item()
                .table_name(self.table.as_ref())
                .set_key(Some(row::key(only.as_str())))
                .consistent_read(true)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(|e| self.err(e))?;
            self.count_capacity(Units::Read, out.consumed_capacity());
            return Ok(vec![out.item().map(row::bucket_state).transpose()?]);
        }
        let mut unique: Vec<String> = dimensions.iter().map(|d| d.as_str().to_owned()).collect();
        unique.sort();
        unique.dedup();
        let found = self.batch_get(unique).await?;
        dimensions
            .iter()
            .map(|d| found.get(d.as_str()).map(row::bucket_state).transpose())
            .collect()
    }

    async fn commit(&self, mut commit: Commit) -> Result<(), CommitError> {
        match (commit.buckets.len(), commit.leases.len()) {
            (0, 0) => Ok(()),
            (1, 0) => self.commit_one_bucket(commit.buckets.remove(0)).await,
            (0, 1) => self.commit_one_lease(commit.leases.remove(0)).await,
            _ => self.commit_transaction(commit).await,
        }
    }

    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        for chunk in keys.chunks(BATCH_WRITE_MAX) {
            let mut requests: Vec<WriteRequest> = chunk
                .iter()
                .map(|k| {
                    DeleteRequest::builder()
                        .set_key(Some(row::key(k.as_str())))
                        .build()
                        .map(|d| WriteRequest::builder().delete_request(d).build())
                        .map_err(build_error)
                })
                .collect::<Result<_, _>>()?;
            let mut round: u32 = 0;
            while !requests.is_empty() {
                round += 1;
                if round > 1 {
                    // DynamoDB hands back what it could not write now (throughput):
                    // resend only that, after a pause.
                    if round > BATCH_WRITE_ROUNDS {
                        return Err(StoreError::Throttled { source: None });
                    }
                    tokio::time::sleep(crate::client::backoff_delay(round - 1)).await;
                }
                self.count_call();
                let out = self
                    .client
                    .batch_write_item()
                    .request_items(self.table.as_ref(), requests)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await
                    .map_err(|e| self.err(e))?;
                self.count_capacity(Units::Write, out.consumed_capacity());
                requests = out
                    .unprocessed_items
                    .and_then(|mut u| u.remove(self.table.as_ref()))
                    .unwrap_or_default();
            }
        }
        Ok(())
    }

    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        // A lease is in a row of its own or kept in its bucket's row: read both.
        let mut wanted: Vec<String> = keys.iter().map(|k| k.as_str().to_owned()).collect();
        wanted.extend(
            keys.iter()
                .filter_map(|k| k.dimension())
                .map(|d| d.as_str().to_owned()),
        );
        wanted.sort();
        wanted.dedup();
        let found = self.batch_get(wanted).await?;
        keys.iter()
            .map(|k| {
                if let Some(item) = found.get(k.as_str()) {
                    return row::lease_record(item).map(Some);
                }
                let Some(item) = k.dimension().and_then(|d| found.get(d.as_str())) else {
                    return Ok(None);
                };
                let bucket = row::bucket_state(item)?;
                Ok(bucket
                    .held_lease(k.unique())
                    .map(|h| LeaseRecord::held_in(&bucket, h)))
            })
            .collect()
    }

    async fn forget_held(&self, dimension: &Dimension, ids: &[String]) -> Result<(), StoreError> {
        for chunk in ids.chunks(FORGET_MAX) {
            let names: HashMap<String, String> = chunk
                .iter()
                .enumerate()
                .map(|(i, id)| (format!("#h{i}"), row::held_name(id)))
                .collect();
            let update = format!(
                "REMOVE {}",
                (0..chunk.len())
                    .map(|i| format!("#h{i}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            self.count_call();
            let result = self
                .client
                .update_item()
                .table_name(self.table.as_ref())
                .set_key(Some(row::key(dimension.as_str())))
                .update_expression(update)
                // Never create a row for a bucket that is gone.
                .condition_expression(EXISTS)
                .set_expression_attribute_names(Some(names))
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await;
            match result {
                Ok(out) => self.count_capacity(Units::Write, out.consumed_capacity()),
                Err(e) => match e.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(_)) => return Ok(()),
                    _ => return Err(self.err(e)),
                },
            }
        }
        Ok(())
    }

    /// A query of the sparse index [`row::SLOTS_INDEX`] (one page of at most `limit` slot
    /// lease rows of `dimension`, earliest expiry first, whatever else the table holds) and,
    /// beside it, a consistent read of the bucket row for the leases it keeps. The index is
    /// eventually consistent (a lease row written or deleted a moment ago may be missing or
    /// still listed): callers use the answer as a hint and condition every write on the
    /// rows themselves. A table without the index (created by another tool) answers no
    /// lease row, with a warning saying how to add it, and is asked again a minute later.
    async fn slot_leases(
        &self,
        dimension: &Dimension,
        limit: usize,
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        let (rows, bucket) = tokio::join!(
            self.slot_lease_rows(dimension, limit),
            self.read_buckets(std::slice::from_ref(dimension))
        );
        let mut leases = rows?;
        if let Some(Some(bucket)) = bucket?.pop()
            && bucket.bucket.limit_type().restores_on_release()
        {
            leases.extend(bucket.held.iter().map(|h| LeaseRecord::held_in(&bucket, h)));
            leases.sort_by_key(|l| l.expires_at);
            leases.truncate(limit);
        }
        Ok(leases)
    }

    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError> {
        let mut expression = "begins_with(vendor_dimension, :lease)".to_owned();
        let mut values = HashMap::from([(":lease".to_owned(), row::s(LEASE_PREFIX))]);
        let mut names = HashMap::new();
        if let Some(d) = &filter.dimension {
            expression.push_str(" AND #dimension = :dimension");
            names.insert("#dimension".to_owned(), row::DIMENSION.to_owned());
            values.insert(":dimension".to_owned(), row::s(d.as_str()));
        }
        if let Some(t) = filter.expired_before {
            // `ttl` is a reserved word. A lease that expired before `t` has a ttl of at most
            // ceil(t) plus the grace sluice adds; the exact expiry is checked below.
            expression.push_str(" AND #ttl <= :ttl");
            names.insert("#ttl".to_owned(), row::TTL.to_owned());
            values.insert(
                ":ttl".to_owned(),
                row::n(t.as_secs_ceil() + row::TTL_GRACE_SECS),
            );
        }
        // Bucket rows too, for the leases they keep.
        match &filter.dimension {
            Some(d) => {
                expression = format!("({expression}) OR vendor_dimension = :bucket");
                values.insert(":bucket".to_owned(), row::s(d.as_str()));
            }
            None => {
                expression = format!("({expression}) OR NOT begins_with(vendor_dimension, :lease)");
            }
        }
        let items = self.scan(&expression, values, names).await?;
        let mut scan = LeaseScan {
            leases: Vec::with_capacity(items.len()),
            unreadable: Vec::new(),
        };
        let matches = |lease: &LeaseRecord| {
            filter.expired_before.is_none_or(|t| lease.expires_at < t)
                && filter
                    .dimension
                    .as_ref()
                    .is_none_or(|d| &lease.dimension == d)
        };
        for item in &items {
            let is_lease_row = matches!(
                item.get(row::KEY),
                Some(AttributeValue::S(k)) if k.starts_with(LEASE_PREFIX)
            );
            if !is_lease_row {
                match row::bucket_state(item) {
                    Ok(bucket) => scan.leases.extend(
                        bucket
                            .held
                            .iter()
                            .map(|h| LeaseRecord::held_in(&bucket, h))
                            .filter(|l| matches(l)),
                    ),
                    Err(e) => tracing::debug!(error = %e, "a bucket row sluice cannot read"),
                }
                continue;
            }
            match row::lease_record(item) {
                Ok(lease) => {
                    if matches(&lease) {
                        scan.leases.push(lease);
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "a lease row sluice cannot read");
                    let key = match item.get(row::KEY) {
                        Some(AttributeValue::S(k)) => k.clone(),
                        _ => String::new(),
                    };
                    scan.unreadable.push(key);
                }
            }
        }
        Ok(scan)
    }

    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError> {
        state
            .validate()
            .map_err(|e| StoreError::invalid_bucket(state.dimension.as_str(), &e))?;
        let Some(expected) = expected else {
            return self.create_bucket(state).await;
        };
        // An update, not a put: the leases the row keeps stay, holding their tokens.
        let (condition, mut values, mut names) = row::same_row(expected);
        let item = row::bucket_item(&BucketState {
            held: Vec::new(),
            ..state.clone()
        });
        let mut sets = Vec::new();
        for (i, (name, value)) in item.into_iter().filter(|(k, _)| k != row::KEY).enumerate() {
            names.insert(format!("#d{i}"), name);
            values.insert(format!(":d{i}"), value);
            sets.push(format!("#d{i} = :d{i}"));
        }
        let mut update = format!("SET {}", sets.join(", "));
        let mut removes = Vec::new();
        if state.bucket.keeps_leases() {
            names.insert("#lean".to_owned(), row::LEAN.to_owned());
            removes.push("#lean");
        }
        if state.write_id.is_none() {
            names.insert("#wid".to_owned(), row::WRITE_ID.to_owned());
            removes.push("#wid");
        }
        if !removes.is_empty() {
            update.push_str(" REMOVE ");
            update.push_str(&removes.join(", "));
        }
        self.count_call();
        let result = self
            .client
            .update_item()
            .table_name(self.table.as_ref())
            .set_key(Some(row::key(state.dimension.as_str())))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match result {
            Ok(out) => {
                self.count_capacity(Units::Write, out.consumed_capacity());
                Ok(true)
            }
            Err(e) => match e.as_service_error() {
                // A resend of an update that had applied finds the row it wrote.
                Some(UpdateItemError::ConditionalCheckFailedException(c))
                    if c.item().is_some_and(|item| is_own_write(item, state)) =>
                {
                    Ok(true)
                }
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(self.err(e)),
            },
        }
    }

    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError> {
        let items = self
            .scan(
                "NOT begins_with(vendor_dimension, :lease)",
                HashMap::from([(":lease".to_owned(), row::s(LEASE_PREFIX))]),
                HashMap::new(),
            )
            .await?;
        let mut buckets = Vec::with_capacity(items.len());
        for item in &items {
            match row::bucket_state(item) {
                Ok(b) => buckets.push(b),
                Err(e) => tracing::warn!(error = %e, "skipping a bucket row sluice cannot read"),
            }
        }
        buckets.sort_by(|a, b| a.dimension.cmp(&b.dimension));
        Ok(buckets)
    }

    async fn delete_bucket(&self, dimension: &Dimension) -> Result<bool, StoreError> {
        self.count_call();
        let out = self
            .client
            .delete_item()
            .table_name(self.table.as_ref())
            .set_key(Some(row::key(dimension.as_str())))
            .return_values(ReturnValue::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| self.err(e))?;
        self.count_capacity(Units::Write, out.consumed_capacity());
        Ok(out.attributes().is_some_and(|a| !a.is_empty()))
    }
}
