//! The table as DynamoDB lays it out: items whose keys hash onto one partition share its
//! ceilings, a hot item is isolated after sustained heat, and an on-demand table has a
//! ceiling of its own (cold start, twice the previous peak, warm throughput, the quota),
//! each throttle naming its reason.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::WarmThroughput;
use dynamodb_fidelity::{Config, TableModel};

use crate::common::{Harness, sized_item, with_proxy};

/// Puts `key` (one write unit) and says whether it went through; a throttle's reason if
/// not.
async fn put(h: &Harness, key: &str) -> Result<(), String> {
    match h
        .client
        .put_item()
        .table_name(&h.table)
        .set_item(Some(sized_item(key, 100)))
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(SdkError::ServiceError(e)) => match e.err() {
            PutItemError::ProvisionedThroughputExceededException(t) => Err(t
                .throttling_reasons()
                .first()
                .and_then(|r| r.reason())
                .unwrap_or_default()
                .to_owned()),
            other => panic!("unexpected error {other:?}"),
        },
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

/// Writes each of `keys` until it is throttled (at most 50 times each); the writes that
/// went through, in all.
async fn spend_all(h: &Harness, keys: &[String]) -> u32 {
    let mut written = 0;
    for key in keys {
        for _ in 0..50 {
            match put(h, key).await {
                Ok(()) => written += 1,
                Err(reason) => {
                    assert_eq!(reason, "TableWriteKeyRangeThroughputExceeded");
                    break;
                }
            }
        }
    }
    written
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("row#{i}")).collect()
}

