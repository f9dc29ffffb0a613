//! The seed's protocol: every attempt reads the rows, then writes every bucket it names
//! and the lease rows in one atomic write. A refusal comes from the rows just read (or
//! handed back by a failed condition), never from memory, so a waiting caller's rows are
//! always fresh. Any number of dimensions.

use std::sync::Arc;
use std::time::Duration;

use crate::acquire::Wanted;
use crate::bucket::{BucketState, Mode, Take, shadow_take};
use crate::clock::UnixMillis;
use crate::detach::Detached;
use crate::dimension::Dimension;
use crate::error::{Error, RetryIn};
use crate::grant::{Grant, Kept, LeasePart};
use crate::ids::new_unique;
use crate::retry::{Backoff, Budget};
use crate::shared::Core;
use crate::store::{
    BucketWrite, Commit, CommitError, ConditionFailure, LeaseKey, LeaseRecord, LeaseWrite,
    StoreError,
};

use super::ending::give_back;
use super::slots::{Refusal, refusal};

/// One attempt's writes, computed from the rows in hand.
struct Attempt {
    writes: Vec<BucketWrite>,
    leases: Vec<LeaseWrite>,
    parts: Vec<LeasePart>,
    /// The indexes of the dimensions whose rows refuse.
    refused: Vec<usize>,
    /// The indexes of the dimensions taken in shadow mode that would have refused.
    would_refuse: Vec<usize>,
}

/// What a lost commit leads to.
enum Lost {
    /// Try again at once, from the rows in hand.
    Again,
    /// Back off, read the rows again, and try again.
    BackOff,
}

/// An acquire on the seed's protocol; with `shadow`, every bucket is taken in shadow mode
/// (else only those whose definition says so, see [`Mode`]).
pub(crate) async fn acquire(
    core: &Arc<Core>,
    wanted: &[Wanted],
    ttl: Duration,
    shadow: bool,
) -> Result<Grant, Error> {
    let dimensions: Vec<Dimension> = wanted.iter().map(|w| w.dimension.clone()).collect();
    let max_retries = core.config.max_retries;
    let mut unique = new_unique();
    let mut backoff = Backoff::new();
    let mut conflicts = Budget::new(max_retries);
    let (mut attempt, mut looked_again) = (0u32, 0u32);
    let mut contended = None;
    // The rows in hand, each confirmed by the store during this acquire.
    let mut rows = core.read_rows(&dimensions).await?;
    loop {
        attempt += 1;
        let now = core.now();
        let expires_at = now.saturating_add(ttl);
        let plan = plan(core, wanted, &rows, &unique, (now, expires_at), shadow);
        let (writes, leases, parts, refused) = (plan.writes, plan.leases, plan.parts, plan.refused);
        if !refused.is_empty() {
            match refuse(core, wanted, &rows, &refused, now, looked_again).await? {
                Some(refusal) => return Err(refusal),
                None => {
                    // Expired leases were given back: read the rows again.
                    looked_again += 1;
                    rows = core.read_rows(&dimensions).await?;
                    continue;
                }
            }
        }
        if attempt > max_retries + 1 {
            return Err(gave_up(contended, &dimensions, attempt - 1));
        }
        let written: Vec<BucketState> = writes.iter().map(BucketWrite::after).collect();
        let commit = Commit {
            buckets: writes,
            leases,
        };
        let failure = match commit_grant(core, commit, &parts).await {
            Ok(()) => {
                granted(core, written, now, (wanted, &plan.would_refuse));
                return Ok(Grant::new(parts, now, expires_at, attempt));
            }
            Err(CommitError::Condition(ConditionFailure::LeaseExists(key))) => {
                tracing::debug!(%key, "lease key already taken; drawing a new one");
                unique = new_unique();
                continue;
            }
            Err(CommitError::TransactionConflict) => {
                conflicted(core, &mut conflicts, &dimensions, &mut contended, attempt)?
            }
            Err(CommitError::Condition(failure)) => lost_race(
                core,
                (wanted, shadow),
                &mut rows,
                &mut contended,
                failure,
                now,
            )?,
            Err(CommitError::Store(e)) => {
                // Each write may or may not have applied: read the rows next time.
                dimensions.iter().for_each(|d| core.lanes.forget(d));
                return Err(e.into());
            }
        };
        if let Lost::BackOff = failure {
            if attempt <= max_retries {
                backoff.sleep(attempt).await;
            }
            // The next attempt reads the rows first.
            rows = core.read_rows(&dimensions).await?;
        }
    }
}

