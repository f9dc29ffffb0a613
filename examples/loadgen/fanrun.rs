//! Running the fan-out shapes and printing their tables: each mode on plain DynamoDB Local
//! and behind `dynamodb-fidelity`, at ample demand and at the limit.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use dynamodb_fidelity::{ItemStats, Stats};
use sluice::{
    Bucket, RefillRate, Sluice, Tokens, clock::Clock as _, clock::SystemClock, clock::UnixMillis,
};

use crate::Args;
use crate::fanout::{FLOOR, FanReport, MODES, SLOTS, floor_key};
use crate::report::{latency, shape};

/// Where a run's requests go: DynamoDB Local itself, or the proxy in front of it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) label: String,
    pub(crate) endpoint: Option<String>,
    /// The proxy's endpoint and its per-item write ceiling, when behind it.
    pub(crate) fidelity: Option<(String, f64)>,
    /// How the workers start: all at once after a barrier, each told the proxy's ceiling
    /// (the benchmark's world), or one after another as they are spawned, told nothing
    /// (a fleet's).
    pub(crate) fleet: bool,
}

/// The proxy set to real DynamoDB's per-item ceilings (1,000 write and 3,000 read units a
/// second), and a fleet-start target behind it.
pub(crate) async fn real_ceilings(proxy: &str) -> Target {
    dynamodb_fidelity::set_ceilings(proxy, 1_000.0, 3_000.0)
        .await
        .expect("set the proxy's ceilings");
    Target {
        label: "behind dynamodb-fidelity, 1,000 write and 3,000 read units/s per item".to_owned(),
        endpoint: Some(proxy.to_owned()),
        fidelity: Some((proxy.to_owned(), 1_000.0)),
        fleet: true,
    }
}

/// One fan-out run: its shape and what it measured.
pub(crate) struct Run {
    pub(crate) report: FanReport,
    pub(crate) seconds: u64,
    pub(crate) started: UnixMillis,
    /// The proxy's counters over the run.
    pub(crate) stats: Option<Stats>,
    /// Each worker process's grants, in the order they were spawned.
    pub(crate) per_process: Vec<u64>,
    /// Each worker process's resident memory at its end, KiB.
    pub(crate) rss_kib: Vec<u64>,
}

/// Runs `kind` in `processes` workers of `callers` callers each holding `hold_ms`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    args: &Args,
    target: &Target,
    kind: &str,
    dims: (&str, &str),
    (processes, callers): (usize, usize),
    hold_ms: u64,
    seconds: u64,
) -> Run {
    if let Some((proxy, _)) = &target.fidelity {
        dynamodb_fidelity::reset_stats(proxy)
            .await
            .expect("reset the proxy's counters");
    }
    let exe = std::env::current_exe().expect("the load generator's path");
    let started = SystemClock.now().saturating_add(start_delay(target));
    let spawn = |_| {
        let mut cmd = Command::new(&exe);
        cmd.args(["--child", kind, "--table", &args.table])
            .args(["--dimension", dims.0, "--tokens-dimension", dims.1])
            .args([
                "--tasks",
                &callers.to_string(),
                "--seconds",
                &seconds.to_string(),
            ])
            .args(["--hold-ms", &hold_ms.to_string()]);
        // A fleet has no start barrier: each process starts when it is spawned.
        if !target.fleet {
            cmd.args(["--start-ms", &started.as_millis().to_string()]);
        }
        if let Some(e) = &target.endpoint {
            cmd.args(["--endpoint", e]);
        }
        // Behind the proxy, the benchmark's clients know its per-item ceiling; a fleet's
        // are not told.
        if let Some((_, ceiling)) = target.fidelity.as_ref().filter(|_| !target.fleet) {
            cmd.args(["--item-ceiling", &(*ceiling as u32).to_string()]);
        }
        if args.shard_pin > 0 {
            cmd.args(["--max-shards", "1"]);
        }
        if args.log {
            cmd.arg("--log");
        }
        cmd.stdout(Stdio::piped()).spawn().expect("spawn a worker")
    };
    let children: Vec<_> = (0..processes).map(spawn).collect();
    let (report, per_process, rss_kib) = tokio::task::spawn_blocking(move || {
        let mut total = FanReport::default();
        let (mut per_process, mut rss_kib) = (Vec::new(), Vec::new());
        for mut child in children {
            let out = BufReader::new(child.stdout.take().expect("stdout"));
            for line in out.lines() {
                let line = line.expect("a worker's line");
                if let Some(r) = FanReport::parse(&line) {
                    per_process.push(r.grants);
                    total.merge(r);
                } else if let Some(kib) = line.strip_prefix("rss ") {
                    rss_kib.push(kib.parse().unwrap_or(0));
                }
            }
            assert!(child.wait().expect("a worker").success(), "a worker failed");
        }
        (total, per_process, rss_kib)
    })
    .await
    .expect("workers");
    let stats = match &target.fidelity {
        Some((proxy, _)) => Some(dynamodb_fidelity::fetch_stats(proxy).await.expect("stats")),
        None => None,
    };
    Run {
        report,
        seconds,
        started,
        stats,
        per_process,
        rss_kib,
    }
}

