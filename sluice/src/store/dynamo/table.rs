//! Creating the table.

use std::time::Duration;

use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};

use super::{DynamoStore, build_error, row};
use crate::store::StoreError;

/// How long to wait for a new table to become active.
const ACTIVE_TIMEOUT: Duration = Duration::from_secs(120);

impl DynamoStore {
    /// Creates the table if it does not exist: partition key `vendor_dimension` (S),
    /// on-demand billing, TTL on the `ttl` attribute. Waits until the table is active.
    /// Returns whether it created the table (`false`: it already existed).
    pub async fn create_table(&self) -> Result<bool, StoreError> {
        self.count_call();
        let created = self
            .client
            .create_table()
            .table_name(self.table.as_ref())
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(row::KEY)
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .map_err(build_error)?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(row::KEY)
                    .key_type(KeyType::Hash)
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
        self.wait_active().await?;
        self.enable_ttl().await?;
        if created {
            tracing::info!(table = %self.table, "created table");
        }
        Ok(created)
    }

    async fn wait_active(&self) -> Result<(), StoreError> {
        let deadline = tokio::time::Instant::now() + ACTIVE_TIMEOUT;
        loop {
            self.count_call();
            let out = self
                .client
                .describe_table()
                .table_name(self.table.as_ref())
                .send()
                .await
                .map_err(|e| self.err(e))?;
            if out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Timeout { source: None });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
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
