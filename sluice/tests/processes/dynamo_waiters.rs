//! Two OS processes share a `concurrent` bucket on DynamoDB Local: a holder takes every
//! slot and frees them one at a time at random moments; a waiter, in another process,
//! waits for slots with `acquire_within`. Every slot freed reaches the waiter within the
//! documented bound (the slot poll interval plus a read and a write), and the live leases
//! never exceed the capacity.
//!
//! The test binary is its own worker: run with `--child holder|waiter`, it takes orders on
//! stdin and reports on stdout, with the wall-clock millisecond of each release and each
//! grant. The parent bounds every wait and kills both children by PID if anything fails.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use crate::dynamo;

use dynamo::worker::{self, Start};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use sluice::store::LeaseFilter;
use sluice::{
    Bucket, DynamoStore, Lease, Sluice, clock::Clock as _, clock::SystemClock, clock::UnixMillis,
};

const SLOTS: usize = 2;
const ROUNDS: usize = 6;
/// The documented bound: the slot poll interval (default 300 ms) plus a read and a write,
/// with room for a loaded two-core machine.
const BOUND: Duration = Duration::from_millis(500);
/// The longest any worker may take to answer an order.
const ANSWER: Duration = Duration::from_secs(60);

pub(crate) fn main() {
    match worker::start(tracing::Level::ERROR) {
        Start::Child(runtime, a) => runtime.block_on(child(&a[0], &a[1], &a[2], &a[3])),
        Start::Parent(runtime) => {
            worker::report("freed slots reach a waiter", runtime.block_on(parent()));
        }
    }
}

fn sluice(endpoint: &str, table: &str, caller: &str) -> Sluice {
    Sluice::builder()
        .store(DynamoStore::new(dynamo::client(endpoint), table))
        .clock(SystemClock)
        .caller(caller)
        .build()
        .unwrap()
}

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

fn now_ms() -> i64 {
    SystemClock.now().as_millis()
}

async fn child(role: &str, endpoint: &str, table: &str, dimension: &str) {
    let sluice = sluice(endpoint, table, role);
    let (orders, mut incoming) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if orders.send(line).is_err() {
                break;
            }
        }
    });
    let mut held: Vec<Lease> = Vec::new();
    say("ready");
    while let Some(order) = incoming.recv().await {
        let order: Vec<&str> = order.split_whitespace().collect();
        match (role, order.as_slice()) {
            ("holder", ["take"]) => {
                for _ in 0..SLOTS {
                    held.push(
                        sluice
                            .acquire(sluice::Acquire::new(dimension).ttl(Duration::from_secs(60)))
                            .await
                            .unwrap(),
                    );
                }
                say("held");
            }
            ("holder", ["free", gaps @ ..]) => {
                // Frees one slot after each gap, saying when each was back in the store.
                for gap in gaps {
                    tokio::time::sleep(Duration::from_millis(gap.parse().unwrap())).await;
                    held.pop().unwrap().release().await.unwrap();
                    say(&format!("freed {}", now_ms()));
                }
            }
            ("waiter", ["wait"]) => {
                say("waiting");
                for _ in 0..SLOTS {
                    let lease = sluice
                        .acquire_within(
                            sluice::Acquire::new(dimension).ttl(Duration::from_secs(60)),
                            Duration::from_secs(30),
                        )
                        .await
                        .unwrap();
                    say(&format!("granted {}", now_ms()));
                    held.push(lease);
                }
            }
            ("waiter", ["release"]) => {
                for lease in held.drain(..) {
                    lease.release().await.unwrap();
                }
                say("released");
            }
            (_, ["exit"]) => return,
            other => panic!("unknown order {other:?}"),
        }
    }
}

/// A child process, killed by PID if the parent stops before it exits.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    role: &'static str,
}

impl Worker {
    fn spawn(role: &'static str, endpoint: &str, table: &str, dimension: &str) -> Worker {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(worker::child_args())
            .args([role, endpoint, table, dimension])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Worker {
            stdin: child.stdin.take().unwrap(),
            child,
            lines,
            role,
        }
    }

