//! A bucket's rows replaced at once (a reshard): one `TransactWriteItems` that puts every
//! new row whole and deletes the rows that go, each on condition that the stored row is
//! still exactly the one read (or, for a new row, that none exists); a row that stays and
//! has a commuting move is updated by it instead (see
//! [`Store::respread_buckets`](crate::store::Store::respread_buckets)).

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::{
    TransactWriteItemsError, TransactWriteItemsOutput,
};
use aws_sdk_dynamodb::types::{Delete, Put, TransactWriteItem, Update};

use super::error::{Cancelled, cancelled};
use super::parts::Conditional;
use super::row;
use super::{DynamoStore, NOT_EXISTS, build_error as build};
use crate::bucket::{BucketState, Commute};
use crate::store::{BucketChange, StoreError};

/// The attributes of a row's definition and count, set (or removed) on a moved row.
const DEFINITION: [&str; 14] = [
    row::CAPACITY,
    row::REFILL_RATE,
    row::REFILL_AMOUNT,
    row::REFILL_PERIOD,
    row::COST_PER_CALL,
    row::LIMIT_TYPE,
    row::LEAN,
    row::RESERVES,
    row::SHARDS,
    row::BURST,
    row::SHARD_LIMIT,
    row::WRITE_CEILING,
    row::MODE,
    row::SCHEDULE,
];

/// The update that moves the row `read` (of a bucket over `read.shards` rows) to `new` by
/// `commute`: the change's own conditions and clauses, on the count read, and the new
/// definition and count set (an attribute `new` has not, removed).
fn moved(
    table: &str,
    read: &BucketState,
    new: &BucketState,
    commute: &Commute,
) -> Result<Update, StoreError> {
    let (mut e, mut c) = super::change::parts_of(&BucketChange::of(read, commute.clone()));
    e.name("#sh", row::SHARDS)
        .value(":shn", row::n(read.shards.max(1)));
    if read.shards > 1 {
        e.and("#sh = :shn");
    } else {
        e.and("(attribute_not_exists(#sh) OR #sh = :shn)");
    }
    let item = row::bucket_item(new);
    for (i, attribute) in DEFINITION.iter().enumerate() {
        let name = format!("#d{i}");
        e.name(&name, attribute);
        match item.get(*attribute) {
            Some(value) => {
                e.value(&format!(":d{i}"), value.clone());
                c.sets.push(format!("{name} = :d{i}"));
            }
            None => c.removes.push(name),
        }
    }
    let u = Conditional::new(new.dimension.as_str(), c.expression(), e.into_parts());
    conditional!(Update::builder(), table, u)
        .build()
        .map_err(build)
}

/// The transaction's items: each row of `rows` put whole (on the row read, or on none
/// existing) or moved by its commuting move; each row `rows` drops deleted as read.
pub(super) fn items(
    table: &str,
    expected: &[BucketState],
    rows: &[BucketState],
    moves: &[Option<Commute>],
) -> Result<Vec<TransactWriteItem>, StoreError> {
    let mut items = Vec::with_capacity(expected.len().max(rows.len()));
    for (k, state) in rows.iter().enumerate() {
        StoreError::check_row(state)?;
        let read = expected.iter().find(|e| e.dimension == state.dimension);
        if let (Some(read), Some(Some(commute))) = (read, moves.get(k)) {
            let update = moved(table, read, state, commute)?;
            items.push(TransactWriteItem::builder().update(update).build());
            continue;
        }
        let put = Put::builder()
            .table_name(table)
            .set_item(Some(row::bucket_item(state)));
        let put = match read {
            Some(old) => {
                let (condition, values, names) = row::same_row(old);
                put.condition_expression(condition)
                    .set_expression_attribute_names(Some(names))
                    .set_expression_attribute_values(Some(values))
            }
            None => put.condition_expression(NOT_EXISTS),
        };
        let put = put.build().map_err(build)?;
        items.push(TransactWriteItem::builder().put(put).build());
    }
    for old in expected
        .iter()
        .filter(|e| rows.iter().all(|r| r.dimension != e.dimension))
    {
        let (condition, values, names) = row::same_row(old);
        let delete = Delete::builder()
            .table_name(table)
            .set_key(Some(row::key(old.dimension.as_str())))
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .build()
            .map_err(build)?;
        items.push(TransactWriteItem::builder().delete(delete).build());
    }
    Ok(items)
}

impl DynamoStore {
    /// What a reshard's transaction answered: whether it applied (`false`: a condition
    /// failed or another transaction held a row, nothing written).
    pub(super) fn resharded(
        &self,
        sent: Result<TransactWriteItemsOutput, SdkError<TransactWriteItemsError, HttpResponse>>,
    ) -> Result<bool, StoreError> {
        let e = match sent {
            Ok(_) => return Ok(true),
            Err(e) => e,
        };
        match e.as_service_error() {
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
        }
    }
}
