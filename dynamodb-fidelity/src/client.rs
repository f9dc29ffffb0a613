//! Reading a proxy's counters over HTTP, from another process.

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::error::Error;
use crate::stats::Stats;

/// The counters of the proxy at `endpoint` (`http://host:port`, as
/// [`Running::endpoint`](crate::Running::endpoint) gives it), from its
/// `GET /_fidelity/stats`.
pub async fn fetch_stats(endpoint: &str) -> Result<Stats, Error> {
    let body = call(endpoint, Method::GET, "stats", Bytes::new()).await?;
    serde_json::from_slice(&body).map_err(|e| failed(endpoint, e.into()))
}

/// Zeroes the counters of the proxy at `endpoint` (`POST /_fidelity/reset`).
pub async fn reset_stats(endpoint: &str) -> Result<(), Error> {
    call(endpoint, Method::POST, "reset", Bytes::new())
        .await
        .map(drop)
}

/// Sets the per-item ceilings of the proxy at `endpoint`, in units per second
/// (`POST /_fidelity/ceilings`).
pub async fn set_ceilings(endpoint: &str, write: f64, read: f64) -> Result<(), Error> {
    let body = serde_json::json!({ "write": write, "read": read }).to_string();
    call(endpoint, Method::POST, "ceilings", Bytes::from(body))
        .await
        .map(drop)
}

/// Sets the time the proxy at `endpoint` adds to every DynamoDB call
/// (`POST /_fidelity/latency`).
pub async fn set_latency(endpoint: &str, latency: crate::Latency) -> Result<(), Error> {
    let micros = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let body =
        serde_json::json!({ "base_us": micros(latency.base), "tail_us": micros(latency.tail) })
            .to_string();
    call(endpoint, Method::POST, "latency", Bytes::from(body))
        .await
        .map(drop)
}

/// Sets how many partitions each table of the proxy at `endpoint` has (`None`: one per
/// item) and how soon a hot item gets one of its own (`None`: never), from now on; every
/// partition starts full (`POST /_fidelity/partitions`).
pub async fn set_partitions(
    endpoint: &str,
    partitions: Option<u32>,
    isolate_after: Option<std::time::Duration>,
) -> Result<(), Error> {
    let millis = isolate_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let body =
        serde_json::json!({ "partitions": partitions, "isolate_after_ms": millis }).to_string();
    call(endpoint, Method::POST, "partitions", Bytes::from(body))
        .await
        .map(drop)
}

fn failed(endpoint: &str, source: Box<dyn std::error::Error + Send + Sync>) -> Error {
    Error::Fetch {
        endpoint: endpoint.to_owned(),
        source,
    }
}

/// Calls the control endpoint `path` of the proxy at `endpoint`; the answer's body.
async fn call(endpoint: &str, method: Method, path: &str, body: Bytes) -> Result<Bytes, Error> {
    let base = endpoint.trim_end_matches('/');
    let uri: Uri = format!("{base}/_fidelity/{path}")
        .parse()
        .map_err(|_| Error::Endpoint(endpoint.to_owned()))?;
    if uri.scheme_str() != Some("http") {
        return Err(Error::Endpoint(endpoint.to_owned()));
    }
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Full::new(body))
        .map_err(|e| failed(endpoint, e.into()))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client
        .request(request)
        .await
        .map_err(|e| failed(endpoint, e.into()))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| failed(endpoint, e.into()))?
        .to_bytes();
    if !status.is_success() {
        let said = String::from_utf8_lossy(&body).into_owned();
        return Err(failed(
            endpoint,
            format!("it answered {status}: {said}").into(),
        ));
    }
    Ok(body)
}
