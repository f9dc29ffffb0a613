//! Fleet start: the fan-out shapes as a fleet runs them, not as a benchmark does. Worker
//! processes are spawned one after another and each starts at once (no barrier, no
//! warm-up), the buckets are written the way Terraform or another SDK of the seed design
//! writes them (the seed's attributes only, a whole-second `last_refill_at`), and no
//! client is told the table's per-item ceiling.
//!
//! Two tables per target: ample demand (against demand and one item's ceiling, with the
//! write units, failed writes and calls per grant), and waiting at the limit (every caller
//! waits with `acquire_within` until granted: against supply, calls and write units per
//! grant, the waits against a fair queue's, and fairness across processes).

use aws_sdk_dynamodb::types::AttributeValue;
use sluice::{Bucket, RefillRate, Sluice, clock::Clock as _, clock::SystemClock};

use crate::Args;
use crate::fanout::{FLOOR, WAIT_AT_MOST, floor_key};
use crate::fanrun::{Run, Target, bucket_rows, errors, ratio, run, warm_up};
use crate::report::{latency, shape};

/// The waiting shape's bucket: capacity 10 refilling 20 a second.
const WAIT_CAPACITY: u64 = 10;
const WAIT_PER_SECOND: u64 = 20;
/// The ample shape's buckets: a million calls of capacity, refilling a million a second.
const AMPLE: u64 = 1_000_000;

/// A bucket row as the seed protocol's other SDKs (or Terraform) write it: its attributes
/// only, full, with `last_refill_at` in whole seconds.
pub(crate) async fn put_seed_row(
    args: &Args,
    dimension: &str,
    capacity: u64,
    per_second: u64,
    limit_type: &str,
) {
    let now = SystemClock.now().as_millis() / 1_000;
    let n = |v: String| AttributeValue::N(v);
    crate::worker::store(args)
        .await
        .client()
        .put_item()
        .table_name(&args.table)
        .item("vendor_dimension", AttributeValue::S(dimension.to_owned()))
        .item("capacity", n(capacity.to_string()))
        .item("tokens", n(capacity.to_string()))
        .item("refill_rate", n(per_second.to_string()))
        .item("last_refill_at", n(now.to_string()))
        .item("cost_per_call", n("1".to_owned()))
        .item("limit_type", AttributeValue::S(limit_type.to_owned()))
        .item("version", n("1".to_owned()))
        .send()
        .await
        .expect("a seed-written bucket row");
}

/// Warms the server on `local` (plain DynamoDB Local) with the fan-out shape's heaviest
/// mode, the pair, on seed-written rows of its own (see [`warm_up`]): the whole run's
/// warm-up (one process) left the first fleet-start row measuring the server compiling the
/// paths of 48 processes' conditional writes (without it, in ten runs on one machine, the
/// default path's first row got 0.86 to 0.93 of demand and the row after it 0.90 to 0.97;
/// with it, both rows 0.97 in two runs, then 0.91 and 0.97, 0.96 and 0.90 in two on a
/// fresh clone: the order no longer decides, the noise of one run remains).
pub(crate) async fn warm_server(args: &Args, local: &Target) {
    if args.warmup == 0 {
        return;
    }
    let suffix = crate::rand_suffix();
    let (rpm, tpm) = (format!("warm{suffix}#rpm"), format!("warm{suffix}#tpm"));
    put_seed_row(args, &rpm, AMPLE, AMPLE, "requests").await;
    put_seed_row(args, &tpm, AMPLE, AMPLE, "tokens").await;
    warm_up(args, local, "fleet", "fan-pair", (&rpm, &tpm)).await;
}

/// The fleet tables on `target` (with `ample` false, only the one at the limit).
pub(crate) async fn tables(args: &Args, target: &Target, sluice: &Sluice, ample_too: bool) {
    if ample_too {
        ample(args, target, sluice).await;
    }
    waiting(args, target).await;
}

