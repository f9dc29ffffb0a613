//! A store that stops answering: every call fails with `StoreError::Timeout` within the
//! configured deadline, by default too (a client built by `DynamoStore::from_config`).
//!
//! The store here is a loopback server that accepts connections and never answers. Time is
//! tokio's paused time, so the deadlines pass without real waiting. It needs the AWS
//! credentials `scripts/test.sh` sets for DynamoDB Local, hence the DynamoDB gate.

use crate::dynamo;

use std::time::Duration;

use sluice::store::StoreError;
use sluice::{Config, Error, SluiceBuilder, config::DEFAULT_STORE_TIMEOUT};

/// A loopback endpoint that accepts connections and never answers; dropped, it stops.
async fn silent_endpoint() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (format!("http://{addr}"), hold)
}

/// How long an acquire on a client built from `config` takes to fail, and the error.
async fn failing_acquire(config: Config) -> (Duration, Error) {
    let sluice = SluiceBuilder::from_config(config).connect().await.unwrap();
    let started = tokio::time::Instant::now();
    // Bounded, so that a store without deadlines fails this test rather than hanging it.
    let e = tokio::time::timeout(Duration::from_secs(60), sluice.acquire("openai#rpm"))
        .await
        .expect("the acquire ended")
        .unwrap_err();
    (started.elapsed(), e)
}

#[tokio::test(start_paused = true)]
async fn a_store_that_stops_answering_times_out_by_default() {
    if dynamo::endpoint().is_none() {
        return;
    }
    let (endpoint, hold) = silent_endpoint().await;
    let config = Config {
        table_name: Some("silent".into()),
        endpoint_url: Some(endpoint),
        ..Config::default()
    };
    let (took, e) = failing_acquire(config).await;
    assert!(
        matches!(e, Error::Store(StoreError::Timeout { .. })),
        "{e:?}"
    );
    assert!(
        took >= Duration::from_secs(1),
        "{took:?}: one attempt at least"
    );
    assert!(
        took <= DEFAULT_STORE_TIMEOUT + Duration::from_millis(100),
        "{took:?}: within the default deadline"
    );
    hold.abort();
}

#[tokio::test(start_paused = true)]
async fn the_store_timeouts_come_from_the_configuration() {
    if dynamo::endpoint().is_none() {
        return;
    }
    let (endpoint, hold) = silent_endpoint().await;
    let config = Config {
        table_name: Some("silent".into()),
        endpoint_url: Some(endpoint),
        store_timeout: Duration::from_millis(400),
        store_attempt_timeout: Duration::from_millis(150),
        ..Config::default()
    };
    let (took, e) = failing_acquire(config).await;
    assert!(
        matches!(e, Error::Store(StoreError::Timeout { .. })),
        "{e:?}"
    );
    assert!(
        took <= Duration::from_millis(500),
        "{took:?}: within the configured 400 ms"
    );
    hold.abort();
}

/// A loopback endpoint answering every call with `body` (a DynamoDB JSON answer).
async fn answering_endpoint(body: &'static str) -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serve = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Ok(n) = socket.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request).to_string();
                    let Some(end) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let length = text[..end]
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if request.len() < end + 4 + length {
                        continue;
                    }
                    request.drain(..end + 4 + length);
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if socket.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), serve)
}

/// A global table (a replica in another Region) is refused at start, with a typed error
/// that says why: its Regions' writes to one bucket row would overwrite each other.
#[tokio::test]
async fn a_table_with_a_replica_region_is_refused_at_start() {
    if dynamo::endpoint().is_none() {
        return;
    }
    let (endpoint, serve) = answering_endpoint(
        r#"{"Table":{"TableName":"shared","TableStatus":"ACTIVE","Replicas":[{"RegionName":"eu-west-1","ReplicaStatus":"ACTIVE"}]}}"#,
    )
    .await;
    let config = Config {
        table_name: Some("shared".into()),
        endpoint_url: Some(endpoint),
        ..Config::default()
    };
    match SluiceBuilder::from_config(config).connect().await {
        Err(Error::Config(sluice::error::ConfigError::GlobalTable { table, regions })) => {
            assert_eq!(
                (table.as_str(), regions),
                ("shared", vec!["eu-west-1".to_owned()])
            );
        }
        other => panic!("expected the global table refused, got {other:?}"),
    }
    // The same answer without replicas: a table of one Region is taken.
    serve.abort();
    let (endpoint, serve) =
        answering_endpoint(r#"{"Table":{"TableName":"shared","TableStatus":"ACTIVE"}}"#).await;
    let config = Config {
        table_name: Some("shared".into()),
        endpoint_url: Some(endpoint),
        ..Config::default()
    };
    assert!(SluiceBuilder::from_config(config).connect().await.is_ok());
    serve.abort();
}
