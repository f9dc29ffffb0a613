//! Lease rows: reading, listing, scanning, the slot index, and the unconditional removals of
//! leases that give nothing back.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::BuildError;
use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, PutRequest, WriteRequest};

use super::billed::TOTAL;
use super::billed::next_round;
use super::row;
use super::{BATCH_ROUNDS, BATCH_WRITE_MAX, DynamoStore, Units, build_error};
use crate::dimension::LEASE_PREFIX;
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
            let sent = request.return_consumed_capacity(TOTAL).send();
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
        let found = self.batch_get(keys.iter().map(LeaseKey::as_str)).await?;
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
}
