//! Correcting a lease's cost after the fact: the difference is charged, or refunded, in
//! one conditional write of the bucket row (and of the lease, wherever it is kept).

use crate::bucket::BucketState;
use crate::bucket::WriteOutcome;
use crate::clock::UnixMillis;
use crate::config::Protocol;
use crate::error::Error;
use crate::grant::{Kept, LeasePart};
use crate::retry::Budget;
use crate::shared::Core;
use crate::store::{
    BucketWrite, Commit, CommitError, ConditionFailure, HeldWrite, LeaseWrite, WriteProbe,
};
use crate::tokens::Tokens;

use super::batch::MAX_FRESH_RETRIES;

/// An adjustment whose write lost its answer (a timeout, a lost connection): it may have
/// applied. Kept by the lease until the next adjustment of its dimension settles it.
#[derive(Debug, Clone)]
pub(crate) struct Unsettled {
    /// What tells whether its write applied.
    probe: WriteProbe,
    /// The cost it was to set.
    cost: Tokens,
    /// Whether it refunded (a lower cost).
    refund: bool,
}

/// Learns what became of an adjustment of `part` whose answer was lost, and takes its cost
/// when it applied. When the row no longer tells, a refund counts as applied (never
/// refunded twice: no over-grant) and a charge as not (charged again at worst).
async fn settle(core: &Core, part: &mut LeasePart, u: &Unsettled) -> Result<(), Error> {
    let Some((outcome, _)) = core.row_after(&u.probe).await? else {
        return Err(core.unknown(&part.dimension));
    };
    tracing::debug!(dimension = %part.dimension, ?outcome, "settled an adjustment that lost its answer");
    match outcome {
        WriteOutcome::Applied => part.cost = u.cost,
        WriteOutcome::Unknown if u.refund => part.cost = u.cost,
        WriteOutcome::NotApplied | WriteOutcome::Unknown => {}
    }
    Ok(())
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
    let mut write = BucketWrite::new(row.clone(), row.charged(delta, now));
    let mut leases = Vec::new();
    match part.kept {
        Kept::Row => leases.push(LeaseWrite::SetCost {
            key: part.key.clone(),
            cost: actual,
        }),
        Kept::InBucket => write.held.push(HeldWrite::SetCost {
            id: part.key.unique().to_owned(),
            cost: actual,
        }),
        // (A local grant is adjusted locally, never here.)
        Kept::Nowhere | Kept::Local => {}
    }
    let pending = Unsettled {
        probe: write.probe(),
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

/// Changes one part's cost to `actual`, charging or refunding the difference, exactly
/// once: an earlier adjustment of the part whose answer was lost (in `unsettled`) is
/// settled first, and this one is kept there when its own answer is lost.
///
/// On the fast path the row comes from memory (no read) and a lost race retries at once
/// from the row the store hands back.
pub(crate) async fn adjust_part(
    core: &Core,
    part: &mut LeasePart,
    actual: Tokens,
    unsettled: &mut Vec<Unsettled>,
) -> Result<(), Error> {
    if let Some(i) = unsettled
        .iter()
        .position(|u| u.probe.dimension == part.dimension)
    {
        settle(core, part, &unsettled[i]).await?;
        unsettled.swap_remove(i);
    }
    let fast = core.config.protocol == Protocol::Fast;
    let dimensions = std::slice::from_ref(&part.dimension);
    // Writes lost to contention so far; a lost race that handed back the current row (fast
    // path) is retried at once and does not count.
    let mut budget = Budget::new(core.config.max_retries);
    let mut fresh_retries: u32 = 0;
    loop {
        let row = if fast {
            core.remembered_row(&part.dimension).await?
        } else {
            core.read_existing(dimensions).await?.remove(0)
        };
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
            Err(CommitError::Condition(ConditionFailure::BucketChanged {
                current: Some(current),
                ..
            })) if fast && fresh_retries < MAX_FRESH_RETRIES => {
                fresh_retries += 1;
                core.lanes.learn(*current, now);
                continue;
            }
            Err(CommitError::Condition(_)) | Err(CommitError::TransactionConflict) => {
                core.lanes.forget(&part.dimension);
                if !budget.lose() {
                    return Err(Error::Contention {
                        dimension: part.dimension.clone(),
                        attempts: budget.lost(),
                    });
                }
            }
            Err(CommitError::Store(e)) => {
                core.lanes.forget(&part.dimension);
                if e.unsure() {
                    unsettled.push(pending);
                }
                return Err(e.into());
            }
        }
        let lost = budget.lost();
        budget.back_off(lost).await;
    }
}
