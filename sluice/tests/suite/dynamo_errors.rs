//! DynamoDB failures mapped to typed errors, none of them posing as a quota denial.
//!
//! Service errors are replayed as DynamoDB's own HTTP error bodies through
//! `aws-smithy-mocks` (so the SDK's real deserializer reads them); timeouts and refused
//! connections use real sockets on loopback.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::operation::batch_write_item::BatchWriteItemOutput;
use aws_sdk_dynamodb::operation::get_item::GetItemOutput;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsOutput;
use aws_sdk_dynamodb::operation::update_item::UpdateItemOutput;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_smithy_mocks::{RuleMode, mock, mock_client};
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use sluice::store::{
    BucketWrite, Commit, CommitError, ConditionFailure, LeaseKey, LeaseRecord, LeaseWrite,
    StoreError,
};
use sluice::{
    DynamoStore, Error, Sluice, Tokens, clock::ManualClock, clock::UnixMillis, store::Store,
};

fn error_response(kind: &str, extra: &str) -> HttpResponse {
    let body = format!(
        r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{kind}","message":"mocked {kind}"{extra}}}"#
    );
    HttpResponse::new(StatusCode::try_from(400).unwrap(), SdkBody::from(body))
}

fn bucket_item(version: &str) -> std::collections::HashMap<String, AttributeValue> {
    [
        ("vendor_dimension", AttributeValue::S("openai#rpm".into())),
        ("capacity", AttributeValue::N("10".into())),
        ("tokens", AttributeValue::N("10".into())),
        ("refill_rate", AttributeValue::N("1".into())),
        ("last_refill_at", AttributeValue::N("1700000000".into())),
        ("cost_per_call", AttributeValue::N("1".into())),
        ("limit_type", AttributeValue::S("requests".into())),
        ("version", AttributeValue::N(version.into())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// A client of the seed's protocol on the mocked DynamoDB, so that a grant is a transaction
/// (what the replayed transaction errors need).
fn sluice_on(client: Client, retries: u32) -> Sluice {
    Sluice::builder()
        .store(DynamoStore::new(client, "buckets"))
        .clock(ManualClock::new(UnixMillis::from_secs(1_700_000_000)))
        .max_retries(retries)
        .protocol(sluice::config::Protocol::Seed)
        .build()
        .unwrap()
}

#[tokio::test]
async fn throttling_is_a_store_error_not_a_quota_denial() {
    for kind in [
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
    ] {
        let rule = mock!(Client::get_item).then_http_response(move || error_response(kind, ""));
        let client = mock_client!(aws_sdk_dynamodb, RuleMode::MatchAny, [&rule], |c| c
            .retry_config(RetryConfig::disabled()));
        let e = sluice_on(client, 3)
            .acquire("openai#rpm")
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::Store(StoreError::Throttled { .. })),
            "{kind}: {e:?}"
        );
        assert_eq!(e.retry_in(), None, "{kind} must not pose as RetryIn");
        assert!(e.to_string().contains("throttling"), "{e}");
    }
}

/// A client of the fast path (the default) on the mocked DynamoDB.
fn fast_on(client: Client) -> Sluice {
    Sluice::builder()
        .store(DynamoStore::new(client, "buckets"))
        .clock(ManualClock::new(UnixMillis::from_secs(1_700_000_000)))
        .build()
        .unwrap()
}

#[tokio::test]
async fn on_the_fast_path_throttles_and_transaction_conflicts_are_back_pressure() {
    // The bucket row's read throttled, then its grant refused by a throttle and by another
    // writer's transaction, then applied: each refusal a short RetryIn, never an error.
    // The throttle on the only row the client knows is followed by one read of the row
    // (was the bucket spread since?): it was not. Each write the store pushed back is
    // followed by a read of the row before the next write (the row moved on meanwhile),
    // unless that read was the one made already.
    let row = || {
        GetItemOutput::builder()
            .set_item(Some(bucket_item("3")))
            .build()
    };
    let read = mock!(Client::get_item)
        .sequence()
        .http_response(|| error_response("ProvisionedThroughputExceededException", ""))
        .output(row)
        .output(row)
        .output(row)
        .build();
    let mut after = bucket_item("4");
    after.insert("tokens".to_owned(), AttributeValue::N("9".into()));
    let write = mock!(Client::update_item)
        .sequence()
        .http_response(|| error_response("ThrottlingException", ""))
        .http_response(|| error_response("TransactionConflictException", ""))
        .output(move || {
            UpdateItemOutput::builder()
                .set_attributes(Some(after.clone()))
                .build()
        })
        .build();
    let lease_row =
        mock!(Client::batch_write_item).then_output(|| BatchWriteItemOutput::builder().build());
    let client = mock_client!(
        aws_sdk_dynamodb,
        RuleMode::MatchAny,
        [&read, &write, &lease_row],
        |c| c.retry_config(RetryConfig::disabled())
    );
    let sluice = fast_on(client);
    for refusal in [
        "a throttled read",
        "a throttled write",
        "a transaction conflict",
    ] {
        let e = sluice.acquire("openai#rpm").await.unwrap_err();
        let wait = e.retry_in();
        assert!(
            wait.is_some_and(|d| d >= Duration::from_millis(10) && d <= Duration::from_secs(1)),
            "{refusal}: {e:?}"
        );
    }
    let lease = sluice.acquire("openai#rpm").await.expect("granted");
    assert_eq!((read.num_calls(), write.num_calls()), (4, 3));
    std::mem::forget(lease);
}

#[tokio::test]
async fn a_missing_table_is_table_not_found() {
    let rule = mock!(Client::get_item)
        .then_http_response(|| error_response("ResourceNotFoundException", ""));
    let client = mock_client!(aws_sdk_dynamodb, RuleMode::MatchAny, [&rule]);
    let e = sluice_on(client, 3)
        .acquire("openai#rpm")
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Store(StoreError::TableNotFound { ref table }) if table == "buckets"),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_transaction_conflict_is_retried_and_then_granted() {
    let read = mock!(Client::get_item).then_output(|| {
        GetItemOutput::builder()
            .set_item(Some(bucket_item("3")))
            .build()
    });
    let write = mock!(Client::transact_write_items)
        .sequence()
        .http_response(|| {
            error_response(
                "TransactionCanceledException",
                r#","CancellationReasons":[{"Code":"TransactionConflict","Message":"Transaction is ongoing for the item"},{"Code":"None"}]"#,
            )
        })
        .output(|| TransactWriteItemsOutput::builder().build())
        .build();
    let client = mock_client!(aws_sdk_dynamodb, RuleMode::MatchAny, [&read, &write]);
    let lease = sluice_on(client, 3)
        .acquire("openai#rpm")
        .await
        .expect("granted after the conflict");
    assert_eq!(lease.attempts(), 2);
    assert_eq!(write.num_calls(), 2);
    std::mem::forget(lease);
}

#[tokio::test]
async fn persistent_conflicts_end_in_contention_never_in_a_made_up_retry_in() {
    let read = mock!(Client::get_item).then_output(|| {
        GetItemOutput::builder()
            .set_item(Some(bucket_item("3")))
            .build()
    });
    let write = mock!(Client::transact_write_items).then_http_response(|| {
        error_response(
            "TransactionCanceledException",
            r#","CancellationReasons":[{"Code":"TransactionConflict"},{"Code":"None"}]"#,
        )
    });
    let client = mock_client!(aws_sdk_dynamodb, RuleMode::MatchAny, [&read, &write]);
    let e = sluice_on(client, 2)
        .acquire("openai#rpm")
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Contention { attempts: 3, .. }), "{e:?}");
    assert_eq!(e.retry_in(), None);
    assert_eq!(write.num_calls(), 3);
}

