//! `SluiceMiddleware` in a small vendor client built on reqwest-middleware, with retries,
//! against the simulated vendor on loopback.
//!
//! The vendor (the repository's simulator, under the real host name `api.openai.com`)
//! enforces 240 requests a minute a second at a time: at most 4 at once, refilled at 4 a
//! second, and says so in its `x-ratelimit-*-requests` headers. The shared `openai#rpm`
//! bucket was configured more generously (100 at once, 120 a minute): the vendor's own
//! headers bring it down to what the vendor holds and teach it the vendor's burst, and a
//! 429, should one come, pauses it for every process sharing it. `openai#tpm` is charged by
//! each chat body's token estimate and corrected to the usage the vendor reports.
//!
//! The client stacks reqwest-retry (outside, for transient failures; it never retries a
//! RetryIn) and sluice (inside), and requeues on RetryIn by sleeping exactly that long.
//! Runs on the in-memory store.
//!
//! ```text
//! cargo run -p sluice-examples --example reqwest_vendor
//! ```
#![allow(clippy::print_stdout)]

use std::time::Instant;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;
use sluice::{Bucket, RefillRate, Sluice};
use sluice_reqwest::{Limit, Route, Routes, Signal, SluiceMiddleware, estimate};
use sluice_vendor_sim::{Shape, VendorConfig, VendorSim};

/// The host the client believes it calls; it resolves to the simulator.
const OPENAI: &str = "api.openai.com";

/// A chat body: 200 tokens to generate at most.
const CHAT: &str = r#"{"model":"gpt-4o","max_tokens":200,"messages":[{"role":"user","content":"Write a haiku about shared quotas."}]}"#;

/// The vendor: 240 requests a minute, enforced a second at a time.
pub fn vendor_config() -> VendorConfig {
    VendorConfig {
        rpm: 240,
        shape: Shape::PerSecond,
        ..VendorConfig::default()
    }
}

/// The shared buckets, as an operator defined them: more requests at once than the vendor
/// really takes.
pub async fn buckets(sluice: &Sluice) -> Result<(), sluice::Error> {
    let rpm = Bucket::requests(RefillRate::per_minute(120)).with_capacity(100);
    sluice.put_bucket("openai#rpm", rpm).await?;
    let tpm = Bucket::tokens(RefillRate::per_minute(40_000));
    sluice.put_bucket("openai#tpm", tpm).await?;
    Ok(())
}

/// The vendor client: retries outside, sluice inside, reaching `vendor`.
pub fn client(sluice: &Sluice, vendor: &VendorSim) -> reqwest::Result<ClientWithMiddleware> {
    let routes = Routes::vendors().route(
        Route::new(OPENAI)
            .limit(
                Limit::parse("openai#rpm")
                    .expect("a valid dimension")
                    .signal(Signal::Requests),
            )
            .limit(
                Limit::parse("openai#tpm")
                    .expect("a valid dimension")
                    .estimate(estimate::chat_tokens)
                    .signal(Signal::Tokens),
            ),
    );
    let http = reqwest::Client::builder()
        .resolve(OPENAI, vendor.addr())
        .build()?;
    Ok(ClientBuilder::new(http)
        .with(RetryTransientMiddleware::new_with_policy(
            ExponentialBackoff::builder().build_with_max_retries(3),
        ))
        .with(SluiceMiddleware::new(routes).client(sluice.clone()))
        .build())
}

/// What `calls` sequential chat calls came to.
#[derive(Debug, Default)]
pub struct Run {
    /// Calls answered with a completion.
    pub completed: u32,
    /// RetryIns slept out on the way.
    pub requeued: u32,
}

/// Sends `calls` chat calls one after another, sleeping out every RetryIn.
pub async fn run(
    client: &ClientWithMiddleware,
    vendor: &VendorSim,
    calls: u32,
    mut report: impl FnMut(String),
) -> Result<Run, reqwest_middleware::Error> {
    let url = vendor.url(OPENAI, "/v1/chat/completions");
    let started = Instant::now();
    let mut run = Run::default();
    while run.completed < calls {
        let elapsed = started.elapsed().as_secs_f64();
        match client
            .post(&url)
            .bearer_auth("sk-example")
            .body(CHAT)
            .send()
            .await
        {
            Ok(response) => {
                let status = response.status();
                // Reading the body to its end lets its usage correct the token charge.
                response.bytes().await?;
                run.completed += 1;
                report(format!("{elapsed:5.2}s  call {}: {status}", run.completed));
            }
            Err(error) => match sluice::Error::find_retry_in(&error) {
                Some(delay) => {
                    run.requeued += 1;
                    report(format!("{elapsed:5.2}s  held back: requeue in {delay:?}"));
                    tokio::time::sleep(delay).await;
                }
                None => return Err(error),
            },
        }
    }
    Ok(run)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let vendor = VendorSim::start(vendor_config()).await;
    let sluice = Sluice::in_memory();
    buckets(&sluice).await?;
    let client = client(&sluice, &vendor)?;
    let started = Instant::now();
    let run = run(&client, &vendor, 12, |line| println!("{line}")).await?;
    let rpm = sluice.snapshot("openai#rpm").await?;
    let stats = vendor.stats();
    println!(
        "{} calls in {:.1}s, {} requeued; the vendor answered {} with 429; openai#rpm learned \
         the vendor's burst: {}",
        run.completed,
        started.elapsed().as_secs_f64(),
        run.requeued,
        stats.rejected,
        rpm.burst
            .map_or_else(|| "none".to_owned(), |b| b.to_string()),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use sluice::Tokens;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_vendors_headers_bring_a_generous_bucket_down_to_its_real_burst() {
        let vendor = VendorSim::start(vendor_config()).await;
        let sluice = Sluice::in_memory();
        buckets(&sluice).await.unwrap();
        let client = client(&sluice, &vendor).unwrap();
        let run = run(&client, &vendor, 12, |_| {}).await.unwrap();
        assert_eq!(run.completed, 12);
        // 12 calls against a vendor that takes 4 at once: sluice held some back.
        assert!(run.requeued > 0, "{run:?}");
        let stats = vendor.stats();
        assert_eq!(stats.accepted, 12);
        // The vendor's headers, not its 429s, paced the client: at most one refusal (a
        // call in flight before the first answer arrived).
        assert!(stats.rejected <= 1, "{stats:?}");
        let rpm = sluice.snapshot("openai#rpm").await.unwrap();
        let burst = rpm.burst.expect("a burst learned from the headers");
        assert!(burst <= Tokens::new(5), "{burst}");
    }
}
