//! Sharding: one ample dimension at the fan-out shape behind `dynamodb-fidelity` at a low
//! per-item write ceiling, where one item cannot carry the demand and the bucket spreads
//! itself over rows (grants/s against the demand and against one item's ceiling, the
//! rows it ended on and when it got there); then a bucket spread over rows at the limit
//! (grants against the supply, the worst window, the ledger over every row, and a request
//! for the whole capacity once the bucket has refilled).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice::{
    Acquire, Bucket, RefillRate, Sluice, Tokens, bucket::BucketState, clock::Clock as _,
    clock::SystemClock,
};

use crate::Args;
use crate::fanrun::{Target, errors, items, ratio, run as fan_run, warm_up};
use crate::report::{latency, shape};

/// The rows of `dimension`'s bucket as stored: its own and its shards'.
async fn rows_of(sluice: &Sluice, dimension: &str) -> Vec<BucketState> {
    let shard = format!("{dimension}#");
    sluice
        .buckets()
        .await
        .expect("list the buckets")
        .into_iter()
        .filter(|r| r.dimension.as_str() == dimension || r.dimension.as_str().starts_with(&shard))
        .collect()
}

/// Every key a bucket of `dimension` may have rows under.
pub(crate) fn keys(dimension: &str) -> Vec<String> {
    std::iter::once(dimension.to_owned())
        .chain((1..sluice::config::MAX_SHARDS).map(|k| format!("{dimension}#{k}")))
        .collect()
}

/// The sharding tables, behind the proxy at `args.shard_ceiling` write units/s per item.
pub(crate) async fn run(args: &Args, sluice: &Sluice, proxy: &str) {
    dynamodb_fidelity::set_ceilings(proxy, args.shard_ceiling, 3.0 * args.shard_ceiling)
        .await
        .expect("set the proxy's ceilings");
    let partitions = (args.shard_partitions > 0).then_some(args.shard_partitions);
    dynamodb_fidelity::set_partitions(proxy, partitions, None)
        .await
        .expect("set the proxy's partitions");
    // A table of partitions is run as a fleet starts: no barrier, no ceiling told.
    let label = match partitions {
        Some(n) => format!(
            "fleet start, behind dynamodb-fidelity, a table of {n} partitions of {} write units/s each",
            args.shard_ceiling
        ),
        None => format!(
            "behind dynamodb-fidelity, {} write units/s per item",
            args.shard_ceiling
        ),
    };
    let target = Target {
        label,
        endpoint: Some(proxy.to_owned()),
        fidelity: Some((proxy.to_owned(), args.shard_ceiling)),
        fleet: partitions.is_some(),
    };
    ample(args, sluice, &target).await;
    at_limit(args, sluice, &target).await;
    dynamodb_fidelity::set_partitions(proxy, None, None)
        .await
        .expect("restore the proxy's partitions");
}

/// Polls how many rows `dimension`'s bucket has, every 100 ms until `stop`: (ms since
/// `since`, rows).
fn watch(
    sluice: Sluice,
    dimension: String,
    since: Instant,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(u64, u16)>> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            if let Ok(Some(row)) = sluice.bucket(&dimension).await {
                seen.push((since.elapsed().as_millis() as u64, row.shards));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        seen
    })
}

/// When the count reached its final value and kept it: ms since the watch began.
fn settled_at(seen: &[(u64, u16)]) -> Option<(u16, u64)> {
    let last = seen.last()?.1;
    let from = seen
        .iter()
        .rposition(|(_, n)| *n != last)
        .map_or(0, |i| i + 1);
    Some((last, seen[from].0))
}

