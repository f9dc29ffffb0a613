//! Waiting on a short `concurrent` bucket: many processes of many callers each wait for a
//! slot of a small bucket (`acquire_within`, asked again on each RetryIn), started as a
//! fleet starts, behind `dynamodb-fidelity`, which counts every call on the bucket's item.
//! It reports the calls a second on that item (reads, writes and counts of waiting
//! clients alike), against the documented bound (about 100 looks a second, however many
//! wait), and how much of the slots' time was used (a freed slot found late is time lost).

use sluice::Sluice;

use crate::Args;
use crate::fanrun::{Target, errors, run};
use crate::report::{latency, shape};

/// The bucket's slots.
const SLOTS: u64 = 4;
/// The waiters' documented looks a second, together, on one bucket (see
/// `sluice::store::Waiting`).
const DOCUMENTED: u64 = 100;

/// The table: one run of `--slot-wait-shape` on a seed-written `concurrent` bucket.
pub(crate) async fn table(args: &Args, target: &Target, _sluice: &Sluice) {
    let (p, t) = shape(&args.slot_wait_shape);
    let hold_ms = args.slot_wait_hold_ms;
    let seconds = args.limit_seconds;
    let dimension = format!("slotwait{}#slots", crate::rand_suffix());
    crate::fleet::put_seed_row(args, &dimension, SLOTS, 0, "concurrent").await;
    println!();
    println!(
        "Waiting on a short `concurrent` bucket ({SLOTS} slots, written by the seed protocol), fleet start, {p}x{t} callers each waiting for a slot (`acquire_within`, asked again on each RetryIn), hold {hold_ms} ms, {}, {seconds} s:",
        target.label
    );
    println!();
    println!(
        "| callers | calls/s on the bucket's item | documented | read units/s | write units/s | slots' time used | grants | wait p50 | wait p99 | errors to callers |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let r = run(
        args,
        target,
        "fan-wait",
        (&dimension, &dimension),
        (p, t),
        hold_ms,
        seconds,
    )
    .await;
    let s = r
        .stats
        .as_ref()
        .and_then(|stats| stats.item(&args.table, &dimension).cloned())
        .unwrap_or_default();
    let secs = r.seconds.max(1) as f64;
    let rep = &r.report;
    let slot_time = SLOTS as f64 * secs;
    let used = (rep.grants as f64 * hold_ms as f64 / 1_000.0 / slot_time).min(1.0);
    println!(
        "| {} | {:.0} | {DOCUMENTED} | {:.0} | {:.0} | {:.2} | {} | {} | {} | {} |",
        p * t,
        s.requests as f64 / secs,
        s.read_half_units as f64 / 2.0 / secs,
        s.write_units as f64 / secs,
        used,
        rep.grants,
        latency(rep.wait_percentile(50)),
        latency(rep.wait_percentile(99)),
        errors(rep),
    );
}
