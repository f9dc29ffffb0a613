//! Correcting a lease's cost after the fact: the difference is charged, or refunded. On the
//! fast path, a change of the bucket row (which commutes with other writers') and an update
//! of the lease row, one after the other; on the seed's, both in one transaction.

use crate::bucket::{BucketState, WriteOutcome};
use crate::clock::UnixMillis;
use crate::config::Protocol;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::grant::{Kept, LeasePart};
use crate::retry::Budget;
use crate::shared::Core;
use crate::store::{
    BucketWrite, Commit, CommitError, ConditionFailure, LeaseWrite, StoreError, WriteProbe,
};
use crate::tokens::Tokens;

use super::batch::MAX_FRESH_RETRIES;
use super::ending::{bucket_change, change_remembered};
use super::lost_race;

/// An adjustment whose write lost its answer (a timeout, a lost connection): it may have
/// applied. Kept by the lease until the next adjustment of its dimension settles it.
#[derive(Debug, Clone)]
pub(crate) struct Unsettled {
    /// What tells whether its write applied (the seed's protocol: a transaction stamps the
    /// row), or nothing (a change, which does not).
    probe: Option<WriteProbe>,
    dimension: crate::dimension::Dimension,
    /// The cost it was to set.
    cost: Tokens,
    /// Whether it refunded (a lower cost).
    refund: bool,
}

/// Learns what became of an adjustment of `part` whose answer was lost, and takes its cost
/// when it applied. When the row does not tell, a refund counts as applied (never refunded
/// twice: no over-grant) and a charge as not (charged again at worst).
async fn settle(core: &Core, part: &mut LeasePart, u: &Unsettled) -> Result<(), Error> {
    let outcome = match &u.probe {
        Some(probe) => match core.row_after(probe).await? {
            Some((outcome, _)) => outcome,
            None => return Err(core.unknown(&part.dimension)),
        },
        None => WriteOutcome::Unknown,
    };
    tracing::debug!(dimension = %part.dimension, ?outcome, "settled an adjustment that lost its answer");
    match outcome {
        WriteOutcome::Applied => part.cost = u.cost,
        WriteOutcome::Unknown if u.refund => part.cost = u.cost,
        WriteOutcome::NotApplied | WriteOutcome::Unknown => {}
    }
    Ok(())
}

/// Changes one part's cost to `actual`, charging or refunding the difference, exactly
/// once: an earlier adjustment of the part whose answer was lost (in `unsettled`) is
/// settled first, and this one is kept there when its own answer is lost.
pub(crate) async fn adjust_part(
    core: &Core,
    part: &mut LeasePart,
    actual: Tokens,
    unsettled: &mut Vec<Unsettled>,
) -> Result<(), Error> {
    if let Some(i) = unsettled.iter().position(|u| u.dimension == part.dimension) {
        settle(core, part, &unsettled[i]).await?;
        unsettled.swap_remove(i);
    }
    if actual == part.cost {
        return Ok(());
    }
    if core.config.protocol() == Protocol::Fast {
        adjust_by_change(core, part, actual, unsettled).await
    } else {
        adjust_in_transaction(core, part, actual, unsettled).await
    }
}

/// The fast path: the bucket's change and the lease row's new cost, one after the other,
/// in the order that leaves a process dying between the two short of nothing it may give
/// back: a charge is taken from the bucket first (a lease row showing less than was taken
/// is refunded less, should the lease expire), a refund is shown in the lease row first
/// (one showing more than is left taken would refund too much).
async fn adjust_by_change(
    core: &Core,
    part: &mut LeasePart,
    actual: Tokens,
    unsettled: &mut Vec<Unsettled>,
) -> Result<(), Error> {
    let delta = actual - part.cost;
    let refund = delta.is_negative();
    if refund {
        set_lease_cost(core, part, actual).await?;
    }
    if let Err(e) = charge(core, part, delta).await {
        if let Error::Store(s) = &e
            && s.may_have_applied()
        {
            unsettled.push(Unsettled {
                probe: None,
                dimension: part.dimension.clone(),
                cost: actual,
                refund,
            });
        }
        return Err(e);
    }
    if !refund {
        set_lease_cost(core, part, actual).await?;
    }
    part.cost = actual;
    Ok(())
}

/// Sets the lease row's cost (nothing for a lease without a row; a row not yet written
/// will be written with it).
async fn set_lease_cost(core: &Core, part: &LeasePart, cost: Tokens) -> Result<(), Error> {
    if let Some(recording) = &part.recording {
        if recording.set_cost(cost) {
            return Ok(());
        }
        recording.settled().await;
    }
    if part.kept != Kept::Row {
        return Ok(());
    }
    let commit = Commit {
        buckets: Vec::new(),
        leases: vec![LeaseWrite::SetCost {
            key: part.key.clone(),
            cost,
        }],
    };
    match core.commit(commit).await {
        Ok(()) => Ok(()),
        Err(CommitError::Condition(ConditionFailure::LeaseMissing(key))) => {
            Err(Error::LeaseNotFound(key.to_string()))
        }
        Err(CommitError::Condition(failure)) => Err(StoreError::impossible(&failure).into()),
        Err(CommitError::TransactionConflict) => Err(Error::Contention {
            dimension: part.dimension.clone(),
            attempts: 1,
        }),
        Err(CommitError::Store(e)) => Err(e.into()),
    }
}

