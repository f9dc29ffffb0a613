//! Keys of one template first used from several OS processes at once, on DynamoDB Local.
//!
//! Every task of every process starts on the same key, none of them written yet, and moves
//! through the keys in turn, every other acquire also taking a shared dimension (a tenant's
//! limit and the vendor's, all or nothing). The parent checks, per key: one row, created
//! once (what it granted and what it holds never exceed `capacity + rate × elapsed` since
//! the key was first asked for: a row written over by a second first use would hold tokens
//! already granted), and at least its capacity granted; and the shared dimension's ledger,
//! exact.

#![allow(clippy::print_stdout)]

use crate::dynamo;

use dynamo::worker::{self, Start, Worker};

use std::io::Write;
use std::time::Duration;

use sluice::{
    Acquire, Bucket, Config, Dimension, DynamoStore, Error, RefillRate, Sluice, Tokens,
    clock::Clock as _, clock::SystemClock, clock::UnixMillis,
};

const PROCESSES: usize = 3;
const TASKS: usize = 4;
const KEYS: usize = 12;
const RUN: Duration = Duration::from_secs(4);
/// A key's bucket: capacity and refill per second.
const KEY_BUCKET: (u64, u64) = (5, 2);
/// The shared bucket: capacity, tokens at the start, refill per second (refill cannot fill
/// it during the run, so its ledger is never cut short by the cap).
const SHARED: (u64, i64, u64) = (1_000, 500, 1);

pub(crate) fn main() {
    match worker::start(tracing::Level::WARN) {
        Start::Child(runtime, a) => runtime.block_on(child(&a[0], &a[1], &a[2])),
        Start::Parent(runtime) => {
            worker::report("keys", runtime.block_on(parent()));
        }
    }
}

fn client(endpoint: &str, table: &str, caller: &str) -> Sluice {
    sluice::SluiceBuilder::from_config(Config {
        caller: caller.to_owned(),
        ..Config::default()
    })
    .store(DynamoStore::new(dynamo::client(endpoint), table))
    .clock(SystemClock)
    .build()
    .unwrap()
}

fn key(vendor: &str, k: usize) -> Dimension {
    format!("{vendor}#rpm")
        .parse::<Dimension>()
        .unwrap()
        .with_key(&format!("tenant-{k}"))
        .unwrap()
}

/// Acquires with `TASKS` tasks until the deadline; prints each key's grants, then the
/// shared dimension's.
async fn child(endpoint: &str, table: &str, vendor: &str) {
    let sluice = client(endpoint, table, &format!("keys-{}", std::process::id()));
    let shared = format!("{vendor}#shared");
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let deadline = UnixMillis::new(line.trim().strip_prefix("go ").unwrap().parse().unwrap());
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (sluice, vendor, shared) = (sluice.clone(), vendor.to_owned(), shared.clone());
            tokio::spawn(async move {
                let (mut granted, mut with_shared) = (vec![0u64; KEYS], 0u64);
                // When this task first asked for each key: its row cannot be older.
                let mut first = vec![i64::MAX; KEYS];
                let mut n = 0usize;
                while SystemClock.now() < deadline {
                    let k = n / 4 % KEYS;
                    let both = (n + task) % 2 == 1;
                    n += 1;
                    first[k] = first[k].min(SystemClock.now().as_millis());
                    let d = key(&vendor, k);
                    let request = if both {
                        Acquire::new(d.as_str()).and(shared.as_str())
                    } else {
                        Acquire::new(d.as_str())
                    };
                    match sluice.acquire(request).await {
                        Ok(lease) => {
                            granted[k] += 1;
                            with_shared += u64::from(both);
                            lease.release().await.unwrap();
                        }
                        Err(Error::RetryIn(r)) => {
                            let left = deadline.saturating_since(SystemClock.now());
                            tokio::time::sleep(r.delay.min(Duration::from_millis(20)).min(left))
                                .await;
                        }
                        Err(Error::Contention { .. }) => {}
                        Err(e) => panic!("acquire failed: {e}"),
                    }
                }
                (granted, with_shared, first)
            })
        })
        .collect();
    let (mut granted, mut with_shared) = (vec![0u64; KEYS], 0u64);
    let mut first = [i64::MAX; KEYS];
    for t in tasks {
        let (g, s, f) = t.await.unwrap();
        for (total, n) in granted.iter_mut().zip(g) {
            *total += n;
        }
        for (earliest, at) in first.iter_mut().zip(f) {
            *earliest = (*earliest).min(at);
        }
        with_shared += s;
    }
    let counts: Vec<String> = granted.iter().map(u64::to_string).collect();
    let firsts: Vec<String> = first.iter().map(i64::to_string).collect();
    println!(
        "granted {} shared {with_shared} first {}",
        counts.join(" "),
        firsts.join(" ")
    );
    println!("done");
    std::io::stdout().flush().unwrap();
}

