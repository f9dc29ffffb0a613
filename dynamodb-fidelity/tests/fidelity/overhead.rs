//! What going through the proxy costs a conditional UpdateItem, against DynamoDB Local
//! directly, interleaved: printed (`-- --nocapture overhead`), never asserted. What it checks
//! is that the proxy counts every write it forwards, and none it did not (the direct ones).

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use dynamodb_fidelity::Config;

use crate::common::{KEY, client, endpoint, key, with_proxy};

const ROUNDS: usize = 300;

async fn update(client: &Client, table: &str) -> Duration {
    let started = Instant::now();
    client
        .update_item()
        .table_name(table)
        .set_key(Some(key("measured")))
        .update_expression("SET n = if_not_exists(n, :zero) + :one")
        .condition_expression("attribute_exists(#k)")
        .expression_attribute_names("#k", KEY)
        .expression_attribute_values(":zero", AttributeValue::N("0".into()))
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .send()
        .await
        .unwrap();
    started.elapsed()
}

fn percentile(sorted: &[Duration], per_cent: usize) -> Duration {
    sorted[(sorted.len() - 1) * per_cent / 100]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stderr)]
async fn overhead_of_a_conditional_update_through_the_proxy() {
    with_proxy(Config::default(), |h| async move {
        let direct = client(&endpoint().unwrap());
        h.put_sized("measured", 300).await;
        for _ in 0..20 {
            update(&direct, &h.table).await;
            update(&h.client, &h.table).await;
        }
        let (mut straight, mut proxied) = (Vec::new(), Vec::new());
        // Interleaved, so that both see the same load.
        for _ in 0..ROUNDS {
            straight.push(update(&direct, &h.table).await);
            proxied.push(update(&h.client, &h.table).await);
        }
        straight.sort();
        proxied.sort();
        for (name, times) in [("direct", &straight), ("proxied", &proxied)] {
            eprintln!(
                "{name:>8}: p50 {:?}  p90 {:?}  p99 {:?}",
                percentile(times, 50),
                percentile(times, 90),
                percentile(times, 99)
            );
        }
        eprintln!(
            "overhead: p50 {:?}",
            percentile(&proxied, 50).saturating_sub(percentile(&straight, 50))
        );
        assert_eq!(
            h.item("measured").successful_writes as usize,
            1 + 20 + ROUNDS
        );
    })
    .await;
}