fn two_item_commit() -> Commit {
    let d: sluice::Dimension = "openai#rpm".parse().unwrap();
    Commit {
        buckets: vec![BucketWrite::new(
            {
                let mut row = sluice::bucket::BucketState::full(
                    d.clone(),
                    sluice::Bucket::requests(sluice::RefillRate::per_second(1)).with_capacity(10),
                    UnixMillis::from_secs(1_700_000_000),
                );
                row.version = 3;
                row
            },
            sluice::store::Level::new(Tokens::new(9), UnixMillis::from_secs(1_700_000_000)),
        )],
        leases: vec![LeaseWrite::Create(LeaseRecord {
            slot: false,
            key: LeaseKey::new(&d, "abc"),
            dimension: d,
            cost: Tokens::new(1),
            created_at: UnixMillis::from_secs(1_700_000_000),
            expires_at: UnixMillis::from_secs(1_700_000_060),
            caller: "test".into(),
        })],
    }
}

#[tokio::test]
async fn condition_failures_say_which_item_failed_and_carry_the_current_row() {
    let bucket_changed = mock!(Client::transact_write_items).then_http_response(|| {
        error_response(
            "TransactionCanceledException",
            r#","CancellationReasons":[{"Code":"ConditionalCheckFailed","Item":{"vendor_dimension":{"S":"openai#rpm"},"capacity":{"N":"10"},"tokens":{"N":"4"},"refill_rate":{"N":"1"},"last_refill_at":{"N":"1700000000.5"},"cost_per_call":{"N":"1"},"limit_type":{"S":"requests"},"version":{"N":"7"}}},{"Code":"None"}]"#,
        )
    });
    let client = mock_client!(aws_sdk_dynamodb, RuleMode::MatchAny, [&bucket_changed]);
    let store = DynamoStore::new(client, "buckets");
    match store.commit(two_item_commit()).await {
        Err(CommitError::Condition(ConditionFailure::BucketChanged { dimension, current })) => {
            assert_eq!(dimension.as_str(), "openai#rpm");
            let current = current.expect("ALL_OLD item returned");
            assert_eq!((current.version, current.tokens), (7, Tokens::new(4)));
        }
        other => panic!("expected BucketChanged, got {other:?}"),
    }

    let lease_exists = mock!(Client::transact_write_items).then_http_response(|| {
        error_response(
            "TransactionCanceledException",
            r#","CancellationReasons":[{"Code":"None"},{"Code":"ConditionalCheckFailed"}]"#,
        )
    });
    let client = mock_client!(aws_sdk_dynamodb, RuleMode::MatchAny, [&lease_exists]);
    let store = DynamoStore::new(client, "buckets");
    match store.commit(two_item_commit()).await {
        Err(CommitError::Condition(ConditionFailure::LeaseExists(key))) => {
            assert_eq!(key.as_str(), "lease#openai#rpm#abc");
        }
        other => panic!("expected LeaseExists, got {other:?}"),
    }
}

