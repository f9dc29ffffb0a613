//! Conditions on a stored bucket row: that it is exactly the row a write was computed
//! from, or that it still has the definition a change was computed with.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{
    BURST, CAPACITY, COST_PER_CALL, Item, LAST_REFILL_AT, LEAN, LIMIT_TYPE, REFILL_RATE, RESERVES,
    TOKENS, VERSION, WRITE_ID, n, reserves_value, s, write_id,
};
use crate::bucket::{Bucket, BucketState};
use crate::clock::UnixMillis;
use crate::tokens::Tokens;

/// A condition expression with its names and values, built a clause at a time.
#[derive(Debug, Default)]
pub(crate) struct Expr {
    clauses: Vec<String>,
    pub(crate) names: HashMap<String, String>,
    pub(crate) values: Item,
}

impl Expr {
    /// Adds `clause`, naming `#name` the attribute `attribute`.
    pub(crate) fn and(&mut self, clause: impl Into<String>) -> &mut Self {
        self.clauses.push(clause.into());
        self
    }

    /// Names `#placeholder` the attribute `attribute`.
    pub(crate) fn name(&mut self, placeholder: &str, attribute: &str) -> &mut Self {
        self.names
            .insert(placeholder.to_owned(), attribute.to_owned());
        self
    }

    /// Gives `:placeholder` the value `value`.
    pub(crate) fn value(&mut self, placeholder: &str, value: AttributeValue) -> &mut Self {
        self.values.insert(placeholder.to_owned(), value);
        self
    }

    /// Makes the condition hold for a missing item too: a missing item, or every clause.
    /// The placeholder `#key` must name the partition key.
    pub(crate) fn or_absent(&mut self) -> &mut Self {
        let all = self.condition();
        self.clauses = vec![format!("(attribute_not_exists(#key) OR ({all}))")];
        self
    }

    /// The condition expression: every clause.
    pub(crate) fn condition(&self) -> String {
        self.clauses.join(" AND ")
    }

    /// The expression's parts: condition, values, names.
    pub(crate) fn into_parts(self) -> (String, Item, HashMap<String, String>) {
        (self.condition(), self.values, self.names)
    }
}

/// The condition that the stored bucket row is the one `expected` was read as.
///
/// A row a sluice write produced is named by its version and write id: every sluice write
/// conditioned on the exact row stamps a new id, and other writers (other SDKs, sluice's
/// changes) bump the version. A row no such write has touched (a re-seed, another SDK's
/// rows) is compared whole: the same version, tokens, refill timestamp and definition, and
/// still no write id. Values another writer stored with more decimals than sluice keeps
/// were rounded when read (never toward an over-grant); each is compared with the interval
/// it was rounded from, so the row matches exactly when nothing changed.
pub(crate) fn same_row(expected: &BucketState) -> (String, Item, HashMap<String, String>) {
    let mut e = Expr::default();
    e.name("#v", VERSION)
        .name("#w", WRITE_ID)
        .value(":v", n(expected.version))
        .and("#v = :v");
    if let Some(id) = expected.write_id {
        e.value(":w", write_id(id)).and("#w = :w");
        return e.into_parts();
    }
    const NANO: Tokens = Tokens::from_nanos(1);
    let last = expected.last_refill_at;
    e.name("#t", TOKENS)
        .name("#l", LAST_REFILL_AT)
        // Read rounding down: the stored value is in [t, t + 1e-9).
        .value(":t0", n(expected.tokens))
        .value(":t1", n(expected.tokens + NANO))
        // Read rounding up to the millisecond: the stored value is in (l - 1 ms, l].
        .value(":l0", n(UnixMillis::new(last.as_millis() - 1)))
        .value(":l1", n(last))
        .and("#t BETWEEN :t0 AND :t1")
        .and("#l BETWEEN :l0 AND :l1")
        .and("attribute_not_exists(#w)");
    let key = expected.dimension.key().is_some();
    same_definition(&mut e, &expected.bucket, expected.burst, key);
    e.into_parts()
}

