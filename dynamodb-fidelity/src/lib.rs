//! A loopback proxy in front of DynamoDB Local that adds what real DynamoDB does and
//! DynamoDB Local does not: per-item throughput ceilings, capacity billing, throttling and
//! transaction conflicts, with per-item counters for tests and load generators.
//!
//! Point a DynamoDB client at [`Running::endpoint`] instead of DynamoDB Local. Every
//! request is forwarded unchanged and its answer returned unchanged, except where one of
//! these rules answers instead:
//!
//! - **Billing.** Each item-level operation is billed as real DynamoDB bills it. An item's
//!   size is its attribute names plus values (numbers: one byte per two significant digits
//!   plus one; binary: raw bytes; lists and maps: 3 bytes plus 1 per element; sets: the
//!   sum of their elements, an assumption). A write costs the larger of the item before and
//!   after, per 1 KB, at least 1 unit; a failed conditional write the item as it is (as the
//!   proxy knows it, below); a
//!   transaction twice per item. A read costs per 4 KB, half if eventually consistent,
//!   twice in a transaction; a Query or Scan rounds its total once. To know sizes before
//!   and after, the proxy serializes each item's writes and remembers the size its last
//!   single write of the item left, per caller scope (access key and region: DynamoDB
//!   Local keeps a database for each); it reads the item itself (strongly consistent,
//!   unbilled) only where it does not know it: before the item's first single write since
//!   the proxy started or since its table was created or deleted through it, after a
//!   batch, a transaction, an error answer or a read that failed, and after a write that
//!   does not say the item after (an update that asks for the whole item back,
//!   `ReturnValues: ALL_NEW`, does). An item written around the proxy (directly to
//!   DynamoDB Local, or by PartiQL, which passes through) is sized as the proxy last knew
//!   it until the proxy writes it again.
//! - **Ceilings.** Each item has a write and a read bucket holding
//!   [`burst`](Config::burst) worth of its ceiling and refilling at it (real DynamoDB: 1,000
//!   write and 3,000 read units per second, a partition's most). A request to an item whose
//!   bucket is empty is answered at once with a throttle, neither forwarded nor billed;
//!   what a request costs is taken once it is done, so a bucket may go below zero.
//!   BatchWriteItem and BatchGetItem return the throttled entries as unprocessed (a
//!   throttle only if none is left); a transaction is throttled whole. The throttle names
//!   its reason as DynamoDB does (`TableWriteKeyRangeThroughputExceeded` on the table's
//!   ARN).
//! - **Partitions** ([`partitions`](Config::partitions), off by default). The buckets are
//!   a partition's, not an item's: each item's partition key is hashed onto one of N
//!   equal ranges of a 64-bit hash space (a stable hash: the same key lands on the same
//!   partition in every run), and the items of a range share its ceilings, as items on
//!   one physical partition do. The sort key does not move an item. Adaptive capacity
//!   ([`isolate_after`](Config::isolate_after), off by default): an item that took at
//!   least half its partition's ceiling in every second for that long gets a partition of
//!   its own, full, from then on (AWS documents the isolation, not its trigger or delay:
//!   both are this proxy's assumptions).
//! - **The table's own ceiling** ([`table`](Config::table), off by default), as an
//!   on-demand table has it: a new table sustains [`TableModel::initial_write`] (AWS:
//!   4,000) and `initial_read` (12,000) units a second; a second's consumption becomes
//!   the previous peak once [`TableModel::peak_window`] (AWS: 30 minutes) has passed, and
//!   twice the previous peak is served from then on; a table created or updated with
//!   `WarmThroughput` sustains what it was warmed to at once (the proxy takes the
//!   parameter out of the request, which DynamoDB Local may not know, and answers an
//!   update that only warms itself); no table exceeds the per-table quota (AWS default:
//!   40,000 each). Each is a bucket of one second's worth, per table and direction,
//!   checked before the partition's. Its throttles name
//!   `Table{Write,Read}AccountLimitExceeded`: AWS names the quota's so and does not
//!   document what a table beyond twice its previous peak is told (an assumption). The
//!   table's state starts over when it is created or deleted through the proxy, or on a
//!   reset.
//! - **Global secondary indexes.** A write that gives an item an index entry, changes
//!   one or removes one (the index's partition key among its attributes before or after,
//!   as the table's `DescribeTable` lists its indexes) is billed to the index too: a put
//!   or a delete of the entry, or both when the key changes, or a rewrite of an entry it
//!   keeps (every attribute is taken as projected), by the item's size, as DynamoDB bills
//!   it. Each index key value is a unit of its own (or, with partitions, hashes onto the
//!   index's own N), named `<table>/index/<index>/<value>` in the counters (units billed
//!   and throttles; the writes are counted on the table's item). A write whose index
//!   entry (before or after, as far as known before it is sent) has no capacity left is
//!   throttled with `IndexWriteKeyRangeThroughputExceeded` on the index's ARN; a batch
//!   returns such entries unprocessed and a transaction is throttled whole. An index is
//!   not warmed with its table. A transaction's index writes are billed once each (AWS
//!   does not say).
//! - **Scans and queries** are billed for every item they evaluate, before a filter and at
//!   full size whatever the projection (or a `Select` of the count), as DynamoDB bills
//!   them: the proxy reads what a narrowed request evaluated with the same request
//!   unnarrowed (same start, same `Limit`), unbilled.
//! - **Time to live.** DynamoDB deletes an expired item "typically within two days": the
//!   proxy answers `UpdateTimeToLive` and `DescribeTimeToLive` itself and never passes
//!   them on, so an expired item stays (read, scanned, billed) for the whole run. Turning
//!   TTL on while it is on, or changing it within an hour of the last change, is a
//!   `ValidationException`, as in DynamoDB.
//! - **Transactions.** A TransactWriteItems holds its items from when the proxy takes it
//!   until the upstream answers plus [`transaction_hold`](Config::transaction_hold). A
//!   single write (or a BatchWriteItem) touching a held item gets
//!   `TransactionConflictException`; another transaction gets `TransactionCanceledException`
//!   with reason `TransactionConflict` for that item. A transaction waits for single
//!   writes already in flight.
//!
//! Counters per item and in total are in [`Running::stats`], or over HTTP at
//! `GET /_fidelity/stats` (read it with [`fetch_stats`]); `POST /_fidelity/reset` zeroes
//! them ([`reset_stats`]) and `POST /_fidelity/ceilings` (`{"write": 1000, "read": 3000}`;
//! [`set_ceilings`]) changes the ceilings, `POST /_fidelity/latency` (`{"base_us": 3000,
//! "tail_us": 2000}`; [`set_latency`]) the time added to every call ([`Latency`]: none by
//! default), `POST /_fidelity/partitions` (`{"partitions": 4, "isolate_after_ms": null}`;
//! [`set_partitions`]) the partitions each table has. These paths never collide with
//! DynamoDB's API, which is `POST /`.
//!
//! ```
//! use std::time::Duration;
//!
//! use dynamodb_fidelity::{Config, Fidelity, ThrottleAs};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let proxy = Fidelity::start(Config {
//!     upstream: "http://127.0.0.1:8000".into(),
//!     write_ceiling: 10.0,
//!     transaction_hold: Duration::from_millis(300),
//!     throttle_as: ThrottleAs::Throttling,
//!     ..Config::default()
//! })
//! .await?;
//! // Give `proxy.endpoint()` to the SDK as its `endpoint_url`, then:
//! let stats = proxy.stats();
//! assert_eq!(stats.totals().write_units, 0);
//! assert_eq!(stats.item("my-table", "some-key"), None);
//! proxy.set_ceilings(1000.0, 3000.0)?;
//! proxy.shutdown().await;
//! # Ok::<(), dynamodb_fidelity::Error>(())
//! # }).unwrap();
//! ```
//!
//! Where real DynamoDB's behaviour is not documented, the proxy assumes: a cancelled
//! transaction costs each item twice its size before, as a failed condition would; a
//! transaction's condition check is billed like a write of the item as it is; a Query or
//! Scan that returns nothing costs one 4 KB read; a throttle of the table's own ceiling is
//! answered with the same exception as a partition's.

