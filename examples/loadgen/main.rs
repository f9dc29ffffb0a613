//! Load generator: sluice on DynamoDB against the physical floor, every mode in one run.
//!
//! Throughput: for each shape `PxT` (P processes of T tasks) it measures the floor (a bare
//! conditional `UpdateItem` on one item, from the same processes and tasks), the same with a
//! lean grant's request shape (four attributes set, a condition on the version and the write
//! id, `ALL_OLD` on failure: what the SDK and server spend on the request itself), and then
//! sluice
//! in each mode (the seed protocol; the fast path with its leases in lease rows, as before
//! sluice kept them in the bucket row, and as it is; the fast path on a lean bucket, and the
//! same prefetching 32 tokens per write for up to 100 ms; and OpenAI's everyday pair, every
//! acquire taking 1 from `rpm` and 50-500 from `tpm`, on the seed protocol and on the fast
//! path): every task acquires on ample buckets and releases, as fast as it can. It reports
//! grants per second, acquire p50/p99, DynamoDB calls and capacity units per grant (from
//! `ReturnConsumedCapacity`; write units as real DynamoDB bills them, two per
//! transactional item where DynamoDB Local reports one), client CPU per grant, and each p50
//! and CPU per grant over the floor's. The time of each row is split into rounds, and every round runs each row once
//! in turn, so drift on a shared machine (a JIT warming up, a neighbour's load) falls on
//! every row alike instead of on whichever ran during it.
//!
//! At the limit: a bucket of capacity 100 refilling 10 per second, far more demand than
//! supply; it reports the grants against `capacity + refill_rate * elapsed` and checks the
//! bucket row's ledger (grants + tokens left = supply, so nothing was over-granted). The
//! two-dimension modes run with `tpm` the bottleneck (capacity 5,000 refilling 5,000 per
//! second, `rpm` ample): the `tpm` tokens granted against its supply, and its ledger.
//! Tokens granted by acquires still in flight at the deadline (the seed protocol's backoff
//! can hold one for most of a second) count in the ledger, not against the run's supply.
//!
//! ```text
//! ./scripts/loadgen.sh                        # starts DynamoDB Local, runs everything
//! ./scripts/loadgen.sh --shapes 4x8 --seconds 10
//! ```
//!
//! Against an existing endpoint and table: `cargo run --release -p sluice-examples
//! --features dynamodb --example loadgen -- --endpoint URL --table NAME`.
#![allow(clippy::print_stdout, clippy::print_stderr)]
// Floating point is used for reporting only, never for accounting.
#![allow(clippy::float_arithmetic)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use clap::Parser;
use sluice::{
    Acquire, Bucket, Clock as _, Config, DynamoStore, Error, Prefetch, Protocol, RefillRate,
    Sluice, SystemClock, Tokens, UnixMillis,
};

#[derive(Debug, Parser)]
#[command(about = "Measures sluice on DynamoDB against a bare conditional UpdateItem")]
struct Args {
    /// DynamoDB endpoint (e.g. DynamoDB Local); AWS's default when absent.
    #[arg(long, env = "SLUICE_ENDPOINT_URL")]
    endpoint: Option<String>,
    /// Table to use (created when missing).
    #[arg(long, default_value = "sluice-loadgen")]
    table: String,
    /// Shapes to run, `PROCESSESxTASKS`, comma-separated.
    #[arg(long, default_value = "1x1,1x16,4x8", value_delimiter = ',')]
    shapes: Vec<String>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Rounds each measurement is split into, the rows taking turns.
    #[arg(long, default_value_t = 5)]
    rounds: u64,
    /// Seconds of unmeasured load first, so DynamoDB Local's JIT is warm.
    #[arg(long, default_value_t = 5)]
    warmup: u64,
    /// Internal: run as a worker process.
    #[arg(long, hide = true)]
    child: Option<String>,
    /// Internal: the worker's tasks.
    #[arg(long, hide = true, default_value_t = 1)]
    tasks: usize,
    /// Internal: the dimension the workers use.
    #[arg(long, hide = true, default_value = "loadgen#rpm")]
    dimension: String,
    /// Internal: the second dimension of the two-dimension modes.
    #[arg(long, hide = true, default_value = "loadgen#tpm")]
    tokens_dimension: String,
    /// Internal: when the workers start (unix milliseconds).
    #[arg(long, hide = true, default_value_t = 0)]
    start_ms: i64,
    /// Seconds per run at the limit.
    #[arg(long, default_value_t = 10)]
    limit_seconds: u64,
    /// Shapes to run at the limit.
    #[arg(long, default_value = "1x16,4x8", value_delimiter = ',')]
    limit_shapes: Vec<String>,
}

