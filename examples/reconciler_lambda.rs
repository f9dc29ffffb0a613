//! The scheduled reconciler as an AWS Lambda function: one reconcile pass per invocation.
//!
//! Deploy it with the same environment as the SDK (`SLUICE_TABLE_NAME`, and the function's
//! role allowed `dynamodb:Scan`, `GetItem`, `BatchGetItem`, `UpdateItem`, `DeleteItem` and
//! `TransactWriteItems` on the table), then schedule it every 5 minutes with an EventBridge
//! rule (`rate(5 minutes)`) targeting the function; the event's content is ignored. Build it
//! for Lambda with `cargo lambda build --release --example reconciler_lambda --features
//! dynamodb` (or any cross-build to `provided.al2023`, binary named `bootstrap`).
//!
//! A pass that hit errors fails the invocation, so Lambda's error metric and alarms see it;
//! the report is in the function's logs and in its result.
//!
//! ```text
//! cargo test -p sluice-examples --features dynamodb --example reconciler_lambda
//! ```

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::{Value, json};
use sluice::{ReconcileReport, Sluice};

/// One reconcile pass; returns the report's counts.
pub async fn handler(sluice: &Sluice, event: LambdaEvent<Value>) -> Result<Value, Error> {
    let report = sluice.reconcile().await?;
    tracing::info!(request_id = %event.context.request_id, %report, "reconcile pass");
    if let Some(first) = report.errors.first() {
        return Err(format!(
            "{} error(s) in the reconcile pass, first: {first}",
            report.errors.len()
        )
        .into());
    }
    Ok(counts(&report))
}

fn counts(report: &ReconcileReport) -> Value {
    json!({
        "leases_seen": report.leases_seen,
        "leases_restored": report.leases_restored,
        "tokens_restored": report.tokens_restored.to_string(),
        "leases_skipped": report.leases_skipped,
        "leases_in_grace": report.leases_in_grace,
        "buckets_checked": report.buckets_checked,
        "buckets_healed": report.buckets_healed,
        "buckets_busy": report.buckets_busy,
        "buckets_not_raised": report.buckets_not_raised,
    })
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .init();
    // One client per execution environment, reused across invocations.
    let sluice = Sluice::from_env().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        let sluice = sluice.clone();
        async move { handler(&sluice, event).await }
    }))
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::print_stderr)]

    use std::time::Duration;

    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    use lambda_runtime::Context;
    use sluice::{Acquire, Bucket, DynamoStore};

    use super::*;

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
        // A caller that crashed holding a slot.
        let lease = sluice
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
}
