//! The middleware against the simulated vendor on loopback: streamed slots, usage
//! corrections, per-model routes and burst shapes learned from headers.

use std::time::Duration;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use serde_json::json;
use sluice::{Bucket, RefillRate, Sluice, Tokens, clock::ManualClock, clock::UnixMillis};
use sluice_reqwest::{Limit, Route, Routes, Signal, SluiceMiddleware, estimate};
use sluice_vendor_sim::{Shape, VendorConfig, VendorSim};

const OPENAI: &str = "api.openai.com";

struct World {
    vendor: VendorSim,
    sluice: Sluice,
    clock: ManualClock,
}

impl World {
    async fn new(config: VendorConfig) -> World {
        let clock = ManualClock::new(UnixMillis::from_secs(1_800_000_000));
        World {
            vendor: VendorSim::start(config).await,
            sluice: Sluice::builder()
                .store(sluice::MemoryStore::new())
                .clock(clock.clone())
                .build()
                .unwrap(),
            clock,
        }
    }

    async fn bucket(&self, dimension: &str, bucket: Bucket) {
        self.sluice.put_bucket(dimension, bucket).await.unwrap();
    }

    fn client(&self, routes: Routes) -> ClientWithMiddleware {
        self.client_with(SluiceMiddleware::new(routes))
    }

    /// A client through `middleware`, on this world's sluice, reaching the vendor.
    fn client_with(&self, middleware: SluiceMiddleware) -> ClientWithMiddleware {
        let http = reqwest::Client::builder()
            .resolve(OPENAI, self.vendor.addr())
            .build()
            .unwrap();
        ClientBuilder::new(http)
            .with(middleware.client(self.sluice.clone()))
            .build()
    }

    async fn available(&self, dimension: &str) -> Tokens {
        self.sluice.snapshot(dimension).await.unwrap().available
    }

    fn url(&self) -> String {
        self.vendor.url(OPENAI, "/v1/chat/completions")
    }
}

/// A vendor that streams `chunks` chunks, `delay_ms` apart.
fn streaming(chunks: u32, delay_ms: u64) -> VendorConfig {
    VendorConfig {
        stream_chunks: chunks,
        chunk_delay: Duration::from_millis(delay_ms),
        ..VendorConfig::default()
    }
}

/// Every request to the vendor takes `limit`.
fn one_route(limit: Limit) -> Routes {
    Routes::empty().route(Route::new(OPENAI).limit(limit))
}

/// A chat body: 40 characters of content and 4 of role are 11 prompt tokens, plus 100 to
/// generate: charged 111 before the call; the simulator reports 11 + 50 = 61 used.
fn chat(model: &str, stream: bool) -> serde_json::Value {
    json!({
        "model": model,
        "max_tokens": 100,
        "stream": stream,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "x".repeat(40)}],
    })
}

async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 2 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_holds_its_concurrent_slot_until_the_body_is_read_or_dropped() {
    let world = World::new(streaming(5, 30)).await;
    world
        .bucket("openai#concurrent", Bucket::concurrent(2))
        .await;
    let routes = one_route(Limit::parse("openai#concurrent").unwrap());
    let client = world.client(routes);

    let response = client
        .post(world.url())
        .body(chat("m", true).to_string())
        .send()
        .await
        .unwrap();
    // Headers are in, the vendor is still streaming: the slot is still held.
    assert_eq!(response.url().as_str(), world.url());
    assert_eq!(response.status(), 200);
    assert_eq!(world.available("openai#concurrent").await, Tokens::new(1));
    let body = response.text().await.unwrap();
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    // Read to the end: the slot came back before the caller saw the end.
    assert_eq!(world.available("openai#concurrent").await, Tokens::new(2));

    // Dropped half-way: the slot comes back too (in the background).
    let mut response = client
        .post(world.url())
        .body(chat("m", true).to_string())
        .send()
        .await
        .unwrap();
    response.chunk().await.unwrap();
    assert_eq!(world.available("openai#concurrent").await, Tokens::new(1));
    drop(response);
    until("the dropped stream's slot", async || {
        world.available("openai#concurrent").await == Tokens::new(2)
    })
    .await;
    assert_eq!(world.vendor.stats().max_in_flight, 1);
}

