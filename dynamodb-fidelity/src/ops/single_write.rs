//! PutItem, UpdateItem and DeleteItem: refused at once if a transaction holds the item or
//! its write capacity (or that of an index key it has or gets) is spent; otherwise
//! serialized with the item's other writes, sized before (as the proxy's last write of it
//! left it, or read) and after, and billed, its index writes with it.

use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use serde_json::{Map, Value};

use super::call::Call;
use crate::item::{ItemId, KeySchema, Shape};
use crate::ledger::{Direction, Outcome, Throttle};
use crate::proxy::Proxy;
use crate::reply;
use crate::units::{failed_condition_units, write_units};

/// Which single-item write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteKind {
    Put,
    Update,
    Delete,
}

pub(super) async fn answer(
    proxy: &Proxy,
    call: &Call,
    json: &Value,
    kind: WriteKind,
) -> Response<Full<Bytes>> {
    let Some(table) = json.get("TableName").and_then(Value::as_str) else {
        return call.pass(proxy).await;
    };
    let named = match kind {
        WriteKind::Put => json.get("Item"),
        WriteKind::Update | WriteKind::Delete => json.get("Key"),
    };
    let Some(named) = named.and_then(Value::as_object) else {
        return call.pass(proxy).await;
    };
    let Some(schema) = proxy
        .schemas
        .get(&proxy.upstream, call.caller(), table)
        .await
    else {
        return call.pass(proxy).await;
    };
    let Some(id) = schema.item_id(table, named) else {
        return call.pass(proxy).await;
    };
    // What the item will be if the write goes through, where the request says it.
    let after_known = match kind {
        WriteKind::Put => Some(schema.shape(table, named)),
        WriteKind::Delete => Some(Shape::default()),
        WriteKind::Update => None,
    };
    let key = schema.key_of(named);
    // An update that asks for the whole item back (as sluice's do) is sized after from its
    // answer, not from a read: one upstream call fewer while the item is locked, so one
    // item's writes are not queued at the proxy below the ceiling it enforces.
    let returns_item = kind == WriteKind::Update
        && json.get("ReturnValues").and_then(Value::as_str) == Some("ALL_NEW");

    proxy.ledger().count_request(&id);
    if let Some(refusal) = refuse(proxy, call, &id) {
        return refusal;
    }
    let mut locked = proxy.locks.lock_all(std::slice::from_ref(&id)).await;
    // Waiting for the item's previous write may have spent its capacity, or let a
    // transaction take it.
    if let Some(refusal) = refuse(proxy, call, &id) {
        return refusal;
    }
    let scope = call.caller().scope().to_owned();
    let before = match locked.shape(&id, &scope) {
        Some(shape) => Some(shape),
        None => shape_read(proxy, call, &schema, table, &key).await,
    };
    // The index entries it has and will have, as far as known now: an index that cannot
    // take their writes throttles the write.
    let index_throttles = proxy.ledger().index_throttles(
        before.as_ref().unwrap_or(&Shape::default()),
        after_known.as_ref().unwrap_or(&Shape::default()),
        Instant::now(),
    );
    if !index_throttles.is_empty() {
        locked.set_shape(&id, &scope, before);
        return throttled(proxy, call, &index_throttles);
    }
    let answer = match call.send(proxy, None).await {
        Ok(answer) => answer,
        Err(response) => {
            // The write may have been applied: the item is not known any more.
            locked.set_shape(&id, &scope, None);
            return response;
        }
    };
    if answer.is_success() {
        let returned = returns_item
            .then(|| answer.json())
            .flatten()
            .and_then(|json| {
                json.get("Attributes")
                    .and_then(Value::as_object)
                    .map(|item| schema.shape(table, item))
            });
        let after = match after_known.or(returned) {
            Some(shape) => Some(shape),
            None => shape_read(proxy, call, &schema, table, &key).await,
        };
        // A shape that could not be read is billed as no item (what is known), not
        // remembered.
        locked.set_shape(&id, &scope, after.clone());
        let (before, after) = (before.unwrap_or_default(), after.unwrap_or_default());
        let mut ledger = proxy.ledger();
        ledger.bill_write(
            &id,
            write_units(before.size, after.size),
            Outcome::Written,
            &[before.size, after.size],
        );
        ledger.bill_index(&before, &after);
    } else if answer.error_name().as_deref() == Some("ConditionalCheckFailedException") {
        let size = before.as_ref().map_or(0, |b| b.size);
        locked.set_shape(&id, &scope, before);
        proxy.ledger().bill_write(
            &id,
            failed_condition_units(size),
            Outcome::ConditionFailed,
            &[size],
        );
    } else {
        locked.set_shape(&id, &scope, None);
    }
    answer.into_response()
}

/// Why a write of `id` may not start now, as the answer to give; counted.
pub(super) fn refuse(proxy: &Proxy, call: &Call, id: &ItemId) -> Option<Response<Full<Bytes>>> {
    let mut ledger = proxy.ledger();
    if ledger.is_held(id, None) {
        ledger.count_conflict(id);
        return Some(reply::transaction_conflict());
    }
    if let Some(throttle) = ledger.throttle(id, Direction::Write, Instant::now()) {
        drop(ledger);
        return Some(throttled(proxy, call, &[throttle]));
    }
    None
}

/// A write throttled for `throttles`.
pub(super) fn throttled(
    proxy: &Proxy,
    call: &Call,
    throttles: &[Throttle],
) -> Response<Full<Bytes>> {
    reply::throttled(
        proxy.throttle_as,
        Direction::Write,
        call.caller().region(),
        throttles,
    )
}

/// The item's shape now, read by the proxy (unbilled); no item if the read failed, so
/// that the bill is what is known.
pub(super) async fn shape_now(
    proxy: &Proxy,
    call: &Call,
    schema: &KeySchema,
    table: &str,
    key: &Map<String, Value>,
) -> Shape {
    shape_read(proxy, call, schema, table, key)
        .await
        .unwrap_or_default()
}

/// The item's shape now, read by the proxy (unbilled); `None` if the read failed.
async fn shape_read(
    proxy: &Proxy,
    call: &Call,
    schema: &KeySchema,
    table: &str,
    key: &Map<String, Value>,
) -> Option<Shape> {
    let item = proxy.upstream.read_item(call.caller(), table, key).await?;
    Some(schema.shape(table, &item))
}

/// The item's size now, read by the proxy (unbilled); 0 if the read failed, so that the
/// bill is what is known.
pub(super) async fn size_now(
    proxy: &Proxy,
    call: &Call,
    table: &str,
    key: &Map<String, Value>,
) -> u64 {
    proxy
        .upstream
        .item_size(call.caller(), table, key)
        .await
        .unwrap_or(0)
}
