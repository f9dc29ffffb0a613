//! `#[rate_limited]`: a vendor client whose calls share one quota, without a lease in sight.
//!
//! A summarizer calls a (simulated) LLM vendor: each call takes one request from
//! `openai#rpm` and an estimate of its tokens from `openai#tpm`, waits inline up to two
//! seconds when the quota is short, and otherwise hands the RetryIn to its caller, which
//! requeues the document. Runs on the in-memory store.
//!
//! ```text
//! cargo run -p sluice-examples --example rate_limited
//! ```
#![allow(clippy::print_stdout)]

use std::time::Duration;

use sluice::{Bucket, RefillRate, Sluice, rate_limited};

/// The application's error: sluice's RetryIn becomes a requeue instruction.
#[derive(Debug)]
enum SummarizeError {
    Requeue(Duration),
    Sluice(sluice::Error),
}

impl From<sluice::Error> for SummarizeError {
    fn from(e: sluice::Error) -> Self {
        match e.retry_in() {
            Some(delay) => SummarizeError::Requeue(delay),
            None => SummarizeError::Sluice(e),
        }
    }
}

struct Summarizer {
    sluice: Sluice,
}

impl Summarizer {
    /// One request, and about a token per four characters of the document.
    #[rate_limited("openai#rpm", "openai#tpm" = doc.len() / 4, client = self.sluice, timeout = 30, wait = 2)]
    async fn summarize(&self, doc: &str) -> Result<String, SummarizeError> {
        tokio::time::sleep(Duration::from_millis(20)).await; // the vendor call
        Ok(format!("{}…", &doc[..doc.len().min(24)]))
    }
}

#[tokio::main]
async fn main() -> Result<(), sluice::Error> {
    let sluice = Sluice::in_memory();
    sluice
        .put_bucket(
            "openai#rpm",
            Bucket::requests(RefillRate::per_second(2)).with_capacity(3),
        )
        .await?;
    sluice
        .put_bucket(
            "openai#tpm",
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(600),
        )
        .await?;
    let summarizer = Summarizer { sluice };
    let docs: Vec<String> = (0..10)
        // About 100 to 550 tokens each.
        .map(|i| format!("document {i}: {}", "lorem ipsum ".repeat(33 + i * 17)))
        .collect();
    let started = tokio::time::Instant::now();
    for (i, doc) in docs.iter().enumerate() {
        let tokens = doc.len() / 4;
        let outcome = summarizer.summarize(doc).await;
        let at = started.elapsed().as_millis();
        match outcome {
            Ok(summary) => println!("{at:>5} ms  doc {i} (~{tokens} tokens): {summary}"),
            Err(SummarizeError::Requeue(delay)) => {
                println!(
                    "{at:>5} ms  doc {i} (~{tokens} tokens): quota short beyond the 2 s wait; requeue in {delay:?}"
                )
            }
            Err(SummarizeError::Sluice(e)) => {
                println!("{at:>5} ms  doc {i} (~{tokens} tokens): failed: {e}")
            }
        }
    }
    Ok(())
}
