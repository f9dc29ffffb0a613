//! The DynamoDB store: the seed's schema and protocol over `aws-sdk-dynamodb`.

#[macro_use]
mod parts;
mod billed;
mod change;
mod commit;
mod define;
mod error;
mod leases;
#[cfg(feature = "record-operations")]
mod record;
mod reshard;
mod row;
mod store;
mod unanswered;

pub use row::{SLOTS_INDEX, TTL_GRACE_SECS};
#[cfg(feature = "fuzzing")]
pub(crate) use row::{bucket_item, bucket_state, lease_item, lease_record};
mod table;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};

use self::billed::{TOTAL, Units, next_round};
use self::error::build_error;
use self::row::Item;
use self::unanswered::Unanswered;
use super::StoreError;
use crate::config::Config;
use crate::retry::Rounds;

/// BatchGetItem reads at most 100 keys per request.
const BATCH_GET_MAX: usize = 100;
/// `BatchWriteItem` takes at most 25 requests.
const BATCH_WRITE_MAX: usize = 25;
/// Rounds of a batched call (the first and the resends of what DynamoDB left unprocessed,
/// with backoff) before it is reported as throttled.
const BATCH_ROUNDS: u32 = 8;

/// Attempts of one store call by a client [`DynamoStore::from_config`] builds (the SDK's
/// standard retries, within the store timeout).
const STORE_ATTEMPTS: u32 = 3;
/// The first backoff between those attempts (the SDK's default is a second).
const STORE_RETRY_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

const EXISTS: &str = "attribute_exists(vendor_dimension)";
const NOT_EXISTS: &str = "attribute_not_exists(vendor_dimension)";

/// Buckets and leases in one DynamoDB table, in the schema the seed defines, so that
/// sluice shares the table with other SDKs that follow it.
///
/// Every operation maps to one DynamoDB call: bucket reads are strongly consistent
/// `GetItem`/`BatchGetItem`; a `Commit` touching one row is a
/// single conditional write, and one touching several is a `TransactWriteItems` with a
/// condition per item.
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
    /// The client the store sends through (recording its operations when they are recorded).
    client: Client,
    /// The client the store was built on: what others send through it is not the store's.
    given: Client,
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
    ///
    /// Unless `client` was given a retry partition of its own, the store sends through a
    /// copy of it with one: the SDK otherwise shares one retry token bucket among every
    /// DynamoDB client of the process in a region, and a throttled hot dimension
    /// elsewhere in the process would spend the retries this store's calls need.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        let table: Arc<str> = Arc::from(table.into());
        let sending = if client.config().retry_partition().is_some() {
            client.clone()
        } else {
            let partition =
                aws_sdk_dynamodb::config::retry::RetryPartition::custom(format!("sluice:{table}"))
                    .build();
            Client::from_conf(
                client
                    .config()
                    .to_builder()
                    .retry_partition(partition)
                    .build(),
            )
        };
        DynamoStore {
            given: client,
            client: recording(sending),
            table,
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
        // A store that stops answering fails a call after these, not the SDK's own limits.
        let timeouts = aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
            .operation_timeout(config.store_timeout)
            .operation_attempt_timeout(config.store_attempt_timeout)
            .build();
        // Attempts resent soon: a rate limiter sits in its caller's request path, and a
        // write whose answer was lost is recognised the more surely the sooner it is resent
        // (see `RecentWrites`).
        let retries = aws_sdk_dynamodb::config::retry::RetryConfig::standard()
            .with_max_attempts(STORE_ATTEMPTS)
            .with_initial_backoff(STORE_RETRY_BACKOFF);
        let aws = loader
            .timeout_config(timeouts)
            .retry_config(retries)
            .load()
            .await;
        Ok(DynamoStore::new(Client::new(&aws), table))
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The underlying DynamoDB client.
    // The one the store was built on, not the one it sends through (which records).
    #[allow(clippy::misnamed_getters)]
    pub fn client(&self) -> &Client {
        &self.given
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

    /// Until when the table is known to lack the slots index.
    fn slots_index_missing_until(&self) -> std::sync::MutexGuard<'_, Option<std::time::Instant>> {
        let until = &self.stats.slots_index_missing_until;
        until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn slots_index_missing(&self) -> bool {
        let until = self.slots_index_missing_until();
        until.is_some_and(|t| std::time::Instant::now() < t)
    }

    fn note_slots_index_missing(&self) {
        let mut until = self.slots_index_missing_until();
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
        let out = self.describe().await?;
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

    /// The rows of `keys` (each read once, however often named), by key.
    async fn batch_get(
        &self,
        keys: impl Iterator<Item = &str>,
    ) -> Result<HashMap<String, Item>, StoreError> {
        let mut keys: Vec<&str> = keys.collect();
        keys.sort_unstable();
        keys.dedup();
        let mut found = HashMap::with_capacity(keys.len());
        for chunk in keys.chunks(BATCH_GET_MAX) {
            let mut pending = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(chunk.iter().map(|k| row::key(k)).collect()))
                    .consistent_read(true)
                    .build()
                    .map_err(build_error)?,
            );
            let table = self.table.as_ref();
            let mut rounds = Rounds::new(BATCH_ROUNDS);
            // DynamoDB hands back the keys it could not read now (throughput): read only
            // those again.
            while let Some(batch) = pending.take() {
                next_round(&mut rounds).await?;
                let request = self.client.batch_get_item().request_items(table, batch);
                let sent = request.return_consumed_capacity(TOTAL).send();
                let out = self.answer(Units::Read, sent).await?;
                for item in out
                    .responses()
                    .and_then(|r| r.get(table))
                    .into_iter()
                    .flatten()
                {
                    if let Some(AttributeValue::S(k)) = item.get(row::KEY) {
                        found.insert(k.clone(), item.clone());
                    }
                }
                let left = out.unprocessed_keys().and_then(|u| u.get(table));
                pending = left.filter(|k| !k.keys().is_empty()).cloned();
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
            let request = self
                .client
                .scan()
                .table_name(self.table.as_ref())
                .consistent_read(true)
                .filter_expression(filter)
                .set_expression_attribute_values(Some(values.clone()))
                .set_expression_attribute_names((!names.is_empty()).then(|| names.clone()))
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(TOTAL)
                .send();
            let out = self.answer(Units::Read, request).await?;
            items.extend(out.items().iter().cloned());
            match out.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => return Ok(items),
            }
        }
    }
}

/// `client` itself: without the `record-operations` feature (a test hook; see
/// `record.rs`), no operation is recorded.
#[cfg(not(feature = "record-operations"))]
fn recording(client: aws_sdk_dynamodb::Client) -> aws_sdk_dynamodb::Client {
    client
}

#[cfg(feature = "record-operations")]
use record::recording;
