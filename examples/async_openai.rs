//! async-openai behind sluice, both ways, against the simulated vendor on loopback.
//!
//! async-openai (feature `middleware`) sends every request through a tower service over its
//! `HttpRequestFactory`; sluice goes there in either of two ways:
//!
//! - **the layer**: `SluiceLayer` in front of async-openai's own `ReqwestService`. Every
//!   call takes one `openai#rpm` request (a layer sees the request before its body is
//!   built, so it charges fixed costs).
//! - **the middleware**: `SluiceMiddleware` in a `reqwest_middleware` client, which a
//!   `service_fn` executes the built request through. The middleware routes by host, so it
//!   also charges `openai#tpm` by the body's token estimate, corrects it to the `usage` the
//!   vendor reports, and learns from the vendor's rate-limit headers.
//!
//! Either way, a call the quota cannot take now fails at once, without reaching the vendor,
//! and `sluice::Error::find_retry_in` finds the exact delay in the `OpenAIError` that
//! async-openai returns. Both clients here are built without async-openai's own retry
//! layer, so nothing resends a call sluice held back.
//!
//! The run: 20 calls at once on each path against a bucket of 5 requests (5 complete, 15
//! are told when to come back), then 20 calls on the middleware path that sleep out their
//! RetryIn and try again: all complete, at the bucket's pace, with no 429 from the vendor.
//! Runs on the in-memory store.
//!
//! ```text
//! cargo run -p sluice-examples --example async_openai
//! ```
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::{HttpRequestFactory, ReqwestService};
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};
use futures::future::join_all;
use sluice::{Bucket, RefillRate, Sluice};
use sluice_reqwest::{Limit, Route, Routes, Signal, SluiceMiddleware, estimate};
use sluice_tower::SluiceLayer;
use sluice_vendor_sim::{VendorConfig, VendorSim};

/// The host the clients believe they call; it resolves to the simulator.
const OPENAI: &str = "api.openai.com";

/// An async-openai client configured for the simulator.
pub type OpenAI = async_openai::Client<OpenAIConfig>;

/// A plain reqwest client that reaches `vendor` under the vendor's real host name.
fn http(vendor: &VendorSim) -> reqwest::Client {
    reqwest::Client::builder()
        .resolve(OPENAI, vendor.addr())
        .build()
        .expect("a client with a resolve override builds")
}

fn config(vendor: &VendorSim) -> OpenAIConfig {
    OpenAIConfig::new()
        .with_api_base(format!("http://{OPENAI}:{}/v1", vendor.addr().port()))
        .with_api_key("sk-example")
}

/// async-openai with `SluiceLayer` in front of its own `ReqwestService`: one `openai#rpm`
/// request per call.
pub fn through_layer(sluice: &Sluice, vendor: &VendorSim) -> OpenAI {
    let http = http(vendor);
    let service = tower::ServiceBuilder::new()
        .layer(SluiceLayer::new("openai#rpm").client(sluice.clone()))
        .service(ReqwestService::new(http.clone()));
    // The layer's error is a `tower::BoxError`: async-openai takes it as `OpenAIError::Boxed`.
    OpenAI::build(http, config(vendor)).with_http_service(service)
}

/// async-openai executing through a `reqwest_middleware` client with `SluiceMiddleware`:
/// `openai#rpm` per call and `openai#tpm` by each body's token estimate, corrected to the
/// reported usage.
pub fn through_middleware(sluice: &Sluice, vendor: &VendorSim) -> OpenAI {
    let routes = Routes::empty().route(
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
    let http = http(vendor);
    let client = reqwest_middleware::ClientBuilder::new(http.clone())
        .with(SluiceMiddleware::new(routes).client(sluice.clone()))
        .build();
    let service = tower::service_fn(move |factory: HttpRequestFactory| {
        let client = client.clone();
        async move {
            let request = factory.build().await?;
            client.execute(request).await.map_err(|e| match e {
                reqwest_middleware::Error::Reqwest(e) => OpenAIError::Reqwest(e),
                reqwest_middleware::Error::Middleware(e) => OpenAIError::Boxed(e.into()),
            })
        }
    });
    OpenAI::build(http, config(vendor)).with_http_service(service)
}

/// A short chat request: 100 tokens to generate at most.
pub fn chat() -> CreateChatCompletionRequest {
    let message = ChatCompletionRequestUserMessageArgs::default()
        .content("Write a haiku about shared quotas.")
        .build()
        .expect("a user message builds");
    CreateChatCompletionRequestArgs::default()
        .model("gpt-4o-mini")
        .max_tokens(100u32)
        .messages([message.into()])
        .build()
        .expect("a chat request builds")
}

/// What `calls` calls at once through `client` came to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Calls answered by the vendor with a completion.
    pub completed: usize,
    /// Calls held back, each with the delay found in its `OpenAIError`.
    pub retry_in: Vec<Duration>,
    /// Any other error, as text.
    pub other: Vec<String>,
}

/// Sends `calls` chat calls at once through `client`.
pub async fn burst(client: &OpenAI, calls: usize) -> Tally {
    let outcomes = join_all((0..calls).map(|_| async { client.chat().create(chat()).await })).await;
    let mut tally = Tally::default();
    for outcome in outcomes {
        match outcome {
            Ok(_) => tally.completed += 1,
            Err(error) => match sluice::Error::find_retry_in(&error) {
                Some(delay) => tally.retry_in.push(delay),
                None => tally.other.push(error.to_string()),
            },
        }
    }
    tally
}

