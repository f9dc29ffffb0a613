//! A mixed fleet on DynamoDB Local: two OS processes whose clients run in shadow mode and
//! one enforcing, each with several tasks, on one enforcing bucket. The shadow processes
//! are never refused and never wait; the enforcing one is refused while they keep the
//! bucket in debt, and is granted only what the bucket holds. The ledger is exact: the row
//! accounts for every grant of every process, shadow and enforcing alike.

#![allow(clippy::print_stdout)]

use crate::dynamo;

use dynamo::worker::{self, Start, Worker};

use std::io::Write;
use std::time::Duration;

use sluice::{
    Bucket, Config, DynamoStore, Error, Mode, RefillRate, Sluice, Tokens, clock::Clock as _,
    clock::SystemClock, clock::UnixMillis,
};

const TASKS: usize = 4;
const RUN: Duration = Duration::from_secs(3);
/// The bucket: capacity, tokens at the start, refill per second. Refill cannot fill it
/// during the run, so the ledger below is never cut short by the cap.
const BUCKET: (u64, i64, u64) = (1_000, 5, 10);

pub(crate) fn main() {
    match worker::start(tracing::Level::WARN) {
        Start::Child(runtime, a) => runtime.block_on(child(&a[0], &a[1], &a[2], &a[3])),
        Start::Parent(runtime) => {
            worker::report("shadow", runtime.block_on(parent()));
        }
    }
}

fn client(endpoint: &str, table: &str, caller: &str, mode: Mode) -> Sluice {
    sluice::SluiceBuilder::from_config(Config {
        caller: caller.to_owned(),
        mode,
        ..Config::default()
    })
    .store(DynamoStore::new(dynamo::client(endpoint), table))
    .clock(SystemClock)
    .build()
    .unwrap()
}

/// Acquires with `TASKS` tasks until the deadline; prints `granted N unrecorded U refused
/// R`. A shadow client must never be refused, nor fail.
async fn child(endpoint: &str, table: &str, dimension: &str, mode: &str) {
    let mode: Mode = mode.parse().unwrap();
    let sluice = client(
        endpoint,
        table,
        &format!("{mode}-{}", std::process::id()),
        mode,
    );
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let deadline = UnixMillis::new(line.trim().strip_prefix("go ").unwrap().parse().unwrap());
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (sluice, dimension) = (sluice.clone(), dimension.to_owned());
            tokio::spawn(async move {
                let (mut granted, mut unrecorded, mut refused) = (0u64, 0u64, 0u64);
                while SystemClock.now() < deadline {
                    match sluice.acquire(dimension.as_str()).await {
                        Ok(lease) if lease.attempts() == 0 => unrecorded += 1,
                        Ok(_) => granted += 1,
                        Err(Error::RetryIn(sluice::RetryIn { delay: d, .. }))
                            if mode == Mode::Enforce =>
                        {
                            refused += 1;
                            // Never past the deadline: the shadow processes keep the
                            // bucket deep in debt, and a RetryIn of a minute slept out
                            // would let refill fill the baseline the ledger counts from
                            // (capped at the capacity: the ledger then seemed off by
                            // what the cap cut).
                            let left = deadline.saturating_since(SystemClock.now());
                            tokio::time::sleep(d.min(left)).await;
                        }
                        Err(e) => panic!("{mode}: {e}"),
                    }
                }
                (granted, unrecorded, refused)
            })
        })
        .collect();
    let mut totals = (0, 0, 0);
    for t in tasks {
        let (g, u, r) = t.await.unwrap();
        totals = (totals.0 + g, totals.1 + u, totals.2 + r);
    }
    println!(
        "granted {} unrecorded {} refused {}",
        totals.0, totals.1, totals.2
    );
    println!("done");
    std::io::stdout().flush().unwrap();
}

async fn parent() -> Option<()> {
    let store = dynamo::store().await?;
    drop(store);
    let endpoint = dynamo::endpoint()?;
    let table = dynamo::table_name();
    let dimension = format!("shadow{:08x}#rpm", rand::random::<u32>());
    let sluice = client(&endpoint, table, "parent", Mode::Enforce);
    let (capacity, start, rate) = BUCKET;
    let bucket = Bucket::requests(RefillRate::per_second(rate))
        .with_capacity(capacity)
        .lean();
    sluice.put_bucket(&dimension, bucket).await.unwrap();
    let down = i64::try_from(capacity).unwrap() - start;
    drop(
        sluice
            .acquire(sluice::Acquire::with_cost(&dimension, down))
            .await
            .unwrap(),
    );
    let baseline = sluice.bucket(&dimension).await.unwrap().unwrap();
    let modes = ["shadow", "shadow", "enforce"];
    let mut workers: Vec<Worker> = modes
        .iter()
        .enumerate()
        .map(|(i, mode)| {
            let caller = format!("{mode}-{i}");
            Worker::spawn(&caller, &[&endpoint, table, &dimension, mode])
        })
        .collect();
    let (lines, _, _) =
        tokio::task::spawn_blocking(move || worker::run_together(&mut workers, RUN))
            .await
            .unwrap();
    let counts: Vec<[u64; 3]> = lines
        .iter()
        .map(|l| {
            let n: Vec<u64> = l.split(' ').filter_map(|w| w.parse().ok()).collect();
            [n[0], n[1], n[2]]
        })
        .collect();
    let shadow_granted: u64 = counts[..2].iter().map(|c| c[0]).sum();
    let [enforce_granted, _, enforce_refused] = counts[2];
    assert!(
        counts.iter().all(|c| c[1] == 0),
        "every grant recorded: {counts:?}"
    );
    assert!(shadow_granted > 0 && enforce_refused > 0, "{counts:?}");
    // The ledger: what was there, plus refill, less every grant of every process.
    let row = sluice.bucket(&dimension).await.unwrap().unwrap();
    let now = SystemClock.now();
    let taken = Tokens::new(i64::try_from(shadow_granted + enforce_granted).unwrap());
    assert_eq!(
        row.available(now),
        baseline.available(now) - taken,
        "{counts:?}"
    );
    assert!(
        row.tokens < Tokens::ZERO,
        "the shadow processes put it in debt"
    );
    assert!(row.shadow_refused() > 0);
    println!(
        "shadow processes granted {shadow_granted}, the enforcing one {enforce_granted} \
         (refused {enforce_refused}), {} would-refusals counted",
        row.shadow_refused()
    );
    Some(())
}
