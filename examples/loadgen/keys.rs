//! Keyed buckets: a limit per tenant, 100,000 tenants. Worker processes of many callers
//! each acquire on keys of one template drawn Zipf-like (a few tenants hot, most of them
//! rare: key `k` of `n` drawn as `⌊(n + 1)^u⌋ - 1`, `u` uniform, so that the `k`th most
//! used key is used in proportion to about `1 / k`), every acquire one key's row, written
//! on its first use by that acquire. Once alone, once with a shared vendor dimension taken
//! by every acquire (a tenant's budget under one vendor key, all or nothing). Started as a
//! fleet starts, behind `dynamodb-fidelity` at real DynamoDB's per-item ceilings, which
//! bills every call. It reports grants a second, the keys used, calls, write units and
//! failed writes per grant (per row taken: the floor is one write of each row an acquire
//! takes), acquire p50/p99, and each worker process's resident memory against the
//! documented bound.

use sluice::{Bucket, RefillRate, Sluice};

use crate::Args;
use crate::fanrun::{Target, errors, run};
use crate::report::{latency, shape};

/// The keys of the template.
pub(crate) const KEYS: u64 = 100_000;
/// The documented bound on a client's resident memory however many dimensions it meets,
/// MiB (see `memory_bound`): a worker process holds it, and the load generator's own (its
/// runtime, the AWS SDK, the latencies it records), under it.
const RSS_BOUND_MIB: f64 = 32.0;

/// One key of `template`, drawn Zipf-like from [`KEYS`] by `u`, uniform in `[0, 1)`.
pub(crate) fn draw(template: &str, u: f64) -> String {
    let k = ((KEYS + 1) as f64).powf(u).floor() as u64;
    format!("{template}#@tenant-{}", k.clamp(1, KEYS) - 1)
}

/// This process's resident memory, KiB (0 where `/proc` does not say).
pub(crate) fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The table: the keyed shape alone and with a shared dimension, behind the proxy.
pub(crate) async fn table(args: &Args, target: &Target, sluice: &Sluice) {
    let (p, t) = shape(&args.keys_shape);
    let seconds = args.fan_seconds;
    let suffix = crate::rand_suffix();
    let template = format!("keys{suffix}#rpm");
    let shared = format!("keys{suffix}#shared");
    // Every key and the vendor's dimension ample: the cost of a grant is measured, not a
    // refusal's.
    let ample = Bucket::requests(RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
    sluice
        .put_bucket(&template, ample.clone().keyed())
        .await
        .expect("the template");
    sluice
        .put_bucket(&shared, ample)
        .await
        .expect("the shared bucket");
    println!();
    println!(
        "Keyed buckets: {KEYS} keys of one template drawn Zipf-like, {p}x{t} callers as fast as each is answered, fleet start, {}, {seconds} s (write units and failed writes as the proxy billed them; per row: per row an acquire takes, the floor being one write each):",
        target.label
    );
    println!();
    println!(
        "| dimensions per acquire | grants/s | keys used | calls/grant | write units/grant | per row | failed writes/grant | acquire p50 | acquire p99 | resident memory per process (max, MiB) | bound | errors to callers |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (label, kind, rows) in [
        ("a key", "fan-keys", 1.0),
        (
            "a key + the shared vendor dimension",
            "fan-keys-shared",
            2.0,
        ),
    ] {
        let r = run(args, target, kind, (&template, &shared), (p, t), 0, seconds).await;
        let rep = &r.report;
        let grants = rep.grants.max(1) as f64;
        let (calls, units, failed, used) = match &r.stats {
            Some(stats) => {
                let marked = format!("{}/{template}#@", args.table);
                let used = stats
                    .items()
                    .filter(|(name, _)| name.starts_with(&marked))
                    .count();
                let all = stats.totals();
                (
                    all.requests as f64,
                    all.write_units as f64,
                    all.failed_conditional_writes as f64,
                    used.to_string(),
                )
            }
            None => (
                rep.calls as f64,
                rep.write_milliunits as f64 / 1_000.0,
                0.0,
                "-".to_owned(),
            ),
        };
        let rss = r.rss_kib.iter().copied().max().unwrap_or(0) as f64 / 1_024.0;
        println!(
            "| {label} | {:.0} | {used} | {:.3} | {:.3} | {:.3} | {:.4} | {} | {} | {rss:.1} | {RSS_BOUND_MIB:.0} | {} |",
            rep.grants as f64 / r.seconds.max(1) as f64,
            calls / grants,
            units / grants,
            units / grants / rows,
            failed / grants,
            latency(rep.percentile(50)),
            latency(rep.percentile(99)),
            errors(rep),
        );
    }
}
