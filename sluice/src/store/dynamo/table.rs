//! Creating the table.

use std::time::Duration;

use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, CreateGlobalSecondaryIndexAction, GlobalSecondaryIndexUpdate,
    KeySchemaElement, KeyType, Projection, ProjectionType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};

use super::{DynamoStore, build_error, row};
use crate::role::{self, Role};
use crate::store::StoreError;

/// How long to wait for a new table to become active.
const ACTIVE_TIMEOUT: Duration = Duration::from_secs(120);

/// The slots index's definition on an SDK builder: a new table's index and an index added
/// to a table have the same setters but no common type.
macro_rules! slots_index {
    ($builder:expr) => {
        $builder
            .index_name(row::SLOTS_INDEX)
            .key_schema(key(row::SLOT_DIMENSION, KeyType::Hash)?)
            .key_schema(key(row::EXPIRES_AT, KeyType::Range)?)
            .projection(all())
    };
}

/// The attributes the slots index is keyed on.
fn slots_index_attributes() -> Result<Vec<AttributeDefinition>, StoreError> {
    Ok(vec![
        attribute(row::SLOT_DIMENSION, ScalarAttributeType::S)?,
        attribute(row::EXPIRES_AT, ScalarAttributeType::N)?,
    ])
}

impl DynamoStore {
    /// Creates the table if it does not exist: partition key `vendor_dimension` (S),
    /// on-demand billing, TTL on the `ttl` attribute, and the sparse index
    /// [`SLOTS_INDEX`](crate::store::SLOTS_INDEX) over slot leases (partition key
    /// `slot_dimension` S, sort key `expires_at` N). A table that exists without the index
    /// (created before it, or by another tool) gets it added; DynamoDB then builds it in the
    /// background (until it is active, a short `concurrent` bucket answers the slot poll
    /// interval). Waits until the table is active. Returns whether it created the table
    /// (`false`: it already existed).
    pub async fn create_table(&self) -> Result<bool, StoreError> {
        role::within(Role::Operator, self.create_table_as_operator()).await
    }

    async fn create_table_as_operator(&self) -> Result<bool, StoreError> {
        self.count_call();
        let created = self
            .client
            .create_table()
            .table_name(self.table.as_ref())
            .set_attribute_definitions(Some(
                [
                    vec![attribute(row::KEY, ScalarAttributeType::S)?],
                    slots_index_attributes()?,
                ]
                .concat(),
            ))
            .key_schema(key(row::KEY, KeyType::Hash)?)
            .global_secondary_indexes(
                slots_index!(aws_sdk_dynamodb::types::GlobalSecondaryIndex::builder())
                    .build()
                    .map_err(build_error)?,
            )
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        let created = match created {
            Ok(_) => true,
            Err(e)
                if matches!(
                    e.as_service_error(),
                    Some(CreateTableError::ResourceInUseException(_))
                ) =>
            {
                false
            }
            Err(e) => return Err(self.err(e)),
        };
        if !self.wait_active().await? {
            self.add_slots_index().await?;
        }
        self.enable_ttl().await?;
        if created {
            tracing::info!(table = %self.table, "created table");
        }
        Ok(created)
    }

    /// Refuses a global table (with replicas in other Regions), whose Regions' writes to
    /// one bucket row would overwrite each other. A table that cannot be described (not
    /// created yet, the store unreachable, no `DescribeTable` permission) is not refused:
    /// a warning says the check could not be made.
    pub(crate) async fn refuse_replicas(&self) -> Result<(), crate::ConfigError> {
        let out = match self.describe().await {
            Ok(out) => out,
            Err(error) => {
                tracing::warn!(table = %self.table, %error, "could not describe the table to check that it has no replicas in other Regions (a global table would over-grant); needs dynamodb:DescribeTable");
                return Ok(());
            }
        };
        let regions: Vec<String> = out
            .table()
            .map(|t| t.replicas())
            .unwrap_or_default()
            .iter()
            .filter_map(|r| r.region_name().map(str::to_owned))
            .collect();
        if regions.is_empty() {
            return Ok(());
        }
        Err(crate::ConfigError::GlobalTable {
            table: self.table.to_string(),
            regions,
        })
    }

    /// The table's description.
    pub(super) async fn describe(
        &self,
    ) -> Result<aws_sdk_dynamodb::operation::describe_table::DescribeTableOutput, StoreError> {
        self.count_call();
        self.client
            .describe_table()
            .table_name(self.table.as_ref())
            .send()
            .await
            .map_err(|e| self.err(e))
    }

