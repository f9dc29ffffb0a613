//! Client behaviour beyond the store conformance suite: the process-wide default client
//! and bounded waits.

use std::time::Duration;

use sluice::{Bucket, Error, MemoryStore, RefillRate, Sluice, UnixMillis};

#[tokio::test]
async fn the_global_client_is_the_one_set_in_code() {
    let mine = Sluice::in_memory();
    mine.put_bucket("global#rpm", Bucket::requests(RefillRate::per_second(1)))
        .await
        .unwrap();
    Sluice::set_global(mine.clone());
    let global = Sluice::global().await.unwrap();
    assert!(
        global.bucket("global#rpm").await.unwrap().is_some(),
        "same store as the one set"
    );
    let replaced = Sluice::set_global(Sluice::in_memory()).expect("a previous client");
    assert!(replaced.bucket("global#rpm").await.unwrap().is_some());
    assert!(
        Sluice::global()
            .await
            .unwrap()
            .bucket("global#rpm")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_table_name_asks_for_connect_when_built_without_io() {
    let config = sluice::Config::from_lookup(|name| {
        (name == "SLUICE_TABLE_NAME").then(|| "vendor-buckets-pre".to_owned())
    })
    .unwrap();
    match Sluice::builder().config(config).build() {
        Err(Error::Config(e)) => assert!(e.to_string().contains("vendor-buckets-pre"), "{e}"),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

fn paused_client() -> Sluice {
    Sluice::builder()
        .store(MemoryStore::new())
        .clock(sluice::TokioClock::starting_at(UnixMillis::from_secs(
            1_700_000_000,
        )))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn acquire_within_waits_exactly_the_retry_in_and_stops_at_its_bound() {
    let sluice = paused_client();
    sluice
        .put_bucket(
            "wait#rpm",
            Bucket::requests(RefillRate::per_second(2)).with_capacity(1),
        )
        .await
        .unwrap();
    sluice
        .acquire("wait#rpm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let lease = sluice
        .acquire_within("wait#rpm", Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(500),
        "slept exactly the RetryIn"
    );
    lease.release().await.unwrap();
    // The next token is 500 ms away: a 499 ms bound gives up at once with that RetryIn.
    let started = tokio::time::Instant::now();
    let e = sluice
        .acquire_within("wait#rpm", Duration::from_millis(499))
        .await
        .unwrap_err();
    assert_eq!(e.retry_in(), Some(Duration::from_millis(500)));
    assert_eq!(started.elapsed(), Duration::ZERO);
}
