//! Fan-out: many processes of one caller each (or a few), every caller holding its grant
//! for a while (the vendor call) before releasing it and asking again, the way many
//! Lambdas and containers share one vendor key. Lane batching cannot help here: each
//! caller's grant is a write of the bucket item of its own.
//!
//! Each run reports grants per second against the demand (callers / hold) and, behind
//! `dynamodb-fidelity`, against one item's write ceiling, with the write units and failed
//! conditional writes the proxy billed on the bucket items and on every row, per grant.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use sluice::store::StoreError;
use sluice::{Acquire, Config, Error, clock::Clock as _, clock::SystemClock, clock::UnixMillis};

use crate::Args;
use crate::worker::{Costs, store};

/// The modes of the fan-out runs: (name, kind).
pub(crate) const MODES: [(&str, &str); 4] = [
    ("fast path (the default)", "fan-fast"),
    ("lean mode", "fan-lean"),
    ("fast path, rpm + tpm", "fan-pair"),
    ("concurrent(64)", "fan-slots"),
];
/// The floor at the same pace: a bare conditional `UpdateItem` per grant.
pub(crate) const FLOOR: (&str, &str) = ("UpdateItem floor", "fan-floor");
/// The slots of the `concurrent` bucket.
pub(crate) const SLOTS: u64 = 64;
const FLOOR_KEY: &str = "loadgen#fan-floor";
/// How long a `fan-wait` caller waits for a grant at most.
pub(crate) const WAIT_AT_MOST: Duration = Duration::from_secs(10);
/// How late past its deadline a wait may return before it counts as over it: the time
/// of one answer from the store.
const WAIT_LATE_BY: Duration = Duration::from_millis(50);

/// What one fan-out worker process measured.
#[derive(Debug, Default)]
pub(crate) struct FanReport {
    /// Grants heard by the deadline.
    pub(crate) grants: u64,
    /// Tokens of the limited dimension granted by the deadline, and after it.
    pub(crate) tokens: u64,
    pub(crate) late_tokens: u64,
    /// RetryIn answers (denials and back-pressure alike).
    pub(crate) retry_ins: u64,
    /// Errors callers heard, by kind (`release: …` for releases).
    pub(crate) errors: BTreeMap<String, u64>,
    /// Write units the store reported, in thousandths (all rows; DynamoDB Local reports one
    /// per write).
    pub(crate) write_milliunits: u64,
    /// Calls the store sent.
    pub(crate) calls: u64,
    /// Waits that returned after their deadline (`fan-wait`).
    pub(crate) over_deadline: u64,
    /// Each wait, from the first ask to the grant (`fan-wait`), microseconds.
    pub(crate) waits_us: Vec<u64>,
    pub(crate) latencies_us: Vec<u64>,
    /// Each grant: when it was heard (unix ms) and how long its acquire took (ms).
    pub(crate) granted_at: Vec<(i64, u64)>,
    /// Each slot: when it was granted and when its release returned (unix ms).
    pub(crate) held: Vec<(i64, i64)>,
}

fn list<T>(items: &[T], f: impl Fn(&T) -> String) -> String {
    if items.is_empty() {
        return "-".to_owned();
    }
    items.iter().map(f).collect::<Vec<_>>().join(",")
}

