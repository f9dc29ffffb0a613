//! The store stops: frozen for 6 s (SIGSTOP) under 4 processes × 32 tasks, and killed and
//! restarted empty. Each scenario runs a DynamoDB Local of its own, stopped by PID.
//!
//! Frozen: every task acquires under a 2.5 s deadline of its own (the store's is 2 s). No
//! call takes longer than the store's deadline plus a small bound; every task ends; grants resume
//! after the freeze in every process; the bucket's decrease is exactly the grants the
//! processes received (a write the frozen server applied only after its caller gave up is
//! given back); no lease is left after the releases. With the `open` failure policy (25%),
//! grants go on during the freeze from each process's local bucket, within its share.
//!
//! Killed and restarted empty: typed errors (unreachable or timed out, then
//! `TableNotFound`), never a panic, and grants again once the table and bucket exist.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use crate::dynamo;

use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use dynamo::server::Server;
use dynamo::worker::{self, Start, Worker};
use sluice::store::{LeaseFilter, StoreError};
use sluice::{
    Acquire, Bucket, Config, DynamoStore, Error, FailurePolicy, RefillRate, Sluice, SluiceBuilder,
    Tokens, clock::Clock as _, clock::SystemClock, clock::UnixMillis,
};

const PROCESSES: usize = 4;
const TASKS: usize = 32;
/// The store's deadline for one call, and each task's own for one acquire.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);
const CALL_DEADLINE: Duration = Duration::from_millis(2_500);
/// What a call may take beyond its deadline (scheduling on two cores).
const SLACK: Duration = Duration::from_millis(400);
/// `rpm`: capacity, tokens at the start, refill per second. Refill cannot reach the
/// capacity during the run, so the ledger below is never cut short by the cap.
const RPM: (u64, u64, u64) = (1_000, 5, 20);
/// The open policy's share.
const OPEN_PERCENT: u8 = 25;
/// The run, from the go: the freeze starts at 2 s and ends at 8 s; the run ends at 12 s.
const FREEZE: (u64, u64) = (2_000, 8_000);
const RUN_MS: u64 = 12_000;

pub(crate) fn main() {
    match worker::start(tracing::Level::ERROR) {
        Start::Child(runtime, a) => runtime.block_on(child(&a[0], &a[1], &a[2], &a[3], &a[4])),
        Start::Parent(runtime) => {
            for mode in ["closed", "open"] {
                if !worker::report(&format!("frozen, {mode}"), runtime.block_on(frozen(mode))) {
                    return;
                }
            }
            if let Some(outcome) = runtime.block_on(restarted()) {
                worker::report("restarted", Some(outcome));
            }
        }
    }
}

async fn client(endpoint: &str, table: &str, caller: &str, policy: FailurePolicy) -> Sluice {
    SluiceBuilder::from_config(Config {
        caller: caller.to_owned(),
        table_name: Some(table.to_owned()),
        endpoint_url: Some(endpoint.to_owned()),
        lease_ttl: Duration::from_secs(300),
        failure_policy: policy,
        ..Config::default()
    })
    .store_timeouts(STORE_TIMEOUT, Duration::from_millis(500))
    .clock(SystemClock)
    .connect()
    .await
    .unwrap()
}

fn policy(mode: &str) -> FailurePolicy {
    if mode == "open" {
        FailurePolicy::Open {
            percent: OPEN_PERCENT,
        }
    } else {
        FailurePolicy::Closed
    }
}

/// What one task counted.
#[derive(Default)]
struct Counts {
    store_grants: u64,
    local_grants: u64,
    after_resume: u64,
    errors: u64,
    longest: Duration,
}

