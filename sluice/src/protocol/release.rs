//! Ending a lease its holder is done with: its lease rows deleted, and a `concurrent`
//! slot's cost given back through its dimension's lane; in one transaction on the seed's
//! protocol; by id from another process; in the background when nobody waits.

use std::sync::Arc;

use crate::clock::UnixMillis;
use crate::config::Protocol;
use crate::error::Error;
use crate::grant::{Kept, LeaseId, LeasePart};
use crate::retry::Backoff;
use crate::shared::Core;
use crate::shared::background::{MAX_IN_FLIGHT, Pending};
use crate::store::LeaseRecord;

use super::ending::{end_in_transactions, end_leases};
use super::fast;

/// Releases a lease's parts. Outside the seed's protocol, the rows of the parts that give
/// nothing back (`requests`, `tokens`) are deleted with no condition, in one batch with the
/// rows other releases of this client delete meanwhile (whoever deletes such a row gives
/// nothing back, so it does not matter who does); each other part
/// has its row deleted on condition that it still exists and, if this call deleted it, its
/// cost given back through its dimension's lane, riding on the lane's next change. The
/// seed's protocol ends them all in one transaction.
pub(crate) async fn release_parts(
    core: &Arc<Core>,
    parts: &[LeasePart],
    expires_at: UnixMillis,
) -> Result<(), Error> {
    // A row not yet written never will be; one being written is ended once it is there.
    let parts = &futures::future::join_all(parts.iter().map(LeasePart::ending)).await;
    if core.config.protocol() != Protocol::Fast {
        return end_in_transactions(core, parts.to_vec(), Some(expires_at))
            .await
            .map(drop);
    }
    let (plain, restoring): (Vec<&LeasePart>, Vec<&LeasePart>) =
        parts.iter().partition(|p| !p.restores);
    let rows: Vec<_> = plain
        .iter()
        .filter(|p| p.kept == Kept::Row)
        .map(|p| p.key.clone())
        .collect();
    core.rows.delete(&core.store, rows).await?;
    let released = futures::future::join_all(
        restoring
            .into_iter()
            .map(|part| fast::release(core, part.clone(), expires_at)),
    )
    .await;
    released.into_iter().collect()
}

/// Whether ending `parts` after it failed so is worth trying again: the store was down,
/// slow, throttling or lost the answer. Ending a lease row is idempotent (a part already
/// ended counts as ended), so it is retried whatever became of the failed write; a lean
/// part's give-back is a plain refund, retried only when it certainly did not apply.
fn worth_retrying(error: &Error, parts: &[LeasePart]) -> bool {
    let idempotent = parts.iter().all(LeasePart::is_kept);
    match error {
        Error::Contention { .. } => true,
        Error::Store(e) if e.may_have_applied() => idempotent,
        Error::Store(e) => e.is_transient(),
        _ => false,
    }
}

/// Releases `parts`; when that fails for a passing reason, tells `first` and goes on
/// trying with backoff until the release succeeds or the lease may be reclaimed (after
/// which the reconciler ends it). `first` hears the first attempt's outcome either way.
pub(crate) async fn release_until_done(
    core: &Arc<Core>,
    parts: Vec<LeasePart>,
    expires_at: UnixMillis,
    first: impl FnOnce(Result<(), Error>),
) {
    let result = release_parts(core, &parts, expires_at).await;
    let retry = matches!(&result, Err(e) if worth_retrying(e, &parts));
    first(result);
    if retry {
        let until = until_reclaimable(core, &parts, expires_at);
        queue(core, parts, expires_at, until, 1);
    }
}

/// When anyone may end the lease of `parts` (see
/// [`Config::reclaimable_at`](crate::Config::reclaimable_at)): its holder's release is
/// tried until then, after which a `requests`/`tokens` lease released is refunded only if
/// the store refused the release for that whole grace.
fn until_reclaimable(core: &Core, parts: &[LeasePart], expires_at: UnixMillis) -> UnixMillis {
    parts
        .iter()
        .map(|p| core.config.reclaimable_at(expires_at, p.restores))
        .max()
        .unwrap_or(expires_at)
}