/// Adds the condition that the stored row has `bucket`'s definition and the learned
/// `burst`: capacity, refill rate, cost per call and limit type (each compared with the
/// interval a stored value with more decimals was rounded from), the reserves, lean mode
/// and the burst.
pub(crate) fn same_definition(e: &mut Expr, bucket: &Bucket, burst: Option<Tokens>, key: bool) {
    const NANO: Tokens = Tokens::from_nanos(1);
    let (rate, rate_above) = bucket.refill_rate().stored_interval();
    e.name("#c", CAPACITY)
        .name("#r", REFILL_RATE)
        .name("#p", COST_PER_CALL)
        .name("#k", LIMIT_TYPE)
        .name("#res", RESERVES)
        .name("#lean", LEAN)
        .name("#b", BURST)
        // Read rounding down: the stored value is in [c, c + 1e-9).
        .value(":c0", n(bucket.capacity()))
        .value(":c1", n(bucket.capacity() + NANO))
        // Read exactly, or rounded toward zero beyond 38 places.
        .value(":r0", AttributeValue::N(rate))
        .value(":r1", AttributeValue::N(rate_above))
        // Read rounding up: the stored value is in (p - 1e-9, p].
        .value(":p0", n(bucket.cost_per_call() - NANO))
        .value(":p1", n(bucket.cost_per_call()))
        .value(":k", s(bucket.limit_type().as_str()))
        .and("#c BETWEEN :c0 AND :c1")
        .and("#r BETWEEN :r0 AND :r1")
        .and("#p BETWEEN :p0 AND :p1")
        .and("#k = :k");
    if bucket.reserves().is_empty() {
        e.value(":nores", reserves_value(&[]))
            .and("(attribute_not_exists(#res) OR #res = :nores)");
    } else {
        e.value(":res", reserves_value(bucket.reserves()))
            .and("#res = :res");
    }
    if bucket.keeps_leases() {
        e.value(":notlean", AttributeValue::Bool(false))
            .and("(attribute_not_exists(#lean) OR #lean = :notlean)");
    } else {
        e.value(":lean", AttributeValue::Bool(true))
            .and("#lean = :lean");
    }
    match burst {
        // Read rounding down: the stored value is in [b, b + 1e-9).
        Some(b) => {
            e.value(":b0", n(b))
                .value(":b1", n(b + NANO))
                .and("#b BETWEEN :b0 AND :b1");
        }
        None => {
            e.and("attribute_not_exists(#b)");
        }
    }
    same_settings(e, bucket, key);
}

/// Adds the condition that the stored row has `bucket`'s mode, schedule, key override and
/// bound on its rows (see [`same_definition`]).
fn same_settings(e: &mut Expr, bucket: &Bucket, key: bool) {
    e.name("#mode", super::MODE);
    match super::mode_value(bucket.mode()) {
        Some(mode) => {
            e.value(":mode", mode).and("#mode = :mode");
        }
        None => {
            e.and("attribute_not_exists(#mode)");
        }
    }
    e.name("#sched", super::SCHEDULE);
    match bucket.schedule() {
        Some(schedule) => {
            e.value(":sched", s(schedule.to_string()))
                .and("#sched = :sched");
        }
        None => {
            e.and("attribute_not_exists(#sched)");
        }
    }
    // A key's own definition is never taken for its template's (a first use's write). Only
    // a key's row can be an override: other rows' writes carry no such clause (on every
    // write of a fleet's start it cost a sixth of the grants behind the proxy, measured).
    if bucket.is_override() {
        e.name("#ovr", super::OVERRIDE)
            .value(":ovr", AttributeValue::Bool(true))
            .and("#ovr = :ovr");
    } else if key {
        e.name("#ovr", super::OVERRIDE)
            .and("attribute_not_exists(#ovr)");
    }
    e.name("#sl", super::SHARD_LIMIT);
    match bucket.shard_limit() {
        Some(limit) => {
            e.value(":sl", s(limit.to_string())).and("#sl = :sl");
        }
        None => {
            e.and("attribute_not_exists(#sl)");
        }
    }
}
