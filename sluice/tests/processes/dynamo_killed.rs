//! Workers SIGKILLed mid-slot: 4 processes hold 120 slots of one `concurrent(150)` bucket
//! on DynamoDB Local (leases of 3 s) and are killed by their PIDs; 2 surviving processes
//! keep taking slots through it all. Survivors only ever see grants or RetryIn; once the
//! killed leases expired and one reconcile pass ran, the bucket is back to its capacity
//! exactly, with no lease left.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use crate::dynamo;

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use dynamo::worker::{self, Start, Worker};
use sluice::store::LeaseFilter;
use sluice::{
    Acquire, Bucket, Config, DynamoStore, Error, Sluice, SluiceBuilder, Tokens, clock::Clock as _,
    clock::SystemClock, clock::UnixMillis,
};

const SLOTS: u64 = 150;
const HOLDERS: usize = 4;
const HELD_EACH: usize = 30;
const SURVIVORS: usize = 2;
/// More survivor tasks than free slots: they run short until the killed leases expire.
const TASKS: usize = 24;
const LEASE: Duration = Duration::from_secs(3);
const RUN: Duration = Duration::from_secs(6);

pub(crate) fn main() {
    match worker::start(tracing::Level::ERROR) {
        Start::Child(runtime, a) => runtime.block_on(child(&a[0], &a[1], &a[2], &a[3], &a[4])),
        Start::Parent(runtime) => {
            worker::report("killed holders", runtime.block_on(parent()));
        }
    }
}

fn client(endpoint: &str, table: &str, caller: &str) -> Sluice {
    SluiceBuilder::from_config(Config {
        caller: caller.to_owned(),
        ..Config::default()
    })
    .store(DynamoStore::new(dynamo::client(endpoint), table))
    .clock(SystemClock)
    .build()
    .unwrap()
}

async fn child(endpoint: &str, table: &str, dimension: &str, caller: &str, role: &str) {
    let sluice = client(endpoint, table, caller);
    let mut stdin = BufReader::new(std::io::stdin());
    if role == "holder" {
        let mut held = Vec::new();
        while held.len() < HELD_EACH {
            match sluice.acquire(Acquire::new(dimension).ttl(LEASE)).await {
                Ok(lease) => held.push(lease),
                Err(Error::RetryIn(_) | Error::Contention { .. }) => {}
                Err(e) => panic!("{caller}: {e}"),
            }
        }
        println!("holding {}", held.len());
        std::io::stdout().flush().unwrap();
        // Mid-slot until killed.
        let mut line = String::new();
        let _ = stdin.read_line(&mut line);
        std::future::pending::<()>().await;
    }
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    stdin.read_line(&mut line).unwrap();
    let deadline = UnixMillis::new(line.trim().strip_prefix("go ").unwrap().parse().unwrap());
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (sluice, dimension) = (sluice.clone(), dimension.to_owned());
            tokio::spawn(async move {
                let (mut granted, mut refused) = (0u64, 0u64);
                while SystemClock.now() < deadline {
                    let body = tokio::time::sleep(Duration::from_millis(20));
                    match sluice.slot(dimension.as_str(), LEASE, body).await {
                        Ok(()) => granted += 1,
                        Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => {
                            refused += 1;
                            tokio::time::sleep(d.min(Duration::from_millis(50))).await;
                        }
                        Err(e) => panic!("a survivor saw neither a grant nor a RetryIn: {e}"),
                    }
                }
                (granted, refused)
            })
        })
        .collect();
    let (mut granted, mut refused) = (0, 0);
    for t in tasks {
        let (g, r) = t.await.unwrap();
        granted += g;
        refused += r;
    }
    println!("done {granted} {refused}");
    std::io::stdout().flush().unwrap();
}

async fn parent() -> Option<()> {
    let _store = dynamo::store().await?;
    let endpoint = dynamo::endpoint()?;
    let table = dynamo::table_name();
    let dimension = format!("killed{:08x}#concurrent", rand::random::<u32>());
    let sluice = client(&endpoint, table, "parent");
    sluice
        .put_bucket(&dimension, Bucket::concurrent(SLOTS))
        .await
        .unwrap();
    let mut holders: Vec<Worker> = (0..HOLDERS)
        .map(|i| {
            let caller = format!("holder-{i}");
            Worker::spawn(&caller, &[&endpoint, table, &dimension, &caller, "holder"])
        })
        .collect();
    let holders = tokio::task::spawn_blocking(move || {
        for h in &mut holders {
            assert_eq!(h.expect_line("holding"), HELD_EACH.to_string());
        }
        holders
    })
    .await
    .unwrap();
    let held = (HOLDERS * HELD_EACH) as u64;
    let row = sluice.bucket(&dimension).await.unwrap().unwrap();
    assert_eq!(row.tokens, Tokens::from(SLOTS - held));
    // Killed mid-slot, by their PIDs.
    drop(holders);

    let mut survivors: Vec<Worker> = (0..SURVIVORS)
        .map(|i| {
            let caller = format!("survivor-{i}");
            Worker::spawn(
                &caller,
                &[&endpoint, table, &dimension, &caller, "survivor"],
            )
        })
        .collect();
    for s in &mut survivors {
        s.expect_line("ready");
    }
    let deadline = SystemClock.now().saturating_add(RUN);
    for s in &mut survivors {
        s.say(&format!("go {}", deadline.as_millis()));
    }
    let (reports, mut survivors) = tokio::task::spawn_blocking(move || {
        let reports: Vec<String> = survivors
            .iter_mut()
            .map(|s| s.expect_line("done"))
            .collect();
        (reports, survivors)
    })
    .await
    .unwrap();
    for s in &mut survivors {
        assert!(s.finish(), "{} failed", s.caller);
    }
    let granted: u64 = reports
        .iter()
        .map(|r| r.split(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(granted > 0, "the survivors got no slot");

    // Every slot is either free or held by a lease (live, or expired and not yet given
    // back): none given back twice.
    let filter = LeaseFilter {
        dimension: Some(dimension.parse().unwrap()),
        expired_before: None,
    };
    let leases = sluice.leases(&filter).await.unwrap().len() as u64;
    let row = sluice.bucket(&dimension).await.unwrap().unwrap();
    assert_eq!(row.tokens + Tokens::from(leases), Tokens::from(SLOTS));
    // After the killed leases expired, one reconcile pass: the bucket is whole, exactly.
    let report = sluice.reconcile().await.unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let left = sluice.leases(&filter).await.unwrap();
    assert!(left.is_empty(), "leases left: {left:#?}");
    let row = sluice.bucket(&dimension).await.unwrap().unwrap();
    assert_eq!(row.tokens, Tokens::from(SLOTS), "slots lost or invented");
    eprintln!(
        "{HOLDERS} processes holding {held} of {SLOTS} slots killed; {SURVIVORS} survivors x {TASKS} tasks: {granted} slots in {RUN:?} ({}); after one reconcile pass ({} restored by it) the bucket holds {}",
        reports.join(", "),
        report.leases_restored,
        row.tokens
    );
    Some(())
}