    /// Waits until the table is active. Returns whether it has the slots index (active or
    /// still being built).
    async fn wait_active(&self) -> Result<bool, StoreError> {
        let deadline = tokio::time::Instant::now() + ACTIVE_TIMEOUT;
        loop {
            let out = self.describe().await?;
            let table = out.table();
            let index = table
                .map(|t| t.global_secondary_indexes())
                .unwrap_or_default()
                .iter()
                .find(|i| i.index_name() == Some(row::SLOTS_INDEX));
            if table.and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
                return Ok(index.is_some());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Timeout { source: None });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Adds the slots index to a table that lacks it, and waits until it is active. Another
    /// process adding it at the same moment wins or loses the race; either way the index is
    /// there, which is checked by describing again, not by the message.
    async fn add_slots_index(&self) -> Result<(), StoreError> {
        tracing::info!(table = %self.table, index = row::SLOTS_INDEX, "adding the slots index");
        self.count_call();
        let added = self
            .client
            .update_table()
            .table_name(self.table.as_ref())
            .set_attribute_definitions(Some(slots_index_attributes()?))
            .global_secondary_index_updates(
                GlobalSecondaryIndexUpdate::builder()
                    .create(
                        slots_index!(CreateGlobalSecondaryIndexAction::builder())
                            .build()
                            .map_err(build_error)?,
                    )
                    .build(),
            )
            .send()
            .await;
        match added {
            Ok(_) => {
                self.wait_active().await?;
                tracing::info!(
                    table = %self.table,
                    index = row::SLOTS_INDEX,
                    "the slots index is being built; until it is active, short concurrent \
                     buckets answer the slot poll interval"
                );
                Ok(())
            }
            Err(e) => {
                if self.wait_active().await? {
                    Ok(())
                } else {
                    Err(self.err(e))
                }
            }
        }
    }

    /// Pre-warms the table: once DynamoDB has applied it, the table serves `write_units`
    /// and `read_units` a second at once (an on-demand table otherwise starts at 4,000
    /// writes and 12,000 reads a second and serves twice its previous peak; see
    /// docs/dynamodb.md, capacity planning). Zero leaves a direction as it is. Warm
    /// throughput only rises, and is billed once when raised: DynamoDB refuses a value
    /// below the table's current one ([`StoreError::Rejected`]). Each partition still
    /// serves 1,000 writes and 3,000 reads a second: warming does not cool a hot row.
    ///
    /// ```no_run
    /// # async fn warm(store: &sluice::DynamoStore) -> Result<(), sluice::error::StoreError> {
    /// // Ready for 20,000 grants a second (about a write each) from the first one.
    /// store.create_table().await?;
    /// store.warm_table(20_000, 0).await?;
    /// # Ok(()) }
    /// ```
    pub async fn warm_table(&self, write_units: u64, read_units: u64) -> Result<(), StoreError> {
        if write_units == 0 && read_units == 0 {
            return Ok(());
        }
        role::within(Role::Operator, async {
            let units = |n: u64| (n > 0).then(|| i64::try_from(n).unwrap_or(i64::MAX));
            self.count_call();
            self.client
                .update_table()
                .table_name(self.table.as_ref())
                .warm_throughput(
                    aws_sdk_dynamodb::types::WarmThroughput::builder()
                        .set_write_units_per_second(units(write_units))
                        .set_read_units_per_second(units(read_units))
                        .build(),
                )
                .send()
                .await
                .map_err(|e| self.err(e))?;
            tracing::info!(table = %self.table, write_units, read_units, "warming the table");
            Ok(())
        })
        .await
    }

    /// Turns TTL on for `ttl` unless it is already on. Another process creating the same
    /// table at the same moment may win the race to turn it on (DynamoDB then answers
    /// `ValidationException`): that is checked by describing again, not by the message.
    async fn enable_ttl(&self) -> Result<(), StoreError> {
        if self.ttl_enabled().await? {
            return Ok(());
        }
        self.count_call();
        let updated = self
            .client
            .update_time_to_live()
            .table_name(self.table.as_ref())
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .enabled(true)
                    .attribute_name(row::TTL)
                    .build()
                    .map_err(build_error)?,
            )
            .send()
            .await;
        match updated {
            Ok(_) => Ok(()),
            Err(e) => {
                if self.ttl_enabled().await? {
                    Ok(())
                } else {
                    Err(self.err(e))
                }
            }
        }
    }

    /// Whether TTL is on (or turning on) for this table, warning when it is on for an
    /// attribute other than `ttl`.
    async fn ttl_enabled(&self) -> Result<bool, StoreError> {
        self.count_call();
        let out = self
            .client
            .describe_time_to_live()
            .table_name(self.table.as_ref())
            .send()
            .await
            .map_err(|e| self.err(e))?;
        let ttl = out.time_to_live_description();
        let on = matches!(
            ttl.and_then(|t| t.time_to_live_status()),
            Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
        );
        if on {
            let attribute = ttl.and_then(|t| t.attribute_name()).unwrap_or_default();
            if attribute != row::TTL {
                tracing::warn!(table = %self.table, attribute, "table has TTL on another attribute; lease rows use `ttl`");
            }
        }
        Ok(on)
    }
}

fn attribute(name: &str, kind: ScalarAttributeType) -> Result<AttributeDefinition, StoreError> {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(kind)
        .build()
        .map_err(build_error)
}

fn key(name: &str, kind: KeyType) -> Result<KeySchemaElement, StoreError> {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()
        .map_err(build_error)
}

fn all() -> Projection {
    Projection::builder()
        .projection_type(ProjectionType::All)
        .build()
}
