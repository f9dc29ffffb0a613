//! Three products share one vendor quota for ten seconds.
//!
//! `openai#rpm` holds 10 requests and refills 5 per second. Three simulated products call
//! at different paces; each asks sluice first and, on `RetryIn(d)`, sleeps exactly `d`
//! before asking again. Every second the table shows grants and RetryIn answers per
//! product, and the running total against what the limit allows. Runs on the embedded
//! in-memory store: no setup.
//!
//! ```text
//! cargo run -p sluice-examples --example quickstart
//! ```
#![allow(clippy::print_stdout)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice::{Bucket, Error, RefillRate, Sluice, Tokens};
use tokio::time::Instant;

const DIMENSION: &str = "openai#rpm";
const CAPACITY: u64 = 10;
const PER_SECOND: u64 = 5;
const SECONDS: usize = 10;

/// A simulated product: its name and how long it thinks between vendor calls.
const PRODUCTS: [(&str, Duration); 3] = [
    ("audit-service", Duration::from_millis(50)),
    ("stats-service", Duration::from_millis(120)),
    ("batch-worker", Duration::from_millis(300)),
];

#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    granted: u32,
    retry_in: u32,
}

#[derive(Debug, Default)]
struct Honoured {
    waits: u32,
    granted_after_wait: u32,
    early_retries: u32,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let sluice = Sluice::in_memory();
    sluice
        .put_bucket(
            DIMENSION,
            Bucket::requests(RefillRate::per_second(PER_SECOND)).with_capacity(CAPACITY),
        )
        .await?;

    println!(
        "sluice quickstart: {} products share `{DIMENSION}` (capacity {CAPACITY}, refill {PER_SECOND}/s) for {SECONDS} s",
        PRODUCTS.len()
    );
    println!("each product asks before every call and sleeps exactly the RetryIn it is given\n");

    let tallies = Arc::new(Mutex::new(vec![[Tally::default(); 3]; SECONDS]));
    let honoured = Arc::new(Mutex::new(Honoured::default()));
    let start = Instant::now();
    let end = start + Duration::from_secs(SECONDS as u64);

    let mut tasks = Vec::new();
    for (p, (name, think)) in PRODUCTS.iter().enumerate() {
        let client = Sluice::builder()
            .store_arc(sluice.store().clone())
            .caller(*name)
            .build()?;
        let tallies = tallies.clone();
        let honoured = honoured.clone();
        let think = *think;
        tasks.push(tokio::spawn(async move {
            let mut not_before: Option<Instant> = None;
            loop {
                let now = Instant::now();
                if now >= end {
                    return Ok::<(), Error>(());
                }
                let second = ((now - start).as_secs() as usize).min(SECONDS - 1);
                let after_wait = not_before.take();
                if after_wait.is_some_and(|t| now < t) {
                    honoured.lock().unwrap().early_retries += 1;
                }
                match client.acquire(DIMENSION).await {
                    Ok(lease) => {
                        tallies.lock().unwrap()[second][p].granted += 1;
                        if after_wait.is_some() {
                            honoured.lock().unwrap().granted_after_wait += 1;
                        }
                        // The vendor call would go here.
                        lease.release().await?;
                        tokio::time::sleep(think).await;
                    }
                    Err(Error::RetryIn(sluice::RetryIn { delay, .. })) => {
                        tallies.lock().unwrap()[second][p].retry_in += 1;
                        honoured.lock().unwrap().waits += 1;
                        not_before = Some(Instant::now() + delay);
                        tokio::time::sleep(delay).await;
                    }
                    Err(other) => return Err(other),
                }
            }
        }));
    }
    let mut printed = 0;
    while printed < SECONDS {
        tokio::time::sleep_until(start + Duration::from_secs(printed as u64 + 1)).await;
        if printed == 0 {
            print_header();
        }
        print_row(printed, &tallies.lock().unwrap());
        printed += 1;
    }
    for t in tasks {
        t.await.expect("product task panicked")?;
    }

    let total: u32 = tallies
        .lock()
        .unwrap()
        .iter()
        .flatten()
        .map(|t| t.granted)
        .sum();
    let allowed = CAPACITY as u32 + PER_SECOND as u32 * SECONDS as u32;
    let (waits, early, granted_after_wait) = {
        let h = honoured.lock().unwrap();
        (h.waits, h.early_retries, h.granted_after_wait)
    };
    println!();
    println!(
        "granted {total} calls in {SECONDS} s; the limit allows at most {allowed} ({CAPACITY} + {PER_SECOND}/s x {SECONDS} s): {}",
        if total <= allowed {
            "the shared limit held"
        } else {
            "LIMIT EXCEEDED"
        }
    );
    println!(
        "{} RetryIn answers were honoured ({} early retries); {} of the retries made after waiting were granted at once",
        waits, early, granted_after_wait
    );
    let snapshot = sluice.snapshot(DIMENSION).await?;
    println!(
        "`{DIMENSION}` now: {} of {} available, refilling {}/s, full in {:?}",
        snapshot.available.max(Tokens::ZERO),
        snapshot.capacity,
        snapshot.refill_rate,
        snapshot.time_to_full.unwrap_or_default()
    );
    Ok(())
}

fn print_header() {
    let mut line = String::from(" sec |");
    for (name, _) in PRODUCTS {
        line.push_str(&format!(" {name:>13} grant/retry |"));
    }
    line.push_str(" total | so far | limit so far");
    println!("{line}");
    println!("{}", "-".repeat(line.len()));
}

fn print_row(second: usize, tallies: &[[Tally; 3]]) {
    let row = tallies[second];
    let mut line = format!(" {:>3} |", second + 1);
    for t in row {
        line.push_str(&format!(" {:>19}/{:<5} |", t.granted, t.retry_in));
    }
    let total: u32 = row.iter().map(|t| t.granted).sum();
    let so_far: u32 = tallies[..=second].iter().flatten().map(|t| t.granted).sum();
    let limit = CAPACITY as u32 + PER_SECOND as u32 * (second as u32 + 1);
    line.push_str(&format!(" {total:>5} | {so_far:>6} | {limit:>12}"));
    println!("{line}");
}
