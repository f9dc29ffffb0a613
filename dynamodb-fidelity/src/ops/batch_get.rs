//! BatchGetItem: each key billed as its own read. Keys whose item has no read capacity
//! left come back in `UnprocessedKeys`, as the real service returns them (a throttle only
//! if none is left to read).

use std::collections::HashMap;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use serde_json::{Map, Value};

use super::call::Call;
use super::is_projected;
use super::single_write::size_now;
use crate::item::ItemId;
use crate::ledger::Direction;
use crate::proxy::Proxy;
use crate::reply;
use crate::size::item_size;
use crate::units::read_half_units;

#[derive(Debug)]
struct Entry {
    table: String,
    id: ItemId,
    key: Map<String, Value>,
}

pub(super) async fn answer(proxy: &Proxy, call: &Call, json: &Value) -> Response<Full<Bytes>> {
    let Some(requests) = json.get("RequestItems").and_then(Value::as_object) else {
        return call.pass(proxy).await;
    };
    let Some(entries) = entries(proxy, call, requests).await else {
        return call.pass(proxy).await;
    };
    let mut throttles = Vec::new();
    let admitted: Vec<bool> = {
        let mut ledger = proxy.ledger();
        let now = Instant::now();
        entries
            .iter()
            .map(|e| {
                ledger.count_request(&e.id);
                let throttle = ledger.throttle(&e.id, Direction::Read, now);
                let go = throttle.is_none();
                throttles.extend(throttle);
                go
            })
            .collect()
    };
    if !admitted.iter().any(|&go| go) {
        return reply::throttled(
            proxy.throttle_as,
            Direction::Read,
            call.caller().region(),
            &throttles,
        );
    }
    let throttled: Vec<&Entry> = entries
        .iter()
        .zip(&admitted)
        .filter_map(|(e, &go)| (!go).then_some(e))
        .collect();
    let rewritten = (!throttled.is_empty()).then(|| {
        let mut body = json.clone();
        body["RequestItems"] = keep(
            requests,
            entries
                .iter()
                .zip(&admitted)
                .filter_map(|(e, &go)| go.then_some(e)),
        );
        body
    });
    let answer = match call.send(proxy, rewritten.as_ref()).await {
        Ok(answer) => answer,
        Err(response) => return response,
    };
    if !answer.is_success() {
        return answer.into_response();
    }
    let Some(mut out) = answer.json() else {
        return answer.into_response();
    };
    let returned = returned_sizes(proxy, call, out.get("Responses")).await;
    let unread = key_ids(proxy, call, out.get("UnprocessedKeys")).await;
    for (entry, &go) in entries.iter().zip(&admitted) {
        if !go || unread.contains(&entry.id) {
            continue;
        }
        let request = &requests[&entry.table];
        let size = if is_projected(request) {
            size_now(proxy, call, &entry.table, &entry.key).await
        } else {
            returned.get(&entry.id).copied().unwrap_or(0)
        };
        let consistent = request.get("ConsistentRead").and_then(Value::as_bool) == Some(true);
        proxy
            .ledger()
            .bill_read(&entry.id, read_half_units(size, consistent), size);
    }
    if throttled.is_empty() {
        return answer.into_response();
    }
    let mut merged = out
        .get("UnprocessedKeys")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for entry in throttled {
        let table = merged.entry(entry.table.clone()).or_insert_with(|| {
            let mut request = requests[&entry.table].clone();
            request["Keys"] = Value::Array(Vec::new());
            request
        });
        if let Some(keys) = table.get_mut("Keys").and_then(Value::as_array_mut) {
            keys.push(Value::Object(entry.key.clone()));
        }
    }
    out["UnprocessedKeys"] = Value::Object(merged);
    answer.with_json(&out).into_response()
}

/// Every key of the call, or `None` if one cannot be read.
async fn entries(proxy: &Proxy, call: &Call, requests: &Map<String, Value>) -> Option<Vec<Entry>> {
    let mut entries = Vec::new();
    for (table, request) in requests {
        let schema = proxy
            .schemas
            .get(&proxy.upstream, call.caller(), table)
            .await?;
        for key in request.get("Keys")?.as_array()? {
            let key = key.as_object()?;
            entries.push(Entry {
                table: table.clone(),
                id: schema.item_id(table, key)?,
                key: key.clone(),
            });
        }
    }
    Some(entries)
}

/// `RequestItems` with only the keys of `entries` (and no table left without keys).
fn keep<'a>(requests: &Map<String, Value>, entries: impl Iterator<Item = &'a Entry>) -> Value {
    let mut keys: HashMap<&str, Vec<Value>> = HashMap::new();
    for entry in entries {
        keys.entry(&entry.table)
            .or_default()
            .push(Value::Object(entry.key.clone()));
    }
    Value::Object(
        keys.into_iter()
            .map(|(table, keys)| {
                let mut request = requests[table].clone();
                request["Keys"] = Value::Array(keys);
                (table.to_owned(), request)
            })
            .collect(),
    )
}

/// The size of every item of an answer's `Responses`, by item.
async fn returned_sizes(
    proxy: &Proxy,
    call: &Call,
    responses: Option<&Value>,
) -> HashMap<ItemId, u64> {
    let mut sizes = HashMap::new();
    for (table, items) in responses.and_then(Value::as_object).into_iter().flatten() {
        let Some(schema) = proxy
            .schemas
            .get(&proxy.upstream, call.caller(), table)
            .await
        else {
            continue;
        };
        for item in items
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_object)
        {
            if let Some(id) = schema.item_id(table, item) {
                sizes.insert(id, item_size(item));
            }
        }
    }
    sizes
}

/// The items of an answer's `UnprocessedKeys`.
async fn key_ids(proxy: &Proxy, call: &Call, unprocessed: Option<&Value>) -> Vec<ItemId> {
    let mut ids = Vec::new();
    for (table, request) in unprocessed.and_then(Value::as_object).into_iter().flatten() {
        let Some(schema) = proxy
            .schemas
            .get(&proxy.upstream, call.caller(), table)
            .await
        else {
            continue;
        };
        let keys = request
            .get("Keys")
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        for key in keys.filter_map(Value::as_object) {
            if let Some(id) = schema.item_id(table, key) {
                ids.push(id);
            }
        }
    }
    ids
}
