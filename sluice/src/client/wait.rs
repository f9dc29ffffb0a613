//! Waiting for capacity within a deadline: a caller that waits takes its turn in the
//! bucket's queue with one write, rather than coming back when everyone else does.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::RngExt as _;
use tokio::time::Instant;

use super::Sluice;

mod parked;
use crate::acquire::Acquire;
use crate::clock::UnixMillis;
use crate::error::{Error, RetryIn};
use crate::lease::Lease;
use crate::shared::lanes::Lane;
use crate::store::StoreError;
pub(crate) use parked::Parked;

/// The shortest wait of a waiting caller (a RetryIn is at least a millisecond); also
/// what a reservation's turn keeps clear of the deadline, for the rounding of clocks.
const MIN_NAP: Duration = Duration::from_millis(1);

/// The answer of a wait whose deadline passed with an acquire in flight: the last RetryIn
/// it heard, counted down (the bucket was short, and nothing since said otherwise), or
/// [`Error::Timeout`] when the store never answered.
fn out_of_time(last: Option<(RetryIn, Instant)>, max_wait: Duration) -> Error {
    match last {
        Some((refusal, at)) => Error::RetryIn(refusal.since(at.elapsed(), MIN_NAP)),
        None => Error::Timeout(max_wait),
    }
}

