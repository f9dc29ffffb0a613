//! Defining a bucket: creating its row, or redefining it in place (the leases the row
//! keeps stay, holding their tokens); deleting it. A resend of a definition whose answer was lost is
//! recognised by its own write id.

use std::collections::HashMap;
use std::future::Future;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{ReturnValue, ReturnValuesOnConditionCheckFailure};

use super::billed::Billed;
use super::billed::TOTAL;
use super::error::ConditionFailed;
use super::parts::Conditional;
use super::row::{self, Item};
use super::{DynamoStore, NOT_EXISTS, Units};
use crate::bucket::BucketState;
use crate::dimension::Dimension;
use crate::store::StoreError;

/// A definition write returns the row as it stood when its condition failed.
const ALL_OLD: ReturnValuesOnConditionCheckFailure = ReturnValuesOnConditionCheckFailure::AllOld;

/// Why a definition write was not applied.
pub(super) enum Refused {
    /// Its condition did not hold; the row as it stood, when returned.
    Condition(Option<Item>),
    Store(StoreError),
}

/// The bucket attributes a whole row leaves out when they hold their default (see
/// [`row::bucket_item`]).
const OPTIONAL: [&str; 14] = [
    row::LEAN,
    row::RESERVES,
    row::BURST,
    row::REFILL_AMOUNT,
    row::REFILL_PERIOD,
    row::REFILL_CARRY,
    row::HERD_AT,
    row::WRITE_ID,
    row::MODE,
    row::SCHEDULE,
    row::SHADOW_OWED,
    row::SHADOW_REFUSED,
    row::KEYED,
    row::OVERRIDE,
];

impl DynamoStore {
    /// Every bucket row sluice can read, by dimension (a row it cannot read is skipped
    /// with a warning).
    pub(super) async fn bucket_rows(&self) -> Result<Vec<BucketState>, StoreError> {
        let items = self
            .scan(
                "NOT begins_with(vendor_dimension, :lease)",
                HashMap::from([(":lease".to_owned(), row::s(crate::dimension::LEASE_PREFIX))]),
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

    pub(super) async fn create(&self, item: Item) -> Result<(), Refused> {
        let put = self
            .client
            .put_item()
            .table_name(self.table.as_ref())
            .set_item(Some(item))
            .condition_expression(NOT_EXISTS);
        self.definition(
            put.return_values_on_condition_check_failure(ALL_OLD)
                .return_consumed_capacity(TOTAL)
                .send(),
        )
        .await
    }

    /// An update, not a put: attributes sluice does not know (another SDK's) stay.
    pub(super) async fn redefine(
        &self,
        state: &BucketState,
        expected: &BucketState,
        item: Item,
    ) -> Result<(), Refused> {
        let (condition, mut values, mut names) = row::same_row(expected);
        // Every attribute a definition may leave out that this one does is removed, so
        // that nothing of the old definition outlives it.
        let mut removes = Vec::new();
        for (i, attribute) in OPTIONAL
            .iter()
            .filter(|a| !item.contains_key(**a))
            .enumerate()
        {
            names.insert(format!("#o{i}"), (*attribute).to_owned());
            removes.push(format!("#o{i}"));
        }
        let mut sets = Vec::new();
        for (i, (name, value)) in item.into_iter().filter(|(k, _)| k != row::KEY).enumerate() {
            names.insert(format!("#d{i}"), name);
            values.insert(format!(":d{i}"), value);
            sets.push(format!("#d{i} = :d{i}"));
        }
        let mut update = format!("SET {}", sets.join(", "));
        if !removes.is_empty() {
            update.push_str(" REMOVE ");
            update.push_str(&removes.join(", "));
        }
        let u = Conditional::new(state.dimension.as_str(), update, (condition, values, names));
        let update = conditional!(self.client.update_item(), self.table.as_ref(), u);
        self.definition(
            update
                .return_values_on_condition_check_failure(ALL_OLD)
                .return_consumed_capacity(TOTAL)
                .send(),
        )
        .await
    }

    /// Sends a definition write, telling its refused condition from the store's errors.
    async fn definition<O: Billed, E, R>(
        &self,
        request: impl Future<Output = Result<O, SdkError<E, R>>>,
    ) -> Result<(), Refused>
    where
        E: ConditionFailed + ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        match self.billed(Units::Write, request).await {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error().and_then(ConditionFailed::item) {
                Some(item) => Err(Refused::Condition(item.cloned())),
                None => Err(Refused::Store(self.err(e))),
            },
        }
    }

    /// Deletes a bucket row; whether it existed.
    pub(super) async fn delete_bucket_row(
        &self,
        dimension: &Dimension,
    ) -> Result<bool, StoreError> {
        let request = self
            .client
            .delete_item()
            .table_name(self.table.as_ref())
            .set_key(Some(row::key(dimension.as_str())))
            .return_values(ReturnValue::AllOld)
            .return_consumed_capacity(TOTAL)
            .send();
        let out = self.answer(Units::Write, request).await?;
        Ok(out.attributes().is_some_and(|a| !a.is_empty()))
    }
}

impl DynamoStore {
    /// Deletes the bucket row `expected` if it is still exactly that row; whether it did.
    pub(super) async fn delete_bucket_row_as(
        &self,
        expected: &BucketState,
    ) -> Result<bool, StoreError> {
        let (condition, values, names) = row::same_row(expected);
        let request = self
            .client
            .delete_item()
            .table_name(self.table.as_ref())
            .set_key(Some(row::key(expected.dimension.as_str())))
            .condition_expression(condition)
            .set_expression_attribute_values(Some(values))
            .set_expression_attribute_names(Some(names))
            .return_consumed_capacity(TOTAL)
            .send();
        match self.billed(Units::Write, request).await {
            Ok(_) => Ok(true),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(e) => Err(self.err(e)),
        }
    }
}

/// Whether `item` is a bucket row that remembers the write `write_id`.
pub(super) fn wrote(item: &Item, write_id: Option<u64>) -> bool {
    write_id.is_some_and(|id| row::bucket_state(item).is_ok_and(|row| row.wrote(id)))
}
