//! The reconciler: gives back what crashed callers took, and heals `concurrent` buckets.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use crate::bucket::{BucketState, Level, LimitType};
use crate::dimension::Dimension;
use crate::error::Error;
use crate::shared::Core;
use crate::store::{BucketWrite, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord};
use crate::tokens::Tokens;

use super::ending::reclaim;

mod idle;

/// What one reconcile pass did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct ReconcileReport {
    /// Expired leases found.
    pub leases_seen: usize,
    /// Expired leases this pass ended, giving their cost back.
    pub leases_restored: usize,
    /// Tokens those leases gave back (before the capacity cap).
    pub tokens_restored: Tokens,
    /// Expired leases already ended by someone else (a late release, another reconciler).
    pub leases_skipped: usize,
    /// Expired leases of `requests`/`tokens` buckets left for a later pass: their holders
    /// may still be retrying a failed release (see
    /// [`Config::reclaimable_at`](crate::Config::reclaimable_at)).
    pub leases_in_grace: usize,
    /// `concurrent` buckets checked against their live leases.
    pub buckets_checked: usize,
    /// `concurrent` buckets whose tokens were recomputed from their leases.
    pub buckets_healed: usize,
    /// Tokens those recomputations added (negative: removed).
    pub tokens_healed: Tokens,
    /// `concurrent` buckets left for the next pass because they changed while checked.
    pub buckets_busy: usize,
    /// `concurrent` buckets holding fewer tokens than their readable leases account for,
    /// left as they are because a lease row on them could not be read: what it holds is
    /// unknown, and raising the bucket could grant a slot that is still taken.
    pub buckets_not_raised: usize,
    /// Buckets whose scheduled limits fell due and were applied by this pass (see
    /// [`Bucket::with_schedule`](crate::Bucket::with_schedule)).
    pub schedules_applied: usize,
    /// Keys' rows of keyed buckets removed for being idle: full for a while (see
    /// [`Bucket::keyed`](crate::Bucket::keyed)); a missing row is a full bucket.
    pub keys_removed: usize,
    /// What went wrong, per lease or bucket; the pass goes on past each.
    pub errors: Vec<ReconcileError>,
}

impl ReconcileReport {
    /// Whether the pass changed nothing at all.
    pub fn is_noop(&self) -> bool {
        self.leases_restored == 0
            && self.buckets_healed == 0
            && self.schedules_applied == 0
            && self.keys_removed == 0
    }
}

impl fmt::Display for ReconcileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} expired leases: {} restored ({} tokens), {} already gone, {} in their release grace; {} concurrent buckets checked: {} healed ({} tokens), {} busy, {} not raised (unreadable leases); {} schedules applied; {} idle keys removed; {} errors",
            self.leases_seen,
            self.leases_restored,
            self.tokens_restored,
            self.leases_skipped,
            self.leases_in_grace,
            self.buckets_checked,
            self.buckets_healed,
            self.tokens_healed,
            self.buckets_busy,
            self.buckets_not_raised,
            self.schedules_applied,
            self.keys_removed,
            self.errors.len()
        )
    }
}

/// One failure inside a reconcile pass.
#[derive(Debug)]
pub struct ReconcileError {
    /// The lease key or dimension it concerns.
    pub subject: String,
    /// What went wrong.
    pub error: Error,
}

impl fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.error)
    }
}

