//! What a grant holds, as data: the lease's parts and where each is kept, and its id.
//! The protocols produce a [`Grant`]; the [`Lease`](crate::Lease) handle wraps one.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

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

    /// The unique suffix of the lease's first row (the seed's protocol gives every row of
    /// a lease the same; on the fast path each dimension's, and each row's of a grant
    /// gathered from several rows of a spread bucket, has its own).
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
    /// For a lease ended by someone other than its holder (an expired one reclaimed): the
    /// expiry its row was seen with. Its delete is conditioned on it, so a holder's
    /// renewal in between wins (see [`Store::renew_lease`](crate::store::Store::renew_lease)).
    pub(crate) expiring_at: Option<UnixMillis>,
}

/// A lease row written after its grant was answered (a `requests`/`tokens` lease row is
/// only the reconciler's record, should its holder die), and only once the lease has been
/// held for a while ([`LEASE_RECORD_AFTER`](crate::config::LEASE_RECORD_AFTER)):
/// a lease ended sooner never gets one. What ends or changes the lease asks it first.
#[derive(Debug, Clone)]
pub(crate) struct Recording(Arc<RecordingState>);

#[derive(Debug)]
struct RecordingState {
    stage: Mutex<Stage>,
    settled: tokio::sync::watch::Sender<bool>,
    /// Wakes the batch's writer to write now.
    flush: Arc<Notify>,
    /// How many of the batch's rows are still to be written: when every one was ended
    /// first, the writer is woken to end (its task does not outlive the leases).
    pending: Arc<std::sync::atomic::AtomicUsize>,
}

#[derive(Debug)]
enum Stage {
    /// Not written yet: the row it will write.
    Pending(LeaseRecord),
    /// Being written.
    Writing,
    /// Written, or given up (the grant stands without the record).
    Done,
    /// Ended before it was written: no row will be.
    Dropped,
}

impl Recording {
    /// The recordings of `records`, and what wakes their writer to write them at once.
    pub(crate) fn batch(records: Vec<LeaseRecord>) -> (Vec<Recording>, Arc<Notify>) {
        let flush = Arc::new(Notify::new());
        let pending = Arc::new(std::sync::atomic::AtomicUsize::new(records.len()));
        let recordings = records
            .into_iter()
            .map(|record| {
                Recording(Arc::new(RecordingState {
                    stage: Mutex::new(Stage::Pending(record)),
                    settled: tokio::sync::watch::channel(false).0,
                    flush: flush.clone(),
                    pending: pending.clone(),
                }))
            })
            .collect();
        (recordings, flush)
    }

    fn stage(&self) -> std::sync::MutexGuard<'_, Stage> {
        self.0.stage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// For the writer: the row to write, unless it was ended meanwhile.
    pub(crate) fn start(&self) -> Option<LeaseRecord> {
        let mut stage = self.stage();
        match std::mem::replace(&mut *stage, Stage::Writing) {
            Stage::Pending(record) => Some(record),
            other => {
                *stage = other;
                None
            }
        }
    }

    /// For the writer: the write is over (written or given up).
    pub(crate) fn finish(&self) {
        let mut stage = self.stage();
        if matches!(*stage, Stage::Writing) {
            *stage = Stage::Done;
        }
        drop(stage);
        self.0.settled.send_replace(true);
    }

    /// Waits until the row's write is over, written, given up, or never to be.
    pub(crate) async fn settled(&self) {
        let mut watch = self.0.settled.subscribe();
        let _ = watch.wait_for(|done| *done).await;
    }

    /// Writes the row now if it is still waiting, and waits until that is over.
    pub(crate) async fn flushed(&self) {
        if matches!(*self.stage(), Stage::Pending(_)) {
            self.0.flush.notify_one();
        }
        self.settled().await;
    }

    /// For what ends the lease: whether it has a row to end. A row not yet written never
    /// will be (and there is nothing to end); one being written is waited for.
    pub(crate) async fn end(&self) -> bool {
        {
            let mut stage = self.stage();
            match *stage {
                Stage::Pending(_) => {
                    *stage = Stage::Dropped;
                    drop(stage);
                    self.0.settled.send_replace(true);
                    let left = self
                        .0
                        .pending
                        .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                    if left == 1 {
                        // None left to write: the writer has nothing to wait for.
                        self.0.flush.notify_one();
                    }
                    return false;
                }
                Stage::Dropped => return false,
                Stage::Writing | Stage::Done => {}
            }
        }
        self.settled().await;
        true
    }

    /// Sets the cost the row will be written with, while it waits; `false` when it is
    /// written (or being written) already.
    pub(crate) fn set_cost(&self, cost: Tokens) -> bool {
        match &mut *self.stage() {
            Stage::Pending(record) => {
                record.cost = cost;
                true
            }
            _ => false,
        }
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
    /// Nowhere at all: a shadow grant whose write could not be made (see
    /// [`protocol::shadow`](crate::protocol::shadow)). Nothing was taken: nothing to
    /// release or give back, and an adjustment changes only its cost.
    Unrecorded,
}

impl LeasePart {
    /// Writes the lease row now if it is still waiting to be, and waits until that is over.
    pub(crate) async fn recorded(&self) {
        if let Some(r) = &self.recording {
            r.flushed().await;
        }
    }

    /// This part as what ends it sees it: a lease row not yet written never will be, and
    /// the part then has none to end (its cost is given back without one when it
    /// restores); one being written is waited for.
    pub(crate) async fn ending(&self) -> LeasePart {
        let mut part = self.clone();
        if let Some(r) = part.recording.take()
            && !r.end().await
        {
            part.kept = Kept::Nowhere;
        }
        part
    }

    /// Whether there is a lease to end.
    pub(crate) fn is_kept(&self) -> bool {
        !matches!(self.kept, Kept::Nowhere | Kept::Local | Kept::Unrecorded)
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
    /// When the grant may be used: `created_at`, or for a reservation (a caller that
    /// waits its turn, see [`Wanted::queue`](crate::acquire::Wanted::queue)) when the
    /// refill has repaid the reservations before it and its own. Its tokens are taken,
    /// and its caller waits until then; one that gives up before gives them back.
    pub(crate) ready_at: UnixMillis,
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
            ready_at: created_at,
        }
    }

    /// This grant, ready at `ready_at` (a reservation's turn) if that is later.
    pub(crate) fn ready_at(mut self, ready_at: UnixMillis) -> Grant {
        self.ready_at = self.ready_at.max(ready_at);
        self
    }
}

impl LeasePart {
    /// The part of the lease `record` describes; `restores`: whether ending it gives its
    /// cost back.
    /// A part held by its holder, its row (if any) written with the grant.
    pub(crate) fn new(
        key: LeaseKey,
        dimension: Dimension,
        cost: Tokens,
        restores: bool,
        kept: Kept,
    ) -> LeasePart {
        LeasePart {
            key,
            dimension,
            cost,
            restores,
            kept,
            recording: None,
            expiring_at: None,
        }
    }

    pub(crate) fn of_record(record: LeaseRecord, restores: bool) -> LeasePart {
        LeasePart {
            expiring_at: None,
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
