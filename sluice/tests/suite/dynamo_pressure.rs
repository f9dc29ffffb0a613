//! Back-pressure at DynamoDB's real limits: independent clients (each with its own store,
//! SDK client and retry partition, as separate processes have) hammer one dimension through
//! `dynamodb-fidelity` with the per-item write ceiling scaled down, so the bucket item is
//! throttled most of the time. A throttled or conflicted write never reaches a caller as
//! an error: without a deadline it is a RetryIn, within one the caller gets its grant. The
//! bucket's ledger stays exact: it lost exactly the tokens granted.

use crate::dynamo;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dynamodb_fidelity::{Config as FidelityConfig, Fidelity, Running};
use sluice::{Bucket, Config, DynamoStore, Error, RefillRate, Sluice, Tokens};

const CAPACITY: i64 = 1_000_000;

/// A fresh table on DynamoDB Local and a fidelity proxy in front of it with `ceiling`
/// write units per second per item (and a quarter second of burst), or `None` to skip.
async fn throttled(ceiling: f64) -> Option<(Running, String)> {
    let endpoint = dynamo::endpoint()?;
    let store = dynamo::fresh_store().await?;
    let proxy = Fidelity::start(FidelityConfig {
        upstream: endpoint,
        write_ceiling: ceiling,
        burst: Duration::from_millis(250),
        transaction_hold: Duration::from_millis(5),
        ..FidelityConfig::default()
    })
    .await
    .expect("start dynamodb-fidelity");
    Some((proxy, store.table().to_owned()))
}

/// A client of its own through the proxy: its own SDK client, store and retry partition.
fn client(proxy: &Running, table: &str, caller: String) -> Sluice {
    let store = DynamoStore::new(dynamo::client(&proxy.endpoint()), table);
    sluice::SluiceBuilder::from_config(Config {
        caller,
        ..Config::default()
    })
    .store(store)
    .build()
    .unwrap()
}

/// A bucket that never runs short in the test and refills a token a day: whatever it
/// lost is what was granted.
fn ample() -> Bucket {
    Bucket::requests(RefillRate::per_day(1)).with_capacity(CAPACITY as u64)
}

#[derive(Default)]
struct Counts {
    grants: AtomicU64,
    retries: AtomicU64,
}