#[tokio::test]
async fn a_row_of_the_wrong_shape_is_a_corrupt_row_error() {
    let read = mock!(Client::get_item).then_output(|| {
        let mut item = bucket_item("3");
        item.insert("tokens".into(), AttributeValue::Bool(true));
        GetItemOutput::builder().set_item(Some(item)).build()
    });
    let client = mock_client!(aws_sdk_dynamodb, RuleMode::MatchAny, [&read]);
    let e = sluice_on(client, 3)
        .acquire("openai#rpm")
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("`tokens` must be a number (N), found a boolean (BOOL)"),
        "{e}"
    );
}

fn real_client(endpoint: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(
            "sluicelocal",
            "sluicelocal",
            None,
            None,
            "test",
        ))
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .operation_timeout(Duration::from_millis(300))
                .build(),
        )
        .build();
    Client::from_conf(config)
}

#[tokio::test]
async fn a_server_that_never_answers_is_a_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let sluice = sluice_on(real_client(&format!("http://{addr}")), 3);
    let e = sluice.acquire("openai#rpm").await.unwrap_err();
    assert!(
        matches!(e, Error::Store(StoreError::Timeout { .. })),
        "{e:?}"
    );
    assert!(e.to_string().contains("did not answer in time"));
    hold.abort();
}

#[tokio::test]
async fn a_refused_connection_is_unreachable_and_sent_nothing() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let sluice = sluice_on(real_client(&format!("http://127.0.0.1:{port}")), 3);
    let e = sluice.acquire("openai#rpm").await.unwrap_err();
    assert!(
        matches!(e, Error::Store(ref s @ StoreError::Unreachable { .. }) if !s.may_have_applied()),
        "{e:?}"
    );
    assert!(e.to_string().contains("could not be reached"), "{e}");
}