/// Learns the rows a grant wrote at `now`, and reports the dimensions (indexes into
/// `wanted`) that shadow mode granted where their buckets would have refused.
fn granted(
    core: &Core,
    written: Vec<BucketState>,
    now: UnixMillis,
    (wanted, would): (&[Wanted], &[usize]),
) {
    for row in written {
        core.lanes.learn_written(row, now);
    }
    would
        .iter()
        .for_each(|&i| super::shadow::would_refuse(core, &wanted[i]));
}

/// A transaction conflict: back off and try again, within the conflicts' budget.
fn conflicted(
    core: &Core,
    conflicts: &mut Budget,
    dimensions: &[Dimension],
    contended: &mut Option<Dimension>,
    attempt: u32,
) -> Result<Lost, Error> {
    tracing::debug!(attempt, "transaction conflict");
    if !conflicts.lose() {
        return Err(Error::Contention {
            dimension: dimensions[0].clone(),
            attempts: attempt,
        });
    }
    crate::metrics::contention_retry(&core.lanes.labels, dimensions[0].as_str());
    *contended = Some(dimensions[0].clone());
    Ok(Lost::BackOff)
}

/// The answer of an acquire that lost `attempts` races in a row.
fn gave_up(contended: Option<Dimension>, dimensions: &[Dimension], attempts: u32) -> Error {
    let dimension = contended.unwrap_or_else(|| dimensions[0].clone());
    tracing::warn!(%dimension, attempts, "giving up after repeated contention");
    Error::Contention {
        dimension,
        attempts,
    }
}

/// The writes of one attempt from `rows` at `now`, leases expiring at `expires_at`, and
/// the dimensions that refuse; with `shadow`, every bucket is taken in shadow mode.
fn plan(
    core: &Core,
    wanted: &[Wanted],
    rows: &[BucketState],
    unique: &str,
    (now, expires_at): (UnixMillis, UnixMillis),
    shadow: bool,
) -> Attempt {
    let mut attempt = Attempt {
        writes: Vec::with_capacity(rows.len()),
        leases: Vec::with_capacity(rows.len()),
        parts: Vec::with_capacity(rows.len()),
        refused: Vec::new(),
        would_refuse: Vec::new(),
    };
    for (i, (w, row)) in wanted.iter().zip(rows).enumerate() {
        let cost = w.cost(row.bucket.cost_per_call());
        let write = if shadow || row.bucket.mode() == Mode::Shadow {
            let (level, ledger, refused) = shadow_take(row, cost, w.floor(&row.bucket), now);
            if refused {
                attempt.would_refuse.push(i);
            }
            BucketWrite::new(row.clone(), level).with_shadow(ledger)
        } else {
            let Take::Granted { level } = w.take_from(row, now) else {
                attempt.refused.push(i);
                continue;
            };
            BucketWrite::new(row.clone(), level)
        };
        let key = LeaseKey::new(&row.dimension, unique);
        attempt.writes.push(write);
        let restores = row.bucket.limit_type().restores_on_release();
        let has_row = row.bucket.keeps_leases();
        if has_row {
            attempt.leases.push(LeaseWrite::Create(LeaseRecord {
                slot: restores,
                key: key.clone(),
                dimension: row.dimension.clone(),
                cost,
                created_at: now,
                expires_at,
                caller: core.config.caller.clone(),
            }));
        }
        attempt.parts.push(LeasePart {
            key,
            dimension: row.dimension.clone(),
            cost,
            restores,
            kept: if has_row { Kept::Row } else { Kept::Nowhere },
            recording: None,
            expiring_at: None,
        });
    }
    attempt
}

