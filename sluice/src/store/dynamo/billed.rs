//! Sending one DynamoDB request: the call counted, and what DynamoDB billed for it
//! (`ReturnConsumedCapacity::Total`) counted once it answers; a batch's rounds.

use std::fmt;
use std::future::Future;
use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::{
    batch_get_item::BatchGetItemOutput, batch_write_item::BatchWriteItemOutput,
    delete_item::DeleteItemOutput, get_item::GetItemOutput, put_item::PutItemOutput,
    query::QueryOutput, scan::ScanOutput, transact_write_items::TransactWriteItemsOutput,
    update_item::UpdateItemOutput,
};
use aws_sdk_dynamodb::types::{ConsumedCapacity, ReturnConsumedCapacity, TransactWriteItem};

use super::DynamoStore;
use super::error::store_error;
use crate::retry::Rounds;
use crate::store::StoreError;

/// Waits out the pause before a batch's next round (the first goes at once):
/// [`StoreError::Throttled`] once `rounds` have run out.
pub(super) async fn next_round(rounds: &mut Rounds) -> Result<(), StoreError> {
    match rounds.next().await {
        true => Ok(()),
        false => Err(StoreError::Throttled { source: None }),
    }
}

/// Every request asks DynamoDB what it consumed.
pub(super) const TOTAL: ReturnConsumedCapacity = ReturnConsumedCapacity::Total;

/// Which counter an answered request's consumed capacity goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Units {
    Read,
    Write,
    /// Also counted as `Write`.
    TransactionWrite,
}

/// An answer that reports the capacity its request consumed.
pub(super) trait Billed {
    /// The consumed capacity reported (one entry per table touched, or none).
    fn billed(&self) -> impl Iterator<Item = &ConsumedCapacity>;
}

macro_rules! billed {
    ($($out:ty),*) => {$(
        impl Billed for $out {
            fn billed(&self) -> impl Iterator<Item = &ConsumedCapacity> {
                self.consumed_capacity().into_iter()
            }
        }
    )*};
}

billed!(
    BatchGetItemOutput,
    BatchWriteItemOutput,
    DeleteItemOutput,
    GetItemOutput,
    PutItemOutput,
    QueryOutput,
    ScanOutput,
    TransactWriteItemsOutput,
    UpdateItemOutput
);

impl DynamoStore {
    /// Sends `request` (a built request's `send()`), counting the call and, when DynamoDB
    /// answers, the capacity it consumed as `units`. The error is handed back as the SDK's,
    /// for callers that read a refused condition from it.
    pub(super) async fn billed<O: Billed, E, R>(
        &self,
        units: Units,
        request: impl Future<Output = Result<O, SdkError<E, R>>>,
    ) -> Result<O, SdkError<E, R>> {
        self.count_call();
        let sent = request.await;
        if let Ok(out) = &sent {
            self.count_capacity(units, out.billed());
            if units == Units::TransactionWrite {
                self.count_capacity(Units::Write, out.billed());
            }
        }
        sent
    }

    /// Sends one `TransactWriteItems` of `items`, idempotent under `token` (the SDK may
    /// resend it).
    pub(super) async fn transact(
        &self,
        items: Vec<TransactWriteItem>,
        token: String,
    ) -> Result<TransactWriteItemsOutput, SdkError<TransactWriteItemsError, HttpResponse>> {
        let request = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(token)
            .return_consumed_capacity(TOTAL)
            .send();
        self.billed(Units::TransactionWrite, request).await
    }

    /// [`billed`](Self::billed), with every error the store's.
    pub(super) async fn answer<O: Billed, E, R>(
        &self,
        units: Units,
        request: impl Future<Output = Result<O, SdkError<E, R>>>,
    ) -> Result<O, StoreError>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: fmt::Debug + Send + Sync + 'static,
    {
        self.billed(units, request).await.map_err(|e| self.err(e))
    }

    pub(super) fn count_call(&self) {
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

    /// The store's error for a request that failed.
    pub(super) fn err<E, R>(&self, e: SdkError<E, R>) -> StoreError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: fmt::Debug + Send + Sync + 'static,
    {
        store_error(e, &self.table)
    }
}

/// Consumed capacity in thousandths of a unit (statistics only, never accounting).
#[allow(
    clippy::float_arithmetic,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
pub(super) fn capacity_milliunits(c: &ConsumedCapacity) -> u64 {
    c.capacity_units()
        .map_or(0, |v| (v * 1_000.0).round().max(0.0) as u64)
}
