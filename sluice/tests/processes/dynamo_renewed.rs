//! A slot held far past its TTL by a live process stays its own, and is free soon after
//! the process is SIGKILLed: a child holds the one slot of a `concurrent(1)` bucket on
//! DynamoDB Local with a lease of 1 s for 12 s (renewed every third of it); meanwhile the
//! parent is refused it. Killed by its PID, the child's slot comes back to the parent
//! within the TTL plus the clock-skew margin (and the parent's poll and round trips).
//!
//! `long_slot_held_ten_minutes` is the same with a lease of 10 s held for ten minutes: it
//! runs only when named (`./scripts/test.sh` runs it beside the other tests).

#![allow(clippy::print_stdout, clippy::print_stderr)]

use crate::dynamo;

use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use dynamo::worker::{self, Start, Worker};
use sluice::store::LeaseFilter;
use sluice::{
    Acquire, Bucket, Config, DynamoStore, Error, Sluice, SluiceBuilder, clock::SystemClock,
};

const SKEW: Duration = Duration::from_millis(250);
const POLL: Duration = Duration::from_millis(100);
/// What a free slot may take on top of TTL + skew to reach the parent: its poll, a read of
/// the slot leases, the reclaim and the grant, on a loaded two-core machine.
const REACH: Duration = Duration::from_millis(1_500);

/// The slot's lease, and how long it is held.
#[derive(Clone, Copy)]
struct Hold {
    ttl: Duration,
    held: Duration,
}

pub(crate) fn main() {
    run(Hold {
        ttl: Duration::from_secs(1),
        held: Duration::from_secs(12),
    });
}

pub(crate) fn ten_minutes() {
    run(Hold {
        ttl: Duration::from_secs(10),
        held: Duration::from_secs(600),
    });
}

fn run(hold: Hold) {
    match worker::start(tracing::Level::WARN) {
        Start::Child(runtime, a) => {
            let ttl = Duration::from_millis(a[3].parse().unwrap());
            runtime.block_on(child(&a[0], &a[1], &a[2], ttl));
        }
        Start::Parent(runtime) => {
            worker::report("renewed slots", runtime.block_on(parent(hold)));
        }
    }
}

fn client(endpoint: &str, table: &str, caller: &str) -> Sluice {
    SluiceBuilder::from_config(Config {
        caller: caller.to_owned(),
        clock_skew: SKEW,
        slot_poll: POLL,
        ..Config::default()
    })
    .store(DynamoStore::new(dynamo::client(endpoint), table))
    .clock(SystemClock)
    .build()
    .unwrap()
}

async fn child(endpoint: &str, table: &str, dimension: &str, ttl: Duration) {
    let sluice = client(endpoint, table, "holder");
    let lease = sluice
        .acquire_within(Acquire::new(dimension).ttl(ttl), Duration::from_secs(5))
        .await
        .unwrap();
    println!("holding");
    std::io::stdout().flush().unwrap();
    // Held until killed; says so if it ever loses the slot. Its parent gone (its stdin
    // closed), it goes too.
    tokio::select! {
        () = lease.lost() => {
            println!("lost");
            std::io::stdout().flush().unwrap();
            std::future::pending::<()>().await;
        }
        _ = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            let _ = BufReader::new(std::io::stdin()).read_line(&mut line);
        }) => std::process::exit(0),
    }
}

async fn parent(Hold { ttl, held }: Hold) -> Option<()> {
    let _store = dynamo::store().await?;
    let endpoint = dynamo::endpoint()?;
    let table = dynamo::table_name();
    let dimension = format!("renewed{:08x}#concurrent", rand::random::<u32>());
    let sluice = client(&endpoint, table, "parent");
    sluice
        .put_bucket(&dimension, Bucket::concurrent(1))
        .await
        .unwrap();
    let ttl_ms = ttl.as_millis().to_string();
    let args = [
        endpoint.as_str(),
        table,
        dimension.as_str(),
        ttl_ms.as_str(),
    ];
    let mut holder = Worker::spawn("holder", &args);
    let mut holder = tokio::task::spawn_blocking(move || {
        holder.expect_line("holding");
        holder
    })
    .await
    .unwrap();
    let filter = LeaseFilter {
        dimension: Some(dimension.parse().unwrap()),
        expired_before: None,
    };
    let started = Instant::now();
    let mut checks = 0;
    while started.elapsed() < held {
        tokio::time::sleep(ttl / 2).await;
        match sluice.acquire(dimension.as_str()).await {
            Err(Error::RetryIn(_)) => {}
            other => panic!(
                "the held slot was handed out after {:?}: {other:?}",
                started.elapsed()
            ),
        }
        let report = sluice.reconcile().await.unwrap();
        assert_eq!(
            report.leases_restored, 0,
            "a live holder's slot was reclaimed"
        );
        let leases = sluice.leases(&filter).await.unwrap();
        assert_eq!(leases.len(), 1, "{leases:?}");
        checks += 1;
    }
    // Killed by its PID, mid-slot.
    holder.child.kill().unwrap();
    let killed = Instant::now();
    holder.child.wait().unwrap();
    let lease = sluice
        .acquire_within(
            dimension.as_str(),
            ttl + SKEW + REACH + Duration::from_secs(2),
        )
        .await
        .unwrap();
    let back = killed.elapsed();
    assert!(
        back <= ttl + SKEW + REACH,
        "the killed holder's slot came back after {back:?}"
    );
    lease.release().await.unwrap();
    eprintln!(
        "a slot with a {ttl:?} lease held {held:?} ({checks} checks, never handed out); after SIGKILL, back in {back:?} (TTL + skew = {:?})",
        ttl + SKEW
    );
    Some(())
}
