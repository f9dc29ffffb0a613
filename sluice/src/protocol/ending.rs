//! Ending leases in transactions: the seed protocol's release, giving back a grant nobody
//! will use, and reclaiming expired leases (the reconciler's work). Each part ends exactly
//! once whatever else races on it: every lease row's delete and every kept lease's
//! removal is conditioned on it still being there.

use std::sync::Arc;

use crate::bucket::BucketState;
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::grant::{Kept, LeasePart};
use crate::retry::Backoff;
use crate::shared::Core;
use crate::store::{
    BucketWrite, Commit, CommitError, ConditionFailure, HeldWrite, LeaseKey, LeaseRecord,
    LeaseWrite, StoreError,
};
use crate::tokens::Tokens;

/// DynamoDB takes at most 100 items per transaction (and 4 MB; lease deletes and bucket
/// updates are far below 40 KB each).
const MAX_TRANSACTION_ITEMS: usize = 100;

/// Gives a grant nobody will use back to its buckets, whatever their limit type, and
/// deletes its lease rows (each exactly once, like a reclaimed lease).
pub(crate) async fn give_back(core: &Core, mut parts: Vec<LeasePart>) -> Result<usize, Error> {
    for part in &mut parts {
        part.restores = true;
    }
    end_parts(core, parts, None).await
}

/// How long a background give-back whose store keeps failing goes on trying: longer than
/// a store's usual outage, shorter than a lease's usual life (after which the reconciler
/// gives it back).
const GIVE_BACK_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// [`give_back`] for a grant its caller never received (gone away, or told the write
/// failed when it may have applied), in a task of its own. A give-back that fails because
/// the store is down, slow or lost the answer is tried again with backoff when that is
/// harmless: every part is a kept lease, whose ending happens once whatever the attempts.
pub(crate) fn give_back_in_background(core: &Arc<Core>, parts: Vec<LeasePart>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            "a grant was abandoned outside a tokio runtime; its leases expire and are reconciled"
        );
        return;
    };
    let core = core.clone();
    let idempotent = parts.iter().all(LeasePart::is_kept);
    handle.spawn(async move {
        let mut backoff = Backoff::new();
        let until = tokio::time::Instant::now() + GIVE_BACK_FOR;
        for attempt in 1u32.. {
            match give_back(&core, parts.clone()).await {
                Ok(_) => return,
                Err(Error::Store(e))
                    if idempotent
                        && (e.is_transient() || e.unsure())
                        && tokio::time::Instant::now() < until =>
                {
                    tracing::debug!(error = %e, attempt, "giving back a grant failed; retrying");
                    backoff.sleep(attempt.min(8)).await;
                }
                Err(error) => {
                    tracing::warn!(%error, "giving back a grant failed; its leases expire and are reconciled");
                    return;
                }
            }
        }
    });
}

/// Ends expired leases, giving their cost back to their buckets whatever the limit type.
/// Exactly once: each removal is conditioned on the lease still existing, so a concurrent
/// release or reconciler wins or loses as a whole.
pub(crate) async fn reclaim(core: &Core, records: Vec<LeaseRecord>) -> Result<usize, Error> {
    let parts = records
        .into_iter()
        .map(|r| LeasePart::of_record(r, true))
        .collect();
    end_parts(core, parts, None).await
}

/// Ends lease parts: deletes their rows and gives back the cost of those that restore (a
/// part without a row, from a lean bucket, only gives back). Returns how many parts this
/// call ended (rows already gone are skipped, and give nothing back). Parts go in
/// transactions DynamoDB accepts (at most 100 items each), each one atomic.
///
/// A release lost to other writers is retried at least `max_retries` times and, while the
/// lease is alive (`keep_trying_until`), until it expires: a slot given up early would
/// stay lost until the reconciler found it.
pub(crate) async fn end_parts(
    core: &Core,
    parts: Vec<LeasePart>,
    keep_trying_until: Option<UnixMillis>,
) -> Result<usize, Error> {
    let mut ended = 0;
    for chunk in transaction_chunks(parts) {
        ended += end_chunk(core, chunk, keep_trying_until).await?;
    }
    Ok(ended)
}

/// [`end_parts`] for parts that fit in one transaction.
async fn end_chunk(
    core: &Core,
    parts: Vec<LeasePart>,
    keep_trying_until: Option<UnixMillis>,
) -> Result<usize, Error> {
    let mut backoff = Backoff::new();
    let give_up = |attempt: u32| {
        attempt > core.config.max_retries && keep_trying_until.is_none_or(|t| core.now() >= t)
    };
    let (forgotten, mut parts) = forget_kept(core, parts).await?;
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        if parts.is_empty() {
            return Ok(forgotten);
        }
        let (buckets, now) = restoring_writes(core, &mut parts).await?;
        let written: Vec<BucketState> = buckets.iter().map(BucketWrite::after).collect();
        let commit = Commit {
            buckets,
            leases: parts
                .iter()
                .filter(|p| p.kept == Kept::Row)
                .map(|p| LeaseWrite::Delete(p.key.clone()))
                .collect(),
        };
        let dimension = match core.commit(commit).await {
            Ok(()) => {
                for row in written {
                    core.lanes.learn_written(row, now);
                }
                return Ok(forgotten + parts.len());
            }
            Err(CommitError::Condition(ConditionFailure::LeaseMissing(key))) => {
                tracing::debug!(%key, "lease row already gone (released or reconciled)");
                drop_gone(core, &mut parts, &key).await?;
                continue;
            }
            Err(CommitError::Condition(failure @ ConditionFailure::LeaseExists(_))) => {
                return Err(StoreError::impossible(&failure).into());
            }
            Err(CommitError::Condition(ConditionFailure::BucketChanged { dimension, .. })) => {
                dimension
            }
            Err(CommitError::TransactionConflict) => parts[0].dimension.clone(),
            Err(CommitError::Store(e)) => return Err(e.into()),
        };
        if give_up(attempt) {
            return Err(Error::Contention {
                dimension,
                attempts: attempt,
            });
        }
        backoff.sleep(attempt).await;
    }
}

