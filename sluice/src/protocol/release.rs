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
    if core.config.protocol != Protocol::Fast {
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
    if !retry {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            "a release failed outside a tokio runtime; the lease will expire and be reconciled"
        );
        return;
    };
    runtime.spawn(retry_release(core.clone(), parts, expires_at));
}

/// Retries a failed release with backoff until it succeeds or anyone may end the lease
/// (see [`Config::reclaimable_at`](crate::Config::reclaimable_at)): a `requests`/`tokens`
/// lease its holder released is then refunded only if the store refused the release for
/// the whole grace.
async fn retry_release(core: Arc<Core>, parts: Vec<LeasePart>, expires_at: UnixMillis) {
    let core = &core;
    let mut backoff = Backoff::new();
    let mut failures: u32 = 1;
    let until = parts
        .iter()
        .map(|p| core.config.reclaimable_at(expires_at, p.restores))
        .max()
        .unwrap_or(expires_at);
    while core.now() < until {
        backoff.sleep(failures.min(8)).await;
        match release_parts(core, &parts, expires_at).await {
            Ok(()) => {
                tracing::info!(failures, "a release that had failed went through");
                return;
            }
            Err(e) if worth_retrying(&e, &parts) => {
                failures += 1;
                tracing::debug!(error = %e, failures, "a release failed again; retrying");
            }
            Err(e) => {
                tracing::warn!(error = %e, "a release failed; the lease will expire and be reconciled");
                return;
            }
        }
    }
    tracing::warn!(
        failures,
        "a release kept failing until its lease could be reclaimed; the reconciler ends it"
    );
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

/// Releases `parts` (or, with `give_back`, gives them back) in a task of their own, for a
/// holder that went away; without a tokio runtime they expire and are reconciled.
pub(crate) fn in_background(
    core: &Arc<Core>,
    parts: Vec<LeasePart>,
    expires_at: UnixMillis,
    give_back: bool,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            %expires_at,
            "a lease was dropped outside a tokio runtime; it will expire and be reconciled"
        );
        return;
    };
    let core = core.clone();
    handle.spawn(async move {
        if give_back {
            give_back_parts(&core, parts, expires_at).await;
        } else {
            release_until_done(&core, parts, expires_at, |result| {
                if let Err(error) = result {
                    tracing::warn!(%error, "a background release failed; retrying until the lease may be reclaimed");
                }
            })
            .await;
        }
    });
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
            LeasePart {
                expiring_at: None,
                ..LeasePart::of_record(r, restores)
            }
        })
        .collect();
    Ok(end_leases(core, parts, None).await? > 0)
}
