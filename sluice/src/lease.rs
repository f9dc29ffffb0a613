//! Leases: the tokens an acquire holds until it is released or expires.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;

use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::grant::{Grant, Kept, LeaseId, LeasePart};
use crate::protocol::{adjust, release};
use crate::shared::Core;
use crate::tokens::Tokens;

/// Tokens held on one or several dimensions, granted by [`Sluice::acquire`](crate::Sluice::acquire).
///
/// Release it when the vendor call is done ([`release`](Lease::release)); for `requests`
/// and `tokens` buckets the tokens stay consumed, for `concurrent` buckets they come
/// back. A lease dropped without release is released in the background when a tokio
/// runtime is available; otherwise it expires at [`expires_at`](Lease::expires_at) and,
/// after the [clock-skew margin](crate::Config::clock_skew) (plus
/// [`RELEASE_GRACE`](crate::RELEASE_GRACE) for `requests`/`tokens`), the reconciler ends
/// it. A `concurrent` lease held past its expiry outside [`run`](Lease::run) may be given
/// to another caller once that margin has passed. [`Sluice::slot`](crate::Sluice::slot) does all of this for you.
#[must_use = "a lease holds quota until it is released or expires"]
pub struct Lease {
    /// The state it is released through: the client's, not the client.
    core: Arc<Core>,
    grant: Grant,
    /// Adjustments whose write lost its answer: the next adjustment of the same dimension
    /// learns first what became of them, so a caller's retry never applies one twice.
    unsettled: Vec<adjust::Unsettled>,
    /// Whether it is a reservation whose turn has not come (see [`Lease::turn`]): dropped
    /// so, it was never used and all of it is given back.
    waiting: bool,
}

impl Lease {
    /// The lease of `grant`, from now on released when dropped.
    pub(crate) fn new(core: Arc<Core>, grant: Grant) -> Lease {
        Lease {
            waiting: grant.ready_at > grant.created_at,
            core,
            grant,
            unsettled: Vec::new(),
        }
    }

    /// Waits until the lease may be used: at once, or for a reservation (a caller that
    /// waits its turn) until the refill has repaid it. Dropped before then, the lease
    /// gives all it took back.
    pub(crate) async fn turn(mut self) -> Lease {
        let wait = self.grant.ready_at.saturating_since(self.core.now());
        if !wait.is_zero() {
            tracing::debug!(
                wait_ms = wait.as_millis() as u64,
                "waiting for this caller's turn"
            );
            tokio::time::sleep(wait).await;
        }
        self.waiting = false;
        self
    }

    /// Marks the lease as never used: dropped before its [`turn`](Self::turn), all of it
    /// is given back.
    pub(crate) fn unused(&mut self) {
        self.waiting = true;
    }

    /// When the lease may be used (see [`turn`](Self::turn)).
    pub(crate) fn ready_at(&self) -> UnixMillis {
        self.grant.ready_at
    }

    /// The lease's id.
    pub fn id(&self) -> &LeaseId {
        &self.grant.id
    }

    /// When the lease was granted.
    pub fn created_at(&self) -> UnixMillis {
        self.grant.created_at
    }

    /// When the lease expires unless released.
    pub fn expires_at(&self) -> UnixMillis {
        self.grant.expires_at
    }

    /// Time left before the lease expires, by the client's clock.
    pub fn remaining(&self) -> Duration {
        self.grant.expires_at.saturating_since(self.core.now())
    }

    /// The dimensions the lease holds tokens on.
    pub fn dimensions(&self) -> impl Iterator<Item = &Dimension> {
        self.grant.parts.iter().map(|p| &p.dimension)
    }

    /// The tokens held on `dimension`, if the lease covers it.
    pub fn cost(&self, dimension: &str) -> Option<Tokens> {
        self.grant
            .parts
            .iter()
            .find(|p| p.dimension.as_str() == dimension)
            .map(|p| p.cost)
    }

