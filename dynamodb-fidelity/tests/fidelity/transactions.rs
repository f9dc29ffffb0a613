//! Transactions: the items of one in flight are held; single writes to them conflict,
//! other transactions on them are cancelled; the upstream's own cancellations pass through.

use std::time::Duration;

use aws_sdk_dynamodb::client::Client;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{ConditionCheck, Put, TransactWriteItem};
use dynamodb_fidelity::Config;

use crate::common::{KEY, key, sized_item, with_proxy};

/// Transactions keep their items 300 ms after their answer: long enough to write to them.
fn held() -> Config {
    Config {
        transaction_hold: Duration::from_millis(300),
        ..Config::default()
    }
}

fn put(table: &str, k: &str) -> TransactWriteItem {
    TransactWriteItem::builder()
        .put(
            Put::builder()
                .table_name(table)
                .set_item(Some(sized_item(k, 200)))
                .build()
                .unwrap(),
        )
        .build()
}

/// A transaction of `items`, started in the background.
fn transact(
    client: &Client,
    items: Vec<TransactWriteItem>,
) -> tokio::task::JoinHandle<Result<(), TransactWriteItemsError>> {
    let request = client
        .transact_write_items()
        .set_transact_items(Some(items));
    tokio::spawn(async move {
        request
            .send()
            .await
            .map(|_| ())
            .map_err(|e| e.into_service_error())
    })
}

/// Time for a transaction started in the background to reach the proxy.
const SETTLE: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_write_during_an_in_flight_transaction_gets_transaction_conflict() {
    with_proxy(held(), |h| async move {
        let txn = transact(&h.client, vec![put(&h.table, "contended")]);
        tokio::time::sleep(SETTLE).await;
        let error = h
            .client
            .put_item()
            .table_name(&h.table)
            .set_item(Some(sized_item("contended", 200)))
            .send()
            .await
            .unwrap_err()
            .into_service_error();
        let aws_sdk_dynamodb::operation::put_item::PutItemError::TransactionConflictException(e) =
            error
        else {
            panic!("expected a TransactionConflictException, got {error:?}")
        };
        assert_eq!(e.message(), Some("Transaction is ongoing for the item"));
        txn.await.unwrap().expect("the transaction commits");
        // Once it is over, the item may be written again.
        h.put_sized("contended", 200).await;
        let stats = h.item("contended");
        assert_eq!(stats.transaction_conflicts, 1);
        assert_eq!(stats.successful_writes, 2);
        assert_eq!(stats.write_units, 2 + 1, "the refused write is not billed");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_transaction_on_a_held_item_is_cancelled_with_reason_transaction_conflict() {
    with_proxy(held(), |h| async move {
        let first = transact(&h.client, vec![put(&h.table, "contended")]);
        tokio::time::sleep(SETTLE).await;
        let second = transact(
            &h.client,
            vec![put(&h.table, "free"), put(&h.table, "contended")],
        )
        .await
        .unwrap()
        .unwrap_err();
        let TransactWriteItemsError::TransactionCanceledException(e) = second else {
            panic!("expected a TransactionCanceledException, got {second:?}")
        };
        assert_eq!(
            e.message(),
            Some("Transaction cancelled, please refer cancellation reasons for specific reasons [None, TransactionConflict]")
        );
        let reasons: Vec<_> = e
            .cancellation_reasons()
            .iter()
            .map(|r| (r.code(), r.message()))
            .collect();
        assert_eq!(
            reasons,
            vec![
                (Some("None"), None),
                (Some("TransactionConflict"), Some("Transaction is ongoing for the item")),
            ]
        );
        first.await.unwrap().expect("the first transaction commits");
        assert_eq!(h.item("contended").transactions_cancelled, 1);
        assert_eq!(h.item("contended").write_units, 2, "only the first is billed");
        assert_eq!(h.item("free").write_units, 0);
        assert_eq!(h.item("free").successful_writes, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstreams_own_cancellation_passes_through_and_is_billed_per_item() {
    with_proxy(Config::default(), |h| async move {
        h.put_sized("exists", 1500).await;
        let check = TransactWriteItem::builder()
            .condition_check(
                ConditionCheck::builder()
                    .table_name(&h.table)
                    .set_key(Some(key("exists")))
                    .condition_expression("attribute_not_exists(#k)")
                    .expression_attribute_names("#k", KEY)
                    .build()
                    .unwrap(),
            )
            .build();
        let error = transact(&h.client, vec![put(&h.table, "new"), check])
            .await
            .unwrap()
            .unwrap_err();
        let TransactWriteItemsError::TransactionCanceledException(e) = error else {
            panic!("expected a TransactionCanceledException, got {error:?}")
        };
        let codes: Vec<_> = e.cancellation_reasons().iter().map(|r| r.code()).collect();
        assert_eq!(codes, vec![Some("None"), Some("ConditionalCheckFailed")]);
        let exists = h.item("exists");
        assert_eq!(exists.write_units, 2 + 2 * 2, "1,500 bytes as it is, twice");
        assert_eq!(exists.failed_conditional_writes, 1);
        let new = h.item("new");
        assert_eq!(new.write_units, 2, "a missing item: one unit, twice");
        assert_eq!(new.successful_writes, 0);
    })
    .await;
}
