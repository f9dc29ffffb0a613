//! GetItem: throttled if the item's read capacity is spent; otherwise billed by the item's
//! whole size (a projection does not make it cheaper), half if eventually consistent.

use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use serde_json::Value;

use super::call::Call;
use super::is_projected;
use super::single_write::size_now;
use crate::ledger::Direction;
use crate::proxy::Proxy;
use crate::reply;
use crate::size::item_size;
use crate::units::read_half_units;

pub(super) async fn answer(proxy: &Proxy, call: &Call, json: &Value) -> Response<Full<Bytes>> {
    let Some(table) = json.get("TableName").and_then(Value::as_str) else {
        return call.pass(proxy).await;
    };
    let Some(key) = json.get("Key").and_then(Value::as_object) else {
        return call.pass(proxy).await;
    };
    let Some(schema) = proxy
        .schemas
        .get(&proxy.upstream, call.caller(), table)
        .await
    else {
        return call.pass(proxy).await;
    };
    let Some(id) = schema.item_id(table, key) else {
        return call.pass(proxy).await;
    };
    let consistent = json.get("ConsistentRead").and_then(Value::as_bool) == Some(true);
    {
        let mut ledger = proxy.ledger();
        ledger.count_request(&id);
        if let Some(throttle) = ledger.throttle(&id, Direction::Read, Instant::now()) {
            return reply::throttled(
                proxy.throttle_as,
                Direction::Read,
                call.caller().region(),
                &[throttle],
            );
        }
    }
    let answer = match call.send(proxy, None).await {
        Ok(answer) => answer,
        Err(response) => return response,
    };
    if answer.is_success() {
        let size = if is_projected(json) {
            size_now(proxy, call, table, key).await
        } else {
            answer
                .json()
                .and_then(|a| a.get("Item").and_then(Value::as_object).map(item_size))
                .unwrap_or(0)
        };
        proxy
            .ledger()
            .bill_read(&id, read_half_units(size, consistent), size);
    }
    answer.into_response()
}
