//! What the CLI prints: tables for people, JSON for scripts.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};
use sluice::{
    Bucket, Tokens, admin::ReconcileReport, admin::Snapshot, bucket::BucketState, bucket::Reserve,
};

/// A decimal as a JSON number (exact decimal text parsed once, for scripts).
fn number(text: String) -> Value {
    text.parse::<serde_json::Number>()
        .map(Value::Number)
        .unwrap_or(Value::String(text))
}

pub(crate) fn tokens(t: Tokens) -> Value {
    number(t.to_string())
}

fn reserves_json(reserves: &[Reserve]) -> Value {
    reserves
        .iter()
        .map(|r| json!({"priority": r.priority.as_str(), "tokens": tokens(r.tokens)}))
        .collect()
}

/// What each priority may take now: the listed ones, highest first, then `*` for every
/// priority the bucket does not list (none when it keeps no reserves).
fn by_priority(s: &Snapshot) -> Vec<(String, Tokens)> {
    if s.reserves.is_empty() {
        return Vec::new();
    }
    s.reserves
        .iter()
        .map(|r| (r.priority.to_string(), s.available_to(Some(&r.priority))))
        .chain([("*".to_owned(), s.available_to_unlisted())])
        .collect()
}

/// A bucket's definition (no state): what `apply` compares.
pub(crate) fn definition_json(b: &Bucket) -> Value {
    json!({
        "type": b.limit_type().as_str(),
        "capacity": tokens(b.capacity()),
        "refill": b.refill_rate().to_string(),
        "refill_per_second": number(b.refill_rate().tokens_per_second()),
        "cost_per_call": tokens(b.cost_per_call()),
        "lean": !b.keeps_leases(),
        "reserves": reserves_json(b.reserves()),
        "mode": b.mode().as_str(),
        "schedule": b.schedule().map(ToString::to_string),
    })
}

pub(crate) fn bucket_json(b: &BucketState) -> Value {
    json!({
        "dimension": b.dimension.as_str(),
        "type": b.bucket.limit_type().as_str(),
        "capacity": tokens(b.bucket.capacity()),
        "tokens": tokens(b.tokens),
        "refill": b.bucket.refill_rate().to_string(),
        "refill_per_second": number(b.bucket.refill_rate().tokens_per_second()),
        "cost_per_call": tokens(b.bucket.cost_per_call()),
        "lean": !b.bucket.keeps_leases(),
        "reserves": reserves_json(b.bucket.reserves()),
        "burst": b.burst.map(tokens),
        "last_refill_at": number(b.last_refill_at.to_string()),
        "version": b.version,
        "shards": b.shards,
        "mode": b.bucket.mode().as_str(),
        "shadow_refused": b.shadow_refused(),
        "schedule": b.bucket.schedule().map(ToString::to_string),
    })
}

pub(crate) fn snapshot_json(s: &Snapshot) -> Value {
    json!({
        "dimension": s.dimension.as_str(),
        "type": s.limit_type.as_str(),
        "capacity": tokens(s.capacity),
        "burst": s.burst.map(tokens),
        "available": tokens(s.available),
        "refill": s.refill_rate.to_string(),
        "refill_per_second": number(s.refill_rate.tokens_per_second()),
        "cost_per_call": tokens(s.cost_per_call),
        "lean": s.lean,
        "reserves": reserves_json(&s.reserves),
        "available_by_priority": by_priority(s)
            .into_iter()
            .map(|(p, t)| (p, tokens(t)))
            .collect::<serde_json::Map<_, _>>(),
        "live_leases": s.live_leases,
        "leased": tokens(s.leased),
        "expired_leases": s.expired_leases,
        "time_to_full_ms": s.time_to_full.map(|d| d.as_millis() as u64),
        "version": s.version,
        "shards": s.shards,
        "mode": s.mode.as_str(),
        "shadow_refused": s.shadow_refused,
        "next_change": s.next_change.as_ref().map(|(at, limits)| json!({
            "at": utc(*at),
            "capacity": tokens(limits.capacity),
            "refill": limits.refill.to_string(),
            "reserves": reserves_json(&limits.reserves),
        })),
    })
}

pub(crate) fn report_json(r: &ReconcileReport) -> Value {
    json!({
        "leases_seen": r.leases_seen,
        "leases_restored": r.leases_restored,
        "tokens_restored": tokens(r.tokens_restored),
        "leases_skipped": r.leases_skipped,
        "leases_in_grace": r.leases_in_grace,
        "buckets_checked": r.buckets_checked,
        "buckets_healed": r.buckets_healed,
        "tokens_healed": tokens(r.tokens_healed),
        "buckets_busy": r.buckets_busy,
        "buckets_not_raised": r.buckets_not_raised,
        "errors": r.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
    })
}

/// Left-aligned columns, two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            let _ = write!(text, "{cell:<width$}  ", width = widths[i]);
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut out, &mut header.iter().copied());
    for row in rows {
        line(&mut out, &mut row.iter().map(String::as_str));
    }
    out
}

