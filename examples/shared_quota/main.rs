//! Shared-quota demo: N processes with skewed load call one simulated vendor key, three
//! ways: with no limiter, with a static split (an in-process limiter holding quota / N in
//! each process), and with sluice on DynamoDB. It prints a table (share of the vendor's
//! supply used, share of requests answered 429, grants per process) and writes an SVG chart
//! of what the vendor accepted and refused each second, against its limit.
//!
//! Each run is one timeline: light traffic first (every response carries the vendor's
//! rate-limit headers), then heavy skewed load (process `i` runs `i` tasks calling back to
//! back), a silence in which every bucket refills, and heavy load again. It runs twice:
//! with the vendor enforcing its per-minute limits per second (as OpenAI may: 600 a minute
//! as 10 a second) and per minute, sluice configured per minute both times.
//!
//! ```text
//! ./scripts/demo-quota.sh          # starts DynamoDB Local, runs, writes docs/shared-quota.*
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)]
// Floating point is used for reporting only, never for accounting.
#![allow(clippy::float_arithmetic)]

mod report;
mod worker;

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use sluice::{Bucket, Config, DynamoStore, RefillRate, Sluice};
use sluice_vendor_sim::{Shape, VendorConfig, VendorSim};

/// How long after a heavy phase's end an admission still counts for it: a call sent
/// before the end reaches the vendor this much later at most.
const ADMISSION_SLACK_MS: u64 = 100;

/// The vendor's host as the clients call it (resolved to the simulator on loopback).
pub(crate) const VENDOR_HOST: &str = "api.openai.com";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// Every process calls as fast as its load asks, honouring only 429s.
    None,
    /// A static split: each process limits itself to quota / N in memory.
    Split,
    /// sluice on DynamoDB: one shared quota.
    Sluice,
}

#[derive(Debug, Parser)]
#[command(about = "N processes sharing one vendor quota: no limiter, a static split, sluice")]
struct Args {
    /// DynamoDB endpoint for the sluice mode (e.g. DynamoDB Local).
    #[arg(long, env = "SLUICE_ENDPOINT_URL")]
    endpoint: Option<String>,
    /// DynamoDB table for the sluice mode (created when missing).
    #[arg(long, default_value = "sluice-demo")]
    table: String,
    /// Processes sharing the key.
    #[arg(long, default_value_t = 8)]
    processes: u64,
    /// Seconds per run.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The vendor's requests per minute.
    #[arg(long, default_value_t = 600)]
    rpm: u64,
    /// The vendor's tokens per minute.
    #[arg(long, default_value_t = 150_000)]
    tpm: u64,
    /// Modes to run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "none,split,sluice"
    )]
    modes: Vec<Mode>,
    /// Where to write the SVG chart.
    #[arg(long, default_value = "docs/shared-quota.svg")]
    chart: String,
    /// Where to write the table (Markdown).
    #[arg(long, default_value = "docs/shared-quota.md")]
    table_out: String,
    /// Debug logs of every worker to stderr (the limiter's decisions).
    #[arg(long)]
    log: bool,
    /// Internal: run as worker process INDEX (1-based).
    #[arg(long, hide = true)]
    worker: Option<u64>,
    #[arg(long, hide = true, value_enum, default_value = "none")]
    mode: Mode,
    #[arg(long, hide = true, default_value_t = 0)]
    vendor_port: u16,
    #[arg(long, hide = true, default_value_t = 0)]
    start_ms: u64,
}

/// Everything a worker needs, passed on its command line.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) mode: Mode,
    pub(crate) processes: u64,
    pub(crate) rpm: u64,
    pub(crate) tpm: u64,
    pub(crate) vendor_port: u16,
    pub(crate) table: String,
    pub(crate) endpoint: Option<String>,
    pub(crate) start_ms: u64,
    pub(crate) seconds: u64,
    pub(crate) log: bool,
}

/// The run's timeline, in unix milliseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Phases {
    /// The two heavy phases, `[from, until)`.
    pub(crate) heavy: [(u64, u64); 2],
}

impl Plan {
    /// Light traffic for the first twelfth, heavy until half-time, silence for a quarter,
    /// heavy again to the end.
    pub(crate) fn phases(&self) -> Phases {
        let at = |num: u64, den: u64| self.start_ms + self.seconds * 1_000 * num / den;
        Phases {
            heavy: [(at(1, 12), at(1, 2)), (at(3, 4), at(1, 1))],
        }
    }

