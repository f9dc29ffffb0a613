//! Idle keys' rows: a key's row of a keyed bucket that has been full for a while is
//! removed. A missing key's row is the bucket full (its next acquire creates it from the
//! template), so removing a full row changes nothing any caller can see, and keys nobody
//! uses cost no row.

use std::time::Duration;

use super::{ReconcileError, ReconcileReport};
use crate::bucket::BucketState;
use crate::clock::UnixMillis;
use crate::shared::Core;

/// How long a key's row stays full before the reconciler removes it: long beyond any
/// clock skew between the reconciler and the clients, so that a row it reads as full is
/// full by every clock; and a key used every few minutes keeps its row.
pub(crate) const KEY_IDLE_AFTER: Duration = Duration::from_secs(600);

/// Whether `row` is an idle key's, to remove at `now`: a key's own row (not spread, not an
/// override, which is a definition of its own, nor one whose shadow ledger counts
/// something or which learned a vendor's burst), of a bucket that refills, full since [`KEY_IDLE_AFTER`] before `now` at the
/// latest.
pub(crate) fn idle(row: &BucketState, now: UnixMillis) -> bool {
    let Some(since) = now.as_millis().checked_sub(millis(KEY_IDLE_AFTER)) else {
        return false;
    };
    row.dimension.key().is_some()
        && row.dimension.shard_index() == 0
        && row.shards == 1
        && !row.bucket.is_override()
        && row.shadow == crate::bucket::ShadowLedger::default()
        && row.burst.is_none()
        && row.bucket.limit_type().refills()
        && row.available(UnixMillis::new(since)) >= row.holds()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Removes the idle keys' rows of `buckets` (read by this pass), each only if it is still
/// the row read: a write since (an acquire) keeps it.
pub(super) async fn remove_idle_keys(
    core: &Core,
    buckets: &[BucketState],
    now: UnixMillis,
    report: &mut ReconcileReport,
) {
    for row in buckets.iter().filter(|row| idle(row, now)) {
        match core.store.delete_bucket_as(row).await {
            Ok(true) => {
                tracing::debug!(dimension = %row.dimension, "removed an idle key's row");
                report.keys_removed += 1;
            }
            Ok(false) => {}
            Err(e) => report.errors.push(ReconcileError {
                subject: row.dimension.to_string(),
                error: e.into(),
            }),
        }
    }
}
