//! `sluice apply`: the plan that makes a table match the bucket file
//! (`sluice::__cli::parse` reads the file).

use std::fmt;
use std::path::Path;

use serde_json::{Value, json};
pub(crate) use sluice::__cli::parse;
use sluice::{Bucket, Dimension, LimitType, Sluice, bucket::BucketState, bucket::ShardLimit};

use crate::{Failure, exit, show};

/// How `apply` runs and speaks.
#[derive(Debug, clap::Args)]
pub(crate) struct How {
    /// Show what would change and change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Also delete buckets that are not in the file.
    #[arg(long)]
    pub(crate) prune: bool,
    /// With --dry-run: exit 2 when changes are pending, 0 when none are (and 1 on any
    /// failure, bad input included).
    #[arg(long, requires = "dry_run")]
    pub(crate) detailed_exitcode: bool,
    /// The plan (and what was applied) as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `sluice apply`: the plan from the bucket file, then its writes (none on a dry run).
/// With `--detailed-exitcode`, pending changes end as [`exit::PENDING`] (and `main` makes
/// every failure 1).
pub(crate) async fn run(sluice: &Sluice, file: &Path, how: How) -> Result<(), Failure> {
    let writes = plan_and_apply(sluice, file, &how).await?;
    if how.detailed_exitcode && writes > 0 {
        return Err(Failure {
            code: exit::PENDING,
            message: format!("{writes} change(s) pending"),
            pending: true,
        });
    }
    Ok(())
}

/// Prints the plan, applies it unless on a dry run; the number of writes it holds.
async fn plan_and_apply(sluice: &Sluice, file: &Path, how: &How) -> Result<usize, Failure> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}", file.display())))?;
    let wanted = parse(&text).map_err(|e| Failure::usage(format!("{}: {e}", file.display())))?;
    // A scheduled bucket is compared, and written, with the limits due now.
    let now = sluice.now();
    let wanted: Vec<(Dimension, Bucket)> =
        wanted.into_iter().map(|(d, b)| (d, b.at(now))).collect();
    // A bucket spread over several rows is compared, kept or pruned as one.
    let current = sluice.whole_buckets().await?;
    let changes = plan(&wanted, &current, how.prune);
    let writes = changes.iter().filter(|c| c.writes()).count();
    if !how.json {
        for change in &changes {
            println!("{change}");
            if let Some(next) = change.target().and_then(|b| show::next_change(b, now)) {
                println!("            {next}");
            }
        }
    }
    if !how.dry_run {
        for change in &changes {
            change.apply(sluice).await?;
        }
    }
    if how.json {
        let all: Vec<Value> = changes.iter().map(Change::json).collect();
        let applied = if how.dry_run { 0 } else { writes };
        let plan =
            json!({"dry_run": how.dry_run, "changes": all, "writes": writes, "applied": applied});
        println!("{plan}");
    } else if how.dry_run {
        println!("dry run: {writes} change(s), nothing applied");
    } else {
        println!("applied {writes} change(s)");
    }
    Ok(writes)
}

/// What `apply` does to one dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    Create(Dimension, Bucket),
    Update {
        dimension: Dimension,
        from: Bucket,
        to: Bucket,
    },
    Unchanged(Dimension),
    /// In the table, not in the file: deleted with `--prune`, else kept.
    Extra {
        dimension: Dimension,
        delete: bool,
    },
}

/// The changes that make `current` match `wanted`, in dimension order.
pub(crate) fn plan(
    wanted: &[(Dimension, Bucket)],
    current: &[BucketState],
    prune: bool,
) -> Vec<Change> {
    let mut changes: Vec<(String, Change)> = Vec::new();
    for (dimension, bucket) in wanted {
        let change = match current.iter().find(|s| &s.dimension == dimension) {
            None => Change::Create(dimension.clone(), bucket.clone()),
            Some(state) if &state.bucket == bucket => Change::Unchanged(dimension.clone()),
            Some(state) => Change::Update {
                dimension: dimension.clone(),
                from: state.bucket.clone(),
                to: bucket.clone(),
            },
        };
        changes.push((dimension.to_string(), change));
    }
    for state in current {
        // A key's row the file does not name is the data of a keyed bucket (created by an
        // acquire), not a definition: listed and pruned with its template, never alone. An
        // override is a definition: kept, or pruned, as any other.
        let template = state.dimension.template();
        let key_of_kept = state.dimension.key().is_some()
            && !state.bucket.is_override()
            && (!prune || wanted.iter().any(|(d, _)| *d == template));
        if key_of_kept {
            continue;
        }
        if !wanted.iter().any(|(d, _)| *d == state.dimension) {
            changes.push((
                state.dimension.to_string(),
                Change::Extra {
                    dimension: state.dimension.clone(),
                    delete: prune,
                },
            ));
        }
    }
    changes.sort_by(|a, b| a.0.cmp(&b.0));
    changes.into_iter().map(|(_, c)| c).collect()
}

