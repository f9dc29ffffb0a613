//! A busy `concurrent` dimension behind `dynamodb-fidelity`, every item and every key of
//! the slots index at `--shard-ceiling` write units a second (as each of real DynamoDB's
//! is at 1,000): each slot costs the bucket's row a take and a give-back and its lease
//! row's index key a put and a delete, so one row, or one index key, carries about half
//! the ceiling in slots a second. Fleet start, no ceiling told. It reports the slots a
//! second against one row's slot capacity, the index writes by key, the throttles, and
//! the slots lost (the bucket's free slots and live lease rows once every caller is done).

use sluice::{Bucket, Sluice, store::LeaseFilter};

use crate::Args;
use crate::fanrun::{Target, errors, items, ratio, run};
use crate::report::{latency, shape};

/// The bucket's slots.
const SLOTS: u64 = 64;

/// The table: one fleet-start run of the fan-out shape on a `concurrent(64)` bucket.
pub(crate) async fn table(args: &Args, sluice: &Sluice, proxy: &str) {
    let ceiling = args.shard_ceiling;
    dynamodb_fidelity::set_ceilings(proxy, ceiling, 3.0 * ceiling)
        .await
        .expect("set the proxy's ceilings");
    let target = Target {
        label: format!(
            "fleet start, behind dynamodb-fidelity, {ceiling} write units/s per item and per index key"
        ),
        endpoint: Some(proxy.to_owned()),
        fidelity: Some((proxy.to_owned(), ceiling)),
        fleet: true,
    };
    let dimension = format!("slotindex{}#concurrent", crate::rand_suffix());
    sluice
        .put_bucket(&dimension, Bucket::concurrent(SLOTS))
        .await
        .expect("bucket");
    let (p, t) = shape(&args.fan_shape);
    let hold_ms = args.fan_hold_ms;
    let seconds = args.shard_seconds;
    println!();
    println!(
        "A busy `concurrent({SLOTS})` dimension, {p}x{t} callers holding {hold_ms} ms, {}, {seconds} s:",
        target.label
    );
    println!();
    println!(
        "| slots/s | one row's slot capacity (ceiling / 2) | of it | of demand | index WU/s by key | index throttles | bucket-row throttles | most held at once | acquire p50 | acquire p99 | slots lost | errors to callers |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let r = run(
        args,
        &target,
        "fan-slots",
        (&dimension, &dimension),
        (p, t),
        hold_ms,
        seconds,
    )
    .await;
    let stats = r.stats.clone().unwrap_or_default();
    let secs = r.seconds.max(1) as f64;
    let rep = &r.report;
    let slots_per_s = rep.grants as f64 / secs;
    let capacity = ceiling / 2.0;
    let demand = (p * t) as f64 * 1_000.0 / hold_ms.max(1) as f64;
    let index = format!("{}/index/{}", args.table, sluice::store::SLOTS_INDEX);
    let keys: Vec<String> = (0..4)
        .map(|k| match k {
            0 => dimension.clone(),
            k => format!("{dimension} {k}"),
        })
        .collect();
    let by_key: Vec<_> = keys
        .iter()
        .map(|key| stats.item(&index, key).copied().unwrap_or_default())
        .collect();
    let index_wu: Vec<String> = by_key
        .iter()
        .map(|s| format!("{:.1}", s.write_units as f64 / secs))
        .collect();
    let index_throttles: u64 = by_key.iter().map(|s| s.throttled_writes).sum();
    let row = items(&stats, &args.table, &[&dimension]);
    let lost = lost_slots(sluice, &dimension).await;
    println!(
        "| {slots_per_s:.1} | {capacity:.1} | {} | {} | {} | {index_throttles} | {} | {} | {} | {} | {lost} | {} |",
        ratio(slots_per_s, capacity),
        ratio(slots_per_s, demand),
        index_wu.join(" / "),
        row.throttled_writes,
        rep.most_held(),
        latency(rep.percentile(50)),
        latency(rep.percentile(99)),
        errors(rep),
    );
}

/// Slots neither free in the bucket's row nor held by a live lease row, once every
/// caller is done (each released what it held).
async fn lost_slots(sluice: &Sluice, dimension: &str) -> String {
    let row = sluice
        .bucket(dimension)
        .await
        .expect("read")
        .expect("bucket");
    let filter = LeaseFilter {
        dimension: Some(dimension.parse().expect("dimension")),
        expired_before: None,
    };
    let leases = sluice.leases(&filter).await.expect("leases").len() as u64;
    let free = u64::try_from(row.tokens.as_nanos() / 1_000_000_000).unwrap_or(0);
    let lost = SLOTS.saturating_sub(free + leases);
    format!("{lost} ({free} free, {leases} lease rows left)")
}
