//! Query and Scan: the items they return are known only from the answer, so the answer is
//! checked against their read capacity afterwards (a read changes nothing, so answering a
//! throttle instead is as if it had been refused). Billed once for the total size, rounded
//! up to 4 KB, and shared among the returned items in proportion to their sizes.
//!
//! Only returned items are billed: real DynamoDB bills every item it evaluated, before a
//! filter, at full size whatever the projection, so a filtered or projected Query or Scan
//! costs more there than here.

use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use serde_json::Value;

use super::call::Call;
use crate::item::ItemId;
use crate::ledger::Direction;
use crate::proxy::Proxy;
use crate::reply;
use crate::size::item_size;
use crate::units::{bulk_read_half_units, share};

pub(super) async fn answer(proxy: &Proxy, call: &Call, json: &Value) -> Response<Full<Bytes>> {
    let Some(table) = json.get("TableName").and_then(Value::as_str) else {
        return call.pass(proxy).await;
    };
    let Some(schema) = proxy
        .schemas
        .get(&proxy.upstream, call.caller(), table)
        .await
    else {
        return call.pass(proxy).await;
    };
    let consistent = json.get("ConsistentRead").and_then(Value::as_bool) == Some(true);
    let answer = match call.send(proxy, None).await {
        Ok(answer) => answer,
        Err(response) => return response,
    };
    if !answer.is_success() {
        return answer.into_response();
    }
    let Some(out) = answer.json() else {
        return answer.into_response();
    };
    let items: Vec<(Option<ItemId>, u64)> = out
        .get("Items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .map(|item| (schema.item_id(table, item), item_size(item)))
        .collect();
    let mut ledger = proxy.ledger();
    let now = Instant::now();
    let mut throttles = Vec::new();
    for id in items.iter().filter_map(|(id, _)| id.as_ref()) {
        ledger.count_request(id);
        throttles.extend(ledger.throttle(id, Direction::Read, now));
    }
    if !throttles.is_empty() {
        return reply::throttled(
            proxy.throttle_as,
            Direction::Read,
            call.caller().region(),
            &throttles,
        );
    }
    let sizes: Vec<u64> = items.iter().map(|(_, size)| *size).collect();
    let units = bulk_read_half_units(sizes.iter().sum(), consistent);
    if items.is_empty() {
        ledger.bill_read_of_nothing(units);
    }
    for ((id, size), units) in items.iter().zip(share(units, &sizes)) {
        match id {
            Some(id) => ledger.bill_read(id, units, *size),
            // An item without its key (projected away): billed to the totals only.
            None => ledger.bill_read_of_nothing(units),
        }
    }
    drop(ledger);
    answer.into_response()
}
