//! How many rows a bucket may be spread over, as its definition says.

use std::fmt;
use std::str::FromStr;

use crate::dimension::MAX_SHARDS;

/// A bucket's own bound on the rows it is spread over (see
/// [`Sluice::reshard`](crate::Sluice::reshard)), kept in its row so that every client
/// obeys it: automatic sharding stays within it, a reshard by hand outside it is refused,
/// and defining the bucket moves it into it.
///
/// ```
/// use sluice::{Bucket, RefillRate, bucket::ShardLimit};
///
/// // Always over 4 rows; or spread on its own, over 8 at most.
/// let pinned = Bucket::requests(RefillRate::per_minute(60_000)).with_shards(ShardLimit::Pinned(4));
/// let capped = Bucket::requests(RefillRate::per_minute(60_000)).with_shards(ShardLimit::AtMost(8));
/// assert_eq!(pinned.shard_limit().map(|l| l.clamp(16)), Some(4));
/// assert_eq!(capped.shard_limit().map(|l| l.clamp(16)), Some(8));
/// assert_eq!("<=8".parse(), Ok(ShardLimit::AtMost(8)));
/// # Ok::<(), sluice::error::BucketError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShardLimit {
    /// Exactly this many rows (stored as `=N`).
    Pinned(u16),
    /// At most this many rows (stored as `<=N`).
    AtMost(u16),
}

impl ShardLimit {
    /// The fewest and the most rows it allows.
    pub fn range(self) -> (u16, u16) {
        match self {
            ShardLimit::Pinned(n) => (n, n),
            ShardLimit::AtMost(n) => (1, n),
        }
    }

    /// Whether it allows `n` rows.
    pub fn allows(self, n: u16) -> bool {
        let (low, high) = self.range();
        (low..=high).contains(&n)
    }

    /// The count nearest `n` that it allows.
    pub fn clamp(self, n: u16) -> u16 {
        let (low, high) = self.range();
        n.clamp(low, high)
    }

    /// The count it names, when 1 to [`MAX_SHARDS`].
    pub(crate) fn valid(self) -> bool {
        let n = self.range().1;
        (1..=MAX_SHARDS).contains(&n)
    }
}

impl fmt::Display for ShardLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShardLimit::Pinned(n) => write!(f, "={n}"),
            ShardLimit::AtMost(n) => write!(f, "<={n}"),
        }
    }
}

/// A stored shard limit that is neither `=N` nor `<=N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a shard limit is `=N` (pinned) or `<=N` (at most), N from 1 to 32; got `{0}`")]
pub struct ShardLimitError(pub String);

impl FromStr for ShardLimit {
    type Err = ShardLimitError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ShardLimitError(s.to_owned());
        let (make, n): (fn(u16) -> ShardLimit, &str) = match s.strip_prefix("<=") {
            Some(n) => (ShardLimit::AtMost, n),
            None => (ShardLimit::Pinned, s.strip_prefix('=').ok_or_else(bad)?),
        };
        let limit = make(n.parse().map_err(|_| bad())?);
        limit.valid().then_some(limit).ok_or_else(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_back_as_written_and_bound_the_count() {
        for limit in [
            ShardLimit::Pinned(4),
            ShardLimit::AtMost(32),
            ShardLimit::Pinned(1),
        ] {
            assert_eq!(limit.to_string().parse(), Ok(limit));
        }
        for bad in ["4", "=0", "<=33", "<=", ">=2", "=x"] {
            assert!(bad.parse::<ShardLimit>().is_err(), "{bad}");
        }
        assert!(ShardLimit::AtMost(8).allows(1) && !ShardLimit::AtMost(8).allows(9));
        assert!(!ShardLimit::Pinned(4).allows(2));
        assert_eq!(ShardLimit::Pinned(4).clamp(1), 4);
    }
}
