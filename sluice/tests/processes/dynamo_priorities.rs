//! Priorities across processes, on DynamoDB Local: a `batch` process hammering one
//! `requests` bucket with many tasks at full speed, and an `interactive` process asking at
//! a steady rate well within the reserve the bucket keeps for it.
//!
//! Measured: the interactive process is never refused (no RetryIn, no other error), the
//! batch process gets the rest, at least 97% of the supply (`capacity + rate × run`) is
//! granted overall, no window of grants holds more than `capacity + rate × window`, and
//! the row's own ledger (granted plus left) holds no more than was there plus refill.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use crate::dynamo;

use std::io::Write;
use std::time::Duration;

use dynamo::worker::{self, Start, Worker};
use sluice::{
    Bucket, Config, DynamoStore, Error, Priority, RefillRate, Sluice, SluiceBuilder, Tokens,
    clock::Clock as _, clock::SystemClock, clock::UnixMillis,
};

const CAPACITY: u64 = 40;
const PER_SECOND: u64 = 100;
/// Kept for `interactive`: a quarter of the capacity.
const RESERVE: i64 = 10;
/// The interactive process asks once per this interval: 5 per second.
const INTERACTIVE_EVERY: Duration = Duration::from_millis(200);
const BATCH_TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(10);

pub(crate) fn main() {
    match worker::start(tracing::Level::ERROR) {
        Start::Child(runtime, args) => runtime.block_on(child(&args)),
        Start::Parent(runtime) => {
            worker::report("priorities across processes", runtime.block_on(parent()));
        }
    }
}

fn now() -> i64 {
    SystemClock.now().as_millis()
}

fn client(endpoint: &str, table: &str, priority: &str) -> Sluice {
    SluiceBuilder::from_config(Config {
        caller: priority.to_owned(),
        priority: Some(priority.parse().unwrap()),
        ..Config::default()
    })
    .store(DynamoStore::new(dynamo::client(endpoint), table))
    .build()
    .unwrap()
}

/// Asks at a steady pace until `deadline`; one line per answer.
async fn interactive(sluice: Sluice, dimension: String, deadline: i64) -> Vec<String> {
    let mut lines = Vec::new();
    let mut next = now();
    while next < deadline {
        let wait = next - now();
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
        let asked = now();
        match sluice.acquire(dimension.as_str()).await {
            Ok(lease) => {
                lines.push(format!("grant interactive {asked} {}", now()));
                lease.release().await.unwrap();
            }
            Err(e) => lines.push(format!("refused interactive {e}")),
        }
        next += INTERACTIVE_EVERY.as_millis() as i64;
    }
    lines
}

/// Asks as fast as it is let until `deadline`, sleeping out each RetryIn.
async fn batch(sluice: Sluice, dimension: String, deadline: i64) -> Vec<String> {
    let mut lines = Vec::new();
    while now() < deadline {
        let asked = now();
        match sluice.acquire(dimension.as_str()).await {
            Ok(lease) => {
                lines.push(format!("grant batch {asked} {}", now()));
                lease.release().await.unwrap();
            }
            Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => tokio::time::sleep(d).await,
            Err(e) => lines.push(format!("refused batch {e}")),
        }
    }
    lines
}

async fn child(args: &[String]) {
    let [endpoint, table, dimension, priority] = args else {
        panic!("child arguments: {args:?}")
    };
    let sluice = client(endpoint, table, priority);
    // Warm: the bucket row is known before the clock starts.
    sluice.bucket(dimension).await.unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let deadline: i64 = line.trim().strip_prefix("go ").unwrap().parse().unwrap();
    let mut tasks = Vec::new();
    if priority == "interactive" {
        tasks.push(tokio::spawn(interactive(
            sluice,
            dimension.clone(),
            deadline,
        )));
    } else {
        for _ in 0..BATCH_TASKS {
            let (s, d) = (sluice.clone(), dimension.clone());
            tasks.push(tokio::spawn(batch(s, d, deadline)));
        }
    }
    for task in tasks {
        for record in task.await.unwrap() {
            println!("{record}");
        }
    }
    println!("done");
    std::io::stdout().flush().unwrap();
}

async fn parent() -> Option<()> {
    let _store = dynamo::store().await?;
    let endpoint = dynamo::endpoint()?;
    let table = dynamo::table_name();
    let dimension = format!("prio{:08x}#rpm", rand::random::<u32>());
    let interactive: Priority = "interactive".parse().unwrap();
    let admin = client(&endpoint, table, "interactive");
    let bucket = Bucket::requests(RefillRate::per_second(PER_SECOND))
        .with_capacity(CAPACITY)
        .with_reserve(interactive, RESERVE);
    let created = now();
    admin.put_bucket(&dimension, bucket).await.unwrap();

    let mut workers: Vec<Worker> = ["interactive", "batch"]
        .iter()
        .map(|p| Worker::spawn(p, &[&endpoint, table, &dimension, p]))
        .collect();
    let (lines, started, deadline) =
        tokio::task::spawn_blocking(move || worker::run_together(&mut workers, RUN))
            .await
            .unwrap();

    let mut grants = Vec::new();
    let (mut interactive, mut batch) = (0usize, 0usize);
    for line in &lines {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["grant", who, asked, returned] => {
                grants.push((asked.parse().unwrap(), returned.parse().unwrap()));
                if *who == "interactive" {
                    interactive += 1;
                } else {
                    batch += 1;
                }
            }
            ["refused", "interactive", ..] => panic!("the interactive process was refused: {line}"),
            _ => panic!("unexpected line {line:?}"),
        }
    }
    let asked = (RUN.as_millis() / INTERACTIVE_EVERY.as_millis()) as usize;
    assert!(
        interactive >= asked - 1,
        "the interactive process was granted {interactive} of about {asked}"
    );
    if let Some(excess) = dynamo::over_granted(&mut grants, CAPACITY, PER_SECOND, 0) {
        panic!("over-granted: {excess}");
    }
    // The supply in thousandths of a request: the full bucket, then the refill.
    let supply = CAPACITY as i64 * 1_000 + PER_SECOND as i64 * (deadline - started);
    let granted = (interactive + batch) as i64;
    let permille = granted * 1_000_000 / supply;
    assert!(
        permille >= 970,
        "{granted} of a supply of {} granted ({permille}‰): {interactive} interactive, {batch} batch",
        supply / 1_000
    );
    // The row's own ledger: everything granted plus what is left is at most what was there
    // plus what refilled since the bucket was created.
    let row = admin.bucket(&dimension).await.unwrap().unwrap();
    let checked = now();
    let left = row.available(UnixMillis::new(checked));
    let refilled = Tokens::from_nanos(
        i128::from(checked - created) * i128::from(PER_SECOND) * 1_000_000_000 / 1_000,
    );
    assert!(
        Tokens::new(granted) + left <= Tokens::new(CAPACITY as i64) + refilled,
        "over-granted: {granted} granted and {left} left, of {CAPACITY} + {refilled} refilled"
    );
    eprintln!(
        "priorities: {interactive} interactive grants, never refused; {batch} batch grants; {}.{}% of the supply ({}) used; {} left in the bucket",
        permille / 10,
        permille % 10,
        supply / 1_000,
        left,
    );
    Some(())
}