/// Asserts the proxy throttled the bucket (else the test proved nothing) and that the
/// bucket lost exactly `grants` tokens.
async fn check(proxy: &Running, sluice: &Sluice, dim: &str, grants: u64) {
    let totals = *proxy.stats().totals();
    assert!(
        totals.throttled_writes + totals.throttled_reads > 0,
        "the ceiling never throttled: {totals:?}"
    );
    let snapshot = sluice.snapshot(dim).await.unwrap();
    let left = snapshot.available;
    let expected = Tokens::new(CAPACITY - grants as i64);
    assert!(
        left >= expected && left < expected + Tokens::new(1),
        "{grants} grants left {left} of {CAPACITY}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_without_a_deadline_is_a_retry_in_never_an_error() {
    let Some((proxy, table)) = throttled(20.0).await else {
        return;
    };
    let dim = "pressure#rpm";
    let first = client(&proxy, &table, "pressure-0".into());
    first.put_bucket(dim, ample()).await.unwrap();
    let counts = Arc::new(Counts::default());
    let until = Instant::now() + Duration::from_secs(3);
    let callers = (0..8)
        .map(|i| {
            let sluice = client(&proxy, &table, format!("pressure-{i}"));
            let counts = counts.clone();
            tokio::spawn(async move {
                while Instant::now() < until {
                    match sluice.acquire(dim).await {
                        Ok(lease) => {
                            counts.grants.fetch_add(1, Ordering::SeqCst);
                            lease.release().await.expect("a release is never an error");
                        }
                        Err(Error::RetryIn(sluice::RetryIn { delay: wait, .. })) => {
                            counts.retries.fetch_add(1, Ordering::SeqCst);
                            assert!(wait <= Duration::from_secs(1), "RetryIn({wait:?})");
                            tokio::time::sleep(wait).await;
                        }
                        Err(e) => panic!("a caller got an error: {e}"),
                    }
                }
            })
        })
        .collect::<Vec<_>>();
    for caller in callers {
        caller.await.unwrap();
    }
    let grants = counts.grants.load(Ordering::SeqCst);
    let retries = counts.retries.load(Ordering::SeqCst);
    assert!(
        grants > 0 && retries > 0,
        "{grants} grants, {retries} RetryIn"
    );
    check(&proxy, &first, dim, grants).await;
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_within_a_deadline_is_waited_out() {
    let Some((proxy, table)) = throttled(40.0).await else {
        return;
    };
    let dim = "pressure#tpm";
    let first = client(&proxy, &table, "waiting-0".into());
    first.put_bucket(dim, ample()).await.unwrap();
    let grants = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(3);
    let callers = (0..6)
        .map(|i| {
            let sluice = client(&proxy, &table, format!("waiting-{i}"));
            let grants = grants.clone();
            tokio::spawn(async move {
                while Instant::now() < until {
                    let lease = sluice
                        .acquire_within(dim, Duration::from_secs(10))
                        .await
                        .unwrap_or_else(|e| panic!("within its deadline, a caller got {e}"));
                    grants.fetch_add(1, Ordering::SeqCst);
                    lease.release().await.expect("a release is never an error");
                }
            })
        })
        .collect::<Vec<_>>();
    for caller in callers {
        caller.await.unwrap();
    }
    let grants = grants.load(Ordering::SeqCst);
    check(&proxy, &first, dim, grants).await;
    proxy.shutdown().await;
}

/// Eight clients of their own acquire (within 10 s each: a table that serves fewer grants
/// than they ask makes them queue, unfairly at times, and a busy machine slower) and
/// release an ample bucket, one that spreads over rows when its row is hot, for 3 s
/// through `proxy`; the rows the bucket ends on.
async fn ample_load(proxy: &Running, table: &str, dim: &str) -> u16 {
    let first = client(proxy, table, "ample-0".into());
    let ample = Bucket::requests(RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
    first.put_bucket(dim, ample).await.unwrap();
    let until = Instant::now() + Duration::from_secs(3);
    let callers = (0..8)
        .map(|i| {
            let sluice = client(proxy, table, format!("ample-{i}"));
            let dim = dim.to_owned();
            tokio::spawn(async move {
                while Instant::now() < until {
                    let lease = sluice
                        .acquire_within(dim.as_str(), Duration::from_secs(10))
                        .await
                        .unwrap_or_else(|e| panic!("within its deadline, a caller got {e}"));
                    lease.release().await.expect("a release is never an error");
                }
            })
        })
        .collect::<Vec<_>>();
    for caller in callers {
        caller.await.unwrap();
    }
    let throttled = proxy.stats().totals().throttled_writes;
    assert!(throttled > 0, "the proxy never throttled");
    first.bucket(dim).await.unwrap().expect("the bucket").shards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttle_of_the_whole_table_is_back_pressure_and_spreads_no_bucket() {
    let Some(endpoint) = dynamo::endpoint() else {
        return;
    };
    // A cold on-demand table that serves 30 write units a second and will not double
    // within the test; every item's own ceiling far above.
    let store = dynamo::fresh_store().await.expect("a fresh table");
    let proxy = Fidelity::start(FidelityConfig {
        upstream: endpoint.clone(),
        transaction_hold: Duration::from_millis(5),
        table: Some(dynamodb_fidelity::TableModel {
            initial_write: 30.0,
            quota_write: 30.0,
            peak_window: Duration::from_secs(3600),
            ..dynamodb_fidelity::TableModel::default()
        }),
        ..FidelityConfig::default()
    })
    .await
    .expect("start dynamodb-fidelity");
    let rows = ample_load(&proxy, store.table(), "table#rpm").await;
    assert_eq!(rows, 1, "a table-wide throttle spread the bucket");
    proxy.shutdown().await;

    // The same load where the row's own key range throttles it: the bucket spreads.
    let store = dynamo::fresh_store().await.expect("a fresh table");
    let proxy = Fidelity::start(FidelityConfig {
        upstream: endpoint,
        write_ceiling: 30.0,
        transaction_hold: Duration::from_millis(5),
        ..FidelityConfig::default()
    })
    .await
    .expect("start dynamodb-fidelity");
    let rows = ample_load(&proxy, store.table(), "row#rpm").await;
    assert!(rows > 1, "a hot row's throttles did not spread the bucket");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_concurrent_dimension_spreads_its_slot_leases_over_four_index_keys() {
    let Some(endpoint) = dynamo::endpoint() else {
        return;
    };
    // The proxy bills each index key value's writes as DynamoDB bills a global secondary
    // index's: a slot's lease row is a put and a delete under its index key.
    let store = dynamo::fresh_store().await.expect("a fresh table");
    let proxy = Fidelity::start(FidelityConfig {
        upstream: endpoint,
        transaction_hold: Duration::from_millis(5),
        ..FidelityConfig::default()
    })
    .await
    .expect("start dynamodb-fidelity");
    let table = store.table();
    let dim = "slots#concurrent";
    let first = client(&proxy, table, "slots-0".into());
    first.put_bucket(dim, Bucket::concurrent(64)).await.unwrap();
    let granted = Arc::new(AtomicU64::new(0));
    let callers = (0..8)
        .map(|i| {
            let sluice = client(&proxy, table, format!("slots-{i}"));
            let granted = granted.clone();
            tokio::spawn(async move {
                for _ in 0..10 {
                    let lease = sluice
                        .acquire_within(dim, Duration::from_secs(10))
                        .await
                        .unwrap_or_else(|e| panic!("within its deadline, a caller got {e}"));
                    granted.fetch_add(1, Ordering::Relaxed);
                    lease.release().await.expect("a release is never an error");
                }
            })
        })
        .collect::<Vec<_>>();
    for caller in callers {
        caller.await.unwrap();
    }
    let granted = granted.load(Ordering::Relaxed);
    let stats = proxy.stats();
    let index = format!("{table}/index/{}", sluice::store::SLOTS_INDEX);
    let keys: Vec<u64> = [
        dim.to_owned(),
        format!("{dim} 1"),
        format!("{dim} 2"),
        format!("{dim} 3"),
    ]
    .iter()
    .map(|key| stats.item(&index, key).map_or(0, |s| s.write_units))
    .collect();
    // Every slot's lease row went under one of the four keys, and each took its share.
    assert_eq!(
        keys.iter().sum::<u64>(),
        2 * granted,
        "index writes by key: {keys:?}"
    );
    assert!(
        keys.iter().all(|&units| units >= granted / 8),
        "index writes by key: {keys:?}"
    );
    // No slot lost on the way.
    let row = first.bucket(dim).await.unwrap().expect("the bucket");
    assert_eq!(row.tokens, Tokens::new(64));
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_pass_reads_the_table_twice_whatever_it_finds() {
    use sluice::clock::{ManualClock, UnixMillis};
    let Some(endpoint) = dynamo::endpoint() else {
        return;
    };
    // The proxy bills a scan for every row it evaluates, as DynamoDB does.
    let store = dynamo::fresh_store().await.expect("a fresh table");
    let proxy = Fidelity::start(FidelityConfig {
        upstream: endpoint,
        ..FidelityConfig::default()
    })
    .await
    .expect("start dynamodb-fidelity");
    let through = DynamoStore::new(dynamo::client(&proxy.endpoint()), store.table());
    let clock = ManualClock::new(UnixMillis::from_secs(dynamo::future_secs()));
    let sluice = Sluice::builder()
        .store(through.clone())
        .clock(clock.clone())
        .caller("reconciler")
        .build()
        .unwrap();
    // 300 other buckets, and a `concurrent` bucket whose holder crashed with a slot.
    for i in 0..300 {
        sluice
            .put_bucket(
                &format!("filler{i}#rpm"),
                Bucket::requests(RefillRate::per_second(1)),
            )
            .await
            .unwrap();
    }
    let dim = "crashed#concurrent";
    sluice.put_bucket(dim, Bucket::concurrent(4)).await.unwrap();
    let lease = sluice
        .acquire(sluice::Acquire::new(dim).ttl(Duration::from_secs(5)))
        .await
        .unwrap();
    // The holder is gone: its lease is never released.
    std::mem::forget(lease);
    clock.advance(Duration::from_secs(120));
    // One strongly consistent read of the whole table: what one scan of it costs.
    proxy.reset();
    let mut start = None;
    loop {
        let page = through
            .client()
            .scan()
            .table_name(through.table())
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .unwrap();
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            break;
        }
    }
    let one_scan = proxy.stats().totals().read_half_units;
    proxy.reset();
    let report = sluice.reconcile().await.unwrap();
    assert_eq!(report.leases_restored, 1, "{report}");
    assert_eq!(
        sluice.bucket(dim).await.unwrap().unwrap().tokens,
        Tokens::new(4)
    );
    let pass = proxy.stats().totals().read_half_units;
    // Two reads of the table (its buckets, its leases) and the concurrent bucket again.
    assert!(
        pass <= 2 * one_scan + 4,
        "a pass read {pass} half units, one scan of the table {one_scan}"
    );
    proxy.shutdown().await;
}
