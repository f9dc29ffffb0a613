//! Lease rows: reading, listing, scanning, the slot index, and the unconditional removals of
//! leases that give nothing back.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::BuildError;
use aws_sdk_dynamodb::types::{
    AttributeValue, DeleteRequest, PutRequest, ReturnConsumedCapacity, WriteRequest,
};

use super::billed::next_round;
use super::row;
use super::{BATCH_ROUNDS, BATCH_WRITE_MAX, DynamoStore, Units, build_error, error};
use crate::dimension::{Dimension, LEASE_PREFIX};
use crate::retry::Rounds;
use crate::store::{LeaseFilter, LeaseKey, LeaseRecord, LeaseScan, StoreError};

impl DynamoStore {
    /// Writes new lease rows, 25 per `BatchWriteItem`, resending what DynamoDB leaves
    /// unprocessed.
    pub(super) async fn put_lease_rows(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        let put = |r: &LeaseRecord| {
            let item = PutRequest::builder().set_item(Some(row::lease_item(r)));
            Ok(WriteRequest::builder().put_request(item.build()?).build())
        };
        self.write_rows(leases, put).await
    }

    /// Deletes lease rows whatever they hold, 25 per `BatchWriteItem`.
    pub(super) async fn delete_lease_rows(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        let delete = |k: &LeaseKey| {
            let key = DeleteRequest::builder().set_key(Some(row::key(k.as_str())));
            Ok(WriteRequest::builder().delete_request(key.build()?).build())
        };
        self.write_rows(keys, delete).await
    }

    /// Sends the write `request` makes of each of `rows`, 25 per `BatchWriteItem`.
    async fn write_rows<T>(
        &self,
        rows: &[T],
        request: impl Fn(&T) -> Result<WriteRequest, BuildError>,
    ) -> Result<(), StoreError> {
        for chunk in rows.chunks(BATCH_WRITE_MAX) {
            let requests = chunk.iter().map(&request).collect::<Result<_, _>>();
            self.write_batch(requests.map_err(build_error)?).await?;
        }
        Ok(())
    }

    /// Sends one `BatchWriteItem` of at most 25 requests. DynamoDB hands back what it could
    /// not write now (throughput): only that is resent, after a pause, up to a bound.
    pub(super) async fn write_batch(
        &self,
        mut requests: Vec<WriteRequest>,
    ) -> Result<(), StoreError> {
        let table = self.table.as_ref();
        let mut rounds = Rounds::new(BATCH_ROUNDS);
        while !requests.is_empty() {
            next_round(&mut rounds).await?;
            let request = self
                .client
                .batch_write_item()
                .request_items(table, requests);
            let sent = request
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send();
            let out = self.answer(Units::Write, sent).await?;
            let left = out.unprocessed_items.and_then(|mut u| u.remove(table));
            requests = left.unwrap_or_default();
        }
        Ok(())
    }

    pub(super) async fn read_lease_rows(
        &self,
        keys: &[LeaseKey],
    ) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        let mut wanted: Vec<String> = keys.iter().map(|k| k.as_str().to_owned()).collect();
        wanted.sort();
        wanted.dedup();
        let found = self.batch_get(wanted).await?;
        keys.iter()
            .map(|k| found.get(k.as_str()).map(row::lease_record).transpose())
            .collect()
    }

    pub(super) async fn scan_lease_rows(
        &self,
        filter: &LeaseFilter,
    ) -> Result<LeaseScan, StoreError> {
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

    /// A query of the sparse index [`row::SLOTS_INDEX`]: one page of at most `limit` slot
    /// lease rows of `dimension`, earliest expiry first, whatever else the table holds. The
    /// index is eventually consistent (a lease row written or deleted a moment ago may be
    /// missing or still listed): callers use the answer as a hint and condition every
    /// write on the rows themselves. A table without the index (created by another tool)
    /// answers no lease row, with a warning saying how to add it, and is asked again a
    /// minute later.
    pub(super) async fn slot_lease_list(
        &self,
        dimension: &Dimension,
        limit: usize,
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        if self.slots_index_missing() {
            return Ok(Vec::new());
        }
        let query = self
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
            .send();
        let out = match self.billed(Units::Read, query).await {
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
