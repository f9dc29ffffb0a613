//! Leases kept in the bucket row, on DynamoDB Local over the real wire: what the seed's
//! other SDKs do to such a row (update it their way, re-seed it whole), and what each kept
//! lease costs in item size and write units.

#![allow(clippy::print_stderr)]

mod dynamo;

use dynamo::{n, s};

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use sluice::store::{LeaseFilter, Store as _};
use sluice::{Bucket, DynamoStore, ManualClock, RefillRate, Sluice, Tokens, UnixMillis};

fn vendor() -> String {
    format!("held{:08x}", rand::random::<u32>())
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
async fn another_sdks_update_keeps_the_leases_a_row_keeps() {
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
    let held = sluice.acquire(dim.as_str()).await.unwrap();
    let id = held.id().clone();
    let raw = get_raw(&store, &dim).await;
    let attribute = format!("lease#{}", held.id().unique());
    assert!(
        matches!(raw.get(&attribute), Some(AttributeValue::L(parts)) if parts.len() == 4),
        "the lease is kept in the row: {raw:?}"
    );
    // Another SDK takes a slot its way: a conditional update of tokens and version (and a
    // lease row of its own, which does not matter here).
    let version = match raw.get("version") {
        Some(AttributeValue::N(v)) => v.clone(),
        other => panic!("version: {other:?}"),
    };
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
        .await
        .unwrap();
    assert!(get_raw(&store, &dim).await.contains_key(&attribute));
    // sluice's release still finds its lease and gives its slot back exactly once.
    held.release().await.unwrap();
    let row = sluice.bucket(&dim).await.unwrap().unwrap();
    assert_eq!(
        row.tokens,
        Tokens::new(2),
        "the other SDK's slot stays taken"
    );
    assert!(row.held.is_empty());
    // A second release finds nothing to give back.
    assert!(!sluice.release_id(&id).await.unwrap());
    assert_eq!(
        sluice.bucket(&dim).await.unwrap().unwrap().tokens,
        Tokens::new(2)
    );
}

#[tokio::test]
async fn a_row_reseeded_whole_drops_its_kept_leases_and_their_release_gives_nothing() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let clock = ManualClock::new(UnixMillis::from_secs(dynamo::future_secs()));
    let sluice = client(&store, &clock, "sluice");
    let dim = format!("{}#concurrent", vendor());
    sluice
        .put_bucket(&dim, Bucket::concurrent(2))
        .await
        .unwrap();
    let held = sluice.acquire(dim.as_str()).await.unwrap();
    // Another tool writes the row whole, as the seed's Terraform does: full, version 0.
    let t = clock.now().as_secs_ceil();
    store
        .client()
        .put_item()
        .table_name(store.table())
        .set_item(Some(HashMap::from([
            ("vendor_dimension".to_owned(), s(&dim)),
            ("capacity".to_owned(), n("2")),
            ("tokens".to_owned(), n("2")),
            ("refill_rate".to_owned(), n("0")),
            ("last_refill_at".to_owned(), n(&t.to_string())),
            ("cost_per_call".to_owned(), n("1")),
            ("limit_type".to_owned(), s("concurrent")),
            ("version".to_owned(), n("0")),
        ])))
        .send()
        .await
        .unwrap();
    held.release().await.unwrap();
    let row = sluice.bucket(&dim).await.unwrap().unwrap();
    assert_eq!(
        row.tokens,
        Tokens::new(2),
        "never above what the re-seed set"
    );
    assert!(
        store
            .list_leases(&LeaseFilter {
                dimension: Some(dim.parse().unwrap()),
                expired_before: None,
            })
            .await
            .unwrap()
            .is_empty()
    );
}

/// What a live kept lease costs: bytes in the row, and write units for every write of it.
#[tokio::test]
async fn each_kept_lease_costs_about_sixty_bytes_and_the_row_stays_within_the_bound() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let clock = ManualClock::new(UnixMillis::from_secs(dynamo::future_secs()));
    let sluice = client(&store, &clock, "worker-0123456789");
    let dim = format!("{}#rpm", vendor());
    sluice
        .put_bucket(&dim, Bucket::requests(RefillRate::per_second(1_000)))
        .await
        .unwrap();
    let per_row = sluice.config().leases_per_row;
    let empty = item_size(&get_raw(&store, &dim).await);
    let mut held = Vec::new();
    let mut units = Vec::new();
    for _ in 0..per_row {
        let before = store.stats();
        held.push(
            sluice
                .acquire(sluice::Acquire::with_cost(dim.as_str(), 250))
                .await
                .unwrap(),
        );
        let after = store.stats();
        assert_eq!(
            after.calls - before.calls,
            1,
            "one single-item write per grant"
        );
        units.push(after.write_milliunits - before.write_milliunits);
    }
    let full = get_raw(&store, &dim).await;
    let kept = full.keys().filter(|k| k.starts_with("lease#")).count();
    assert_eq!(kept, per_row);
    let per_lease = (item_size(&full) - empty) / per_row;
    eprintln!(
        "an empty row: {empty} bytes; with {per_row} kept leases: {} bytes ({per_lease} per lease); write units per grant as the row grew: {units:?} (thousandths)",
        item_size(&full)
    );
    assert!(per_lease <= 70, "{per_lease} bytes per kept lease");
    assert!(
        item_size(&full) <= 3 * 1024,
        "a row keeping {per_row} leases stays within 3 KB: {} bytes",
        item_size(&full)
    );
    // One more lease goes to a row of its own: the bound holds.
    let overflow = sluice.acquire(dim.as_str()).await.unwrap();
    let raw = get_raw(&store, &dim).await;
    assert_eq!(
        raw.keys().filter(|k| k.starts_with("lease#")).count(),
        per_row
    );
    assert!(
        store.read_leases(overflow.id().keys()).await.unwrap()[0]
            .as_ref()
            .is_some_and(|l| !l.in_bucket)
    );
    // What DynamoDB Local reports for a write of the full row.
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
    eprintln!(
        "a write of the row keeping {per_row} leases: {:?} write units",
        out.consumed_capacity().and_then(|c| c.capacity_units())
    );
    overflow.release().await.unwrap();
    for lease in held {
        lease.release().await.unwrap();
    }
    assert!(
        !get_raw(&store, &dim)
            .await
            .keys()
            .any(|k| k.starts_with("lease#"))
    );
}

#[tokio::test]
async fn a_client_that_keeps_releasing_its_leases_never_needs_a_transaction() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let sluice = Sluice::builder()
        .store(store.clone())
        .caller("loop")
        .build()
        .unwrap();
    let dim = format!("{}#rpm", vendor());
    sluice
        .put_bucket(
            &dim,
            Bucket::requests(RefillRate::per_second(1_000_000)).with_capacity(1_000_000),
        )
        .await
        .unwrap();
    let before = store.stats();
    // Far more cycles than the row keeps leases: each release must leave the row (and this
    // client's memory of it) with room for the next.
    let cycles = 3 * sluice.config().leases_per_row as u64;
    for _ in 0..cycles {
        sluice
            .acquire(dim.as_str())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let after = store.stats();
    assert_eq!(
        after.transaction_write_milliunits, before.transaction_write_milliunits,
        "no grant fell back to a lease row"
    );
    // One write to take, one to release (the client knows the row it created).
    assert_eq!(after.calls - before.calls, 2 * cycles);
    assert!(after.write_milliunits - before.write_milliunits <= 2_000 * cycles);
}