/// Ample demand, fleet start: the floor and each mode on seed-written rows, and the
/// default path on a row sluice wrote.
async fn ample(args: &Args, target: &Target, sluice: &Sluice) {
    let suffix = crate::rand_suffix();
    let (rpm, tpm) = (format!("fleet{suffix}#rpm"), format!("fleet{suffix}#tpm"));
    let own = format!("fleet{suffix}#own");
    let lean = format!("fleet{suffix}#lean");
    put_seed_row(args, &rpm, AMPLE, AMPLE, "requests").await;
    put_seed_row(args, &tpm, AMPLE, AMPLE, "tokens").await;
    let ample = Bucket::requests(RefillRate::per_second(AMPLE)).with_capacity(AMPLE);
    sluice
        .put_bucket(&own, ample.clone())
        .await
        .expect("bucket");
    sluice
        .put_bucket(&lean, ample.lean())
        .await
        .expect("bucket");
    println!();
    println!(
        "Fleet start (spawned one after another, no barrier, no warm-up, no ceiling hint), {}:",
        target.label
    );
    println!();
    println!(
        "| mode | bucket written by | processes x callers, hold | of demand | of one item's ceiling | bucket-rows WU/grant | failed bucket writes/grant | calls/grant | acquire p50 | acquire p99 | errors to callers |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let (p, t) = shape(&args.fan_shape);
    let rows = [
        (FLOOR.0, "-", FLOOR.1, floor_key(), None),
        (
            "fast path (the default)",
            "the seed protocol",
            "fan-fast",
            rpm.as_str(),
            None,
        ),
        (
            "fast path (the default)",
            "sluice",
            "fan-fast",
            own.as_str(),
            None,
        ),
        ("lean mode", "sluice", "fan-lean", lean.as_str(), None),
        (
            "fast path, rpm + tpm",
            "the seed protocol",
            "fan-pair",
            rpm.as_str(),
            Some(tpm.as_str()),
        ),
    ];
    for (name, writer, kind, dimension, second) in rows {
        let r = run(
            args,
            target,
            kind,
            (dimension, second.unwrap_or(tpm.as_str())),
            (p, t),
            args.fan_hold_ms,
            args.fan_seconds,
        )
        .await;
        let demand = (p * t) as f64 * 1_000.0 / args.fan_hold_ms as f64;
        let per_second = r.report.grants as f64 / r.seconds as f64;
        let all = (r.report.grants + r.report.late_tokens).max(1) as f64;
        let mut keys = vec![dimension];
        keys.extend(second);
        let (ceiling, wu, failed) = bucket_columns(&r, target, &keys, all, &args.table);
        let calls = format!("{:.2}", r.report.calls as f64 / all);
        println!(
            "| {name} | {writer} | {p}x{t}, {} ms | {} | {} | {wu} | {failed} | {calls} | {} | {} | {} |",
            args.fan_hold_ms,
            ratio(per_second, demand),
            ratio(per_second, ceiling),
            latency(r.report.percentile(50)),
            latency(r.report.percentile(99)),
            errors(&r.report),
        );
    }
}

/// One item's ceiling, and the write units and failed conditional writes per grant the
/// proxy billed on a bucket's rows (its shards' too), when behind it.
fn bucket_columns(
    r: &Run,
    target: &Target,
    dimensions: &[&str],
    grants: f64,
    table: &str,
) -> (f64, String, String) {
    let (Some(stats), Some((_, ceiling))) = (&r.stats, &target.fidelity) else {
        return (0.0, "-".to_owned(), "-".to_owned());
    };
    let s = bucket_rows(stats, table, dimensions);
    (
        *ceiling,
        format!("{:.2}", s.write_units as f64 / grants),
        format!("{:.3}", s.failed_conditional_writes as f64 / grants),
    )
}

/// Waiting at the limit, fleet start: every caller waits until granted on a seed-written
/// bucket of capacity 10 refilling 20/s.
async fn waiting(args: &Args, target: &Target) {
    let (p, t) = shape(&args.fan_shape);
    let callers = (p * t) as f64;
    let hold = args.fan_hold_ms as f64 / 1_000.0;
    // A fair queue: every caller waits its turn among all of them, less its own hold.
    let ideal = (callers / WAIT_PER_SECOND as f64 - hold).max(0.0);
    println!();
    println!(
        "Waiting at the limit (capacity {WAIT_CAPACITY}, refill {WAIT_PER_SECOND}/s, written by the seed protocol), fleet start, {p}x{t} callers each waiting until granted (`acquire_within`, at most {} s), hold {} ms, {}, {} s; a fair queue's wait {ideal:.2} s:",
        WAIT_AT_MOST.as_secs(),
        args.fan_hold_ms,
        target.label,
        args.limit_seconds,
    );
    println!();
    println!(
        "| grants by the deadline | of supply | calls/grant | bucket-rows WU/grant | failed bucket writes/grant | wait p50 | wait p99 | wait p99 / a fair queue's | Jain's index over processes | least-served process / mean | worst window over capacity + rate x window | waits past their deadline | errors to callers |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let dimension = format!("wait{}#rpm", crate::rand_suffix());
    put_seed_row(args, &dimension, WAIT_CAPACITY, WAIT_PER_SECOND, "requests").await;
    let r = run(
        args,
        target,
        "fan-wait",
        (&dimension, &dimension),
        (p, t),
        args.fan_hold_ms,
        args.limit_seconds,
    )
    .await;
    let rep = &r.report;
    let supply = WAIT_CAPACITY as f64 + WAIT_PER_SECOND as f64 * r.seconds as f64;
    let all = (rep.grants + rep.late_tokens).max(1) as f64;
    let (_, wu, failed) = bucket_columns(&r, target, &[&dimension], all, &args.table);
    let (jain, least) = fairness(&r.per_process);
    println!(
        "| {} | {} | {:.2} | {wu} | {failed} | {} | {} | {} | {jain:.3} | {least:.2} | {:.1} | {} | {} |",
        rep.grants,
        ratio(rep.grants as f64, supply),
        rep.calls as f64 / all,
        latency(rep.wait_percentile(50)),
        latency(rep.wait_percentile(99)),
        ratio(rep.wait_percentile(99).as_secs_f64(), ideal),
        rep.worst_window(WAIT_CAPACITY as f64, WAIT_PER_SECOND as f64),
        rep.over_deadline,
        errors(rep),
    );
}

/// Jain's fairness index over the processes' grants, and the least-served process's share
/// of the mean.
fn fairness(grants: &[u64]) -> (f64, f64) {
    let n = grants.len() as f64;
    let sum: f64 = grants.iter().map(|g| *g as f64).sum();
    let squares: f64 = grants.iter().map(|g| (*g as f64).powi(2)).sum();
    if n == 0.0 || squares == 0.0 {
        return (0.0, 0.0);
    }
    let least = grants.iter().copied().min().unwrap_or(0) as f64;
    (sum * sum / (n * squares), least / (sum / n))
}
