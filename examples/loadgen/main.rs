//! Load generator: sluice on DynamoDB against the physical floor, every mode in one run.
//!
//! Throughput: for each shape `PxT` (P processes of T tasks) it measures the floor (a bare
//! conditional `UpdateItem` on one item, from the same processes and tasks), the same with a
//! lean grant's request shape (four attributes set, a condition on the version and the write
//! id, `ALL_OLD` on failure: what the SDK and server spend on the request itself), and then
//! sluice in each mode (the seed protocol; the fast path; the fast path taking as `batch`
//! under a reserve; the fast path on a lean bucket, and the same prefetching 32 tokens per
//! write for up to 100 ms; and OpenAI's everyday pair, every
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
//! Fan-out (see `fanout.rs`): the seeds' deployment, many processes of one caller each,
//! every caller holding its grant (the vendor call) before releasing it: on plain DynamoDB
//! Local and behind `dynamodb-fidelity` (real DynamoDB's per-item ceiling, scaled down,
//! its billing, throttling and transaction conflicts), against demand and one item's
//! ceiling, with the write units the proxy billed per grant; and the same at the limit.
//!
//! ```text
//! ./scripts/loadgen.sh                        # starts DynamoDB Local and the proxy, runs everything
//! ./scripts/loadgen.sh --only fanout          # the fan-out tables alone
//! ./scripts/loadgen.sh --only slot-wait       # 1,000 callers waiting on a short concurrent bucket
//! ./scripts/loadgen.sh --only slot-index      # a busy concurrent(64) bucket, index keys throttled
//! ./scripts/loadgen.sh --only keys            # 100,000 keys of one template, Zipf-like
//! ./scripts/loadgen.sh --shapes 4x8 --seconds 10
//! ```
//!
//! Against an existing endpoint and table: `cargo run --release -p sluice-examples
//! --features dynamodb --example loadgen -- --endpoint URL --table NAME`.
#![allow(clippy::print_stdout, clippy::print_stderr)]
// Floating point is used for reporting only, never for accounting.
#![allow(clippy::float_arithmetic)]

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use clap::Parser;
use sluice::{Bucket, RefillRate, Sluice, Tokens};