pub(crate) fn buckets_table(buckets: &[BucketState]) -> String {
    let rows: Vec<Vec<String>> = buckets
        .iter()
        .map(|b| {
            vec![
                b.dimension.to_string(),
                b.bucket.limit_type().to_string(),
                b.bucket.capacity().to_string(),
                b.bucket.refill_rate().to_string(),
                b.bucket.cost_per_call().to_string(),
                b.version.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "DIMENSION",
            "TYPE",
            "CAPACITY",
            "REFILL",
            "COST/CALL",
            "VERSION",
        ],
        &rows,
    )
}

pub(crate) fn bucket_text(b: &BucketState) -> String {
    format!(
        "dimension       {}\ntype            {}\ncapacity        {}\ntokens          {} (at {})\nrefill          {}\ncost per call   {}\nlean            {}\nreserves        {}\nburst           {}\nversion         {}\nshards          {}\nmode            {} ({} would refuse)\n",
        b.dimension,
        b.bucket.limit_type(),
        b.bucket.capacity(),
        b.tokens,
        b.last_refill_at,
        b.bucket.refill_rate(),
        b.bucket.cost_per_call(),
        if b.bucket.keeps_leases() { "no" } else { "yes" },
        crate::apply::Reserves(&b.bucket),
        b.burst
            .map_or_else(|| "capacity".to_owned(), |t| t.to_string()),
        b.version,
        b.shards,
        b.bucket.mode(),
        b.shadow_refused()
    )
}

pub(crate) fn status_table(snapshots: &[Snapshot]) -> String {
    // The column of what each priority may take, only when some bucket keeps reserves;
    // the count of rows, only when some bucket is spread over several.
    let by_priority_column = snapshots.iter().any(|s| !s.reserves.is_empty());
    let rows_column = snapshots.iter().any(|s| s.shards > 1);
    // What shadow mode would have refused, only when some bucket is or was in it.
    let mode_column = snapshots
        .iter()
        .any(|s| s.mode != sluice::Mode::Enforce || s.shadow_refused > 0);
    let schedule_column = snapshots.iter().any(|s| s.next_change.is_some());
    let rows: Vec<Vec<String>> = snapshots
        .iter()
        .map(|s| {
            let mut row = vec![
                s.dimension.to_string(),
                s.limit_type.to_string(),
                match s.burst {
                    // What the vendor takes at once, learned from its answers.
                    Some(burst) => format!("{} (burst {burst})", s.capacity),
                    None => s.capacity.to_string(),
                },
                s.available.to_string(),
                s.refill_rate.to_string(),
                if s.lean && s.live_leases == 0 && s.expired_leases == 0 {
                    // No lease rows by design: say so rather than a misleading 0.
                    "lean".to_owned()
                } else if s.expired_leases > 0 {
                    format!("{} (+{} expired)", s.live_leases, s.expired_leases)
                } else {
                    s.live_leases.to_string()
                },
                match s.time_to_full {
                    Some(Duration::ZERO) => "full".to_owned(),
                    Some(d) => humantime::format_duration(millis(d)).to_string(),
                    None => "on release".to_owned(),
                },
            ];
            if rows_column {
                row.push(s.shards.to_string());
            }
            row.extend(adoption_columns(s, mode_column, schedule_column));
            if by_priority_column {
                row.push(
                    by_priority(s)
                        .iter()
                        .map(|(p, t)| format!("{p}={t}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                );
            }
            row
        })
        .collect();
    let mut header = vec![
        "DIMENSION",
        "TYPE",
        "CAPACITY",
        "AVAILABLE",
        "REFILL",
        "LEASES",
        "TIME TO FULL",
    ];
    let optional = [
        (rows_column, "ROWS"),
        (mode_column, "MODE"),
        (schedule_column, "NEXT CHANGE"),
        (by_priority_column, "BY PRIORITY"),
    ];
    header.extend(
        optional
            .iter()
            .filter(|(shown, _)| *shown)
            .map(|(_, name)| name),
    );
    table(&header, &rows)
}

/// The status columns of shadow mode and schedules, those shown.
fn adoption_columns(s: &Snapshot, mode: bool, schedule: bool) -> Vec<String> {
    let mut columns = Vec::new();
    if mode {
        columns.push(format!("{} ({} would refuse)", s.mode, s.shadow_refused));
    }
    if schedule {
        columns.push(s.next_change.as_ref().map_or_else(
            || "none".to_owned(),
            |(at, limits)| format!("{}: {limits}", utc(*at)),
        ));
    }
    columns
}

/// When a scheduled bucket's limits change next, and to what: `next change
/// 2026-11-26T22:00:00Z: capacity=5000 refill=500/s`; `None` for a bucket with no schedule
/// (or one whose limits never change).
pub(crate) fn next_change(b: &Bucket, now: sluice::clock::UnixMillis) -> Option<String> {
    let (at, limits) = b.schedule()?.next_change(now)?;
    Some(format!("next change {}: {limits}", utc(at)))
}

/// An instant as RFC 3339, UTC, to the second.
pub(crate) fn utc(at: sluice::clock::UnixMillis) -> String {
    let since = Duration::from_millis(u64::try_from(at.as_millis()).unwrap_or(0));
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + since).to_string()
}

/// A duration cut to whole milliseconds, for display.
pub(crate) fn millis(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}
