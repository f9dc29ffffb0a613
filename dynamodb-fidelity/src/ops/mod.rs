//! DynamoDB's API through the proxy: each item-level operation has its own file; every
//! other request passes through unchanged.

mod batch_get;
mod batch_write;
mod call;
mod get_item;
mod query;
mod single_write;
mod table;
mod transact_get;
mod transact_write;
mod ttl;

pub(crate) use ttl::Ttls;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper::http::request::Parts;
use serde_json::Value;

use crate::proxy::Proxy;
use call::Call;
use single_write::WriteKind;
use table::TableOp;
use ttl::TtlOp;

/// The answer to one request on DynamoDB's API.
pub(crate) async fn answer(proxy: &Proxy, parts: Parts, body: Bytes) -> Response<Full<Bytes>> {
    proxy.ledger().count_api_request();
    let call = Call::new(parts, body);
    let Some(json) = call.json() else {
        return call.pass(proxy).await;
    };
    match call.operation() {
        Some("PutItem") => single_write::answer(proxy, &call, &json, WriteKind::Put).await,
        Some("UpdateItem") => single_write::answer(proxy, &call, &json, WriteKind::Update).await,
        Some("DeleteItem") => single_write::answer(proxy, &call, &json, WriteKind::Delete).await,
        Some("BatchWriteItem") => batch_write::answer(proxy, &call, &json).await,
        Some("TransactWriteItems") => transact_write::answer(proxy, &call, &json).await,
        Some("GetItem") => get_item::answer(proxy, &call, &json).await,
        Some("BatchGetItem") => batch_get::answer(proxy, &call, &json).await,
        Some("TransactGetItems") => transact_get::answer(proxy, &call, &json).await,
        Some("Query" | "Scan") => query::answer(proxy, &call, &json).await,
        Some("CreateTable") => table::answer(proxy, &call, json, TableOp::Create).await,
        Some("UpdateTable") => table::answer(proxy, &call, json, TableOp::Update).await,
        Some("DeleteTable") => table::answer(proxy, &call, json, TableOp::Delete).await,
        Some("UpdateTimeToLive") => ttl::answer(proxy, &call, &json, TtlOp::Update).await,
        Some("DescribeTimeToLive") => ttl::answer(proxy, &call, &json, TtlOp::Describe).await,
        _ => call.pass(proxy).await,
    }
}

/// Whether a read asks for some attributes only: the answer is then smaller than the item
/// DynamoDB bills, and the proxy reads the whole item to size it.
fn is_projected(request: &Value) -> bool {
    request.get("ProjectionExpression").is_some() || request.get("AttributesToGet").is_some()
}
