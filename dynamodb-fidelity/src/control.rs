//! The proxy's own endpoints, under a path DynamoDB's API (`POST /`) never uses:
//! `GET /_fidelity/stats`, `POST /_fidelity/reset`, `POST /_fidelity/ceilings`,
//! `POST /_fidelity/latency`, `POST /_fidelity/partitions`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde::Deserialize;
use serde_json::json;

use crate::proxy::Proxy;
use crate::reply;

/// Where the control endpoints live.
pub(crate) const PREFIX: &str = "/_fidelity/";

/// The body of `POST /_fidelity/ceilings`.
#[derive(Debug, Deserialize)]
struct Ceilings {
    write: f64,
    read: f64,
}

/// The body of `POST /_fidelity/partitions`.
#[derive(Debug, Deserialize)]
struct Partitions {
    partitions: Option<u32>,
    isolate_after_ms: Option<u64>,
}

/// The body of `POST /_fidelity/latency`.
#[derive(Debug, Deserialize)]
struct Latency {
    base_us: u64,
    tail_us: u64,
}

pub(crate) fn answer(proxy: &Proxy, parts: &Parts, body: &Bytes) -> Response<Full<Bytes>> {
    let endpoint = &parts.uri.path()[PREFIX.len()..];
    match (&parts.method, endpoint) {
        (&Method::GET, "stats") => match serde_json::to_value(proxy.ledger().stats()) {
            Ok(stats) => reply::json(StatusCode::OK, &stats),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        },
        (&Method::POST, "reset") => {
            proxy.ledger().reset();
            reply::json(StatusCode::OK, &json!({}))
        }
        (&Method::POST, "ceilings") => {
            let ceilings = match serde_json::from_slice::<Ceilings>(body) {
                Ok(ceilings) => ceilings,
                Err(e) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        &format!(
                            "expected {{\"write\": <units per second>, \"read\": <units per second>}}: {e}"
                        ),
                    );
                }
            };
            match proxy.set_ceilings(ceilings.write, ceilings.read) {
                Ok(()) => reply::json(StatusCode::OK, &json!({})),
                Err(e) => error(StatusCode::BAD_REQUEST, &e.to_string()),
            }
        }
        (&Method::POST, "latency") => match serde_json::from_slice::<Latency>(body) {
            Ok(l) => {
                proxy.set_latency(crate::Latency {
                    base: Duration::from_micros(l.base_us),
                    tail: Duration::from_micros(l.tail_us),
                });
                reply::json(StatusCode::OK, &json!({}))
            }
            Err(e) => error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "expected {{\"base_us\": <microseconds>, \"tail_us\": <microseconds>}}: {e}"
                ),
            ),
        },
        (&Method::POST, "partitions") => match serde_json::from_slice::<Partitions>(body) {
            Ok(p) => match proxy
                .set_partitions(p.partitions, p.isolate_after_ms.map(Duration::from_millis))
            {
                Ok(()) => reply::json(StatusCode::OK, &json!({})),
                Err(e) => error(StatusCode::BAD_REQUEST, &e.to_string()),
            },
            Err(e) => error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "expected {{\"partitions\": <count or null>, \"isolate_after_ms\": <milliseconds or null>}}: {e}"
                ),
            ),
        },
        (_, "stats" | "reset" | "ceilings" | "latency" | "partitions") => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "GET /_fidelity/stats, POST /_fidelity/reset, POST /_fidelity/ceilings, POST /_fidelity/latency, POST /_fidelity/partitions",
        ),
        _ => error(StatusCode::NOT_FOUND, "no such endpoint"),
    }
}

fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    reply::json(status, &json!({"message": message}))
}
