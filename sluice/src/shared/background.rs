//! A client's background work, bounded and drainable: releases nobody waits for (a lease
//! dropped, a release that failed) go through one queue, worked by one task at a time per
//! client with at most [`MAX_IN_FLIGHT`] store calls at once; while the store fails, the
//! queue backs off together (capped exponential backoff, one probe at a time), never a
//! task per release hammering a recovering table. [`Sluice::flush`](crate::Sluice::flush)
//! writes pending lease rows now and waits for the queue to empty, within a deadline.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::clock::UnixMillis;
use crate::error::Error;
use crate::grant::LeasePart;

/// The most store calls a client's background queue has in flight at once.
pub(crate) const MAX_IN_FLIGHT: usize = 16;

/// One release nobody waits for.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) parts: Vec<LeasePart>,
    pub(crate) expires_at: UnixMillis,
    /// Until when it is tried: after that, anyone may end the lease (the reconciler does).
    pub(crate) until: UnixMillis,
    /// Its attempts that failed.
    pub(crate) failures: u32,
}

/// A client's queue of background work, and what is still to settle.
#[derive(Debug, Default)]
pub(crate) struct Background {
    queue: Mutex<VecDeque<Pending>>,
    /// Whether a task works the queue now.
    working: AtomicBool,
    /// Releases queued or in flight, and lease-row writes not yet settled.
    outstanding: AtomicUsize,
    /// Told whenever `outstanding` falls to zero.
    idle: Notify,
    /// Moved on by a flush: lease rows waiting for their delay are written at once.
    flushed: FlushSignal,
}

/// The flush generation, which lease-row writers watch.
#[derive(Debug)]
struct FlushSignal(watch::Sender<u64>);

impl Default for FlushSignal {
    fn default() -> Self {
        FlushSignal(watch::channel(0).0)
    }
}

impl Background {
    /// Counts a piece of work that must settle before a flush returns.
    pub(crate) fn begin(&self) {
        self.outstanding.fetch_add(1, Ordering::AcqRel);
    }

    /// Counts a piece of work as settled.
    pub(crate) fn end(&self) {
        if self.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// What a lease-row writer waits on besides its delay: a flush.
    pub(crate) fn flushes(&self) -> watch::Receiver<u64> {
        self.flushed.0.subscribe()
    }

    /// Queues `pending` (counted until settled); whether the caller must start a task to
    /// work the queue (none works it now).
    pub(crate) fn push(&self, pending: Pending) -> bool {
        self.begin();
        lock(&self.queue).push_back(pending);
        !self.working.swap(true, Ordering::AcqRel)
    }

    /// Puts back a release that failed, to be tried again (still counted).
    pub(crate) fn requeue(&self, pending: Pending) {
        lock(&self.queue).push_back(pending);
    }

    /// The next round for the task working the queue: up to `width` releases; empty when
    /// the queue is, and the task is done (unless one was queued meanwhile and no other
    /// task took it up: then the round holds it).
    pub(crate) fn round(&self, width: usize) -> Vec<Pending> {
        loop {
            let round: Vec<Pending> = {
                let mut queue = lock(&self.queue);
                let n = queue.len().min(width);
                queue.drain(..n).collect()
            };
            if !round.is_empty() {
                return round;
            }
            self.working.store(false, Ordering::Release);
            // Queued between the drain and the flag: work on, unless another task does.
            if lock(&self.queue).is_empty() || self.working.swap(true, Ordering::AcqRel) {
                return Vec::new();
            }
        }
    }

    /// Writes every lease row still waiting for its delay now, and waits until they and
    /// every queued release are settled, at most `deadline`.
    pub(crate) async fn flush(&self, deadline: Duration) -> Result<(), Error> {
        self.flushed.0.send_modify(|g| *g += 1);
        let settled = async {
            loop {
                let idle = self.idle.notified();
                if self.outstanding.load(Ordering::Acquire) == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(deadline, settled)
            .await
            .map_err(|_| Error::Timeout(deadline))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
