//! What can go wrong starting the proxy, changing it, or asking it for its counters.

use std::net::SocketAddr;

/// An error of this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The upstream is not an `http://host:port` URL.
    #[error("invalid upstream `{0}`: expected http://host:port")]
    Upstream(String),
    /// The proxy listens on loopback only.
    #[error("cannot listen on {0}: not a loopback address")]
    NotLoopback(SocketAddr),
    /// A ceiling must be a finite number of units per second, zero or more.
    #[error("invalid ceiling {0}: expected a finite number of units per second, zero or more")]
    Ceiling(f64),
    /// The burst must be longer than zero.
    #[error("invalid burst: it must be longer than zero")]
    Burst,
    /// A table has at least one partition.
    #[error("invalid partition count 0: a table has at least one partition")]
    Partitions,
    /// The time a peak takes to count as the previous one must be longer than zero.
    #[error("invalid peak window: it must be longer than zero")]
    PeakWindow,
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An endpoint given to [`fetch_stats`](crate::fetch_stats) is not an `http://` URL.
    #[error("invalid endpoint `{0}`: expected http://host:port")]
    Endpoint(String),
    /// The stats could not be fetched.
    #[error("cannot fetch the stats from {endpoint}")]
    Fetch {
        /// The proxy's endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
