//! reqwest middleware for [sluice]: requests to known vendor hosts run in a slot of a
//! shared, cross-process quota, and the vendor's own rate-limit answers (429s,
//! `retry-after`, remaining-count headers) tighten that quota for every process at once.
//!
//! ```no_run
//! use reqwest_middleware::ClientBuilder;
//! use sluice_reqwest::SluiceMiddleware;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(SluiceMiddleware::default()) // api.openai.com -> openai#rpm, ...
//!     .build();
//! match client.get("https://api.openai.com/v1/models").send().await {
//!     Ok(response) => println!("{}", response.status()),
//!     Err(e) => match sluice::Error::find_retry_in(&e) {
//!         Some(delay) => println!("requeue in {delay:?}"),
//!         None => return Err(e.into()),
//!     },
//! }
//! # Ok(()) }
//! ```
//!
//! See [`SluiceMiddleware`] for the behaviour, [`Routes`] for the routing table and its
//! defaults, and [`VendorLimits`] for the headers understood.

#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs` on nightly: items behind a feature say which.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod error;
pub mod estimate;
mod headers;
mod middleware;
mod model;
mod route;
mod usage;

pub use headers::{Signal, VendorLimits};
pub use middleware::{DEFAULT_PAUSE, SluiceMiddleware};
pub use route::{Limit, Override, Route, Routes};
