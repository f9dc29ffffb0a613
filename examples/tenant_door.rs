//! A limit per tenant at the door of an inbound API (axum): one keyed bucket,
//! `ingest#rpm`, gives every tenant 5 requests refilling 1 a second, the tenant named by
//! the `x-tenant` header. A tenant's first request creates its bucket; every replica of
//! the service sharing one table shares each tenant's limit. A refusal is `429 Too Many
//! Requests` with `Retry-After` (whole seconds, rounded up) and the IETF rate-limit fields
//! (draft-ietf-httpapi-ratelimit-headers: `RateLimit-Policy: "ingest";q=5;w=5`,
//! `RateLimit: "ingest";r=0;t=<seconds>`); a grant carries the policy. Back-pressure from
//! the store (no bucket short) is a `503` with `Retry-After`.
//!
//! ```text
//! # One process on the in-memory store, which sends itself a burst from two tenants:
//! cargo run -p sluice-examples --example tenant_door
//! # A replica on a shared table (start several; each prints where it listens):
//! cargo run -p sluice-examples --features dynamodb --example tenant_door -- \
//!     serve 127.0.0.1:8080 --table sluice --endpoint http://127.0.0.1:8000
//! curl -i -H 'x-tenant: acme' http://127.0.0.1:8080/ingest
//! ```
#![allow(clippy::print_stdout)]

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use sluice::{Bucket, Dimension, Error, RefillRate, Sluice};

/// The keyed bucket every tenant's limit is a key of.
const TEMPLATE: &str = "ingest#rpm";
/// Each tenant's bucket: capacity and refill per second.
const PER_TENANT: (u64, u64) = (5, 1);

/// What the door's handler needs: the client, and the policy it advertises.
#[derive(Clone)]
struct Door {
    sluice: Sluice,
    template: Dimension,
    /// `RateLimit-Policy`: the quota (the bucket's capacity) and the window, the seconds the
    /// bucket takes to refill from empty.
    policy: HeaderValue,
}

/// Defines the template (each tenant's bucket; as `sluice apply` would from a bucket file)
/// and returns the door's router.
async fn door(sluice: Sluice) -> Result<Router, Error> {
    let (capacity, per_second) = PER_TENANT;
    let bucket = Bucket::requests(RefillRate::per_second(per_second)).with_capacity(capacity);
    sluice.put_bucket(TEMPLATE, bucket.keyed()).await?;
    // The window: the whole seconds the bucket takes to refill from empty.
    let policy = format!(
        "\"ingest\";q={capacity};w={}",
        capacity.div_ceil(per_second)
    );
    let door = Door {
        sluice,
        template: TEMPLATE.parse()?,
        policy: HeaderValue::from_str(&policy).expect("a header value"),
    };
    Ok(Router::new()
        .route("/ingest", post(ingest).get(ingest))
        .with_state(door))
}

/// One request: granted on the tenant's key, or refused with when to come back.
async fn ingest(State(door): State<Door>, headers: HeaderMap) -> Response {
    let Some(tenant) = headers.get("x-tenant").and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "name the tenant in x-tenant\n").into_response();
    };
    let key = match door.template.with_key(tenant) {
        Ok(key) => key,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let policy = (
        header::HeaderName::from_static("ratelimit-policy"),
        door.policy,
    );
    match door.sluice.acquire(key.as_str()).await {
        Ok(lease) => {
            // A request taken is spent: nothing to give back.
            drop(lease.release().await);
            ([policy], "accepted\n").into_response()
        }
        // Back-pressure (the store pushed back; no bucket short): the tenant's quota is not
        // spent, so no `RateLimit` says it is; come back after the wait.
        Err(Error::RetryIn(refusal)) if refusal.short.is_empty() => {
            let seconds = whole_seconds_up(refusal.delay);
            let after = [(header::RETRY_AFTER, HeaderValue::from(seconds))];
            (StatusCode::SERVICE_UNAVAILABLE, after, "try again\n").into_response()
        }
        Err(Error::RetryIn(refusal)) => {
            let seconds = whole_seconds_up(refusal.delay);
            let state = format!("\"ingest\";r=0;t={seconds}");
            let fields = [
                (header::RETRY_AFTER, HeaderValue::from(seconds)),
                (
                    header::HeaderName::from_static("ratelimit"),
                    HeaderValue::from_str(&state).expect("a header value"),
                ),
                policy,
            ];
            (StatusCode::TOO_MANY_REQUESTS, fields, "slow down\n").into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "the limiter could not answer");
            (StatusCode::SERVICE_UNAVAILABLE, "try again\n").into_response()
        }
    }
}

/// A wait in whole seconds, rounded up: never advertised as shorter than it is.
fn whole_seconds_up(delay: Duration) -> u64 {
    delay.as_secs() + u64::from(delay.subsec_nanos() > 0)
}

/// Serves `router` on `addr` (`127.0.0.1:0`: any free port), printing where it listens.
#[cfg(feature = "dynamodb")]
async fn serve(router: Router, addr: &str) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, router).await
}

/// The client a replica runs on: one DynamoDB table, shared by every replica.
#[cfg(feature = "dynamodb")]
async fn on_table(table: &str, endpoint: Option<&str>) -> Result<Sluice, Error> {
    let config = sluice::Config {
        table_name: Some(table.to_owned()),
        endpoint_url: endpoint.map(str::to_owned),
        ..sluice::Config::default()
    };
    let store = sluice::DynamoStore::from_config(&config).await?;
    store.create_table().await?;
    Sluice::builder().store(store).build()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        return replica(&args[1..]).await;
    }
    // One process, in memory: the door, and a burst from two tenants against it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let router = door(Sluice::in_memory()).await?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    for (i, tenant) in ["acme", "acme", "acme", "acme", "acme", "acme", "globex"]
        .iter()
        .enumerate()
    {
        let (status, fields) = get(addr, tenant).await?;
        println!("request {i} from {tenant}: {status} {fields}");
    }
    Ok(())
}

