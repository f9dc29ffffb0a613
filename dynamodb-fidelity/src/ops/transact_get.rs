//! TransactGetItems: cancelled (`TransactionConflict`) if a transaction holds an item or a
//! write of one is in flight; throttled whole if an item's read capacity is spent;
//! otherwise each item billed twice a strongly consistent read.

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
use crate::units::transact_read_half_units;

#[derive(Debug)]
struct Entry {
    table: String,
    id: ItemId,
    key: Map<String, Value>,
    projected: bool,
}

pub(super) async fn answer(proxy: &Proxy, call: &Call, json: &Value) -> Response<Full<Bytes>> {
    let Some(entries) = entries(proxy, call, json).await else {
        return call.pass(proxy).await;
    };
    {
        let writing: Vec<bool> = entries
            .iter()
            .map(|e| proxy.locks.is_locked(&e.id))
            .collect();
        let mut ledger = proxy.ledger();
        for entry in &entries {
            ledger.count_request(&entry.id);
        }
        let conflicts: Vec<bool> = entries
            .iter()
            .zip(&writing)
            .map(|(e, &w)| w || ledger.is_held(&e.id, None))
            .collect();
        if conflicts.iter().any(|&c| c) {
            for (entry, _) in entries.iter().zip(&conflicts).filter(|(_, c)| **c) {
                ledger.count_cancelled(&entry.id);
            }
            return reply::transaction_cancelled(&conflicts);
        }
        let now = Instant::now();
        let throttles: Vec<_> = entries
            .iter()
            .filter_map(|e| ledger.throttle(&e.id, Direction::Read, now))
            .collect();
        if !throttles.is_empty() {
            return reply::throttled(
                proxy.throttle_as,
                Direction::Read,
                call.caller().region(),
                &throttles,
            );
        }
    }
    let answer = match call.send(proxy, None).await {
        Ok(answer) => answer,
        Err(response) => return response,
    };
    if !answer.is_success() {
        return answer.into_response();
    }
    let responses = answer
        .json()
        .and_then(|a| a.get("Responses").cloned())
        .unwrap_or(Value::Null);
    for (i, entry) in entries.iter().enumerate() {
        let size = if entry.projected {
            size_now(proxy, call, &entry.table, &entry.key).await
        } else {
            responses
                .get(i)
                .and_then(|r| r.get("Item"))
                .and_then(Value::as_object)
                .map_or(0, item_size)
        };
        proxy
            .ledger()
            .bill_read(&entry.id, transact_read_half_units(size), size);
    }
    answer.into_response()
}

/// The transaction's items in request order, or `None` if one cannot be read.
async fn entries(proxy: &Proxy, call: &Call, json: &Value) -> Option<Vec<Entry>> {
    let mut entries = Vec::new();
    for item in json.get("TransactItems")?.as_array()? {
        let get = item.get("Get")?;
        let table = get.get("TableName")?.as_str()?;
        let key = get.get("Key")?.as_object()?;
        let schema = proxy
            .schemas
            .get(&proxy.upstream, call.caller(), table)
            .await?;
        entries.push(Entry {
            table: table.to_owned(),
            id: schema.item_id(table, key)?,
            key: key.clone(),
            projected: is_projected(get),
        });
    }
    Some(entries)
}
