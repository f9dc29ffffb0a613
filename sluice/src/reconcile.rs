//! The reconciler: gives back what crashed callers took, and heals `concurrent` buckets.

use std::collections::HashMap;
use std::fmt;

use crate::bucket::{BucketState, LimitType};
use crate::client::Sluice;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::store::{BucketWrite, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord};
use crate::tokens::Tokens;

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
    /// What went wrong, per lease or bucket; the pass goes on past each.
    pub errors: Vec<ReconcileError>,
}

impl ReconcileReport {
    /// Whether the pass changed nothing at all.
    pub fn is_noop(&self) -> bool {
        self.leases_restored == 0 && self.buckets_healed == 0
    }
}

impl fmt::Display for ReconcileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} expired leases: {} restored ({} tokens), {} already gone; {} concurrent buckets checked: {} healed ({} tokens), {} busy, {} not raised (unreadable leases); {} errors",
            self.leases_seen,
            self.leases_restored,
            self.tokens_restored,
            self.leases_skipped,
            self.buckets_checked,
            self.buckets_healed,
            self.tokens_healed,
            self.buckets_busy,
            self.buckets_not_raised,
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

impl Sluice {
    /// One reconcile pass, as the seed's scheduled reconciler runs it every 5 minutes.
    ///
    /// 1. Every lease past its expiry (a caller that crashed or overran) is ended with one
    ///    atomic write per lease: its cost goes back to its bucket, capped at capacity, and
    ///    the lease row is deleted on condition that it still exists. A release or another
    ///    reconciler racing on the same lease wins or loses as a whole, so the cost comes
    ///    back exactly once. Idempotent: a second pass finds nothing.
    /// 2. Every `concurrent` bucket is checked against its lease rows: its tokens must be
    ///    `capacity - sum of lease costs`. A lease deleted without giving its slot back
    ///    (DynamoDB's TTL sweeper, a manual delete) would otherwise lose that slot forever;
    ///    the bucket is rewritten on condition that its version has not moved since it was
    ///    read (any acquire or release moves it), so healing never races a grant. A bucket
    ///    with a lease row the store cannot read is only ever lowered, never raised.
    ///
    /// Returns `Err` only when the pass cannot start (e.g. a missing table); failures on
    /// single leases or buckets are in the report's `errors`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Acquire, Bucket, ManualClock, Sluice, UnixMillis};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    /// let sluice = Sluice::builder().clock(clock.clone()).build()?;
    /// sluice.put_bucket("elevenlabs#concurrent", Bucket::concurrent(2)).await?;
    ///
    /// // A caller takes a slot and "crashes": the lease is never released.
    /// let lease = sluice.acquire(Acquire::new("elevenlabs#concurrent").ttl(Duration::from_secs(30))).await?;
    /// std::mem::forget(lease);
    ///
    /// clock.advance(Duration::from_secs(31));
    /// let report = sluice.reconcile().await?;
    /// assert_eq!(report.leases_restored, 1);
    /// assert!(sluice.reconcile().await?.is_noop());
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub async fn reconcile(&self) -> Result<ReconcileReport, Error> {
        let started = std::time::Instant::now();
        let mut report = ReconcileReport::default();
        let expired = self
            .store()
            .list_leases(&LeaseFilter {
                dimension: None,
                expired_before: Some(self.now()),
            })
            .await?;
        report.leases_seen = expired.len();
        for lease in expired {
            self.restore_expired(lease, &mut report).await;
        }
        self.heal_concurrent(&mut report).await?;
        crate::metrics::reconciled(&report, started.elapsed());
        if report.is_noop() && report.errors.is_empty() {
            tracing::debug!(%report, "reconcile pass");
        } else {
            tracing::info!(%report, "reconcile pass");
        }
        Ok(report)
    }

    async fn restore_expired(&self, lease: LeaseRecord, report: &mut ReconcileReport) {
        let (key, cost, caller) = (lease.key.clone(), lease.cost, lease.caller.clone());
        match self.reclaim(vec![lease]).await {
            Ok(0) => report.leases_skipped += 1,
            Ok(_) => {
                tracing::debug!(lease = %key, %cost, %caller, "restored an expired lease");
                report.leases_restored += 1;
                report.tokens_restored += cost;
            }
            Err(error) => report.errors.push(ReconcileError {
                subject: key.to_string(),
                error,
            }),
        }
    }

    async fn heal_concurrent(&self, report: &mut ReconcileReport) -> Result<(), Error> {
        // Buckets first, leases second: a bucket's version is read before any lease it
        // could be missing, and the write below is conditioned on that version.
        let buckets: Vec<BucketState> = self
            .store()
            .list_buckets()
            .await?
            .into_iter()
            .filter(|b| b.bucket.limit_type() == LimitType::Concurrent)
            .collect();
        if buckets.is_empty() {
            return Ok(());
        }
        let scan = self.store().scan_leases(&LeaseFilter::default()).await?;
        let mut held: HashMap<Dimension, Tokens> = HashMap::new();
        for lease in scan.leases {
            *held.entry(lease.dimension).or_default() += lease.cost;
        }
        // Dimensions with a lease row of unknown content; `None`: a row whose key does not
        // even say which dimension (it could be any).
        let unknown: Vec<Option<Dimension>> = scan
            .unreadable
            .iter()
            .map(|key| LeaseKey::parse(key).and_then(|k| k.dimension()))
            .collect();
        for row in buckets {
            report.buckets_checked += 1;
            let leased = held.get(&row.dimension).copied().unwrap_or_default();
            let expected = row.bucket.capacity() - leased;
            if row.tokens == expected {
                continue;
            }
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
            let commit = Commit {
                buckets: vec![BucketWrite::new(row.clone(), expected, row.last_refill_at)],
                leases: Vec::new(),
            };
            match self.store().commit(commit).await {
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
        Ok(())
    }
}
