//! A lane write on a key's row under a keyed bucket (see
//! [`Bucket::keyed`](crate::Bucket::keyed)): the first write of a key this client never
//! saw is computed from the template, and creates the row when there is none.

use crate::bucket::{BucketState, Herd, full_by_refill};
use crate::clock::UnixMillis;
use crate::error::Error;
use crate::store::BucketChange;

use super::plan::Reading;
use super::{AcquireJob, Next, Write};

impl Write<'_> {
    /// The row to write a key's first acquire from, for a key's row this client never saw
    /// or forgot (a row remembered but pushed back is read): the key's bucket full, as
    /// its template defines it (see [`BucketState::unwritten_key`]), and the write creates
    /// the row if there is none (no read before it, and no race between two first users:
    /// the second's condition fails on the row the first created, and hands it back).
    /// `None`: not a key's row, or no template to write from (removed, or not keyed: a key
    /// whose row exists keeps it, and is read as any other).
    pub(super) async fn unknown_key(&mut self) -> Result<Option<BucketState>, Next> {
        if self.dimension.key().is_none()
            || self.dimension.shard_index() != 0
            || self.lane.memory().row().is_some()
        {
            return Ok(None);
        }
        let now = self.core.now();
        match self.core.template(&self.dimension, now).await {
            Ok(Some(template)) => {
                self.creates = Some(now);
                self.fresh = false;
                Ok(Some(BucketState::unwritten_key(
                    self.dimension.clone(),
                    &template.bucket,
                    now,
                )))
            }
            Ok(None) => Ok(None),
            Err(e) if e.is_back_pressure() => Err(self.throttled(&e).await),
            Err(e) => {
                self.fail_store(&e);
                Err(Next::Done)
            }
        }
    }

    /// How an attempt from a key's unwritten row reads it: a plain fill (or take), no herd
    /// and nothing stamped ahead, which a missing row could not satisfy.
    pub(super) fn first_use(&self, reading: Reading) -> Reading {
        if self.creates.is_none() {
            return reading;
        }
        Reading {
            fill: true,
            short: false,
            others_per_ks: 0,
            behind: false,
            herd: Herd::Not,
            ..reading
        }
    }

    /// `change`, computed at `at` from `row`, as it is sent: for a key's row this client
    /// never saw, a write that creates the row if there is none, and whose fill accepts
    /// any row refill has made full (see [`full_by_refill`]).
    pub(super) fn creating(
        &self,
        mut change: BucketChange,
        row: &BucketState,
        at: UnixMillis,
    ) -> BucketChange {
        let Some(created_at) = self.creates else {
            return change;
        };
        if self.releases.is_empty() {
            full_by_refill(&mut change.commute, row, at);
        }
        change.creating(created_at)
    }

    /// Answers refusals computed from a key's template (a cost beyond what its bucket can
    /// ever hold, or beyond a priority's share of it): the key's row is read first, as an
    /// override (a bigger customer) may hold what the template cannot. With no row there,
    /// the template's answer is the store's; with one, the acquires are decided from it.
    pub(super) async fn refused_by_template(
        &mut self,
        template_row: &BucketState,
        refused: Vec<AcquireJob>,
        now: UnixMillis,
    ) -> Next {
        self.acquires = refused;
        match self.core.read_into(self.lane, &self.dimension).await {
            Ok(Some(_)) => {
                self.fresh = true;
                Next::Again
            }
            Ok(None) => {
                let refused = std::mem::take(&mut self.acquires);
                self.refuse_confirmed(template_row, refused, now).await
            }
            Err(e) if e.is_back_pressure() => self.throttled(&e).await,
            Err(e) => {
                self.fail_store(&e);
                Next::Done
            }
        }
    }

    /// Answers every acquire: the dimension is a keyed bucket's, whose row is a template,
    /// never taken from.
    pub(super) fn key_required(&mut self) -> Next {
        let dimension = self.dimension.clone();
        self.fail(|| Error::KeyRequired {
            dimension: dimension.clone(),
        });
        Next::Done
    }
}
