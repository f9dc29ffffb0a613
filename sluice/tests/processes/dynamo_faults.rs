//! Several OS processes share buckets on DynamoDB Local through a proxy that loses
//! answers, delays them by up to 3 s and resets connections after forwarding requests
//! (see `dynamo/proxy.rs`): nothing is lost, nothing is over-granted.
//!
//! The test binary is its own worker: run with `--child`, it acquires until a deadline
//! (`rpm` alone, `rpm` + `tpm` together, `concurrent` slots), corrects each pair's `tpm`
//! cost with `adjust` (retrying on errors, as a caller would), holds every lease, reports
//! what it was granted and what it adjusted to, then releases. Every store call of the
//! children goes through the proxy, with the store timeouts short enough that lost answers
//! are asked again within the run. The parent reads the rows directly and checks the
//! ledger: the bucket's decrease equals the grants delivered (`rpm`) and the final adjusted
//! costs (`tpm`), but for the writes whose answer was lost and that the children counted as
//! unsure (a change adds to the row and never tells whether it applied: it may have taken
//! its tokens, never granted them); the grants stay within `tokens + refill_rate *
//! elapsed`; the leases per process equal the grants reported; and after the releases no
//! lease is left and the `concurrent` bucket, once the reconciler healed what lost answers
//! left short, is whole. It runs on the fast path with lease rows, and on lean buckets (no
//! leases).

#![allow(clippy::print_stdout, clippy::print_stderr)]

use crate::dynamo;

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use dynamo::proxy::{Faults, Proxy};
use dynamo::worker::{self, Start, Worker};
use sluice::store::LeaseFilter;
use sluice::{
    Acquire, Bucket, Config, Error, Lease, RefillRate, Sluice, SluiceBuilder, Tokens,
    clock::Clock as _, clock::SystemClock, clock::UnixMillis,
};

const PROCESSES: usize = 4;
const TASKS: usize = 8;
const RUN: Duration = Duration::from_secs(6);
const MODES: [&str; 2] = ["fast", "lean"];
/// `rpm`: capacity, tokens at the start, refill per second.
const RPM: (u64, u64, u64) = (100, 5, 10);
/// `tpm`: capacity, tokens at the start, refill per second, each pair's estimate.
const TPM: (u64, u64, u64, u64) = (1_000, 40, 30, 3);
const SLOTS: u64 = 4;
/// The faults: 5% of answers lost, 5% delayed by up to 3 s, 2% of connections reset.
const FAULTS: Faults = Faults {
    lose_per_mille: 50,
    delay_per_mille: 50,
    max_delay: Duration::from_secs(3),
    reset_per_mille: 20,
};

pub(crate) fn main() {
    match worker::start(tracing::Level::WARN) {
        Start::Child(runtime, a) => runtime.block_on(child(&a[0], &a[1], &a[2], &a[3])),
        Start::Parent(runtime) => {
            for mode in MODES {
                if !worker::report(mode, runtime.block_on(parent(mode))) {
                    return;
                }
            }
        }
    }
}

/// A client through the proxy at `endpoint`: short store timeouts, so that a lost answer
/// is asked again (and settled) well within the run.
async fn client(endpoint: &str, table: &str, caller: &str) -> Sluice {
    SluiceBuilder::from_config(Config {
        caller: caller.to_owned(),
        table_name: Some(table.to_owned()),
        endpoint_url: Some(endpoint.to_owned()),
        lease_ttl: Duration::from_secs(300),
        heal_settle: Duration::from_secs(1),
        ..Config::default()
    })
    .store_timeouts(Duration::from_secs(2), Duration::from_millis(250))
    .clock(SystemClock)
    .connect()
    .await
    .unwrap()
}

/// What a child counted.
#[derive(Default)]
struct Counts {
    granted: u64,
    pairs: u64,
    /// The sum of the pairs' `tpm` costs after adjustment.
    tpm_cost: u64,
    /// Store errors seen by acquires (their outcome settled: nothing granted).
    store_errors: u64,
    /// Adjustments that failed and were retried.
    adjust_retries: u64,
    /// The most tokens of each bucket that writes whose outcome the row could no longer
    /// tell may have taken without a grant.
    unknown_rpm: u64,
    unknown_tpm: u64,
}

