//! Ending leases: giving back a grant nobody will use, reclaiming expired leases (the
//! reconciler's work, and a short `concurrent` bucket's), and the seed protocol's release
//! in one transaction. Each lease ends exactly once whatever else races on it: whoever
//! deletes its row (a delete conditioned on the row existing) gives its cost back.
//!
//! Outside the seed's protocol, a lease's row and its bucket are written one after the
//! other, never in one transaction (a transaction on the bucket row would make every
//! other writer of that row fail while it is in flight): the row is deleted first, then the
//! cost is given back in a [`BucketChange`]. A process that dies between the two leaves
//! the bucket short of that cost: a `concurrent` bucket is healed by the reconciler; a
//! `requests`/`tokens` one counts it as used. Neither ever grants more than it holds.

use std::sync::Arc;

use crate::bucket::{BucketState, Want, commute};
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::grant::{Kept, LeasePart};
use crate::retry::{Backoff, Budget};
use crate::shared::Core;
use crate::store::{
    BucketChange, BucketWrite, ChangeError, Commit, CommitError, ConditionFailure, LeaseKey,
    LeaseRecord, LeaseWrite, StoreError,
};
use crate::tokens::Tokens;

/// DynamoDB takes at most 100 items per transaction (and 4 MB; lease deletes and bucket
/// updates are far below 40 KB each).
const MAX_TRANSACTION_ITEMS: usize = 100;

/// Changes lost to another writer's fold or fill before a give-back gives up (each hands
/// back the current row, from which the next is computed at once).
const MAX_FRESH_RETRIES: u32 = 64;

/// Gives a grant nobody will use back to its buckets, whatever their limit type, and
/// deletes its lease rows (each exactly once, like a reclaimed lease). Returns how many
/// parts it ended.
pub(crate) async fn give_back(core: &Core, mut parts: Vec<LeasePart>) -> Result<usize, Error> {
    for part in &mut parts {
        part.restores = true;
    }
    end_leases(core, parts, None).await
}

/// How long a background give-back whose store keeps failing goes on trying: longer than
/// a store's usual outage, shorter than a lease's usual life (after which the reconciler
/// gives it back).
const GIVE_BACK_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// [`give_back`] for a grant its caller never received (gone away, or told the write
/// failed when it may have applied), in a task of its own, one dimension after another.
/// A dimension's give-back that fails because the store is down or slow is tried again
/// with backoff only when that cannot give twice: when every part of it has a lease row
/// (whose ending happens once whatever the attempts), or when nothing was sent. A part
/// with no row (its row never written) whose give-back lost its answer may have been
/// given back: it is not sent again, and its tokens count as used.
pub(crate) fn give_back_in_background(core: &Arc<Core>, parts: Vec<LeasePart>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            "a grant was abandoned outside a tokio runtime; its leases expire and are reconciled"
        );
        return;
    };
    let core = core.clone();
    handle.spawn(async move {
        // Whether each part has a row to end is settled once, before any attempt: a row
        // not yet written never will be.
        let parts = futures::future::join_all(parts.iter().map(LeasePart::ending)).await;
        let until = tokio::time::Instant::now() + GIVE_BACK_FOR;
        let grouped = by_dimension(parts.into_iter().map(|p| (p.dimension.clone(), p)));
        for (_, parts) in grouped {
            give_back_until(&core, parts, until).await;
        }
    });
}

/// Gives back `parts`, all of one dimension, trying again while that is harmless and
/// before `until`.
async fn give_back_until(core: &Core, parts: Vec<LeasePart>, until: tokio::time::Instant) {
    let rows = parts.iter().all(LeasePart::is_kept);
    let mut backoff = Backoff::new();
    for attempt in 1u32.. {
        match give_back(core, parts.clone()).await {
            Ok(_) => return,
            Err(Error::Store(e))
                if e.is_transient()
                    && (rows || !e.may_have_applied())
                    && tokio::time::Instant::now() < until =>
            {
                tracing::debug!(error = %e, attempt, "giving back a grant failed; retrying");
                backoff.sleep(attempt.min(8)).await;
            }
            Err(error) => {
                tracing::warn!(%error, "giving back a grant failed; its leases expire and are reconciled, tokens given back without a lease row count as used");
                return;
            }
        }
    }
}

/// Ends expired leases, giving their cost back to their buckets whatever the limit type.
/// Exactly once: each lease row's delete is conditioned on it still existing, so a
/// concurrent release or reconciler wins or loses as a whole. Returns how many it ended.
pub(crate) async fn reclaim(core: &Core, records: Vec<LeaseRecord>) -> Result<usize, Error> {
    let parts = records
        .into_iter()
        .map(|r| LeasePart {
            expiring_at: Some(r.expires_at),
            ..LeasePart::of_record(r, true)
        })
        .collect();
    end_leases(core, parts, None).await
}

