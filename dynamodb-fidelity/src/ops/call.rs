//! One client request: its parts, body and caller, and sending it on.

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper::http::request::Parts;
use serde_json::Value;

use crate::caller::Caller;
use crate::proxy::Proxy;
use crate::reply;
use crate::upstream::Answer;

/// A request as the client sent it.
#[derive(Debug)]
pub(crate) struct Call {
    parts: Parts,
    body: Bytes,
    caller: Caller,
}

impl Call {
    pub(crate) fn new(parts: Parts, body: Bytes) -> Call {
        let caller = Caller::of(&parts.headers);
        Call {
            parts,
            body,
            caller,
        }
    }

    /// The operation named by `X-Amz-Target` (`PutItem`), if it is DynamoDB's.
    pub(crate) fn operation(&self) -> Option<&str> {
        self.parts
            .headers
            .get("x-amz-target")?
            .to_str()
            .ok()?
            .strip_prefix("DynamoDB_20120810.")
    }

    /// The body, if it is a JSON object.
    pub(crate) fn json(&self) -> Option<Value> {
        serde_json::from_slice::<Value>(&self.body)
            .ok()
            .filter(Value::is_object)
    }

    /// Who sent it.
    pub(crate) fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Sends it upstream, with `body` in place of its own if given; the answer, or what to
    /// answer the client if the upstream did not.
    pub(crate) async fn send(
        &self,
        proxy: &Proxy,
        body: Option<&Value>,
    ) -> Result<Answer, Response<Full<Bytes>>> {
        let body = body.map_or_else(|| self.body.clone(), |b| Bytes::from(b.to_string()));
        proxy
            .upstream
            .forward(&self.parts, body)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "forwarding a request failed");
                reply::unreachable()
            })
    }

    /// Sends it upstream as it is and answers what the upstream answers.
    pub(crate) async fn pass(&self, proxy: &Proxy) -> Response<Full<Bytes>> {
        match self.send(proxy, None).await {
            Ok(answer) => answer.into_response(),
            Err(response) => response,
        }
    }
}
