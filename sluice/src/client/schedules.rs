//! Applying bucket schedules: each change once, however many reconcilers run.

use crate::bucket::BucketState;
use crate::error::Error;
use crate::protocol::reconcile::{ReconcileError, ReconcileReport};

use super::Sluice;
use super::admin::{as_one, redefined};

impl Sluice {
    /// Applies every bucket's scheduled limits that fell due, into `report`, from `rows`
    /// (every bucket row, as the pass listed them: a change is conditioned on the row as
    /// read, and made again from a fresh read if it changed since).
    pub(super) async fn apply_schedules(
        &self,
        report: &mut ReconcileReport,
        rows: Vec<BucketState>,
    ) {
        for row in self
            .wholes_of(rows)
            .into_iter()
            .filter(|b| b.bucket.schedule().is_some())
        {
            let subject = row.dimension.to_string();
            match self.apply_schedule(row).await {
                Ok(true) => report.schedules_applied += 1,
                Ok(false) => {}
                Err(error) => report.errors.push(ReconcileError { subject, error }),
            }
        }
    }

    /// Gives `row`'s bucket the limits its schedule has now, unless it has them: one
    /// write conditioned on the row as read. Lost to another writer, it backs off, reads
    /// the row again and looks again, so a change another reconciler made is not made
    /// twice, and one an operator made meanwhile is not undone. `true`: this call made it.
    ///
    /// A spread bucket is redefined as a whole, over all its rows, after reading them again
    /// (a definition changed since the pass read it is looked at afresh); two reconcilers
    /// at the same instant may then both write the change (the same limits twice).
    async fn apply_schedule(&self, mut row: BucketState) -> Result<bool, Error> {
        let mut backoff = crate::retry::Backoff::new();
        for lost in 0..=self.core.config.max_retries {
            if lost > 0 {
                backoff.sleep(lost).await;
            }
            let now = self.now();
            let due = row.bucket.at(now);
            if due == row.bucket {
                return Ok(false);
            }
            if row.shards > 1 {
                let rows = crate::protocol::reshard::rows_of(&self.core, &row.dimension).await?;
                let fresh = as_one(rows, now);
                if fresh.bucket != row.bucket {
                    row = fresh;
                    continue;
                }
                self.define(row.dimension.as_str(), due).await?;
                tracing::info!(dimension = %row.dimension, "applied the bucket's scheduled limits");
                return Ok(true);
            }
            let state = redefined(Some(&row), &row.dimension, &due, now);
            if self.core.store.put_bucket(&state, Some(&row)).await? {
                self.core.lanes.learn_written(state, now);
                tracing::info!(
                    dimension = %row.dimension,
                    capacity = %due.capacity(),
                    refill = %due.refill_rate(),
                    "applied the bucket's scheduled limits"
                );
                return Ok(true);
            }
            match self.core.read_one(&row.dimension).await? {
                Some(current) => row = current,
                None => return Ok(false),
            }
        }
        Err(Error::Contention {
            dimension: row.dimension,
            attempts: self.core.config.max_retries + 1,
        })
    }
}
