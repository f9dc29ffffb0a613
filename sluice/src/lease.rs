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
use crate::keep::Keeper;
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
/// it. A lease holding `concurrent` slots is renewed while it is held (every third of its
/// TTL, one write per slot row, by a task the lease owns), so the TTL bounds how long a
/// slot stays taken after its holder dies or freezes, not how long it may be held; what
/// runs under it stops when [`lost`](Lease::lost) says the slot is no longer its own. A
/// lease kept alive holds its slots as long as its process lives, so one leaked (kept in
/// a value never dropped, or passed to `std::mem::forget`) is held until the process ends.
/// [`Sluice::slot`](crate::Sluice::slot) does all of this for you.
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
    /// The heartbeats of its slot rows, if it holds slots (see [`crate::keep`]).
    keeper: Option<Box<Keeper>>,
}

impl Lease {
    /// The lease of `grant`, from now on released when dropped.
    pub(crate) fn new(core: Arc<Core>, grant: Grant) -> Lease {
        let slot_rows = grant
            .parts
            .iter()
            .filter(|p| p.restores && p.kept == Kept::Row && p.recording.is_none())
            .map(|p| p.key.clone())
            .collect();
        let ttl = grant.expires_at.saturating_since(grant.created_at);
        Lease {
            waiting: grant.ready_at > grant.created_at,
            keeper: Keeper::start(&core, slot_rows, grant.expires_at, ttl).map(Box::new),
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

    /// When the lease expires unless released (or, for a lease holding slots, renewed: its
    /// holder renews it while it lives, see [`run`](Lease::run)).
    pub fn expires_at(&self) -> UnixMillis {
        self.keeper
            .as_ref()
            .map_or(self.grant.expires_at, |k| k.until())
    }

    /// Time left before the lease expires, by the client's clock: zero for a lease whose
    /// slot is no longer its holder's (see [`lost`](Lease::lost)).
    pub fn remaining(&self) -> Duration {
        if self.keeper.as_ref().is_some_and(|k| k.is_lost()) {
            return Duration::ZERO;
        }
        self.expires_at().saturating_since(self.core.now())
    }

    /// Resolves once the lease's slots are no longer its holder's, which is when what runs
    /// under them must stop: a renewal of its rows found one reclaimed, or its expiry
    /// passed by this client's clock without a renewal (the process was frozen, or the
    /// store failed every renewal for a whole TTL). While its holder lives and the store
    /// answers, a lease holding slots is renewed every third of its TTL (one write per
    /// slot row) and never lost. A lease holding no slot is never lost: this never
    /// resolves.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Bucket, Sluice};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
    /// let sluice = Sluice::in_memory();
    /// sluice.put_bucket("elevenlabs#concurrent", Bucket::concurrent(1)).await?;
    /// let lease = sluice.acquire("elevenlabs#concurrent").await?;
    /// // Held well past its TTL (60 s): renewed, never lost.
    /// tokio::select! {
    ///     () = lease.lost() => unreachable!("renewed while held"),
    ///     () = tokio::time::sleep(Duration::from_secs(600)) => {}
    /// }
    /// # lease.release().await?;
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let lost = self.keeper.as_ref().map(|k| k.lost());
        async move {
            match lost {
                Some(lost) => lost.await,
                None => std::future::pending().await,
            }
        }
    }

    /// The dimensions the lease holds tokens on, each once, as they were asked for: a grant
    /// on a bucket spread over several rows names the bucket (`openai#tpm`), whichever of
    /// its rows it came from.
    pub fn dimensions(&self) -> impl Iterator<Item = Dimension> {
        let mut seen: Vec<Dimension> = Vec::with_capacity(self.grant.parts.len());
        for part in &self.grant.parts {
            let base = part.dimension.base();
            if !seen.contains(&base) {
                seen.push(base);
            }
        }
        seen.into_iter()
    }

    /// The tokens held on `dimension`, if the lease covers it: on a spread bucket, what it
    /// holds on all of its rows.
    pub fn cost(&self, dimension: &str) -> Option<Tokens> {
        self.grant
            .parts
            .iter()
            .filter(|p| p.dimension.base().as_str() == dimension)
            .map(|p| p.cost)
            .reduce(|a, b| a.saturating_add(b))
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
    /// answered, once the lease has been held for a
    /// second (at most half its time to live), and a lease
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
        let (core, expires_at) = (self.core.clone(), self.expires_at());
        // No renewal once it is being ended.
        self.keeper = None;
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
    /// `timeout` is the body's deadline, the caller's own: a body still running then is
    /// dropped and the result is [`Error::Timeout`] with that deadline. Whatever the
    /// deadline, a body under a lease that holds slots is stopped as soon as they are no
    /// longer its holder's ([`lost`](Lease::lost): a renewal found its row reclaimed, or
    /// the process woke past its expiry), with [`Error::LeaseNotFound`]: while its holder
    /// lives, the lease is renewed and the body may run as long as it needs. A lease with
    /// no time left (its grant came back after it expired) does not start the body at
    /// all. The lease is released on every path: when the body finishes, when it is
    /// stopped, when it panics (the panic then continues), and when this future is
    /// dropped (released in the background).
    pub async fn run<F>(self, timeout: Duration, body: F) -> Result<F::Output, Error>
    where
        F: Future,
    {
        self.run_until(Some(timeout), body).await
    }

    /// [`run`](Self::run) with the caller's deadline, if any.
    pub(crate) async fn run_until<F>(
        self,
        deadline: Option<Duration>,
        body: F,
    ) -> Result<F::Output, Error>
    where
        F: Future,
    {
        if self.remaining().is_zero() || deadline.is_some_and(|d| d.is_zero()) {
            // The grant came back after its lease expired (a slow or resent write), or its
            // renewals failed for a whole TTL: the slot may be another caller's by now,
            // so the body does not start at all.
            if let Err(error) = self.release().await {
                tracing::warn!(%error, "release of a lease with no time left failed; retried in the background");
            }
            return Err(Error::Timeout(Duration::ZERO));
        }
        let expired = async {
            match deadline {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let lost = self.lost();
        let body = AssertUnwindSafe(body).catch_unwind();
        let outcome = tokio::select! {
            outcome = body => Ok(outcome),
            () = expired => Err(Error::Timeout(deadline.unwrap_or_default())),
            () = lost => Err(Error::LeaseNotFound(format!(
                "{}: its slot was reclaimed while the body ran (the process was frozen or the store failed its renewals for a whole TTL)",
                self.grant.id
            ))),
        };
        let release = self.release().await;
        let value = match outcome {
            Err(stopped) => {
                if let Err(error) = release {
                    tracing::warn!(%error, "release after a stopped body failed; retried in the background until the lease may be reclaimed");
                }
                return Err(stopped);
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
            if part.kept == Kept::Unrecorded {
                // Granted in shadow with no write: nothing was taken, nor is corrected.
                part.cost = cost;
                continue;
            }
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
        let expires_at = self.expires_at();
        self.keeper = None;
        release::in_background(&self.core, parts, expires_at, false);
    }
}