#[derive(Debug, Parser)]
#[command(about = "Measures sluice on DynamoDB against a bare conditional UpdateItem")]
pub(crate) struct Args {
    /// DynamoDB endpoint (e.g. DynamoDB Local); AWS's default when absent.
    #[arg(long, env = "SLUICE_ENDPOINT_URL")]
    pub(crate) endpoint: Option<String>,
    /// Table to use (created when missing).
    #[arg(long, default_value = "sluice-loadgen")]
    pub(crate) table: String,
    /// Shapes to run, `PROCESSESxTASKS`, comma-separated.
    #[arg(long, default_value = "1x1,1x16,4x8", value_delimiter = ',')]
    pub(crate) shapes: Vec<String>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    pub(crate) seconds: u64,
    /// Rounds each measurement is split into, the rows taking turns.
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: u64,
    /// Seconds of unmeasured load first, so DynamoDB Local's JIT is warm.
    #[arg(long, default_value_t = 5)]
    pub(crate) warmup: u64,
    /// Internal: run as a worker process.
    #[arg(long, hide = true)]
    pub(crate) child: Option<String>,
    /// Internal: the worker's tasks.
    #[arg(long, hide = true, default_value_t = 1)]
    pub(crate) tasks: usize,
    /// Internal: the dimension the workers use.
    #[arg(long, hide = true, default_value = "loadgen#rpm")]
    pub(crate) dimension: String,
    /// Internal: the second dimension of the two-dimension modes.
    #[arg(long, hide = true, default_value = "loadgen#tpm")]
    pub(crate) tokens_dimension: String,
    /// Internal: when the workers start (unix milliseconds).
    #[arg(long, hide = true, default_value_t = 0)]
    pub(crate) start_ms: i64,
    /// Seconds per run at the limit.
    #[arg(long, default_value_t = 10)]
    pub(crate) limit_seconds: u64,
    /// Shapes to run at the limit.
    #[arg(long, default_value = "1x16,4x8", value_delimiter = ',')]
    pub(crate) limit_shapes: Vec<String>,
    /// What to run: `throughput`, `limit`, `fanout`, `fleet`, `sharding`, `slot-wait`,
    /// `slot-index`, `keys`, comma-separated (all by default); `fleet-wait` runs only the fleet's tables
    /// at the limit, `fleet-proxy` only those behind the proxy.
    #[arg(
        long,
        default_value = "throughput,limit,fanout,fleet,sharding,slot-wait,slot-index,keys",
        value_delimiter = ','
    )]
    pub(crate) only: Vec<String>,
    /// The fan-out shape: processes x callers.
    #[arg(long, default_value = "48x1")]
    pub(crate) fan_shape: String,
    /// How long each fan-out caller holds a grant, milliseconds.
    #[arg(long, default_value_t = 200)]
    pub(crate) fan_hold_ms: u64,
    /// Seconds per fan-out run.
    #[arg(long, default_value_t = 20)]
    pub(crate) fan_seconds: u64,
    /// The shape of the callers waiting on a short `concurrent` bucket (`slot-wait`):
    /// processes x callers.
    #[arg(long, default_value = "50x20")]
    pub(crate) slot_wait_shape: String,
    /// How long each `slot-wait` caller holds its slot, milliseconds.
    #[arg(long, default_value_t = 500)]
    pub(crate) slot_wait_hold_ms: u64,
    /// The keyed shape (`keys`: 100,000 keys of one template drawn Zipf-like):
    /// processes x callers.
    #[arg(long, default_value = "8x16")]
    pub(crate) keys_shape: String,
    /// The LLM fan-out shape (rpm + tpm pairs held long): processes x callers.
    #[arg(long, default_value = "16x64")]
    pub(crate) llm_shape: String,
    /// How long each caller of the LLM shape holds its pair, milliseconds.
    #[arg(long, default_value_t = 4_000)]
    pub(crate) llm_hold_ms: u64,
    /// A `dynamodb-fidelity` proxy in front of the same DynamoDB Local: the fan-out runs
    /// again through it.
    #[arg(long)]
    pub(crate) fidelity: Option<String>,
    /// The per-item write ceiling the proxy enforces during the fan-out runs, units per
    /// second (real DynamoDB: 1,000; scaled down so that one machine reaches it).
    #[arg(long, default_value_t = 100.0)]
    pub(crate) fidelity_ceiling: f64,
    /// The per-item write ceiling of the sharding runs, units per second.
    #[arg(long, default_value_t = 50.0)]
    pub(crate) shard_ceiling: f64,
    /// Seconds of the sharding run at ample demand.
    #[arg(long, default_value_t = 30)]
    pub(crate) shard_seconds: u64,
    /// Rows to spread the sharding run's bucket over beforehand, each worker then leaving
    /// the count alone (0: one row, and the workers reshard on their own).
    #[arg(long, default_value_t = 0)]
    pub(crate) shard_pin: u16,
    /// Partitions of the sharding runs' table, each with the per-item ceiling above,
    /// items hashed onto them as DynamoDB does (0: every item its own ceiling). The
    /// table's bound is then partitions x that ceiling.
    #[arg(long, default_value_t = 0)]
    pub(crate) shard_partitions: u32,
    /// The sharding runs' dimension at ample demand (default: a new one each run). Its
    /// rows hash onto the partitions by name: the same name, the same layout, to compare
    /// two builds.
    #[arg(long)]
    pub(crate) shard_name: Option<String>,
    /// Internal: the most rows a fan-out worker spreads a bucket over (0: the default).
    #[arg(long, hide = true, default_value_t = 0)]
    pub(crate) max_shards: u16,
    /// Internal: the per-item write ceiling a fan-out worker's client assumes (0: the
    /// store's own).
    #[arg(long, hide = true, default_value_t = 0)]
    pub(crate) item_ceiling: u32,
    /// Milliseconds the proxy adds to every call in the last fleet-start run behind it.
    #[arg(long, default_value_t = 5)]
    pub(crate) fleet_latency_ms: u64,
    /// Log sluice's debug events to standard error (in worker processes too).
    #[arg(long)]
    pub(crate) log: bool,
    /// Internal: how long a fan-out caller holds each grant, milliseconds.
    #[arg(long, hide = true, default_value_t = 0)]
    pub(crate) hold_ms: u64,
}

mod fanout;
mod fanrun;
mod fleet;
mod keys;
mod report;
mod sharding;
mod slotindex;
mod slotwait;
mod worker;

use report::{Report, latency, per_grant, shape};
use worker::{
    AMPLE, AMPLE_LEAN, AMPLE_RESERVED, AMPLE_TPM, AMPLE_TPM_RESERVED, FLOOR_KEY, LIMIT_CAPACITY,
    LIMIT_PER_SECOND, LIMIT_TPM, MODES, SHAPED_WRITE_ID, reserved, run_shape, store,
    two_dimensions, with_reserve,
};

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if args.log {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::stderr)
            .init();
    }
    if let Some(kind) = args.child.clone() {
        if kind.starts_with("fan-") {
            fanout::child(args, kind).await;
        } else {
            worker::child(args, kind).await;
        }
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

    let runs = |what: &str| args.only.iter().any(|o| o == what);
    if args.warmup > 0 {
        eprintln!("warming up for {} s", args.warmup);
        run_shape(&args, "floor", AMPLE, AMPLE_TPM, 1, 4, args.warmup);
        run_shape(&args, "fast", AMPLE, AMPLE_TPM, 1, 4, args.warmup);
    }
    if runs("throughput") {
        throughput(&args, dimension_of, tokens_dimension_of);
    }
    if runs("limit") {
        limits(&args, &sluice, &ample).await;
    }
    if runs("fanout") {
        fanout(&args, &sluice).await;
    }
    if runs("fleet") || runs("fleet-wait") || runs("fleet-proxy") {
        let plain = !runs("fleet-proxy");
        fleet(&args, &sluice, (runs("fleet") || !plain, plain)).await;
    }
    if runs("slot-wait")
        && let Some(proxy) = &args.fidelity
    {
        // The proxy's real per-item ceilings: the waiters' reads are what is measured.
        let target = fanrun::real_ceilings(proxy).await;
        slotwait::table(&args, &target, &sluice).await;
    }
    if runs("keys")
        && let Some(proxy) = &args.fidelity
    {
        let target = fanrun::real_ceilings(proxy).await;
        keys::table(&args, &target, &sluice).await;
    }
    if runs("slot-index")
        && let Some(proxy) = &args.fidelity
    {
        slotindex::table(&args, &sluice, proxy).await;
    }
    if runs("sharding")
        && let Some(proxy) = &args.fidelity
    {
        fanout::create_floor(worker::store(&args).await.client(), &args.table).await;
        sharding::run(&args, &sluice, proxy).await;
    }
}

