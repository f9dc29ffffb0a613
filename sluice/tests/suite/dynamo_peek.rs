//! Peek on DynamoDB Local through `dynamodb-fidelity`, whose counters bill every request
//! the way real DynamoDB does: a peek never writes (no write unit, no failed condition),
//! reads at most once, and inside a denial window not at all.

use crate::dynamo;

use std::time::Duration;

use dynamodb_fidelity::{Config as FidelityConfig, Fidelity, ItemStats};
use sluice::{
    Acquire, Bucket, Config, DynamoStore, RefillRate, admin::Peek, clock::ManualClock,
    clock::UnixMillis,
};

#[tokio::test]
async fn peek_never_writes_and_reads_at_most_once_per_peek() {
    let Some(endpoint) = dynamo::endpoint() else {
        return;
    };
    let Some(store) = dynamo::fresh_store().await else {
        return;
    };
    let table = store.table().to_owned();
    let proxy = Fidelity::start(FidelityConfig {
        upstream: endpoint,
        ..FidelityConfig::default()
    })
    .await
    .expect("start dynamodb-fidelity");
    let clock = ManualClock::new(UnixMillis::from_secs(dynamo::future_secs()));
    let client = |caller: &str| {
        sluice::SluiceBuilder::from_config(Config {
            caller: caller.to_owned(),
            ..Config::default()
        })
        .store(DynamoStore::new(dynamo::client(&proxy.endpoint()), &table))
        .clock(clock.clone())
        .build()
        .unwrap()
    };
    let (peeker, taker) = (client("peeker"), client("taker"));
    let d = "peeked#tpm";
    peeker
        .put_bucket(
            d,
            Bucket::tokens(RefillRate::per_second(10)).with_capacity(100),
        )
        .await
        .unwrap();
    let totals = || *proxy.stats().totals();
    let wrote = |from: &ItemStats, to: &ItemStats| {
        (
            to.successful_writes - from.successful_writes,
            to.failed_conditional_writes - from.failed_conditional_writes,
            to.write_units - from.write_units,
        )
    };

    // Granted: every peek reads (a grant never comes from memory), none writes.
    let before = totals();
    for _ in 0..10 {
        let peeked = peeker.peek(Acquire::with_cost(d, 100)).await.unwrap();
        assert_eq!(peeked, Peek::Granted);
    }
    let after = totals();
    assert_eq!(wrote(&before, &after), (0, 0, 0), "{after:?}");
    assert_eq!(after.requests - before.requests, 10, "one read per peek");

    // Another client takes it all; the peeker's next peek reads and sees it.
    let _held = taker.acquire(Acquire::with_cost(d, 100)).await.unwrap();
    let before = totals();
    let first = peeker.peek(Acquire::with_cost(d, 20)).await.unwrap();
    assert_eq!(first, Peek::RetryIn(Duration::from_secs(2)));
    // The peeker's own refusal opens a denial window: peeks inside it read nothing.
    let refused = peeker.acquire(Acquire::with_cost(d, 20)).await.unwrap_err();
    let in_window = totals();
    clock.advance(Duration::from_millis(500));
    for _ in 0..10 {
        let peeked = peeker.peek(Acquire::with_cost(d, 20)).await.unwrap();
        assert_eq!(
            peeked.retry_in(),
            refused.retry_in().map(|w| w - Duration::from_millis(500))
        );
    }
    let after = totals();
    assert_eq!(wrote(&before, &after), (0, 0, 0), "{after:?}");
    assert_eq!(
        after.requests, in_window.requests,
        "no call inside the window"
    );
    proxy.shutdown().await;
}
