//! `SluiceMiddleware`: a small vendor client with retries, sharing one quota.
//!
//! A stand-in for `api.openai.com` listens on loopback (the client resolves the real host
//! name to it). It reports `x-ratelimit-remaining-requests` on every answer and, once, says
//! 429 with `retry-after: 2` and no requests remaining: `openai#rpm` pauses for every
//! process sharing it, `openai#tpm` is left alone. The client stacks reqwest-retry (outside, for transient
//! failures) and sluice (inside), charges `openai#rpm` per request and `openai#tpm` by each
//! chat body's token estimate, and requeues on RetryIn by sleeping exactly that long.
//! Runs on the in-memory store.
//!
//! ```text
//! cargo run -p sluice-examples --example reqwest_vendor
//! ```
#![allow(clippy::print_stdout)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use reqwest_middleware::ClientBuilder;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;
use sluice::{Bucket, RefillRate, Sluice};
use sluice_reqwest::{Limit, Route, Routes, Signal, SluiceMiddleware, estimate};

/// The stand-in vendor: 60 requests a minute by its own count, and one 429 on the 4th call.
async fn vendor() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    let calls = Arc::new(AtomicU32::new(0));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let calls = calls.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_: hyper::Request<Incoming>| {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    async move {
                        let mut response =
                            hyper::Response::new(Full::new(Bytes::from_static(b"{}")));
                        // The 4th answer says requests ran out.
                        let remaining = if n == 4 { 0 } else { 60u32.saturating_sub(n) };
                        let remaining = remaining.to_string();
                        let headers = response.headers_mut();
                        headers.insert(
                            "x-ratelimit-remaining-requests",
                            remaining.parse().expect("a number is a header value"),
                        );
                        headers.insert(
                            "x-ratelimit-reset-requests",
                            hyper::header::HeaderValue::from_static("1s"),
                        );
                        if n == 4 {
                            headers.insert(
                                "retry-after",
                                hyper::header::HeaderValue::from_static("2"),
                            );
                            *response.status_mut() = hyper::StatusCode::TOO_MANY_REQUESTS;
                        }
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = vendor().await;
    let sluice = Sluice::in_memory();
    sluice
        .put_bucket(
            "openai#rpm",
            Bucket::requests(RefillRate::per_minute(120)).with_capacity(100),
        )
        .await?;
    sluice
        .put_bucket("openai#tpm", Bucket::tokens(RefillRate::per_minute(40_000)))
        .await?;

    let routes = Routes::vendors().route(
        Route::new("api.openai.com")
            .limit(Limit::parse("openai#rpm")?.signal(Signal::Requests))
            .limit(
                Limit::parse("openai#tpm")?
                    .estimate(estimate::chat_tokens)
                    .signal(Signal::Tokens),
            ),
    );
    let http = reqwest::Client::builder()
        .resolve("api.openai.com", addr)
        .build()?;
    let client = ClientBuilder::new(http)
        .with(RetryTransientMiddleware::new_with_policy(
            ExponentialBackoff::builder().build_with_max_retries(3),
        ))
        .with(SluiceMiddleware::new(routes).client(sluice.clone()))
        .build();

    let url = format!("http://api.openai.com:{}/v1/chat/completions", addr.port());
    let body = r#"{"model":"gpt-4o","max_tokens":200,"messages":[{"role":"user","content":"Write a haiku about shared quotas."}]}"#;
    let started = Instant::now();
    let mut done = 0;
    while done < 6 {
        let elapsed = started.elapsed().as_secs_f64();
        match client.post(&url).body(body).send().await {
            Ok(response) => {
                done += 1;
                let rpm = sluice.snapshot("openai#rpm").await?;
                let tpm = sluice.snapshot("openai#tpm").await?;
                println!(
                    "{elapsed:5.2}s  call {done}: {}  openai#rpm available {}  openai#tpm available {}",
                    response.status(),
                    rpm.available,
                    tpm.available,
                );
            }
            Err(error) => match sluice::Error::find_retry_in(&error) {
                Some(delay) => {
                    println!("{elapsed:5.2}s  rate limited: requeue in {delay:?}");
                    tokio::time::sleep(delay).await;
                }
                None => return Err(error.into()),
            },
        }
    }
    println!(
        "six calls in {:.1}s; the vendor's 429 paused openai#rpm for every process sharing it",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
