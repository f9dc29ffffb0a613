//! Reading a proxy's counters over HTTP, from another process.

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::error::Error;
use crate::stats::Stats;

/// The counters of the proxy at `endpoint` (`http://host:port`, as
/// [`Running::endpoint`](crate::Running::endpoint) gives it), from its
/// `GET /_fidelity/stats`.
pub async fn fetch_stats(endpoint: &str) -> Result<Stats, Error> {
    let base = endpoint.trim_end_matches('/');
    let uri: Uri = format!("{base}/_fidelity/stats")
        .parse()
        .map_err(|_| Error::Endpoint(endpoint.to_owned()))?;
    if uri.scheme_str() != Some("http") {
        return Err(Error::Endpoint(endpoint.to_owned()));
    }
    let failed = |source: Box<dyn std::error::Error + Send + Sync>| Error::Fetch {
        endpoint: endpoint.to_owned(),
        source,
    };
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let response = client.get(uri).await.map_err(|e| failed(e.into()))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| failed(e.into()))?
        .to_bytes();
    if !status.is_success() {
        return Err(failed(format!("it answered {status}").into()));
    }
    serde_json::from_slice(&body).map_err(|e| failed(e.into()))
}
