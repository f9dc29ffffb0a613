//! One process of the demo: its tasks call the vendor through the mode's client, on the
//! shared timeline, and it prints what it got as one JSON line.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use sluice::{Bucket, Config, DynamoStore, RefillRate, Sluice};
use sluice_reqwest::{Limit, Route, Routes, Signal, SluiceMiddleware, estimate};

use crate::{Mode, Plan, VENDOR_HOST, now_ms, sleep_until};

/// What one process got.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) ok: AtomicU64,
    pub(crate) refused: AtomicU64,
}

/// The routes every sluice-based mode uses: OpenAI's everyday pair.
fn routes() -> Routes {
    let limit = |d: &str| Limit::parse(d).expect("a well-formed dimension");
    Routes::empty().route(
        Route::new(VENDOR_HOST)
            .limit(limit("openai#rpm").signal(Signal::Requests))
            .limit(
                limit("openai#tpm")
                    .estimate(estimate::chat_tokens)
                    .signal(Signal::Tokens),
            ),
    )
}

/// The client of `mode` for process `index` of `processes`.
async fn client(plan: &Plan, index: u64) -> ClientWithMiddleware {
    let http = reqwest::Client::builder()
        .resolve(VENDOR_HOST, ([127, 0, 0, 1], plan.vendor_port).into())
        .pool_max_idle_per_host(64)
        .build()
        .expect("a reqwest client");
    let builder = ClientBuilder::new(http);
    let wait = Duration::from_secs(1);
    match plan.mode {
        Mode::None => builder.build(),
        Mode::Split => {
            // An in-process limiter holding this process's share of the quota, as a
            // static split gives it; it knows nothing of the vendor's answers.
            let local = Sluice::in_memory();
            let n = plan.processes;
            for (dimension, bucket) in [
                (
                    "openai#rpm",
                    Bucket::requests(RefillRate::per_minute(plan.rpm / n)),
                ),
                (
                    "openai#tpm",
                    Bucket::tokens(RefillRate::per_minute(plan.tpm / n)),
                ),
            ] {
                local
                    .put_bucket(dimension, bucket)
                    .await
                    .expect("a local bucket");
            }
            builder
                .with(
                    SluiceMiddleware::new(routes())
                        .client(local)
                        .wait(wait)
                        .feedback(false),
                )
                .build()
        }
        Mode::Sluice => {
            let config = Config {
                table_name: Some(plan.table.clone()),
                endpoint_url: plan.endpoint.clone(),
                caller: format!("demo-{index}"),
                ..Config::default()
            };
            let store = DynamoStore::from_config(&config)
                .await
                .expect("DynamoDB configuration");
            let shared = Sluice::builder()
                .store(store)
                .build()
                .expect("a sluice client");
            builder
                .with(SluiceMiddleware::new(routes()).client(shared).wait(wait))
                .build()
        }
    }
}

/// A chat request of about 111 tokens (estimated; 61 used).
fn body(index: u64) -> String {
    serde_json::json!({
        "model": "gpt-4o-mini",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": format!("process {index:02} says hello {:>20}", "")}],
    })
    .to_string()
}

/// One call; the pause it asks for before the next (a RetryIn, a 429's delay).
async fn call(
    client: &ClientWithMiddleware,
    plan: &Plan,
    index: u64,
    outcome: &Outcome,
) -> Option<Duration> {
    let url = format!(
        "http://{VENDOR_HOST}:{}/v1/chat/completions",
        plan.vendor_port
    );
    let sent = client
        .post(url)
        .bearer_auth("demo-key")
        .header("content-type", "application/json")
        .body(body(index))
        .send()
        .await;
    match sent {
        Ok(response) if response.status().is_success() => {
            outcome.ok.fetch_add(1, Ordering::Relaxed);
            // Read to the end: the usage in it corrects the tokens charged.
            let _ = response.bytes().await;
            None
        }
        Ok(response) => {
            outcome.refused.fetch_add(1, Ordering::Relaxed);
            let delay = response
                .headers()
                .get("retry-after-ms")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1_000);
            Some(Duration::from_millis(delay))
        }
        Err(error) => {
            Some(sluice::Error::find_retry_in(&error).unwrap_or(Duration::from_millis(100)))
        }
    }
}

/// The process's demand in a heavy phase: calls due at a steady pace, shared by its tasks.
struct Pace {
    /// When the next call is due, in unix microseconds.
    next_us: AtomicU64,
    period_us: u64,
}

impl Pace {
    /// Process `index` of `n` offers `2^(index-1) / (2^n - 1)` of eight times the vendor's
    /// sustained rate: the heaviest half of the total, the lightest a sliver.
    fn new(plan: &Plan, index: u64, from_ms: u64) -> Pace {
        let n = plan.processes.min(20);
        let weight_den = (1u64 << n) - 1;
        let weight_num = 1u64 << (index.min(n) - 1);
        // Calls per minute this process offers: 8 x rpm x weight.
        let per_minute = (8 * plan.rpm * weight_num / weight_den).max(1);
        Pace {
            next_us: AtomicU64::new(from_ms * 1_000),
            period_us: 60_000_000 / per_minute,
        }
    }

    /// The next due time, in unix milliseconds.
    fn claim(&self) -> u64 {
        self.next_us.fetch_add(self.period_us, Ordering::Relaxed) / 1_000
    }
}

/// Calls as they fall due until `until_ms`; each call is retried, pausing as asked, until
/// it succeeds or the phase ends.
async fn busy(
    client: ClientWithMiddleware,
    plan: Arc<Plan>,
    index: u64,
    until_ms: u64,
    pace: Arc<Pace>,
    outcome: Arc<Outcome>,
) {
    loop {
        let due = pace.claim();
        if due >= until_ms {
            return;
        }
        sleep_until(due).await;
        while now_ms() < until_ms {
            let Some(pause) = call(&client, &plan, index, &outcome).await else {
                break;
            };
            let left = until_ms.saturating_sub(now_ms());
            tokio::time::sleep(pause.min(Duration::from_millis(left))).await;
        }
    }
}

/// Runs process `index` (1-based) on the plan's timeline; prints `{"ok":…,"refused":…}`.
pub(crate) async fn run(plan: Plan, index: u64) {
    let plan = Arc::new(plan);
    let client = client(&plan, index).await;
    let outcome = Arc::new(Outcome::default());
    let phases = plan.phases();
    sleep_until(plan.start_ms).await;
    // Light traffic: one call every two seconds.
    let mut at = plan.start_ms + index * 2_000 / plan.processes;
    while at < phases.heavy[0].0 {
        sleep_until(at).await;
        call(&client, &plan, index, &outcome).await;
        at += 2_000;
    }
    for (from, until) in phases.heavy {
        sleep_until(from).await;
        // Skewed load: process i offers twice what process i - 1 does, with i tasks.
        let pace = Arc::new(Pace::new(&plan, index, from));
        let tasks: Vec<_> = (0..index)
            .map(|_| {
                let (client, plan) = (client.clone(), plan.clone());
                let (pace, outcome) = (pace.clone(), outcome.clone());
                tokio::spawn(busy(client, plan, index, until, pace, outcome))
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    }
    let line = serde_json::json!({
        "ok": outcome.ok.load(Ordering::Relaxed),
        "refused": outcome.refused.load(Ordering::Relaxed),
    });
    #[allow(clippy::print_stdout)]
    {
        println!("{line}");
    }
}