    fn args(&self, index: u64) -> Vec<String> {
        let mut args = vec![
            format!("--worker={index}"),
            format!(
                "--mode={}",
                self.mode
                    .to_possible_value()
                    .map_or_else(String::new, |v| v.get_name().to_owned())
            ),
            format!("--processes={}", self.processes),
            format!("--rpm={}", self.rpm),
            format!("--tpm={}", self.tpm),
            format!("--vendor-port={}", self.vendor_port),
            format!("--table={}", self.table),
            format!("--start-ms={}", self.start_ms),
            format!("--seconds={}", self.seconds),
        ];
        if let Some(endpoint) = &self.endpoint {
            args.push(format!("--endpoint={endpoint}"));
        }
        if self.log {
            args.push("--log".to_owned());
        }
        args
    }
}

/// What one run of one mode gave.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) shape: Shape,
    pub(crate) mode: Mode,
    /// Requests the vendor could have accepted in the heavy phases.
    pub(crate) supply: u64,
    /// Requests it accepted in them (and in the second after each, still in flight).
    pub(crate) used: u64,
    pub(crate) accepted: u64,
    pub(crate) rejected: u64,
    /// Successful calls per process.
    pub(crate) per_process: Vec<u64>,
    /// Accepted and refused per second.
    pub(crate) seconds: Vec<(u64, u64)>,
    /// The vendor's sustained rate, per second.
    pub(crate) limit_per_second: f64,
    /// When requests were refused (ms since the start) and by which limit.
    pub(crate) refused: Vec<(u64, &'static str)>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let plan = |mode, vendor_port, start_ms| Plan {
        mode,
        processes: args.processes.max(1),
        rpm: args.rpm,
        tpm: args.tpm,
        vendor_port,
        table: args.table.clone(),
        endpoint: args.endpoint.clone(),
        start_ms,
        seconds: args.seconds,
        log: args.log,
    };
    if let Some(index) = args.worker {
        if args.log {
            log_to_stderr();
        }
        worker::run(plan(args.mode, args.vendor_port, args.start_ms), index).await;
        return;
    }
    let vendor = VendorSim::start(VendorConfig::default()).await;
    let mut runs = Vec::new();
    for shape in [Shape::PerSecond, Shape::PerMinute] {
        for &mode in &args.modes {
            let run = run(&vendor, shape, plan(mode, vendor.addr().port(), 0)).await;
            eprintln!("{}", report::row(&run));
            if !run.refused.is_empty() && run.refused.len() <= 10 {
                eprintln!("  429s (ms since the start, limit): {:?}", run.refused);
            }
            runs.push(run);
        }
    }
    let table = report::table(&runs, &args_line(&args));
    println!("{table}");
    write(&args.table_out, &table);
    if let Err(error) = report::chart(&runs, &args.chart) {
        eprintln!("could not draw {}: {error}", args.chart);
        std::process::exit(1);
    }
    eprintln!("wrote {} and {}", args.table_out, args.chart);
}

/// The limiter's debug logs and every DynamoDB call's duration (its span closing), to
/// stderr; the rest at warnings.
fn log_to_stderr() {
    use tracing_subscriber::fmt::format::FmtSpan;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let targets = tracing_subscriber::filter::Targets::new()
        .with_target("sluice", tracing::Level::DEBUG)
        .with_target("sluice_reqwest", tracing::Level::DEBUG)
        .with_target("aws_sdk_dynamodb", tracing::Level::DEBUG)
        .with_default(tracing::Level::WARN);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_span_events(FmtSpan::CLOSE),
        )
        .with(targets)
        .init();
}

fn args_line(args: &Args) -> String {
    format!(
        "{} processes (process i offers 2^(i-1) / (2^N - 1) of 8 x the vendor's rate, with i tasks), {} s per run, vendor {} requests and {} tokens a minute",
        args.processes, args.seconds, args.rpm, args.tpm
    )
}

fn write(path: &str, text: &str) {
    if let Some(dir) = std::path::Path::new(path).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(error) = std::fs::write(path, text) {
        eprintln!("could not write {path}: {error}");
        std::process::exit(1);
    }
}