/// Adjusts a pair's `tpm` cost to `actual`, retrying on errors as a caller would.
async fn adjust(lease: &mut Lease, tpm: &str, actual: u64, counts: &mut Counts) {
    for _ in 0..50 {
        match lease.adjust(tpm, actual).await {
            Ok(()) => return,
            Err(Error::Store(e)) if e.may_have_applied() => {
                counts.adjust_retries += 1;
                // Charged again at worst: the estimate was 3, the actual 1 to 5.
                counts.unknown_tpm += 2;
            }
            Err(Error::Store(_) | Error::Contention { .. }) => counts.adjust_retries += 1,
            Err(e) => panic!("adjust failed: {e}"),
        }
    }
    panic!("adjust failed 50 times");
}

async fn child(endpoint: &str, table: &str, vendor: &str, caller: &str) {
    let rpm = format!("{vendor}#rpm");
    let tpm = format!("{vendor}#tpm");
    let concurrent = format!("{vendor}#concurrent");
    let sluice = client(endpoint, table, caller).await;
    let mut stdin = BufReader::new(std::io::stdin());
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    stdin.read_line(&mut line).unwrap();
    let deadline = UnixMillis::new(line.trim().strip_prefix("go ").unwrap().parse().unwrap());

    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (sluice, rpm, tpm, concurrent) =
            (sluice.clone(), rpm.clone(), tpm.clone(), concurrent.clone());
        tasks.push(tokio::spawn(async move {
            let mut held = Vec::new();
            let mut counts = Counts::default();
            while SystemClock.now() < deadline {
                if task % 4 == 3 {
                    let body = tokio::time::sleep(Duration::from_millis(5));
                    match sluice
                        .slot(concurrent.as_str(), Duration::from_secs(30), body)
                        .await
                    {
                        Ok(()) => {}
                        Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => {
                            tokio::time::sleep(d.min(Duration::from_millis(50))).await
                        }
                        Err(Error::Contention { .. } | Error::Store(_)) => {}
                        Err(e) => panic!("slot failed: {e}"),
                    }
                    continue;
                }
                let pair = task % 4 == 1;
                let request = if pair {
                    Acquire::new(rpm.as_str()).and_cost(tpm.as_str(), TPM.3)
                } else {
                    Acquire::new(rpm.as_str())
                };
                match sluice.acquire(request).await {
                    Ok(mut lease) => {
                        counts.granted += 1;
                        if pair {
                            // The actual usage: a refund, the estimate or a charge.
                            let actual = 1 + counts.pairs % 5;
                            adjust(&mut lease, &tpm, actual, &mut counts).await;
                            counts.pairs += 1;
                            counts.tpm_cost += actual;
                        }
                        held.push(lease);
                    }
                    Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => {
                        tokio::time::sleep(d).await
                    }
                    Err(Error::Contention { .. }) => {}
                    Err(Error::Store(e)) if e.may_have_applied() => {
                        counts.unknown_rpm += 1;
                        if pair {
                            counts.unknown_tpm += TPM.3;
                        }
                    }
                    Err(Error::Store(_)) => counts.store_errors += 1,
                    Err(e) => panic!("acquire failed: {e}"),
                }
            }
            (held, counts)
        }));
    }
    let mut held = Vec::new();
    let mut total = Counts::default();
    for t in tasks {
        let (leases, counts) = t.await.unwrap();
        held.extend(leases);
        total.granted += counts.granted;
        total.pairs += counts.pairs;
        total.tpm_cost += counts.tpm_cost;
        total.store_errors += counts.store_errors;
        total.adjust_retries += counts.adjust_retries;
        total.unknown_rpm += counts.unknown_rpm;
        total.unknown_tpm += counts.unknown_tpm;
    }
    // Give-backs of tokens taken for requests that were not granted (a pair whose other
    // dimension was short, a write whose answer came too late) finish in the background,
    // retried until they go through: let them, before the ledger is read.
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!(
        "granted {} {} {} {} {} {} {}",
        total.granted,
        total.pairs,
        total.tpm_cost,
        total.store_errors,
        total.adjust_retries,
        total.unknown_rpm,
        total.unknown_tpm
    );
    std::io::stdout().flush().unwrap();
    line.clear();
    stdin.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "release");
    let mut failed = 0;
    for lease in held {
        // A release that fails goes on in the background until it succeeds.
        if lease.release().await.is_err() {
            failed += 1;
        }
    }
    // Give background releases time to go through (each retry waits at most 200 ms).
    if failed > 0 {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    println!("released {failed}");
    std::io::stdout().flush().unwrap();
}

