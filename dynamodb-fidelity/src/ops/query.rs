//! Query and Scan: the items they read are known only from the answer, so the answer is
//! checked against their read capacity afterwards (a read changes nothing, so answering a
//! throttle instead is as if it had been refused). Billed as DynamoDB bills them: once
//! for the total size of every item evaluated, before a filter and at full size whatever
//! the projection, rounded up to 4 KB, and shared among those items in proportion to
//! their sizes. A filtered, projected or counting request's evaluated items are read by
//! the proxy (unbilled): the same request without its filter, projection or `Select`,
//! from the same start and with the same `Limit` (which counts evaluated items).

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
    let evaluated = match evaluated_request(json) {
        Some(body) => evaluated_items(proxy, call, &body).await,
        None => None,
    };
    let items: Vec<(Option<ItemId>, u64)> = evaluated
        .as_ref()
        .unwrap_or(&out)
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

/// The request that reads every item `request` evaluates, whole: `None` if it returns them
/// all already (no filter, projection or `Select`). Expression names and values only the
/// filter or the projection used are left out (DynamoDB refuses unused ones).
fn evaluated_request(request: &Value) -> Option<Value> {
    const NARROWING: [&str; 6] = [
        "FilterExpression",
        "ProjectionExpression",
        "AttributesToGet",
        "Select",
        "QueryFilter",
        "ScanFilter",
    ];
    let object = request.as_object()?;
    if !NARROWING.iter().any(|k| object.contains_key(*k)) {
        return None;
    }
    let mut body = object.clone();
    for key in NARROWING.iter().chain(&["ConditionalOperator"]) {
        body.remove(*key);
    }
    let used = body
        .get("KeyConditionExpression")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    for field in ["ExpressionAttributeNames", "ExpressionAttributeValues"] {
        if let Some(map) = body.get_mut(field).and_then(Value::as_object_mut) {
            map.retain(|name, _| mentions(&used, name));
            if map.is_empty() {
                body.remove(field);
            }
        }
    }
    Some(Value::Object(body))
}

/// Whether `expression` mentions the placeholder `name` (`#n` or `:v`) as a whole token.
fn mentions(expression: &str, name: &str) -> bool {
    expression.match_indices(name).any(|(at, _)| {
        expression[at + name.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    })
}

/// The answer of `body` (see [`evaluated_request`]), read by the proxy; `None` if it failed
/// (what was returned is billed then).
async fn evaluated_items(proxy: &Proxy, call: &Call, body: &Value) -> Option<Value> {
    let operation = call.operation()?;
    let answer = proxy
        .upstream
        .call(call.caller(), operation, body)
        .await
        .ok()?;
    if !answer.is_success() {
        tracing::warn!(status = %answer.status, "the proxy's own read of what a {operation} evaluated failed");
        return None;
    }
    answer.json()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_evaluated_request_drops_the_filter_and_what_only_it_used() {
        let request = json!({
            "TableName": "t",
            "KeyConditionExpression": "#d = :d",
            "FilterExpression": "#c > :c AND begins_with(#d, :dx)",
            "ProjectionExpression": "#d",
            "ExpressionAttributeNames": {"#d": "pk", "#c": "cost"},
            "ExpressionAttributeValues": {":d": {"S": "a"}, ":dx": {"S": "b"}, ":c": {"N": "1"}},
            "Limit": 10
        });
        assert_eq!(
            evaluated_request(&request).unwrap(),
            json!({
                "TableName": "t",
                "KeyConditionExpression": "#d = :d",
                "ExpressionAttributeNames": {"#d": "pk"},
                "ExpressionAttributeValues": {":d": {"S": "a"}},
                "Limit": 10
            })
        );
        // A scan with a filter only: no expression left, none of its names or values.
        let scan = json!({
            "TableName": "t",
            "FilterExpression": "begins_with(#k, :p)",
            "ExpressionAttributeNames": {"#k": "pk"},
            "ExpressionAttributeValues": {":p": {"S": "lease#"}}
        });
        assert_eq!(evaluated_request(&scan).unwrap(), json!({"TableName": "t"}));
        // Nothing narrows it: what it returns is what it evaluated.
        assert_eq!(
            evaluated_request(&json!({"TableName": "t", "Limit": 5})),
            None
        );
    }
}