impl Change {
    /// Makes the change in the table.
    async fn apply(&self, sluice: &Sluice) -> Result<(), sluice::Error> {
        match self {
            Change::Create(d, b)
            | Change::Update {
                dimension: d,
                to: b,
                ..
            } => {
                sluice.put_bucket(d.as_str(), b.clone()).await?;
            }
            Change::Extra {
                dimension,
                delete: true,
            } => {
                sluice.delete_bucket(dimension.as_str()).await?;
            }
            Change::Extra { .. } | Change::Unchanged(_) => {}
        }
        Ok(())
    }

    /// The change for scripts: its dimension, action, and the definitions it moves between.
    fn json(&self) -> Value {
        match self {
            Change::Create(d, b) => {
                json!({"dimension": d.as_str(), "action": "create", "to": show::definition_json(b)})
            }
            Change::Update { from, to, .. } => json!({
                "dimension": self.dimension().as_str(),
                "action": "update",
                "from": show::definition_json(from),
                "to": show::definition_json(to),
            }),
            Change::Unchanged(d) => json!({"dimension": d.as_str(), "action": "unchanged"}),
            Change::Extra { dimension, delete } => json!({
                "dimension": dimension.as_str(),
                "action": if *delete { "delete" } else { "not_in_file" },
            }),
        }
    }

    /// The dimension it changes.
    fn dimension(&self) -> &Dimension {
        match self {
            Change::Create(d, _) | Change::Unchanged(d) => d,
            Change::Update { dimension, .. } | Change::Extra { dimension, .. } => dimension,
        }
    }

    /// The bucket it defines, if it does.
    fn target(&self) -> Option<&Bucket> {
        match self {
            Change::Create(_, b) | Change::Update { to: b, .. } => Some(b),
            Change::Unchanged(_) | Change::Extra { .. } => None,
        }
    }

    /// Whether applying it writes anything.
    pub(crate) fn writes(&self) -> bool {
        match self {
            Change::Create(..) | Change::Update { .. } => true,
            Change::Extra { delete, .. } => *delete,
            Change::Unchanged(_) => false,
        }
    }
}

/// A bucket definition in one line.
pub(crate) struct Describe<'a>(pub(crate) &'a Bucket);

impl fmt::Display for Describe<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{}, capacity {}", b.limit_type(), b.capacity())?;
        if b.limit_type() != LimitType::Concurrent {
            write!(f, ", refill {}", b.refill_rate())?;
        }
        write!(f, ", cost per call {}", b.cost_per_call())?;
        if !b.keeps_leases() {
            f.write_str(", lean")?;
        }
        if !b.reserves().is_empty() {
            write!(f, ", reserves {}", Reserves(b))?;
        }
        if b.shard_limit().is_some() {
            write!(f, ", rows {}", rows(b))?;
        }
        if b.mode() != sluice::Mode::Enforce {
            write!(f, ", {}", b.mode())?;
        }
        if b.schedule().is_some() {
            write!(f, ", schedule {}", Windows(b))?;
        }
        if b.is_keyed() {
            f.write_str(", keyed (a bucket per key)")?;
        }
        Ok(())
    }
}

/// A bucket's scheduled windows in one phrase: `22:00-06:00 UTC capacity=5000
/// refill=500/s`, or `none`.
pub(crate) struct Windows<'a>(pub(crate) &'a Bucket);

impl fmt::Display for Windows<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(schedule) = self.0.schedule() else {
            return f.write_str("none");
        };
        for (i, w) in schedule.windows().iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{}-{} UTC {}", w.from, w.to, w.limits)?;
        }
        Ok(())
    }
}

/// The rows a bucket's definition allows it: `4`, `at most 8`, or `any`.
fn rows(b: &Bucket) -> String {
    match b.shard_limit() {
        Some(ShardLimit::Pinned(n)) => n.to_string(),
        Some(ShardLimit::AtMost(n)) => format!("at most {n}"),
        None => "any".to_owned(),
    }
}

/// A bucket's reserves in one phrase, highest priority first: `interactive=400000,
/// standard=100000`, or `none`.
pub(crate) struct Reserves<'a>(pub(crate) &'a Bucket);

