//! The lease rows of a lane write's grants: a slot's written before it is handed out, a
//! `requests`/`tokens` lease's after its grant is answered, once it has been held a while.

use std::sync::Arc;
use std::time::Duration;

use super::super::ending::restore;

use crate::clock::UnixMillis;
use crate::error::Error;
use crate::grant::{Kept, LeasePart, Recording};
use crate::retry::Backoff;
use crate::shared::Core;
use crate::shared::lanes::{AcquireJob, answer_each};
use crate::store::{LeaseKey, LeaseRecord, StoreError};

/// Writes the grants' lease rows, sending them again while the store fails for a passing
/// reason (writing a new row twice is writing it once).
pub(super) async fn record_leases(core: &Core, records: &[LeaseRecord]) -> Result<(), StoreError> {
    if records.is_empty() {
        return Ok(());
    }
    let mut backoff = Backoff::new();
    for attempt in 1u32.. {
        match core.rows.put(&core.store, records.to_vec()).await {
            Err(e) if (e.is_transient() || e.answer_lost()) && attempt < 6 => {
                tracing::debug!(error = %e, attempt, "writing lease rows failed; sending them again");
                backoff.sleep(attempt).await;
            }
            done => return done,
        }
    }
    Ok(())
}

/// Writes the lease rows of `requests`/`tokens` grants after the grants are answered, once
/// they have been held for [`LEASE_RECORD_AFTER`](crate::config::LEASE_RECORD_AFTER)
/// (at most half their time to live): such a row is only the reconciler's record, should
/// its holder die, so a lease released sooner never gets one and its grant costs one write
/// in all. A holder that dies before its row is written is refunded nothing (the quota it
/// took stays used). Held is counted from `ready`, the first of the grants' turns (a
/// reservation waiting its turn is not held yet). Ending or changing a part asks its
/// recording first.
pub(super) fn record_in_background<T>(
    core: &Arc<Core>,
    records: Vec<LeaseRecord>,
    mut parts: Vec<(T, LeasePart, UnixMillis)>,
    (now, ready): (UnixMillis, UnixMillis),
) -> Vec<(T, LeasePart, UnixMillis)> {
    if records.is_empty() {
        return parts;
    }
    let after = parts
        .iter()
        .map(|(_, _, expires_at)| expires_at.saturating_since(ready) / 2)
        .fold(crate::config::LEASE_RECORD_AFTER, Duration::min)
        + ready.saturating_since(now);
    let keys: Vec<LeaseKey> = records.iter().map(|r| r.key.clone()).collect();
    let (recordings, flush) = Recording::batch(records);
    for (_, part, _) in &mut parts {
        if part.kept == Kept::Row
            && let Some(i) = keys.iter().position(|k| *k == part.key)
        {
            part.recording = Some(recordings[i].clone());
        }
    }
    let core = core.clone();
    // Counted until settled, so that a flush waits for it (and tells it to write now).
    core.background.begin();
    let mut flushes = core.background.flushes();
    flushes.mark_unchanged();
    tokio::spawn(async move {
        if !after.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(after) => {}
                () = flush.notified() => {}
                _ = flushes.changed() => {}
            }
        }
        let records: Vec<LeaseRecord> = recordings.iter().filter_map(Recording::start).collect();
        if let Err(error) = record_leases(&core, &records).await {
            tracing::warn!(%error, leases = records.len(), "lease rows could not be written; the grants stand, without the reconciler's record of them");
        }
        for recording in &recordings {
            recording.finish();
        }
        core.background.end();
    });
    parts
}

impl super::Write<'_> {
    /// Grants whose tokens were taken but whose lease rows could not be written. A slot
    /// without a row could never be given back by anyone but its holder: its cost is given
    /// back now and the caller hears the failure. A `requests`/`tokens` grant is a grant
    /// all the same (its row is only the reconciler's record, should its holder die): its
    /// caller gets it.
    pub(super) async fn unrecorded(
        &mut self,
        parts: Vec<(AcquireJob, LeasePart, UnixMillis)>,
        restores: bool,
        e: StoreError,
    ) -> Vec<(AcquireJob, LeasePart, UnixMillis)> {
        if !restores {
            tracing::warn!(dimension = %self.dimension, error = %e, "lease rows could not be written; the grants stand, without the reconciler's record of them");
            return parts
                .into_iter()
                .map(|(a, mut part, at)| {
                    part.kept = Kept::Nowhere;
                    (a, part, at)
                })
                .collect();
        }
        let cost = parts
            .iter()
            .fold(crate::tokens::Tokens::ZERO, |sum, (_, p, _)| sum + p.cost);
        if let Err(error) = restore(self.core, &self.dimension, cost).await {
            tracing::warn!(dimension = %self.dimension, %error, "slots whose lease rows could not be written could not be given back; the reconciler heals the bucket");
        }
        let keys: Vec<LeaseKey> = parts.iter().map(|(_, p, _)| p.key.clone()).collect();
        // Some rows of the batch may have been written: they are gone too.
        let _ = self.core.store.delete_leases(&keys).await;
        answer_each(
            parts.into_iter().map(|(a, _, _)| a).collect(),
            |a| a.reply,
            || Error::Store(e.clone_lossy()),
        );
        Vec::new()
    }
}