/// The keys of `dimensions` as DynamoDB hands them back unprocessed.
fn unprocessed_keys(
    dimensions: &[&str],
) -> std::collections::HashMap<String, aws_sdk_dynamodb::types::KeysAndAttributes> {
    let keys = dimensions
        .iter()
        .map(|d| {
            [(
                "vendor_dimension".to_owned(),
                AttributeValue::S((*d).into()),
            )]
            .into_iter()
            .collect()
        })
        .collect();
    let keys = aws_sdk_dynamodb::types::KeysAndAttributes::builder()
        .set_keys(Some(keys))
        .consistent_read(true)
        .build()
        .unwrap();
    [("buckets".to_owned(), keys)].into_iter().collect()
}

fn dimensions(names: &[&str]) -> Vec<sluice::Dimension> {
    names
        .iter()
        .map(|d| sluice::Dimension::new(d).unwrap())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn keys_a_batch_read_leaves_unprocessed_are_read_again_after_a_pause() {
    use aws_sdk_dynamodb::operation::batch_get_item::BatchGetItemOutput;
    let mut tpm = bucket_item("3");
    tpm.insert(
        "vendor_dimension".into(),
        AttributeValue::S("openai#tpm".into()),
    );
    let read = mock!(Client::batch_get_item)
        .sequence()
        .output(move || {
            BatchGetItemOutput::builder()
                .responses("buckets", vec![bucket_item("3")])
                .set_unprocessed_keys(Some(unprocessed_keys(&["openai#tpm"])))
                .build()
        })
        .output(move || {
            BatchGetItemOutput::builder()
                .responses("buckets", vec![tpm.clone()])
                .build()
        })
        .build();
    let client = mock_client!(aws_sdk_dynamodb, RuleMode::MatchAny, [&read]);
    let store = DynamoStore::new(client, "buckets");
    let started = tokio::time::Instant::now();
    let rows = store
        .read_buckets(&dimensions(&["openai#rpm", "openai#tpm"]))
        .await
        .unwrap();
    assert!(rows.iter().all(Option::is_some), "{rows:?}");
    assert_eq!(read.num_calls(), 2);
    assert!(
        started.elapsed() >= Duration::from_micros(12_500),
        "the resend waited for a backoff"
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_read_left_unprocessed_round_after_round_is_throttled_after_a_bound() {
    use aws_sdk_dynamodb::operation::batch_get_item::BatchGetItemOutput;
    let read = mock!(Client::batch_get_item).then_output(|| {
        BatchGetItemOutput::builder()
            .set_unprocessed_keys(Some(unprocessed_keys(&["openai#rpm", "openai#tpm"])))
            .build()
    });
    let client = mock_client!(aws_sdk_dynamodb, RuleMode::MatchAny, [&read]);
    let store = DynamoStore::new(client, "buckets");
    let e = store
        .read_buckets(&dimensions(&["openai#rpm", "openai#tpm"]))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Throttled { .. }), "{e:?}");
    assert_eq!(read.num_calls(), 8, "eight rounds, then throttled");
}

#[tokio::test(start_paused = true)]
async fn a_batch_delete_left_unprocessed_round_after_round_is_throttled_after_a_bound() {
    use aws_sdk_dynamodb::operation::batch_write_item::BatchWriteItemOutput;
    use aws_sdk_dynamodb::types::{DeleteRequest, WriteRequest};
    let key = LeaseKey::parse("lease#openai#rpm#abc").unwrap();
    let write = mock!(Client::batch_write_item).then_output(|| {
        let delete = DeleteRequest::builder()
            .key(
                "vendor_dimension",
                AttributeValue::S("lease#openai#rpm#abc".into()),
            )
            .build()
            .unwrap();
        BatchWriteItemOutput::builder()
            .unprocessed_items(
                "buckets",
                vec![WriteRequest::builder().delete_request(delete).build()],
            )
            .build()
    });
    let client = mock_client!(aws_sdk_dynamodb, RuleMode::MatchAny, [&write]);
    let store = DynamoStore::new(client, "buckets");
    let started = tokio::time::Instant::now();
    let e = store.delete_leases(&[key]).await.unwrap_err();
    assert!(matches!(e, StoreError::Throttled { .. }), "{e:?}");
    assert_eq!(write.num_calls(), 8, "eight rounds, then throttled");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "each resend waited for a backoff"
    );
}
