//! A [tower] `Layer` that puts a shared, cross-process [sluice] quota in front of any
//! service: outbound HTTP clients (hyper-util, reqwest as a tower service), tonic channels,
//! or anything else that is a `tower::Service`.
//!
//! ```
//! use std::time::Duration;
//! use sluice::{Bucket, clock::ManualClock, MemoryStore, RefillRate, Sluice, clock::UnixMillis};
//! use sluice_tower::SluiceLayer;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! // A fixed clock keeps the example exact; real code uses the system clock.
//! let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
//! let sluice = Sluice::builder().store(MemoryStore::new()).clock(clock).build().unwrap();
//! sluice.put_bucket("vendor#rpm", Bucket::requests(RefillRate::per_minute(60)).with_capacity(1)).await.unwrap();
//!
//! let mut svc = ServiceBuilder::new()
//!     .layer(SluiceLayer::new("vendor#rpm").client(sluice))
//!     .service_fn(|name: &'static str| async move { Ok::<_, std::convert::Infallible>(format!("hello {name}")) });
//!
//! assert_eq!(svc.ready().await.unwrap().call("world").await.unwrap(), "hello world");
//! // The bucket is empty now: the error says exactly when to retry, and which dimension
//! // was short (the boxed `sluice::Error::RetryIn`).
//! let e = svc.ready().await.unwrap().call("again").await.unwrap_err();
//! assert_eq!(sluice::Error::find_retry_in(&*e), Some(Duration::from_secs(1)));
//! let refusal = sluice::Error::find_refusal(&*e).unwrap();
//! assert_eq!(refusal.delay_of("vendor#rpm"), Some(Duration::from_secs(1)));
//! # });
//! ```
//!
//! [tower]: https://docs.rs/tower
//! [sluice]: https://docs.rs/sluice-limiter

#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs` on nightly: items behind a feature say which.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod future;
#[cfg(feature = "http")]
mod http;
mod layer;
mod service;

pub use error::BoxError;
pub use future::ResponseFuture;
#[cfg(feature = "http")]
pub use http::{TooManyRequests, TooManyRequestsLayer};
pub use layer::{AcquireFor, Fixed, SluiceLayer};
pub use service::SluiceService;
