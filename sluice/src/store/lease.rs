//! Lease rows and their keys.

use std::fmt;

use crate::clock::UnixMillis;
use crate::dimension::{Dimension, LEASE_PREFIX};
use crate::tokens::Tokens;

/// The key of a lease row: `lease#{dimension}#{unique}`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseKey(String);

impl LeaseKey {
    /// The key of the lease row for `dimension` with the unique suffix `unique`.
    pub fn new(dimension: &Dimension, unique: &str) -> Self {
        LeaseKey(format!("{LEASE_PREFIX}{dimension}#{unique}"))
    }

    /// Reads a stored key, checking that it has the lease row shape.
    pub fn parse(key: &str) -> Option<Self> {
        let rest = key.strip_prefix(LEASE_PREFIX)?;
        let (dimension, unique) = rest.rsplit_once('#')?;
        (Dimension::from_row_key(dimension).is_ok() && !unique.is_empty())
            .then(|| LeaseKey(key.to_owned()))
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The unique suffix after the dimension.
    pub fn unique(&self) -> &str {
        self.0.rsplit_once('#').map_or("", |(_, u)| u)
    }

    /// The dimension named in the key, when it names a valid one.
    pub fn dimension(&self) -> Option<Dimension> {
        let rest = self.0.strip_prefix(LEASE_PREFIX)?;
        Dimension::from_row_key(rest.rsplit_once('#')?.0).ok()
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseKey({})", self.0)
    }
}

/// A lease row: tokens held on one dimension until released or expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Whether the lease holds slots of a `concurrent` bucket. sluice marks such rows so
    /// that a short bucket finds its leases, earliest expiry first, without scanning the
    /// table (`Store::slot_leases`); rows other SDKs write are not marked.
    pub slot: bool,
    /// The row's key.
    pub key: LeaseKey,
    /// The dimension whose tokens the lease holds.
    pub dimension: Dimension,
    /// The tokens taken.
    pub cost: Tokens,
    /// When the lease was taken.
    pub created_at: UnixMillis,
    /// When the lease expires and becomes the reconciler's to clean up.
    pub expires_at: UnixMillis,
    /// Who took it (`SLUICE_CALLER`).
    pub caller: String,
}

/// Which lease rows to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseFilter {
    /// Only leases on this dimension.
    pub dimension: Option<Dimension>,
    /// Only leases that expired strictly before this time.
    pub expired_before: Option<UnixMillis>,
}

/// The lease rows a scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseScan {
    /// The rows that match the filter.
    pub leases: Vec<LeaseRecord>,
    /// The keys of lease rows the store could not read (written by a foreign or broken
    /// writer): whatever they hold is unknown.
    pub unreadable: Vec<String>,
}