/// What one worker process measured.
#[derive(Debug, Default, Clone)]
struct Report {
    grants: u64,
    /// Tokens granted on the dimension that counts (`tpm` in the two-dimension modes), by
    /// acquires that ended before the deadline.
    tokens: u64,
    /// The same, by acquires in flight at the deadline that ended after it.
    late_tokens: u64,
    /// Write units of transactions, as DynamoDB Local reports them (one per item).
    transaction_milliunits: u64,
    denials: u64,
    errors: u64,
    calls: u64,
    read_milliunits: u64,
    write_milliunits: u64,
    cpu_ns: u64,
    latencies_us: Vec<u64>,
}

impl Report {
    fn line(&self) -> String {
        let lat: Vec<String> = self.latencies_us.iter().map(u64::to_string).collect();
        format!(
            "report {} {} {} {} {} {} {} {} {} {} {}",
            self.grants,
            self.tokens,
            self.late_tokens,
            self.transaction_milliunits,
            self.denials,
            self.errors,
            self.calls,
            self.read_milliunits,
            self.write_milliunits,
            self.cpu_ns,
            lat.join(",")
        )
    }

    fn parse(line: &str) -> Option<Report> {
        let mut f = line.strip_prefix("report ")?.split(' ');
        let mut num = || f.next()?.parse::<u64>().ok();
        let mut r = Report {
            grants: num()?,
            tokens: num()?,
            late_tokens: num()?,
            transaction_milliunits: num()?,
            denials: num()?,
            errors: num()?,
            calls: num()?,
            read_milliunits: num()?,
            write_milliunits: num()?,
            cpu_ns: num()?,
            latencies_us: Vec::new(),
        };
        r.latencies_us = f
            .next()
            .unwrap_or("")
            .split(',')
            .filter_map(|v| v.parse().ok())
            .collect();
        Some(r)
    }

    fn merge(&mut self, other: Report) {
        self.grants += other.grants;
        self.tokens += other.tokens;
        self.late_tokens += other.late_tokens;
        self.transaction_milliunits += other.transaction_milliunits;
        self.denials += other.denials;
        self.errors += other.errors;
        self.calls += other.calls;
        self.read_milliunits += other.read_milliunits;
        self.write_milliunits += other.write_milliunits;
        self.cpu_ns += other.cpu_ns;
        self.latencies_us.extend(other.latencies_us);
    }

    /// Write units as real DynamoDB bills them: two per transactional item.
    fn billed_write_milliunits(&self) -> u64 {
        self.write_milliunits + self.transaction_milliunits
    }

    fn percentile(&self, p: usize) -> Duration {
        let mut l = self.latencies_us.clone();
        l.sort_unstable();
        l.get((l.len().saturating_sub(1)) * p / 100)
            .map_or(Duration::ZERO, |us| Duration::from_micros(*us))
    }
}