async fn task(sluice: Sluice, rpm: String, go: UnixMillis) -> (Vec<sluice::Lease>, Counts) {
    let at = |ms: u64| go.saturating_add(Duration::from_millis(ms));
    let mut held = Vec::new();
    let mut counts = Counts::default();
    while SystemClock.now() < at(RUN_MS) {
        let started = Instant::now();
        let outcome = tokio::time::timeout(CALL_DEADLINE, sluice.acquire(rpm.as_str())).await;
        counts.longest = counts.longest.max(started.elapsed());
        match outcome {
            Ok(Ok(lease)) => {
                if lease.attempts() == 0 {
                    counts.local_grants += 1;
                } else {
                    counts.store_grants += 1;
                    if SystemClock.now() > at(FREEZE.1) {
                        counts.after_resume += 1;
                    }
                    held.push(lease);
                }
            }
            Ok(Err(Error::RetryIn(sluice::RetryIn { delay: d, .. }))) => {
                tokio::time::sleep(d.min(Duration::from_millis(100))).await
            }
            Ok(Err(Error::Store(_) | Error::Contention { .. })) | Err(_) => {
                counts.errors += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(Err(e)) => panic!("acquire failed: {e}"),
        }
    }
    (held, counts)
}

async fn child(endpoint: &str, table: &str, vendor: &str, caller: &str, mode: &str) {
    let rpm = format!("{vendor}#rpm");
    let sluice = client(endpoint, table, caller, policy(mode)).await;
    // Seen once while the store answers (the open policy needs the bucket's definition).
    let _ = sluice.bucket(&rpm).await.unwrap();
    sluice
        .acquire(Acquire::with_cost(&rpm, 0))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut stdin = BufReader::new(std::io::stdin());
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    stdin.read_line(&mut line).unwrap();
    let go = UnixMillis::new(line.trim().strip_prefix("go ").unwrap().parse().unwrap());
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| tokio::spawn(task(sluice.clone(), rpm.clone(), go)))
        .collect();
    let (mut held, mut total) = (Vec::new(), Counts::default());
    for t in tasks {
        let (leases, c) = t.await.unwrap();
        held.extend(leases);
        total.store_grants += c.store_grants;
        total.local_grants += c.local_grants;
        total.after_resume += c.after_resume;
        total.errors += c.errors;
        total.longest = total.longest.max(c.longest);
    }
    // Give-backs of writes the frozen server applied after their callers gave up finish
    // in the background: let them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!(
        "granted {} {} {} {} {}",
        total.store_grants,
        total.local_grants,
        total.after_resume,
        total.errors,
        total.longest.as_millis()
    );
    std::io::stdout().flush().unwrap();
    line.clear();
    stdin.read_line(&mut line).unwrap();
    for lease in held {
        lease.release().await.unwrap();
    }
    println!("released");
    std::io::stdout().flush().unwrap();
}

async fn frozen(mode: &str) -> Option<()> {
    let server = Server::start().await?;
    let endpoint = server.endpoint();
    let table = "sluice-outages";
    let store = DynamoStore::new(dynamo::client(&endpoint), table);
    store.create_table().await.unwrap();
    let vendor = format!("frozen{:08x}", rand::random::<u32>());
    let rpm = format!("{vendor}#rpm");
    let sluice = client(&endpoint, table, "parent", FailurePolicy::Closed).await;
    let bucket = Bucket::requests(RefillRate::per_second(RPM.2)).with_capacity(RPM.0);
    sluice.put_bucket(&rpm, bucket).await.unwrap();
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|i| {
            let caller = format!("worker-{i}");
            Worker::spawn(&caller, &[&endpoint, table, &vendor, &caller, mode])
        })
        .collect();
    for w in &mut workers {
        w.expect_line("ready");
    }
    let lease = sluice
        .acquire(Acquire::with_cost(&rpm, RPM.0 - RPM.1))
        .await;
    lease.unwrap().release().await.unwrap();
    let baseline = sluice.bucket(&rpm).await.unwrap().unwrap();
    let go = SystemClock.now().saturating_add(Duration::from_millis(300));
    for w in &mut workers {
        w.say(&format!("go {}", go.as_millis()));
    }
    let until = |ms: u64| {
        let at = go.saturating_add(Duration::from_millis(ms));
        at.saturating_since(SystemClock.now())
    };
    tokio::time::sleep(until(FREEZE.0)).await;
    server.freeze();
    // A wait on the frozen store is a deadline all the same: it returns by it, within
    // 50 ms, whatever the store does (each call bounded by the time left).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = std::time::Instant::now();
    let answer = sluice
        .acquire_within(rpm.as_str(), Duration::from_secs(2))
        .await;
    let took = asked.elapsed();
    assert!(
        took <= Duration::from_millis(2_050) && answer.is_err(),
        "{mode}: acquire_within(2 s) on the frozen store: {answer:?} after {took:?}"
    );
    tokio::time::sleep(until(FREEZE.1)).await;
    server.resume();

    let (reports, mut workers) = tokio::task::spawn_blocking(move || {
        let reports: Vec<(String, Vec<u64>)> = workers
            .iter_mut()
            .map(|w| {
                let line = w.expect_line("granted");
                (
                    w.caller.clone(),
                    line.split(' ').map(|n| n.parse().unwrap()).collect(),
                )
            })
            .collect();
        (reports, workers)
    })
    .await
    .unwrap();
    let freeze_s = (FREEZE.1 - FREEZE.0) / 1_000;
    for (caller, n) in &reports {
        let [store_grants, local, after_resume, errors, longest_ms] = n[..] else {
            panic!("{caller}: {n:?}");
        };
        // No call outlives its caller's deadline. Almost every call ends at the store's
        // (requests queued behind a write the store did not answer hear so with it); a
        // request that joined the next write just as the one before it finished waits for
        // that write's own deadline, so the caller's is the bound that always holds.
        let bound = (CALL_DEADLINE + SLACK).as_millis() as u64;
        assert!(
            longest_ms <= bound,
            "{mode} {caller}: a call took {longest_ms} ms"
        );
        assert!(
            after_resume > 0,
            "{mode} {caller}: no grant after the freeze"
        );
        // Closed, the freeze shows as errors; open, as local grants (or none at all).
        assert!(
            store_grants > 0 && (errors > 0 || mode == "open"),
            "{mode} {caller}: {n:?}"
        );
        if mode == "open" {
            // A local bucket empty when the outage began, refilling at 25% of the rate:
            // at most that share of the refill over the outage (the freeze, plus the
            // moments before it is noticed to be over: a probe a second, a call).
            let share = u64::from(OPEN_PERCENT);
            let most = RPM.2 * share / 100 * (freeze_s + 3);
            assert!(
                local > 0 && local <= most,
                "{mode} {caller}: {local} local grants"
            );
        } else {
            assert_eq!(local, 0, "{mode} {caller}: closed grants nothing locally");
        }
    }
    // The ledger: the bucket lost exactly what the processes were granted by the store.
    let granted: u64 = reports.iter().map(|(_, n)| n[0]).sum();
    let row = sluice.bucket(&rpm).await.unwrap().unwrap();
    let ms = i128::from(row.last_refill_at.as_millis() - baseline.last_refill_at.as_millis());
    let supplied = baseline.tokens
        + RefillRate::per_second(RPM.2)
            .refill_over(std::time::Duration::from_millis(ms.unsigned_abs() as u64));
    // A write whose answer the freeze swallowed is not sent again (another client's
    // grants commute with it, so nothing tells whether it applied): its call fails (or,
    // open, is granted locally), and the tokens it asked for may have gone. Never more
    // than those, never invented.
    let errors: u64 = reports.iter().map(|(_, n)| n[3]).sum();
    let local: u64 = reports.iter().map(|(_, n)| n[1]).sum();
    let taken = supplied.saturating_sub(row.tokens);
    assert!(
        taken >= Tokens::from(granted) && taken <= Tokens::from(granted + errors + local),
        "{mode}: {taken} tokens taken for {granted} grants, {errors} failed calls and {local} local grants"
    );
    let filter = LeaseFilter {
        dimension: Some(rpm.parse().unwrap()),
        expired_before: None,
    };
    let leases = sluice.leases(&filter).await.unwrap();
    for (caller, n) in &reports {
        let counted = leases.iter().filter(|l| &l.caller == caller).count() as u64;
        assert_eq!(counted, n[0], "{mode} {caller}: leases vs grants");
    }
    for w in &mut workers {
        w.say("release");
    }
    for w in &mut workers {
        w.expect_line("released");
        assert!(w.finish(), "{} failed", w.caller);
    }
    assert!(sluice.leases(&filter).await.unwrap().is_empty());
    let longest = reports.iter().map(|(_, n)| n[4]).max().unwrap_or(0);
    eprintln!(
        "frozen {freeze_s} s, {mode}: {PROCESSES} processes x {TASKS} tasks: {granted} grants by the store, {local} local, {errors} failed calls, the longest {longest} ms (the store's deadline {} ms)",
        STORE_TIMEOUT.as_millis()
    );
    Some(())
}

