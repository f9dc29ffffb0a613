//! How the proxy is set up: where it listens, what it stands in front of, and the rules of
//! real DynamoDB it adds.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::bucket::Rate;
use crate::error::Error;
use crate::latency::Latency;
use crate::ledger::Limits;
use crate::partition::Layout;
use crate::table::TableModel;

/// Which throttling error the proxy answers with, as a table's capacity mode would.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ThrottleAs {
    /// A provisioned table's `ProvisionedThroughputExceededException`, with its
    /// `ThrottlingReasons`.
    #[default]
    ProvisionedThroughputExceeded,
    /// An on-demand table's `ThrottlingException`, with its `throttlingReasons` (the
    /// lower-case key the AWS SDK for Rust reads).
    Throttling,
}

/// The proxy's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The DynamoDB Local to stand in front of: `http://host:port`.
    pub upstream: String,
    /// Where to listen: a loopback address (port 0: any free port).
    pub listen: SocketAddr,
    /// Write units per second each item may consume (real DynamoDB: 1,000, a partition's
    /// most).
    pub write_ceiling: f64,
    /// Read units per second each item may consume (real DynamoDB: 3,000).
    pub read_ceiling: f64,
    /// How much unused capacity an item saves up: a full bucket holds the ceiling times
    /// this.
    pub burst: Duration,
    /// How long a transaction keeps holding its items after the upstream has answered it
    /// (its answer waits as long), to widen the window in which other writes conflict.
    pub transaction_hold: Duration,
    /// The throttling error to answer with.
    pub throttle_as: ThrottleAs,
    /// The time added to every DynamoDB call (none by default).
    pub latency: Latency,
    /// How many partitions each table has: items whose partition keys hash onto one
    /// partition share its ceilings. `None` (the default): every item has ceilings of its
    /// own, as if each were alone on a partition.
    pub partitions: Option<u32>,
    /// Adaptive capacity: an item that takes at least half its partition's ceiling in
    /// every second for this long gets a partition of its own. `None` (the default):
    /// never. AWS documents that hot items are isolated, not how soon; a few minutes of
    /// sustained heat is the usual observation.
    pub isolate_after: Option<Duration>,
    /// Each table's own ceiling as an on-demand table has it (cold start, twice the
    /// previous peak, warm throughput, the per-table quota); `None` (the default): tables
    /// have no ceiling of their own.
    pub table: Option<TableModel>,
}

impl Default for Config {
    /// DynamoDB Local's usual port, any free loopback port, real DynamoDB's per-partition
    /// ceilings, a second of burst, no hold, provisioned-mode errors, no added latency.
    fn default() -> Self {
        Config {
            upstream: "http://127.0.0.1:8000".to_owned(),
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            write_ceiling: 1000.0,
            read_ceiling: 3000.0,
            burst: Duration::from_secs(1),
            transaction_hold: Duration::ZERO,
            throttle_as: ThrottleAs::default(),
            latency: Latency::default(),
            partitions: None,
            isolate_after: None,
            table: None,
        }
    }
}

/// The layout of `partitions` and `isolate_after`, checked.
pub(crate) fn layout(
    partitions: Option<u32>,
    isolate_after: Option<Duration>,
) -> Result<Layout, Error> {
    if partitions == Some(0) {
        return Err(Error::Partitions);
    }
    Ok(Layout {
        partitions,
        isolate_after,
    })
}

/// `model`, checked: every rate a valid ceiling and the window not zero.
pub(crate) fn table_model(model: Option<TableModel>) -> Result<Option<TableModel>, Error> {
    if let Some(m) = model {
        for rate in [m.initial_write, m.initial_read, m.quota_write, m.quota_read] {
            milli_units(rate)?;
        }
        if m.peak_window.is_zero() {
            return Err(Error::PeakWindow);
        }
    }
    Ok(model)
}

/// The limits of ceilings `write` and `read` (units per second) and `burst`, checked.
pub(crate) fn limits(write: f64, read: f64, burst: Duration) -> Result<Limits, Error> {
    if burst.is_zero() {
        return Err(Error::Burst);
    }
    let (write_milli, read_milli) = (milli_units(write)?, milli_units(read)?);
    Ok(Limits {
        write: Rate::new(write_milli, burst),
        read: Rate::new(read_milli, burst),
        write_milli,
        read_milli,
    })
}

/// A ceiling in exact thousandths of a unit per second.
#[allow(
    clippy::float_arithmetic,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "the one place a configured ceiling becomes the integer the buckets count in"
)]
fn milli_units(ceiling: f64) -> Result<u64, Error> {
    // Up to a billion units per second: far beyond any real ceiling, far within i128.
    if !ceiling.is_finite() || !(0.0..=1e9).contains(&ceiling) {
        return Err(Error::Ceiling(ceiling));
    }
    Ok((ceiling * 1000.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_must_be_finite_and_not_negative() {
        let second = Duration::from_secs(1);
        assert!(limits(1000.0, 3000.0, second).is_ok());
        assert!(limits(0.0, 0.5, second).is_ok());
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e12] {
            assert!(matches!(limits(bad, 1.0, second), Err(Error::Ceiling(_))));
            assert!(matches!(limits(1.0, bad, second), Err(Error::Ceiling(_))));
        }
        assert!(matches!(
            limits(1.0, 1.0, Duration::ZERO),
            Err(Error::Burst)
        ));
    }

    #[test]
    fn a_table_has_at_least_one_partition_and_its_model_valid_rates() {
        assert!(matches!(layout(Some(0), None), Err(Error::Partitions)));
        assert!(layout(Some(1), None).is_ok());
        assert!(layout(None, Some(Duration::from_secs(1))).is_ok());
        assert!(table_model(Some(TableModel::default())).is_ok());
        let bad_rate = TableModel {
            quota_write: f64::NAN,
            ..TableModel::default()
        };
        assert!(matches!(
            table_model(Some(bad_rate)),
            Err(Error::Ceiling(_))
        ));
        let no_window = TableModel {
            peak_window: Duration::ZERO,
            ..TableModel::default()
        };
        assert!(matches!(
            table_model(Some(no_window)),
            Err(Error::PeakWindow)
        ));
    }
}