    /// Whether the lease holds slots of a `concurrent` bucket, which come back only when it
    /// ends: hold it as long as the vendor counts the call (a streamed response, until its
    /// body ends).
    ///
    /// ```
    /// use sluice::{Acquire, Bucket, RefillRate, Sluice};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let sluice = Sluice::in_memory();
    /// sluice.put_bucket("elevenlabs#concurrent", Bucket::concurrent(2)).await?;
    /// sluice.put_bucket("elevenlabs#rpm", Bucket::requests(RefillRate::per_minute(60))).await?;
    /// let lease = sluice.acquire("elevenlabs#rpm").await?;
    /// assert!(!lease.holds_slots());
    /// let lease = sluice.acquire(Acquire::new("elevenlabs#rpm").and("elevenlabs#concurrent")).await?;
    /// assert!(lease.holds_slots());
    /// # lease.release().await?;
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub fn holds_slots(&self) -> bool {
        self.grant.parts.iter().any(|p| p.restores)
    }

    /// Writes the lease's rows now if they are still waiting to be, and waits until they
    /// are in the store. The row of a `requests` or `tokens` lease is only the reconciler's
    /// record, should the holder die before releasing: it is written after the grant is
    /// answered, once the lease has been held for
    /// [`Config::lease_record_after`](crate::Config::lease_record_after), and a lease
    /// released sooner never has one (its grant costs one write in all). So
    /// [`Sluice::leases`](crate::Sluice::leases) and another process's
    /// [`Sluice::release_id`](crate::Sluice::release_id) may not see it yet when `acquire`
    /// returns; a slot's row is always written first. Releasing and adjusting need none of
    /// this.
    ///
    /// ```
    /// use sluice::{Bucket, RefillRate, Sluice};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let sluice = Sluice::in_memory();
    /// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(500))).await?;
    /// let lease = sluice.acquire("openai#rpm").await?;
    /// lease.recorded().await;
    /// assert_eq!(sluice.leases(&Default::default()).await?.len(), 1);
    /// lease.release().await?;
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub async fn recorded(&self) {
        for part in &self.grant.parts {
            part.recorded().await;
        }
    }

    /// How many commits the acquire attempted (1 when there was no contention; 0 for a
    /// grant from tokens this client prefetched, see [`Prefetch`](crate::Prefetch)).
    pub fn attempts(&self) -> u32 {
        self.grant.attempts
    }

    /// Ends the lease: deletes its rows and, for `concurrent` buckets, gives the tokens back.
    ///
    /// Releasing a lease that has already expired and been reconciled changes nothing.
    ///
    /// A release whose caller stops waiting (a timeout around it, a cancelled request)
    /// still happens: it finishes on its own. One that fails because the store is down,
    /// slow or throttling returns that error and goes on in the background, with backoff,
    /// until it succeeds or anyone may end the lease
    /// ([`Config::reclaimable_at`](crate::Config::reclaimable_at)): a release is idempotent,
    /// so a retry never gives a slot back twice, and a `requests`/`tokens` lease released
    /// within that time is never refunded.
    pub async fn release(mut self) -> Result<(), Error> {
        let parts = self.take_rows();
        if parts.is_empty() {
            return Ok(());
        }
        let (sent, outcome) = tokio::sync::oneshot::channel();
        let (core, expires_at) = (self.core.clone(), self.grant.expires_at);
        crate::detach::Detached::new(async move {
            release::release_until_done(&core, parts, expires_at, |result| {
                if let Err(Err(error)) = sent.send(result) {
                    tracing::warn!(%error, "a release nobody waited for failed; retrying until the lease may be reclaimed");
                }
            })
            .await;
        })
        .await;
        outcome.await.unwrap_or_else(|_| {
            Err(crate::store::StoreError::service("the release was abandoned").into())
        })
    }

