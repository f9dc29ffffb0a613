//! The layer against `tower-test` mocks and against a real HTTP client and server on
//! loopback.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use sluice::{Bucket, RefillRate, Sluice, Tokens, clock::ManualClock, clock::UnixMillis};
use sluice_tower::SluiceLayer;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_test::mock;

fn clock() -> ManualClock {
    ManualClock::new(UnixMillis::from_secs(1_700_000_000))
}

async fn client() -> Sluice {
    let sluice = Sluice::builder()
        .store(sluice::MemoryStore::new())
        .clock(clock())
        .build()
        .unwrap();
    sluice
        .put_bucket(
            "vendor#rpm",
            Bucket::requests(RefillRate::per_second(2)).with_capacity(3),
        )
        .await
        .unwrap();
    sluice
        .put_bucket("vendor#concurrent", Bucket::concurrent(1))
        .await
        .unwrap();
    sluice
}

async fn available(sluice: &Sluice, dimension: &str) -> Tokens {
    sluice.snapshot(dimension).await.unwrap().available
}

async fn leases(sluice: &Sluice) -> usize {
    sluice.leases(&Default::default()).await.unwrap().len()
}

#[tokio::test]
async fn each_call_takes_one_token_and_reaches_the_inner_service() {
    let sluice = client().await;
    let (inner, mut handle) = mock::pair::<&'static str, &'static str>();
    let mut svc = SluiceLayer::new("vendor#rpm")
        .client(sluice.clone())
        .layer(inner);
    let response = tokio::spawn(svc.ready().await.unwrap().call("hello"));
    let (request, send) = handle.next_request().await.unwrap();
    assert_eq!(request, "hello");
    send.send_response("world");
    assert_eq!(response.await.unwrap().unwrap(), "world");
    assert_eq!(available(&sluice, "vendor#rpm").await, Tokens::new(2));
    assert_eq!(
        leases(&sluice).await,
        0,
        "released when the response completed"
    );
}

/// With several dimensions, the refusal names the one that was short and its wait: the
/// caller requeues by it.
#[tokio::test]
async fn a_refusal_names_the_dimension_that_was_short() {
    let sluice = client().await;
    sluice
        .put_bucket(
            "vendor#tpm",
            Bucket::tokens(RefillRate::per_second(4)).with_capacity(1),
        )
        .await
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(
            SluiceLayer::new("vendor#rpm")
                .and("vendor#tpm")
                .client(sluice.clone()),
        )
        .service_fn(|n: u32| async move { Ok::<_, Infallible>(n + 1) });
    assert_eq!(svc.ready().await.unwrap().call(1).await.unwrap(), 2);
    let e = svc.ready().await.unwrap().call(1).await.unwrap_err();
    let refusal = sluice::Error::find_refusal(&*e).expect("a RetryIn");
    let short: Vec<&str> = refusal.short.iter().map(|s| s.dimension.as_str()).collect();
    // Requests are there (2 of 3); a token comes back in a quarter of a second.
    assert_eq!(short, ["vendor#tpm"]);
    assert_eq!(refusal.delay, Duration::from_millis(250));
    assert_eq!(
        refusal.delay_of("vendor#tpm"),
        Some(Duration::from_millis(250))
    );
    assert_eq!(refusal.at, sluice.now().saturating_add(refusal.delay));
    assert_eq!(available(&sluice, "vendor#rpm").await, Tokens::new(2));
}

#[tokio::test]
async fn retry_in_is_a_downcastable_error_with_the_exact_delay_and_the_inner_is_not_called() {
    let sluice = client().await;
    let (inner, mut handle) = mock::pair::<&'static str, &'static str>();
    let mut svc = SluiceLayer::new("vendor#rpm")
        .client(sluice.clone())
        .layer(inner);
    for _ in 0..3 {
        let f = tokio::spawn(svc.ready().await.unwrap().call("x"));
        handle.next_request().await.unwrap().1.send_response("ok");
        f.await.unwrap().unwrap();
    }
    let e = svc.ready().await.unwrap().call("x").await.unwrap_err();
    let refused = e.downcast_ref::<sluice::Error>().expect("a sluice::Error");
    assert_eq!(refused.retry_in(), Some(Duration::from_millis(500)));
    assert_eq!(
        sluice::Error::find_retry_in(&*e),
        Some(Duration::from_millis(500))
    );
    assert_eq!(
        e.to_string(),
        "rate limited: `vendor#rpm` short: retry in 500ms"
    );
    assert!(
        handle.next_request().now_or_never().is_none(),
        "the inner service was not called"
    );
}