/// The sum of the counters of `items` of `table`.
pub(crate) fn items(stats: &Stats, table: &str, keys: &[&str]) -> ItemStats {
    let mut sum = ItemStats::default();
    for key in keys {
        if let Some(s) = stats.item(table, key) {
            sum.write_units += s.write_units;
            sum.failed_conditional_writes += s.failed_conditional_writes;
            sum.throttled_writes += s.throttled_writes;
        }
    }
    sum
}

/// The sum of the counters of the rows of the buckets of `dimensions`: each one's own and,
/// once it spread itself, its shards'.
pub(crate) fn bucket_rows(stats: &Stats, table: &str, dimensions: &[&str]) -> ItemStats {
    let rows: Vec<String> = dimensions
        .iter()
        .flat_map(|d| crate::sharding::keys(d))
        .collect();
    let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
    items(stats, table, &rows)
}

pub(crate) fn ratio(value: f64, of: f64) -> String {
    if of <= 0.0 {
        "-".to_owned()
    } else {
        format!("{:.2}", value / of)
    }
}

pub(crate) fn errors(r: &FanReport) -> String {
    if r.errors.is_empty() {
        return "0".to_owned();
    }
    let kinds: Vec<String> = r.errors.iter().map(|(k, v)| format!("{v} {k}")).collect();
    kinds.join(", ")
}

/// Unmeasured load for `--warmup` seconds (none at 0): `kind` on `dims` from the fan-out
/// shape (`args.fan_shape` holding `args.fan_hold_ms`), warming the server to it. The first
/// shape of this many processes on a fresh server ran slower than the same shape later in
/// the run, whichever mode it was: a cold DynamoDB Local is a cold JVM, which no deployment
/// has. The clients measured after it still start cold.
pub(crate) async fn warm_up(
    args: &Args,
    target: &Target,
    what: &str,
    kind: &str,
    dims: (&str, &str),
) {
    if args.warmup == 0 {
        return;
    }
    eprintln!("warming up the {what} shape for {} s", args.warmup);
    let shape = shape(&args.fan_shape);
    let _ = run(
        args,
        target,
        kind,
        dims,
        shape,
        args.fan_hold_ms,
        args.warmup,
    )
    .await;
}

