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
    /// vendor's burst from then on (see `BucketState::reported`). Only refilling buckets
    /// take this.
    Reported(Report),
}

/// Makes the bucket of `dimension` stricter, for every process sharing it, with one
/// conditional write (see [`Sluice::tighten`](crate::Sluice::tighten)): every row of a
/// bucket spread over several, each by its share of what the vendor reported, in one
/// transaction (a 429 pauses the whole bucket, not the one row a grant came from).
pub(crate) async fn tighten(
    core: &Core,
    dimension: Dimension,
    how: Tighten,
) -> Result<bool, Error> {
    // A row's name (`openai#tpm#3`, from a grant on a spread bucket) means its bucket.
    let dimension = dimension.base();
    let lane = core.lane(&dimension);
    if let Tighten::Reported(_) = how
        && unchanged(core, &dimension, how)
    {
        // A successful answer's report comes with every call: when it changes nothing in
        // the rows this client last saw, it is not worth a read. The stored rows may have
        // moved since (mostly other clients' grants, which only lower them; a refund or
        // release elsewhere may raise them, and a drift that leaves is caught by a later
        // report or the vendor's next 429): skipping never loosens a bucket.
        return Ok(false);
    }
    if !matches!(how, Tighten::Reported(_)) {
        // The vendor said stop: tokens this client took ahead are not granted any more.
        lane.memory().set_prefetched(None);
    }
    let mut budget = Budget::new(core.config.max_retries);
    loop {
        // Remembered, so that the reports of the next answers are weighed against them.
        let rows = rows_of(core, &lane, &dimension).await?;
        let now = core.now();
        let Some(commit) = whole_tightening(&rows, how, now) else {
            return Ok(false);
        };
        let written: Vec<BucketState> = commit.buckets.iter().map(BucketWrite::after).collect();
        match core.commit(commit).await {
            Ok(()) => {
                // What this client took ahead is not granted any more once the vendor's
                // report has lowered the bucket.
                lane.memory().set_prefetched(None);
                for row in written {
                    core.lanes.learn_written(row, now);
                }
                tracing::info!(%dimension, ?how, rows = rows.len(), "bucket tightened from the vendor's report");
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

/// Whether `how` changes nothing in the rows of `dimension` this client remembers (all of
/// them known: a row never seen may need it).
fn unchanged(core: &Core, dimension: &Dimension, how: Tighten) -> bool {
    let now = core.now();
    let Some(first) = core.lane(dimension).memory().row().cloned() else {
        return false;
    };
    let n = first.shards.max(1);
    let mut rows = vec![first];
    for k in 1..n {
        match core.lane(&dimension.shard(k)).memory().row() {
            Some(row) => rows.push(row.clone()),
            None => return false,
        }
    }
    whole_tightening(&rows, how, now).is_none()
}

/// Every row of `dimension`'s bucket, read now and remembered.
async fn rows_of(
    core: &Core,
    lane: &crate::shared::lanes::Lane,
    dimension: &Dimension,
) -> Result<Vec<BucketState>, Error> {
    let sent = core.now();
    let first = core
        .read_into(lane, dimension)
        .await?
        .ok_or_else(|| core.unknown(dimension))?;
    if first.shards <= 1 {
        return Ok(vec![first]);
    }
    let rows = super::reshard::rows_of(core, dimension).await?;
    for row in &rows[1..] {
        core.lanes.learn(row.clone(), sent);
    }
    Ok(rows)
}

/// The commit that makes every row of a bucket as strict as `how` says at `now`, each by
/// its share (what a count allows is split as the rows' tokens are); `None` when all
/// already are.
fn whole_tightening(rows: &[BucketState], how: Tighten, now: UnixMillis) -> Option<Commit> {
    let n = u16::try_from(rows.len()).unwrap_or(u16::MAX);
    let share =
        |t: Tokens, k: u16| Tokens::from_nanos(crate::bucket::shards::part(t.as_nanos(), n, k));
    let mut whole = Commit::default();
    for (k, row) in (0u16..).zip(rows) {
        let mine = match how {
            Tighten::AtMost(limit) => Tighten::AtMost(share(limit, k)),
            Tighten::Reported(report) => Tighten::Reported(Report {
                remaining: share(report.remaining, k),
                ..report
            }),
            pause @ Tighten::PauseFor(_) => pause,
        };
        let spread_pause = match how {
            Tighten::PauseFor(pause) if n > 1 => Some(pause),
            _ => None,
        };
        if let Some(pause) = spread_pause {
            // Together the rows hold one call's cost when the pause ends, not one each.
            let share = share(row.bucket.cost_per_call(), k);
            if let Some(level) = row.holding_after(share, pause, now) {
                whole
                    .buckets
                    .push(BucketWrite::new(row.clone(), level).with_burst(row.burst));
            }
        } else if let Some(commit) = tightening(row, mine, now) {
            whole.buckets.extend(commit.buckets);
            whole.leases.extend(commit.leases);
        }
    }
    (!whole.is_empty()).then_some(whole)
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