#[tokio::test]
async fn a_client_in_shadow_mode_is_never_refused_and_counts_what_would_have_been() {
    let enforcing = client().await;
    let shadow = Sluice::builder()
        .store_arc(enforcing.store().clone())
        .clock(clock())
        .mode(sluice::Mode::Shadow)
        .build()
        .unwrap();
    let (inner, mut handle) = mock::pair::<&'static str, &'static str>();
    let mut svc = SluiceLayer::new("vendor#rpm")
        .client(shadow.clone())
        .layer(inner);
    for _ in 0..5 {
        let f = tokio::spawn(svc.ready().await.unwrap().call("x"));
        handle.next_request().await.unwrap().1.send_response("ok");
        f.await.unwrap().unwrap();
    }
    // Three held, five taken: the enforcing client sees the debt.
    assert_eq!(available(&enforcing, "vendor#rpm").await, Tokens::new(-2));
    assert_eq!(
        enforcing
            .snapshot("vendor#rpm")
            .await
            .unwrap()
            .shadow_refused,
        2
    );
    assert!(matches!(
        enforcing.acquire("vendor#rpm").await,
        Err(sluice::Error::RetryIn(sluice::RetryIn { delay: d, .. })) if d == Duration::from_millis(1_500)
    ));
}

#[tokio::test]
async fn a_fixed_priority_keeps_the_reserves_above_it_and_a_per_request_one_wins() {
    let sluice = client().await;
    let reserved = Bucket::requests(RefillRate::per_second(2))
        .with_capacity(3)
        .with_reserve("interactive".parse().unwrap(), 2);
    sluice
        .put_bucket("vendor#reserved", reserved)
        .await
        .unwrap();
    let (inner, mut handle) = mock::pair::<bool, &'static str>();
    let mut svc = SluiceLayer::per_request(|interactive: &bool| {
        let request = sluice::Acquire::new("vendor#reserved");
        if *interactive {
            request.priority("interactive".parse().unwrap())
        } else {
            request
        }
    })
    .priority("batch".parse().unwrap())
    .client(sluice.clone())
    .layer(inner);
    let f = tokio::spawn(svc.ready().await.unwrap().call(false));
    handle.next_request().await.unwrap().1.send_response("ok");
    f.await.unwrap().unwrap();
    // Two left, kept for `interactive`: the layer's `batch` is refused a whole refill.
    let e = svc.ready().await.unwrap().call(false).await.unwrap_err();
    assert_eq!(
        sluice::Error::find_retry_in(&*e),
        Some(Duration::from_millis(500))
    );
    for _ in 0..2 {
        let f = tokio::spawn(svc.ready().await.unwrap().call(true));
        handle.next_request().await.unwrap().1.send_response("ok");
        f.await.unwrap().unwrap();
    }
    assert_eq!(available(&sluice, "vendor#reserved").await, Tokens::ZERO);
}

#[tokio::test]
async fn the_lease_is_released_when_the_inner_service_fails() {
    let sluice = client().await;
    let (inner, mut handle) = mock::pair::<&'static str, &'static str>();
    let mut svc = SluiceLayer::new("vendor#concurrent")
        .client(sluice.clone())
        .layer(inner);
    let response = tokio::spawn(svc.ready().await.unwrap().call("x"));
    let (_, send) = handle.next_request().await.unwrap();
    assert_eq!(
        available(&sluice, "vendor#concurrent").await,
        Tokens::ZERO,
        "held during the call"
    );
    send.send_error(std::io::Error::other("vendor down"));
    let e = response.await.unwrap().unwrap_err();
    assert!(e.to_string().contains("vendor down"));
    assert_eq!(
        available(&sluice, "vendor#concurrent").await,
        Tokens::new(1)
    );
    assert_eq!(leases(&sluice).await, 0);
}

