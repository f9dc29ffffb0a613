//! Per-item ceilings: a burst beyond an item's capacity is throttled, at once and unbilled,
//! with the error real DynamoDB gives; other items are not; capacity refills.

use std::time::Duration;

use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
use dynamodb_fidelity::{Config, ThrottleAs};

use crate::common::{Harness, key, sized_item, with_proxy};

/// One write unit per second, five seconds of burst: five units to spend, one back a
/// second.
fn slow_writes() -> Config {
    Config {
        write_ceiling: 1.0,
        burst: Duration::from_secs(5),
        ..Config::default()
    }
}

/// Spends `key`'s five write units: a put of 2 units, then one of 5 units, which is let
/// in with 3 left and overdraws to -2: two seconds of refill.
async fn spend(h: &Harness, key: &str) {
    h.put_sized(key, 2000).await;
    h.put_sized(key, 5000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_beyond_the_item_ceiling_is_throttled_with_the_key_range_reason_and_not_billed() {
    with_proxy(slow_writes(), |h| async move {
        spend(&h, "hot").await;
        let throttled = h
            .client
            .put_item()
            .table_name(&h.table)
            .set_item(Some(sized_item("hot", 2000)))
            .send()
            .await
            .unwrap_err();
        let body = throttled
            .raw_response()
            .map(|r| String::from_utf8_lossy(r.body().bytes().unwrap_or_default()).into_owned())
            .unwrap_or_default();
        let error = throttled.into_service_error();
        assert!(error.is_provisioned_throughput_exceeded_exception(), "{error:?}");
        assert!(
            body.contains(r#""__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException""#),
            "{body}"
        );
        let aws_sdk_dynamodb::operation::put_item::PutItemError::ProvisionedThroughputExceededException(e) = error else {
            unreachable!()
        };
        assert_eq!(
            e.message(),
            Some("The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API.")
        );
        let reasons = e.throttling_reasons();
        assert_eq!(reasons.len(), 1);
        assert_eq!(reasons[0].reason(), Some("TableWriteKeyRangeThroughputExceeded"));
        assert_eq!(
            reasons[0].resource(),
            Some(format!("arn:aws:dynamodb:us-east-1:000000000000:table/{}", h.table).as_str())
        );
        let hot = h.item("hot");
        assert_eq!(hot.write_units, 2 + 5, "the throttled put is not billed");
        assert_eq!(hot.successful_writes, 2);
        assert_eq!(hot.throttled_writes, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_another_item_are_not_throttled() {
    with_proxy(slow_writes(), |h| async move {
        spend(&h, "hot").await;
        let hot = h
            .client
            .put_item()
            .table_name(&h.table)
            .set_item(Some(sized_item("hot", 2000)))
            .send()
            .await;
        assert!(hot.is_err(), "the hot item is spent");
        h.put_sized("cold", 2000).await;
        assert_eq!(h.item("cold").throttled_writes, 0);
        assert_eq!(h.item("cold").write_units, 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ceiling_refills() {
    with_proxy(slow_writes(), |h| async move {
        spend(&h, "hot").await;
        let write = || {
            h.client
                .put_item()
                .table_name(&h.table)
                .set_item(Some(sized_item("hot", 500)))
                .send()
        };
        assert!(write().await.is_err(), "spent");
        // Two units below zero, one unit a second.
        tokio::time::sleep(Duration::from_millis(2200)).await;
        write().await.expect("refilled");
        assert_eq!(h.item("hot").throttled_writes, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_read_throttle_is_a_throttling_exception_whose_reasons_the_sdk_reads() {
    // Half a read unit per second, three seconds of burst: three halves to spend.
    let config = Config {
        read_ceiling: 0.5,
        burst: Duration::from_secs(3),
        throttle_as: ThrottleAs::Throttling,
        ..Config::default()
    };
    with_proxy(config, |h| async move {
        h.put_sized("read-hot", 100).await;
        let get = || {
            h.client
                .get_item()
                .table_name(&h.table)
                .set_key(Some(key("read-hot")))
                .consistent_read(true)
                .send()
        };
        // Two halves per consistent read: the second overdraws to -1, the third is refused.
        get().await.unwrap();
        get().await.unwrap();
        let error = get().await.unwrap_err().into_service_error();
        let aws_sdk_dynamodb::operation::get_item::GetItemError::ThrottlingException(e) = error
        else {
            panic!("expected a ThrottlingException, got {error:?}")
        };
        assert!(
            e.message()
                .unwrap_or_default()
                .starts_with("Throughput exceeds the current capacity")
        );
        assert_eq!(
            e.throttling_reasons()[0].reason(),
            Some("TableReadKeyRangeThroughputExceeded")
        );
        let stats = h.item("read-hot");
        assert_eq!(stats.read_half_units, 4);
        assert_eq!(stats.throttled_reads, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_write_returns_the_throttled_entries_as_unprocessed_and_writes_the_rest() {
    with_proxy(slow_writes(), |h| async move {
        spend(&h, "hot").await;
        let put = |k: &str| {
            WriteRequest::builder()
                .put_request(
                    PutRequest::builder()
                        .set_item(Some(sized_item(k, 300)))
                        .build()
                        .unwrap(),
                )
                .build()
        };
        let answer = h
            .client
            .batch_write_item()
            .request_items(&h.table, vec![put("hot"), put("cold")])
            .send()
            .await
            .unwrap();
        let unprocessed = &answer.unprocessed_items().unwrap()[&h.table];
        assert_eq!(unprocessed, &vec![put("hot")]);
        assert_eq!(h.item("cold").successful_writes, 1);
        assert_eq!(h.item("hot").throttled_writes, 1);
        let stored = h
            .client
            .get_item()
            .table_name(&h.table)
            .set_key(Some(key("cold")))
            .send()
            .await
            .unwrap();
        assert!(stored.item().is_some());

        // None left to write: a throttle.
        let error = h
            .client
            .batch_write_item()
            .request_items(&h.table, vec![put("hot")])
            .send()
            .await
            .unwrap_err()
            .into_service_error();
        assert!(
            error.is_provisioned_throughput_exceeded_exception(),
            "{error:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_get_returns_the_throttled_keys_as_unprocessed_and_reads_the_rest() {
    // Half a read unit per second, two seconds of burst: one unit, which a consistent
    // read of 8 KB overdraws to minus one (two seconds of refill).
    let config = Config {
        read_ceiling: 0.5,
        burst: Duration::from_secs(2),
        ..Config::default()
    };
    with_proxy(config, |h| async move {
        h.put_sized("read-hot", 5000).await;
        h.put_sized("read-cold", 100).await;
        let get = |k: &str| {
            h.client
                .get_item()
                .table_name(&h.table)
                .set_key(Some(key(k)))
                .consistent_read(true)
                .send()
        };
        get("read-hot").await.unwrap();
        let answer = h
            .client
            .batch_get_item()
            .request_items(
                &h.table,
                aws_sdk_dynamodb::types::KeysAndAttributes::builder()
                    .keys(key("read-hot"))
                    .keys(key("read-cold"))
                    .consistent_read(true)
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
        let read = &answer.responses().unwrap()[&h.table];
        assert_eq!(read.len(), 1);
        assert_eq!(read[0]["vendor_dimension"].as_s().unwrap(), "read-cold");
        let unread = &answer.unprocessed_keys().unwrap()[&h.table];
        assert_eq!(unread.keys(), &[key("read-hot")]);
        assert_eq!(unread.consistent_read(), Some(true));
        assert_eq!(h.item("read-hot").throttled_reads, 1);
        assert_eq!(h.item("read-hot").read_half_units, 4);
        assert_eq!(h.item("read-cold").read_half_units, 2);
    })
    .await;
}