/// What became of a lease row this client tried to delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// This client deleted it: it gives the cost back.
    Here,
    /// Someone else did (a release elsewhere, the reconciler), or it never was.
    Elsewhere,
}

/// Deletes `part`'s lease row. An answer that was lost is settled by reading the row: gone
/// before anyone but its holder may end it (`holder_until`), it was this client's delete;
/// after that, it may have been the reconciler's, and is taken as someone else's (a slot
/// that may then stay short of its cost is healed by the reconciler, never given twice).
/// A delete throttled, or refused while a transaction holds the row (another SDK's release
/// or reconciler), applied nothing: it is sent again after a jittered backoff, up to
/// `max_retries` times.
pub(crate) async fn end_lease_row(
    core: &Core,
    key: &LeaseKey,
    holder_until: Option<UnixMillis>,
    expiring_at: Option<UnixMillis>,
) -> Result<Ended, Error> {
    let mut pressed = Budget::new(core.config.max_retries);
    let ended = loop {
        match core.store.end_lease(key, expiring_at).await {
            Err(e) if e.is_back_pressure() && pressed.lose() => {
                tracing::debug!(%key, error = %e, "a lease row's delete met back-pressure; sending it again");
                pressed.back_off(pressed.lost()).await;
            }
            other => break other,
        }
    };
    match ended {
        Ok(true) => Ok(Ended::Here),
        Ok(false) => Ok(Ended::Elsewhere),
        Err(e) if e.answer_lost() => {
            let row = core.store.read_leases(std::slice::from_ref(key)).await?;
            match (row.first().and_then(Option::as_ref), holder_until) {
                // Still there: the delete did not apply.
                (Some(_), _) => Box::pin(end_lease_row(core, key, holder_until, expiring_at)).await,
                (None, Some(until)) if core.now() < until => Ok(Ended::Here),
                (None, _) => {
                    tracing::warn!(%key, error = %e, "a lease row's delete lost its answer and the row is gone; not giving its cost back (the reconciler heals a slot left short)");
                    Ok(Ended::Elsewhere)
                }
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Ends lease parts: deletes their rows and gives back the cost of those that restore and
/// whose row this call deleted (a part without a row, from a lean bucket, only gives
/// back). Returns how many parts this call ended (rows already gone are skipped, and give
/// nothing back). `holder_until`: the parts' holder ends them, and no one else may before
/// then (see [`end_lease_row`]).
pub(crate) async fn end_leases(
    core: &Core,
    parts: Vec<LeasePart>,
    holder_until: Option<UnixMillis>,
) -> Result<usize, Error> {
    // A row not yet written never will be; one being written is ended once it is there.
    let parts = futures::future::join_all(parts.iter().map(LeasePart::ending)).await;
    let mut ended = 0;
    let mut back: Vec<(Dimension, Tokens)> = Vec::new();
    for part in parts {
        let mine = match part.kept {
            Kept::Row => {
                end_lease_row(core, &part.key, holder_until, part.expiring_at).await? == Ended::Here
            }
            Kept::Nowhere => true,
            Kept::Local | Kept::Unrecorded => false,
        };
        if !mine {
            continue;
        }
        ended += 1;
        if part.restores && part.cost > Tokens::ZERO {
            match back.iter_mut().find(|(d, _)| *d == part.dimension) {
                Some((_, sum)) => *sum += part.cost,
                None => back.push((part.dimension.clone(), part.cost)),
            }
        }
    }
    for (dimension, amount) in back {
        restore(core, &dimension, amount).await?;
    }
    Ok(ended)
}

/// Gives `amount` back to `dimension`'s bucket (capped at what it holds), in one change
/// computed from the row this client remembers (see [`change_remembered`]). A bucket that
/// is gone has nothing to give back to. A change whose answer was lost is not sent again:
/// giving back twice could grant what the bucket does not hold.
pub(crate) async fn restore(
    core: &Core,
    dimension: &Dimension,
    amount: Tokens,
) -> Result<(), Error> {
    change_remembered(
        core,
        dimension,
        MAX_FRESH_RETRIES,
        |_| Ok(()),
        |row, now| Ok(bucket_change(core, row, amount, Tokens::ZERO, now)),
    )
    .await
}

/// Makes one change of `dimension`'s bucket, computed by `compute` from the row this
/// client remembers at `now` (`None`: nothing to change). A lost race is computed again at
/// once from the row the failure hands back, a shard gathered away is followed to its
/// bucket's row that took its place, back-pressure is waited out; at most
/// `max_fresh_retries` + 1 changes. A bucket gone with no row in its place answers `gone`,
/// except a key's row (removed when idle): its bucket is its template's, full, and the
/// change creates the row again (see [`unwritten_key`](super::reshard::unwritten_key)).
pub(super) async fn change_remembered(
    core: &Core,
    dimension: &Dimension,
    max_fresh_retries: u32,
    gone: impl Fn(&Dimension) -> Result<(), Error>,
    compute: impl Fn(&BucketState, UnixMillis) -> Result<Option<BucketChange>, Error>,
) -> Result<(), Error> {
    let mut backoff = Backoff::new();
    let mut throttled: u32 = 0;
    let mut dimension = dimension.clone();
    for _ in 0..=max_fresh_retries {
        let (row, creates) = match core.remembered_row(&dimension).await {
            Ok(row) => (row, None),
            Err(Error::UnknownDimension { .. }) => match core.moved_shard(&dimension).await? {
                // A shard gathered away: its bucket's row that took its place.
                Some(moved) => {
                    dimension = moved;
                    continue;
                }
                None => match super::reshard::unwritten_key(core, &dimension).await? {
                    Some(row) => {
                        let at = row.last_refill_at;
                        (row, Some(at))
                    }
                    None => return gone(&dimension),
                },
            },
            Err(e) => return Err(e),
        };
        let now = core.now();
        let Some(change) = compute(&row, now)? else {
            return Ok(());
        };
        let change = match creates {
            Some(at) => change.creating(at),
            None => change,
        };
        match core.change(change).await {
            Ok(after) => {
                core.lanes.learn_written(after, now);
                return Ok(());
            }
            Err(ChangeError::Condition(Some(current))) => core.lanes.learn(*current, now),
            Err(ChangeError::Condition(None)) => {
                core.lanes.forget(&dimension);
                match core.moved_shard(&dimension).await? {
                    Some(moved) => dimension = moved,
                    // A key's row removed: made again from its template next time round.
                    None if dimension.key().is_some() => {}
                    None => return gone(&dimension),
                }
            }
            Err(ChangeError::Store(e)) if e.is_back_pressure() => {
                throttled += 1;
                backoff.sleep(throttled.min(8)).await;
            }
            Err(ChangeError::Store(e)) => {
                core.lanes.forget(&dimension);
                return Err(e.into());
            }
        }
    }
    Err(Error::Contention {
        dimension,
        attempts: max_fresh_retries + 1,
    })
}

/// The change that gives `restored` back to `row`'s bucket (capped at what it holds) and
/// takes `taken` from it (into debt if need be) at `now`.
pub(super) fn bucket_change(
    core: &Core,
    row: &BucketState,
    restored: Tokens,
    taken: Tokens,
    now: UnixMillis,
) -> Option<BucketChange> {
    let want = Want {
        restored,
        taken,
        need: None,
        ceiling: row.holds(),
        fill: true,
        short: false,
        others_per_ks: 0,
        behind: false,
        herd: crate::bucket::Herd::Not,
    };
    let commute = commute(row, &want, (now, core.now_micros()), core.config.fold_after)?;
    Some(BucketChange::of(row, commute))
}

/// Ends lease parts in transactions, the seed's protocol: deletes their rows and gives back
/// the cost of those that restore, each transaction atomic (at most 100 items). Returns how
/// many parts this call ended (rows already gone are skipped, and give nothing back).
///
/// A release lost to other writers is retried at least `max_retries` times and, while the
/// lease is alive (`keep_trying_until`), until it expires: a slot given up early would
/// stay lost until the reconciler found it.
pub(crate) async fn end_in_transactions(
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

/// [`end_in_transactions`] for parts that fit in one transaction.
async fn end_chunk(
    core: &Core,
    mut parts: Vec<LeasePart>,
    keep_trying_until: Option<UnixMillis>,
) -> Result<usize, Error> {
    let mut backoff = Backoff::new();
    let give_up = |attempt: u32| {
        attempt > core.config.max_retries && keep_trying_until.is_none_or(|t| core.now() >= t)
    };
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        if parts.is_empty() {
            return Ok(0);
        }
        let (buckets, now) = restoring_writes(core, &parts).await?;
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
                return Ok(parts.len());
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

/// The bucket writes that give the restoring parts' cost back, from rows read now, and the
/// time they were computed at. A deleted bucket has nothing to give back to.
async fn restoring_writes(
    core: &Core,
    parts: &[LeasePart],
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
        .filter_map(|((_, amount), row)| {
            let row = row?;
            let restored = row.restored(*amount, now);
            Some(BucketWrite::new(row, restored))
        })
        .collect();
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
