//! Clock skew between hosts, on DynamoDB Local: 4 processes whose clocks are off by
//! -2 s, -0.7 s, +0.7 s and +2 s share a `concurrent` bucket and a `requests` bucket, each
//! client allowing for 4 s between any two clocks (`clock_skew`). Slots are held for up
//! to past their deadline, and the two processes whose clocks are furthest apart each leak
//! one (its holder "crashes"), so expired leases are given back by clients whose clocks
//! disagree with their holders'. A leaked slot is out of use until its expiry and the
//! margin have passed on a reader's clock (5 to 9 s here): two leaks at most leave half the
//! slots for the whole run, enough uses for the count to tell.
//!
//! Measured on the true clock (all processes run on one host): slot bodies running at once
//! never outnumber the slots (a leaked lease counts as in use until its expiry by its
//! holder's clock), and the requests granted in any window stay within
//! `capacity + rate × (window + 4 s)`. Then the same run with no margin (`clock_skew` 0)
//! shows what the margin prevents: slots handed on while their bodies still run.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use crate::dynamo;
use crate::faults;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo::worker::{self, Start, Worker};
use faults::SkewedClock;
use rand::RngExt as _;
use sluice::{
    Acquire, Bucket, Config, DynamoStore, Error, RefillRate, Sluice, SluiceBuilder,
    clock::Clock as _, clock::SystemClock,
};

const SLOTS: u64 = 4;
const RPM_CAPACITY: u64 = 20;
const RPM_PER_SECOND: u64 = 40;
/// The clocks' offsets, one process each.
const OFFSETS_MS: [i64; 4] = [-2_000, -700, 700, 2_000];
/// The most two of those clocks disagree.
const SPREAD: Duration = Duration::from_secs(4);
/// What every client allows for: the spread, and a little for a body to be stopped.
const MARGIN: Duration = Duration::from_millis(4_200);
const TTL: Duration = Duration::from_secs(1);
/// The slots' TTL in the run with no margin: long enough that a leaked slot given back
/// early shows on a loaded server too (the hand-over must come within it to be early).
const CONTROL_TTL: Duration = Duration::from_secs(3);
const SLOT_TASKS: usize = 4;
const RPM_TASKS: usize = 2;
const RUN: Duration = Duration::from_secs(8);
const UNPROTECTED_RUN: Duration = Duration::from_secs(4);

pub(crate) fn main() {
    match worker::start(tracing::Level::ERROR) {
        Start::Child(runtime, a) => {
            let offset_ms = a[4].parse().unwrap();
            let margin = Duration::from_millis(a[5].parse().unwrap());
            runtime.block_on(child(&a[..4], offset_ms, margin));
        }
        Start::Parent(runtime) => {
            worker::report("skewed clocks", runtime.block_on(parent()));
        }
    }
}

/// The true time: every process runs on this host and reads the same system clock.
fn true_now() -> i64 {
    SystemClock.now().as_millis()
}

fn client(endpoint: &str, table: &str, caller: &str, offset_ms: i64, margin: Duration) -> Sluice {
    SluiceBuilder::from_config(Config {
        caller: caller.to_owned(),
        clock_skew: margin,
        slot_poll: Duration::from_millis(50),
        ..Config::default()
    })
    .store(DynamoStore::new(dynamo::client(endpoint), table))
    .clock(SkewedClock {
        inner: SystemClock,
        offset_ms,
    })
    .build()
    .unwrap()
}

/// Records when a slot's body stops, whether it finished or was cut at its deadline.
struct Stopped(Arc<Mutex<Option<i64>>>);

impl Drop for Stopped {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(true_now());
    }
}

/// Takes slots until `deadline` (true time); returns the true intervals they were in use.
async fn take_slots(
    sluice: Sluice,
    dimension: String,
    offset_ms: i64,
    deadline: i64,
    leak_all: bool,
    leak_one: Arc<AtomicBool>,
) -> Vec<String> {
    let ttl = if leak_all { CONTROL_TTL } else { TTL };
    let mut used = Vec::new();
    while true_now() < deadline {
        let lease = match sluice
            .acquire_within(Acquire::new(dimension.as_str()).ttl(ttl), ttl)
            .await
        {
            Ok(lease) => lease,
            Err(Error::RetryIn(_)) => continue,
            Err(e) => panic!("a slot acquire saw neither a grant nor a RetryIn: {e}"),
        };
        let start = true_now();
        // In the run with no margin, the process whose clock is furthest behind leaks every
        // slot it takes: whoever gives them back gives them back early, so what the run
        // shows does not hang on who won which slot. Otherwise a process with a leak to
        // make leaks one slot, at random among its first.
        let leak =
            leak_all || (rand::rng().random_ratio(1, 4) && leak_one.swap(false, Ordering::Relaxed));
        if leak {
            // The holder dies: its slot is in use until the lease expires by its clock.
            used.push(format!(
                "slot {start} {}",
                lease.expires_at().as_millis() - offset_ms
            ));
            std::mem::forget(lease);
            continue;
        }
        // Up to half again past the deadline: such bodies are cut there.
        let hold = Duration::from_millis(rand::rng().random_range(50..1_500));
        let stopped = Arc::new(Mutex::new(None));
        let mark = Stopped(stopped.clone());
        let _ = lease
            .run(ttl, async move {
                let _mark = mark;
                tokio::time::sleep(hold).await;
            })
            .await;
        let end = stopped.lock().unwrap().expect("the body stopped");
        used.push(format!("slot {start} {end}"));
    }
    used
}

