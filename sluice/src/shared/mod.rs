//! The one state every protocol works on: the store, the clock, the configuration and
//! what this client remembers of each bucket row (its lanes). Protocols borrow it; a
//! [`Lease`](crate::Lease) holds it, not the client façade.

pub(crate) mod background;
pub(crate) mod fallback;
pub(crate) mod heat;
mod keys;
pub(crate) mod lanes;
pub(crate) mod recent;
pub(crate) mod remembered;
pub(crate) mod rows;
#[cfg(test)]
pub(crate) mod test_store;

use std::fmt;
use std::sync::Arc;

use crate::bucket::{BucketState, WriteOutcome};
use crate::clock::{Clock, UnixMillis};
use crate::config::Config;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::store::{
    BucketChange, BucketWrite, ChangeError, Commit, CommitError, ConditionFailure, Store,
    StoreError, WriteProbe,
};

use self::lanes::{Lane, Lanes};

/// The state shared by a client, its clones and its leases.
pub(crate) struct Core {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: Config,
    /// What this client knows of each dimension's row, and the fast path's queues.
    pub(crate) lanes: Lanes,
    /// The `open` failure policy's local buckets.
    pub(crate) fallback: fallback::Fallback,
    /// The lease rows grants are writing and releases deleting, batched.
    pub(crate) rows: rows::LeaseRows,
    /// How hot this client sees each bucket row (when to reshard).
    pub(crate) heat: heat::Heat,
    /// Work nobody waits for: releases queued, lease rows still to write.
    pub(crate) background: background::Background,
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sluice")
            .field("store", &self.store)
            .field("clock", &self.clock)
            .field("config", &self.config)
            .finish()
    }
}