async fn restarted() -> Option<()> {
    let mut server = Server::start().await?;
    let endpoint = server.endpoint();
    let table = "sluice-restarted";
    let store = DynamoStore::new(dynamo::client(&endpoint), table);
    store.create_table().await.unwrap();
    let sluice = client(&endpoint, table, "restarted", FailurePolicy::Closed).await;
    let bucket = || Bucket::requests(RefillRate::per_second(10));
    sluice.put_bucket("openai#rpm", bucket()).await.unwrap();
    sluice
        .acquire("openai#rpm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    server.kill();
    let e = sluice.acquire("openai#rpm").await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Store(
                StoreError::Unreachable { .. }
                    | StoreError::Unavailable { .. }
                    | StoreError::Timeout { .. }
            )
        ),
        "while down: {e:?}"
    );
    server.restart().await;
    let e = sluice.acquire("openai#rpm").await.unwrap_err();
    assert!(
        matches!(e, Error::Store(StoreError::TableNotFound { ref table }) if table == "sluice-restarted"),
        "an empty server: {e:?}"
    );
    assert!(matches!(
        sluice.bucket("openai#rpm").await,
        Err(Error::Store(StoreError::TableNotFound { .. }))
    ));
    store.create_table().await.unwrap();
    let e = sluice.acquire("openai#rpm").await.unwrap_err();
    assert!(
        matches!(e, Error::UnknownDimension { .. }),
        "no bucket yet: {e:?}"
    );
    sluice.put_bucket("openai#rpm", bucket()).await.unwrap();
    let lease = sluice.acquire("openai#rpm").await.unwrap();
    lease.release().await.unwrap();
    eprintln!("restarted: unreachable, then TableNotFound, then grants again");
    Some(())
}
