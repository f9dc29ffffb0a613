//! The bucket row on DynamoDB Local over the real wire: it stays the same size whatever is
//! in flight (leases live in rows of their own), each grant is one write of it, and the
//! seed's other SDKs, whose writes are conditioned on the version, see every sluice write
//! and are never overwritten.

#![allow(clippy::print_stderr)]

use crate::dynamo;

use dynamo::{n, s};

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use sluice::store::LeaseFilter;
use sluice::{
    Bucket, DynamoStore, RefillRate, Sluice, Tokens, clock::ManualClock, clock::UnixMillis,
};

fn vendor() -> String {
    format!("rows{:08x}", rand::random::<u32>())
}

fn client(store: &DynamoStore, clock: &ManualClock, caller: &str) -> Sluice {
    Sluice::builder()
        .store(store.clone())
        .clock(clock.clone())
        .caller(caller)
        .build()
        .unwrap()
}

async fn get_raw(store: &DynamoStore, key: &str) -> HashMap<String, AttributeValue> {
    store
        .client()
        .get_item()
        .table_name(store.table())
        .key("vendor_dimension", s(key))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .expect("row")
}

/// An item's size as DynamoDB counts it for capacity: each attribute's name plus its
/// value (strings by their UTF-8 length; numbers about one byte per two significant digits
/// plus one; lists three bytes plus one per element and the elements).
fn item_size(item: &HashMap<String, AttributeValue>) -> usize {
    fn value(v: &AttributeValue) -> usize {
        match v {
            AttributeValue::S(s) => s.len(),
            AttributeValue::N(n) => {
                let digits = n.chars().filter(char::is_ascii_digit).count();
                digits.div_ceil(2) + 1
            }
            AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
            AttributeValue::L(items) => 3 + items.iter().map(|i| 1 + value(i)).sum::<usize>(),
            AttributeValue::M(map) => {
                3 + map
                    .iter()
                    .map(|(k, v)| 1 + k.len() + value(v))
                    .sum::<usize>()
            }
            _ => 0,
        }
    }
    item.iter().map(|(k, v)| k.len() + value(v)).sum()
}

#[tokio::test]
async fn the_bucket_row_stays_the_same_size_whatever_is_in_flight() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let clock = ManualClock::new(UnixMillis::from_secs(dynamo::future_secs()));
    let sluice = client(&store, &clock, "worker-0123456789");
    for (metric, bucket) in [
        (
            "rpm",
            Bucket::requests(RefillRate::per_minute(1_000))
                .with_reserve("interactive".parse().unwrap(), 100)
                .with_reserve("standard".parse().unwrap(), 50),
        ),
        ("concurrent", Bucket::concurrent(500)),
    ] {
        let dim = format!("{}#{metric}", vendor());
        sluice.put_bucket(&dim, bucket).await.unwrap();
        let mut held = Vec::new();
        let mut sizes = Vec::new();
        for _ in 0..200 {
            let before = store.stats();
            let lease = sluice.acquire(dim.as_str()).await.unwrap();
            lease.recorded().await;
            held.push(lease);
            let after = store.stats();
            assert_eq!(
                after.calls - before.calls,
                2,
                "one write of the bucket row and one of the lease row per grant"
            );
            sizes.push(item_size(&get_raw(&store, &dim).await));
        }
        let largest = sizes.iter().copied().max().unwrap();
        eprintln!("{metric}: the bucket row is {largest} bytes at most with 200 leases live");
        assert!(largest < 1_024, "{largest} bytes");
        assert!(
            sizes.iter().all(|s| s.abs_diff(sizes[0]) <= 8),
            "grows with the leases in flight: {sizes:?}"
        );
        let leases = sluice
            .leases(&LeaseFilter {
                dimension: Some(dim.parse().unwrap()),
                expired_before: None,
            })
            .await
            .unwrap();
        assert_eq!(leases.len(), 200, "each lease in a row of its own");
        for lease in held {
            lease.release().await.unwrap();
        }
    }
}

