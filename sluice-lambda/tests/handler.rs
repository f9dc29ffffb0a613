//! The function's handler against DynamoDB Local: a crashed caller's slot given back once,
//! and a failed pass failing the invocation.

#![allow(clippy::print_stderr)]

use std::time::Duration;

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use sluice::{
    Acquire, Bucket, DynamoStore, Sluice, clock::Clock as _, clock::ManualClock, clock::SystemClock,
};
use sluice_lambda::handler;

/// A store on a fresh table of DynamoDB Local, or `None` (skip) without one.
async fn store() -> Option<DynamoStore> {
    let Ok(endpoint) = std::env::var("SLUICE_TEST_DYNAMODB_ENDPOINT") else {
        assert!(
            std::env::var_os("SLUICE_REQUIRE_DYNAMODB").is_none(),
            "SLUICE_REQUIRE_DYNAMODB is set but SLUICE_TEST_DYNAMODB_ENDPOINT is not"
        );
        eprintln!("skipped: no DynamoDB Local (run ./scripts/test.sh)");
        return None;
    };
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(
            "sluicelocal",
            "sluicelocal",
            None,
            None,
            "lambda-test",
        ))
        .build();
    let table = format!("sluice-lambda-{}", std::process::id());
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::from_conf(config), table);
    store.create_table().await.expect("create the table");
    Some(store)
}

/// An EventBridge scheduled event, as the rule delivers it.
fn scheduled_event() -> LambdaEvent<Value> {
    let payload = json!({
        "version": "0",
        "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "time": "2026-11-22T05:00:00Z",
        "resources": ["arn:aws:events:us-east-1:123456789012:rule/sluice-reconciler"],
        "detail": {}
    });
    LambdaEvent::new(payload, Context::default())
}

#[tokio::test]
async fn the_handler_restores_a_crashed_slot_once() {
    let Some(store) = store().await else { return };
    let sluice = Sluice::builder()
        .store(store)
        .clock_skew(Duration::from_millis(100))
        .build()
        .unwrap();
    sluice
        .put_bucket("eleven#concurrent", Bucket::concurrent(2))
        .await
        .unwrap();
    // A caller that crashed holding a slot: its process froze (its clock stands still, so
    // its lease is never renewed) and never released it.
    let frozen = Sluice::builder()
        .store_arc(sluice.store().clone())
        .clock(ManualClock::new(SystemClock.now()))
        .build()
        .unwrap();
    let lease = frozen
        .acquire(Acquire::new("eleven#concurrent").ttl(Duration::from_millis(50)))
        .await
        .unwrap();
    std::mem::forget(lease);
    // Past its expiry and the clock-skew margin.
    tokio::time::sleep(Duration::from_millis(160)).await;
    let first = handler(&sluice, scheduled_event()).await.unwrap();
    assert_eq!(first["leases_restored"], 1, "{first}");
    assert_eq!(first["tokens_restored"], "1", "{first}");
    let snapshot = sluice.snapshot("eleven#concurrent").await.unwrap();
    assert_eq!(snapshot.available, 2.into());
    let second = handler(&sluice, scheduled_event()).await.unwrap();
    assert_eq!(second["leases_seen"], 0, "{second}");
    assert_eq!(second["buckets_healed"], 0, "{second}");
}

#[tokio::test]
async fn a_missing_table_fails_the_invocation() {
    let Some(store) = store().await else { return };
    let missing = DynamoStore::new(store.client().clone(), "sluice-no-such-table");
    let sluice = Sluice::builder().store(missing).build().unwrap();
    let error = handler(&sluice, scheduled_event()).await.unwrap_err();
    assert!(
        error.to_string().contains("sluice-no-such-table"),
        "{error}"
    );
}