async fn ample(args: &Args, sluice: &Sluice, target: &Target) {
    let rpm = args
        .shard_name
        .clone()
        .unwrap_or_else(|| format!("shard{}#rpm", crate::rand_suffix()));
    let ample = Bucket::requests(RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
    sluice.put_bucket(&rpm, ample).await.expect("bucket");
    if args.shard_pin > 1 {
        sluice.reshard(&rpm, args.shard_pin).await.expect("reshard");
    }
    let (p, t) = shape(&args.fan_shape);
    println!();
    println!(
        "Sharding, one ample dimension, {}{}:",
        target.label,
        if args.shard_pin > 1 {
            format!(", pinned to {} rows", args.shard_pin)
        } else {
            String::new()
        }
    );
    println!();
    println!(
        "| processes x callers, hold | grants/s | of demand | x one item's ceiling | rows at the end | rows settled after | of demand once settled | bucket-rows WU/grant | all-rows WU/grant | failed bucket writes/grant | throttled bucket writes/grant | acquire p50 | acquire p99 | errors to callers |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    if args.warmup > 0 {
        let warm = format!("shardwarm{}#rpm", crate::rand_suffix());
        let bucket = Bucket::requests(RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
        sluice.put_bucket(&warm, bucket).await.expect("bucket");
        warm_up(args, target, "sharding", "fan-fast", (&warm, &warm)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    // When the workers start (see `fanrun::run`).
    let since = Instant::now() + crate::fanrun::start_delay(target);
    let watching = watch(sluice.clone(), rpm.clone(), since, stop.clone());
    let r = fan_run(
        args,
        target,
        "fan-fast",
        (&rpm, &rpm),
        (p, t),
        args.fan_hold_ms,
        args.shard_seconds,
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    let seen = watching.await.expect("watch");
    let (rows, settled) = settled_at(&seen).unwrap_or((1, 0));
    let rep = &r.report;
    // Once the rows settled: the grants heard after, over the rest of the run.
    let from = r.started.as_millis() + settled as i64;
    let end = r.started.as_millis() + r.seconds as i64 * 1_000;
    let after = rep
        .granted_at
        .iter()
        .filter(|(t, _)| *t >= from && *t <= end)
        .count() as f64;
    let settled_rate = after * 1_000.0 / (end - from).max(1) as f64;
    let per_second = rep.grants as f64 / r.seconds as f64;
    let demand = (p * t) as f64 * 1_000.0 / args.fan_hold_ms as f64;
    let all = (rep.grants + rep.late_tokens).max(1) as f64;
    let stats = r.stats.as_ref().expect("the proxy's counters");
    let keys = keys(&rpm);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let s = items(stats, &args.table, &keys);
    println!(
        "| {p}x{t}, {} ms | {per_second:.1} | {} | {} | {rows} | {:.1} s | {} | {:.2} | {:.2} | {:.3} | {:.2} | {} | {} | {} |",
        args.fan_hold_ms,
        ratio(per_second, demand),
        ratio(per_second, args.shard_ceiling),
        settled as f64 / 1_000.0,
        ratio(settled_rate, demand),
        s.write_units as f64 / all,
        stats.totals().write_units as f64 / all,
        s.failed_conditional_writes as f64 / all,
        s.throttled_writes as f64 / all,
        latency(rep.percentile(50)),
        latency(rep.percentile(99)),
        errors(rep),
    );
    let (mut writes, mut conflicts, mut largest) = (0, 0, 0);
    for key in &keys {
        if let Some(item) = stats.item(&args.table, key) {
            writes += item.successful_writes;
            conflicts += item.transaction_conflicts;
            largest = largest.max(item.largest_item_size);
        }
    }
    println!(
        "|  | bucket rows: {:.2} successful writes/grant, {conflicts} transaction conflicts, largest row {largest} bytes |  |  |  |  |  |  |  |  |  |  |  |  |",
        writes as f64 / all
    );
    if args.shard_partitions > 0 {
        let bound = f64::from(args.shard_partitions) * args.shard_ceiling;
        println!(
            "|  | the table's bound: {} partitions x {} WU/s = {bound:.0} WU/s; grants/s {} of it, {} once settled |  |  |  |  |  |  |  |  |  |  |  |  |",
            args.shard_partitions,
            args.shard_ceiling,
            ratio(per_second, bound),
            ratio(settled_rate, bound),
        );
    }
    floor(args, target, &r).await;
    println!(
        "|  | reshards: {}; grants in each of the first seconds: {} |  |  |  |  |  |  |  |  |  |  |  |  |",
        timeline(&seen),
        first_seconds(&rep.granted_at, r.started.as_millis(), 8)
    );
}

/// The grants heard in each of the first `n` seconds from `start`: "52, 140, 231".
fn first_seconds(granted_at: &[(i64, u64)], start: i64, n: usize) -> String {
    let mut each = vec![0u64; n];
    for (at, _) in granted_at {
        let second = usize::try_from((at - start).div_euclid(1_000)).unwrap_or(usize::MAX);
        if let Some(count) = each.get_mut(second) {
            *count += 1;
        }
    }
    each.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The counts a bucket went through, and when: "4 rows at 1.2 s, 16 rows at 3.8 s".
fn timeline(seen: &[(u64, u16)]) -> String {
    let counts: Vec<String> = seen
        .windows(2)
        .filter(|w| w[0].1 != w[1].1)
        .map(|w| format!("{} rows at {:.1} s", w[1].1, w[1].0 as f64 / 1_000.0))
        .collect();
    if counts.is_empty() {
        "none".to_owned()
    } else {
        counts.join(", ")
    }
}

/// What this machine carries through the proxy at the same shape: a bare conditional
/// `UpdateItem` per grant on one item whose ceiling is lifted for the run.
async fn floor(args: &Args, target: &Target, sharded: &crate::fanrun::Run) {
    let Some((proxy, ceiling)) = &target.fidelity else {
        return;
    };
    dynamodb_fidelity::set_ceilings(proxy, 1_000_000.0, 3_000_000.0)
        .await
        .expect("lift the proxy's ceilings");
    let (p, t) = shape(&args.fan_shape);
    let r = fan_run(
        args,
        target,
        "fan-floor",
        (crate::fanout::floor_key(), crate::fanout::floor_key()),
        (p, t),
        args.fan_hold_ms,
        args.shard_seconds.min(10),
    )
    .await;
    dynamodb_fidelity::set_ceilings(proxy, *ceiling, 3.0 * ceiling)
        .await
        .expect("restore the proxy's ceilings");
    let floor = r.report.grants as f64 / r.seconds as f64;
    let sharded_rate = sharded.report.grants as f64 / sharded.seconds as f64;
    println!(
        "|  | the floor through the proxy, its ceiling lifted: {floor:.1} UpdateItem/s at this shape (p50 {}, p99 {}); the sharded bucket {} of it |  |  |  |  |  |  |  |  |  |  |  |  |",
        latency(r.report.percentile(50)),
        latency(r.report.percentile(99)),
        ratio(sharded_rate, floor),
    );
}

async fn at_limit(args: &Args, sluice: &Sluice, target: &Target) {
    const CAPACITY: u64 = 1_000;
    const PER_SECOND: u64 = 100;
    const ROWS: u16 = 4;
    let rpm = format!("shardlimit{}#rpm", crate::rand_suffix());
    let limited = Bucket::requests(RefillRate::per_second(PER_SECOND)).with_capacity(CAPACITY);
    sluice.put_bucket(&rpm, limited).await.expect("bucket");
    sluice.reshard(&rpm, ROWS).await.expect("reshard");
    let (p, t) = shape(&args.fan_shape);
    println!();
    println!(
        "At the limit on a bucket spread over {ROWS} rows (capacity {CAPACITY}, refill {PER_SECOND}/s), fan-out {}, hold {} ms, {}, {} s:",
        args.fan_shape, args.fan_hold_ms, target.label, args.limit_seconds
    );
    println!();
    println!(
        "| grants by the deadline | supply (capacity + refill x run) | granted / supply | worst window over capacity + rate x window | ledger over every row | rows at the end | the whole capacity at once, once refilled | errors to callers |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let stop = Arc::new(AtomicBool::new(false));
    let since = Instant::now() + crate::fanrun::start_delay(target);
    let watching = watch(sluice.clone(), rpm.clone(), since, stop.clone());
    let r = fan_run(
        args,
        target,
        "fan-fast",
        (&rpm, &rpm),
        (p, t),
        args.fan_hold_ms,
        args.limit_seconds,
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    let seen = watching.await.expect("watch");
    let rep = &r.report;
    let supply = CAPACITY as f64 + PER_SECOND as f64 * r.seconds as f64;
    let rows = rows_of(sluice, &rpm).await;
    let now = SystemClock.now();
    let left = rows
        .iter()
        .fold(Tokens::ZERO, |s, r| s + r.available(now).max(Tokens::ZERO));
    let refilled_ms = i128::from(now.as_millis() - r.started.as_millis());
    let most = Tokens::from(CAPACITY)
        + Tokens::from_nanos(refilled_ms * i128::from(PER_SECOND) * 1_000_000);
    let ledger = if Tokens::from(rep.tokens + rep.late_tokens) + left <= most {
        "no over-grant"
    } else {
        "OVER-GRANT"
    };
    // Quiet until every row is full again, then the whole capacity in one acquire.
    tokio::time::sleep(Duration::from_millis(CAPACITY * 1_000 / PER_SECOND + 1_000)).await;
    let whole = match sluice
        .acquire(Acquire::with_cost(rpm.as_str(), CAPACITY))
        .await
    {
        Ok(lease) => {
            let parts = lease.id().to_string().matches(',').count() + 1;
            let _ = lease.release().await;
            format!("granted ({parts} rows gave)")
        }
        Err(e) => format!("refused: {e}"),
    };
    println!(
        "| {} | {supply:.0} | {:.1}% | {:.1} | {ledger} | {} | {whole} | {} |",
        rep.tokens,
        rep.tokens as f64 * 100.0 / supply,
        rep.worst_window(CAPACITY as f64, PER_SECOND as f64),
        rows.len(),
        errors(rep),
    );
    // What the rows could have given and nobody took: refill lost to a full row, or a
    // token a reshard dropped (never negative: that would be an over-grant).
    let unaccounted = most - (Tokens::from(rep.tokens + rep.late_tokens) + left);
    println!(
        "|  | reshards: {}; {} RetryIns, {} granted after the deadline; tokens in the rows at the end: {left}, unaccounted: {unaccounted} |  |  |  |  |  |  |",
        timeline(&seen),
        rep.retry_ins,
        rep.late_tokens,
    );
}