/// Five write units a second per partition, a minute of refill away: what is written
/// within the test is what the buckets held.
fn five_per_partition(partitions: Option<u32>) -> Config {
    Config {
        write_ceiling: 0.1,
        burst: Duration::from_secs(50),
        partitions,
        ..Config::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_on_one_partition_share_its_ceiling() {
    // Twenty items of one unit each; five units per bucket (and what trickles back while
    // the test runs: a bucket refilled above zero lets one more in).
    for (partitions, buckets) in [(Some(1), 1), (Some(2), 2), (None, 20)] {
        with_proxy(five_per_partition(partitions), |h| async move {
            let written = spend_all(&h, &keys(20)).await;
            assert!(
                (5 * buckets..=6 * buckets).contains(&written),
                "{partitions:?} partitions: {written} written"
            );
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_set_at_run_time_start_full() {
    with_proxy(five_per_partition(None), |h| async move {
        h.proxy.set_partitions(Some(1), None).unwrap();
        assert!((5..=6).contains(&spend_all(&h, &keys(3)).await));
        // Over HTTP, as another process would.
        dynamodb_fidelity::set_partitions(&h.proxy.endpoint(), Some(2), None)
            .await
            .unwrap();
        assert!((10..=12).contains(&spend_all(&h, &keys(20)).await));
        assert!(h.proxy.set_partitions(Some(0), None).is_err());
    })
    .await;
}

/// On one partition of 20 units a second: the hot item writes 15 a second for 3 s, then
/// as fast as it can for a second while the cold one writes every 200 ms; the cold item's
/// throttles.
async fn cold_throttles(isolate_after: Option<Duration>) -> u64 {
    let config = Config {
        write_ceiling: 20.0,
        burst: Duration::from_secs(1),
        partitions: Some(1),
        isolate_after,
        ..Config::default()
    };
    let throttles = Arc::new(AtomicU64::new(0));
    let counted = throttles.clone();
    with_proxy(config, |h| async move {
        let h = Arc::new(h);
        let start = Instant::now();
        let mut n = 0u32;
        while start.elapsed() < Duration::from_secs(3) {
            let _ = put(&h, "hot").await;
            n += 1;
            tokio::time::sleep_until((start + Duration::from_millis(66) * n).into()).await;
        }
        let hammer = {
            let h = h.clone();
            tokio::spawn(async move {
                let until = Instant::now() + Duration::from_millis(1100);
                while Instant::now() < until {
                    let _ = put(&h, "hot").await;
                }
            })
        };
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = put(&h, "cold").await;
        }
        hammer.await.unwrap();
        counted.store(h.item("cold").throttled_writes, Ordering::SeqCst);
    })
    .await;
    throttles.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_item_is_isolated_after_sustained_heat_and_then_has_a_partition_of_its_own() {
    if crate::common::endpoint().is_none() {
        return;
    }
    // Isolated after 1.5 s of heat: the cold item has the partition to itself.
    assert_eq!(cold_throttles(Some(Duration::from_millis(1500))).await, 0);
    // Never isolated: the hot item drains the partition the cold one shares.
    let shared = cold_throttles(None).await;
    assert!(
        shared >= 3,
        "the cold item was throttled {shared} times of 5"
    );
}

/// A cold on-demand table sustaining 10 write units a second at first, a 2-second peak
/// window and a quota of 30; items with ceilings far above.
fn cold_table() -> Config {
    Config {
        table: Some(TableModel {
            initial_write: 10.0,
            initial_read: 30.0,
            peak_window: Duration::from_secs(2),
            quota_write: 30.0,
            quota_read: 90.0,
        }),
        ..Config::default()
    }
}

/// Puts distinct items until one is throttled; how many went through, and the reason.
/// Asserts they were a full bucket of one second at a rate within `rates` (units a
/// second) and what it refilled meanwhile (a bucket refilled above zero lets one more in).
async fn until_throttled(h: &Harness, round: u32, rates: (u32, u32)) -> String {
    let (low, high) = rates;
    let start = Instant::now();
    for i in 0..1000 {
        if let Err(reason) = put(h, &format!("r{round}-{i}")).await {
            let refilled =
                u32::try_from((start.elapsed().as_millis() * u128::from(high)).div_ceil(1000))
                    .unwrap_or(u32::MAX);
            assert!(
                (low..=high + refilled + 1).contains(&i),
                "{i} written at {low} to {high} a second, up to {refilled} refilled"
            );
            return reason;
        }
    }
    panic!("never throttled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_table_is_throttled_table_wide_until_a_peak_is_old_enough_to_double() {
    with_proxy(cold_table(), |h| async move {
        // A second's worth of the initial 10 units, spread over distinct items, then a
        // throttle naming the table, not a key range.
        let reason = until_throttled(&h, 0, (10, 10)).await;
        assert_eq!(reason, "TableWriteAccountLimitExceeded");
        // Keep the table at its ceiling for 3 s: its peak becomes previous after 2 s, and
        // twice it is served: 20 a second at least (10 a second of refill), 40 at most (a
        // second that took a full bucket and its refill).
        let start = Instant::now();
        let mut round = 1u32;
        while start.elapsed() < Duration::from_secs(3) {
            while put(&h, &format!("r{round}")).await.is_ok() {
                round += 1;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let reason = until_throttled(&h, 999_999, (20, 40)).await;
        assert_eq!(reason, "TableWriteAccountLimitExceeded");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warmed_table_serves_its_warm_throughput_at_once_up_to_the_quota() {
    with_proxy(cold_table(), |h| async move {
        let warm = |units: i64| {
            h.client
                .update_table()
                .table_name(&h.table)
                .warm_throughput(
                    WarmThroughput::builder()
                        .write_units_per_second(units)
                        .build(),
                )
                .send()
        };
        let answer = warm(25).await.expect("warm the table through the proxy");
        assert_eq!(
            answer
                .table_description()
                .and_then(|d| d.warm_throughput())
                .and_then(|w| w.write_units_per_second()),
            Some(25)
        );
        let reason = until_throttled(&h, 0, (25, 25)).await;
        assert_eq!(reason, "TableWriteAccountLimitExceeded");
        // Warmer than the quota: the quota holds.
        warm(100).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        until_throttled(&h, 1, (30, 30)).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_a_table_that_exists_leaves_its_state_as_it_was() {
    with_proxy(cold_table(), |h| async move {
        until_throttled(&h, 0, (10, 10)).await;
        // CreateTable of the test's table, through the proxy: ResourceInUse.
        let again = h
            .client
            .create_table()
            .table_name(&h.table)
            .attribute_definitions(
                aws_sdk_dynamodb::types::AttributeDefinition::builder()
                    .attribute_name(crate::common::KEY)
                    .attribute_type(aws_sdk_dynamodb::types::ScalarAttributeType::S)
                    .build()
                    .unwrap(),
            )
            .key_schema(
                aws_sdk_dynamodb::types::KeySchemaElement::builder()
                    .attribute_name(crate::common::KEY)
                    .key_type(aws_sdk_dynamodb::types::KeyType::Hash)
                    .build()
                    .unwrap(),
            )
            .billing_mode(aws_sdk_dynamodb::types::BillingMode::PayPerRequest)
            .send()
            .await;
        assert!(again.is_err(), "the table exists");
        // The table's spent budget was not refilled by the failed create.
        assert_eq!(
            put(&h, "after-create").await,
            Err("TableWriteAccountLimitExceeded".to_owned())
        );
    })
    .await;
}