/// The fan-out tables for `target`: the floor and each mode at `args.fan_shape` holding
/// `args.fan_hold_ms`, then the pair at `args.llm_shape` holding `args.llm_hold_ms`.
pub(crate) async fn ample(args: &Args, target: &Target, sluice: &Sluice) {
    let suffix = crate::rand_suffix();
    let rpm = format!("fan{suffix}#rpm");
    let tpm = format!("fan{suffix}#tpm");
    let lean = format!("fan{suffix}#lean");
    let slots = format!("fan{suffix}#slots");
    let ample = Bucket::requests(RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
    let put = |d: &str, b: Bucket| {
        let (d, b) = (d.to_owned(), b);
        async move { sluice.put_bucket(&d, b).await.expect("bucket") }
    };
    put(&rpm, ample.clone()).await;
    put(
        &tpm,
        Bucket::tokens(RefillRate::per_second(1_000_000)).with_capacity(1_000_000),
    )
    .await;
    put(&lean, ample.lean()).await;
    put(&slots, Bucket::concurrent(SLOTS)).await;
    println!();
    println!("Fan-out, {}:", target.label);
    println!();
    println!(
        "| mode | processes x callers, hold | grants/s | of demand | of one item's ceiling | bucket-rows WU/grant | all-rows WU/grant | failed bucket writes/grant | throttled bucket writes/grant | acquire p50 | acquire p99 | p50 / floor p50 | errors to callers |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let (p, t) = shape(&args.fan_shape);
    warm_up(args, target, "fan-out", "fan-fast", (&rpm, &tpm)).await;
    let mut floor_p50 = None;
    for (name, kind) in std::iter::once(FLOOR).chain(MODES) {
        let dims = match kind {
            "fan-lean" => (lean.as_str(), tpm.as_str()),
            "fan-slots" => (slots.as_str(), tpm.as_str()),
            "fan-floor" => (floor_key(), tpm.as_str()),
            _ => (rpm.as_str(), tpm.as_str()),
        };
        let r = run(
            args,
            target,
            kind,
            dims,
            (p, t),
            args.fan_hold_ms,
            args.fan_seconds,
        )
        .await;
        let p50 = r.report.percentile(50);
        let floor = *floor_p50.get_or_insert(p50);
        let bucket_items: &[&str] = if kind == "fan-pair" {
            &[dims.0, dims.1]
        } else {
            &[dims.0]
        };
        row(
            name,
            target,
            &r,
            bucket_items,
            (p, t),
            args.fan_hold_ms,
            floor,
            &args.table,
        );
        if kind == "fan-slots" {
            slots_left(sluice, &slots, &r.report).await;
        }
    }
    let (p, t) = shape(&args.llm_shape);
    let r = run(
        args,
        target,
        "fan-pair",
        (&rpm, &tpm),
        (p, t),
        args.llm_hold_ms,
        args.fan_seconds,
    )
    .await;
    let floor = floor_p50.unwrap_or_default();
    row(
        "fast path, rpm + tpm",
        target,
        &r,
        &[&rpm, &tpm],
        (p, t),
        args.llm_hold_ms,
        floor,
        &args.table,
    );
}

/// One row of a fan-out table.
#[allow(clippy::too_many_arguments)]
fn row(
    name: &str,
    target: &Target,
    r: &Run,
    bucket_items: &[&str],
    (p, t): (usize, usize),
    hold_ms: u64,
    floor_p50: Duration,
    table: &str,
) {
    let rep = &r.report;
    let per_second = rep.grants as f64 / r.seconds as f64;
    let demand = (p * t) as f64 * 1_000.0 / hold_ms as f64;
    let all = (rep.grants + rep.late_tokens).max(1) as f64;
    let (ceiling, item, all_rows) = match (&r.stats, &target.fidelity) {
        (Some(stats), Some((_, ceiling))) => {
            let s = bucket_rows(stats, table, bucket_items);
            (
                ratio(per_second, *ceiling),
                [
                    format!("{:.2}", s.write_units as f64 / all),
                    format!("{:.3}", s.failed_conditional_writes as f64 / all),
                    format!("{:.2}", s.throttled_writes as f64 / all),
                ],
                format!("{:.2}", stats.totals().write_units as f64 / all),
            )
        }
        _ => (
            "-".to_owned(),
            ["-".to_owned(), "-".to_owned(), "-".to_owned()],
            format!("{:.2}", rep.write_milliunits as f64 / 1_000.0 / all),
        ),
    };
    println!(
        "| {name} | {p}x{t}, {hold_ms} ms | {per_second:.1} | {} | {ceiling} | {} | {all_rows} | {} | {} | {} | {} | {} | {} |",
        ratio(per_second, demand),
        item[0],
        item[1],
        item[2],
        latency(rep.percentile(50)),
        latency(rep.percentile(99)),
        ratio(rep.percentile(50).as_secs_f64(), floor_p50.as_secs_f64()),
        errors(rep),
    );
}

/// After the slots run: the most held at once, and what is left of the bucket.
async fn slots_left(sluice: &Sluice, slots: &str, r: &FanReport) {
    let row = sluice.bucket(slots).await.expect("read").expect("bucket");
    let filter = sluice::store::LeaseFilter {
        dimension: Some(slots.parse().expect("dimension")),
        expired_before: None,
    };
    let leases = sluice.leases(&filter).await.expect("leases").len();
    println!(
        "|  | at most {} of {SLOTS} slots held at once; after the run {} free, {leases} lease rows left |  |  |  |  |  |  |  |  |  |  |  |",
        r.most_held(),
        row.tokens,
    );
}

/// At the limit: capacity 100 refilling 10/s, each mode but `concurrent` at the fan-out
/// shape; grants against the supply, the worst window, the row's ledger.
pub(crate) async fn at_limit(args: &Args, target: &Target, sluice: &Sluice) {
    const CAPACITY: u64 = 100;
    const PER_SECOND: u64 = 10;
    println!();
    println!(
        "At the limit (capacity {CAPACITY}, refill {PER_SECOND}/s), fan-out {}, hold {} ms, {}, {} s:",
        args.fan_shape, args.fan_hold_ms, target.label, args.limit_seconds
    );
    println!();
    println!(
        "| mode | grants by the deadline | supply (capacity + refill x run) | granted / supply | worst window over capacity + rate x window | ledger | errors to callers |"
    );
    println!("|---|---|---|---|---|---|---|");
    let (p, t) = shape(&args.fan_shape);
    for (name, kind) in MODES.into_iter().filter(|(_, k)| *k != "fan-slots") {
        let suffix = crate::rand_suffix();
        let rpm = format!("limit{suffix}#rpm");
        let tpm = format!("limit{suffix}#tpm");
        let limited = Bucket::requests(RefillRate::per_second(PER_SECOND)).with_capacity(CAPACITY);
        let limited = if kind == "fan-lean" {
            limited.lean()
        } else {
            limited
        };
        sluice.put_bucket(&rpm, limited).await.expect("bucket");
        let ample = Bucket::tokens(RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
        sluice.put_bucket(&tpm, ample).await.expect("bucket");
        let r = run(
            args,
            target,
            kind,
            (&rpm, &tpm),
            (p, t),
            args.fan_hold_ms,
            args.limit_seconds,
        )
        .await;
        let rep = &r.report;
        let supply = CAPACITY as f64 + PER_SECOND as f64 * r.seconds as f64;
        let row = sluice.bucket(&rpm).await.expect("read").expect("bucket");
        let now = sluice.now();
        let refilled_ms = i128::from(now.as_millis() - r.started.as_millis());
        let most = Tokens::from(CAPACITY)
            + Tokens::from_nanos(refilled_ms * i128::from(PER_SECOND) * 1_000_000);
        let ledger = if Tokens::from(rep.tokens + rep.late_tokens) + row.available(now) <= most {
            "no over-grant"
        } else {
            "OVER-GRANT"
        };
        println!(
            "| {name} | {} | {supply:.0} | {:.1}% | {:.1} | {ledger} | {} |",
            rep.tokens,
            rep.tokens as f64 * 100.0 / supply,
            rep.worst_window(CAPACITY as f64, PER_SECOND as f64),
            errors(rep),
        );
    }
}

/// How long after a run is set up its workers start: together 1.5 s later, once every
/// process is up, or, a fleet, each as it is spawned (then the run's supply and timeline
/// count from the first spawn, the earliest any worker can acquire).
pub(crate) fn start_delay(target: &Target) -> Duration {
    if target.fleet {
        Duration::ZERO
    } else {
        Duration::from_millis(1_500)
    }
}
