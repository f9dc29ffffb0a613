//! Shared set-up for tests against DynamoDB Local.
//!
//! `scripts/test.sh` starts DynamoDB Local and sets `SLUICE_TEST_DYNAMODB_ENDPOINT` and
//! `SLUICE_REQUIRE_DYNAMODB=1`. Without an endpoint, these tests skip (saying so) unless
//! `SLUICE_REQUIRE_DYNAMODB` is set, in which case they fail.

#![allow(dead_code, unreachable_pub)]

pub mod proxy;
pub mod server;
pub mod worker;

use std::sync::OnceLock;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use sluice::DynamoStore;

/// The endpoint of the DynamoDB Local under test, or `None` to skip.
#[allow(clippy::print_stderr)]
pub fn endpoint() -> Option<String> {
    match std::env::var("SLUICE_TEST_DYNAMODB_ENDPOINT") {
        Ok(e) if !e.is_empty() => Some(e),
        _ if std::env::var_os("SLUICE_REQUIRE_DYNAMODB").is_some() => {
            panic!(
                "SLUICE_REQUIRE_DYNAMODB is set but SLUICE_TEST_DYNAMODB_ENDPOINT is not: DynamoDB Local is not running"
            )
        }
        _ => {
            eprintln!(
                "skipping: no DynamoDB Local (run ./scripts/test.sh to include the DynamoDB tests)"
            );
            None
        }
    }
}

/// A client of DynamoDB Local with the dummy credentials every test uses.
pub fn client(endpoint: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(
            "sluicelocal",
            "sluicelocal",
            None,
            None,
            "sluice-tests",
        ))
        .build();
    Client::from_conf(config)
}

/// A random table name, one per test binary.
pub fn table_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| format!("sluice-test-{:016x}", rand::random::<u64>()))
}

/// A store on this binary's table (created on first use), or `None` to skip.
pub async fn store() -> Option<DynamoStore> {
    let endpoint = endpoint()?;
    let store = DynamoStore::new(client(&endpoint), table_name());
    store.create_table().await.expect("create the test table");
    Some(store)
}

/// A store on a table of its own, for tests whose operations span the whole table (the
/// reconciler, listings), or `None` to skip.
pub async fn fresh_store() -> Option<DynamoStore> {
    let endpoint = endpoint()?;
    let table = format!("sluice-test-{:016x}", rand::random::<u64>());
    let store = DynamoStore::new(client(&endpoint), table);
    store.create_table().await.expect("create a test table");
    Some(store)
}

/// A whole-second time one day ahead of the real clock. Test clocks start there: DynamoDB
/// Local's TTL sweeper really deletes rows whose `ttl` is in the real past, so lease rows of
/// a test clock set in the past would vanish under the test.
pub fn future_secs() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    now + 86_400
}

/// A string attribute value.
pub fn s(v: &str) -> aws_sdk_dynamodb::types::AttributeValue {
    aws_sdk_dynamodb::types::AttributeValue::S(v.to_owned())
}

/// A number attribute value, as written.
pub fn n(v: &str) -> aws_sdk_dynamodb::types::AttributeValue {
    aws_sdk_dynamodb::types::AttributeValue::N(v.to_owned())
}

/// The first window of grants holding more than `capacity + rate × (window + slack)`,
/// where each grant is `(asked, returned)` in milliseconds and a window runs from the
/// earliest start of an acquire in it to the last return (every grant in it was made
/// within that span); grants are sorted by when they returned. `None`: no over-grant.
pub fn over_granted(
    grants: &mut [(i64, i64)],
    capacity: u64,
    per_second: u64,
    slack_ms: i64,
) -> Option<String> {
    grants.sort_by_key(|&(_, returned)| returned);
    for (i, first) in grants.iter().enumerate() {
        let mut earliest = first.0;
        for (count, &(asked, returned)) in grants[i..].iter().enumerate() {
            earliest = earliest.min(asked);
            let window_ms = returned - earliest;
            // In thousandths of a grant.
            let allowed = capacity as i64 * 1_000 + per_second as i64 * (window_ms + slack_ms);
            let count = count as i64 + 1;
            if count * 1_000 > allowed {
                return Some(format!(
                    "{count} grants within {window_ms} ms (allowed {}.{:03})",
                    allowed / 1_000,
                    allowed % 1_000
                ));
            }
        }
    }
    None
}

/// Creates `table` as another tool would: the partition key, on-demand, and nothing else
/// (no TTL, no slots index).
pub async fn create_bare_table(client: &Client, table: &str) {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    client
        .create_table()
        .table_name(table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("vendor_dimension")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("vendor_dimension")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
}
