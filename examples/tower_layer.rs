//! `SluiceLayer`: a shared quota in front of an outbound HTTP client built from tower.
//!
//! A stand-in vendor listens on loopback. The client is hyper-util's, wrapped in a
//! `SluiceLayer` on `vendor#rpm` (3 requests, refilling 2 per second). Ten requests go out;
//! those the quota refuses come back as a RetryIn error, which this caller honours by
//! sleeping exactly that long before trying again. Runs on the in-memory store.
//!
//! ```text
//! cargo run -p sluice-examples --example tower_layer
//! ```
#![allow(clippy::print_stdout)]

use std::convert::Infallible;

use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice::{Bucket, RefillRate, Sluice};
use sluice_tower::SluiceLayer;
use tower::{Service, ServiceBuilder, ServiceExt};

/// A stand-in for the vendor's API, on loopback.
async fn vendor() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_: hyper::Request<Incoming>| async {
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
                        b"completion",
                    ))))
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
async fn main() -> Result<(), sluice_tower::BoxError> {
    let addr = vendor().await;
    let sluice = Sluice::in_memory();
    sluice
        .put_bucket(
            "vendor#rpm",
            Bucket::requests(RefillRate::per_second(2)).with_capacity(3),
        )
        .await?;

    let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut client = ServiceBuilder::new()
        .layer(SluiceLayer::new("vendor#rpm").client(sluice))
        .service(http);

    let started = tokio::time::Instant::now();
    for i in 0..10 {
        loop {
            let request = hyper::Request::get(format!("http://{addr}/v1/completions"))
                .body(Empty::<Bytes>::new())?;
            match client.ready().await?.call(request).await {
                Ok(response) => {
                    let body = response.into_body().collect().await?.to_bytes();
                    println!(
                        "{:>5} ms  request {i}: {}",
                        started.elapsed().as_millis(),
                        String::from_utf8_lossy(&body)
                    );
                    break;
                }
                Err(e) => match sluice::Error::find_retry_in(&*e) {
                    Some(delay) => {
                        println!(
                            "{:>5} ms  request {i}: quota used up, retrying in {} ms",
                            started.elapsed().as_millis(),
                            delay.as_millis()
                        );
                        tokio::time::sleep(delay).await;
                    }
                    None => return Err(e),
                },
            }
        }
    }
    Ok(())
}
