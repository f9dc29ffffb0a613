//! Correcting a lease's cost after the fact: the difference is charged, or refunded, in
//! one conditional write of the bucket row (and of the lease, wherever it is kept).

use crate::config::Protocol;
use crate::error::Error;
use crate::grant::{Kept, LeasePart};
use crate::retry::Budget;
use crate::shared::Core;
use crate::store::{BucketWrite, Commit, CommitError, ConditionFailure, HeldWrite, LeaseWrite};
use crate::tokens::Tokens;

use super::batch::MAX_FRESH_RETRIES;

/// Changes one part's cost to `actual`, charging or refunding the difference.
///
/// On the fast path the row comes from memory (no read) and a lost race retries at once
/// from the row the store hands back.
pub(crate) async fn adjust_part(
    core: &Core,
    part: &LeasePart,
    actual: Tokens,
) -> Result<(), Error> {
    let delta = actual - part.cost;
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
        let charged = row.charged(delta, now);
        let mut write = BucketWrite::of(row, charged);
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
            Kept::Nowhere => {}
        }
        let written = write.after();
        let commit = Commit {
            buckets: vec![write],
            leases,
        };
        match core.store.commit(commit).await {
            Ok(()) => {
                core.lanes.learn_written(written, now);
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
                return Err(e.into());
            }
        }
        let lost = budget.lost();
        budget.back_off(lost).await;
    }
}