/// This process's CPU time so far: the sum over its threads of the nanoseconds each has
/// run (`/proc/self/task/*/schedstat`), finer than the 10 ms ticks of `/proc/self/stat`.
fn cpu_time() -> Duration {
    let tasks = std::fs::read_dir("/proc/self/task").expect("read /proc/self/task");
    let nanos: u64 = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

async fn store(args: &Args) -> DynamoStore {
    let config = Config {
        table_name: Some(args.table.clone()),
        endpoint_url: args.endpoint.clone(),
        ..Config::default()
    };
    DynamoStore::from_config(&config)
        .await
        .expect("DynamoDB configuration")
}

const FLOOR_KEY: &str = "loadgen#floor";
/// The write id the grant-shaped write sets, and its condition expects.
const SHAPED_WRITE_ID: &str = "0123456789abcdef";
const AMPLE: &str = "loadgen#rpm";
const AMPLE_TPM: &str = "loadgen#tpm";
const AMPLE_LEAN: &str = "loadgen#lean";
/// The ample buckets again, each keeping a tenth of its capacity for `interactive`: the
/// `-res` modes take from them as `batch`, so every grant checks a reserve.
const AMPLE_RESERVED: &str = "loadgen#rpm-res";
const AMPLE_TPM_RESERVED: &str = "loadgen#tpm-res";
const LIMIT_CAPACITY: u64 = 100;
const LIMIT_PER_SECOND: u64 = 10;
/// `tpm` at the limit in the two-dimension modes.
const LIMIT_TPM: u64 = 5_000;
/// The `tpm` cost of a two-dimension acquire is drawn from this range.
const TPM_COSTS: std::ops::RangeInclusive<u64> = 50..=500;

/// The modes measured.
const MODES: [(&str, &str); 8] = [
    ("seed protocol", "seed"),
    ("fast path", "fast"),
    ("fast path, `batch` under a reserve", "fast-res"),
    ("lean mode", "lean"),
    ("lean + prefetch", "prefetch"),
    ("seed protocol, rpm + tpm", "seed2"),
    ("fast path, rpm + tpm", "fast2"),
    ("fast path, rpm + tpm, `batch` under reserves", "fast2-res"),
];

/// Whether `mode` takes `rpm` and `tpm` in each acquire.
fn two_dimensions(mode: &str) -> bool {
    mode.contains('2')
}

/// Whether `mode` acquires as `batch` from buckets keeping a reserve for `interactive`.
fn reserved(mode: &str) -> bool {
    mode.ends_with("-res")
}

/// `bucket` keeping a tenth of its capacity for `interactive`.
fn with_reserve(bucket: Bucket) -> Bucket {
    let tenth = Tokens::from_nanos(bucket.capacity().as_nanos() / 10);
    bucket.with_reserve("interactive".parse().expect("priority"), tenth)
}

/// A small per-task random sequence (xorshift), for the `tpm` costs.
struct Costs(u64);

impl Costs {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        TPM_COSTS.start() + self.0 % (TPM_COSTS.end() - TPM_COSTS.start() + 1)
    }
}

/// What the `prefetch` mode takes ahead per write, and for how long.
const PREFETCH_TOKENS: i64 = 32;
const PREFETCH_HOLD: Duration = Duration::from_millis(100);

