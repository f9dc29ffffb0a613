//! A global secondary index as DynamoDB runs it: each write that adds, changes or removes
//! an item's entry is billed to the index, and every entry under one index key value
//! shares that key's ceiling; an index key that cannot take a write throttles the
//! table's write, naming the index.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, ReturnValue, WriteRequest};
use dynamodb_fidelity::Config;

use crate::common::{GROUP, Harness, INDEX, KEY, key, sized_item, with_proxy};

/// An item of `key` (100 bytes and its group), in `group` if any.
fn grouped(key: &str, group: Option<&str>) -> HashMap<String, AttributeValue> {
    let mut item = sized_item(key, 100);
    if let Some(group) = group {
        item.insert(GROUP.to_owned(), AttributeValue::S(group.to_owned()));
    }
    item
}

/// Puts `key` in `group`; a throttle's reason and resource if it was refused.
async fn put(h: &Harness, key: &str, group: Option<&str>) -> Result<(), (String, String)> {
    match h
        .client
        .put_item()
        .table_name(&h.table)
        .set_item(Some(grouped(key, group)))
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(SdkError::ServiceError(e)) => match e.err() {
            PutItemError::ProvisionedThroughputExceededException(t) => {
                let reason = t.throttling_reasons().first().expect("a reason");
                Err((
                    reason.reason().unwrap_or_default().to_owned(),
                    reason.resource().unwrap_or_default().to_owned(),
                ))
            }
            other => panic!("unexpected error {other:?}"),
        },
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

/// The index entry of `group`, as the proxy's counters name it.
fn entry(group: &str) -> String {
    format!("index/{INDEX}/{group}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_write_to_an_index_entry_is_billed_to_its_key() {
    with_proxy(Config::default(), |h| async move {
        put(&h, "a", Some("g1")).await.unwrap();
        // An item without the index's key has no entry: no index write.
        put(&h, "b", None).await.unwrap();
        assert_eq!(h.item(&entry("g1")).write_units, 1);
        assert_eq!(h.proxy.stats().totals().write_units, 3);
        // Moving the item to another group: a delete under the old key, a put under the
        // new one.
        h.client
            .update_item()
            .table_name(&h.table)
            .set_key(Some(key("a")))
            .update_expression("SET #g = :g")
            .expression_attribute_names("#g", GROUP)
            .expression_attribute_values(":g", AttributeValue::S("g2".to_owned()))
            .send()
            .await
            .unwrap();
        assert_eq!(h.item(&entry("g1")).write_units, 2);
        assert_eq!(h.item(&entry("g2")).write_units, 1);
        // Changing another attribute rewrites the entry (every attribute is projected),
        // and an item of 2 KB is two units there as in the table.
        h.client
            .update_item()
            .table_name(&h.table)
            .set_key(Some(key("a")))
            .update_expression("SET payload = :p")
            .expression_attribute_values(":p", AttributeValue::S("x".repeat(1_500)))
            .return_values(ReturnValue::AllNew)
            .send()
            .await
            .unwrap();
        assert_eq!(h.item(&entry("g2")).write_units, 3);
        // A failed condition writes nothing to the index.
        let failed = h
            .client
            .put_item()
            .table_name(&h.table)
            .set_item(Some(grouped("a", Some("g3"))))
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", KEY)
            .send()
            .await;
        assert!(failed.is_err());
        assert_eq!(h.item(&entry("g3")).write_units, 0);
        // Deleting the item deletes its entry (by the item's size as it was).
        h.client
            .delete_item()
            .table_name(&h.table)
            .set_key(Some(key("a")))
            .send()
            .await
            .unwrap();
        assert_eq!(h.item(&entry("g2")).write_units, 5);
        // Index writes are billed, not counted as writes made.
        assert_eq!(h.item(&entry("g2")).successful_writes, 0);
    })
    .await;
}

/// Five write units a second per key, a minute of refill away.
fn five_per_key() -> Config {
    Config {
        write_ceiling: 0.1,
        burst: Duration::from_secs(50),
        ..Config::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_index_key_throttles_the_writes_of_every_item_under_it() {
    with_proxy(five_per_key(), |h| async move {
        // Twenty items, each its own partition in the table, all under one index key:
        // five units a second for all of them, there.
        let mut written = 0;
        let mut refused = None;
        for i in 0..20 {
            match put(&h, &format!("item#{i}"), Some("busy")).await {
                Ok(()) => written += 1,
                Err(why) => refused = Some(why),
            }
        }
        assert!((5..=6).contains(&written), "{written} written");
        let (reason, resource) = refused.expect("throttled");
        assert_eq!(reason, "IndexWriteKeyRangeThroughputExceeded");
        assert!(
            resource.ends_with(&format!(":table/{}/index/{INDEX}", h.table)),
            "{resource}"
        );
        assert!(h.item(&entry("busy")).throttled_writes >= 14);
        // Another index key, and items with no entry, write on.
        put(&h, "other#0", Some("quiet")).await.unwrap();
        put(&h, "plain#0", None).await.unwrap();
        // A batch: the entry under the spent key comes back unprocessed, the rest is
        // written.
        let request = |item| {
            WriteRequest::builder()
                .put_request(PutRequest::builder().set_item(Some(item)).build().unwrap())
                .build()
        };
        let out = h
            .client
            .batch_write_item()
            .request_items(
                &h.table,
                vec![
                    request(grouped("batch#0", Some("busy"))),
                    request(grouped("batch#1", None)),
                ],
            )
            .send()
            .await
            .unwrap();
        let unprocessed = &out.unprocessed_items().unwrap()[&h.table];
        assert_eq!(unprocessed.len(), 1);
        let item = unprocessed[0].put_request().unwrap().item();
        assert_eq!(item[KEY], AttributeValue::S("batch#0".to_owned()));
        // A transaction touching the spent key is throttled whole.
        let tx = h
            .client
            .transact_write_items()
            .transact_items(
                aws_sdk_dynamodb::types::TransactWriteItem::builder()
                    .put(
                        aws_sdk_dynamodb::types::Put::builder()
                            .table_name(&h.table)
                            .set_item(Some(grouped("tx#0", Some("busy"))))
                            .build()
                            .unwrap(),
                    )
                    .build(),
            )
            .send()
            .await;
        let error = tx.expect_err("throttled");
        assert!(
            format!("{error:?}").contains("IndexWriteKeyRangeThroughputExceeded"),
            "{error:?}"
        );
    })
    .await;
}
