//! Load generator: sluice on DynamoDB against the physical floor, in one run.
//!
//! For each shape `PxT` (P processes of T tasks), it first measures the floor — a bare
//! conditional `UpdateItem` on one item, from the same number of processes and tasks — and
//! then sluice: every task acquires a grant on one ample bucket and releases it, as fast as
//! it can. It reports grants per second, acquire p50/p99, DynamoDB calls and capacity units
//! per grant (from `ReturnConsumedCapacity`), client CPU per grant, and the ratio of the
//! acquire p50 to the floor's p50.
//!
//! ```text
//! ./scripts/loadgen.sh                        # starts DynamoDB Local, runs the default shapes
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
use sluice::{Bucket, Config, DynamoStore, Error, RefillRate, Sluice};

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
}

/// What one worker process measured.
#[derive(Debug, Default, Clone)]
struct Report {
    grants: u64,
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
            "report {} {} {} {} {} {} {} {}",
            self.grants,
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
        self.denials += other.denials;
        self.errors += other.errors;
        self.calls += other.calls;
        self.read_milliunits += other.read_milliunits;
        self.write_milliunits += other.write_milliunits;
        self.cpu_ns += other.cpu_ns;
        self.latencies_us.extend(other.latencies_us);
    }

    fn percentile(&self, p: usize) -> Duration {
        let mut l = self.latencies_us.clone();
        l.sort_unstable();
        l.get((l.len().saturating_sub(1)) * p / 100)
            .map_or(Duration::ZERO, |us| Duration::from_micros(*us))
    }
}

/// This process's CPU time so far (user + system, all threads), from `/proc/self/stat`
/// in clock ticks of 10 ms.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are the 14th and 15th fields of the line, 12th and 13th after `)`.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
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

async fn child(args: Args, kind: String) {
    let store = store(&args).await;
    let sluice = Sluice::builder()
        .store(store.clone())
        .caller("loadgen")
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let cpu_start = cpu_time();
    let mut tasks = Vec::new();
    for _ in 0..args.tasks {
        let sluice = sluice.clone();
        let client = store.client().clone();
        let table = args.table.clone();
        let dimension = args.dimension.clone();
        let kind = kind.clone();
        tasks.push(tokio::spawn(async move {
            let mut r = Report::default();
            while Instant::now() < deadline {
                let started = Instant::now();
                if kind == "floor" {
                    let out = client
                        .update_item()
                        .table_name(&table)
                        .key("vendor_dimension", AttributeValue::S(FLOOR_KEY.to_owned()))
                        .update_expression("ADD #n :one")
                        .condition_expression("attribute_exists(vendor_dimension)")
                        .expression_attribute_names("#n", "n")
                        .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
                        .return_consumed_capacity(ReturnConsumedCapacity::Total)
                        .send()
                        .await;
                    r.calls += 1;
                    match out {
                        Ok(out) => {
                            r.latencies_us.push(started.elapsed().as_micros() as u64);
                            r.grants += 1;
                            let units = out
                                .consumed_capacity()
                                .and_then(|c| c.capacity_units())
                                .unwrap_or(0.0);
                            #[allow(clippy::float_arithmetic)]
                            let milli = (units * 1_000.0).round() as u64;
                            r.write_milliunits += milli;
                        }
                        Err(_) => r.errors += 1,
                    }
                    continue;
                }
                match sluice.acquire(dimension.as_str()).await {
                    Ok(lease) => {
                        r.latencies_us.push(started.elapsed().as_micros() as u64);
                        r.grants += 1;
                        if lease.release().await.is_err() {
                            r.errors += 1;
                        }
                    }
                    Err(Error::RetryIn(d)) => {
                        r.denials += 1;
                        tokio::time::sleep(d).await;
                    }
                    Err(_) => r.errors += 1,
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
    if kind != "floor" {
        let stats = store.stats();
        total.calls = stats.calls;
        total.read_milliunits = stats.read_milliunits;
        total.write_milliunits = stats.write_milliunits;
    }
    println!("{}", total.line());
}

fn run_shape(args: &Args, kind: &str, processes: usize, tasks: usize) -> (Report, Duration) {
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let children: Vec<_> = (0..processes)
        .map(|_| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "--child",
                kind,
                "--tasks",
                &tasks.to_string(),
                "--seconds",
                &args.seconds.to_string(),
            ])
            .args(["--table", &args.table, "--dimension", &args.dimension]);
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
    (total, started.elapsed())
}

fn per_grant(value: u64, grants: u64) -> String {
    if grants == 0 {
        return "-".to_owned();
    }
    format!("{:.2}", value as f64 / grants as f64)
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
        .send()
        .await
        .expect("floor item");
    let sluice = Sluice::builder().store(store).build().unwrap();
    sluice
        .put_bucket(
            &args.dimension,
            Bucket::requests(RefillRate::per_second(1_000_000_000)).with_capacity(1_000_000_000),
        )
        .await
        .expect("bucket");

    if args.warmup > 0 {
        eprintln!("warming up for {} s", args.warmup);
        let warm = Args {
            seconds: args.warmup,
            ..Args::parse()
        };
        run_shape(&warm, "floor", 1, 4);
        run_shape(&warm, "seed", 1, 4);
    }
    println!(
        "| mode | processes x tasks | grants/s | acquire p50 | acquire p99 | calls/grant | write units/grant | read units/grant | client CPU/grant | p50 / UpdateItem p50 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for shape in &args.shapes {
        let (p, t) = shape
            .split_once('x')
            .and_then(|(p, t)| Some((p.parse::<usize>().ok()?, t.parse::<usize>().ok()?)))
            .expect("shape PROCESSESxTASKS");
        let (floor, floor_time) = run_shape(&args, "floor", p, t);
        let (seed, seed_time) = run_shape(&args, "seed", p, t);
        for (mode, r, time) in [
            ("UpdateItem floor", &floor, floor_time),
            ("seed protocol", &seed, seed_time),
        ] {
            let ratio =
                r.percentile(50).as_secs_f64() / floor.percentile(50).as_secs_f64().max(1e-9);
            println!(
                "| {mode} | {p}x{t} | {:.0} | {:.2} ms | {:.2} ms | {} | {} | {} | {} µs | {ratio:.2} |",
                r.grants as f64 / time.as_secs_f64(),
                r.percentile(50).as_secs_f64() * 1e3,
                r.percentile(99).as_secs_f64() * 1e3,
                per_grant(r.calls, r.grants),
                per_grant(r.write_milliunits, r.grants * 1_000),
                per_grant(r.read_milliunits, r.grants * 1_000),
                per_grant(r.cpu_ns / 1_000, r.grants),
            );
            if r.errors > 0 || r.denials > 0 {
                eprintln!(
                    "  {mode} {p}x{t}: {} errors, {} denials",
                    r.errors, r.denials
                );
            }
        }
    }
}
