//! TransactWriteItems: its items are held from the moment the proxy takes it until the
//! upstream has answered and the configured hold has passed. An item held by another
//! transaction cancels it (`TransactionConflict`); an item without write capacity throttles
//! it whole, and so does an index key that cannot take an item's index writes. Each item
//! is billed twice (prepare and commit); its index writes once each (what DynamoDB bills
//! for a transaction's index writes is not documented).

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
use crate::ledger::{Direction, Ledger, Outcome, TxnId};
use crate::proxy::Proxy;
use crate::reply;
use crate::units::{failed_condition_units, write_units};

/// What a transaction does to one item.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Put { after: Shape },
    Update,
    Delete,
    ConditionCheck,
}

#[derive(Debug)]
struct Entry {
    table: String,
    id: ItemId,
    key: Map<String, Value>,
    schema: Arc<KeySchema>,
    action: Action,
}

/// Holds a transaction's items; dropped, lets them go (also if the client goes away and
/// the request is dropped half-way).
struct Holding<'a> {
    proxy: &'a Proxy,
    ids: Vec<ItemId>,
    txn: TxnId,
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.proxy.ledger().release(&self.ids, self.txn);
    }
}

pub(super) async fn answer(proxy: &Proxy, call: &Call, json: &Value) -> Response<Full<Bytes>> {
    let Some(entries) = entries(proxy, call, json).await else {
        return call.pass(proxy).await;
    };
    let ids: Vec<ItemId> = entries.iter().map(|e| e.id.clone()).collect();
    let holding = {
        let mut ledger = proxy.ledger();
        for id in &ids {
            ledger.count_request(id);
        }
        let conflicts: Vec<bool> = ids.iter().map(|id| ledger.is_held(id, None)).collect();
        if conflicts.iter().any(|&c| c) {
            for (id, _) in ids.iter().zip(&conflicts).filter(|(_, c)| **c) {
                ledger.count_cancelled(id);
            }
            return reply::transaction_cancelled(&conflicts);
        }
        if let Some(refusal) = throttle(proxy, call, &mut ledger, &ids) {
            return refusal;
        }
        let txn = ledger.new_txn();
        ledger.hold(&ids, txn);
        Holding {
            proxy,
            ids: ids.clone(),
            txn,
        }
    };
    // Single writes in flight finish first; new ones are refused while the items are held.
    let mut locked = proxy.locks.lock_all(&ids).await;
    locked.forget_shapes();
    if let Some(refusal) = throttle(proxy, call, &mut proxy.ledger(), &ids) {
        return refusal;
    }
    let befores = join_all(
        entries
            .iter()
            .map(|e| shape_now(proxy, call, &e.schema, &e.table, &e.key)),
    )
    .await;
    let index_throttles: Vec<_> = {
        let mut ledger = proxy.ledger();
        let now = Instant::now();
        entries
            .iter()
            .zip(&befores)
            .flat_map(|(e, before)| match &e.action {
                Action::Put { after } => ledger.index_throttles(before, after, now),
                Action::Delete | Action::Update => {
                    ledger.index_throttles(before, &Shape::default(), now)
                }
                Action::ConditionCheck => Vec::new(),
            })
            .collect()
    };
    if !index_throttles.is_empty() {
        return throttled(proxy, call, &index_throttles);
    }
    let answer = match call.send(proxy, None).await {
        Ok(answer) => answer,
        Err(response) => return response,
    };
    if answer.is_success() {
        let afters = join_all(entries.iter().zip(&befores).map(|(e, before)| async move {
            match &e.action {
                Action::Put { after } => after.clone(),
                Action::Delete => Shape::default(),
                Action::ConditionCheck => before.clone(),
                Action::Update => shape_now(proxy, call, &e.schema, &e.table, &e.key).await,
            }
        }))
        .await;
        let mut ledger = proxy.ledger();
        for ((entry, before), after) in entries.iter().zip(&befores).zip(&afters) {
            let outcome = match entry.action {
                Action::ConditionCheck => Outcome::NotWritten,
                _ => Outcome::Written,
            };
            let units = 2 * write_units(before.size, after.size);
            ledger.bill_write(&entry.id, units, outcome, &[before.size, after.size]);
            if outcome == Outcome::Written {
                ledger.bill_index(before, after);
            }
        }
    } else if answer.error_name().as_deref() == Some("TransactionCanceledException") {
        // Whether and how a cancelled transaction is billed is not documented: billed here
        // as a failed condition of each item, twice (prepare and commit).
        let codes = cancellation_codes(&answer.json());
        let mut ledger = proxy.ledger();
        for (i, (entry, before)) in entries.iter().zip(&befores).enumerate() {
            let before = before.size;
            let outcome = match codes.get(i).map(String::as_str) {
                Some("ConditionalCheckFailed") => Outcome::ConditionFailed,
                _ => Outcome::NotWritten,
            };
            let units = 2 * failed_condition_units(before);
            ledger.bill_write(&entry.id, units, outcome, &[before]);
        }
    }
    if !proxy.transaction_hold.is_zero() {
        tokio::time::sleep(proxy.transaction_hold).await;
    }
    // Holds first: a write waiting for a lock must not find the item still held.
    drop(holding);
    drop(locked);
    answer.into_response()
}

/// A throttle if an item of the transaction has no write capacity left; counted.
fn throttle(
    proxy: &Proxy,
    call: &Call,
    ledger: &mut Ledger,
    ids: &[ItemId],
) -> Option<Response<Full<Bytes>>> {
    let now = Instant::now();
    let throttles: Vec<_> = ids
        .iter()
        .filter_map(|id| ledger.throttle(id, Direction::Write, now))
        .collect();
    if throttles.is_empty() {
        return None;
    }
    Some(reply::throttled(
        proxy.throttle_as,
        Direction::Write,
        call.caller().region(),
        &throttles,
    ))
}

/// The transaction's items in request order, or `None` if one cannot be read.
async fn entries(proxy: &Proxy, call: &Call, json: &Value) -> Option<Vec<Entry>> {
    let mut entries = Vec::new();
    for item in json.get("TransactItems")?.as_array()? {
        let (kind, request) = item.as_object()?.iter().next()?;
        let table = request.get("TableName")?.as_str()?;
        let (named, action) = match kind.as_str() {
            "Put" => {
                let item = request.get("Item")?.as_object()?;
                (
                    item,
                    Action::Put {
                        after: Shape::default(),
                    },
                )
            }
            "Update" => (request.get("Key")?.as_object()?, Action::Update),
            "Delete" => (request.get("Key")?.as_object()?, Action::Delete),
            "ConditionCheck" => (request.get("Key")?.as_object()?, Action::ConditionCheck),
            _ => return None,
        };
        let schema = proxy
            .schemas
            .get(&proxy.upstream, call.caller(), table)
            .await?;
        let action = match action {
            Action::Put { .. } => Action::Put {
                after: schema.shape(table, named),
            },
            other => other,
        };
        entries.push(Entry {
            table: table.to_owned(),
            id: schema.item_id(table, named)?,
            key: schema.key_of(named),
            schema,
            action,
        });
    }
    Some(entries)
}

/// The `Code` of each cancellation reason, in order.
fn cancellation_codes(body: &Option<Value>) -> Vec<String> {
    body.as_ref()
        .and_then(|b| b.get("CancellationReasons"))
        .and_then(Value::as_array)
        .map(|reasons| {
            reasons
                .iter()
                .map(|r| {
                    r.get("Code")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                })
                .collect()
        })
        .unwrap_or_default()
}