/// Takes requests until `deadline`; returns when each acquire started and returned.
async fn take_requests(sluice: Sluice, dimension: String, deadline: i64) -> Vec<String> {
    let mut granted = Vec::new();
    while true_now() < deadline {
        let asked = true_now();
        match sluice.acquire(dimension.as_str()).await {
            Ok(lease) => {
                granted.push(format!("rpm {asked} {}", true_now()));
                lease.release().await.unwrap();
            }
            Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => tokio::time::sleep(d).await,
            Err(e) => panic!("a request acquire saw neither a grant nor a RetryIn: {e}"),
        }
    }
    granted
}

async fn child(args: &[String], offset_ms: i64, margin: Duration) {
    let [endpoint, table, slots, rpm] = args else {
        panic!("child arguments: {args:?}")
    };
    let caller = format!("skewed{offset_ms:+}");
    let sluice = client(endpoint, table, &caller, offset_ms, margin);
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let deadline: i64 = line.trim().strip_prefix("go ").unwrap().parse().unwrap();
    let mut tasks = Vec::new();
    let furthest = offset_ms.abs() == OFFSETS_MS[0].abs();
    let leak_one = Arc::new(AtomicBool::new(furthest && margin > Duration::ZERO));
    for _ in 0..SLOT_TASKS {
        let (s, d) = (sluice.clone(), slots.clone());
        let leak_all = margin.is_zero() && offset_ms == OFFSETS_MS[0];
        tasks.push(tokio::spawn(take_slots(
            s,
            d,
            offset_ms,
            deadline,
            leak_all,
            leak_one.clone(),
        )));
    }
    if margin > Duration::ZERO {
        for _ in 0..RPM_TASKS {
            let (s, d) = (sluice.clone(), rpm.clone());
            tasks.push(tokio::spawn(take_requests(s, d, deadline)));
        }
    }
    for task in tasks {
        for record in task.await.unwrap() {
            println!("{record}");
        }
    }
    println!("done");
    std::io::stdout().flush().unwrap();
}

/// The most slot bodies in use at once, by the true clock (one ending as another starts
/// at the same millisecond do not overlap).
fn most_at_once(intervals: &[(i64, i64)]) -> usize {
    let mut events: Vec<(i64, i32)> = intervals
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    most as usize
}

struct Outcome {
    slots: Vec<(i64, i64)>,
    requests: Vec<(i64, i64)>,
}

async fn run(endpoint: &str, table: &str, margin: Duration, length: Duration) -> Outcome {
    let tag = format!("{:08x}", rand::random::<u32>());
    let (slots, rpm) = (format!("skew{tag}#concurrent"), format!("skew{tag}#rpm"));
    let admin = client(endpoint, table, "parent", 0, margin);
    admin
        .put_bucket(&slots, Bucket::concurrent(SLOTS))
        .await
        .unwrap();
    admin
        .put_bucket(
            &rpm,
            Bucket::requests(RefillRate::per_second(RPM_PER_SECOND)).with_capacity(RPM_CAPACITY),
        )
        .await
        .unwrap();
    let margin_ms = margin.as_millis().to_string();
    let mut workers: Vec<Worker> = OFFSETS_MS
        .iter()
        .map(|offset| {
            let offset = offset.to_string();
            Worker::spawn(
                &format!("skewed{offset}"),
                &[endpoint, table, &slots, &rpm, &offset, &margin_ms],
            )
        })
        .collect();
    let (lines, _, _) =
        tokio::task::spawn_blocking(move || worker::run_together(&mut workers, length))
            .await
            .unwrap();
    let mut outcome = Outcome {
        slots: Vec::new(),
        requests: Vec::new(),
    };
    for line in lines {
        let mut parts = line.split(' ');
        let (kind, a, b) = (parts.next(), parts.next(), parts.next());
        let pair = (a.unwrap().parse().unwrap(), b.unwrap().parse().unwrap());
        match kind {
            Some("slot") => outcome.slots.push(pair),
            Some("rpm") => outcome.requests.push(pair),
            _ => panic!("unexpected line {line:?}"),
        }
    }
    outcome
}

async fn parent() -> Option<()> {
    let _store = dynamo::store().await?;
    let endpoint = dynamo::endpoint()?;
    let table = dynamo::table_name();

    let mut kept = run(&endpoint, table, MARGIN, RUN).await;
    let most = most_at_once(&kept.slots);
    assert!(
        kept.slots.len() > 10,
        "too few slots to tell: {}",
        kept.slots.len()
    );
    assert!(
        most <= SLOTS as usize,
        "{most} slot bodies ran at once on {SLOTS} slots"
    );
    assert!(
        kept.requests.len() > RPM_CAPACITY as usize,
        "too few requests"
    );
    let slack = SPREAD.as_millis() as i64;
    if let Some(excess) =
        dynamo::over_granted(&mut kept.requests, RPM_CAPACITY, RPM_PER_SECOND, slack)
    {
        panic!("requests over-granted: {excess}");
    }

    let unprotected = run(&endpoint, table, Duration::ZERO, UNPROTECTED_RUN).await;
    let most_unprotected = most_at_once(&unprotected.slots);
    assert!(
        most_unprotected > SLOTS as usize,
        "without a margin the run should hand slots on early; at most {most_unprotected} at once"
    );
    eprintln!(
        "clocks {OFFSETS_MS:?} ms, margin {MARGIN:?}: {} slot uses, at most {most} at once on {SLOTS}; {} requests within capacity + rate x (window + {SPREAD:?}); with no margin, {most_unprotected} at once",
        kept.slots.len(),
        kept.requests.len(),
    );
    Some(())
}