/// Removes the leases kept in a bucket row that give nothing back, without any condition
/// (see [`Store::forget_held`](crate::store::Store::forget_held)): how many, and the
/// parts left to end.
async fn forget_kept(core: &Core, parts: Vec<LeasePart>) -> Result<(usize, Vec<LeasePart>), Error> {
    let (forget, rest): (Vec<LeasePart>, Vec<LeasePart>) = parts
        .into_iter()
        .partition(|p| p.kept == Kept::InBucket && !p.restores);
    let mut forgotten = 0;
    for (dimension, ids) in by_dimension(forget.into_iter().map(|p| (p.dimension, p.key))) {
        let ids: Vec<String> = ids.iter().map(|k| k.unique().to_owned()).collect();
        core.store.forget_held(&dimension, &ids).await?;
        forgotten += ids.len();
    }
    Ok((forgotten, rest))
}

/// Groups `(dimension, item)` pairs by dimension, in first-seen order.
fn by_dimension<T>(items: impl Iterator<Item = (Dimension, T)>) -> Vec<(Dimension, Vec<T>)> {
    let mut grouped: Vec<(Dimension, Vec<T>)> = Vec::new();
    for (dimension, item) in items {
        match grouped.iter_mut().find(|(d, _)| *d == dimension) {
            Some((_, items)) => items.push(item),
            None => grouped.push((dimension, vec![item])),
        }
    }
    grouped
}

/// The bucket writes that give the restoring parts' cost back and remove the leases their
/// rows keep, from rows read now, and the time they were computed at. A deleted bucket has
/// nothing to give back to, and the leases it kept went with it: those parts are dropped.
async fn restoring_writes(
    core: &Core,
    parts: &mut Vec<LeasePart>,
) -> Result<(Vec<BucketWrite>, UnixMillis), Error> {
    let restore: Vec<(Dimension, Tokens)> = by_dimension(
        parts
            .iter()
            .filter(|p| p.restores)
            .map(|p| (p.dimension.clone(), p.cost)),
    )
    .into_iter()
    .map(|(d, costs)| (d, costs.into_iter().fold(Tokens::ZERO, |sum, c| sum + c)))
    .collect();
    let dims: Vec<Dimension> = restore.iter().map(|(d, _)| d.clone()).collect();
    let rows = if dims.is_empty() {
        Vec::new()
    } else {
        core.store.read_buckets(&dims).await?
    };
    let now = core.now();
    let buckets: Vec<BucketWrite> = restore
        .iter()
        .zip(rows)
        .filter_map(|((dimension, amount), row)| {
            let row = row?;
            let held = parts
                .iter()
                .filter(|p| p.kept == Kept::InBucket && p.dimension == *dimension)
                .map(|p| HeldWrite::Remove(p.key.unique().to_owned()))
                .collect();
            let restored = row.restored(*amount, now);
            Some(BucketWrite::new(row, restored).with_held(held))
        })
        .collect();
    let existing: Vec<&Dimension> = buckets.iter().map(BucketWrite::dimension).collect();
    parts.retain(|p| p.kept != Kept::InBucket || existing.contains(&&p.dimension));
    Ok((buckets, now))
}

/// Drops the part of `key`, found gone, and every other one already gone: another client
/// may have ended many of them (two reclaiming the same expired leases), dropped at once
/// rather than one per failed transaction.
async fn drop_gone(core: &Core, parts: &mut Vec<LeasePart>, key: &LeaseKey) -> Result<(), Error> {
    parts.retain(|p| p.key != *key);
    let keys: Vec<LeaseKey> = parts
        .iter()
        .filter(|p| p.is_kept())
        .map(|p| p.key.clone())
        .collect();
    if keys.len() > 1 {
        let present = core.store.read_leases(&keys).await?;
        let gone: Vec<LeaseKey> = keys
            .into_iter()
            .zip(present)
            .filter(|(_, row)| row.is_none())
            .map(|(k, _)| k)
            .collect();
        parts.retain(|p| !gone.contains(&p.key));
    }
    Ok(())
}

/// Splits lease parts into groups that each fit in one transaction: at most
/// [`MAX_TRANSACTION_ITEMS`] items, counting one per lease row and one per bucket that
/// gets something back.
fn transaction_chunks(mut parts: Vec<LeasePart>) -> Vec<Vec<LeasePart>> {
    parts.sort_by(|a, b| a.dimension.cmp(&b.dimension));
    let mut chunks: Vec<Vec<LeasePart>> = Vec::new();
    let mut chunk: Vec<LeasePart> = Vec::new();
    let mut items = 0;
    for part in parts {
        let new_bucket = |chunk: &[LeasePart]| {
            part.restores
                && !chunk
                    .iter()
                    .any(|p| p.restores && p.dimension == part.dimension)
        };
        let mut adds = usize::from(part.is_kept()) + usize::from(new_bucket(&chunk));
        if items + adds > MAX_TRANSACTION_ITEMS && !chunk.is_empty() {
            chunks.push(std::mem::take(&mut chunk));
            items = 0;
            adds = usize::from(part.is_kept()) + usize::from(part.restores);
        }
        items += adds;
        chunk.push(part);
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    chunks
}