async fn child(args: Args, kind: String) {
    let store = store(&args).await;
    let mut builder = sluice::SluiceBuilder::from_config(Config {
        caller: "loadgen".to_owned(),
        protocol: if kind.starts_with("seed") {
            Protocol::Seed
        } else {
            Protocol::Fast
        },
        priority: reserved(&kind).then(|| "batch".parse().expect("priority")),
        ..Config::default()
    })
    .store(store.clone());
    if kind == "prefetch" {
        builder = builder.prefetch(
            args.dimension.parse().expect("dimension"),
            Prefetch::new(PREFETCH_TOKENS, PREFETCH_HOLD),
        );
    }
    let sluice = builder.build().unwrap();
    // Everyone starts together, after every process is up.
    let start = UnixMillis::new(args.start_ms);
    let now = SystemClock.now();
    if start > now {
        tokio::time::sleep(start.saturating_since(now)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let cpu_start = cpu_time();
    let mut tasks = Vec::new();
    for _ in 0..args.tasks {
        let sluice = sluice.clone();
        let client = store.client().clone();
        let table = args.table.clone();
        let dimension = args.dimension.clone();
        let tokens_dimension = args.tokens_dimension.clone();
        let kind = kind.clone();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        let mut costs =
            Costs((seed ^ (tasks.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1);
        tasks.push(tokio::spawn(async move {
            let mut r = Report::default();
            while Instant::now() < deadline {
                let started = Instant::now();
                if kind == "floor" || kind == "shaped" {
                    let request = client
                        .update_item()
                        .table_name(&table)
                        .key("vendor_dimension", AttributeValue::S(FLOOR_KEY.to_owned()))
                        .return_consumed_capacity(ReturnConsumedCapacity::Total);
                    let request = if kind == "floor" {
                        request
                            .update_expression("ADD #n :one")
                            .condition_expression("attribute_exists(vendor_dimension)")
                            .expression_attribute_names("#n", "n")
                            .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
                    } else {
                        // The same shape as a lean grant's write: four attributes set, a
                        // condition on a number and a string (the version and the write id),
                        // the old row asked for on failure.
                        let n = |v: &str| AttributeValue::N(v.to_owned());
                        let id = AttributeValue::S(SHAPED_WRITE_ID.to_owned());
                        request
                            .update_expression("SET #t = :t, #l = :l, #n = #n + :one, #w = :w")
                            .condition_expression("#n >= :zero AND #w = :w")
                            .expression_attribute_names("#t", "t")
                            .expression_attribute_names("#l", "l")
                            .expression_attribute_names("#n", "n")
                            .expression_attribute_names("#w", "w")
                            .expression_attribute_values(":t", n("999999999.123456789"))
                            .expression_attribute_values(":l", n("1800000000.123"))
                            .expression_attribute_values(":one", n("1"))
                            .expression_attribute_values(":zero", n("0"))
                            .expression_attribute_values(":w", id)
                            .return_values_on_condition_check_failure(
                                aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
                            )
                    };
                    let out = request.send().await;
                    r.calls += 1;
                    match out {
                        Ok(out) => {
                            r.latencies_us.push(started.elapsed().as_micros() as u64);
                            r.grants += 1;
                            let units = out
                                .consumed_capacity()
                                .and_then(|c| c.capacity_units())
                                .unwrap_or(0.0);
                            r.write_milliunits += (units * 1_000.0).round() as u64;
                        }
                        Err(_) => r.errors += 1,
                    }
                    continue;
                }
                let (request, tokens) = if two_dimensions(&kind) {
                    let cost = costs.next();
                    (
                        Acquire::with_cost(dimension.as_str(), 1)
                            .and_cost(tokens_dimension.as_str(), cost),
                        cost,
                    )
                } else {
                    (Acquire::new(dimension.as_str()), 1)
                };
                match sluice.acquire(request).await {
                    Ok(lease) => {
                        r.latencies_us.push(started.elapsed().as_micros() as u64);
                        r.grants += 1;
                        if Instant::now() <= deadline {
                            r.tokens += tokens;
                        } else {
                            r.late_tokens += tokens;
                        }
                        if lease.release().await.is_err() {
                            r.errors += 1;
                        }
                    }
                    Err(Error::RetryIn(d)) => {
                        r.denials += 1;
                        tokio::time::sleep(d).await;
                    }
                    Err(e) => {
                        if r.errors == 0 {
                            eprintln!("  first error in a {kind} task: {e}");
                        }
                        r.errors += 1;
                    }
                }
            }
            r
        }));
    }
    let mut total = Report::default();
    for t in tasks {
        total.merge(t.await.unwrap());
    }
    total.cpu_ns = (cpu_time() - cpu_start).as_nanos() as u64;
    if kind != "floor" && kind != "shaped" {
        let stats = store.stats();
        total.calls = stats.calls;
        total.read_milliunits = stats.read_milliunits;
        total.write_milliunits = stats.write_milliunits;
        total.transaction_milliunits = stats.transaction_write_milliunits;
    }
    println!("{}", total.line());
}

/// Runs `processes` workers of `tasks` tasks for `seconds`; returns their merged report,
/// the measured time, and when they started.
fn run_shape(
    args: &Args,
    kind: &str,
    dimension: &str,
    tokens_dimension: &str,
    processes: usize,
    tasks: usize,
    seconds: u64,
) -> (Report, Duration, UnixMillis) {
    let exe = std::env::current_exe().unwrap();
    let start = SystemClock
        .now()
        .saturating_add(Duration::from_millis(1_500));
    let children: Vec<_> = (0..processes)
        .map(|_| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "--child",
                kind,
                "--tokens-dimension",
                tokens_dimension,
                "--tasks",
                &tasks.to_string(),
                "--seconds",
                &seconds.to_string(),
                "--start-ms",
                &start.as_millis().to_string(),
            ])
            .args(["--table", &args.table, "--dimension", dimension]);
            if let Some(e) = &args.endpoint {
                cmd.args(["--endpoint", e]);
            }
            cmd.stdout(Stdio::piped()).spawn().expect("spawn worker")
        })
        .collect();
    let mut total = Report::default();
    for mut child in children {
        let out = BufReader::new(child.stdout.take().unwrap());
        for line in out.lines() {
            if let Some(r) = Report::parse(&line.unwrap()) {
                total.merge(r);
            }
        }
        assert!(child.wait().unwrap().success(), "worker failed");
    }
    (total, Duration::from_secs(seconds), start)
}

/// A latency for the table: microseconds below a millisecond (a grant from prefetched
/// tokens makes no call), milliseconds above.
fn latency(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{} µs", d.as_micros())
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

fn per_grant(value: u64, grants: u64) -> String {
    if grants == 0 {
        return "-".to_owned();
    }
    format!("{:.2}", value as f64 / grants as f64)
}

fn shape(text: &str) -> (usize, usize) {
    text.split_once('x')
        .and_then(|(p, t)| Some((p.parse::<usize>().ok()?, t.parse::<usize>().ok()?)))
        .expect("shape PROCESSESxTASKS")
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Some(kind) = args.child.clone() {
        child(args, kind).await;
        return;
    }
    let store = store(&args).await;
    store.create_table().await.expect("create the table");
    store
        .client()
        .put_item()
        .table_name(&args.table)
        .item("vendor_dimension", AttributeValue::S(FLOOR_KEY.to_owned()))
        .item("n", AttributeValue::N("0".to_owned()))
        .item("w", AttributeValue::S(SHAPED_WRITE_ID.to_owned()))
        .send()
        .await
        .expect("floor item");
    let sluice = Sluice::builder().store(store).build().unwrap();
    let ample =
        Bucket::requests(RefillRate::per_second(1_000_000_000)).with_capacity(1_000_000_000);
    sluice
        .put_bucket(AMPLE, ample.clone())
        .await
        .expect("bucket");
    sluice
        .put_bucket(AMPLE_TPM, ample.clone())
        .await
        .expect("tpm bucket");
    sluice
        .put_bucket(AMPLE_LEAN, ample.clone().lean())
        .await
        .expect("lean bucket");
    for dimension in [AMPLE_RESERVED, AMPLE_TPM_RESERVED] {
        sluice
            .put_bucket(dimension, with_reserve(ample.clone()))
            .await
            .expect("reserved bucket");
    }
    let dimension_of = |mode: &str| {
        if mode == "lean" || mode == "prefetch" {
            AMPLE_LEAN
        } else if reserved(mode) {
            AMPLE_RESERVED
        } else {
            AMPLE
        }
    };
    let tokens_dimension_of = |mode: &str| {
        if reserved(mode) {
            AMPLE_TPM_RESERVED
        } else {
            AMPLE_TPM
        }
    };

    if args.warmup > 0 {
        eprintln!("warming up for {} s", args.warmup);
        run_shape(&args, "floor", AMPLE, AMPLE_TPM, 1, 4, args.warmup);
        run_shape(&args, "fast", AMPLE, AMPLE_TPM, 1, 4, args.warmup);
    }
    println!(
        "| mode | processes x tasks | grants/s | acquire p50 | acquire p99 | calls/grant | write units/grant | read units/grant | client CPU/grant | p50 / floor p50 | CPU / floor CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for text in args.shapes.iter().filter(|s| !s.is_empty()) {
        let (p, t) = shape(text);
        let kinds = [
            ("UpdateItem floor", "floor"),
            ("UpdateItem, a grant's shape", "shaped"),
        ]
        .into_iter()
        .chain(MODES);
        let mut rows: Vec<(&str, Report, Duration)> = kinds
            .map(|(name, _)| (name, Report::default(), Duration::ZERO))
            .collect();
        let rounds = args.rounds.clamp(1, args.seconds.max(1));
        for round in 0..rounds {
            // Whole seconds per run, the remainder spread over the first rounds.
            let seconds = args.seconds / rounds + u64::from(round < args.seconds % rounds);
            let kinds = ["floor", "shaped"].into_iter().chain(MODES.map(|(_, m)| m));
            for ((_, total, time), kind) in rows.iter_mut().zip(kinds) {
                let dimension = dimension_of(kind);
                let tokens = tokens_dimension_of(kind);
                let (r, t_run, _) = run_shape(&args, kind, dimension, tokens, p, t, seconds);
                total.merge(r);
                *time += t_run;
            }
        }
        let floor = &rows[0].1;
        let floor_p50 = floor.percentile(50).as_secs_f64().max(1e-9);
        let floor_cpu = floor.cpu_ns as f64 / floor.grants.max(1) as f64;
        for (mode, r, time) in &rows {
            let cpu = r.cpu_ns as f64 / r.grants.max(1) as f64;
            println!(
                "| {mode} | {p}x{t} | {:.0} | {} | {} | {} | {} | {} | {} µs | {:.2} | {:.2} |",
                r.grants as f64 / time.as_secs_f64(),
                latency(r.percentile(50)),
                latency(r.percentile(99)),
                per_grant(r.calls, r.grants),
                per_grant(r.billed_write_milliunits(), r.grants * 1_000),
                per_grant(r.read_milliunits, r.grants * 1_000),
                per_grant(r.cpu_ns / 1_000, r.grants),
                r.percentile(50).as_secs_f64() / floor_p50,
                cpu / floor_cpu.max(1.0),
            );
            if r.errors > 0 {
                eprintln!("  {mode} {p}x{t}: {} errors", r.errors);
            }
        }
    }

    println!();
    println!(
        "At the limit: capacity {LIMIT_CAPACITY}, refill {LIMIT_PER_SECOND}/s, {} s",
        args.limit_seconds
    );
    println!();
    println!(
        "| mode | processes x tasks | grants | tokens granted by the deadline | supply (capacity + refill x run) | granted / supply | calls/grant | errors | ledger (every grant, late ones too) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for text in args.limit_shapes.iter().filter(|s| !s.is_empty()) {
        let (p, t) = shape(text);
        for (name, mode) in MODES {
            let suffix = rand_suffix();
            let dimension = format!("limit{suffix}#{mode}");
            let tokens_dimension = format!("limit{suffix}#{mode}-tpm");
            // The bucket at the limit, and what it holds and refills.
            let (capacity, per_second) = if two_dimensions(mode) {
                sluice
                    .put_bucket(&dimension, ample.clone())
                    .await
                    .expect("bucket");
                (LIMIT_TPM, LIMIT_TPM)
            } else {
                (LIMIT_CAPACITY, LIMIT_PER_SECOND)
            };
            let bucket = if two_dimensions(mode) {
                Bucket::tokens(RefillRate::per_second(per_second))
            } else {
                Bucket::requests(RefillRate::per_second(per_second))
            }
            .with_capacity(capacity);
            let bucket = if mode == "lean" || mode == "prefetch" {
                bucket.lean()
            } else if reserved(mode) {
                with_reserve(bucket)
            } else {
                bucket
            };
            let limited = if two_dimensions(mode) {
                &tokens_dimension
            } else {
                &dimension
            };
            sluice.put_bucket(limited, bucket).await.expect("bucket");
            let (r, time, start) = run_shape(
                &args,
                mode,
                &dimension,
                &tokens_dimension,
                p,
                t,
                args.limit_seconds,
            );
            let supply = capacity as f64 + per_second as f64 * time.as_secs_f64();
            // The row's own ledger: everything granted plus what is left is exactly what
            // was there plus what refilled since the first grant.
            let row = sluice.bucket(limited).await.unwrap().unwrap();
            let now = sluice.now();
            let left = row.available(now);
            let refilled_ms = i128::from(now.as_millis() - start.as_millis());
            let most = Tokens::new(capacity as i64)
                + Tokens::from_nanos(refilled_ms * i128::from(per_second) * 1_000_000_000 / 1_000);
            let ledger = if Tokens::from(r.tokens + r.late_tokens) + left <= most {
                "no over-grant"
            } else {
                "OVER-GRANT"
            };
            println!(
                "| {name} | {p}x{t} | {} | {} | {supply:.0} | {:.1}% | {} | {} | {ledger} |",
                r.grants,
                r.tokens,
                r.tokens as f64 * 100.0 / supply,
                per_grant(r.calls, r.grants),
                r.errors,
            );
            if r.errors > 0 {
                eprintln!("  {name} {p}x{t} at the limit: {} errors", r.errors);
            }
        }
    }
}

fn rand_suffix() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    )
}