impl Sluice {
    /// Like [`acquire`](Self::acquire), but waits up to `max_wait` for capacity: a
    /// deadline, counted from the call, that the store's answers count against too. It
    /// returns a lease, or an error by then: the [`Error::RetryIn`] of a bucket that
    /// cannot serve the request within the time left (or, when the deadline passes while
    /// the store is asked again, the last one heard, counted down), or [`Error::Timeout`]
    /// when the store has not answered at all by the deadline. An acquire still in flight
    /// at the deadline (or when this future is dropped) finishes on its own: a grant it
    /// brings is kept for this client's next `acquire_within` of the same request for a
    /// second, then given back, never used by anyone else. A `max_wait` of zero is one
    /// [`acquire`](Self::acquire).
    ///
    /// Waiting is a queue, not a race, across every process sharing the bucket: on the
    /// fast path, a bucket that refills the request within the time left grants it at once
    /// as a reservation (its tokens taken in the same conditional write, the level going
    /// into a debt the refill repays, in the order the reservations landed), and this call
    /// returns when the refill has repaid it: one write per grant, in about the order the
    /// callers asked. A caller that gives up before its turn (this future dropped) gives
    /// the reservation back. Buckets that do not refill (`concurrent`) and the seed
    /// protocol's testing client (`Protocol::Seed`, feature `unstable-store`) are asked
    /// again after each exact RetryIn instead (a `concurrent` slot at most a jittered
    /// [`slot_poll`](crate::Config::slot_poll) later, as one may come back before then).
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Bucket, RefillRate, Sluice};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
    /// let sluice = Sluice::builder().store(sluice::MemoryStore::new()).clock(sluice::clock::TokioClock::starting_at(sluice::clock::UnixMillis::from_secs(1_700_000_000))).build()?;
    /// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_second(10)).with_capacity(1)).await?;
    /// sluice.acquire("openai#rpm").await?.release().await?;
    /// // The next token is 100 ms away: waiting up to a second gets it.
    /// let lease = sluice.acquire_within("openai#rpm", Duration::from_secs(1)).await?;
    /// # lease.release().await?;
    /// // The one after is 100 ms further: 50 ms is too short a wait.
    /// let refused = sluice.acquire_within("openai#rpm", Duration::from_millis(50)).await;
    /// assert!(matches!(refused, Err(sluice::Error::RetryIn(_))));
    /// # Ok::<(), sluice::Error>(()) }).unwrap();
    /// ```
    pub async fn acquire_within(
        &self,
        request: impl Into<Acquire>,
        max_wait: Duration,
    ) -> Result<Lease, Error> {
        let request = request.into();
        // `None`: a wait too long to count, as good as no deadline.
        let deadline = Instant::now().checked_add(max_wait);
        let left = || {
            deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            })
        };
        let mut fresh_after = None;
        // Counted among the callers waiting for a slot while it waits for one.
        let mut waiting = None;
        // The last RetryIn, and when it was answered: the answer at the deadline when the
        // store has not answered the acquire after it.
        let mut last: Option<(RetryIn, Instant)> = None;
        loop {
            // The turn must come by the deadline, clear of it by a millisecond.
            let queue = left().saturating_sub(MIN_NAP);
            let by = self.now().saturating_add(queue);
            // The request's key is made only when a grant is kept (rarely: a slow store).
            if !self.parked.is_empty()
                && let Some(lease) = self.parked.claim(&self.key_of(&request)?, by, self.now())
            {
                return Ok(lease.turn().await);
            }
            let answer = match deadline.filter(|_| !max_wait.is_zero()) {
                Some(deadline) => {
                    let attempt = self.attempt_kept(&request, fresh_after, queue);
                    tokio::time::timeout_at(deadline, attempt)
                        .await
                        .unwrap_or_else(|_| Err(out_of_time(last, max_wait)))
                }
                None => self.acquire_after(&request, fresh_after, queue).await,
            };
            match answer {
                Ok(lease)
                    if lease.ready_at()
                        <= self.now().saturating_add(left().saturating_sub(MIN_NAP)) =>
                {
                    return Ok(lease.turn().await);
                }
                Ok(lease) => return Err(self.park(&request, lease)),
                Err(Error::RetryIn(refusal)) => {
                    let delay = refusal.delay;
                    let (nap, slots) = self.nap(&request, delay)?;
                    if waiting.is_none() && !slots.is_empty() {
                        waiting = Some(WaitingForSlots::new(slots));
                    }
                    // Asked again at the deadline, the store's answer would come after it.
                    if nap >= left() {
                        return Err(Error::RetryIn(refusal));
                    }
                    last = Some((refusal, Instant::now()));
                    tracing::debug!(delay_ms = nap.as_millis() as u64, "waiting for capacity");
                    // What the store says after the wait, not what was remembered before it.
                    fresh_after = Some(self.now());
                    tokio::time::sleep(nap).await;
                }
                other => return other,
            }
        }
    }

    /// One acquire of a waiting caller, in a task of its own: should its caller stop
    /// waiting for the answer (its deadline passed, or it went away) and the answer be a
    /// grant, the grant is kept for the caller's next ask rather than given back at once:
    /// on a slow store, the next ask of a caller told to wait takes what its last one was
    /// granted, with no call. Resolves when the answer is in.
    fn attempt_kept(
        &self,
        request: &Acquire,
        fresh_after: Option<UnixMillis>,
        queue: Duration,
    ) -> impl std::future::Future<Output = Result<Lease, Error>> + use<> {
        use futures::FutureExt as _;
        let (sluice, asked) = (self.clone(), request.clone());
        let mut attempt =
            Box::pin(async move { sluice.acquire_after(&asked, fresh_after, queue).await });
        // Answered at once (from memory, or prefetched tokens): no task.
        if let Some(answer) = (&mut attempt).now_or_never() {
            return futures::future::Either::Left(std::future::ready(answer));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (sluice, request) = (self.clone(), request.clone());
        // Bounded by the acquire's own store calls; it owns the answer until the caller
        // takes it, or the kept grant until the caller's next ask or its grace.
        tokio::spawn(async move {
            let answer = attempt.await;
            if let Err(Ok(lease)) = tx.send(answer) {
                tracing::debug!(
                    "a grant answered after its caller stopped waiting, kept for its next ask"
                );
                drop(sluice.park(&request, lease));
            }
        });
        futures::future::Either::Right(async move {
            rx.await.unwrap_or_else(|_| {
                Err(StoreError::service("the acquire was abandoned before it answered").into())
            })
        })
    }

    /// What a kept grant for `request` serves.
    fn key_of(&self, request: &Acquire) -> Result<parked::Key, Error> {
        Ok(parked::key(&self.prioritized(request)?))
    }

    /// Keeps `lease`, never handed to its caller (a grant answered after its caller stopped
    /// waiting, or a reservation whose turn the time the answer took pushed past the
    /// deadline), for the caller's next ask; the RetryIn until its turn.
    fn park(&self, request: &Acquire, mut lease: Lease) -> Error {
        lease.unused();
        // Resolved once already, by the acquire that granted it.
        let (ready_at, now) = (lease.ready_at(), self.now());
        let wait = ready_at.saturating_since(now).max(MIN_NAP);
        // Every dimension of the request waits its turn.
        let refusal = lease
            .dimensions()
            .fold(RetryIn::pressed(wait, now), |r, d| {
                r.and(RetryIn::on(&d, wait, now))
            });
        // Resolved once already, by the acquire that granted it.
        let Ok(key) = self.key_of(request) else {
            return Error::RetryIn(refusal);
        };
        if self.parked.park(key, lease, (ready_at, now), wait) {
            tracing::debug!(
                turn_ms = wait.as_millis() as u64,
                "a grant its caller did not wait for, kept for its next ask"
            );
        }
        Error::RetryIn(refusal)
    }

    /// How long a caller refused for `delay` waits before asking again: the delay, but a
    /// slot may come back before its RetryIn (released elsewhere), so on a `concurrent`
    /// bucket at most a jittered poll interval.
    /// Also returns the lanes of the `concurrent` buckets it waits on.
    fn nap(&self, request: &Acquire, delay: Duration) -> Result<(Duration, Vec<Arc<Lane>>), Error> {
        let now = self.now();
        let base = self.core.config.slot_poll;
        let slots: Vec<Arc<Lane>> = request
            .resolve()?
            .iter()
            .filter_map(|w| self.core.lanes.slots_lane(&w.dimension))
            .collect();
        let poll = slots
            .iter()
            .map(|lane| {
                let memory = lane.memory();
                memory
                    .row()
                    .map_or(base, |row| row.waiting.spacing(now, base))
            })
            .max();
        let nap = match poll {
            Some(poll) => delay.min(poll_nap(poll)),
            None => delay.max(MIN_NAP),
        };
        Ok((nap, slots))
    }
}

/// A caller waiting for slots, counted on their lanes while it waits (see
/// [`Lane::waiting`]).
struct WaitingForSlots(Vec<Arc<Lane>>);

impl WaitingForSlots {
    fn new(lanes: Vec<Arc<Lane>>) -> Self {
        for lane in &lanes {
            lane.waiting.fetch_add(1, Ordering::Relaxed);
        }
        WaitingForSlots(lanes)
    }
}

impl Drop for WaitingForSlots {
    fn drop(&mut self) {
        for lane in &self.0 {
            lane.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A wait of half to all of `poll` (the slot poll interval, or longer when many callers
/// wait: see [`Waiting`](crate::store::Waiting)), drawn at random so that waiting processes
/// do not look at the store all at once.
fn poll_nap(poll: Duration) -> Duration {
    let half = poll / 2;
    let jitter = rand::rng().random_range(0..=(poll - half).as_micros() as u64);
    (half + Duration::from_micros(jitter)).max(MIN_NAP)
}

#[cfg(test)]
mod tests;
