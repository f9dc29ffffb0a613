//! What a grant holds, as data: the lease's parts and where each is kept, and its id.
//! The protocols produce a [`Grant`]; the [`Lease`](crate::Lease) handle wraps one.

use std::fmt;
use std::str::FromStr;

use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::store::{LeaseKey, LeaseRecord};
use crate::tokens::Tokens;

/// Identifies a lease across processes: the keys of its lease rows.
///
/// Its text form (`Display`/`FromStr`) is the comma-separated row keys, e.g.
/// `lease#openai#rpm#4f1c…,lease#openai#tpm#4f1c…`, so a lease taken in one process can be
/// released in another with [`Sluice::release_id`](crate::Sluice::release_id).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseId {
    keys: Vec<LeaseKey>,
}

impl LeaseId {
    pub(crate) fn new(keys: Vec<LeaseKey>) -> Self {
        LeaseId { keys }
    }

    /// The lease's row keys, one per dimension.
    pub fn keys(&self) -> &[LeaseKey] {
        &self.keys
    }

    /// The unique suffix shared by the lease's rows.
    pub fn unique(&self) -> &str {
        self.keys.first().map_or("", LeaseKey::unique)
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, k) in self.keys.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(k.as_str())?;
        }
        Ok(())
    }
}

/// A string that is not a lease id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a lease id; expected comma-separated `lease#{{vendor}}#{{metric}}#{{unique}}` keys"
)]
pub struct LeaseIdError(pub String);

impl FromStr for LeaseId {
    type Err = LeaseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let keys = s
            .split(',')
            .map(|k| LeaseKey::parse(k.trim()))
            .collect::<Option<Vec<_>>>()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| LeaseIdError(s.to_owned()))?;
        Ok(LeaseId { keys })
    }
}

/// One dimension's share of a lease.
#[derive(Debug, Clone)]
pub(crate) struct LeasePart {
    pub(crate) key: LeaseKey,
    pub(crate) dimension: Dimension,
    pub(crate) cost: Tokens,
    /// Whether release gives the cost back (`concurrent` buckets).
    pub(crate) restores: bool,
    /// Where the lease is kept.
    pub(crate) kept: Kept,
    /// The lease row's write, when it goes on after the grant was answered.
    pub(crate) recording: Option<Recording>,
}

/// A lease row written after its grant was answered (a `requests`/`tokens` lease row is
/// only the reconciler's record, should its holder die): what ends or changes the row
/// waits for it to [settle](Recording::settled) first.
#[derive(Debug, Clone)]
pub(crate) struct Recording(tokio::sync::watch::Receiver<bool>);

impl Recording {
    /// A recording, and what says it is done (sent `true`, or dropped).
    pub(crate) fn new() -> (tokio::sync::watch::Sender<bool>, Recording) {
        let (done, watch) = tokio::sync::watch::channel(false);
        (done, Recording(watch))
    }

    /// Waits until the row's write is over, written or given up.
    pub(crate) async fn settled(&self) {
        let mut watch = self.0.clone();
        // An error: the writer is gone, so the write is over too.
        let _ = watch.wait_for(|done| *done).await;
    }
}

/// Where a lease part is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kept {
    /// Nowhere: a lean bucket's grant, or one from prefetched tokens (nothing to release).
    Nowhere,
    /// In a lease row of its own.
    Row,
    /// Nowhere in the store: granted from this process's local bucket while the store
    /// could not answer (the `open` failure policy). Nothing to release; an adjustment
    /// charges the local bucket.
    Local,
}

impl LeasePart {
    /// Waits until the lease row's write, if it goes on after the grant, is over.
    pub(crate) async fn recorded(&self) {
        if let Some(r) = &self.recording {
            r.settled().await;
        }
    }

    /// Whether there is a lease to end.
    pub(crate) fn is_kept(&self) -> bool {
        !matches!(self.kept, Kept::Nowhere | Kept::Local)
    }
}

/// What an acquire was granted: the parts it holds and when.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    pub(crate) id: LeaseId,
    pub(crate) parts: Vec<LeasePart>,
    pub(crate) created_at: UnixMillis,
    pub(crate) expires_at: UnixMillis,
    /// How many commits the acquire attempted (0: from prefetched tokens).
    pub(crate) attempts: u32,
}

impl Grant {
    /// A grant of `parts`, its id their keys in order.
    pub(crate) fn new(
        parts: Vec<LeasePart>,
        created_at: UnixMillis,
        expires_at: UnixMillis,
        attempts: u32,
    ) -> Grant {
        Grant {
            id: LeaseId::new(parts.iter().map(|p| p.key.clone()).collect()),
            parts,
            created_at,
            expires_at,
            attempts,
        }
    }
}

impl LeasePart {
    /// The part of the lease `record` describes; `restores`: whether ending it gives its
    /// cost back.
    pub(crate) fn of_record(record: LeaseRecord, restores: bool) -> LeasePart {
        LeasePart {
            kept: Kept::Row,
            key: record.key,
            dimension: record.dimension,
            cost: record.cost,
            restores,
            recording: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dimension::Dimension;

    #[test]
    fn lease_ids_round_trip_through_text() {
        let a = Dimension::new("openai#rpm").unwrap();
        let b = Dimension::new("openai#tpm").unwrap();
        let id = LeaseId::new(vec![LeaseKey::new(&a, "abc"), LeaseKey::new(&b, "abc")]);
        let text = id.to_string();
        assert_eq!(text, "lease#openai#rpm#abc,lease#openai#tpm#abc");
        assert_eq!(text.parse::<LeaseId>().unwrap(), id);
        assert_eq!(id.unique(), "abc");
        assert!("openai#rpm".parse::<LeaseId>().is_err());
        assert!("".parse::<LeaseId>().is_err());
    }
}
