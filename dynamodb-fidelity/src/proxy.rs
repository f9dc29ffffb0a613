//! What every request handler shares: the upstream, the tables' key schemas, the item
//! locks, the accounts and the rules in force.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::config::{self, Config, ThrottleAs};
use crate::error::Error;
use crate::latency::Latency;
use crate::ledger::Ledger;
use crate::locks::Locks;
use crate::schema::Schemas;
use crate::upstream::Upstream;

/// The proxy's shared state.
#[derive(Debug)]
pub(crate) struct Proxy {
    pub(crate) upstream: Upstream,
    pub(crate) schemas: Schemas,
    pub(crate) locks: Locks,
    pub(crate) ttls: crate::ops::Ttls,
    pub(crate) throttle_as: ThrottleAs,
    pub(crate) transaction_hold: Duration,
    burst: Duration,
    ledger: Mutex<Ledger>,
    latency: Mutex<Latency>,
}

impl Proxy {
    /// The state for `config`, checked.
    pub(crate) fn new(config: &Config) -> Result<Proxy, Error> {
        let limits = config::limits(config.write_ceiling, config.read_ceiling, config.burst)?;
        let layout = config::layout(config.partitions, config.isolate_after)?;
        let table_model = config::table_model(config.table)?;
        Ok(Proxy {
            upstream: Upstream::new(&config.upstream)?,
            schemas: Schemas::default(),
            locks: Locks::default(),
            ttls: crate::ops::Ttls::default(),
            throttle_as: config.throttle_as,
            transaction_hold: config.transaction_hold,
            burst: config.burst,
            ledger: Mutex::new(Ledger::new(limits, layout, table_model)),
            latency: Mutex::new(config.latency),
        })
    }

    /// The accounts, locked (never across an await).
    pub(crate) fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The time to add to one call, drawn now.
    pub(crate) fn delay(&self) -> Duration {
        let latency = *self.latency.lock().unwrap_or_else(|p| p.into_inner());
        latency.draw(&mut rand::rng())
    }

    /// The time added to every call from now on.
    pub(crate) fn set_latency(&self, latency: Latency) {
        *self.latency.lock().unwrap_or_else(|p| p.into_inner()) = latency;
    }

    /// New per-item ceilings from now on, in units per second.
    pub(crate) fn set_ceilings(&self, write: f64, read: f64) -> Result<(), Error> {
        let limits = config::limits(write, read, self.burst)?;
        self.ledger().set_limits(limits);
        Ok(())
    }

    /// How many partitions each table has from now on (`None`: one per item), and how
    /// soon a hot item is isolated; every partition starts full.
    pub(crate) fn set_partitions(
        &self,
        partitions: Option<u32>,
        isolate_after: Option<Duration>,
    ) -> Result<(), Error> {
        let layout = config::layout(partitions, isolate_after)?;
        self.ledger().set_layout(layout);
        Ok(())
    }
}