#![forbid(unsafe_code)]

mod bucket;
mod caller;
mod client;
mod config;
mod control;
mod crc;
mod error;
mod item;
mod latency;
mod ledger;
mod locks;
mod number;
mod ops;
mod partition;
mod proxy;
mod reply;
mod schema;
mod server;
mod size;
mod stats;
mod table;
mod units;
mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use client::{fetch_stats, reset_stats, set_ceilings, set_latency, set_partitions};
pub use config::{Config, ThrottleAs};
pub use error::Error;
pub use latency::Latency;
pub use stats::{ItemStats, Stats};
pub use table::TableModel;

use proxy::Proxy;

/// The proxy: [`start`](Fidelity::start) one.
#[derive(Debug)]
pub struct Fidelity(());

impl Fidelity {
    /// Starts a proxy on the current tokio runtime, listening on `config.listen`.
    ///
    /// Fails if the configuration is invalid (an upstream that is not `http://host:port`,
    /// a listen address off loopback, a negative or infinite ceiling, a zero burst) or the
    /// address cannot be bound. The upstream is not contacted until the first request.
    pub async fn start(config: Config) -> Result<Running, Error> {
        if !config.listen.ip().is_loopback() {
            return Err(Error::NotLoopback(config.listen));
        }
        let proxy = Arc::new(Proxy::new(&config)?);
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Listen {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Listen {
            addr: config.listen,
            source,
        })?;
        tracing::info!(%addr, upstream = %config.upstream, "dynamodb-fidelity listening");
        let serving = tokio::spawn(server::serve(listener, proxy.clone()));
        Ok(Running {
            addr,
            proxy,
            serving,
        })
    }
}

/// A running proxy. Dropped (or [shut down](Running::shutdown)), it stops listening and
/// closes its connections.
#[derive(Debug)]
pub struct Running {
    addr: SocketAddr,
    proxy: Arc<Proxy>,
    serving: JoinHandle<()>,
}

impl Running {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://host:port`: the endpoint to give DynamoDB clients.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A snapshot of its counters.
    pub fn stats(&self) -> Stats {
        self.proxy.ledger().stats()
    }

    /// Zeroes the counters and fills every item's buckets again.
    pub fn reset(&self) {
        self.proxy.ledger().reset();
    }

    /// Sets the per-item ceilings, in write and read units per second, from now on
    /// (buckets keep what they hold, up to the new burst).
    pub fn set_ceilings(&self, write: f64, read: f64) -> Result<(), Error> {
        self.proxy.set_ceilings(write, read)
    }

    /// Sets how many partitions each table has from now on (`None`: one per item) and how
    /// soon a hot item gets one of its own (`None`: never); every partition starts full.
    pub fn set_partitions(
        &self,
        partitions: Option<u32>,
        isolate_after: Option<std::time::Duration>,
    ) -> Result<(), Error> {
        self.proxy.set_partitions(partitions, isolate_after)
    }

    /// Sets the time added to every DynamoDB call from now on (see [`Latency`]).
    pub fn set_latency(&self, latency: Latency) {
        self.proxy.set_latency(latency);
    }

    /// Stops it and waits until it no longer listens.
    pub async fn shutdown(mut self) {
        self.serving.abort();
        let _ = (&mut self.serving).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.serving.abort();
    }
}
