//! A bucket's definition as row attributes: what every row of the bucket carries.

use aws_sdk_dynamodb::types::AttributeValue;

use super::{
    CAPACITY, COST_PER_CALL, Item, LEAN, LIMIT_TYPE, MODE, RESERVES, SCHEDULE, SHARD_LIMIT,
    StoreError, mode_value, n, rate_attributes, reserves_value, s,
};
use crate::bucket::Bucket;

/// sluice's extra bucket attribute: `true` on a keyed bucket's row, the template of a
/// bucket per key ([`Bucket::keyed`]); absent: a bucket of its own. A key's row does not
/// carry it.
pub(crate) const KEYED: &str = "keyed";

/// The attributes of `bucket`'s definition: the seed's (capacity, refill rate, cost per
/// call, limit type) and sluice's (the exact rate, lean mode, reserves, shard limit, mode,
/// schedule, keyed), each only when it says more than its absence.
pub(crate) fn definition_attributes(bucket: &Bucket) -> Vec<(String, AttributeValue)> {
    let mut attributes = vec![
        (CAPACITY.to_owned(), n(bucket.capacity())),
        (COST_PER_CALL.to_owned(), n(bucket.cost_per_call())),
        (LIMIT_TYPE.to_owned(), s(bucket.limit_type().as_str())),
    ];
    attributes.extend(rate_attributes(bucket.refill_rate()));
    if !bucket.keeps_leases() {
        attributes.push((LEAN.to_owned(), AttributeValue::Bool(true)));
    }
    if !bucket.reserves().is_empty() {
        attributes.push((RESERVES.to_owned(), reserves_value(bucket.reserves())));
    }
    if let Some(limit) = bucket.shard_limit() {
        attributes.push((SHARD_LIMIT.to_owned(), s(limit.to_string())));
    }
    if let Some(mode) = mode_value(bucket.mode()) {
        attributes.push((MODE.to_owned(), mode));
    }
    if let Some(schedule) = bucket.schedule() {
        attributes.push((SCHEDULE.to_owned(), s(schedule.to_string())));
    }
    if bucket.is_keyed() {
        attributes.push((KEYED.to_owned(), AttributeValue::Bool(true)));
    }
    if bucket.is_override() {
        attributes.push((OVERRIDE.to_owned(), AttributeValue::Bool(true)));
    }
    attributes
}

/// sluice's extra bucket attribute: `true` on a key's row put with its own definition
/// ([`Bucket::is_override`]); absent on the rows keys' first acquires create.
pub(crate) const OVERRIDE: &str = "override";

/// Whether the flag `name` is set on a row.
pub(crate) fn read_flag(
    item: &Item,
    name: &str,
    corrupt: impl Fn(String) -> StoreError,
) -> Result<bool, StoreError> {
    match item.get(name) {
        None => Ok(false),
        Some(AttributeValue::Bool(b)) => Ok(*b),
        Some(_) => Err(corrupt(format!("`{name}` must be a boolean (BOOL)"))),
    }
}

/// `bucket` as its row's flags say: a keyed bucket's template, or a key's own definition.
pub(crate) fn with_flags(
    bucket: Bucket,
    item: &Item,
    corrupt: impl Fn(String) -> StoreError,
) -> Result<Bucket, StoreError> {
    let bucket = if read_flag(item, KEYED, &corrupt)? {
        bucket.keyed()
    } else {
        bucket
    };
    Ok(if read_flag(item, OVERRIDE, &corrupt)? {
        bucket.overriding()
    } else {
        bucket
    })
}
