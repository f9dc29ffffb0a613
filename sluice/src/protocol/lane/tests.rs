use crate::shared::recent::MAX_DIMENSIONS_KEPT;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::Sluice;
use crate::acquire::Acquire;
use crate::bucket::Bucket;
use crate::clock::{ManualClock, UnixMillis};
use crate::dimension::Dimension;
use crate::lease::Lease;
use crate::shared::lanes::{
    AcquireJob, Job, Lane, MAX_BATCH, MAX_QUEUED, Queued, ReleaseJob, lock,
};
use crate::store::{LeaseFilter, LeaseKey, LeaseRecord, MemoryStore};
use crate::tokens::Tokens;

fn acquire_job(dimension: &str) -> (Queued, tokio::sync::oneshot::Receiver<Result<Grant, Error>>) {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let wanted = Acquire::new(dimension).resolve().unwrap().remove(0);
    let job = Job::Acquire(AcquireJob {
        wanted,
        ttl: Duration::from_secs(60),
        fresh_after: None,
        alone: true,
        reply,
    });
    (queued(job), answer)
}

fn release_job(lease: &mut Lease) -> (Queued, tokio::sync::oneshot::Receiver<Result<(), Error>>) {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let part = lease.take_rows().remove(0);
    (queued(Job::Release(ReleaseJob { part, reply })), answer)
}

/// The dimension most tests use.
const RPM: &str = "vendor#rpm";

/// A client on a new memory store with a manual clock, and `bucket` on [`RPM`].
async fn rpm_client(bucket: Bucket) -> Sluice {
    let sluice = Sluice::builder()
        .store(MemoryStore::new())
        .clock(ManualClock::new(UnixMillis::from_secs(1_700_000_000)))
        .build()
        .unwrap();
    sluice.put_bucket(RPM, bucket).await.unwrap();
    sluice
}

/// A `requests` bucket refilling one a second, holding `capacity`.
fn one_per_second(capacity: i64) -> Bucket {
    Bucket::requests(crate::RefillRate::per_second(1)).with_capacity(capacity)
}

/// The lane of `dim` on `sluice`.
fn lane_of(sluice: &Sluice, dim: &str) -> Arc<Lane> {
    sluice.core().lane(&Dimension::new(dim).unwrap())
}

/// How many tokens of [`RPM`]'s bucket are taken: its capacity less its stored tokens.
async fn rpm_taken(sluice: &Sluice) -> Tokens {
    let row = sluice.bucket(RPM).await.unwrap().unwrap();
    row.bucket.capacity() - row.tokens
}

/// `n` tokens.
fn tokens(n: usize) -> Tokens {
    Tokens::new(i64::try_from(n).unwrap())
}

/// Every live lease row on `sluice`'s store.
async fn live_leases(sluice: &Sluice) -> Vec<LeaseRecord> {
    sluice.leases(&LeaseFilter::default()).await.unwrap()
}

fn wrap(sluice: &Sluice, grant: Grant) -> Lease {
    Lease::new(sluice.core().clone(), grant)
}