#[tokio::test]
async fn another_sdks_version_conditioned_write_sees_every_sluice_write() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let clock = ManualClock::new(UnixMillis::from_secs(dynamo::future_secs()));
    let sluice = client(&store, &clock, "sluice");
    let dim = format!("{}#concurrent", vendor());
    sluice
        .put_bucket(&dim, Bucket::concurrent(3))
        .await
        .unwrap();
    let version = |raw: &HashMap<String, AttributeValue>| match raw.get("version") {
        Some(AttributeValue::N(v)) => v.clone(),
        other => panic!("version: {other:?}"),
    };
    let seed_take = |version: String| {
        store
            .client()
            .update_item()
            .table_name(store.table())
            .key("vendor_dimension", s(&dim))
            .update_expression("SET tokens = tokens - :one, version = version + :one")
            .condition_expression("version = :v")
            .expression_attribute_values(":one", n("1"))
            .expression_attribute_values(":v", n(&version))
            .send()
    };
    // Another SDK reads the row, then sluice grants: the SDK's write, conditioned on the
    // version it read, fails and it reads again.
    let read = version(&get_raw(&store, &dim).await);
    let held = sluice.acquire(dim.as_str()).await.unwrap();
    assert!(seed_take(read).await.is_err(), "a sluice write went unseen");
    seed_take(version(&get_raw(&store, &dim).await))
        .await
        .unwrap();
    // sluice's next writes, computed from a row from before the other SDK's, apply on top
    // of it and never overwrite it.
    held.release().await.unwrap();
    assert_eq!(
        sluice.bucket(&dim).await.unwrap().unwrap().tokens,
        Tokens::new(2),
        "the other SDK's slot stays taken"
    );
    let again = sluice.acquire(dim.as_str()).await.unwrap();
    assert_eq!(
        sluice.bucket(&dim).await.unwrap().unwrap().tokens,
        Tokens::new(1)
    );
    again.release().await.unwrap();
    // Whole-row re-seeds aside, the row carries nothing per lease.
    let raw = get_raw(&store, &dim).await;
    assert!(!raw.keys().any(|k| k.starts_with("lease#")), "{raw:?}");
}

#[tokio::test]
async fn a_grant_is_one_write_unit_of_the_bucket_row_as_dynamodb_reports_it() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let clock = ManualClock::new(UnixMillis::from_secs(dynamo::future_secs()));
    let sluice = client(&store, &clock, "sluice");
    let dim = format!("{}#rpm", vendor());
    sluice
        .put_bucket(&dim, Bucket::requests(RefillRate::per_second(1_000)).lean())
        .await
        .unwrap();
    let before = store.stats();
    for _ in 0..20 {
        let _lean = sluice.acquire(dim.as_str()).await.unwrap();
        clock.advance(std::time::Duration::from_millis(3));
    }
    let after = store.stats();
    assert_eq!(after.calls - before.calls, 20, "one call per lean grant");
    assert_eq!(
        after.write_milliunits - before.write_milliunits,
        20_000,
        "one write unit per lean grant"
    );
    let out = store
        .client()
        .update_item()
        .table_name(store.table())
        .key("vendor_dimension", s(&dim))
        .update_expression("SET probe = :p")
        .expression_attribute_values(":p", n("1"))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .unwrap();
    assert_eq!(
        out.consumed_capacity().and_then(|c| c.capacity_units()),
        Some(1.0)
    );
}

#[tokio::test]
async fn the_write_ceiling_a_client_learned_goes_with_every_row_through_reshards() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let clock = ManualClock::new(UnixMillis::from_secs(dynamo::future_secs()));
    let sluice = client(&store, &clock, "worker-0123456789");
    let dim = format!("{}#rpm", vendor());
    let bucket = Bucket::requests(RefillRate::per_second(1_000)).with_capacity(10_000);
    let defined = sluice.put_bucket(&dim, bucket).await.unwrap();
    // As the client that spread it for the store's throttles leaves it.
    let mut learned = defined.clone();
    learned.set_write_ceiling(Some(160));
    learned.version = defined.version + 1;
    assert!(
        sluice::store::Store::put_bucket(&store, &learned, Some(&defined))
            .await
            .unwrap()
    );
    assert_eq!(get_raw(&store, &dim).await["write_ceiling"], n("160"));
    for (to, takes) in [(4u16, 8), (2, 4), (1, 2)] {
        sluice.reshard(&dim, to).await.unwrap();
        for _ in 0..takes {
            drop(sluice.acquire(dim.as_str()).await.unwrap());
        }
        for k in 0..to {
            let key = if k == 0 {
                dim.clone()
            } else {
                format!("{dim}#{k}")
            };
            let row = get_raw(&store, &key).await;
            assert_eq!(row["write_ceiling"], n("160"), "{key} over {to} rows");
        }
    }
    let row = sluice.bucket(&dim).await.unwrap().unwrap();
    assert_eq!((row.shards, row.write_ceiling()), (1, Some(160)));
}
