//! Each store retries from a token bucket of its own: another DynamoDB client of the same
//! process, throttled until the SDK's shared retry bucket is empty, does not take the
//! retries a store's calls need.
//!
//! Its own test binary: the SDK's default retry bucket is shared process-wide, and this
//! test empties it on purpose.

#![cfg(feature = "dynamodb")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::{RetryConfig, RetryPartition};
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use sluice::store::Store;
use sluice::{Dimension, DynamoStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TABLES: [&str; 3] = ["noisy", "own", "shared"];

/// A loopback server that throttles every request, counting them by the table named.
async fn throttling_server() -> (String, Arc<Mutex<HashMap<&'static str, u32>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let seen = counts.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(throttle(socket, seen.clone()));
        }
    });
    (endpoint, counts)
}

async fn throttle(mut socket: TcpStream, counts: Arc<Mutex<HashMap<&'static str, u32>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            let mut chunk = [0u8; 4096];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while buf.len() < end + 4 + length {
            let mut chunk = [0u8; 4096];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length]).into_owned();
        buf.drain(..end + 4 + length);
        if let Some(table) = TABLES.iter().find(|t| body.contains(&format!("\"{t}\""))) {
            *counts.lock().unwrap().entry(*table).or_default() += 1;
        }
        let answer = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate of requests exceeds the allowed throughput."}"#;
        let response = format!(
            "HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.0\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if socket.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// A client retrying up to 3 attempts at once, in the SDK's default partition for its
/// region unless given one.
fn client(endpoint: &str, partition: Option<RetryPartition>) -> Client {
    let mut config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("local", "local", None, None, "test"))
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(3)
                .with_initial_backoff(Duration::from_millis(1))
                .with_max_backoff(Duration::from_millis(2)),
        );
    if let Some(p) = partition {
        config = config.retry_partition(p);
    }
    Client::from_conf(config.build())
}

#[tokio::test]
async fn a_store_keeps_its_retries_when_another_client_empties_the_shared_bucket() {
    let (endpoint, counts) = throttling_server().await;
    // Another client of the process, throttled until the region's shared retry bucket
    // is empty (each retry of a throttled call takes 5 of its 500).
    let noisy = client(&endpoint, None);
    let calls = (0..200).map(|_| noisy.describe_table().table_name("noisy").send());
    for r in futures::future::join_all(calls).await {
        assert!(r.is_err());
    }
    let noisy_requests = counts.lock().unwrap()["noisy"];
    assert!(
        noisy_requests < 200 * 3,
        "the shared bucket ran dry: {noisy_requests} requests for 200 calls"
    );

    let dimension: Dimension = "openai#rpm".parse().unwrap();
    // A store on a client without a partition of its own gets one.
    let own = DynamoStore::new(client(&endpoint, None), "own");
    // A store on a client its owner put in the shared partition stays there.
    let shared = DynamoStore::new(
        client(&endpoint, Some(RetryPartition::new("dynamodb-us-east-1"))),
        "shared",
    );
    assert!(
        own.read_buckets(std::slice::from_ref(&dimension))
            .await
            .is_err()
    );
    assert!(
        shared
            .read_buckets(std::slice::from_ref(&dimension))
            .await
            .is_err()
    );
    let counts = counts.lock().unwrap();
    let (own, shared) = (counts["own"], counts["shared"]);
    assert!(
        own > shared,
        "a store's own partition retried {own} requests, the emptied shared one {shared}"
    );
    assert_eq!(
        own % 3,
        0,
        "every call of the store made its 3 attempts: {own}"
    );
}