    fn say(&mut self, order: &str) {
        writeln!(self.stdin, "{order}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next line, which must start with `word`; what follows it.
    fn expect(&mut self, word: &str) -> String {
        let line = self
            .lines
            .recv_timeout(ANSWER)
            .unwrap_or_else(|_| panic!("{}: no `{word}` within {ANSWER:?}", self.role));
        let rest = line
            .strip_prefix(word)
            .unwrap_or_else(|| panic!("{}: expected `{word}…`, got {line:?}", self.role));
        rest.trim().to_owned()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

async fn parent() -> Option<()> {
    let store = dynamo::store().await?;
    let endpoint = dynamo::endpoint()?;
    let table = dynamo::table_name();
    let dimension = format!("waiters{:08x}#concurrent", rand::random::<u32>());
    let admin = sluice(&endpoint, table, "parent");
    admin
        .put_bucket(&dimension, Bucket::concurrent(SLOTS as u64))
        .await
        .unwrap();
    let mut holder = Worker::spawn("holder", &endpoint, table, &dimension);
    let mut waiter = Worker::spawn("waiter", &endpoint, table, &dimension);
    holder.expect("ready");
    waiter.expect("ready");

    // Throughout, never more live leases than slots.
    let max_live = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let admin = admin.clone();
        let filter = LeaseFilter {
            dimension: Some(dimension.parse().unwrap()),
            expired_before: None,
        };
        let (max_live, done) = (max_live.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let now = UnixMillis::new(now_ms());
                let live = admin
                    .leases(&filter)
                    .await
                    .unwrap()
                    .iter()
                    .filter(|l| l.expires_at > now)
                    .count();
                max_live.fetch_max(live, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let mut worst = Duration::ZERO;
    let rounds = tokio::task::spawn_blocking(move || {
        let mut delays = Vec::new();
        for _ in 0..ROUNDS {
            holder.say("take");
            holder.expect("held");
            waiter.say("wait");
            waiter.expect("waiting");
            // The holder keeps its slots a random while, then frees them apart.
            let gaps: Vec<String> = (0..SLOTS)
                .map(|_| rand::random_range(100..1_500u64).to_string())
                .collect();
            holder.say(&format!("free {}", gaps.join(" ")));
            for _ in 0..SLOTS {
                let freed: i64 = holder.expect("freed").parse().unwrap();
                let granted: i64 = waiter.expect("granted").parse().unwrap();
                // Not before it was freed (by more than the two processes' log order), and
                // within the bound after.
                assert!(
                    granted >= freed - 50,
                    "granted at {granted}, before the slot was freed at {freed}"
                );
                delays.push(Duration::from_millis(
                    granted.saturating_sub(freed).max(0) as u64
                ));
            }
            waiter.say("release");
            waiter.expect("released");
        }
        holder.say("exit");
        waiter.say("exit");
        delays
    })
    .await
    .unwrap();
    done.store(true, Ordering::SeqCst);
    watcher.await.unwrap();
    for delay in &rounds {
        worst = worst.max(*delay);
    }
    eprintln!(
        "{} slots freed by one process reached a waiting one within {worst:?} (bound {BOUND:?}); at most {} live leases of {SLOTS}",
        rounds.len(),
        max_live.load(Ordering::SeqCst)
    );
    assert_eq!(rounds.len(), ROUNDS * SLOTS);
    assert!(
        worst <= BOUND,
        "a freed slot took {worst:?} to reach the waiter"
    );
    assert!(
        max_live.load(Ordering::SeqCst) <= SLOTS,
        "more live leases than slots"
    );
    assert_eq!(
        admin.bucket(&dimension).await.unwrap().unwrap().tokens,
        sluice::Tokens::from(SLOTS as u64),
        "every slot back"
    );
    drop(store);
    Some(())
}