/// The fan-out tables, on plain DynamoDB Local and behind the proxy when there is one.
async fn fanout(args: &Args, sluice: &Sluice) {
    fanout::create_floor(store(args).await.client(), &args.table).await;
    let mut targets = vec![fanrun::Target {
        label: "plain DynamoDB Local".to_owned(),
        endpoint: args.endpoint.clone(),
        fidelity: None,
        fleet: false,
    }];
    if let Some(proxy) = &args.fidelity {
        dynamodb_fidelity::set_ceilings(proxy, args.fidelity_ceiling, 3.0 * args.fidelity_ceiling)
            .await
            .expect("set the proxy's ceilings");
        targets.push(fanrun::Target {
            label: format!(
                "behind dynamodb-fidelity, {} write units/s per item",
                args.fidelity_ceiling
            ),
            endpoint: Some(proxy.clone()),
            fidelity: Some((proxy.clone(), args.fidelity_ceiling)),
            fleet: false,
        });
    }
    for target in &targets {
        fanrun::ample(args, target, sluice).await;
        fanrun::at_limit(args, target, sluice).await;
    }
}

/// The fleet-start tables (see `fleet.rs`): on plain DynamoDB Local, and behind the proxy
/// at its ceiling, at half of it, and at its ceiling with `--fleet-latency-ms` added to
/// every call, the clients told none of it.
async fn fleet(args: &Args, sluice: &Sluice, (ample, plain): (bool, bool)) {
    fanout::create_floor(store(args).await.client(), &args.table).await;
    let local = fanrun::Target {
        label: "plain DynamoDB Local".to_owned(),
        endpoint: args.endpoint.clone(),
        fidelity: None,
        fleet: true,
    };
    fleet::warm_server(args, &local).await;
    let mut targets = Vec::new();
    if plain {
        targets.push((local, None, Duration::ZERO));
    }
    if let Some(proxy) = &args.fidelity {
        let latency = Duration::from_millis(args.fleet_latency_ms);
        let full = args.fidelity_ceiling;
        for (ceiling, latency) in [
            (full, Duration::ZERO),
            (full / 2.0, Duration::ZERO),
            (full, latency),
        ] {
            let added = if latency.is_zero() {
                String::new()
            } else {
                format!(", {} ms added to every call", latency.as_millis())
            };
            let target = fanrun::Target {
                label: format!("behind dynamodb-fidelity, {ceiling} write units/s per item{added}"),
                endpoint: Some(proxy.clone()),
                fidelity: Some((proxy.clone(), ceiling)),
                fleet: true,
            };
            targets.push((target, Some(ceiling), latency));
        }
    }
    for (target, ceiling, latency) in &targets {
        if let (Some(proxy), Some(ceiling)) = (&args.fidelity, ceiling) {
            dynamodb_fidelity::set_ceilings(proxy, *ceiling, 3.0 * ceiling)
                .await
                .expect("set the proxy's ceilings");
            let latency = dynamodb_fidelity::Latency {
                base: *latency,
                tail: Duration::ZERO,
            };
            dynamodb_fidelity::set_latency(proxy, latency)
                .await
                .expect("set the proxy's latency");
        }
        fleet::tables(args, target, sluice, ample).await;
    }
    if let Some(proxy) = &args.fidelity {
        dynamodb_fidelity::set_latency(proxy, dynamodb_fidelity::Latency::default())
            .await
            .expect("set the proxy's latency");
    }
}

/// The throughput table: every mode at each shape, against the floor.
fn throughput(
    args: &Args,
    dimension_of: impl Fn(&str) -> &'static str,
    tokens_dimension_of: impl Fn(&str) -> &'static str,
) {
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
                let (r, t_run, _) = run_shape(args, kind, dimension, tokens, p, t, seconds);
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
}

/// The at-the-limit table: every mode at each limit shape, against the supply.
async fn limits(args: &Args, sluice: &Sluice, ample: &Bucket) {
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
                args,
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

pub(crate) fn rand_suffix() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    )
}
