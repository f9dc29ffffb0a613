//! BatchWriteItem: each put or delete billed as its own write. Entries whose item has no
//! write capacity left come back in `UnprocessedItems`, as the real service returns them
//! (a throttle only if none is left to write), and so do entries whose index writes an
//! index key cannot take; a transaction holding any item refuses the whole call with
//! `TransactionConflictException`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::future::join_all;
use http_body_util::Full;
use hyper::Response;
use serde_json::{Map, Value};

use super::call::Call;
use super::single_write::{shape_now, throttled};
use crate::item::{ItemId, KeySchema, Shape};
use crate::ledger::{Direction, Outcome};
use crate::proxy::Proxy;
use crate::reply;
use crate::units::write_units;

/// One put or delete of the batch.
#[derive(Debug)]
struct Entry {
    table: String,
    /// The request as sent (`{"PutRequest": …}` or `{"DeleteRequest": …}`).
    request: Value,
    id: ItemId,
    key: Map<String, Value>,
    schema: Arc<KeySchema>,
    /// The item once written (none for a delete).
    after: Shape,
}

pub(super) async fn answer(proxy: &Proxy, call: &Call, json: &Value) -> Response<Full<Bytes>> {
    let Some(entries) = entries(proxy, call, json).await else {
        return call.pass(proxy).await;
    };
    let ids: Vec<ItemId> = entries.iter().map(|e| e.id.clone()).collect();
    {
        let mut ledger = proxy.ledger();
        for id in &ids {
            ledger.count_request(id);
        }
    }
    let admitted = match admit(proxy, call, &entries, &vec![true; entries.len()]) {
        Ok(admitted) => admitted,
        Err(refusal) => return *refusal,
    };
    let mut locked = proxy.locks.lock_all(&ids).await;
    locked.forget_shapes();
    let admitted = match admit(proxy, call, &entries, &admitted) {
        Ok(admitted) => admitted,
        Err(refusal) => return *refusal,
    };
    let befores = join_all(entries.iter().zip(&admitted).map(|(e, &go)| async move {
        if go {
            shape_now(proxy, call, &e.schema, &e.table, &e.key).await
        } else {
            Shape::default()
        }
    }))
    .await;
    let admitted = match admit_index(proxy, call, &entries, &befores, admitted) {
        Ok(admitted) => admitted,
        Err(refusal) => return *refusal,
    };

    let throttled: Vec<&Entry> = entries
        .iter()
        .zip(&admitted)
        .filter_map(|(e, &go)| (!go).then_some(e))
        .collect();
    let rewritten = (!throttled.is_empty()).then(|| {
        let mut body = json.clone();
        body["RequestItems"] = group(
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
    // DynamoDB Local writes every entry; should it leave some unprocessed, they are not
    // billed.
    let unprocessed = unprocessed_ids(proxy, call, out.get("UnprocessedItems")).await;
    {
        let mut ledger = proxy.ledger();
        for ((entry, &go), before) in entries.iter().zip(&admitted).zip(&befores) {
            if go && !unprocessed.contains(&entry.id) {
                let (b, a) = (before.size, entry.after.size);
                ledger.bill_write(&entry.id, write_units(b, a), Outcome::Written, &[b, a]);
                ledger.bill_index(before, &entry.after);
            }
        }
    }
    if throttled.is_empty() {
        return answer.into_response();
    }
    let mut merged = out
        .get("UnprocessedItems")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for entry in throttled {
        if let Some(list) = merged
            .entry(entry.table.clone())
            .or_insert_with(|| Value::Array(Vec::new()))
            .as_array_mut()
        {
            list.push(entry.request.clone());
        }
    }
    out["UnprocessedItems"] = Value::Object(merged);
    answer.with_json(&out).into_response()
}

/// The batch's entries, or `None` if one cannot be read (the call then passes through,
/// and the upstream says what is wrong with it).
async fn entries(proxy: &Proxy, call: &Call, json: &Value) -> Option<Vec<Entry>> {
    let mut entries = Vec::new();
    for (table, requests) in json.get("RequestItems")?.as_object()? {
        let schema = proxy
            .schemas
            .get(&proxy.upstream, call.caller(), table)
            .await?;
        for request in requests.as_array()? {
            let (named, after) = if let Some(put) = request.get("PutRequest") {
                let item = put.get("Item")?.as_object()?;
                (item, schema.shape(table, item))
            } else {
                let key = request.get("DeleteRequest")?.get("Key")?.as_object()?;
                (key, Shape::default())
            };
            entries.push(Entry {
                table: table.clone(),
                request: request.clone(),
                id: schema.item_id(table, named)?,
                key: schema.key_of(named),
                schema: schema.clone(),
                after,
            });
        }
    }
    Some(entries)
}

/// Which of the `candidates` may be written now: an error answer if a transaction holds
/// any item of the batch, or if no entry has capacity left.
fn admit(
    proxy: &Proxy,
    call: &Call,
    entries: &[Entry],
    candidates: &[bool],
) -> Result<Vec<bool>, Box<Response<Full<Bytes>>>> {
    let mut ledger = proxy.ledger();
    let held: Vec<&ItemId> = entries
        .iter()
        .map(|e| &e.id)
        .filter(|id| ledger.is_held(id, None))
        .collect();
    if !held.is_empty() {
        for id in held {
            ledger.count_conflict(id);
        }
        return Err(Box::new(reply::transaction_conflict()));
    }
    let now = Instant::now();
    let mut admitted = Vec::with_capacity(entries.len());
    let mut throttles = Vec::new();
    for (entry, &candidate) in entries.iter().zip(candidates) {
        let throttle = if candidate {
            ledger.throttle(&entry.id, Direction::Write, now)
        } else {
            None
        };
        admitted.push(candidate && throttle.is_none());
        throttles.extend(throttle);
    }
    if admitted.iter().any(|&go| go) {
        return Ok(admitted);
    }
    Err(Box::new(reply::throttled(
        proxy.throttle_as,
        Direction::Write,
        call.caller().region(),
        &throttles,
    )))
}

/// Which of the `admitted` entries their index keys can take now (the others come back
/// unprocessed), each item as it is (`befores`); a throttle answer if none.
fn admit_index(
    proxy: &Proxy,
    call: &Call,
    entries: &[Entry],
    befores: &[Shape],
    admitted: Vec<bool>,
) -> Result<Vec<bool>, Box<Response<Full<Bytes>>>> {
    let mut ledger = proxy.ledger();
    let now = Instant::now();
    let mut throttles = Vec::new();
    let admitted: Vec<bool> = entries
        .iter()
        .zip(befores)
        .zip(admitted)
        .map(|((entry, before), go)| {
            if !go {
                return false;
            }
            let refused = ledger.index_throttles(before, &entry.after, now);
            let go = refused.is_empty();
            throttles.extend(refused);
            go
        })
        .collect();
    drop(ledger);
    if admitted.iter().any(|&go| go) {
        return Ok(admitted);
    }
    Err(Box::new(throttled(proxy, call, &throttles)))
}

/// `RequestItems` of `entries`, by table.
fn group<'a>(entries: impl Iterator<Item = &'a Entry>) -> Value {
    let mut tables: HashMap<&str, Vec<Value>> = HashMap::new();
    for entry in entries {
        tables
            .entry(&entry.table)
            .or_default()
            .push(entry.request.clone());
    }
    Value::Object(
        tables
            .into_iter()
            .map(|(table, requests)| (table.to_owned(), Value::Array(requests)))
            .collect(),
    )
}

/// The items of an answer's `UnprocessedItems`.
async fn unprocessed_ids(proxy: &Proxy, call: &Call, unprocessed: Option<&Value>) -> Vec<ItemId> {
    let mut ids = Vec::new();
    let Some(tables) = unprocessed.and_then(Value::as_object) else {
        return ids;
    };
    for (table, requests) in tables {
        let Some(schema) = proxy
            .schemas
            .get(&proxy.upstream, call.caller(), table)
            .await
        else {
            continue;
        };
        for request in requests.as_array().into_iter().flatten() {
            let named = request
                .pointer("/PutRequest/Item")
                .or_else(|| request.pointer("/DeleteRequest/Key"))
                .and_then(Value::as_object);
            if let Some(id) = named.and_then(|n| schema.item_id(table, n)) {
                ids.push(id);
            }
        }
    }
    ids
}
