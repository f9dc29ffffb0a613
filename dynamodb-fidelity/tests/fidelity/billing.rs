//! What each operation costs, per item, as real DynamoDB bills it.

use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, Put, PutRequest, ReturnValue, TransactGetItem,
    TransactWriteItem, WriteRequest,
};
use dynamodb_fidelity::Config;

use crate::common::{KEY, key, sized_item, with_proxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_of_500_bytes_bills_one_write_unit_and_of_1500_bytes_two() {
    with_proxy(Config::default(), |h| async move {
        h.put_sized("small", 500).await;
        h.put_sized("large", 1500).await;
        let small = h.item("small");
        assert_eq!(small.write_units, 1);
        assert_eq!(small.successful_writes, 1);
        assert_eq!(small.largest_item_size, 500);
        let large = h.item("large");
        assert_eq!(large.write_units, 2);
        assert_eq!(large.largest_item_size, 1500);
        assert_eq!(h.proxy.stats().totals().write_units, 3);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_bills_the_larger_of_the_item_before_and_after() {
    with_proxy(Config::default(), |h| async move {
        // Shrinking: 2,500 bytes before, a few after: 3 units.
        h.put_sized("shrinks", 2500).await;
        h.client
            .update_item()
            .table_name(&h.table)
            .set_key(Some(key("shrinks")))
            .update_expression("REMOVE payload")
            .send()
            .await
            .unwrap();
        assert_eq!(h.item("shrinks").write_units, 3 + 3);
        // Growing: 100 bytes before, 1,500 after (28 of them the key and the payload's
        // name): 2 units.
        h.put_sized("grows", 100).await;
        h.client
            .update_item()
            .table_name(&h.table)
            .set_key(Some(key("grows")))
            .update_expression("SET payload = :p")
            .expression_attribute_values(":p", AttributeValue::S("y".repeat(1500 - 28)))
            .send()
            .await
            .unwrap();
        let grows = h.item("grows");
        assert_eq!(grows.write_units, 1 + 2);
        assert_eq!(grows.largest_item_size, 1500);
        assert_eq!(grows.successful_writes, 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_that_asks_for_the_item_back_is_billed_by_it_and_still_gets_it() {
    with_proxy(Config::default(), |h| async move {
        let update = |name: &'static str, expression: &'static str| {
            h.client
                .update_item()
                .table_name(&h.table)
                .set_key(Some(key(name)))
                .update_expression(expression)
                .return_values(ReturnValue::AllNew)
        };
        // Growing: 100 bytes before, 1,500 after: 2 units, sized from the answer.
        h.put_sized("grows", 100).await;
        let answer = update("grows", "SET payload = :p")
            .expression_attribute_values(":p", AttributeValue::S("y".repeat(1500 - 28)))
            .send()
            .await
            .unwrap();
        let returned = answer.attributes().unwrap();
        assert_eq!(returned.get(KEY), Some(&AttributeValue::S("grows".into())));
        assert_eq!(returned["payload"].as_s().unwrap().len(), 1500 - 28);
        let grows = h.item("grows");
        assert_eq!(grows.write_units, 1 + 2);
        assert_eq!(grows.largest_item_size, 1500);
        // Shrinking: 2,500 bytes before, a few after: 3 units, the item before as read.
        h.put_sized("shrinks", 2500).await;
        let answer = update("shrinks", "REMOVE payload").send().await.unwrap();
        assert!(!answer.attributes().unwrap().contains_key("payload"));
        assert_eq!(h.item("shrinks").write_units, 3 + 3);
        // A new item made by the update: 1 unit.
        let answer = update("made", "SET n = :one")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.attributes().unwrap().len(), 2);
        assert_eq!(h.item("made").write_units, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_conditional_update_is_billed_by_the_item_as_it_is() {
    with_proxy(Config::default(), |h| async move {
        h.put_sized("present", 1500).await;
        let failed = h
            .client
            .update_item()
            .table_name(&h.table)
            .set_key(Some(key("present")))
            .update_expression("SET payload = :p")
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", KEY)
            .expression_attribute_values(":p", AttributeValue::S("z".repeat(5000)))
            .send()
            .await
            .unwrap_err();
        assert!(
            failed
                .into_service_error()
                .is_conditional_check_failed_exception()
        );
        let present = h.item("present");
        assert_eq!(present.write_units, 2 + 2, "1,500 bytes as it is: 2 units");
        assert_eq!(present.failed_conditional_writes, 1);
        assert_eq!(present.successful_writes, 1);

        // A missing item costs one unit.
        let failed = h
            .client
            .put_item()
            .table_name(&h.table)
            .set_item(Some(sized_item("absent", 3000)))
            .condition_expression("attribute_exists(#k)")
            .expression_attribute_names("#k", KEY)
            .send()
            .await
            .unwrap_err();
        assert!(
            failed
                .into_service_error()
                .is_conditional_check_failed_exception()
        );
        assert_eq!(h.item("absent").write_units, 1);
        assert_eq!(h.item("absent").failed_conditional_writes, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_bills_the_deleted_item_and_one_unit_when_there_is_none() {
    with_proxy(Config::default(), |h| async move {
        h.put_sized("doomed", 2100).await;
        for k in ["doomed", "never"] {
            h.client
                .delete_item()
                .table_name(&h.table)
                .set_key(Some(key(k)))
                .send()
                .await
                .unwrap();
        }
        assert_eq!(h.item("doomed").write_units, 3 + 3);
        assert_eq!(h.item("never").write_units, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_bills_twice_per_item() {
    with_proxy(Config::default(), |h| async move {
        let put = |k: &str, size: usize| {
            TransactWriteItem::builder()
                .put(
                    Put::builder()
                        .table_name(&h.table)
                        .set_item(Some(sized_item(k, size)))
                        .build()
                        .unwrap(),
                )
                .build()
        };
        h.client
            .transact_write_items()
            .transact_items(put("first", 500))
            .transact_items(put("second", 1500))
            .send()
            .await
            .unwrap();
        assert_eq!(h.item("first").write_units, 2);
        assert_eq!(h.item("second").write_units, 4);
        assert_eq!(h.item("second").successful_writes, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_write_bills_each_item_rounded_up_separately() {
    with_proxy(Config::default(), |h| async move {
        // The guide's example: 500 bytes and 3.5 KB cost 1 + 4 units.
        let put = |k: &str, size: usize| {
            WriteRequest::builder()
                .put_request(
                    PutRequest::builder()
                        .set_item(Some(sized_item(k, size)))
                        .build()
                        .unwrap(),
                )
                .build()
        };
        let answer = h
            .client
            .batch_write_item()
            .request_items(&h.table, vec![put("half", 500), put("more", 3584)])
            .send()
            .await
            .unwrap();
        assert!(answer.unprocessed_items().is_none_or(|u| u.is_empty()));
        assert_eq!(h.item("half").write_units, 1);
        assert_eq!(h.item("more").write_units, 4);
        assert_eq!(h.proxy.stats().totals().write_units, 5);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_bill_per_4_kb_half_if_eventually_consistent_and_twice_in_a_transaction() {
    with_proxy(Config::default(), |h| async move {
        h.put_sized("big", 5000).await;
        let get = |consistent: bool, k: &'static str| {
            h.client
                .get_item()
                .table_name(&h.table)
                .set_key(Some(key(k)))
                .consistent_read(consistent)
                .send()
        };
        get(true, "big").await.unwrap();
        assert_eq!(
            h.item("big").read_half_units,
            4,
            "8 KB strongly consistent: 2 units"
        );
        get(false, "big").await.unwrap();
        assert_eq!(
            h.item("big").read_half_units,
            4 + 2,
            "eventually consistent: half"
        );
        get(false, "missing").await.unwrap();
        assert_eq!(
            h.item("missing").read_half_units,
            1,
            "a missing item: half a unit"
        );
        // A projection does not make it cheaper.
        h.client
            .get_item()
            .table_name(&h.table)
            .set_key(Some(key("big")))
            .projection_expression("#k")
            .expression_attribute_names("#k", KEY)
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        assert_eq!(h.item("big").read_half_units, 6 + 4);
        h.client
            .transact_get_items()
            .transact_items(
                TransactGetItem::builder()
                    .get(
                        aws_sdk_dynamodb::types::Get::builder()
                            .table_name(&h.table)
                            .set_key(Some(key("big")))
                            .build()
                            .unwrap(),
                    )
                    .build(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(
            h.item("big").read_half_units,
            10 + 8,
            "transactional: twice"
        );
        h.client
            .batch_get_item()
            .request_items(
                &h.table,
                KeysAndAttributes::builder()
                    .keys(key("big"))
                    .keys(key("missing"))
                    .consistent_read(true)
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(h.item("big").read_half_units, 18 + 4);
        assert_eq!(h.item("missing").read_half_units, 1 + 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_bills_its_total_size_rounded_up_once_and_shares_it_among_the_items() {
    with_proxy(Config::default(), |h| async move {
        for k in ["a", "b", "c"] {
            h.put_sized(k, 1500).await;
        }
        h.proxy.reset();
        let scanned = h
            .client
            .scan()
            .table_name(&h.table)
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        assert_eq!(scanned.count(), 3);
        // 4,500 bytes in all: 2 units (4 halves), where one read each would cost 3.
        assert_eq!(h.proxy.stats().totals().read_half_units, 4);
        let shares: u64 = ["a", "b", "c"]
            .iter()
            .map(|k| h.item(k).read_half_units)
            .sum();
        assert_eq!(shares, 4);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_scan_bills_every_item_it_evaluated_at_full_size() {
    with_proxy(Config::default(), |h| async move {
        // Twenty items of 2 KB, one of which the filter keeps.
        for i in 0..20 {
            h.put_sized(&format!("row#{i:02}"), 2_048).await;
        }
        h.proxy.reset();
        let filtered = h
            .client
            .scan()
            .table_name(&h.table)
            .filter_expression("#k = :k")
            .projection_expression("#k")
            .expression_attribute_names("#k", KEY)
            .expression_attribute_values(":k", AttributeValue::S("row#07".to_owned()))
            .send()
            .await
            .unwrap();
        assert_eq!((filtered.count(), filtered.scanned_count()), (1, 20));
        // 40 KB evaluated, eventually consistent: 10 units (10 halves), not the half unit
        // the one small item returned would cost.
        assert_eq!(h.proxy.stats().totals().read_half_units, 10);
        let shares: u64 = (0..20)
            .map(|i| h.item(&format!("row#{i:02}")).read_half_units)
            .sum();
        assert_eq!(shares, 10);
        // A count reads as much; a limit counts evaluated items.
        h.proxy.reset();
        let counted = h
            .client
            .scan()
            .table_name(&h.table)
            .select(aws_sdk_dynamodb::types::Select::Count)
            .limit(4)
            .send()
            .await
            .unwrap();
        assert_eq!(counted.count(), 4);
        assert_eq!(h.proxy.stats().totals().read_half_units, 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_sized_before_by_what_the_last_write_through_the_proxy_left() {
    with_proxy(Config::default(), |h| async move {
        let direct = crate::common::client(&crate::common::endpoint().unwrap());
        let grow_around = |k: &'static str| {
            let (direct, table) = (direct.clone(), h.table.clone());
            async move {
                direct
                    .put_item()
                    .table_name(table)
                    .set_item(Some(sized_item(k, 2500)))
                    .send()
                    .await
                    .unwrap();
            }
        };
        let delete = |k: &'static str| {
            let (client, table) = (h.client.clone(), h.table.clone());
            async move {
                client
                    .delete_item()
                    .table_name(table)
                    .set_key(Some(key(k)))
                    .send()
                    .await
                    .unwrap();
            }
        };
        // Written through the proxy at 500 bytes, then grown to 2,500 around it: the
        // proxy sized the item from its own put, and does not read it again before the
        // delete (1 unit, where a read would have found 3).
        h.put_sized("remembered", 500).await;
        grow_around("remembered").await;
        delete("remembered").await;
        assert_eq!(h.item("remembered").write_units, 1 + 1);
        // After a transaction (sized by reads of its own) the size is not remembered: the
        // next write reads the item.
        h.put_sized("forgotten", 500).await;
        let put = Put::builder()
            .table_name(&h.table)
            .set_item(Some(sized_item("forgotten", 500)))
            .build()
            .unwrap();
        h.client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(put).build())
            .send()
            .await
            .unwrap();
        grow_around("forgotten").await;
        delete("forgotten").await;
        assert_eq!(h.item("forgotten").write_units, 1 + 2 + 3);
    })
    .await;
}
