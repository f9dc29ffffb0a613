//! CreateTable, UpdateTable and DeleteTable: what the proxy knows of a table starts over
//! when it is created or deleted, and a table warmed (`WarmThroughput`) keeps what it was
//! warmed to. The warmth is taken out of the request before it is forwarded, so an
//! upstream that does not know the parameter still creates the table.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use super::call::Call;
use crate::proxy::Proxy;
use crate::reply;

/// Which table operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TableOp {
    Create,
    Update,
    Delete,
}

pub(super) async fn answer(
    proxy: &Proxy,
    call: &Call,
    json: Value,
    op: TableOp,
) -> Response<Full<Bytes>> {
    let Some(table) = json
        .get("TableName")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return call.pass(proxy).await;
    };
    let forgets = op != TableOp::Update;
    if forgets {
        // A table of this name may come back with other keys.
        proxy.schemas.forget(&table);
        proxy.locks.forget_table(&table);
    }
    let (warmth, request) = match without_warmth(json) {
        Some((warmth, request)) => (Some(warmth), Some(request)),
        None => (None, None),
    };
    if let (Some((write, read)), Some(rest)) = (warmth, &request)
        && op == TableOp::Update
        && rest.as_object().is_some_and(|o| o.len() == 1)
    {
        // Warmth alone: nothing for the upstream to change.
        proxy.ledger().warm(&table, write, read);
        tracing::info!(table, write, read, "table warmed");
        return reply::json(
            StatusCode::OK,
            &json!({"TableDescription": {
                "TableName": table,
                "TableStatus": "ACTIVE",
                "WarmThroughput": {
                    "WriteUnitsPerSecond": write,
                    "ReadUnitsPerSecond": read,
                    "Status": "UPDATING",
                },
            }}),
        );
    }
    let answer = match call.send(proxy, request.as_ref()).await {
        Ok(answer) => answer,
        Err(response) => return response,
    };
    if answer.is_success() {
        // Only a table that was created or deleted starts over (a CreateTable of a table
        // that exists fails, and leaves it as it was).
        if forgets {
            proxy.ledger().forget_table(&table);
            proxy.ttls.forget(&table);
        }
        if let Some((write, read)) = warmth {
            proxy.ledger().warm(&table, write, read);
            tracing::info!(table, write, read, "table warmed");
        }
    }
    answer.into_response()
}

/// The write and read units a second a request's `WarmThroughput` asks for, and the
/// request without it; `None` if it has none.
fn without_warmth(mut json: Value) -> Option<((f64, f64), Value)> {
    let warm = json.as_object_mut()?.remove("WarmThroughput")?;
    let units = |name: &str| {
        warm.get(name)
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
            .max(0.0)
    };
    Some((
        (units("WriteUnitsPerSecond"), units("ReadUnitsPerSecond")),
        json,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmth_is_read_and_taken_out_of_the_request() {
        let request = json!({
            "TableName": "t",
            "WarmThroughput": {"WriteUnitsPerSecond": 8000, "ReadUnitsPerSecond": 24000},
        });
        let (warmth, rest) = without_warmth(request).unwrap();
        assert_eq!(warmth, (8000.0, 24000.0));
        assert_eq!(rest, json!({"TableName": "t"}));
        let partial = json!({"TableName": "t", "WarmThroughput": {"WriteUnitsPerSecond": 5}});
        assert_eq!(without_warmth(partial).unwrap().0, (5.0, 0.0));
        assert!(without_warmth(json!({"TableName": "t"})).is_none());
    }
}
