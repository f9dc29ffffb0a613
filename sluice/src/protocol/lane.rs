//! A lane's writers: acquires and releases waiting on the same dimension are committed
//! together. While one write is in flight the requests behind it queue (at most
//! [`MAX_QUEUED`](crate::shared::lanes::MAX_QUEUED); more wait for room), and the next
//! write carries them all: the bucket update (slots given back first, then as many grants
//! as the bucket allows), the new leases and the ended ones. What one write decides and
//! how it is retried is in [`batch`](super::batch).
//!
//! A caller that goes away is never granted: its request leaves the queue with it, a write
//! skips requests whose caller is gone, and a grant whose caller went while its write was
//! in flight is given back at once. A write never stops half-way because its caller went
//! away: it finishes in a task of its own ([`Detached`]).

use std::sync::Arc;

use crate::detach::Detached;
use crate::error::Error;
use crate::grant::Grant;
use crate::shared::Core;
use crate::shared::lanes::{
    AcquireJob, Dequeue, Job, Lane, Queued, ReleaseJob, lock, sort_into_write,
};
use crate::store::StoreError;

use super::batch;
use super::ending::give_back_in_background;

/// A caller's answer, given back should the caller go away once it is in but before it
/// was read.
struct Answer<'a, T: Unanswered> {
    core: &'a Arc<Core>,
    receiver: tokio::sync::oneshot::Receiver<Result<T, Error>>,
}

/// What an answer nobody read leaves behind.
pub(super) trait Unanswered: Sized {
    /// Gives it back.
    fn abandon(self, core: &Arc<Core>);
}

impl Unanswered for Grant {
    fn abandon(self, core: &Arc<Core>) {
        give_back_in_background(core, self.parts);
    }
}

impl Unanswered for () {
    fn abandon(self, _: &Arc<Core>) {}
}

impl<T: Unanswered> Drop for Answer<'_, T> {
    fn drop(&mut self) {
        if let Ok(Ok(answer)) = self.receiver.try_recv() {
            tracing::debug!("the caller went away with its answer unread; giving it back");
            answer.abandon(self.core);
        }
    }
}

/// Queues `job` on `lane` and waits for its answer: either an earlier writer takes the
/// job along, or this caller becomes the writer, as many times as it takes (a write
/// carries at most [`MAX_BATCH`](crate::shared::lanes::MAX_BATCH) acquires; the rest wait
/// for the next turn). Waiting for the answer and for the writer's turn at once keeps
/// callers whose job is already done out of the writers' line.
pub(super) async fn on_lane<T: Unanswered>(
    core: &Arc<Core>,
    lane: &Arc<Lane>,
    job: Job,
    receiver: tokio::sync::oneshot::Receiver<Result<T, Error>>,
) -> Result<T, Error> {
    let mut answer = Answer { core, receiver };
    let mut dequeue = enqueue(lane, job).await?;
    let ticket = dequeue.ticket;
    loop {
        let writer = match lane.writer.clone().try_lock_owned() {
            // No write in flight: this caller writes (without registering a wake-up on
            // the answer, which would cost a needless reschedule).
            Ok(writer) => writer,
            Err(_) => tokio::select! {
                biased;
                reply = &mut answer.receiver => {
                    dequeue.queued = false;
                    return reply.unwrap_or_else(|_| Err(abandoned()));
                }
                writer = lane.writer.clone().lock_owned() => writer,
            },
        };
        let jobs = std::mem::take(&mut *lock(&lane.queue));
        if jobs.is_empty() {
            // An earlier writer carried this job: its answer is in.
            drop(writer);
        } else if jobs.len() == 1 && jobs[0].ticket == ticket {
            // Only this caller's own job: written in place. Should the caller go away
            // meanwhile, the write finishes on its own and gives its grant back; jobs
            // arriving meanwhile wait in the queue for the next writer.
            let (core, lane) = (core.clone(), lane.clone());
            Detached::new(async move {
                commit_jobs(&core, &lane, jobs).await;
                drop(writer);
            })
            .await;
        } else {
            // The write runs in its own task: a caller dropping its acquire or release
            // must not cancel a write other callers are waiting for.
            let (core, lane) = (core.clone(), lane.clone());
            let task = tokio::spawn(async move {
                commit_jobs(&core, &lane, jobs).await;
                drop(writer);
            });
            if let Err(e) = task.await
                && e.is_panic()
            {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        match answer.receiver.try_recv() {
            Ok(reply) => {
                dequeue.queued = false;
                return reply;
            }
            // The write had no room for this job: it is back in the queue.
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                return Err(abandoned());
            }
        }
    }
}

/// Puts `job` in `lane`'s queue, waiting for room; it leaves the queue with the returned
/// guard unless answered.
async fn enqueue(lane: &Lane, job: Job) -> Result<Dequeue<'_>, Error> {
    let room = match lane.room.clone().try_acquire_owned() {
        Ok(room) => room,
        Err(_) => lane
            .room
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| abandoned())?,
    };
    let ticket = lane
        .tickets
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    lock(&lane.queue).push(Queued {
        ticket,
        job,
        _room: room,
    });
    Ok(Dequeue {
        lane,
        ticket,
        queued: true,
    })
}

/// Carries `jobs`: one change gives back the released `concurrent` slots and grants as
/// many acquires as the bucket then allows. Acquires whose caller is gone are dropped
/// unanswered: never granted. Answers every other job, or puts it back in the queue.
async fn commit_jobs(core: &Arc<Core>, lane: &Lane, jobs: Vec<Queued>) {
    let mut acquires: Vec<AcquireJob> = Vec::new();
    let mut releases: Vec<ReleaseJob> = Vec::new();
    // The rest wait for the next write.
    let mut later: Vec<Queued> = Vec::new();
    sort_into_write(jobs, &mut acquires, &mut releases, &mut later);
    if !later.is_empty() {
        lock(&lane.queue).extend(later);
    }
    batch::write(core, lane, acquires, releases).await;
}

/// The answer when the write carrying a request went away without answering it.
fn abandoned() -> Error {
    StoreError::service("the write carrying this request was abandoned").into()
}

#[cfg(test)]
mod tests;