/// Fresh, full buckets for the sluice mode: the vendor's limits, per minute.
async fn fresh_buckets(plan: &Plan) {
    let config = Config {
        table_name: Some(plan.table.clone()),
        endpoint_url: plan.endpoint.clone(),
        ..Config::default()
    };
    let store = DynamoStore::from_config(&config)
        .await
        .expect("DynamoDB configuration");
    store.create_table().await.expect("the demo's table");
    let sluice = Sluice::builder()
        .store(store)
        .build()
        .expect("a sluice client");
    for (dimension, bucket) in [
        (
            "openai#rpm",
            Bucket::requests(RefillRate::per_minute(plan.rpm)),
        ),
        (
            "openai#tpm",
            Bucket::tokens(RefillRate::per_minute(plan.tpm)),
        ),
    ] {
        // The previous run's last writes may still hold the rows' throughput (behind
        // dynamodb-fidelity): a throttled call is asked again, for up to half a minute.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let done = async {
                sluice.delete_bucket(dimension).await?;
                sluice.put_bucket(dimension, bucket.clone()).await
            };
            match done.await {
                Ok(_) => break,
                Err(sluice::Error::Store(e)) if e.is_transient() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!("could not write the demo's fresh bucket {dimension}: {e}"),
            }
        }
    }
}

/// One run: the vendor reset at the start, the workers on the timeline, the vendor's
/// levels read at the start of each heavy phase.
async fn run(vendor: &VendorSim, shape: Shape, mut plan: Plan) -> Run {
    if plan.mode == Mode::Sluice {
        fresh_buckets(&plan).await;
    }
    plan.start_ms = now_ms() + 3_000;
    let exe = std::env::current_exe().expect("this program's path");
    let mut children: Vec<Child> = (1..=plan.processes)
        .map(|i| {
            Command::new(&exe)
                .args(plan.args(i))
                .stdout(Stdio::piped())
                .spawn()
                .expect("a worker process")
        })
        .collect();
    sleep_until(plan.start_ms).await;
    vendor.reset(VendorConfig {
        rpm: plan.rpm,
        tpm: plan.tpm,
        shape,
        latency: Duration::from_millis(50),
        jitter: Duration::from_millis(20),
        ..VendorConfig::default()
    });
    let phases = plan.phases();
    let mut levels = Vec::new();
    for (from, _) in phases.heavy {
        sleep_until(from).await;
        levels.push(vendor.requests_left("demo-key"));
    }
    let per_process = collect(&mut children, Duration::from_secs(plan.seconds + 60));
    let stats = vendor.stats();
    let rate = plan.rpm as f64 / 60.0;
    let mut supply = 0.0;
    let mut used = 0;
    for ((from, until), level) in phases.heavy.iter().zip(&levels) {
        supply += *level as f64 + rate * (until - from) as f64 / 1_000.0;
        // Admitted from the phase's start to just after its end: calls sent before the
        // end reach the vendor a moment later (its latency comes after admission).
        let window = (from - plan.start_ms)..(until - plan.start_ms + ADMISSION_SLACK_MS);
        used += stats
            .admitted_ms
            .iter()
            .filter(|t| window.contains(t))
            .count() as u64;
    }
    Run {
        shape,
        mode: plan.mode,
        supply: supply.round() as u64,
        used,
        accepted: stats.accepted,
        rejected: stats.rejected,
        per_process,
        seconds: stats
            .seconds
            .iter()
            .map(|s| (s.accepted, s.rejected))
            .collect(),
        limit_per_second: rate,
        refused: stats.refused.clone(),
    }
}

/// Each worker's successful calls, in order; a worker still running after `limit` is
/// killed (by its PID) and counts 0.
fn collect(children: &mut [Child], limit: Duration) -> Vec<u64> {
    let deadline = Instant::now() + limit;
    children
        .iter_mut()
        .map(|child| {
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    eprintln!("worker {} overran; killing it", child.id());
                    let _ = child.kill();
                    let _ = child.wait();
                    return 0;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let Some(out) = child.stdout.take() else {
                return 0;
            };
            BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
                .find_map(|v| v.get("ok")?.as_u64())
                .unwrap_or(0)
        })
        .collect()
}

/// Now, in unix milliseconds: the timeline every process shares.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Sleeps until `at_ms` (unix milliseconds); at once if it has passed.
pub(crate) async fn sleep_until(at_ms: u64) {
    let now = now_ms();
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
}