/// One chat call that sleeps out every RetryIn and tries again; the number of tries.
pub async fn call_until_done(client: &OpenAI) -> Result<u32, OpenAIError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match client.chat().create(chat()).await {
            Ok(_) => return Ok(tries),
            Err(error) => match sluice::Error::find_retry_in(&error) {
                Some(delay) => tokio::time::sleep(delay).await,
                None => return Err(error),
            },
        }
    }
}

/// The quota both paths share: 5 requests at once, refilled at `per_minute`.
pub async fn quota(sluice: &Sluice, per_minute: u64) -> Result<(), sluice::Error> {
    sluice
        .put_bucket(
            "openai#rpm",
            Bucket::requests(RefillRate::per_minute(per_minute)).with_capacity(5),
        )
        .await?;
    sluice
        .put_bucket(
            "openai#tpm",
            Bucket::tokens(RefillRate::per_minute(150_000)),
        )
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let vendor = VendorSim::start(VendorConfig::default()).await;
    for (path, build) in [
        ("layer", through_layer as fn(&Sluice, &VendorSim) -> OpenAI),
        ("middleware", through_middleware),
    ] {
        let sluice = Sluice::in_memory();
        quota(&sluice, 1).await?;
        let tally = burst(&build(&sluice, &vendor), 20).await;
        println!(
            "{path:>10}: 20 calls at once on a bucket of 5: {} completed, {} told when to retry \
             (first in {:?}), {} other errors",
            tally.completed,
            tally.retry_in.len(),
            tally.retry_in.first(),
            tally.other.len(),
        );
    }
    let sluice = Sluice::in_memory();
    quota(&sluice, 600).await?;
    let client = through_middleware(&sluice, &vendor);
    let started = Instant::now();
    let tries = join_all((0..20).map(|_| call_until_done(&client))).await;
    let tries: u32 = tries.into_iter().sum::<Result<u32, _>>()?;
    println!(
        "requeued: 20 calls completed in {:.2}s with {tries} tries at 10/s; the vendor refused {}",
        started.elapsed().as_secs_f64(),
        vendor.stats().rejected,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use sluice::{Tokens, clock::ManualClock, clock::UnixMillis};

    use super::*;

    /// 20 calls at once on a bucket of 5 refilled once a minute, through `build`.
    async fn twenty_on_five(build: fn(&Sluice, &VendorSim) -> OpenAI) -> (Tally, VendorSim) {
        let vendor = VendorSim::start(VendorConfig::default()).await;
        let sluice = Sluice::in_memory();
        quota(&sluice, 1).await.unwrap();
        let tally = burst(&build(&sluice, &vendor), 20).await;
        (tally, vendor)
    }

    fn check(tally: &Tally, vendor: &VendorSim) {
        assert_eq!(tally.completed, 5, "{tally:?}");
        assert!(tally.other.is_empty(), "{tally:?}");
        assert_eq!(tally.retry_in.len(), 15, "{tally:?}");
        // The next request of a bucket refilled once a minute is a minute away (and the
        // clock-skew margin).
        for delay in &tally.retry_in {
            assert!(
                *delay > Duration::from_secs(59) && *delay <= Duration::from_secs(61),
                "{delay:?}"
            );
        }
        // The 15 held back never reached the vendor.
        assert_eq!(vendor.stats().accepted, 5);
        assert_eq!(vendor.stats().rejected, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn through_the_layer_five_complete_and_fifteen_get_their_delay() {
        let (tally, vendor) = twenty_on_five(through_layer).await;
        check(&tally, &vendor);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn through_the_middleware_five_complete_and_fifteen_get_their_delay() {
        let (tally, vendor) = twenty_on_five(through_middleware).await;
        check(&tally, &vendor);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_middleware_charges_the_reported_usage_to_the_token_bucket() {
        let vendor = VendorSim::start(VendorConfig::default()).await;
        // A fixed clock: the token bucket does not refill during the call.
        let clock = ManualClock::new(UnixMillis::from_secs(1_800_000_000));
        let sluice = Sluice::builder()
            .store(sluice::MemoryStore::new())
            .clock(clock)
            .build()
            .unwrap();
        quota(&sluice, 1).await.unwrap();
        let tally = burst(&through_middleware(&sluice, &vendor), 1).await;
        assert_eq!(tally.completed, 1, "{tally:?}");
        // What the vendor counted (the usage it reported) is what sluice charged.
        let used = vendor.stats().tokens;
        assert!(used > 0);
        assert_eq!(
            sluice.snapshot("openai#tpm").await.unwrap().available,
            Tokens::new(150_000 - i64::try_from(used).unwrap())
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requeued_calls_all_complete_and_the_vendor_refuses_none() {
        let vendor = VendorSim::start(VendorConfig::default()).await;
        let sluice = Sluice::in_memory();
        quota(&sluice, 600).await.unwrap();
        let client = through_middleware(&sluice, &vendor);
        let tries = join_all((0..12).map(|_| call_until_done(&client))).await;
        let tries: u32 = tries.into_iter().map(Result::unwrap).sum();
        assert!(tries > 12, "{tries}: a bucket of 5 made some wait");
        assert_eq!(vendor.stats().accepted, 12);
        assert_eq!(vendor.stats().rejected, 0);
    }
}