fn pairs(text: &str, sep: char) -> Vec<(i64, i64)> {
    text.split(',')
        .filter_map(|p| {
            let (a, b) = p.split_once(sep)?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

impl FanReport {
    pub(crate) fn line(&self) -> String {
        let errors: Vec<(String, u64)> = self.errors.iter().map(|(k, v)| (k.clone(), *v)).collect();
        format!(
            "fan {} {} {} {} {} {} {} {} {} {} {} {}",
            self.grants,
            self.tokens,
            self.late_tokens,
            self.retry_ins,
            self.write_milliunits,
            self.calls,
            self.over_deadline,
            list(&self.waits_us, u64::to_string),
            list(&errors, |(k, v)| format!("{}={v}", k.replace(' ', "_"))),
            list(&self.latencies_us, u64::to_string),
            list(&self.granted_at, |(t, l)| format!("{t}:{l}")),
            list(&self.held, |(a, b)| format!("{a}:{b}")),
        )
    }

    pub(crate) fn parse(line: &str) -> Option<FanReport> {
        let mut f = line.strip_prefix("fan ")?.split(' ');
        let mut num = || f.next()?.parse::<u64>().ok();
        let (grants, tokens, late_tokens, retry_ins, write_milliunits, calls, over_deadline) =
            (num()?, num()?, num()?, num()?, num()?, num()?, num()?);
        let waits_us = f
            .next()?
            .split(',')
            .filter_map(|v| v.parse().ok())
            .collect();
        let errors = f
            .next()?
            .split(',')
            .filter_map(|e| {
                let (k, v) = e.split_once('=')?;
                Some((k.replace('_', " "), v.parse().ok()?))
            })
            .collect();
        let latencies_us = f
            .next()?
            .split(',')
            .filter_map(|v| v.parse().ok())
            .collect();
        let granted_at = pairs(f.next()?, ':')
            .into_iter()
            .map(|(t, l)| (t, l.unsigned_abs()))
            .collect();
        let held = pairs(f.next()?, ':');
        Some(FanReport {
            grants,
            tokens,
            late_tokens,
            retry_ins,
            errors,
            write_milliunits,
            calls,
            over_deadline,
            waits_us,
            latencies_us,
            granted_at,
            held,
        })
    }

    pub(crate) fn merge(&mut self, other: FanReport) {
        self.grants += other.grants;
        self.tokens += other.tokens;
        self.late_tokens += other.late_tokens;
        self.retry_ins += other.retry_ins;
        self.write_milliunits += other.write_milliunits;
        self.calls += other.calls;
        self.over_deadline += other.over_deadline;
        self.waits_us.extend(other.waits_us);
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        self.latencies_us.extend(other.latencies_us);
        self.granted_at.extend(other.granted_at);
        self.held.extend(other.held);
    }

    pub(crate) fn percentile(&self, p: usize) -> Duration {
        percentile(&self.latencies_us, p)
    }

    /// The `p`th percentile of the waits (`fan-wait`).
    pub(crate) fn wait_percentile(&self, p: usize) -> Duration {
        percentile(&self.waits_us, p)
    }

    /// The most slots held at once, by the intervals from grant to release.
    pub(crate) fn most_held(&self) -> usize {
        let mut edges: Vec<(i64, i32)> = self
            .held
            .iter()
            .flat_map(|(a, b)| [(*a, 1), (*b, -1)])
            .collect();
        // At one instant, a release before a grant: an interval is held up to its end.
        edges.sort_unstable();
        let (mut now, mut most) = (0i32, 0i32);
        for (_, d) in edges {
            now += d;
            most = most.max(now);
        }
        most.max(0) as usize
    }

    /// The most any window of grants exceeds `capacity + rate × window`, a grant's window
    /// stretched back by its own acquire's time (it may have applied any time during it):
    /// `0` when no window over-granted.
    pub(crate) fn worst_window(&self, capacity: f64, per_second: f64) -> f64 {
        let mut at = self.granted_at.clone();
        at.sort_unstable();
        let mut worst = 0.0f64;
        for i in 0..at.len() {
            for (j, (t, _)) in at.iter().enumerate().skip(i) {
                let window_ms = (t - at[i].0 + at[i].1 as i64).max(0) as f64;
                let allowed = capacity + per_second * window_ms / 1_000.0;
                worst = worst.max((j - i + 1) as f64 - allowed);
            }
        }
        worst
    }
}

/// The `p`th percentile of `micros`.
fn percentile(micros: &[u64], p: usize) -> Duration {
    let mut l = micros.to_vec();
    l.sort_unstable();
    l.get((l.len().saturating_sub(1)) * p / 100)
        .map_or(Duration::ZERO, |us| Duration::from_micros(*us))
}

/// What a caller heard, as a kind for the table.
fn kind(e: &Error) -> &'static str {
    match e {
        Error::Store(StoreError::Throttled { .. }) => "throttled",
        Error::Store(StoreError::TransactionConflict { .. }) => "transaction conflict",
        Error::Store(StoreError::Timeout { .. }) => "timeout",
        Error::Store(StoreError::Unavailable { .. } | StoreError::Unreachable { .. }) => {
            "unavailable"
        }
        Error::Store(_) => "store",
        Error::Contention { .. } => "contention",
        Error::Shards(_) => "shards",
        Error::UnknownDimension { .. } => "unknown dimension",
        Error::CostExceedsCapacity { .. } | Error::CostExceedsShare { .. } => "cost",
        _ => "other",
    }
}

/// A fan-out worker: `args.tasks` callers, each acquiring, holding `args.hold_ms`,
/// releasing, until `args.seconds` have passed.
pub(crate) async fn child(args: Args, kind_of_run: String) {
    let store = store(&args).await;
    let sluice = sluice::SluiceBuilder::from_config(Config {
        caller: "loadgen-fan".to_owned(),
        sharding: sluice::Sharding {
            item_write_ceiling: (args.item_ceiling > 0).then_some(args.item_ceiling),
            max_shards: if args.max_shards > 0 {
                args.max_shards
            } else {
                sluice::config::MAX_SHARDS
            },
        },
        ..Config::default()
    })
    .store(store.clone())
    .build()
    .expect("client");
    let start = UnixMillis::new(args.start_ms);
    let now = SystemClock.now();
    if start > now {
        tokio::time::sleep(start.saturating_since(now)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let hold = Duration::from_millis(args.hold_ms);
    let mut tasks = Vec::new();
    for task in 0..args.tasks {
        let (sluice, client) = (sluice.clone(), store.client().clone());
        let (table, kind_of_run) = (args.table.clone(), kind_of_run.clone());
        let (rpm, tpm) = (args.dimension.clone(), args.tokens_dimension.clone());
        let mut costs = Costs::seeded(task as u64);
        tasks.push(tokio::spawn(async move {
            let mut r = FanReport::default();
            while Instant::now() < deadline {
                if kind_of_run == "fan-floor" {
                    floor_call(&client, &table, &mut r, deadline).await;
                    tokio::time::sleep(hold).await;
                    continue;
                }
                let request = if kind_of_run == "fan-pair" {
                    Acquire::with_cost(rpm.as_str(), 1).and_cost(tpm.as_str(), costs.next())
                } else if kind_of_run == "fan-keys" {
                    Acquire::new(crate::keys::draw(&rpm, costs.unit()).as_str())
                } else if kind_of_run == "fan-keys-shared" {
                    Acquire::new(crate::keys::draw(&rpm, costs.unit()).as_str()).and(tpm.as_str())
                } else {
                    Acquire::new(rpm.as_str())
                };
                let started = Instant::now();
                let answer = if kind_of_run == "fan-wait" {
                    let answer = sluice.acquire_within(request, WAIT_AT_MOST).await;
                    let waited = started.elapsed();
                    if waited > WAIT_AT_MOST + WAIT_LATE_BY {
                        r.over_deadline += 1;
                    }
                    if answer.is_ok() {
                        r.waits_us.push(waited.as_micros() as u64);
                    }
                    answer
                } else {
                    sluice.acquire(request).await
                };
                match answer {
                    Ok(lease) => {
                        let took = started.elapsed();
                        let granted = SystemClock.now().as_millis();
                        r.latencies_us.push(took.as_micros() as u64);
                        r.granted_at.push((granted, took.as_millis() as u64));
                        if Instant::now() <= deadline {
                            r.grants += 1;
                            r.tokens += 1;
                        } else {
                            r.late_tokens += 1;
                        }
                        tokio::time::sleep(hold).await;
                        if let Err(e) = lease.release().await {
                            *r.errors
                                .entry(format!("release: {}", kind(&e)))
                                .or_default() += 1;
                        }
                        if kind_of_run == "fan-slots" {
                            r.held.push((granted, SystemClock.now().as_millis()));
                        }
                    }
                    Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => {
                        r.retry_ins += 1;
                        tokio::time::sleep(d).await;
                    }
                    Err(e) => {
                        *r.errors.entry(kind(&e).to_owned()).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            r
        }));
    }
    let mut total = FanReport::default();
    for t in tasks {
        total.merge(t.await.expect("task"));
    }
    let stats = store.stats();
    total.write_milliunits = stats.write_milliunits;
    // The floor's calls are its own (`floor_call`), sent outside the store.
    total.calls += stats.calls;
    println!("{}", total.line());
    println!("rss {}", crate::keys::rss_kib());
}

/// One write of the floor: a bare conditional `UpdateItem`, waited out on a throttle as a
/// caller of sluice would be.
async fn floor_call(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    r: &mut FanReport,
    deadline: Instant,
) {
    let started = Instant::now();
    r.calls += 1;
    let out = client
        .update_item()
        .table_name(table)
        .key("vendor_dimension", AttributeValue::S(FLOOR_KEY.to_owned()))
        .update_expression("ADD #n :one")
        .condition_expression("attribute_exists(vendor_dimension)")
        .expression_attribute_names("#n", "n")
        .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
        .send()
        .await;
    match out {
        Ok(_) => {
            let took = started.elapsed();
            r.latencies_us.push(took.as_micros() as u64);
            r.granted_at
                .push((SystemClock.now().as_millis(), took.as_millis() as u64));
            if Instant::now() <= deadline {
                r.grants += 1;
            }
        }
        Err(e) => {
            let throttled = e.as_service_error().is_some_and(|s| {
                s.is_provisioned_throughput_exceeded_exception()
                    || aws_sdk_dynamodb::error::ProvideErrorMetadata::code(s)
                        == Some("ThrottlingException")
            });
            if throttled {
                r.retry_ins += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            } else {
                *r.errors.entry("floor".to_owned()).or_default() += 1;
            }
        }
    }
}

/// The floor's item, created once.
pub(crate) async fn create_floor(client: &aws_sdk_dynamodb::Client, table: &str) {
    client
        .put_item()
        .table_name(table)
        .item("vendor_dimension", AttributeValue::S(FLOOR_KEY.to_owned()))
        .item("n", AttributeValue::N("0".to_owned()))
        .send()
        .await
        .expect("floor item");
}

/// The floor's key, for the proxy's counters.
pub(crate) fn floor_key() -> &'static str {
    FLOOR_KEY
}
