//! The operator's view of a dimension.

use std::time::Duration;

use crate::bucket::{BucketState, LimitType};
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::priority::{Priority, Reserve, above, floor};
use crate::rate::RefillRate;
use crate::store::LeaseRecord;
use crate::tokens::Tokens;

/// A dimension's state at one moment: enough to tell at a glance whether a product is
/// hitting the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// The dimension.
    pub dimension: Dimension,
    /// What the bucket counts.
    pub limit_type: LimitType,
    /// The most tokens the bucket holds.
    pub capacity: Tokens,
    /// Tokens available now, after refill (negative: in debt).
    pub available: Tokens,
    /// Tokens added per second.
    pub refill_rate: RefillRate,
    /// Tokens an acquire takes by default.
    pub cost_per_call: Tokens,
    /// Whether the bucket is in lean mode (grants write no lease row, so there are no
    /// leases to count and nothing for the reconciler to refund).
    pub lean: bool,
    /// Leases not yet expired.
    pub live_leases: usize,
    /// Tokens held by live leases.
    pub leased: Tokens,
    /// Leases past their expiry, waiting for the reconciler.
    pub expired_leases: usize,
    /// Time until the bucket is full; `None` for a `concurrent` bucket that is not full
    /// (only releases fill it).
    pub time_to_full: Option<Duration>,
    /// The reserves kept for higher priorities, highest first (see
    /// [`Bucket::with_reserve`](crate::Bucket::with_reserve)).
    pub reserves: Vec<Reserve>,
    /// The most the bucket holds as learned from the vendor's own reports (its burst, see
    /// [`BucketState::burst`]); `None`: its capacity.
    pub burst: Option<Tokens>,
    /// The bucket row's version.
    pub version: u64,
    /// How many rows the bucket is spread over (1: its own row alone; see
    /// [`Sluice::reshard`](crate::Sluice::reshard)); the snapshot is of them all.
    pub shards: u16,
    /// The bucket's [`Mode`](crate::Mode).
    pub mode: crate::Mode,
    /// How many acquires shadow mode granted that the bucket would have refused (see
    /// `ShadowLedger`).
    pub shadow_refused: u64,
    /// When the bucket's schedule changes its limits next, and to what (see
    /// [`Bucket::with_schedule`](crate::Bucket::with_schedule)); `None` without one.
    pub next_change: Option<(UnixMillis, crate::Limits)>,
    /// When the snapshot was taken.
    pub taken_at: UnixMillis,
}

impl Snapshot {
    pub(crate) fn of(row: &BucketState, leases: &[LeaseRecord], now: UnixMillis) -> Self {
        let live: Vec<&LeaseRecord> = leases.iter().filter(|l| l.expires_at > now).collect();
        Snapshot {
            dimension: row.dimension.clone(),
            limit_type: row.bucket.limit_type(),
            capacity: row.bucket.capacity(),
            burst: (row.holds() < row.bucket.capacity()).then(|| row.holds()),
            available: row.available(now),
            refill_rate: row.bucket.effective_rate(),
            cost_per_call: row.bucket.cost_per_call(),
            lean: !row.bucket.keeps_leases(),
            live_leases: live.len(),
            leased: live.iter().map(|l| l.cost).sum(),
            expired_leases: leases.len() - live.len(),
            time_to_full: row.time_to_full(now),
            reserves: row.bucket.reserves().to_vec(),
            version: row.version,
            shards: row.shards,
            mode: row.bucket.mode(),
            shadow_refused: row.shadow.refused,
            next_change: row
                .bucket
                .schedule()
                .and_then(|s| s.next_change(now))
                .map(|(at, limits)| (at, limits.clone())),
            taken_at: now,
        }
    }

    /// What one acquire at `priority` may take now: the available tokens less the reserves
    /// above it, never below zero.
    ///
    /// ```
    /// use sluice::{Bucket, RefillRate, Sluice};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let sluice = Sluice::in_memory();
    /// let tpm = Bucket::tokens(RefillRate::per_minute(1_000)).with_reserve("interactive".parse()?, 200);
    /// sluice.put_bucket("openai#tpm", tpm).await?;
    /// let snapshot = sluice.snapshot("openai#tpm").await?;
    /// assert_eq!(snapshot.available_to(Some(&"batch".parse()?)), sluice::Tokens::new(800));
    /// assert_eq!(snapshot.available_to(Some(&"interactive".parse()?)), sluice::Tokens::new(1_000));
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn available_to(&self, priority: Option<&Priority>) -> Tokens {
        above(self.available, floor(&self.reserves, priority))
    }

    /// What one acquire at a priority the bucket does not list may take now: the available
    /// tokens less every reserve, never below zero.
    ///
    /// ```
    /// use sluice::{Bucket, Sluice};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let sluice = Sluice::in_memory();
    /// let slots = Bucket::concurrent(10)
    ///     .with_reserve("live".parse()?, 3)
    ///     .with_reserve("standard".parse()?, 2);
    /// sluice.put_bucket("voice#concurrent", slots).await?;
    /// let snapshot = sluice.snapshot("voice#concurrent").await?;
    /// assert_eq!(snapshot.available_to_unlisted(), sluice::Tokens::new(5));
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn available_to_unlisted(&self) -> Tokens {
        let reserved = self.reserves.iter().map(|r| r.tokens).sum();
        above(self.available, reserved)
    }
}