async fn parent() -> Option<()> {
    let store = dynamo::store().await?;
    drop(store);
    let endpoint = dynamo::endpoint()?;
    let table = dynamo::table_name();
    let vendor = format!("keys{:08x}", rand::random::<u32>());
    let sluice = client(&endpoint, table, "parent");
    let (capacity, per_second) = KEY_BUCKET;
    let template = Bucket::requests(RefillRate::per_second(per_second))
        .with_capacity(capacity)
        .lean()
        .keyed();
    sluice
        .put_bucket(&format!("{vendor}#rpm"), template)
        .await
        .unwrap();
    let shared = format!("{vendor}#shared");
    let (shared_capacity, shared_start, shared_rate) = SHARED;
    let bucket = Bucket::requests(RefillRate::per_second(shared_rate))
        .with_capacity(shared_capacity)
        .lean();
    sluice.put_bucket(&shared, bucket).await.unwrap();
    let down = i64::try_from(shared_capacity).unwrap() - shared_start;
    drop(
        sluice
            .acquire(Acquire::with_cost(&shared, down))
            .await
            .unwrap(),
    );
    let baseline = sluice.bucket(&shared).await.unwrap().unwrap();
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|i| Worker::spawn(&format!("keys-{i}"), &[&endpoint, table, &vendor]))
        .collect();
    let (lines, started, _) =
        tokio::task::spawn_blocking(move || worker::run_together(&mut workers, RUN))
            .await
            .unwrap();
    let now = SystemClock.now();
    let mut granted = vec![0u64; KEYS];
    let mut with_shared = 0u64;
    let mut first = [i64::MAX; KEYS];
    for line in &lines {
        let n: Vec<i64> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
        for (total, g) in granted.iter_mut().zip(&n[..KEYS]) {
            *total += u64::try_from(*g).unwrap();
        }
        with_shared += u64::try_from(n[KEYS]).unwrap();
        for (earliest, at) in first.iter_mut().zip(&n[KEYS + 1..]) {
            *earliest = (*earliest).min(*at);
        }
    }
    assert!(started <= first[0], "no acquire before the run");
    for (k, &g) in granted.iter().enumerate() {
        // Supply since the key was first asked for (its row cannot be older): a second
        // first use writing the row over would give about `capacity` more.
        let since = Duration::from_millis(u64::try_from(now.as_millis() - first[k]).unwrap());
        let bound = Tokens::new(i64::try_from(capacity).unwrap())
            + RefillRate::per_second(per_second).refill_over(since);
        let d = key(&vendor, k);
        let row = sluice.bucket(d.as_str()).await.unwrap().expect("a row");
        assert_eq!(row.shards, 1, "{d}: one row");
        // What was granted and what is left never exceed what the key was ever given: a
        // row created twice (the second first use writing over the first's) would hold
        // tokens already granted.
        let given = Tokens::new(i64::try_from(g).unwrap()) + row.available(now);
        assert!(
            given <= bound,
            "{d}: {g} granted and {} left, at most {bound} ({granted:?})",
            row.available(now)
        );
        assert!(g >= capacity, "{d}: {g} granted, the first fill at least");
    }
    let row = sluice.bucket(&shared).await.unwrap().unwrap();
    assert_eq!(
        row.available(now),
        baseline.available(now) - Tokens::new(i64::try_from(with_shared).unwrap()),
        "the shared dimension's ledger"
    );
    println!(
        "{} keys first used from {PROCESSES} processes at once: {granted:?} granted, \
         {with_shared} with the shared dimension",
        KEYS
    );
    Some(())
}
