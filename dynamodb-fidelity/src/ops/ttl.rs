//! UpdateTimeToLive and DescribeTimeToLive, answered by the proxy: real DynamoDB deletes an
//! expired item "typically within two days" (the developer guide), so within any run an
//! expired item is still read, queried, scanned and billed. The proxy keeps each table's
//! TTL setting itself and never passes it on, so the upstream never sweeps an item early.
//! Turning TTL on while it is on is refused as DynamoDB refuses it (a
//! `ValidationException`), and so is any change within an hour of the last one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use super::call::Call;
use crate::proxy::Proxy;
use crate::reply;

/// How soon after a change DynamoDB refuses another (its documented hour).
const SETTLE: Duration = Duration::from_secs(3_600);

/// A table's TTL as set through the proxy: the attribute, whether it is on, and when it
/// last changed.
#[derive(Debug, Clone)]
struct Setting {
    attribute: String,
    enabled: bool,
    changed: Instant,
}

/// Every table's TTL setting, by caller scope and table name.
#[derive(Debug, Default)]
pub(crate) struct Ttls {
    settings: Mutex<HashMap<(String, String), Setting>>,
}

impl Ttls {
    /// Forgets `table`'s setting in every scope: it was created or deleted.
    pub(crate) fn forget(&self, table: &str) {
        self.lock().retain(|(_, name), _| name != table);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Setting>> {
        self.settings.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Which TTL operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TtlOp {
    Update,
    Describe,
}

pub(super) async fn answer(
    proxy: &Proxy,
    call: &Call,
    json: &Value,
    op: TtlOp,
) -> Response<Full<Bytes>> {
    let Some(table) = json.get("TableName").and_then(Value::as_str) else {
        return call.pass(proxy).await;
    };
    // A table the upstream cannot describe: its answer says why (it does not exist).
    if proxy
        .schemas
        .get(&proxy.upstream, call.caller(), table)
        .await
        .is_none()
    {
        return call.pass(proxy).await;
    }
    let entry = (call.caller().scope().to_owned(), table.to_owned());
    match op {
        TtlOp::Describe => {
            let setting = proxy.ttls.lock().get(&entry).cloned();
            let description = match setting {
                Some(s) if s.enabled => {
                    json!({"TimeToLiveStatus": "ENABLED", "AttributeName": s.attribute})
                }
                _ => json!({"TimeToLiveStatus": "DISABLED"}),
            };
            reply::json(
                StatusCode::OK,
                &json!({"TimeToLiveDescription": description}),
            )
        }
        TtlOp::Update => {
            let Some(spec) = json.get("TimeToLiveSpecification") else {
                return call.pass(proxy).await;
            };
            let (Some(attribute), Some(enabled)) = (
                spec.get("AttributeName").and_then(Value::as_str),
                spec.get("Enabled").and_then(Value::as_bool),
            ) else {
                return call.pass(proxy).await;
            };
            let mut settings = proxy.ttls.lock();
            let now = Instant::now();
            if let Some(s) = settings.get(&entry) {
                if s.enabled && enabled {
                    return reply::validation("TimeToLive is already enabled");
                }
                if now.duration_since(s.changed) < SETTLE {
                    return reply::validation(
                        "Time to live has been modified multiple times within a fixed interval",
                    );
                }
            } else if !enabled {
                return reply::validation("TimeToLive is already disabled");
            }
            settings.insert(
                entry,
                Setting {
                    attribute: attribute.to_owned(),
                    enabled,
                    changed: now,
                },
            );
            reply::json(
                StatusCode::OK,
                &json!({"TimeToLiveSpecification": {"AttributeName": attribute, "Enabled": enabled}}),
            )
        }
    }
}