    /// Runs `body` under this lease, then releases it: the lease's slot.
    ///
    /// The body's deadline is `timeout` or the lease's expiry by this client's clock,
    /// whichever comes first (give the lease the same TTL when acquiring): a body still
    /// running then is dropped and the result is [`Error::Timeout`] with the deadline it
    /// had. The expiry was set before the grant's write, so the body never outlives its
    /// lease by that write's round trip; other clients give an expired lease back only
    /// [`Config::clock_skew`](crate::Config::clock_skew) after it, so while clocks agree
    /// that closely a slot in use is never handed on. A lease with no time left (its grant
    /// came back after it expired) does not start the body at all. The lease is
    /// released on every path: when the body finishes, when it times out, when it panics
    /// (the panic then continues), and when this future is dropped (released in the
    /// background).
    pub async fn run<F>(self, timeout: Duration, body: F) -> Result<F::Output, Error>
    where
        F: Future,
    {
        let timeout = timeout.min(self.remaining());
        if timeout.is_zero() {
            // The grant came back after its lease expired (a slow or resent write): the
            // slot may be another caller's by now, so the body does not start at all.
            if let Err(error) = self.release().await {
                tracing::warn!(%error, "release of a lease granted too late failed; retried in the background");
            }
            return Err(Error::Timeout(timeout));
        }
        let outcome = tokio::time::timeout(timeout, AssertUnwindSafe(body).catch_unwind()).await;
        let release = self.release().await;
        let value = match outcome {
            Err(_elapsed) => {
                if let Err(error) = release {
                    tracing::warn!(%error, "release after timeout failed; retried in the background until the lease may be reclaimed");
                }
                return Err(Error::Timeout(timeout));
            }
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Ok(Ok(value)) => value,
        };
        if let Err(error) = release {
            // The body's work is done and must not be lost; the release goes on.
            tracing::warn!(%error, "release after the slot's body failed; retried in the background until the lease may be reclaimed");
        }
        Ok(value)
    }

    /// Corrects the cost held on `dimension` to `actual` (e.g. 500 tokens estimated, 2,000
    /// used). The difference is charged to the bucket now, which may go negative (debt,
    /// repaid by refill); a lower cost refunds the difference, capped at capacity.
    pub async fn adjust(
        &mut self,
        dimension: &str,
        actual: impl Into<Tokens>,
    ) -> Result<(), Error> {
        let actual = actual.into();
        // A grant on a sharded bucket holds a part per shard it took from: the correction
        // is spread over them (a charge to the first, a refund from the last first).
        let mine: Vec<usize> = (0..self.grant.parts.len())
            .filter(|i| self.grant.parts[*i].dimension.base().as_str() == dimension)
            .collect();
        let Some(first) = mine.first().copied() else {
            return Err(Error::LeaseNotFound(format!(
                "{} (no part on `{dimension}`)",
                self.grant.id
            )));
        };
        if actual.is_negative() || actual > Tokens::MAX {
            return Err(Error::InvalidCost {
                dimension: self.grant.parts[first].dimension.base(),
                cost: actual,
            });
        }
        let held: Vec<Tokens> = mine.iter().map(|i| self.grant.parts[*i].cost).collect();
        let total = held.iter().fold(Tokens::ZERO, |s, c| s.saturating_add(*c));
        let mut left = actual;
        let mut costs = vec![Tokens::ZERO; held.len()];
        for (j, cost) in held.iter().enumerate() {
            costs[j] = (*cost).min(left);
            left = left.saturating_sub(costs[j]);
        }
        if actual > total {
            costs[0] = held[0].saturating_add(actual.saturating_sub(total));
        }
        for (i, cost) in mine.into_iter().zip(costs) {
            let part = &mut self.grant.parts[i];
            if part.kept == Kept::Local {
                // Granted locally while the store could not answer: so is its correction.
                let now = self.core.now();
                self.core
                    .fallback
                    .charge(&part.dimension, cost - part.cost, now);
                part.cost = cost;
                continue;
            }
            adjust::adjust_part(&self.core, part, cost, &mut self.unsettled).await?;
        }
        Ok(())
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.grant.id.to_string())
            .field("expires_at", &self.grant.expires_at)
            .field("released", &self.grant.parts.is_empty())
            .finish()
    }
}

impl Lease {
    /// Takes the parts that have leases to end; lean parts need nothing.
    pub(crate) fn take_rows(&mut self) -> Vec<LeasePart> {
        let mut parts = std::mem::take(&mut self.grant.parts);
        parts.retain(LeasePart::is_kept);
        parts
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.waiting && !self.grant.parts.is_empty() {
            // Dropped while waiting its turn: never used, so all of it is given back.
            tracing::debug!(lease = %self.grant.id, "a reservation dropped before its turn; giving it back");
            let parts = std::mem::take(&mut self.grant.parts);
            crate::protocol::ending::give_back_in_background(&self.core, parts);
            return;
        }
        let parts = self.take_rows();
        if parts.is_empty() {
            return;
        }
        tracing::debug!(lease = %self.grant.id, "lease dropped without release; releasing in the background");
        release::in_background(&self.core, parts, self.grant.expires_at, false);
    }
}
