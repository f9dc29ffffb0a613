//! The condition that a stored bucket row is exactly the one a write was computed from.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{
    CAPACITY, COST_PER_CALL, Item, LAST_REFILL_AT, LIMIT_TYPE, REFILL_RATE, RESERVES, TOKENS,
    VERSION, WRITE_ID, n, reserves_value, s, write_id,
};
use crate::bucket::BucketState;
use crate::clock::UnixMillis;
use crate::tokens::Tokens;

/// The condition that the stored bucket row is the one `expected` was read as.
///
/// A row a sluice write produced is named by its version and write id: every sluice write
/// stamps a new id, and other SDKs bump the version. A row no sluice write has touched (a
/// re-seed, another SDK's rows) is compared whole: the same version, tokens, refill
/// timestamp and definition, and still no write id. Values another writer stored with more
/// decimals than sluice keeps were rounded when read (never toward an over-grant); each is
/// compared with the interval it was rounded from, so the row matches exactly when nothing
/// changed.
pub(crate) fn same_row(expected: &BucketState) -> (String, Item, HashMap<String, String>) {
    if let Some(id) = expected.write_id {
        return (
            "#v = :v AND #w = :w".to_owned(),
            HashMap::from([
                (":v".to_owned(), n(expected.version)),
                (":w".to_owned(), write_id(id)),
            ]),
            HashMap::from([
                ("#v".to_owned(), VERSION.to_owned()),
                ("#w".to_owned(), WRITE_ID.to_owned()),
            ]),
        );
    }
    const NANO: Tokens = Tokens::from_nanos(1);
    let b = &expected.bucket;
    let last = expected.last_refill_at;
    let (rate, rate_above) = b.refill_rate().stored_interval();
    let mut names = HashMap::from([
        ("#v".to_owned(), VERSION.to_owned()),
        ("#t".to_owned(), TOKENS.to_owned()),
        ("#l".to_owned(), LAST_REFILL_AT.to_owned()),
        ("#c".to_owned(), CAPACITY.to_owned()),
        ("#r".to_owned(), REFILL_RATE.to_owned()),
        ("#p".to_owned(), COST_PER_CALL.to_owned()),
        ("#k".to_owned(), LIMIT_TYPE.to_owned()),
        ("#w".to_owned(), WRITE_ID.to_owned()),
    ]);
    let mut values = HashMap::from([
        (":v".to_owned(), n(expected.version)),
        // Read rounding down: the stored value is in [t, t + 1e-9).
        (":t0".to_owned(), n(expected.tokens)),
        (":t1".to_owned(), n(expected.tokens + NANO)),
        // Read rounding up to the millisecond: the stored value is in (l - 1 ms, l].
        (":l0".to_owned(), n(UnixMillis::new(last.as_millis() - 1))),
        (":l1".to_owned(), n(last)),
        (":c0".to_owned(), n(b.capacity())),
        (":c1".to_owned(), n(b.capacity() + NANO)),
        // Read exactly, or rounded toward zero beyond 38 places.
        (":r0".to_owned(), AttributeValue::N(rate)),
        (":r1".to_owned(), AttributeValue::N(rate_above)),
        // Read rounding up: the stored value is in (p - 1e-9, p].
        (":p0".to_owned(), n(b.cost_per_call() - NANO)),
        (":p1".to_owned(), n(b.cost_per_call())),
        (":k".to_owned(), s(b.limit_type().as_str())),
    ]);
    names.insert("#res".to_owned(), RESERVES.to_owned());
    let reserves = if b.reserves().is_empty() {
        values.insert(":nores".to_owned(), reserves_value(&[]));
        " AND (attribute_not_exists(#res) OR #res = :nores)"
    } else {
        values.insert(":res".to_owned(), reserves_value(b.reserves()));
        " AND #res = :res"
    };
    (format!("{SAME_ROW}{reserves}"), values, names)
}

/// The condition expression of [`same_row`].
const SAME_ROW: &str = "#v = :v AND #t BETWEEN :t0 AND :t1 AND #l BETWEEN :l0 AND :l1 \
     AND #c BETWEEN :c0 AND :c1 AND #r BETWEEN :r0 AND :r1 AND #p BETWEEN :p0 AND :p1 AND #k = :k \
     AND attribute_not_exists(#w)";