/// Gives parts of a grant nobody will use back to their buckets through their lanes,
/// whatever their limit type, each exactly once (see [`release_parts`]).
pub(crate) async fn give_back_parts(
    core: &Arc<Core>,
    mut parts: Vec<LeasePart>,
    expires_at: UnixMillis,
) {
    for part in &mut parts {
        part.restores = true;
    }
    release_until_done(core, parts, expires_at, |result| {
        if let Err(error) = result {
            tracing::warn!(%error, "giving back tokens a refused acquire took failed; retrying while that is safe, else its leases expire and are reconciled");
        }
    })
    .await;
}

/// Releases `parts` (or, with `give_back`, gives them back) through the client's
/// background queue, for a holder that went away; without a tokio runtime they expire and
/// are reconciled.
pub(crate) fn in_background(
    core: &Arc<Core>,
    mut parts: Vec<LeasePart>,
    expires_at: UnixMillis,
    give_back: bool,
) {
    if give_back {
        for part in &mut parts {
            part.restores = true;
        }
    }
    let until = until_reclaimable(core, &parts, expires_at);
    queue(core, parts, expires_at, until, 0);
}

/// Releases a lease by id, e.g. one taken by another process. Returns whether any of its
/// rows still existed (`false`: already released or reconciled).
pub(crate) async fn release_id(core: &Core, id: &LeaseId) -> Result<bool, Error> {
    let records = core.store.read_leases(id.keys()).await?;
    let records: Vec<LeaseRecord> = records.into_iter().flatten().collect();
    if records.is_empty() {
        return Ok(false);
    }
    let dims: Vec<_> = records.iter().map(|r| r.dimension.clone()).collect();
    let rows = core.store.read_buckets(&dims).await?;
    let parts = records
        .into_iter()
        .zip(rows)
        .map(|(r, row)| {
            let restores = row.is_some_and(|b| b.bucket.limit_type().restores_on_release());
            // Released by id, as its holder would: whatever its expiry now.
            LeasePart::of_record(r, restores)
        })
        .collect();
    Ok(end_leases(core, parts, None).await? > 0)
}

/// Queues the release of `parts` in the client's background queue (tried at once, then
/// with the queue's backoff) until it succeeds or `until`, when anyone may end the lease.
fn queue(
    core: &Arc<Core>,
    parts: Vec<LeasePart>,
    expires_at: UnixMillis,
    until: UnixMillis,
    failures: u32,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            %expires_at,
            "a release nobody waits for outside a tokio runtime; the lease will expire and be reconciled"
        );
        return;
    };
    let pending = Pending {
        parts,
        expires_at,
        until,
        failures,
    };
    if core.background.push(pending) {
        // Owned by the queue: it ends when the queue is empty.
        runtime.spawn(work(core.clone()));
    }
}

/// Works `core`'s background queue until it is empty: a round takes up to
/// [`MAX_IN_FLIGHT`] releases (one, after a round where every call failed: a probe), and
/// the queue waits out one backoff (100 to 200 ms at most) after a round with failures.
async fn work(core: Arc<Core>) {
    let background = &core.background;
    let mut backoff = Backoff::new();
    let mut failed_rounds: u32 = 0;
    loop {
        let width = if failed_rounds > 0 { 1 } else { MAX_IN_FLIGHT };
        let round = background.round(width);
        if round.is_empty() {
            return;
        }
        let outcomes = futures::future::join_all(
            round
                .iter()
                .map(|p| release_parts(&core, &p.parts, p.expires_at)),
        )
        .await;
        let (mut any_failed, mut all_failed) = (false, true);
        for (mut pending, outcome) in round.into_iter().zip(outcomes) {
            match outcome {
                Ok(()) => {
                    all_failed = false;
                    if pending.failures > 0 {
                        tracing::info!(
                            failures = pending.failures,
                            "a release that had failed went through"
                        );
                    }
                    background.end();
                }
                Err(e) if worth_retrying(&e, &pending.parts) && core.now() < pending.until => {
                    any_failed = true;
                    pending.failures += 1;
                    tracing::debug!(error = %e, failures = pending.failures, "a background release failed; queued again");
                    background.requeue(pending);
                }
                Err(e) => {
                    all_failed = false;
                    tracing::warn!(error = %e, failures = pending.failures, "a release could not be made; the lease will expire and be reconciled");
                    background.end();
                }
            }
        }
        failed_rounds = if any_failed && all_failed {
            failed_rounds + 1
        } else {
            0
        };
        if any_failed {
            backoff.sleep(failed_rounds.clamp(1, 8)).await;
        }
    }
}