/// A streamed call holding a slot is renewed while it is read, past its TTL (300 ms, the
/// stream 1 s), and read to its end; one whose slot is reclaimed meanwhile (its process
/// frozen past the TTL, the reconciler giving the slot back) is cut with `LeaseNotFound`,
/// and the slot is given back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_outliving_its_ttl_is_read_whole_and_one_whose_slot_is_reclaimed_is_cut() {
    let world = World::new(streaming(20, 50)).await;
    world
        .bucket("openai#concurrent", Bucket::concurrent(1))
        .await;
    let routes = one_route(Limit::parse("openai#concurrent").unwrap());
    let client =
        world.client_with(SluiceMiddleware::new(routes).lease_ttl(Duration::from_millis(300)));
    let response = client
        .post(world.url())
        .body(chat("m", true).to_string())
        .send()
        .await
        .unwrap();
    response.bytes().await.unwrap();
    until("the whole stream's slot", async || {
        world.available("openai#concurrent").await == Tokens::new(1)
    })
    .await;

    let mut response = client
        .post(world.url())
        .body(chat("m", true).to_string())
        .send()
        .await
        .unwrap();
    response.chunk().await.unwrap();
    // As if frozen past its expiry and the clock-skew margin: the reconciler gives the
    // slot back, and the holder learns it at its next renewal.
    world.clock.advance(Duration::from_secs(5));
    let report = world.sluice.reconcile().await.unwrap();
    assert_eq!(report.leases_restored, 1, "{report:?}");
    let error = loop {
        match response.chunk().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream of a reclaimed slot was read to its end"),
            Err(error) => break error,
        }
    };
    let lost = std::iter::successors(Some(&error as &dyn std::error::Error), |e| e.source())
        .find_map(|e| e.downcast_ref::<sluice::Error>());
    assert!(
        matches!(lost, Some(sluice::Error::LeaseNotFound(_))),
        "{error:?}"
    );
    assert_eq!(world.available("openai#concurrent").await, Tokens::new(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_held_only_for_its_usage_may_outlive_the_lease() {
    let world = World::new(streaming(10, 50)).await;
    world
        .bucket(
            "openai#tpm",
            Bucket::tokens(RefillRate::per_minute(100_000)),
        )
        .await;
    let routes = one_route(
        Limit::parse("openai#tpm")
            .unwrap()
            .estimate(estimate::chat_tokens)
            .signal(Signal::Tokens),
    );
    let client =
        world.client_with(SluiceMiddleware::new(routes).lease_ttl(Duration::from_millis(200)));
    // Half a second of stream on a 200 ms lease: no slot to hand on, nothing is cut, and
    // the usage still corrects the charge.
    let body = client
        .post(world.url())
        .body(chat("m", true).to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    assert_eq!(
        world.available("openai#tpm").await,
        Tokens::new(100_000 - 61)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokens_charge_becomes_the_reported_usage_whole_or_streamed() {
    let world = World::new(VendorConfig::default()).await;
    let tpm = Bucket::tokens(RefillRate::per_minute(100_000));
    world.bucket("openai#tpm", tpm).await;
    world
        .bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(600)))
        .await;
    let route = Route::new(OPENAI)
        .limit(Limit::parse("openai#rpm").unwrap().signal(Signal::Requests))
        .limit(
            Limit::parse("openai#tpm")
                .unwrap()
                .estimate(estimate::chat_tokens)
                .signal(Signal::Tokens),
        );
    let client = world.client(Routes::empty().route(route.clone()));
    let mut expected = 100_000;
    for stream in [false, true] {
        let response = client
            .post(world.url())
            .body(chat("m", stream).to_string())
            .send()
            .await
            .unwrap();
        // Until the body is read, the estimate is charged.
        assert_eq!(
            world.available("openai#tpm").await,
            Tokens::new(expected - 111),
            "stream: {stream}"
        );
        response.bytes().await.unwrap();
        expected -= 61;
        assert_eq!(
            world.available("openai#tpm").await,
            Tokens::new(expected),
            "stream: {stream}"
        );
    }
    // Opted out on the route: the estimate stays.
    let client = world.client(Routes::empty().route(route.correct_usage(false)));
    client
        .post(world.url())
        .body(chat("m", false).to_string())
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(
        world.available("openai#tpm").await,
        Tokens::new(expected - 111)
    );
    // What the vendor charged, once corrected, is what sluice charged where it corrected.
    assert_eq!(world.vendor.stats().tokens, 61 * 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_model_routes_take_their_models_dimensions_and_fall_back_otherwise() {
    let world = World::new(VendorConfig::default()).await;
    for dimension in ["openai#rpm", "openai#mini-rpm", "openai#4o-rpm"] {
        world
            .bucket(dimension, Bucket::requests(RefillRate::per_minute(600)))
            .await;
    }
    let route = Route::new(OPENAI)
        .limit(Limit::parse("openai#rpm").unwrap())
        .model("gpt-4o-mini*", [Limit::parse("openai#mini-rpm").unwrap()])
        .model("gpt-4o", [Limit::parse("openai#4o-rpm").unwrap()]);
    let client = world.client(Routes::empty().route(route));
    let cases = [
        ("gpt-4o-mini-2024-07-18", [600, 599, 600]),
        ("gpt-4o", [600, 599, 599]),
        ("o3", [599, 599, 599]),
    ];
    for (model, want) in cases {
        client
            .post(world.url())
            .body(chat(model, false).to_string())
            .send()
            .await
            .unwrap();
        let mut got = Vec::new();
        for dimension in ["openai#rpm", "openai#mini-rpm", "openai#4o-rpm"] {
            got.push(world.available(dimension).await);
        }
        assert_eq!(got, want.map(Tokens::new), "{model}");
    }
    // A body with no model (or not JSON) takes the route's own limits.
    client.post(world.url()).body("plain").send().await.unwrap();
    assert_eq!(world.available("openai#rpm").await, Tokens::new(598));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vendors_burst_is_learned_from_its_headers_and_never_loosens_the_bucket() {
    // The vendor enforces 600 a minute as 10 a second; sluice is told 600 a minute.
    let world = World::new(VendorConfig {
        rpm: 600,
        shape: Shape::PerSecond,
        ..VendorConfig::default()
    })
    .await;
    world
        .bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(600)))
        .await;
    let routes = one_route(Limit::parse("openai#rpm").unwrap().signal(Signal::Requests));
    let client = world.client(routes);
    client
        .post(world.url())
        .body(chat("m", false).to_string())
        .send()
        .await
        .unwrap();
    let row = world.sluice.bucket("openai#rpm").await.unwrap().unwrap();
    assert_eq!(
        row.bucket.capacity(),
        Tokens::new(600),
        "the definition is untouched"
    );
    assert_eq!(row.burst, Some(Tokens::new(10)));
    let after_first = world.available("openai#rpm").await;
    // 9 left after this call (a whole count: maybe 9.9), not the bucket's 599.
    assert!(after_first <= Tokens::new(10), "{after_first}");
    // The vendor now takes its whole minute at once: the bound lifts, but no token is
    // added by a report.
    world.vendor.reset(VendorConfig::default());
    client
        .post(world.url())
        .body(chat("m", false).to_string())
        .send()
        .await
        .unwrap();
    let row = world.sluice.bucket("openai#rpm").await.unwrap().unwrap();
    assert_eq!(row.burst, None);
    assert_eq!(
        world.available("openai#rpm").await,
        after_first - Tokens::new(1)
    );
}
