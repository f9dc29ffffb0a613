//! The upstream DynamoDB Local: requests forwarded as they came, and the proxy's own calls
//! (`DescribeTable`, consistent `GetItem`s), over one pooled keep-alive client.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde_json::{Map, Value, json};

use crate::caller::Caller;
use crate::crc::crc32;
use crate::error::Error;
use crate::size::item_size;

/// Headers that belong to one connection, not to the request or answer they travel with,
/// and the body framing the proxy sets afresh.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
    "content-length",
];

/// Connections idle this long are closed rather than reused: shorter than the server's
/// own idle timeout, so the pool never hands out a connection the server just closed.
const IDLE: Duration = Duration::from_secs(10);

/// The upstream could not be reached or broke off its answer.
#[derive(Debug, thiserror::Error)]
#[error("the upstream did not answer")]
pub(crate) struct Unreachable(#[source] Box<dyn std::error::Error + Send + Sync>);

/// An answer, read whole.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    /// The body as JSON (`None` if it is not JSON).
    pub(crate) fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// Whether the operation succeeded.
    pub(crate) fn is_success(&self) -> bool {
        self.status.is_success()
    }

    /// The error's name without its namespace (`ConditionalCheckFailedException`), if the
    /// answer is a DynamoDB error.
    pub(crate) fn error_name(&self) -> Option<String> {
        if self.is_success() {
            return None;
        }
        let json = self.json()?;
        let name = json.get("__type")?.as_str()?;
        Some(name.rsplit('#').next().unwrap_or(name).to_owned())
    }

    /// The same answer with `body` in place of its own (length and checksum to match).
    pub(crate) fn with_json(mut self, body: &Value) -> Answer {
        self.body = Bytes::from(body.to_string());
        if self.headers.contains_key("x-amz-crc32") {
            self.headers
                .insert("x-amz-crc32", HeaderValue::from(crc32(&self.body)));
        }
        self
    }

    /// The answer to send back.
    pub(crate) fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(self.body));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response
    }
}

/// The upstream and a pooled client to it.
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    /// `http://host:port`, no trailing slash.
    base: String,
}

impl Upstream {
    /// A client of the DynamoDB Local at `url` (`http://host:port`).
    pub(crate) fn new(url: &str) -> Result<Upstream, Error> {
        let invalid = || Error::Upstream(url.to_owned());
        let uri: Uri = url.parse().map_err(|_| invalid())?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(invalid());
        }
        let mut connector = HttpConnector::new();
        // Small JSON requests and answers: never wait to fill a segment.
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE)
            .pool_timer(TokioTimer::new())
            .build(connector);
        Ok(Upstream {
            client,
            base: format!("http://{}", uri.authority().ok_or_else(invalid)?),
        })
    }

    /// Sends a client's request on, as it came (`body` in place of its own, which may have
    /// been rewritten).
    pub(crate) async fn forward(&self, parts: &Parts, body: Bytes) -> Result<Answer, Unreachable> {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut request = Request::builder()
            .method(parts.method.clone())
            .uri(format!("{}{path}", self.base));
        for (name, value) in &parts.headers {
            if !HOP_BY_HOP.contains(&name.as_str()) {
                request = request.header(name, value);
            }
        }
        self.send(request, body).await
    }

    /// The proxy's own call of `operation` with `body`, as `caller`.
    pub(crate) async fn call(
        &self,
        caller: &Caller,
        operation: &str,
        body: &Value,
    ) -> Result<Answer, Unreachable> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!("{}/", self.base))
            .header(CONTENT_TYPE, "application/x-amz-json-1.0")
            .header("x-amz-target", format!("DynamoDB_20120810.{operation}"));
        for (name, value) in caller.headers() {
            request = request.header(name, value);
        }
        self.send(request, Bytes::from(body.to_string())).await
    }

    /// The item of `table` at `key` as it is now, read strongly consistent and unbilled
    /// (an empty map: no item); `None` if the read failed.
    pub(crate) async fn read_item(
        &self,
        caller: &Caller,
        table: &str,
        key: &Map<String, Value>,
    ) -> Option<Map<String, Value>> {
        let body = json!({"TableName": table, "Key": key, "ConsistentRead": true});
        let answer = self.call(caller, "GetItem", &body).await.ok()?;
        if !answer.is_success() {
            tracing::warn!(table, status = %answer.status, "the proxy's own read of an item failed");
            return None;
        }
        let json = answer.json()?;
        Some(
            json.get("Item")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        )
    }

    /// The size of the item of `table` at `key` now (0: no item); `None` if the read
    /// failed.
    pub(crate) async fn item_size(
        &self,
        caller: &Caller,
        table: &str,
        key: &Map<String, Value>,
    ) -> Option<u64> {
        Some(item_size(&self.read_item(caller, table, key).await?))
    }

    async fn send(
        &self,
        request: hyper::http::request::Builder,
        body: Bytes,
    ) -> Result<Answer, Unreachable> {
        let request = request
            .header(CONTENT_LENGTH, body.len())
            .body(Full::new(body))
            .map_err(|e| Unreachable(e.into()))?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| Unreachable(e.into()))?;
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| Unreachable(e.into()))?
            .to_bytes();
        let mut headers = parts.headers;
        for name in HOP_BY_HOP {
            headers.remove(HeaderName::from_static(name));
        }
        Ok(Answer {
            status: parts.status,
            headers,
            body,
        })
    }
}