impl Core {
    pub(crate) fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, config: Config) -> Core {
        Core {
            store,
            clock,
            config,
            lanes: Lanes::default(),
            fallback: fallback::Fallback::default(),
            rows: rows::LeaseRows::default(),
            heat: heat::Heat::default(),
            background: background::Background::default(),
        }
    }

    /// The current time by the client's clock.
    pub(crate) fn now(&self) -> UnixMillis {
        self.clock.now()
    }

    /// The current time to the microsecond by the client's clock (see
    /// [`Clock::now_micros`](crate::Clock::now_micros)).
    pub(crate) fn now_micros(&self) -> i64 {
        self.clock.now_micros()
    }

    /// Where a give-back to the shard row `dimension` goes once a reshard gathered its
    /// bucket into fewer rows: the row its index falls on now (`None`: not a shard row,
    /// no bucket, or the bucket still has that row). Reads the bucket's own row.
    pub(crate) async fn moved_shard(
        &self,
        dimension: &Dimension,
    ) -> Result<Option<Dimension>, StoreError> {
        let k = dimension.shard_index();
        if k == 0 {
            return Ok(None);
        }
        let base = dimension.base();
        let Some(row) = self.read_one(&base).await? else {
            return Ok(None);
        };
        self.lanes.note_shards(&base, row.shards);
        Ok((k >= row.shards).then(|| base.shard(k % row.shards.max(1))))
    }

    /// The lane of `dimension`.
    pub(crate) fn lane(&self, dimension: &Dimension) -> Arc<Lane> {
        self.lanes.lane(dimension)
    }

    /// Applies `commit`. When its answer was lost (a timeout, a lost connection, a server
    /// error), reads its first bucket row, within what is left of the store timeout, to
    /// learn whether it applied all the same (a commit is all or nothing, so its bucket
    /// write tells for the whole; see [`WriteProbe`](crate::store::WriteProbe)):
    ///
    /// - it applied: `Ok`;
    /// - it did not: the row as it stands, as a failed condition (the caller computes its
    ///   write again from it, as after a lost race);
    /// - the row no longer tells: [`StoreError::OutcomeUnknown`];
    /// - the row could not be read in time: the store's error.
    ///
    /// Either of the last two may have applied: a caller never takes it as granted, nor
    /// gives back what it took, unless doing so twice is harmless.
    pub(crate) async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        let probe = self
            .store
            .loses_answers()
            .then(|| commit.buckets.first().map(BucketWrite::probe))
            .flatten();
        let started = tokio::time::Instant::now();
        let e = match self.store.commit(commit).await {
            Err(CommitError::Store(e)) if e.answer_lost() => e,
            other => return other,
        };
        let Some(probe) = probe else {
            return Err(e.into());
        };
        let left = self.config.store_timeout.saturating_sub(started.elapsed());
        let read = tokio::time::timeout(left, self.row_after(&probe)).await;
        let (outcome, result) = match read {
            Ok(Ok(Some((outcome, row)))) => match outcome {
                WriteOutcome::Applied => (WriteOutcome::Applied, Ok(())),
                WriteOutcome::NotApplied => (
                    WriteOutcome::NotApplied,
                    Err(CommitError::Condition(ConditionFailure::BucketChanged {
                        dimension: probe.dimension.clone(),
                        current: Some(Box::new(row)),
                    })),
                ),
                WriteOutcome::Unknown => (
                    WriteOutcome::Unknown,
                    Err(StoreError::OutcomeUnknown {
                        dimension: probe.dimension.to_string(),
                    }
                    .into()),
                ),
            },
            Ok(Ok(None)) => (
                WriteOutcome::NotApplied,
                Err(CommitError::Condition(ConditionFailure::BucketChanged {
                    dimension: probe.dimension.clone(),
                    current: None,
                })),
            ),
            Ok(Err(_)) | Err(_) => (WriteOutcome::Unknown, Err(e.clone_lossy().into())),
        };
        tracing::debug!(dimension = %probe.dimension, ?outcome, error = %e, "a write lost its answer");
        crate::metrics::lost_answer(&self.lanes.labels, probe.dimension.as_str(), outcome);
        result
    }

    /// Applies `change`. Its answer is never guessed: a change adds to the row, so one whose
    /// answer was lost (an error that [`StoreError::unsure`]) may have applied, once, and
    /// is never sent again.
    pub(crate) async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        let dimension = change.dimension.clone();
        let result = self.store.change(change).await;
        match &result {
            Err(ChangeError::Condition(_)) => {
                crate::metrics::bucket_failed_write(&self.lanes.labels, dimension.as_str())
            }
            Err(ChangeError::Store(e)) if e.is_back_pressure() => {
                crate::metrics::bucket_throttled(&self.lanes.labels, dimension.as_str(), e);
                // Nothing applied, but the row moves on meanwhile (rule 7 of `remembered`).
                let lane = self.lane(&dimension);
                lane.memory().pushed_back();
                lane.pushed_at
                    .store(self.now().as_millis(), std::sync::atomic::Ordering::Relaxed);
            }
            Err(ChangeError::Store(e)) if e.answer_lost() => {
                tracing::debug!(%dimension, error = %e, "a change lost its answer");
                crate::metrics::lost_answer(
                    &self.lanes.labels,
                    dimension.as_str(),
                    WriteOutcome::Unknown,
                );
            }
            _ => {}
        }
        result
    }

    /// Reads the row a write described by `probe` went to, and what it tells of that
    /// write; `None` when the bucket is gone.
    pub(crate) async fn row_after(
        &self,
        probe: &WriteProbe,
    ) -> Result<Option<(WriteOutcome, BucketState)>, StoreError> {
        Ok(self
            .read_one(&probe.dimension)
            .await?
            .map(|row| (probe.outcome(&row), row)))
    }

    /// Reads the bucket row of `dimension`, if any.
    pub(crate) async fn read_one(
        &self,
        dimension: &Dimension,
    ) -> Result<Option<BucketState>, StoreError> {
        Ok(self
            .store
            .read_buckets(std::slice::from_ref(dimension))
            .await?
            .remove(0))
    }

    /// Reads the bucket row of `dimension` and takes it as what its lane remembers (as of
    /// when the read was sent: nothing later is known of the row); a missing bucket is
    /// forgotten.
    pub(crate) async fn read_into(
        &self,
        lane: &Lane,
        dimension: &Dimension,
    ) -> Result<Option<BucketState>, StoreError> {
        let sent = self.now();
        let row = self.read_one(dimension).await?;
        let mut memory = lane.memory();
        match &row {
            Some(row) => memory.learn(row.clone(), sent),
            None => memory.forget(),
        }
        Ok(row)
    }

    /// Reads the buckets of `dimensions`, all of which must exist, and remembers them (as
    /// of when the read was sent). A bucket found missing is forgotten.
    pub(crate) async fn read_rows(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<BucketState>, Error> {
        let sent = self.now();
        let rows = self.store.read_buckets(dimensions).await?;
        let mut found = Vec::with_capacity(rows.len());
        for (row, d) in rows.into_iter().zip(dimensions) {
            let Some(row) = row else {
                self.lanes.forget(d);
                return Err(self.unknown(d));
            };
            self.lanes.learn(row.clone(), sent);
            found.push(row);
        }
        Ok(found)
    }

    /// The error for a dimension without a bucket in this client's store.
    pub(crate) fn unknown(&self, dimension: &Dimension) -> Error {
        Error::UnknownDimension {
            dimension: dimension.clone(),
            store: self.store.describe(),
        }
    }

    /// Reads the buckets of `dimensions`, all of which must exist.
    pub(crate) async fn read_existing(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<BucketState>, Error> {
        let rows = self.store.read_buckets(dimensions).await?;
        rows.into_iter()
            .zip(dimensions)
            .map(|(row, d)| row.ok_or_else(|| self.unknown(d)))
            .collect()
    }

    /// The row of `dimension` to compute a write from: as this client remembers it, or
    /// read when it remembers none (or a write of it was pushed back since, rule 7 of
    /// `remembered`).
    pub(crate) async fn remembered_row(&self, dimension: &Dimension) -> Result<BucketState, Error> {
        let remembered = self.lane(dimension).memory().row_to_write().cloned();
        match remembered {
            Some(row) => Ok(row),
            None => Ok(self
                .read_rows(std::slice::from_ref(dimension))
                .await?
                .remove(0)),
        }
    }
}
