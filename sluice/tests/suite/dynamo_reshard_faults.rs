//! Reshards whose answers are lost, on DynamoDB Local behind a proxy that loses or delays
//! them (see `dynamo/proxy.rs`): whether a reshard's transaction applied or not, and
//! however its client's retries met it, the bucket is whole afterwards (one count on every
//! row, every token kept) and the next reshard goes on from it.

use crate::dynamo;

use std::time::Duration;

use dynamo::proxy::{Faults, Proxy};
use sluice::{
    Acquire, Bucket, Config, RefillRate, Sluice, SluiceBuilder, Tokens, clock::ManualClock,
    clock::UnixMillis,
};

/// A client of `table` at `endpoint` on `clock`, with store deadlines short enough that
/// a lost answer is asked again, and given up, within the test.
async fn client(endpoint: &str, table: &str, clock: &ManualClock) -> Sluice {
    SluiceBuilder::from_config(Config {
        caller: "resharder".to_owned(),
        table_name: Some(table.to_owned()),
        endpoint_url: Some(endpoint.to_owned()),
        ..Config::default()
    })
    .store_timeouts(Duration::from_millis(1_500), Duration::from_millis(250))
    .clock(clock.clone())
    .connect()
    .await
    .unwrap()
}

/// The rows of `d`'s bucket as stored (read straight from DynamoDB Local): the count
/// every row carries, and the tokens they hold at `now` together.
async fn whole(direct: &Sluice, d: &str, now: UnixMillis) -> (Vec<u16>, Tokens) {
    let rows: Vec<_> = direct
        .buckets()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.dimension.as_str() == d || r.dimension.as_str().starts_with(&format!("{d}#")))
        .collect();
    let counts = rows.iter().map(|r| r.shards).collect();
    let tokens = rows
        .iter()
        .fold(Tokens::ZERO, |s, r| s.saturating_add(r.available(now)));
    (counts, tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reshard_whose_answer_is_lost_leaves_the_bucket_whole() {
    let Some(endpoint) = dynamo::endpoint() else {
        return;
    };
    let Some(store) = dynamo::fresh_store().await else {
        return;
    };
    let table = store.table().to_owned();
    let clock = ManualClock::new(UnixMillis::from_secs(dynamo::future_secs()));
    let direct = client(&endpoint, &table, &clock).await;
    let d = "lossy#tpm";
    direct
        .put_bucket(
            d,
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000),
        )
        .await
        .unwrap();
    drop(direct.acquire(Acquire::with_cost(d, 370)).await.unwrap());
    let proxy = Proxy::start(&endpoint, Faults::default()).await;
    let resharder = client(&proxy.endpoint, &table, &clock).await;
    let expected = Tokens::new(630);
    let (mut lost, mut landed) = (0, 0);
    // Every answer lost, then half of them, then some delayed past the attempt deadline.
    let faults = [
        Faults {
            lose_per_mille: 1_000,
            ..Faults::default()
        },
        Faults {
            lose_per_mille: 500,
            ..Faults::default()
        },
        Faults {
            delay_per_mille: 700,
            max_delay: Duration::from_millis(600),
            ..Faults::default()
        },
    ];
    for (round, to) in [4, 1, 8, 2, 1, 4, 8, 1, 2].into_iter().enumerate() {
        proxy.set_faults(faults[round % faults.len()]);
        match tokio::time::timeout(Duration::from_secs(20), resharder.reshard(d, to)).await {
            Ok(Ok(rows)) => {
                landed += 1;
                assert_eq!(rows.len(), usize::from(to));
            }
            Ok(Err(_)) => lost += 1,
            Err(_) => panic!("a reshard ran past 20 s"),
        }
        proxy.set_faults(Faults::default());
        let (counts, tokens) = whole(&direct, d, clock.now()).await;
        let n = counts[0];
        assert!(
            counts.len() == usize::from(n) && counts.iter().all(|c| *c == n),
            "round {round}: rows {counts:?} are not one bucket's"
        );
        assert_eq!(
            tokens, expected,
            "round {round}: a token made or lost over {n} rows"
        );
        // The next reshard, with nothing lost, lands from whatever this one left.
        let rows = resharder.reshard(d, to).await.unwrap();
        assert_eq!(rows.len(), usize::from(to), "round {round}");
        assert_eq!(whole(&direct, d, clock.now()).await.1, expected);
    }
    assert!(
        lost > 0,
        "no reshard lost its answer: the test proved nothing"
    );
    assert_eq!(landed + lost, 9);
    // The bucket still grants its whole, through a client that knows nothing of it.
    let fresh = client(&endpoint, &table, &clock).await;
    drop(fresh.acquire(Acquire::with_cost(d, 630)).await.unwrap());
}