/// One reconcile pass (see [`Sluice::reconcile`](crate::Sluice::reconcile)), and the
/// bucket rows it listed (for the schedules).
///
/// It reads the table twice, whatever it finds: one listing of the bucket rows and one of
/// the lease rows (on DynamoDB each a scan, billed for every row of the table). What it
/// reads besides is in proportion to what it acts on: the `concurrent` buckets again when
/// it gave leases back, and a second look at the leases only where a bucket seems not to
/// match them.
pub(crate) async fn reconcile(core: &Core) -> Result<(ReconcileReport, Vec<BucketState>), Error> {
    let started = std::time::Instant::now();
    let mut report = ReconcileReport::default();
    let now = core.now();
    let buckets = core.store.list_buckets().await?;
    let scan = core.store.scan_leases(&LeaseFilter::default()).await?;
    let slots: HashSet<Dimension> = buckets
        .iter()
        .filter(|b| b.bucket.limit_type() == LimitType::Concurrent)
        .map(|b| b.dimension.clone())
        .collect();
    // Every expired lease; those within the clock-skew margin (a cool-down lease has
    // none) are left alone: their holder's clock may still show them live.
    let expired_before = now.saturating_add(Duration::from_millis(1));
    let (expired, mut live): (Vec<LeaseRecord>, Vec<LeaseRecord>) =
        scan.leases.into_iter().partition(|l| {
            l.expires_at < expired_before
                && core
                    .config
                    .lease_reclaimable_at(l.expires_at, true, &l.caller)
                    <= now
        });
    report.leases_seen = expired.len();
    let mut unsure: Vec<Option<Dimension>> = scan
        .unreadable
        .iter()
        .map(|key| LeaseKey::parse(key).and_then(|k| k.dimension()))
        .collect();
    let mut gave_back = false;
    for lease in expired {
        let slot = slots.contains(&lease.dimension);
        if core
            .config
            .lease_reclaimable_at(lease.expires_at, slot, &lease.caller)
            > now
        {
            report.leases_in_grace += 1;
            live.push(lease);
            continue;
        }
        let dimension = lease.dimension.clone();
        match restore_expired(core, lease, &mut report).await {
            Some(true) => gave_back |= slot,
            Some(false) => {}
            // Whether it is gone is not known: its bucket is not healed this pass.
            None => unsure.push(Some(dimension)),
        }
    }
    // What the healing compares: the `concurrent` buckets as they are after the leases
    // given back, against the leases that were live.
    let concurrent = concurrent_now(core, &buckets, &slots, gave_back).await?;
    heal_concurrent(core, &concurrent, (held(live), unsure), &mut report).await?;
    idle::remove_idle_keys(core, &buckets, now, &mut report).await;
    crate::metrics::reconciled(
        crate::metrics::Reconciled {
            restored: report.leases_restored,
            skipped: report.leases_skipped,
            healed: report.buckets_healed,
            errors: report.errors.len(),
            tokens_restored: report.tokens_restored,
        },
        started.elapsed(),
    );
    if report.is_noop() && report.errors.is_empty() {
        tracing::debug!(%report, "reconcile pass");
    } else {
        tracing::info!(%report, "reconcile pass");
    }
    Ok((report, buckets))
}

/// The `concurrent` buckets (`slots`) as they stand: read again when this pass `gave_back`
/// leases of them, else as listed in `buckets`.
async fn concurrent_now(
    core: &Core,
    buckets: &[BucketState],
    slots: &HashSet<Dimension>,
    gave_back: bool,
) -> Result<Vec<BucketState>, Error> {
    if !gave_back {
        return Ok(buckets
            .iter()
            .filter(|b| slots.contains(&b.dimension))
            .cloned()
            .collect());
    }
    let dimensions: Vec<Dimension> = slots.iter().cloned().collect();
    Ok(core
        .store
        .read_buckets(&dimensions)
        .await?
        .into_iter()
        .flatten()
        .collect())
}

/// Ends `lease`, giving its cost back: `Some(true)` if this pass did, `Some(false)` if
/// someone else had, `None` if that is not known (an error, in `report`).
async fn restore_expired(
    core: &Core,
    lease: LeaseRecord,
    report: &mut ReconcileReport,
) -> Option<bool> {
    let (key, cost, caller) = (lease.key.clone(), lease.cost, lease.caller.clone());
    match reclaim(core, vec![lease]).await {
        Ok(0) => {
            report.leases_skipped += 1;
            Some(false)
        }
        Ok(_) => {
            tracing::debug!(lease = %key, %cost, %caller, "restored an expired lease");
            report.leases_restored += 1;
            report.tokens_restored += cost;
            Some(true)
        }
        Err(error) => {
            report.errors.push(ReconcileError {
                subject: key.to_string(),
                error,
            });
            None
        }
    }
}

/// The live lease rows of each dimension, as one scan found them: key and cost, sorted.
type Held = HashMap<Dimension, Vec<(LeaseKey, Tokens)>>;

/// The lease rows of each dimension among `leases`.
fn held(leases: Vec<LeaseRecord>) -> Held {
    let mut held: Held = HashMap::new();
    for lease in leases {
        held.entry(lease.dimension)
            .or_default()
            .push((lease.key, lease.cost));
    }
    for rows in held.values_mut() {
        rows.sort();
    }
    held
}

