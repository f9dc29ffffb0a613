//! The answers the proxy gives itself, shaped as real DynamoDB's on the JSON 1.0 protocol.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::CONTENT_TYPE;
use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use crate::config::ThrottleAs;
use crate::ledger::{Direction, Limit, Throttle};

const NAMESPACE: &str = "com.amazonaws.dynamodb.v20120810#";

const PROVISIONED_MESSAGE: &str = "The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API.";

const ON_DEMAND_MESSAGE: &str = "Throughput exceeds the current capacity of your table or index. DynamoDB is automatically scaling your table or index so please try again shortly. If exceptions persist, check if you have a hot key: https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html";

/// The text of a transaction conflict, alone or as a cancellation reason.
const CONFLICT_MESSAGE: &str = "Transaction is ongoing for the item";

/// An answer of `status` with a JSON body, as DynamoDB sends it.
pub(crate) fn json(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-amz-json-1.0"),
    );
    if let Ok(id) = format!("fidelity-{:08x}-{n:012x}", std::process::id()).parse() {
        headers.insert("x-amzn-requestid", id);
    }
    response
}

/// An error answer: 400 with `__type` set to `name` in DynamoDB's namespace.
fn error(name: &str, mut fields: Value) -> Response<Full<Bytes>> {
    fields["__type"] = Value::String(format!("{NAMESPACE}{name}"));
    json(StatusCode::BAD_REQUEST, &fields)
}

/// A throttle of `direction` for `throttles` (a table and the limit that refused a
/// request on it, one reason per distinct pair), in `region`.
pub(crate) fn throttled(
    throttle_as: ThrottleAs,
    direction: Direction,
    region: &str,
    throttles: &[Throttle],
) -> Response<Full<Bytes>> {
    let operation = match direction {
        Direction::Read => "Read",
        Direction::Write => "Write",
    };
    let mut seen: Vec<&Throttle> = Vec::new();
    let reasons: Vec<Value> = throttles
        .iter()
        .filter(|t| {
            let first = !seen.contains(t);
            seen.push(t);
            first
        })
        .map(|t| {
            let limit = match t.limit {
                Limit::KeyRange => "KeyRangeThroughputExceeded",
                Limit::Table => "AccountLimitExceeded",
            };
            // An index's entries are named `{table}/index/{index}`, as its ARN ends.
            let scope = if t.table.contains("/index/") {
                "Index"
            } else {
                "Table"
            };
            json!({
                "reason": format!("{scope}{operation}{limit}"),
                "resource": format!("arn:aws:dynamodb:{region}:000000000000:table/{}", t.table),
            })
        })
        .collect();
    match throttle_as {
        ThrottleAs::ProvisionedThroughputExceeded => error(
            "ProvisionedThroughputExceededException",
            json!({"message": PROVISIONED_MESSAGE, "ThrottlingReasons": reasons}),
        ),
        ThrottleAs::Throttling => error(
            "ThrottlingException",
            json!({"message": ON_DEMAND_MESSAGE, "throttlingReasons": reasons}),
        ),
    }
}

/// A request refused as invalid, saying why.
pub(crate) fn validation(message: &str) -> Response<Full<Bytes>> {
    error("ValidationException", json!({"message": message}))
}

/// A single write refused: a transaction holds its item.
pub(crate) fn transaction_conflict() -> Response<Full<Bytes>> {
    error(
        "TransactionConflictException",
        json!({"message": CONFLICT_MESSAGE}),
    )
}

/// A transaction cancelled: `conflicts[i]` says whether its `i`-th item is held by
/// another.
pub(crate) fn transaction_cancelled(conflicts: &[bool]) -> Response<Full<Bytes>> {
    let reasons: Vec<Value> = conflicts
        .iter()
        .map(|&conflict| {
            if conflict {
                json!({"Code": "TransactionConflict", "Message": CONFLICT_MESSAGE})
            } else {
                json!({"Code": "None"})
            }
        })
        .collect();
    let codes: Vec<&str> = conflicts
        .iter()
        .map(|&c| if c { "TransactionConflict" } else { "None" })
        .collect();
    error(
        "TransactionCanceledException",
        json!({
            "Message": format!(
                "Transaction cancelled, please refer cancellation reasons for specific reasons [{}]",
                codes.join(", ")
            ),
            "CancellationReasons": reasons,
        }),
    )
}

/// The upstream did not answer: a gateway error, which SDKs retry as transient.
pub(crate) fn unreachable() -> Response<Full<Bytes>> {
    json(
        StatusCode::BAD_GATEWAY,
        &json!({"message": "the upstream DynamoDB did not answer"}),
    )
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;

    use super::*;

    fn body(response: Response<Full<Bytes>>) -> Value {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = runtime
            .block_on(response.into_body().collect())
            .unwrap()
            .to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn a_provisioned_throttle_names_the_reason_and_the_table() {
        let answer = throttled(
            ThrottleAs::ProvisionedThroughputExceeded,
            Direction::Write,
            "eu-west-1",
            &[key_range("t"), key_range("t")],
        );
        assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            body(answer),
            json!({
                "__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                "message": PROVISIONED_MESSAGE,
                "ThrottlingReasons": [{
                    "reason": "TableWriteKeyRangeThroughputExceeded",
                    "resource": "arn:aws:dynamodb:eu-west-1:000000000000:table/t",
                }],
            })
        );
    }

    #[test]
    fn an_on_demand_throttle_uses_the_lower_case_reasons_key() {
        let answer = body(throttled(
            ThrottleAs::Throttling,
            Direction::Read,
            "us-east-1",
            &[
                key_range("t"),
                Throttle {
                    table: "t".to_owned(),
                    limit: Limit::Table,
                },
            ],
        ));
        assert_eq!(
            answer["__type"],
            "com.amazonaws.dynamodb.v20120810#ThrottlingException"
        );
        assert_eq!(
            answer["throttlingReasons"][0]["reason"],
            "TableReadKeyRangeThroughputExceeded"
        );
        assert_eq!(
            answer["throttlingReasons"][1]["reason"],
            "TableReadAccountLimitExceeded"
        );
        assert_eq!(answer["message"], ON_DEMAND_MESSAGE);
    }

    fn key_range(table: &str) -> Throttle {
        Throttle {
            table: table.to_owned(),
            limit: Limit::KeyRange,
        }
    }

    #[test]
    fn a_cancellation_gives_one_reason_per_item_in_order() {
        assert_eq!(
            body(transaction_cancelled(&[false, true])),
            json!({
                "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
                "Message": "Transaction cancelled, please refer cancellation reasons for specific reasons [None, TransactionConflict]",
                "CancellationReasons": [
                    {"Code": "None"},
                    {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"},
                ],
            })
        );
    }
}
