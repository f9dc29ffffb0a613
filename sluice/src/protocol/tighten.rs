//! Making a shared bucket stricter from what the vendor itself reports.

use std::time::Duration;

use crate::bucket::{BucketState, Level, LimitType, Report};
use crate::clock::UnixMillis;
use crate::config::COOLDOWN_CALLER;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::ids::new_unique;
use crate::retry::Budget;
use crate::shared::Core;
use crate::store::{
    BucketWrite, Commit, CommitError, ConditionFailure, LeaseKey, LeaseRecord, LeaseWrite,
    StoreError,
};
use crate::tokens::Tokens;

use super::lost_race;

/// What the vendor reported about a limit, as a way to make its bucket stricter.
///
/// Tightening never makes a bucket looser: a report that allows more than the bucket holds
/// changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Tighten {
    /// At most this many tokens are left now (e.g. `x-ratelimit-remaining-requests`). Only
    /// refilling (`requests`/`tokens`) buckets take this; a `concurrent` bucket ignores it.
    AtMost(Tokens),
    /// Grant nothing for this long (e.g. a 429 with `retry-after`). A refilling bucket is
    /// emptied so that `cost_per_call` is available exactly when the pause ends; a
    /// `concurrent` bucket gets a cool-down lease holding all its slots until then, which
    /// the usual expiry handling gives back.
    PauseFor(Duration),
    /// What a successful response's headers report (remaining, time until full): the
    /// bucket holds no more than the vendor can now, and refills no further than the
    /// vendor's burst from then on (see [`BucketState::reported`]). Only refilling buckets
    /// take this.
    Reported(Report),
}

/// Makes the bucket of `dimension` stricter, for every process sharing it, with one
/// conditional write (see [`Sluice::tighten`](crate::Sluice::tighten)).
pub(crate) async fn tighten(
    core: &Core,
    dimension: Dimension,
    how: Tighten,
) -> Result<bool, Error> {
    let lane = core.lane(&dimension);
    if let Tighten::Reported(_) = how {
        // A successful answer's report comes with every call: when it changes nothing in
        // the row this client last saw, it is not worth a read. The stored row may have
        // moved since (mostly other clients' grants, which only lower it; a refund or
        // release elsewhere may raise it, and a drift that leaves is caught by a later
        // report or the vendor's next 429): skipping never loosens a bucket.
        let now = core.now();
        let unchanged = lane
            .memory()
            .row()
            .is_some_and(|row| tightening(row, how, now).is_none());
        if unchanged {
            return Ok(false);
        }
    }
    if !matches!(how, Tighten::Reported(_)) {
        // The vendor said stop: tokens this client took ahead are not granted any more.
        lane.memory().set_prefetched(None);
    }
    let mut budget = Budget::new(core.config.max_retries);
    loop {
        // Remembered, so that the reports of the next answers are weighed against it.
        let row = core
            .read_into(&lane, &dimension)
            .await?
            .ok_or_else(|| core.unknown(&dimension))?;
        let now = core.now();
        let Some(commit) = tightening(&row, how, now) else {
            return Ok(false);
        };
        let written = commit.buckets.first().map(BucketWrite::after);
        match core.commit(commit).await {
            Ok(()) => {
                // What this client took ahead is not granted any more once the vendor's
                // report has lowered the bucket.
                lane.memory().set_prefetched(None);
                if let Some(row) = written {
                    core.lanes.learn_written(row, now);
                }
                tracing::info!(%dimension, ?how, "bucket tightened from the vendor's report");
                return Ok(true);
            }
            Err(CommitError::Condition(failure @ ConditionFailure::LeaseMissing(_))) => {
                return Err(StoreError::impossible(&failure).into());
            }
            // A report lost to another writer is not sent again: the row it was weighed
            // against moved (mostly grants, which only lower it), and the next answer
            // brings a report of its own. On a row every process writes, a report resent
            // until it wins would cost reads and billed writes at every answer.
            Err(CommitError::Condition(_)) | Err(CommitError::TransactionConflict)
                if matches!(how, Tighten::Reported(_)) =>
            {
                return Ok(false);
            }
            // A lost race or a (vanishingly unlikely) key collision: look again.
            Err(CommitError::Condition(_)) | Err(CommitError::TransactionConflict) => {
                lost_race(&mut budget, &dimension).await?;
            }
            Err(CommitError::Store(e)) => return Err(e.into()),
        }
    }
}

/// The commit that makes `row` as strict as `how` says at `now`; `None` when it already is
/// (or the report does not apply to its limit type).
fn tightening(row: &BucketState, how: Tighten, now: UnixMillis) -> Option<Commit> {
    let concurrent = row.bucket.limit_type() == LimitType::Concurrent;
    let lowered = match (how, concurrent) {
        (Tighten::AtMost(limit), false) => row
            .lowered_to(limit.clamp(Tokens::ZERO, Tokens::MAX), now)
            .map(|level| (level, row.burst)),
        (Tighten::PauseFor(pause), false) => row.emptied_for(pause, now).map(|l| (l, row.burst)),
        (Tighten::Reported(report), false) => row.reported(&report, now),
        _ => None,
    };
    let dimension = &row.dimension;
    Some(match (how, concurrent, lowered) {
        (_, false, Some((level, burst))) => Commit {
            buckets: vec![BucketWrite::new(row.clone(), level).with_burst(burst)],
            leases: Vec::new(),
        },
        (Tighten::AtMost(_) | Tighten::Reported(_), _, _) | (Tighten::PauseFor(_), false, None) => {
            return None;
        }
        (Tighten::PauseFor(pause), true, _) => {
            if pause.is_zero() {
                return None;
            }
            // Hold every slot until the pause ends. Slots in use now come back to
            // a bucket that stays short; at expiry, the cool-down lease is given
            // back like any expired lease, exactly once.
            let capacity = row.bucket.capacity();
            Commit {
                buckets: vec![BucketWrite::new(
                    row.clone(),
                    Level::new(
                        row.tokens.saturating_sub(capacity),
                        row.last_refill_at.max(now),
                    ),
                )],
                leases: vec![LeaseWrite::Create(LeaseRecord {
                    slot: true,
                    key: LeaseKey::new(dimension, &format!("cooldown-{}", new_unique())),
                    dimension: dimension.clone(),
                    cost: capacity,
                    created_at: now,
                    expires_at: now.saturating_add(pause),
                    caller: COOLDOWN_CALLER.to_owned(),
                })],
            }
        }
    })
}

#[cfg(test)]
mod tests;