impl fmt::Display for Reserves<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.reserves().is_empty() {
            return f.write_str("none");
        }
        for (i, r) in self.0.reserves().iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{}={}", r.priority, r.tokens)?;
        }
        Ok(())
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Create(d, b) => write!(f, "+ create    {d}: {}", Describe(b)),
            Change::Update { from, to, .. } => {
                let dimension = self.dimension();
                let field = |name, show: fn(&Bucket) -> String| (name, show(from), show(to));
                let fields = [
                    field("type", |b| b.limit_type().to_string()),
                    field("capacity", |b| b.capacity().to_string()),
                    field("refill", |b| b.refill_rate().to_string()),
                    field("cost per call", |b| b.cost_per_call().to_string()),
                    field("lean", |b| (!b.keeps_leases()).to_string()),
                    field("reserves", |b| Reserves(b).to_string()),
                    field("rows", rows),
                    field("mode", |b| b.mode().to_string()),
                    field("schedule", |b| Windows(b).to_string()),
                    field("keyed", |b| b.is_keyed().to_string()),
                ];
                let diffs: Vec<String> = fields
                    .iter()
                    .filter(|(_, a, b)| a != b)
                    .map(|(name, a, b)| format!("{name} {a} -> {b}"))
                    .collect();
                write!(f, "~ update    {dimension}: {}", diffs.join(", "))
            }
            Change::Unchanged(d) => write!(f, "= unchanged {d}"),
            Change::Extra {
                dimension,
                delete: true,
            } => write!(f, "- delete    {dimension}"),
            Change::Extra {
                dimension,
                delete: false,
            } => write!(f, "? not in file {dimension} (kept; --prune deletes it)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice::{RefillRate, clock::UnixMillis};

    const FILE: &str = r#"
["openai#rpm"]
type = "requests"
refill = "500/min"
capacity = 500
max_shards = 8

["openai#tpm"]
type = "tokens"
refill = "2000000/min"
cost_per_call = "1000"
lean = true
shards = 4

["elevenlabs#concurrent"]
type = "concurrent"
capacity = 10
reserves = [{ priority = "interactive", reserve = 2 }]
"#;

    #[test]
    fn the_plan_creates_updates_keeps_and_prunes() {
        let wanted = parse(FILE).unwrap();
        let now = UnixMillis::from_secs(1_800_000_000);
        let state = |d: &str, b: Bucket| BucketState::full(d.parse().unwrap(), b, now);
        let current = vec![
            state(
                "openai#rpm",
                Bucket::requests(RefillRate::per_minute(500)).with_capacity(500),
            ),
            state("elevenlabs#concurrent", Bucket::concurrent(5)),
            state("old#rpm", Bucket::requests(RefillRate::per_second(1))),
        ];
        let lines: Vec<String> = plan(&wanted, &current, false)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            lines,
            [
                "~ update    elevenlabs#concurrent: capacity 5 -> 10, reserves none -> interactive=2",
                "? not in file old#rpm (kept; --prune deletes it)",
                "~ update    openai#rpm: rows any -> at most 8",
                "+ create    openai#tpm: tokens, capacity 2000000, refill 2000000/min, cost per call 1000, lean, rows 4",
            ]
        );
        let pruned = plan(&wanted, &current, true);
        assert!(
            pruned
                .iter()
                .any(|c| c.to_string() == "- delete    old#rpm")
        );
        assert_eq!(pruned.iter().filter(|c| c.writes()).count(), 4);
        // A change of reserves alone is an update, and the plan says which.
        let reserved = vec![state(
            "elevenlabs#concurrent",
            Bucket::concurrent(10).with_reserve("interactive".parse().unwrap(), 3),
        )];
        let only = plan(&wanted[..1], &reserved, false);
        assert_eq!(
            only[0].to_string(),
            "~ update    elevenlabs#concurrent: reserves interactive=3 -> interactive=2"
        );
    }

    #[test]
    fn keys_rows_are_a_keyed_bucket_s_data_pruned_only_with_it() {
        let wanted = parse(
            r#"
["ingest#rpm"]
type = "requests"
refill = "50/s"
keyed = true

["ingest#rpm#@big-customer"]
type = "requests"
refill = "500/s"
"#,
        )
        .unwrap();
        assert!(wanted[0].1.is_keyed());
        let now = UnixMillis::from_secs(1_800_000_000);
        let state = |d: &str, b: Bucket| BucketState::full(d.parse().unwrap(), b, now);
        let per_key = Bucket::requests(RefillRate::per_second(50));
        let current = vec![
            state("ingest#rpm", per_key.clone()),
            state("ingest#rpm#@t1", per_key.clone()),
            state("gone#rpm", per_key.clone().keyed()),
            state("gone#rpm#@t1", per_key.clone()),
            state("ingest#rpm#@old-customer", wanted[1].1.clone()),
        ];
        assert!(
            wanted[1].1.is_override(),
            "a key's table is its own definition"
        );
        let lines = |prune| -> Vec<String> {
            plan(&wanted, &current, prune)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(
            lines(false),
            [
                "? not in file gone#rpm (kept; --prune deletes it)",
                "~ update    ingest#rpm: keyed false -> true",
                "+ create    ingest#rpm#@big-customer: requests, capacity 30000, refill 500/s, cost per call 1",
                "? not in file ingest#rpm#@old-customer (kept; --prune deletes it)",
            ]
        );
        assert_eq!(
            lines(true),
            [
                "- delete    gone#rpm",
                "- delete    gone#rpm#@t1",
                "~ update    ingest#rpm: keyed false -> true",
                "+ create    ingest#rpm#@big-customer: requests, capacity 30000, refill 500/s, cost per call 1",
                "- delete    ingest#rpm#@old-customer",
            ]
        );
    }
}
