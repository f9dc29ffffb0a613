//! The middleware against a fake vendor on loopback, reached under the real vendor host
//! names (`reqwest::ClientBuilder::resolve`), so the default routing table is what is tested.

mod vendor;
mod vendor_sim;

use std::sync::Arc;
use std::time::Duration;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;
use sluice::store::{LeaseFilter, Store};
use sluice::{
    Bucket, MemoryStore, RefillRate, Sluice, Tokens, clock::ManualClock, clock::UnixMillis,
};
use sluice_reqwest::{Limit, Override, Route, Routes, Signal, SluiceMiddleware, estimate};
use vendor::{Reply, Vendor};

const OPENAI: &str = "api.openai.com";
const ANTHROPIC: &str = "api.anthropic.com";
const ELEVENLABS: &str = "api.elevenlabs.io";
const OTHER: &str = "internal.example";
const HOSTS: [&str; 4] = [OPENAI, ANTHROPIC, ELEVENLABS, OTHER];

/// One shared store and clock: each `client()` is another process on the same quota.
struct World {
    store: Arc<MemoryStore>,
    clock: ManualClock,
    vendor: Vendor,
}

impl World {
    async fn new() -> World {
        World {
            store: Arc::new(MemoryStore::new()),
            clock: ManualClock::new(UnixMillis::from_secs(1_800_000_000)),
            vendor: Vendor::start().await,
        }
    }

    fn sluice(&self) -> Sluice {
        Sluice::builder()
            .store_arc(self.store.clone())
            .clock(self.clock.clone())
            .build()
            .unwrap()
    }

    /// A vendor client with the default routes on its own `Sluice` over the shared store.
    fn client(&self) -> ClientWithMiddleware {
        self.client_with(SluiceMiddleware::default())
    }

    fn client_with(&self, middleware: SluiceMiddleware) -> ClientWithMiddleware {
        ClientBuilder::new(self.vendor.reqwest(&HOSTS))
            .with(middleware.client(self.sluice()))
            .build()
    }

    async fn bucket(&self, dimension: &str, bucket: Bucket) {
        self.sluice().put_bucket(dimension, bucket).await.unwrap();
    }

    async fn available(&self, dimension: &str) -> Tokens {
        let row = self.sluice().bucket(dimension).await.unwrap().unwrap();
        row.available(self.clock.now())
    }

    async fn leases(&self) -> usize {
        self.store
            .list_leases(&LeaseFilter::default())
            .await
            .unwrap()
            .len()
    }

    fn url(&self, host: &str, path: &str) -> String {
        self.vendor.url(host, path)
    }
}

fn rpm(capacity: u64) -> Bucket {
    Bucket::requests(RefillRate::per_second(1)).with_capacity(capacity)
}

