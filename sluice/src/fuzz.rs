//! Entry points for the fuzz harness (the `sluice-fuzz` crate); not a public API.
//!
//! Compiled only with the `fuzzing` feature, so an ordinary build carries none of it. Each
//! function hands a crate-private parser (or its inverse) to the harness unchanged.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::store::{LeaseRecord, StoreError};
use crate::{BucketState, DecimalError, Rounding};

/// A DynamoDB item, as the store reads and writes them.
pub type Item = HashMap<String, AttributeValue>;

/// Reads `text` as an integer scaled by `10^decimals`.
pub fn parse_decimal(text: &str, decimals: u32, rounding: Rounding) -> Result<i128, DecimalError> {
    crate::decimal::parse(text, decimals, rounding)
}

/// Writes an integer scaled by `10^decimals` as a plain decimal.
pub fn format_decimal(value: i128, decimals: u32) -> String {
    crate::decimal::format(value, decimals)
}

/// Reads a bucket row as the DynamoDB store does.
pub fn read_bucket_row(item: &Item) -> Result<BucketState, StoreError> {
    crate::store::bucket_state(item)
}

/// The bucket row the DynamoDB store writes for `state`.
pub fn write_bucket_row(state: &BucketState) -> Item {
    crate::store::bucket_item(state)
}

/// Reads a lease row as the DynamoDB store does.
pub fn read_lease_row(item: &Item) -> Result<LeaseRecord, StoreError> {
    crate::store::lease_record(item)
}

/// The lease row the DynamoDB store writes for `lease`.
pub fn write_lease_row(lease: &LeaseRecord) -> Item {
    crate::store::lease_item(lease)
}