fn queued(job: Job) -> Queued {
    Queued {
        ticket: 0,
        job,
        _room: Arc::new(tokio::sync::Semaphore::new(1))
            .try_acquire_owned()
            .unwrap(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_caller_pushed_back_by_a_full_write_takes_the_writers_turn_again() {
    let sluice = rpm_client(one_per_second(500)).await;
    let lane = lane_of(&sluice, RPM);
    lane.tickets
        .fetch_add(1_000, std::sync::atomic::Ordering::Relaxed);
    // More acquires than one write carries are queued ahead of this caller, by callers
    // that are not taking the writer's turn themselves (they wait for their answers).
    let mut ahead = Vec::new();
    for _ in 0..MAX_BATCH + 6 {
        let (job, answer) = acquire_job(RPM);
        lock(&lane.queue).push(job);
        ahead.push(answer);
    }
    // The caller writes the first batch, finds its own job back in the queue, and must
    // write again: no one else will.
    let lease = tokio::time::timeout(Duration::from_secs(60), sluice.acquire(RPM))
        .await
        .expect("answered without other traffic")
        .unwrap();
    lease.release().await.unwrap();
    for mut answer in ahead {
        wrap(&sluice, answer.try_recv().unwrap().unwrap())
            .release()
            .await
            .unwrap();
    }
    assert_eq!(rpm_taken(&sluice).await, tokens(MAX_BATCH + 7));
}

#[tokio::test]
async fn a_lane_queue_is_bounded_and_drains() {
    let sluice = rpm_client(one_per_second(5_000)).await;
    let lane = lane_of(&sluice, RPM);
    // A write in flight holds the writer's turn.
    let turn = lane.writer.clone().try_lock_owned().unwrap();
    let tasks: Vec<_> = (0..MAX_QUEUED + 50)
        .map(|_| {
            let sluice = sluice.clone();
            tokio::spawn(async move { sluice.acquire(RPM).await })
        })
        .collect();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        lock(&lane.queue).len(),
        MAX_QUEUED,
        "the rest wait for room"
    );
    drop(turn);
    for task in tasks {
        task.await.unwrap().unwrap().release().await.unwrap();
    }
    assert!(lock(&lane.queue).is_empty());
    assert_eq!(rpm_taken(&sluice).await, tokens(MAX_QUEUED + 50));
}

#[tokio::test]
async fn one_write_gives_back_released_slots_once_and_grants_from_them() {
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let sluice = Sluice::builder()
        .store(MemoryStore::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    let dim = "vendor#concurrent";
    sluice.put_bucket(dim, Bucket::concurrent(3)).await.unwrap();
    let mut short_lived = sluice
        .acquire(Acquire::new(dim).ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    let mut b = sluice.acquire(dim).await.unwrap();
    let held = sluice.acquire(dim).await.unwrap();
    // The first lease expires and the reconciler gives its slot back before its
    // release arrives: the release finds its row gone and gives nothing back.
    clock.advance(Duration::from_secs(2));
    assert_eq!(sluice.reconcile().await.unwrap().leases_restored, 1);
    let late = short_lived.take_rows().remove(0);
    crate::protocol::fast::release(sluice.core(), late, UnixMillis::EPOCH)
        .await
        .unwrap();
    // Another release rides on one write with an acquire: its row deleted first, as a
    // release does, then its slot given back in the same change that grants the acquire.
    let (release_b, b_answer) = release_job(&mut b);
    if let Job::Release(r) = &release_b.job {
        assert!(
            sluice
                .core()
                .store
                .end_lease(&r.part.key, None)
                .await
                .unwrap()
        );
    }
    let (acquire, acquired) = acquire_job(dim);
    let lane = lane_of(&sluice, dim);
    commit_jobs(sluice.core(), &lane, vec![release_b, acquire]).await;
    b_answer.await.unwrap().unwrap();
    let new = wrap(&sluice, acquired.await.unwrap().unwrap());
    // Three slots: `held` and the new lease out, one free. Giving the reconciled slot
    // back twice would show two.
    let row = sluice.bucket(dim).await.unwrap().unwrap();
    assert_eq!(row.tokens, Tokens::new(1));
    let mut live: Vec<LeaseKey> = live_leases(&sluice)
        .await
        .into_iter()
        .map(|r| r.key)
        .collect();
    live.sort();
    let mut expected = vec![held.id().keys()[0].clone(), new.id().keys()[0].clone()];
    expected.sort();
    assert_eq!(live, expected);
}

#[tokio::test]
async fn a_client_cycling_through_many_dimensions_keeps_a_bounded_number_of_lanes() {
    let sluice = Sluice::in_memory();
    let busy = lane_of(&sluice, "vendor#busy");
    for i in 0..2 * MAX_DIMENSIONS_KEPT + 10 {
        let dim = format!("vendor{i}#rpm");
        sluice
            .put_bucket(&dim, Bucket::requests(crate::RefillRate::per_second(10)))
            .await
            .unwrap();
        sluice
            .acquire(dim.as_str())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let mut lanes = lock(&sluice.core().lanes.lanes);
    assert!(
        lanes.len() <= 2 * MAX_DIMENSIONS_KEPT + 1,
        "{} lanes",
        lanes.len()
    );
    // A lane in use is never forgotten under its user.
    let kept = lanes.get(&Dimension::new("vendor#busy").unwrap()).unwrap();
    assert!(Arc::ptr_eq(kept, &busy));
}

#[tokio::test]
async fn a_write_grants_at_most_a_batch_and_the_rest_wait() {
    let sluice = rpm_client(Bucket::requests(crate::RefillRate::per_second(1000))).await;
    let mut batch = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..MAX_BATCH + 3 {
        let (job, answer) = acquire_job(RPM);
        batch.push(job);
        answers.push(answer);
    }
    let lane = lane_of(&sluice, RPM);
    commit_jobs(sluice.core(), &lane, batch).await;
    // One write grants MAX_BATCH; the rest wait in the queue for the next writer.
    assert_eq!(lock(&lane.queue).len(), 3);
    let mut leases = Vec::new();
    for answer in answers.iter_mut().take(MAX_BATCH) {
        leases.push(wrap(&sluice, answer.try_recv().unwrap().unwrap()));
    }
    assert!(answers[MAX_BATCH].try_recv().is_err());
    let rest = std::mem::take(&mut *lock(&lane.queue));
    commit_jobs(sluice.core(), &lane, rest).await;
    for answer in answers.iter_mut().skip(MAX_BATCH) {
        leases.push(wrap(&sluice, answer.try_recv().unwrap().unwrap()));
    }
    // Plain releases delete their rows, beside the lanes.
    for lease in leases {
        lease.release().await.unwrap();
    }
    assert!(live_leases(&sluice).await.is_empty());
    // Plain releases give nothing back.
    assert_eq!(rpm_taken(&sluice).await, tokens(MAX_BATCH + 3));
}