/// The tokens a bucket row held at `baseline`, plus what refilled until `until`.
fn supply(baseline: &sluice::bucket::BucketState, rate: u64, until: UnixMillis) -> Tokens {
    let ms = i128::from(until.as_millis() - baseline.last_refill_at.as_millis());
    baseline.tokens
        + RefillRate::per_second(rate)
            .refill_over(std::time::Duration::from_millis(ms.unsigned_abs() as u64))
}

async fn parent(mode: &str) -> Option<()> {
    let _store = dynamo::store().await?;
    let endpoint = dynamo::endpoint()?;
    let table = dynamo::table_name();
    let proxy = Proxy::start(&endpoint, FAULTS).await;
    let vendor = format!("lossy{:08x}", rand::random::<u32>());
    let (rpm, tpm) = (format!("{vendor}#rpm"), format!("{vendor}#tpm"));
    let concurrent = format!("{vendor}#concurrent");
    // The parent reads and sets up directly, not through the proxy.
    let sluice = client(&endpoint, table, "parent").await;
    let lean = mode == "lean";
    let lean_if = |b: Bucket| if lean { b.lean() } else { b };
    let rpm_bucket = Bucket::requests(RefillRate::per_second(RPM.2)).with_capacity(RPM.0);
    let tpm_bucket = Bucket::tokens(RefillRate::per_second(TPM.2)).with_capacity(TPM.0);
    sluice.put_bucket(&rpm, lean_if(rpm_bucket)).await.unwrap();
    sluice.put_bucket(&tpm, lean_if(tpm_bucket)).await.unwrap();
    sluice
        .put_bucket(&concurrent, Bucket::concurrent(SLOTS))
        .await
        .unwrap();
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|i| {
            let caller = format!("worker-{i}");
            Worker::spawn(&caller, &[&proxy.endpoint, table, &vendor, &caller])
        })
        .collect();
    for w in &mut workers {
        w.expect_line("ready");
    }
    // Start the run with few tokens: demand far exceeds supply.
    for (dimension, take) in [(&rpm, RPM.0 - RPM.1), (&tpm, TPM.0 - TPM.1)] {
        let lease = sluice.acquire(Acquire::with_cost(dimension, take)).await;
        lease.unwrap().release().await.unwrap();
    }
    let rpm_baseline = sluice.bucket(&rpm).await.unwrap().unwrap();
    let tpm_baseline = sluice.bucket(&tpm).await.unwrap().unwrap();
    let deadline = SystemClock.now().saturating_add(RUN);
    for w in &mut workers {
        w.say(&format!("go {}", deadline.as_millis()));
    }

    let (reports, mut workers) = tokio::task::spawn_blocking(move || {
        let reports: Vec<(String, Vec<u64>)> = workers
            .iter_mut()
            .map(|w| {
                let line = w.expect_line("granted");
                let numbers = line.split(' ').map(|n| n.parse().unwrap()).collect();
                (w.caller.clone(), numbers)
            })
            .collect();
        (reports, workers)
    })
    .await
    .unwrap();
    let now = SystemClock.now();
    let sum = |i: usize| -> u64 { reports.iter().map(|(_, n)| n[i]).sum() };
    let (granted, pairs, tpm_cost, store_errors, adjust_retries) =
        (sum(0), sum(1), sum(2), sum(3), sum(4));
    let (unknown_rpm, unknown_tpm) = (sum(5), sum(6));
    let injected = proxy.injected();
    let lost = injected.lost.load(std::sync::atomic::Ordering::Relaxed);
    let reset = injected.reset.load(std::sync::atomic::Ordering::Relaxed);
    assert!(lost + reset > 0, "{mode}: the proxy injected no fault");
    assert!(pairs > 0, "{mode}: no pair was granted");

    // The ledger: what each bucket lost is what was granted, and what the pairs'
    // adjustments left them at, except for what writes whose answer was lost may have
    // taken (counted by the children, and give-backs whose answer was lost, one cost each
    // at most): never more granted than taken.
    let faults = lost + reset;
    let within = |row: &sluice::bucket::BucketState, used: u64, unknown: u64, supplied: Tokens| {
        let taken = supplied - row.tokens;
        let most_cost = 5;
        taken >= Tokens::from(used) && taken <= Tokens::from(used + unknown + faults * most_cost)
    };
    let rpm_row = sluice.bucket(&rpm).await.unwrap().unwrap();
    let rpm_supplied = supply(&rpm_baseline, RPM.2, rpm_row.last_refill_at);
    assert!(
        within(&rpm_row, granted, unknown_rpm, rpm_supplied),
        "{mode}: rpm: {} taken for {granted} grants ({unknown_rpm} unsure)",
        rpm_supplied - rpm_row.tokens
    );
    assert!(
        Tokens::from(granted) <= supply(&rpm_baseline, RPM.2, now),
        "{mode}: over-grant"
    );
    let tpm_row = sluice.bucket(&tpm).await.unwrap().unwrap();
    let tpm_supplied = supply(&tpm_baseline, TPM.2, tpm_row.last_refill_at);
    assert!(
        within(&tpm_row, tpm_cost, unknown_tpm, tpm_supplied),
        "{mode}: tpm: {} taken for adjusted costs of {tpm_cost} ({unknown_tpm} unsure): an adjustment applied twice or not at all",
        tpm_supplied - tpm_row.tokens
    );
    if !lean {
        for (dimension, index) in [(&rpm, 0), (&tpm, 1)] {
            let filter = LeaseFilter {
                dimension: Some(dimension.parse().unwrap()),
                expired_before: None,
            };
            let leases = sluice.leases(&filter).await.unwrap();
            for (caller, numbers) in &reports {
                let counted = leases.iter().filter(|l| &l.caller == caller).count() as u64;
                assert_eq!(
                    counted, numbers[index],
                    "{mode} {caller} {dimension}: leases"
                );
            }
        }
    }

    for w in &mut workers {
        w.say("release");
    }
    let mut failed_releases = 0;
    for w in &mut workers {
        failed_releases += w.expect_line("released").parse::<u64>().unwrap();
        assert!(w.finish(), "{} failed", w.caller);
    }
    for dimension in [&rpm, &tpm, &concurrent] {
        let filter = LeaseFilter {
            dimension: Some(dimension.parse().unwrap()),
            expired_before: None,
        };
        let left = sluice.leases(&filter).await.unwrap();
        assert!(
            left.is_empty(),
            "{mode}: {dimension} leases left: {left:#?}"
        );
    }
    // Slots a lost answer left short (taken, or given back, without telling) are healed
    // once the bucket is quiet; none is ever invented.
    let slots = sluice.bucket(&concurrent).await.unwrap().unwrap().tokens;
    assert!(
        slots <= Tokens::from(SLOTS),
        "{mode}: concurrent slots invented"
    );
    if slots < Tokens::from(SLOTS) {
        let report = sluice.reconcile().await.unwrap();
        eprintln!("{mode}: {} slots healed", report.tokens_healed);
    }
    assert_eq!(
        sluice.bucket(&concurrent).await.unwrap().unwrap().tokens,
        Tokens::from(SLOTS),
        "{mode}: concurrent slots lost"
    );
    eprintln!(
        "{mode}: {} rpm and {} tpm writes",
        rpm_row.version - rpm_baseline.version,
        tpm_row.version - tpm_baseline.version
    );
    eprintln!(
        "{mode}: {PROCESSES} processes x {TASKS} tasks through the proxy ({lost} answers lost, {reset} connections reset, {} delayed): {granted} grants ({pairs} pairs, tpm adjusted to {tpm_cost}), {store_errors} acquires failed with a store error, {unknown_rpm} rpm and {unknown_tpm} tpm tokens unsure, {adjust_retries} adjustments retried, {failed_releases} releases retried in the background",
        injected.delayed.load(std::sync::atomic::Ordering::Relaxed)
    );
    Some(())
}
