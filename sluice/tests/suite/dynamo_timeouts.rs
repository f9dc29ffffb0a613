//! A store that stops answering: every call fails with `StoreError::Timeout` within the
//! configured deadline, by default too (a client built by `DynamoStore::from_config`).
//!
//! The store here is a loopback server that accepts connections and never answers. Time is
//! tokio's paused time, so the deadlines pass without real waiting. It needs the AWS
//! credentials `scripts/test.sh` sets for DynamoDB Local, hence the DynamoDB gate.

use crate::dynamo;

use std::time::Duration;

use sluice::store::StoreError;
use sluice::{Config, DEFAULT_STORE_TIMEOUT, Error, SluiceBuilder};

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