/// A commit lost to a failed condition: takes the row handed back. When that row is
/// already short for a single dimension, that is the exact answer, with no backoff and no
/// second read; so is a shadow acquire's next attempt (every bucket taken in shadow, which
/// never refuses; `shadow`: the client is), from the row handed back; otherwise back off
/// and read again.
fn lost_race(
    core: &Core,
    (wanted, shadow): (&[Wanted], bool),
    rows: &mut [BucketState],
    contended: &mut Option<Dimension>,
    failure: ConditionFailure,
    now: UnixMillis,
) -> Result<Lost, Error> {
    let ConditionFailure::BucketChanged { dimension, current } = failure else {
        // Creating leases never requires one to exist: a store reporting this is broken.
        return Err(StoreError::impossible(&failure).into());
    };
    tracing::debug!(%dimension, "lost the race: the bucket changed since it was read");
    crate::metrics::contention_retry(&core.lanes.labels, dimension.as_str());
    let i = wanted.iter().position(|w| w.dimension == dimension);
    let handed_back = match (i, current) {
        (Some(i), Some(current)) => {
            core.lanes.learn((*current).clone(), now);
            rows[i] = *current;
            true
        }
        _ => false,
    };
    *contended = Some(dimension);
    if handed_back && (shadow || rows.iter().all(|r| r.bucket.mode() == Mode::Shadow)) {
        return Ok(Lost::Again);
    }
    if let ([w], [row], true) = (wanted, &*rows, handed_back)
        && !matches!(w.take_from(row, core.now()), Take::Granted { .. })
    {
        return Ok(Lost::Again);
    }
    Ok(Lost::BackOff)
}

/// The refusal of a seed-protocol acquire, from rows the store just confirmed: the
/// capacity error, or the longest wait. `None`: expired leases of a short `concurrent`
/// bucket were given back, and the acquire should look again.
async fn refuse(
    core: &Core,
    wanted: &[Wanted],
    rows: &[BucketState],
    refused: &[usize],
    now: UnixMillis,
    looked_again: u32,
) -> Result<Option<Error>, Error> {
    for &i in refused {
        let (row, w) = (&rows[i], &wanted[i]);
        if let Some(error) = w.never(row, &w.take_from(row, now)) {
            return Ok(Some(error));
        }
    }
    let mut longest = Duration::ZERO;
    let mut short = Vec::new();
    for &i in refused {
        match refusal(core, &rows[i], &wanted[i], now, looked_again).await? {
            Some(Refusal::Wait(wait)) => {
                longest = longest.max(wait);
                short.push(RetryIn::on(&wanted[i].dimension, wait, now));
            }
            Some(Refusal::LookAgain) => return Ok(None),
            Some(Refusal::Exceeds(_)) | None => {}
        }
    }
    let wait = crate::shared::remembered::retry_in(longest);
    // The caller may be back when the answer runs out, asking every dimension again.
    for row in rows {
        core.lane(&row.dimension)
            .memory()
            .answered(now.saturating_add(wait));
    }
    let named = short
        .into_iter()
        .fold(RetryIn::pressed(wait, now), RetryIn::and);
    Ok(Some(Error::RetryIn(named)))
}

/// Commits a grant so that it is never lost to a caller that went away: should the
/// caller drop the future while the commit is in flight, the commit finishes on its own
/// and, if it granted, gives the grant back at once.
async fn commit_grant(
    core: &Arc<Core>,
    commit: Commit,
    parts: &[LeasePart],
) -> Result<(), CommitError> {
    let (sent, outcome) = tokio::sync::oneshot::channel();
    let core = core.clone();
    let parts = parts.to_vec();
    Detached::new(async move {
        let result = core.commit(commit).await;
        if let Err(Ok(())) = sent.send(result) {
            tracing::debug!("the caller went away while its grant was written; giving it back");
            if let Err(error) = give_back(&core, parts).await {
                tracing::warn!(%error, "giving back an abandoned grant failed; its leases expire and are reconciled");
            }
        }
    })
    .await;
    outcome
        .await
        .unwrap_or_else(|_| Err(StoreError::service("the commit was abandoned").into()))
}
