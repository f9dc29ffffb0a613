//! Ending a lease its holder is done with: through the lanes on the fast path, in one
//! transaction on the seed's; by id from another process; in the background when nobody
//! waits.

use std::sync::Arc;

use crate::clock::UnixMillis;
use crate::config::Protocol;
use crate::error::Error;
use crate::grant::{LeaseId, LeasePart};
use crate::shared::Core;
use crate::store::LeaseRecord;

use super::ending::end_parts;
use super::fast;

/// Releases a lease's parts. On the fast path each part goes through its dimension's
/// lane, all at once (no read; the release rides on the lane's next write); a part whose
/// write keeps losing races falls back to [`end_parts`], which keeps trying until the
/// lease expires. The seed's protocol ends them all in one transaction.
pub(crate) async fn release_parts(
    core: &Arc<Core>,
    parts: Vec<LeasePart>,
    expires_at: UnixMillis,
) -> Result<(), Error> {
    if core.config.protocol != Protocol::Fast {
        return end_parts(core, parts, Some(expires_at)).await.map(drop);
    }
    let released = futures::future::join_all(parts.into_iter().map(|part| async move {
        match fast::release(core, part.clone()).await {
            Err(Error::Contention { .. }) => end_parts(core, vec![part], Some(expires_at))
                .await
                .map(drop),
            done => done,
        }
    }))
    .await;
    released.into_iter().collect()
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
    if let Err(error) = release_parts(core, parts, expires_at).await {
        tracing::warn!(%error, "giving back tokens a refused acquire took failed; its leases expire and are reconciled");
    }
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
        } else if let Err(error) = release_parts(&core, parts, expires_at).await {
            tracing::warn!(%error, "background release failed; the lease will expire and be reconciled");
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
            LeasePart::of_record(r, restores)
        })
        .collect();
    Ok(end_parts(core, parts, None).await? > 0)
}