/// Charges `delta` more to `part`'s bucket (a negative one refunds, capped at what it
/// holds), in one change computed from the row this client remembers (see
/// [`change_remembered`]); the bucket may go into debt.
pub(crate) async fn charge(core: &Core, part: &LeasePart, delta: Tokens) -> Result<(), Error> {
    if spread_charge(core, &part.dimension, delta).await? {
        return Ok(());
    }
    change_remembered(
        core,
        &part.dimension,
        MAX_FRESH_RETRIES,
        |gone| Err(core.unknown(gone)),
        |row, now| {
            // A negative delta refunds.
            let refund = (-delta).max(Tokens::ZERO);
            let change = bucket_change(core, row, refund, delta.max(Tokens::ZERO), now)
                .ok_or_else(|| StoreError::service("a charge found no change to make"))?;
            Ok(Some(change))
        },
    )
    .await
}

/// A charge on one row of a sharded bucket that the row cannot cover on its own, taken
/// from the other rows too, in one transaction: what the row holds first, then the rows
/// that hold most, and only what the whole lacks as the row's debt. A row in debt while
/// the others still grant would let the bucket hand out its debt again. `false` when the
/// plain charge on the row does (the bucket is in one row, the row covers it as far as
/// this client knows, or the rows kept moving).
async fn spread_charge(core: &Core, dimension: &Dimension, delta: Tokens) -> Result<bool, Error> {
    let base = dimension.base();
    if delta <= Tokens::ZERO || core.lanes.shards(&base) <= 1 {
        return Ok(false);
    }
    let covered = core
        .lane(dimension)
        .memory()
        .row()
        .is_some_and(|row| row.available(core.now()) >= delta);
    if covered {
        return Ok(false);
    }
    for _ in 0..=MAX_FRESH_RETRIES {
        let rows = super::reshard::rows_of(core, &base).await?;
        let Some(k) = rows.iter().position(|r| r.dimension == *dimension) else {
            return Ok(false);
        };
        let now = core.now();
        let writes: Vec<BucketWrite> = spread(&rows, k, delta, now)
            .into_iter()
            .map(|(i, take)| BucketWrite::new(rows[i].clone(), rows[i].charged(take, now)))
            .collect();
        let written: Vec<BucketState> = writes.iter().map(BucketWrite::after).collect();
        match core
            .commit(Commit {
                buckets: writes,
                leases: Vec::new(),
            })
            .await
        {
            Ok(()) => {
                for row in written {
                    core.lanes.learn_written(row, now);
                }
                return Ok(true);
            }
            Err(CommitError::Condition(_) | CommitError::TransactionConflict) => {}
            Err(CommitError::Store(e)) => return Err(e.into()),
        }
    }
    Ok(false)
}

/// How `delta` is taken from `rows` at `now`, charged to row `k`: what `k` holds, then
/// what the rows holding most hold, the rest as `k`'s debt; per row touched, its part.
fn spread(rows: &[BucketState], k: usize, delta: Tokens, now: UnixMillis) -> Vec<(usize, Tokens)> {
    let mut order: Vec<usize> = (0..rows.len()).filter(|i| *i != k).collect();
    order.sort_by_key(|i| std::cmp::Reverse(rows[*i].available(now)));
    order.insert(0, k);
    let mut left = delta;
    let mut parts: Vec<(usize, Tokens)> = Vec::new();
    for i in order {
        let take = rows[i].available(now).max(Tokens::ZERO).min(left);
        if take > Tokens::ZERO {
            parts.push((i, take));
            left = left.saturating_sub(take);
        }
    }
    if left > Tokens::ZERO {
        match parts.iter_mut().find(|(i, _)| *i == k) {
            Some((_, take)) => *take = take.saturating_add(left),
            None => parts.push((k, left)),
        }
    }
    parts
}

/// The commit that changes `part`'s cost to `actual` over `row` at `now`, the row it
/// leaves, and what settles it should its answer be lost.
fn adjustment(
    part: &LeasePart,
    actual: Tokens,
    row: BucketState,
    now: UnixMillis,
) -> (Commit, BucketState, Unsettled) {
    let delta = actual - part.cost;
    let write = BucketWrite::new(row.clone(), row.charged(delta, now));
    let mut leases = Vec::new();
    if part.kept == Kept::Row {
        leases.push(LeaseWrite::SetCost {
            key: part.key.clone(),
            cost: actual,
        });
    }
    let pending = Unsettled {
        probe: Some(write.probe()),
        dimension: part.dimension.clone(),
        cost: actual,
        refund: delta.is_negative(),
    };
    let written = write.after();
    let commit = Commit {
        buckets: vec![write],
        leases,
    };
    (commit, written, pending)
}

/// The seed's protocol: the bucket row read, then its write and the lease row's new cost
/// in one transaction.
async fn adjust_in_transaction(
    core: &Core,
    part: &mut LeasePart,
    actual: Tokens,
    unsettled: &mut Vec<Unsettled>,
) -> Result<(), Error> {
    let dimensions = std::slice::from_ref(&part.dimension);
    let mut budget = Budget::new(core.config.max_retries);
    loop {
        let row = core.read_existing(dimensions).await?.remove(0);
        let now = core.now();
        let (commit, written, pending) = adjustment(part, actual, row, now);
        match core.commit(commit).await {
            Ok(()) => {
                core.lanes.learn_written(written, now);
                part.cost = actual;
                return Ok(());
            }
            Err(CommitError::Condition(ConditionFailure::LeaseMissing(key))) => {
                return Err(Error::LeaseNotFound(key.to_string()));
            }
            Err(CommitError::Condition(_)) | Err(CommitError::TransactionConflict) => {
                core.lanes.forget(&part.dimension);
                lost_race(&mut budget, &part.dimension).await?;
            }
            Err(CommitError::Store(e)) => {
                core.lanes.forget(&part.dimension);
                if e.may_have_applied() {
                    unsettled.push(pending);
                }
                return Err(e.into());
            }
        }
    }
}
