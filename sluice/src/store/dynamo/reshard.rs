//! A bucket's rows replaced at once (a reshard): one `TransactWriteItems` that puts every
//! new row whole and deletes the rows that go, each on condition that the stored row is
//! still exactly the one read (or, for a new row, that none exists).

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{Delete, Put, ReturnConsumedCapacity, TransactWriteItem};

use super::error::{Cancelled, cancelled};
use super::row;
use super::{DynamoStore, NOT_EXISTS, Units, build_error as build};
use crate::bucket::BucketState;
use crate::store::StoreError;

impl DynamoStore {
    pub(super) async fn replace_rows(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
    ) -> Result<bool, StoreError> {
        let mut items = Vec::with_capacity(expected.len().max(rows.len()));
        for state in rows {
            StoreError::check_row(state)?;
            let mut put = Put::builder()
                .table_name(self.table.as_ref())
                .set_item(Some(row::bucket_item(state)));
            put = match expected.iter().find(|e| e.dimension == state.dimension) {
                Some(old) => {
                    let (condition, values, names) = row::same_row(old);
                    put.condition_expression(condition)
                        .set_expression_attribute_names(Some(names))
                        .set_expression_attribute_values(Some(values))
                }
                None => put.condition_expression(NOT_EXISTS),
            };
            items.push(
                TransactWriteItem::builder()
                    .put(put.build().map_err(build)?)
                    .build(),
            );
        }
        for old in expected
            .iter()
            .filter(|e| rows.iter().all(|r| r.dimension != e.dimension))
        {
            let (condition, values, names) = row::same_row(old);
            let delete = Delete::builder()
                .table_name(self.table.as_ref())
                .set_key(Some(row::key(old.dimension.as_str())))
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names))
                .set_expression_attribute_values(Some(values));
            items.push(
                TransactWriteItem::builder()
                    .delete(delete.build().map_err(build)?)
                    .build(),
            );
        }
        self.count_call();
        let sent = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(crate::ids::new_unique())
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match sent {
            Ok(out) => {
                self.count_capacity(Units::Write, out.consumed_capacity());
                self.count_capacity(Units::TransactionWrite, out.consumed_capacity());
                Ok(true)
            }
            Err(e) => match e.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(c)) => {
                    match cancelled(c.cancellation_reasons()) {
                        Cancelled::Condition(_) | Cancelled::Conflict => Ok(false),
                        Cancelled::Throttled => Err(StoreError::Throttled {
                            source: Some(Box::new(e)),
                        }),
                        Cancelled::Other(why) => Err(StoreError::Service {
                            message: format!("reshard cancelled: {why}"),
                            source: Some(Box::new(e)),
                        }),
                    }
                }
                Some(TransactWriteItemsError::TransactionInProgressException(_)) => Ok(false),
                _ => Err(self.err(e)),
            },
        }
    }
}