#[tokio::test]
async fn the_lease_is_released_when_the_response_future_is_dropped() {
    let sluice = client().await;
    let (inner, mut handle) = mock::pair::<&'static str, &'static str>();
    let mut svc = SluiceLayer::new("vendor#concurrent")
        .client(sluice.clone())
        .layer(inner);
    let response = tokio::spawn(svc.ready().await.unwrap().call("x"));
    let (_request, _send) = handle.next_request().await.unwrap();
    assert_eq!(available(&sluice, "vendor#concurrent").await, Tokens::ZERO);
    response.abort();
    assert!(response.await.unwrap_err().is_cancelled());
    for _ in 0..200 {
        if available(&sluice, "vendor#concurrent").await == Tokens::new(1)
            && leases(&sluice).await == 0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the dropped future's lease was not released");
}

#[tokio::test]
async fn poll_ready_never_takes_a_lease() {
    let sluice = client().await;
    let (inner, mut handle) = mock::pair::<&'static str, &'static str>();
    handle.allow(0);
    let mut svc = SluiceLayer::new("vendor#concurrent")
        .client(sluice.clone())
        .layer(inner);
    assert!(
        svc.ready().now_or_never().is_none(),
        "not ready while the inner is not"
    );
    handle.allow(1);
    svc.ready().await.unwrap();
    assert_eq!(leases(&sluice).await, 0, "ready, but nothing taken");
    assert_eq!(
        available(&sluice, "vendor#concurrent").await,
        Tokens::new(1)
    );
}

#[tokio::test]
async fn clones_share_one_bucket() {
    let sluice = client().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(SluiceLayer::new("vendor#rpm").client(sluice.clone()))
        .service_fn(move |_: ()| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(()) }
        });
    let mut granted = 0;
    let mut limited = 0;
    for _ in 0..10 {
        let mut clone = svc.clone();
        match clone.ready().await.unwrap().call(()).await {
            Ok(()) => granted += 1,
            Err(e) if sluice::Error::find_retry_in(&*e).is_some() => limited += 1,
            Err(e) => panic!("unexpected: {e}"),
        }
    }
    assert_eq!(
        (granted, limited),
        (3, 7),
        "ten clones, one bucket of three"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

mod http_on_loopback {
    use super::*;
    use http_body_util::{BodyExt as _, Empty, Full};
    use hyper::body::{Bytes, Incoming};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    /// A vendor on loopback that counts the requests it serves.
    async fn vendor() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let count = count.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |_req: hyper::Request<Incoming>| {
                            count.fetch_add(1, Ordering::SeqCst);
                            async {
                                Ok::<_, Infallible>(hyper::Response::new(Full::new(
                                    Bytes::from_static(b"ok"),
                                )))
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, served)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_requests_through_a_real_http_client_get_at_most_the_bucket() {
        let (addr, served) = vendor().await;
        let sluice = Sluice::builder()
            .store(sluice::MemoryStore::new())
            .clock(clock())
            .build()
            .unwrap();
        sluice
            .put_bucket(
                "vendor#rpm",
                Bucket::requests(RefillRate::per_minute(1)).with_capacity(4),
            )
            .await
            .unwrap();
        let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let svc = ServiceBuilder::new()
            .layer(SluiceLayer::new("vendor#rpm").client(sluice.clone()))
            .service(http);
        let mut tasks = Vec::new();
        for _ in 0..12 {
            let mut svc = svc.clone();
            let uri: hyper::Uri = format!("http://{addr}/v1/chat").parse().unwrap();
            tasks.push(tokio::spawn(async move {
                let request = hyper::Request::get(uri)
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                svc.ready().await.unwrap().call(request).await
            }));
        }
        let (mut ok, mut limited) = (0, 0);
        for t in tasks {
            match t.await.unwrap() {
                Ok(response) => {
                    assert_eq!(response.status(), 200);
                    assert_eq!(
                        response.into_body().collect().await.unwrap().to_bytes(),
                        "ok"
                    );
                    ok += 1;
                }
                Err(e) => {
                    assert!(sluice::Error::find_retry_in(&*e).is_some(), "{e}");
                    limited += 1;
                }
            }
        }
        assert_eq!((ok, limited), (4, 8));
        assert_eq!(
            served.load(Ordering::SeqCst),
            4,
            "the vendor saw only the granted requests"
        );
        assert_eq!(leases(&sluice).await, 0);
    }
}

#[cfg(feature = "http")]
mod too_many_requests {
    use super::*;
    use sluice_tower::TooManyRequestsLayer;

    #[tokio::test]
    async fn retry_in_becomes_429_with_retry_after_rounded_up() {
        let sluice = Sluice::builder()
            .store(sluice::MemoryStore::new())
            .clock(clock())
            .build()
            .unwrap();
        // 5 tokens per 6 s: the next token is 1.2 s away, advertised as 2 s.
        sluice
            .put_bucket(
                "inbound#rpm",
                Bucket::requests(RefillRate::new(5, Duration::from_secs(6))).with_capacity(1),
            )
            .await
            .unwrap();
        let mut svc = ServiceBuilder::new()
            .layer(TooManyRequestsLayer)
            .layer(SluiceLayer::new("inbound#rpm").client(sluice))
            .service_fn(|_: http::Request<()>| async {
                Ok::<_, Infallible>(http::Response::new(String::from("served")))
            });
        let first = svc
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        assert_eq!(
            (first.status(), first.body().as_str()),
            (http::StatusCode::OK, "served")
        );
        let limited = svc
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        assert_eq!(limited.status(), http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(limited.headers()[http::header::RETRY_AFTER], "2");
        assert_eq!(limited.body(), "");
    }
}

#[tokio::test]
async fn a_caller_that_requeues_on_retry_in_gets_the_slot_another_client_freed() {
    let clock = clock();
    let store = Arc::new(sluice::MemoryStore::new());
    let on_store = || {
        Sluice::builder()
            .store_arc(store.clone())
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let holder = on_store();
    holder
        .put_bucket("vendor#concurrent", Bucket::concurrent(1))
        .await
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(SluiceLayer::new("vendor#concurrent").client(on_store()))
        .service_fn(|n: u32| async move { Ok::<_, Infallible>(n + 1) });
    for released_after in [Duration::ZERO, sluice::config::DEFAULT_SLOT_POLL / 2] {
        let held = holder.acquire("vendor#concurrent").await.unwrap();
        let e = svc.ready().await.unwrap().call(1).await.unwrap_err();
        let wait = sluice::Error::find_retry_in(&*e).expect("a RetryIn");
        assert!(wait <= sluice::config::DEFAULT_SLOT_POLL, "{wait:?}");
        clock.advance(released_after);
        held.release().await.unwrap();
        // The caller requeues for the RetryIn, and the slot is there when it asks again.
        clock.advance(wait - released_after);
        assert_eq!(svc.ready().await.unwrap().call(1).await.unwrap(), 2);
    }
}