/// `serve ADDR --table T [--endpoint URL]`: one replica on a shared table.
#[cfg(feature = "dynamodb")]
async fn replica(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let addr = args.first().map_or("127.0.0.1:8080", String::as_str);
    let table = flag("--table").ok_or("serve ADDR --table TABLE [--endpoint URL]")?;
    let sluice = on_table(table, flag("--endpoint")).await?;
    serve(door(sluice).await?, addr).await?;
    Ok(())
}

#[cfg(not(feature = "dynamodb"))]
async fn replica(_: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    Err("a replica on a shared table needs `--features dynamodb`".into())
}

/// One GET of `/ingest` as `tenant`: the status, and the rate-limit fields it carried.
async fn get(
    addr: std::net::SocketAddr,
    tenant: &str,
) -> Result<(StatusCode, String), Box<dyn std::error::Error>> {
    use http_body_util::Empty;
    use hyper::body::Bytes;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let request = hyper::Request::get(format!("http://{addr}/ingest"))
        .header("x-tenant", tenant)
        .body(Empty::new())?;
    let response = client.request(request).await?;
    let fields: Vec<String> = ["retry-after", "ratelimit", "ratelimit-policy"]
        .iter()
        .filter_map(|name| {
            let value = response.headers().get(*name)?.to_str().ok()?;
            Some(format!("{name}: {value}"))
        })
        .collect();
    Ok((response.status(), fields.join(", ")))
}

#[cfg(all(test, feature = "dynamodb"))]
mod tests {
    //! Two replicas of the door, each its own OS process, on one DynamoDB table (DynamoDB
    //! Local, from `SLUICE_TEST_DYNAMODB_ENDPOINT`): one tenant's limit holds across both.

    use super::*;

    use std::io::{BufRead as _, BufReader};
    use std::process::{Child, Command, Stdio};

    /// A replica started as a child process: stopped (by PID) when dropped.
    struct Replica {
        child: Child,
        addr: std::net::SocketAddr,
    }

    impl Replica {
        fn start(table: &str, endpoint: &str) -> Replica {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "tests::replica_process", "--nocapture"])
                .env("TENANT_DOOR_REPLICA", format!("{table} {endpoint}"))
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut out = BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            let addr = loop {
                line.clear();
                assert!(out.read_line(&mut line).unwrap() > 0, "the replica stopped");
                if let Some(addr) = line.trim().strip_prefix("listening on ") {
                    break addr.parse().unwrap();
                }
            };
            Replica { child, addr }
        }
    }

    impl Drop for Replica {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// The replica's process: serves until stopped, a minute at most (run only as a child).
    #[test]
    fn replica_process() {
        let Ok(args) = std::env::var("TENANT_DOOR_REPLICA") else {
            return;
        };
        let (table, endpoint) = args.split_once(' ').unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let sluice = on_table(table, Some(endpoint)).await.unwrap();
            let router = door(sluice).await.unwrap();
            let served =
                tokio::time::timeout(Duration::from_secs(60), serve(router, "127.0.0.1:0"));
            let _ = served.await;
        });
    }

    fn endpoint() -> Option<String> {
        let endpoint = std::env::var("SLUICE_TEST_DYNAMODB_ENDPOINT").ok();
        assert!(
            endpoint.is_some() || std::env::var_os("SLUICE_REQUIRE_DYNAMODB").is_none(),
            "SLUICE_REQUIRE_DYNAMODB is set, and no SLUICE_TEST_DYNAMODB_ENDPOINT"
        );
        endpoint
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_tenant_s_limit_holds_across_two_replicas() {
        let Some(endpoint) = endpoint() else {
            return;
        };
        let table = format!("door-{:08x}", std::process::id());
        let (a, b) = (
            Replica::start(&table, &endpoint),
            Replica::start(&table, &endpoint),
        );
        let started = std::time::Instant::now();
        let (mut granted, mut refused) = (0u64, Vec::new());
        for i in 0..10 {
            let addr = if i % 2 == 0 { a.addr } else { b.addr };
            let (status, fields) = get(addr, "acme").await.unwrap();
            match status {
                StatusCode::OK => {
                    granted += 1;
                    assert_eq!(fields, "ratelimit-policy: \"ingest\";q=5;w=5");
                }
                StatusCode::TOO_MANY_REQUESTS => refused.push(fields),
                other => panic!("{other}: {fields}"),
            }
        }
        // The tenant's 5, and what refilled meanwhile (1 a second), across both replicas.
        let most = 5 + started.elapsed().as_secs();
        assert!(
            (5..=most).contains(&granted),
            "{granted} granted, 5 to {most}"
        );
        for fields in &refused {
            // The next request comes within a second: `Retry-After` is 1, and so is `t`.
            assert_eq!(
                fields,
                "retry-after: 1, ratelimit: \"ingest\";r=0;t=1, ratelimit-policy: \"ingest\";q=5;w=5"
            );
        }
        assert!(!refused.is_empty(), "10 asked of 5");
        // Another tenant has a limit of its own.
        assert_eq!(get(b.addr, "globex").await.unwrap().0, StatusCode::OK);
        // Waited out, the tenant is served again, by either replica.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(get(b.addr, "acme").await.unwrap().0, StatusCode::OK);
        // A request with no tenant is refused for what it is.
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Empty<hyper::body::Bytes>>();
        let response = client
            .get(format!("http://{}/ingest", a.addr).parse().unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
}