#[tokio::test]
async fn a_mapped_host_takes_a_token_per_request_and_an_unmapped_host_none() {
    let world = World::new().await;
    world.bucket("openai#rpm", rpm(10)).await;
    let client = world.client();
    for _ in 0..3 {
        let response = client
            .get(world.url(OPENAI, "/v1/models"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(world.available("openai#rpm").await, Tokens::new(7));
    for _ in 0..3 {
        client
            .get(world.url(OTHER, "/v1/models"))
            .send()
            .await
            .unwrap();
    }
    assert_eq!(world.available("openai#rpm").await, Tokens::new(7));
    assert_eq!(world.vendor.served(OPENAI), 3);
    assert_eq!(world.vendor.served(OTHER), 3);
    assert_eq!(world.leases().await, 0, "every slot was released");
}

#[tokio::test]
async fn a_bucket_in_shadow_mode_lets_every_request_through_and_counts_the_excess() {
    let world = World::new().await;
    world
        .bucket("openai#rpm", rpm(2).with_mode(sluice::Mode::Shadow))
        .await;
    let client = world.client();
    for _ in 0..5 {
        let response = client
            .get(world.url(OPENAI, "/v1/models"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(world.vendor.served(OPENAI), 5);
    assert_eq!(world.available("openai#rpm").await, Tokens::new(-3));
    let row = world.sluice().bucket("openai#rpm").await.unwrap().unwrap();
    assert_eq!(row.shadow_refused(), 3);
}

#[tokio::test]
async fn retry_in_is_found_with_and_without_the_retry_middleware() {
    let world = World::new().await;
    world.bucket("openai#rpm", rpm(1)).await;
    let client = world.client();
    client
        .get(world.url(OPENAI, "/v1/models"))
        .send()
        .await
        .unwrap();
    let error = client
        .get(world.url(OPENAI, "/v1/models"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        sluice::Error::find_retry_in(&error),
        Some(Duration::from_secs(1))
    );
    // Which dimension was short, and its wait.
    let refusal = sluice::Error::find_refusal(&error).expect("a RetryIn");
    let short: Vec<&str> = refusal.short.iter().map(|s| s.dimension.as_str()).collect();
    assert_eq!(short, ["openai#rpm"]);
    assert_eq!(refusal.delay_of("openai#rpm"), Some(Duration::from_secs(1)));
    assert!(matches!(
        &error,
        reqwest_middleware::Error::Middleware(e)
            if matches!(e.downcast_ref::<sluice::Error>(), Some(sluice::Error::RetryIn(_)))
    ));

    // The documented order: retries outside, sluice inside. A RetryIn is not retried.
    let retrying = ClientBuilder::new(world.vendor.reqwest(&HOSTS))
        .with(RetryTransientMiddleware::new_with_policy(
            ExponentialBackoff::builder()
                .retry_bounds(Duration::from_millis(1), Duration::from_millis(5))
                .build_with_max_retries(3),
        ))
        .with(SluiceMiddleware::default().client(world.sluice()))
        .build();
    let error = retrying
        .get(world.url(OPENAI, "/v1/models"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        sluice::Error::find_retry_in(&error),
        Some(Duration::from_secs(1))
    );
    assert_eq!(
        world.vendor.served(OPENAI),
        1,
        "denied calls never reach the vendor"
    );
}

#[tokio::test]
async fn the_slot_is_released_on_success_error_statuses_and_connection_errors() {
    let world = World::new().await;
    world
        .bucket("elevenlabs#concurrent", Bucket::concurrent(1))
        .await;
    let client = world.client();
    world.vendor.reply("/v1/fail", Reply::status(500));
    world.vendor.reply("/v1/missing", Reply::status(404));
    for path in ["/v1/ok", "/v1/fail", "/v1/missing", "/v1/ok"] {
        let response = client
            .post(world.url(ELEVENLABS, path))
            .send()
            .await
            .unwrap();
        // The vendor counts the call until its body has been read: so does the slot.
        assert_eq!(
            world.available("elevenlabs#concurrent").await,
            Tokens::ZERO,
            "{path}"
        );
        response.bytes().await.unwrap();
        assert_eq!(
            world.available("elevenlabs#concurrent").await,
            Tokens::new(1),
            "{path}"
        );
    }
    assert_eq!(world.vendor.served(ELEVENLABS), 4);

    // A host that refuses connections: the error is reqwest's, and the slot comes back.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let refused = ClientBuilder::new(
        reqwest::Client::builder()
            .resolve(ELEVENLABS, closed)
            .build()
            .unwrap(),
    )
    .with(SluiceMiddleware::default().client(world.sluice()))
    .build();
    let error = refused
        .post(format!("http://{ELEVENLABS}:{}/v1/ok", closed.port()))
        .send()
        .await
        .unwrap_err();
    assert!(error.is_connect(), "{error}");
    assert_eq!(sluice::Error::find_retry_in(&error), None);
    assert_eq!(
        world.available("elevenlabs#concurrent").await,
        Tokens::new(1)
    );
    assert_eq!(world.leases().await, 0);
}

/// A call is its caller's: on a `requests` bucket a call of five minutes, five times the
/// default lease TTL, completes (sluice sets no deadline; before, it was abandoned at the
/// TTL with `Timeout`). Paused time: the vendor's five minutes pass at once.
#[tokio::test(start_paused = true)]
async fn a_five_minute_call_on_a_requests_bucket_completes_under_the_default_ttl() {
    let world = World::new().await;
    world.bucket("openai#rpm", rpm(10)).await;
    world.vendor.reply(
        "/v1/models",
        Reply::status(200).delay(Duration::from_secs(300)),
    );
    let client = world.client();
    assert_eq!(
        world.sluice().config().lease_ttl,
        Duration::from_secs(60),
        "the default TTL"
    );
    let started = tokio::time::Instant::now();
    let response = client
        .get(world.url(OPENAI, "/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(started.elapsed() >= Duration::from_secs(300));
    assert_eq!(world.available("openai#rpm").await, Tokens::new(9));
    assert_eq!(world.leases().await, 0);
}

/// A slot is held as long as its call runs, renewed past its TTL (here 200 ms, the call
/// 3 s): meanwhile nobody else gets it, and it comes back when the call ends.
#[tokio::test(start_paused = true)]
async fn a_slot_outliving_its_ttl_is_renewed_until_the_call_ends() {
    let world = World::new().await;
    world
        .bucket("elevenlabs#concurrent", Bucket::concurrent(1))
        .await;
    world
        .vendor
        .reply("/v1/slow", Reply::status(200).delay(Duration::from_secs(3)));
    // A clock that follows tokio's (paused) time: the lease expires unless renewed.
    let sluice = Sluice::builder()
        .store_arc(world.store.clone())
        .clock(sluice::clock::TokioClock::starting_at(
            UnixMillis::from_secs(1_800_000_000),
        ))
        .build()
        .unwrap();
    let client = ClientBuilder::new(world.vendor.reqwest(&HOSTS))
        .with(
            SluiceMiddleware::default()
                .client(sluice.clone())
                .lease_ttl(Duration::from_millis(200)),
        )
        .build();
    let url = world.url(ELEVENLABS, "/v1/slow");
    let call = tokio::spawn(async move { client.post(url).send().await });
    // Well past the TTL (and its clock-skew margin), the slot is still the call's.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert!(!call.is_finished());
    let row = sluice
        .bucket("elevenlabs#concurrent")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.tokens, Tokens::ZERO, "the slot is held");
    assert!(matches!(
        sluice.acquire("elevenlabs#concurrent").await,
        Err(sluice::Error::RetryIn(_))
    ));
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap();
    assert_eq!(
        world.available("elevenlabs#concurrent").await,
        Tokens::new(1)
    );
    assert_eq!(world.leases().await, 0);
}

/// On a bucket spread over four rows, a vendor 429 pauses the whole bucket: every row,
/// whichever one the grant came from (before, only the one named, of four).
#[tokio::test]
async fn a_vendor_429_on_a_bucket_spread_over_four_rows_pauses_all_four() {
    let world = World::new().await;
    world
        .bucket(
            "openai#rpm",
            Bucket::requests(RefillRate::per_second(100)).with_capacity(100),
        )
        .await;
    world.sluice().reshard("openai#rpm", 4).await.unwrap();
    world.vendor.reply(
        "/v1/chat/completions",
        Reply::status(429).header("retry-after", "7"),
    );
    let error = world
        .client()
        .post(world.url(OPENAI, "/v1/chat/completions"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        sluice::Error::find_retry_in(&error),
        Some(Duration::from_secs(7))
    );
    let sluice = world.sluice();
    let now = world.clock.now();
    let rows: Vec<_> = sluice
        .buckets()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.dimension.as_str().starts_with("openai#rpm"))
        .collect();
    assert_eq!(rows.len(), 4);
    for row in rows {
        assert!(
            row.refilled(now).tokens < Tokens::new(1),
            "a row not paused: {row:?}"
        );
    }
    // Any process, on any row, backs off for the vendor's delay.
    for _ in 0..8 {
        let refused = world.sluice().acquire("openai#rpm").await.unwrap_err();
        assert_eq!(refused.retry_in(), Some(Duration::from_secs(7)));
    }
    assert_eq!(world.vendor.served(OPENAI), 1);
}

#[tokio::test]
async fn a_vendor_429_pauses_every_process_for_the_vendors_delay() {
    let world = World::new().await;
    world
        .bucket("openai#rpm", Bucket::requests(RefillRate::per_second(10)))
        .await;
    world.vendor.reply(
        "/v1/chat/completions",
        Reply::status(429).header("retry-after", "7"),
    );
    let first = world.client();
    let error = first
        .post(world.url(OPENAI, "/v1/chat/completions"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        sluice::Error::find_retry_in(&error),
        Some(Duration::from_secs(7))
    );
    assert_eq!(world.vendor.served(OPENAI), 1);

    // Another process sharing the store backs off without calling the vendor.
    let second = world.client();
    let error = second
        .get(world.url(OPENAI, "/v1/models"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        sluice::Error::find_retry_in(&error),
        Some(Duration::from_secs(7))
    );
    assert_eq!(world.vendor.served(OPENAI), 1);

    world.clock.advance(Duration::from_secs(7));
    let response = second
        .get(world.url(OPENAI, "/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn a_429_naming_the_exhausted_limit_pauses_only_its_dimension() {
    let world = World::new().await;
    world.bucket("openai#rpm", rpm(100)).await;
    world
        .bucket("openai#tpm", Bucket::tokens(RefillRate::per_minute(60_000)))
        .await;
    world.vendor.reply(
        "/v1/chat/completions",
        Reply::status(429)
            .header("x-ratelimit-remaining-requests", "50")
            .header("x-ratelimit-remaining-tokens", "0")
            .header("x-ratelimit-reset-tokens", "20s"),
    );
    let routes = Routes::empty().route(
        Route::new(OPENAI)
            .limit(Limit::parse("openai#rpm").unwrap().signal(Signal::Requests))
            .limit(
                Limit::parse("openai#tpm")
                    .unwrap()
                    .cost(100)
                    .signal(Signal::Tokens),
            ),
    );
    let error = world
        .client_with(SluiceMiddleware::new(routes))
        .post(world.url(OPENAI, "/v1/chat/completions"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        sluice::Error::find_retry_in(&error),
        Some(Duration::from_secs(20))
    );
    // Tokens ran out: paused. Requests did not: lowered to what the vendor reports.
    let tpm = world.sluice().acquire("openai#tpm").await.unwrap_err();
    assert_eq!(tpm.retry_in(), Some(Duration::from_secs(20)));
    assert_eq!(world.available("openai#rpm").await, Tokens::new(50));
}

#[tokio::test]
async fn an_anthropic_429_without_retry_after_pauses_until_the_exhausted_limit_resets() {
    let world = World::new().await;
    world
        .bucket(
            "anthropic#rpm",
            Bucket::requests(RefillRate::per_second(10)),
        )
        .await;
    let reset = std::time::SystemTime::now() + Duration::from_secs(30);
    world.vendor.reply(
        "/v1/messages",
        Reply::status(429)
            .header("anthropic-ratelimit-requests-remaining", "0")
            .header("anthropic-ratelimit-requests-reset", rfc3339(reset)),
    );
    let error = world
        .client()
        .post(world.url(ANTHROPIC, "/v1/messages"))
        .send()
        .await
        .unwrap_err();
    let delay = sluice::Error::find_retry_in(&error).unwrap();
    // Whole seconds in the header, and real time passes while the test runs.
    assert!(
        delay > Duration::from_secs(27) && delay <= Duration::from_secs(30),
        "{delay:?}"
    );
    let other = world.sluice().acquire("anthropic#rpm").await.unwrap_err();
    assert_eq!(other.retry_in(), Some(delay));
}

#[tokio::test]
async fn a_429_on_a_concurrent_dimension_holds_every_slot_for_the_pause() {
    let world = World::new().await;
    world
        .bucket("elevenlabs#concurrent", Bucket::concurrent(4))
        .await;
    world.vendor.reply(
        "/v1/text-to-speech/voice",
        Reply::status(429).header("retry-after", "3"),
    );
    let error = world
        .client()
        .post(world.url(ELEVENLABS, "/v1/text-to-speech/voice"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        sluice::Error::find_retry_in(&error),
        Some(Duration::from_secs(3))
    );
    let denied = world
        .sluice()
        .acquire("elevenlabs#concurrent")
        .await
        .unwrap_err();
    assert_eq!(denied.retry_in(), Some(Duration::from_secs(3)));
    world.clock.advance(Duration::from_secs(3));
    let mut leases = Vec::new();
    for _ in 0..4 {
        leases.push(
            world
                .sluice()
                .acquire("elevenlabs#concurrent")
                .await
                .unwrap(),
        );
    }
    for lease in leases {
        lease.release().await.unwrap();
    }
    assert_eq!(
        world.available("elevenlabs#concurrent").await,
        Tokens::new(4)
    );
}

#[tokio::test]
async fn remaining_counts_lower_a_bucket_and_never_raise_it() {
    let world = World::new().await;
    world.bucket("openai#rpm", rpm(100)).await;
    let client = world.client();
    world.vendor.reply(
        "/v1/low",
        Reply::status(200)
            .header("x-ratelimit-remaining-requests", "40")
            .header("x-ratelimit-reset-requests", "6m0s"),
    );
    world.vendor.reply(
        "/v1/high",
        Reply::status(200).header("x-ratelimit-remaining-requests", "90"),
    );
    world.vendor.reply(
        "/v1/garbled",
        Reply::status(200).header("x-ratelimit-remaining-requests", "forty"),
    );
    client
        .get(world.url(OPENAI, "/v1/low"))
        .send()
        .await
        .unwrap();
    // A whole count with its reset: 40, to the reset's millisecond of refill.
    let close_to = |n: i64, a: Tokens| {
        Tokens::new(n) <= a && a < Tokens::new(n) + Tokens::from_nanos(10_000_000)
    };
    let available = world.available("openai#rpm").await;
    assert!(close_to(40, available), "{available}");
    client
        .get(world.url(OPENAI, "/v1/high"))
        .send()
        .await
        .unwrap();
    let available = world.available("openai#rpm").await;
    assert!(close_to(39, available), "{available}");
    let response = client
        .get(world.url(OPENAI, "/v1/garbled"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        200,
        "a malformed header is never an error"
    );
    let available = world.available("openai#rpm").await;
    assert!(close_to(38, available), "{available}");
}

#[tokio::test]
async fn without_feedback_a_429_is_handed_back_untouched() {
    let world = World::new().await;
    world.bucket("openai#rpm", rpm(10)).await;
    world
        .vendor
        .reply("/v1/limited", Reply::status(429).header("retry-after", "7"));
    let response = world
        .client_with(SluiceMiddleware::default().feedback(false))
        .get(world.url(OPENAI, "/v1/limited"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(world.available("openai#rpm").await, Tokens::new(9));
}

#[tokio::test]
async fn a_chat_body_is_charged_to_openai_tpm_by_its_token_estimate() {
    let world = World::new().await;
    world.bucket("openai#rpm", rpm(10)).await;
    world
        .bucket(
            "openai#tpm",
            Bucket::tokens(RefillRate::per_minute(100_000)),
        )
        .await;
    let routes = Routes::vendors().route(
        Route::new(OPENAI)
            .limit(Limit::parse("openai#rpm").unwrap().signal(Signal::Requests))
            .limit(
                Limit::parse("openai#tpm")
                    .unwrap()
                    .estimate(estimate::chat_tokens)
                    .signal(Signal::Tokens),
            ),
    );
    let client = world.client_with(SluiceMiddleware::new(routes));
    // 4 + 36 characters of prompt: 10 tokens, plus up to 500 generated.
    let body = r#"{"model":"gpt-4o","max_tokens":500,"messages":[{"role":"user","content":"Summarize the meeting notes below."}]}"#;
    client
        .post(world.url(OPENAI, "/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(world.available("openai#rpm").await, Tokens::new(9));
    assert_eq!(
        world.available("openai#tpm").await,
        Tokens::new(100_000 - 510)
    );
}

#[tokio::test]
async fn a_request_extension_overrides_the_route() {
    let world = World::new().await;
    world.bucket("openai#rpm", rpm(10)).await;
    world.bucket("openai#batch", rpm(100)).await;
    world.bucket("internal#rpm", rpm(10)).await;
    let client = world.client();
    client
        .get(world.url(OPENAI, "/v1/models"))
        .with_extension(Override::Bypass)
        .send()
        .await
        .unwrap();
    assert_eq!(world.available("openai#rpm").await, Tokens::new(10));
    client
        .post(world.url(OPENAI, "/v1/batches"))
        .with_extension(Override::Limits(vec![
            Limit::parse("openai#batch").unwrap().cost(25),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(world.available("openai#rpm").await, Tokens::new(10));
    assert_eq!(world.available("openai#batch").await, Tokens::new(75));
    // An unmapped host can be limited for one request too.
    client
        .get(world.url(OTHER, "/report"))
        .with_extension(Override::Limits(vec![
            Limit::parse("internal#rpm").unwrap(),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(world.available("internal#rpm").await, Tokens::new(9));
}

#[tokio::test]
async fn priorities_come_from_the_request_then_the_route_then_the_middleware() {
    let world = World::new().await;
    // 4 requests, 2 kept for `interactive` and 1 more for `standard`.
    let reserved = rpm(4)
        .with_reserve("interactive".parse().unwrap(), 2)
        .with_reserve("standard".parse().unwrap(), 1);
    world.bucket("openai#rpm", reserved).await;
    let routes = Routes::vendors().route(
        Route::new(OPENAI)
            .path_prefix("/v1/batches")
            .limit(Limit::parse("openai#rpm").unwrap())
            .priority("batch".parse().unwrap()),
    );
    let client =
        world.client_with(SluiceMiddleware::new(routes).priority("standard".parse().unwrap()));
    let denied = |r: Result<reqwest::Response, reqwest_middleware::Error>| {
        sluice::Error::find_retry_in(&r.unwrap_err()).is_some()
    };
    // The route's `batch` leaves 3: one request, then denied.
    let batches = || client.post(world.url(OPENAI, "/v1/batches"));
    batches().send().await.unwrap();
    assert!(denied(batches().send().await));
    // The middleware's `standard` leaves 2: one more (3 were left).
    let chats = || client.post(world.url(OPENAI, "/v1/chat/completions"));
    chats().send().await.unwrap();
    assert!(denied(chats().send().await));
    // A request's own priority comes first, on the route's limits…
    chats()
        .with_extension(Override::Priority("interactive".parse().unwrap()))
        .send()
        .await
        .unwrap();
    // …and with limits of its own.
    batches()
        .with_extension(Override::LimitsAt(
            vec![Limit::parse("openai#rpm").unwrap()],
            "interactive".parse().unwrap(),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(world.available("openai#rpm").await, Tokens::ZERO);
    assert_eq!(world.vendor.served(OPENAI), 4);
}

#[tokio::test]
async fn a_route_without_a_bucket_fails_loudly_unless_told_to_pass() {
    let world = World::new().await;
    let error = world
        .client()
        .get(world.url(ANTHROPIC, "/v1/models"))
        .send()
        .await
        .unwrap_err();
    assert!(matches!(
        &error,
        reqwest_middleware::Error::Middleware(e)
            if matches!(e.downcast_ref::<sluice::Error>(), Some(sluice::Error::UnknownDimension { .. }))
    ));
    assert!(error.to_string().contains("anthropic#rpm"), "{error}");
    assert_eq!(world.vendor.served(ANTHROPIC), 0);
    let response = world
        .client_with(SluiceMiddleware::default().pass_unknown_dimensions(true))
        .get(world.url(ANTHROPIC, "/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(world.vendor.served(ANTHROPIC), 1);
}

#[tokio::test]
async fn waiting_inline_gets_the_next_token() {
    let world = World::new().await;
    // Real time here: the wait is a real sleep of at most 100 ms.
    let sluice = Sluice::builder()
        .store_arc(world.store.clone())
        .build()
        .unwrap();
    sluice
        .put_bucket(
            "openai#rpm",
            Bucket::requests(RefillRate::per_second(10)).with_capacity(1),
        )
        .await
        .unwrap();
    let client = ClientBuilder::new(world.vendor.reqwest(&HOSTS))
        .with(
            SluiceMiddleware::default()
                .client(sluice)
                .wait(Duration::from_millis(500)),
        )
        .build();
    for _ in 0..2 {
        let response = client
            .get(world.url(OPENAI, "/v1/models"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(world.vendor.served(OPENAI), 2);
}

/// `SystemTime` as RFC 3339 in UTC, whole seconds (as Anthropic sends it).
fn rfc3339(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since the epoch.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem / 60 % 60,
        rem % 60
    )
}

#[tokio::test]
async fn a_caller_that_requeues_on_retry_in_gets_the_slot_another_client_freed() {
    let world = World::new().await;
    world
        .bucket("elevenlabs#concurrent", Bucket::concurrent(1))
        .await;
    let holder = world.sluice();
    let client = world.client();
    let send = || {
        client
            .post(world.url(ELEVENLABS, "/v1/text-to-speech/x"))
            .send()
    };
    // Released at once, or half-way through the wait the caller was given.
    for released_after in [Duration::ZERO, sluice::config::DEFAULT_SLOT_POLL / 2] {
        let held = holder.acquire("elevenlabs#concurrent").await.unwrap();
        let error = send().await.unwrap_err();
        let wait = sluice::Error::find_retry_in(&error).expect("a RetryIn");
        assert!(wait <= sluice::config::DEFAULT_SLOT_POLL, "{wait:?}");
        world.clock.advance(released_after);
        held.release().await.unwrap();
        // The caller requeues for the RetryIn, and the slot is there when it asks again.
        world.clock.advance(wait - released_after);
        let response = send().await.unwrap();
        assert!(response.status().is_success());
        // Its slot ends with the body.
        response.bytes().await.unwrap();
    }
    assert_eq!(world.leases().await, 0);
}
