//! The throughput and at-the-limit workers: each task acquires (and releases) as fast as it
//! can, on ample buckets or at the limit.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use sluice::{
    Acquire, Bucket, Config, DynamoStore, Error, Prefetch, Tokens, clock::Clock as _,
    clock::SystemClock, clock::UnixMillis, config::Protocol,
};

use crate::Args;
use crate::report::{Report, cpu_time};

pub(crate) async fn store(args: &Args) -> DynamoStore {
    let config = Config {
        table_name: Some(args.table.clone()),
        endpoint_url: args.endpoint.clone(),
        ..Config::default()
    };
    DynamoStore::from_config(&config)
        .await
        .expect("DynamoDB configuration")
}

pub(crate) const FLOOR_KEY: &str = "loadgen#floor";
/// The write id the grant-shaped write sets, and its condition expects.
pub(crate) const SHAPED_WRITE_ID: &str = "0123456789abcdef";
pub(crate) const AMPLE: &str = "loadgen#rpm";
pub(crate) const AMPLE_TPM: &str = "loadgen#tpm";
pub(crate) const AMPLE_LEAN: &str = "loadgen#lean";
/// The ample buckets again, each keeping a tenth of its capacity for `interactive`: the
/// `-res` modes take from them as `batch`, so every grant checks a reserve.
pub(crate) const AMPLE_RESERVED: &str = "loadgen#rpm-res";
pub(crate) const AMPLE_TPM_RESERVED: &str = "loadgen#tpm-res";
pub(crate) const LIMIT_CAPACITY: u64 = 100;
pub(crate) const LIMIT_PER_SECOND: u64 = 10;
/// `tpm` at the limit in the two-dimension modes.
pub(crate) const LIMIT_TPM: u64 = 5_000;
/// The `tpm` cost of a two-dimension acquire is drawn from this range.
pub(crate) const TPM_COSTS: std::ops::RangeInclusive<u64> = 50..=500;

/// The modes measured.
pub(crate) const MODES: [(&str, &str); 8] = [
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
pub(crate) fn two_dimensions(mode: &str) -> bool {
    mode.contains('2')
}

/// Whether `mode` acquires as `batch` from buckets keeping a reserve for `interactive`.
pub(crate) fn reserved(mode: &str) -> bool {
    mode.ends_with("-res")
}

/// `bucket` keeping a tenth of its capacity for `interactive`.
pub(crate) fn with_reserve(bucket: Bucket) -> Bucket {
    let tenth = Tokens::from_nanos(bucket.capacity().as_nanos() / 10);
    bucket.with_reserve("interactive".parse().expect("priority"), tenth)
}

/// A small per-task random sequence (xorshift), for the `tpm` costs.
pub(crate) struct Costs(u64);

impl Costs {
    /// A sequence of its own for task `task`.
    pub(crate) fn seeded(task: u64) -> Costs {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Costs((seed ^ task.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1)
    }

    /// A number drawn uniformly from `[0, 1)`, from the same sequence.
    pub(crate) fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        TPM_COSTS.start() + self.0 % (TPM_COSTS.end() - TPM_COSTS.start() + 1)
    }
}

/// What the `prefetch` mode takes ahead per write, and for how long.
pub(crate) const PREFETCH_TOKENS: i64 = 32;
pub(crate) const PREFETCH_HOLD: Duration = Duration::from_millis(100);

pub(crate) async fn child(args: Args, kind: String) {
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
        let mut costs = Costs::seeded(tasks.len() as u64);
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
                    Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => {
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
pub(crate) fn run_shape(
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