/// The lease rows of each dimension, as a scan of every lease row finds them now.
async fn scan_held(core: &Core) -> Result<Held, Error> {
    let scan = core.store.scan_leases(&LeaseFilter::default()).await?;
    Ok(held(scan.leases))
}

/// What `row`'s tokens should be by the lease rows `held`, when they are not that.
fn mismatch(row: &BucketState, held: &Held) -> Option<Tokens> {
    let leased = held
        .get(&row.dimension)
        .map(|rows| rows.iter().fold(Tokens::ZERO, |sum, (_, cost)| sum + *cost))
        .unwrap_or_default();
    let expected = row.bucket.capacity() - leased;
    (row.tokens != expected).then_some(expected)
}

/// Sets each `concurrent` bucket (of `buckets`) whose tokens do not match its live lease
/// rows (`held`) to match them, once the mismatch has stayed unchanged for
/// [`Config::heal_settle`]: the bucket row's version and the dimension's lease rows the
/// same at both looks (a slot's acquire and release write the two one after the other,
/// so a mismatch seen once may be a write in flight). The write is conditioned on that
/// version. A bucket with a lease row of unknown content (`unknown`: `None`, any bucket)
/// is never raised.
///
/// [`Config::heal_settle`]: crate::Config::heal_settle
async fn heal_concurrent(
    core: &Core,
    buckets: &[BucketState],
    (held, unknown): (Held, Vec<Option<Dimension>>),
    report: &mut ReconcileReport,
) -> Result<(), Error> {
    let buckets: Vec<BucketState> = buckets
        .iter()
        .filter(|b| b.bucket.limit_type() == LimitType::Concurrent)
        .cloned()
        .collect();
    if buckets.is_empty() {
        return Ok(());
    }
    let mut suspects = Vec::new();
    for row in buckets {
        report.buckets_checked += 1;
        let Some(expected) = mismatch(&row, &held) else {
            continue;
        };
        if expected > row.tokens
            && unknown
                .iter()
                .any(|d| d.as_ref().is_none_or(|d| *d == row.dimension))
        {
            tracing::warn!(
                dimension = %row.dimension,
                tokens = %row.tokens,
                "concurrent bucket holds fewer tokens than its readable leases account for, \
                 but a lease row on it cannot be read; not raising it"
            );
            report.buckets_not_raised += 1;
            continue;
        }
        suspects.push(row);
    }
    if suspects.is_empty() {
        return Ok(());
    }
    tokio::time::sleep(core.config.heal_settle).await;
    let dimensions: Vec<Dimension> = suspects.iter().map(|r| r.dimension.clone()).collect();
    let again = core.store.read_buckets(&dimensions).await?;
    let held_again = scan_held(core).await?;
    for (row, now) in suspects.into_iter().zip(again) {
        let settled = now.as_ref().is_some_and(|now| now.version == row.version)
            && held.get(&row.dimension) == held_again.get(&row.dimension);
        let Some(expected) = mismatch(&row, &held).filter(|_| settled) else {
            report.buckets_busy += 1;
            continue;
        };
        heal(core, row, expected, report).await;
    }
    Ok(())
}

/// Sets `row`'s tokens to `expected`, on condition that the row is still as read.
async fn heal(core: &Core, row: BucketState, expected: Tokens, report: &mut ReconcileReport) {
    let commit = Commit {
        buckets: vec![BucketWrite::new(
            row.clone(),
            Level {
                tokens: expected,
                ..row.level()
            },
        )],
        leases: Vec::new(),
    };
    match core.commit(commit).await {
        Ok(()) => {
            tracing::warn!(
                dimension = %row.dimension,
                was = %row.tokens,
                now = %expected,
                "concurrent bucket did not match its leases; recomputed"
            );
            report.buckets_healed += 1;
            report.tokens_healed += expected - row.tokens;
        }
        Err(CommitError::Condition(_) | CommitError::TransactionConflict) => {
            report.buckets_busy += 1;
        }
        Err(CommitError::Store(e)) => report.errors.push(ReconcileError {
            subject: row.dimension.to_string(),
            error: e.into(),
        }),
    }
}
