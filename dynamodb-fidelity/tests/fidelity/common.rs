//! Shared set-up: the DynamoDB Local under test, clients of it and of the proxy, and a
//! table of each test's own, deleted afterwards whatever happens.
//!
//! `SLUICE_TEST_DYNAMODB_ENDPOINT` names DynamoDB Local. Without it these tests skip
//! (saying so) unless `SLUICE_REQUIRE_DYNAMODB` is set, in which case they fail.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, KeySchemaElement,
    KeyType, Projection, ProjectionType, ScalarAttributeType,
};
use dynamodb_fidelity::{Config, Fidelity, Running};
use futures::FutureExt as _;

/// The partition key of every test table.
pub(crate) const KEY: &str = "vendor_dimension";
/// Every test table's sparse global secondary index, on [`GROUP`] (all attributes
/// projected): an item without `group` has no entry in it.
pub(crate) const INDEX: &str = "by-group";
pub(crate) const GROUP: &str = "group";

/// The longest a test may take, table set-up and clean-up aside.
const TEST_TIME: Duration = Duration::from_secs(60);

/// The endpoint of the DynamoDB Local under test, or `None` to skip.
#[allow(clippy::print_stderr)]
pub(crate) fn endpoint() -> Option<String> {
    match std::env::var("SLUICE_TEST_DYNAMODB_ENDPOINT") {
        Ok(e) if !e.is_empty() => Some(e),
        _ if std::env::var_os("SLUICE_REQUIRE_DYNAMODB").is_some() => {
            panic!(
                "SLUICE_REQUIRE_DYNAMODB is set but SLUICE_TEST_DYNAMODB_ENDPOINT is not: DynamoDB Local is not running"
            )
        }
        _ => {
            eprintln!(
                "skipping: no DynamoDB Local (set SLUICE_TEST_DYNAMODB_ENDPOINT to include the DynamoDB tests)"
            );
            None
        }
    }
}

/// A client of `endpoint` with the dummy credentials every test uses, and no retries: a
/// throttle reaches the test.
pub(crate) fn client(endpoint: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(
            "sluicelocal",
            "sluicelocal",
            None,
            None,
            "dynamodb-fidelity-tests",
        ))
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .operation_timeout(Duration::from_secs(10))
                .build(),
        )
        .build();
    Client::from_conf(config)
}

/// A name no other test uses.
pub(crate) fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}-{}-{nanos:08x}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// What a test works with.
pub(crate) struct Harness {
    /// The proxy, in front of DynamoDB Local.
    pub(crate) proxy: Running,
    /// A client of the proxy.
    pub(crate) client: Client,
    /// The test's table (partition key [`KEY`], a string).
    pub(crate) table: String,
}

fn attribute(name: &str) -> AttributeDefinition {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .unwrap()
}

fn hash_key(name: &str) -> KeySchemaElement {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(KeyType::Hash)
        .build()
        .unwrap()
}

impl Harness {
    /// The counters of `key` in the test's table (all zero if never named).
    pub(crate) fn item(&self, key: &str) -> dynamodb_fidelity::ItemStats {
        self.proxy
            .stats()
            .item(&self.table, key)
            .copied()
            .unwrap_or_default()
    }

    /// Puts `key` with a `payload` string making the whole item `size` bytes, through
    /// the proxy.
    pub(crate) async fn put_sized(&self, key: &str, size: usize) {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(sized_item(key, size)))
            .send()
            .await
            .expect("put an item through the proxy");
    }
}

/// An item of `key` whose size as DynamoDB bills it is exactly `size` bytes (at least the
/// key and an empty payload).
pub(crate) fn sized_item(key: &str, size: usize) -> HashMap<String, AttributeValue> {
    let fixed = KEY.len() + key.len() + "payload".len();
    let payload = "x".repeat(size.checked_sub(fixed).expect("an item this small"));
    HashMap::from([
        (KEY.to_owned(), AttributeValue::S(key.to_owned())),
        ("payload".to_owned(), AttributeValue::S(payload)),
    ])
}

/// The key of `key`.
pub(crate) fn key(key: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([(KEY.to_owned(), AttributeValue::S(key.to_owned()))])
}

/// Runs `test` against a proxy of `config` (its upstream set to DynamoDB Local) and a
/// fresh table, within a bounded time; deletes the table and stops the proxy afterwards,
/// pass or fail. Skips if there is no DynamoDB Local.
pub(crate) async fn with_proxy<F, Fut>(config: Config, test: F)
where
    F: FnOnce(Harness) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(endpoint) = endpoint() else {
        return;
    };
    let direct = client(&endpoint);
    let table = unique("fidelity-test");
    create_table(&direct, &table).await;
    let outcome = tokio::time::timeout(
        TEST_TIME,
        AssertUnwindSafe(async {
            let proxy = Fidelity::start(Config {
                upstream: endpoint.clone(),
                ..config
            })
            .await
            .expect("start the proxy");
            let harness = Harness {
                client: client(&proxy.endpoint()),
                proxy,
                table: table.clone(),
            };
            test(harness).await;
        })
        .catch_unwind(),
    )
    .await;
    let deleted = direct.delete_table().table_name(&table).send().await;
    match outcome {
        Ok(Ok(())) => {
            deleted.expect("delete the test table");
        }
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("the test took longer than {TEST_TIME:?}"),
    }
}

async fn create_table(client: &Client, table: &str) {
    client
        .create_table()
        .table_name(table)
        .attribute_definitions(attribute(KEY))
        .attribute_definitions(attribute(GROUP))
        .key_schema(hash_key(KEY))
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(INDEX)
                .key_schema(hash_key(GROUP))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::All)
                        .build(),
                )
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("create the test table");
}
