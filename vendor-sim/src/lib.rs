//! A simulated LLM vendor on loopback, written for sluice's tests and its shared-quota demo.
//!
//! It answers OpenAI-style chat completions (`POST` any path, JSON body with `model`,
//! `messages`, `max_tokens`, optional `stream` and `stream_options.include_usage`) and
//! enforces, per API key (the bearer token), a requests and a tokens limit the way the
//! big vendors do:
//!
//! - **Burst shape**: [`Shape::PerMinute`] holds a minute's worth; [`Shape::PerSecond`]
//!   enforces the same per-minute limit as a second's worth at a time (OpenAI: "600 RPM may
//!   be enforced as 10 per second").
//! - **Tokens**: a request is charged its prompt (characters / 4, rounded up) plus its
//!   `max_tokens` when admitted; the charge is corrected to the actual usage when the
//!   response ends.
//! - **Headers** on every answer: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`
//!   (reset: time until full, Go-style), and on a 429 `retry-after-ms`.
//! - **Concurrency**: an optional cap on calls in flight (a streamed call is in flight until
//!   its body ends or is dropped), and the most seen at once.
//!
//! ```
//! use sluice_vendor_sim::{Shape, VendorConfig, VendorSim};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let vendor = VendorSim::start(VendorConfig { rpm: 600, shape: Shape::PerSecond, ..VendorConfig::default() }).await;
//! assert_eq!(vendor.stats().accepted, 0);
//! # });
//! ```

#![forbid(unsafe_code)]

mod bucket;
mod reply;
mod stats;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use bucket::Bucket;
pub use stats::{Second, Stats};

/// How the vendor spreads its per-minute limits over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A minute's worth at once.
    PerMinute,
    /// A second's worth at once (a sixtieth of the per-minute limit), refilled at the same
    /// rate.
    PerSecond,
}

/// The vendor's limits and manners.
#[derive(Debug, Clone)]
pub struct VendorConfig {
    /// Requests per minute, per key.
    pub rpm: u64,
    /// Tokens per minute, per key.
    pub tpm: u64,
    /// How the limits are enforced over time.
    pub shape: Shape,
    /// Calls in flight at once, per key (`None`: no cap).
    pub concurrent: Option<u64>,
    /// Time before the response headers.
    pub latency: Duration,
    /// Extra latency, spread evenly over requests: 0 to this much more.
    pub jitter: Duration,
    /// Completion tokens used, as a percentage of `max_tokens` (at least 1).
    pub completion_percent: u64,
    /// Chunks of a streamed response (before its usage and `[DONE]`).
    pub stream_chunks: u32,
    /// Time between streamed chunks.
    pub chunk_delay: Duration,
}

impl Default for VendorConfig {
    fn default() -> Self {
        VendorConfig {
            rpm: 600,
            tpm: 1_000_000,
            shape: Shape::PerMinute,
            concurrent: None,
            latency: Duration::from_millis(20),
            jitter: Duration::ZERO,
            completion_percent: 50,
            stream_chunks: 4,
            chunk_delay: Duration::from_millis(20),
        }
    }
}

/// One key's limits and counters.
#[derive(Debug)]
struct Key {
    requests: Bucket,
    tokens: Bucket,
    in_flight: u64,
}

#[derive(Debug)]
struct State {
    config: VendorConfig,
    started: Instant,
    keys: HashMap<String, Key>,
    stats: Stats,
    served: u64,
}

/// The running vendor: stopped when the runtime that started it stops.
#[derive(Debug, Clone)]
pub struct VendorSim {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl VendorSim {
    /// Starts the vendor on a free loopback port.
    pub async fn start(config: VendorConfig) -> VendorSim {
        Self::start_on(config, 0)
            .await
            .expect("a loopback port is free")
    }

    /// Starts the vendor on loopback `port` (0: any free one).
    pub async fn start_on(config: VendorConfig, port: u16) -> std::io::Result<VendorSim> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let vendor = VendorSim {
            addr: listener.local_addr()?,
            state: Arc::new(Mutex::new(State {
                config,
                started: Instant::now(),
                keys: HashMap::new(),
                stats: Stats::default(),
                served: 0,
            })),
        };
        let server = vendor.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let server = server.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                            let server = server.clone();
                            async move { Ok::<_, Infallible>(server.answer(req).await) }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(vendor)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://{host}:{port}{path}`: reach it under `host` with a client that resolves
    /// `host` to [`addr`](Self::addr).
    pub fn url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.addr.port())
    }

    /// What it has served so far.
    pub fn stats(&self) -> Stats {
        let state = self.lock();
        let mut stats = state.stats.clone();
        stats.elapsed = state.started.elapsed();
        stats
    }

    /// Whole requests `key` has left now.
    pub fn requests_left(&self, key: &str) -> u64 {
        let now = Instant::now();
        self.lock().key(key, now).requests.remaining(now)
    }

    /// Tokens `key` has left now (its charges corrected so far).
    pub fn tokens_left(&self, key: &str) -> u64 {
        let now = Instant::now();
        self.lock().key(key, now).tokens.remaining(now)
    }

    /// Starts afresh: every key full, counters at zero, the clock of the per-second
    /// counts at now; `config` from now on.
    pub fn reset(&self, config: VendorConfig) {
        let mut state = self.lock();
        state.config = config;
        state.started = Instant::now();
        state.keys.clear();
        state.stats = Stats::default();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    /// `key`'s limits and counters, full when first seen.
    fn key(&mut self, key: &str, now: Instant) -> &mut Key {
        let config = &self.config;
        let divisor = match config.shape {
            Shape::PerMinute => 1,
            Shape::PerSecond => 60,
        };
        self.keys.entry(key.to_owned()).or_insert_with(|| Key {
            requests: Bucket::new(config.rpm, divisor, now),
            tokens: Bucket::new(config.tpm, divisor, now),
            in_flight: 0,
        })
    }
}
