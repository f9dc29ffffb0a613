//! Making a shared bucket stricter from what the vendor itself reports.

use std::time::Duration;

use crate::bucket::LimitType;
use crate::client::{Sluice, backoff_delay, new_unique};
use crate::dimension::Dimension;
use crate::error::Error;
use crate::store::{
    BucketWrite, Commit, CommitError, ConditionFailure, LeaseKey, LeaseRecord, LeaseWrite,
};
use crate::tokens::Tokens;

/// What the vendor reported about a limit, as a way to make its bucket stricter.
///
/// Tightening never makes a bucket looser: a report that allows more than the bucket holds
/// changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Tighten {
    /// At most this many tokens are left now (e.g. `x-ratelimit-remaining-requests`). Only
    /// refilling (`requests`/`tokens`) buckets take this; a `concurrent` bucket ignores it.
    AtMost(Tokens),
    /// Grant nothing for this long (e.g. a 429 with `retry-after`). A refilling bucket is
    /// emptied so that `cost_per_call` is available exactly when the pause ends; a
    /// `concurrent` bucket gets a cool-down lease holding all its slots until then, which
    /// the usual expiry handling gives back.
    PauseFor(Duration),
}

/// The caller recorded on cool-down leases.
pub const COOLDOWN_CALLER: &str = "sluice-cooldown";

impl Sluice {
    /// Makes the bucket of `dimension` stricter, for every process sharing it, with one
    /// conditional write. Returns whether the bucket changed (`false`: it was already at
    /// least this strict, or the report does not apply to its limit type). Tokens this
    /// client [prefetched](crate::Prefetch) for the dimension are dropped either way.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Bucket, ManualClock, RefillRate, Sluice, Tighten, UnixMillis};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    /// let sluice = Sluice::builder().clock(clock).build()?;
    /// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_second(10))).await?;
    ///
    /// // The vendor answered 429 with `retry-after: 7`: every client now waits 7 s.
    /// assert!(sluice.tighten("openai#rpm", Tighten::PauseFor(Duration::from_secs(7))).await?);
    /// assert_eq!(
    ///     sluice.acquire("openai#rpm").await.unwrap_err().retry_in(),
    ///     Some(Duration::from_secs(7))
    /// );
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub async fn tighten(&self, dimension: &str, how: Tighten) -> Result<bool, Error> {
        let dimension = Dimension::new(dimension)?;
        // The vendor said stop: tokens this client took ahead are not granted any more.
        self.lanes().lane(&dimension).memory().set_prefetched(None);
        let max_retries = self.config().max_retries;
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let row = self
                .store()
                .read_buckets(std::slice::from_ref(&dimension))
                .await?
                .remove(0)
                .ok_or_else(|| Error::UnknownDimension(dimension.clone()))?;
            let now = self.now();
            let concurrent = row.bucket.limit_type() == LimitType::Concurrent;
            let lowered = match (how, concurrent) {
                (Tighten::AtMost(limit), false) => {
                    row.lowered_to(limit.clamp(Tokens::ZERO, Tokens::MAX), now)
                }
                (Tighten::PauseFor(pause), false) => row.emptied_for(pause, now),
                _ => None,
            };
            let commit = match (how, concurrent, lowered) {
                (_, false, Some((tokens, last_refill_at))) => Commit {
                    buckets: vec![BucketWrite::new(row.clone(), tokens, last_refill_at)],
                    leases: Vec::new(),
                },
                (Tighten::AtMost(_), _, _) | (Tighten::PauseFor(_), false, None) => {
                    return Ok(false);
                }
                (Tighten::PauseFor(pause), true, _) => {
                    if pause.is_zero() {
                        return Ok(false);
                    }
                    // Hold every slot until the pause ends. Slots in use now come back to
                    // a bucket that stays short; at expiry, the cool-down lease is given
                    // back like any expired lease, exactly once.
                    let capacity = row.bucket.capacity();
                    Commit {
                        buckets: vec![BucketWrite::new(
                            row.clone(),
                            row.tokens.saturating_sub(capacity),
                            row.last_refill_at.max(now),
                        )],
                        leases: vec![LeaseWrite::Create(LeaseRecord {
                            slot: true,
                            key: LeaseKey::new(&dimension, &format!("cooldown-{}", new_unique())),
                            dimension: dimension.clone(),
                            cost: capacity,
                            created_at: now,
                            expires_at: now.saturating_add(pause),
                            caller: COOLDOWN_CALLER.to_owned(),
                            in_bucket: false,
                        })],
                    }
                }
            };
            let written = commit.buckets.first().map(BucketWrite::after);
            match self.store().commit(commit).await {
                Ok(()) => {
                    if let Some(row) = written {
                        self.lanes().learn_written(row, now);
                    }
                    tracing::info!(%dimension, ?how, "bucket tightened from the vendor's report");
                    return Ok(true);
                }
                Err(CommitError::Condition(ConditionFailure::LeaseMissing(key))) => {
                    return Err(crate::store::StoreError::missing_lease(&key).into());
                }
                // A lost race or a (vanishingly unlikely) key collision: look again.
                Err(CommitError::Condition(_)) | Err(CommitError::TransactionConflict) => {
                    if attempt > max_retries {
                        return Err(Error::Contention {
                            dimension,
                            attempts: attempt,
                        });
                    }
                }
                Err(CommitError::Store(e)) => return Err(e.into()),
            }
            tokio::time::sleep(backoff_delay(attempt)).await;
        }
    }
}
