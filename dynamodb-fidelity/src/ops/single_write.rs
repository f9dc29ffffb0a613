//! PutItem, UpdateItem and DeleteItem: refused at once if a transaction holds the item or
//! its write capacity is spent; otherwise serialized with the item's other writes, sized
//! before (as the proxy's last write of it left it, or read) and after, and billed.

use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use serde_json::{Map, Value};

use super::call::Call;
use crate::item::ItemId;
use crate::ledger::{Direction, Outcome};
use crate::proxy::Proxy;
use crate::reply;
use crate::size::item_size;
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
        WriteKind::Put => Some(item_size(named)),
        WriteKind::Delete => Some(0),
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
    let before = match locked.size(&id, &scope) {
        Some(size) => Some(size),
        None => size_read(proxy, call, table, &key).await,
    };
    let answer = match call.send(proxy, None).await {
        Ok(answer) => answer,
        Err(response) => {
            // The write may have been applied: the item's size is not known any more.
            locked.set_size(&id, &scope, None);
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
                    .map(item_size)
            });
        let after = match after_known.or(returned) {
            Some(size) => Some(size),
            None => size_read(proxy, call, table, &key).await,
        };
        // A size that could not be read is billed as 0 (what is known), not remembered.
        locked.set_size(&id, &scope, after);
        let (before, after) = (before.unwrap_or(0), after.unwrap_or(0));
        proxy.ledger().bill_write(
            &id,
            write_units(before, after),
            Outcome::Written,
            &[before, after],
        );
    } else if answer.error_name().as_deref() == Some("ConditionalCheckFailedException") {
        locked.set_size(&id, &scope, before);
        let before = before.unwrap_or(0);
        proxy.ledger().bill_write(
            &id,
            failed_condition_units(before),
            Outcome::ConditionFailed,
            &[before],
        );
    } else {
        locked.set_size(&id, &scope, None);
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
        return Some(reply::throttled(
            proxy.throttle_as,
            Direction::Write,
            call.caller().region(),
            &[throttle],
        ));
    }
    None
}

/// The item's size now, read by the proxy (unbilled); 0 if the read failed, so that the
/// bill is what is known.
pub(super) async fn size_now(
    proxy: &Proxy,
    call: &Call,
    table: &str,
    key: &Map<String, Value>,
) -> u64 {
    size_read(proxy, call, table, key).await.unwrap_or(0)
}

/// The item's size now, read by the proxy (unbilled); `None` if the read failed.
async fn size_read(
    proxy: &Proxy,
    call: &Call,
    table: &str,
    key: &Map<String, Value>,
) -> Option<u64> {
    proxy.upstream.item_size(call.caller(), table, key).await
}
