//! Waiting callers queue: their turns in order, one write each, the deadline kept, and a
//! reservation given back by a caller that gives up.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::bucket::Bucket;
use crate::clock::{TokioClock, UnixMillis};
use crate::error::Error;
use crate::rate::RefillRate;
use crate::shared::test_store::{Hooked, Hooks};
use crate::store::{BucketChange, ChangeError};
use crate::{Sluice, Tokens};

const RPM: &str = "vendor#rpm";

/// Counts bucket changes; holds each for an hour while `slow` is set, else `hold_ms`.
#[derive(Debug, Default)]
struct Counter {
    changes: AtomicUsize,
    slow: AtomicBool,
    hold_ms: AtomicUsize,
}

#[async_trait::async_trait]
impl Hooks for Counter {
    fn change(&self, _: &BucketChange) -> Result<(), ChangeError> {
        self.changes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn hold_change(&self) {
        if self.slow.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_secs(3_600)).await;
        }
        let ms = self.hold_ms.load(Ordering::Relaxed) as u64;
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// A client of `store` (one process of many: each has its own memory of the row) on
/// tokio's paused clock.
fn process<H: Hooks>(store: &Arc<Hooked<H>>) -> Sluice {
    Sluice::builder()
        .store_arc(store.clone())
        .clock(TokioClock::starting_at(UnixMillis::from_secs(
            1_700_000_000,
        )))
        .build()
        .unwrap()
}

/// One token every 100 ms, holding one.
fn bucket() -> Bucket {
    Bucket::requests(RefillRate::per_second(10)).with_capacity(1)
}

#[tokio::test(start_paused = true)]
async fn waiting_callers_of_many_processes_take_turns_in_order_with_one_write_each() {
    let store = Arc::new(Hooked::new(Counter::default()));
    process(&store).put_bucket(RPM, bucket()).await.unwrap();
    let started = Instant::now();
    let mut waiters = Vec::new();
    for i in 0..8u64 {
        let sluice = process(&store);
        waiters.push(tokio::spawn(async move {
            // Each asks a millisecond after the one before.
            tokio::time::sleep(Duration::from_millis(i)).await;
            let lease = sluice
                .acquire_within(RPM, Duration::from_secs(2))
                .await
                .unwrap();
            let at = started.elapsed();
            lease.release().await.unwrap();
            at
        }));
    }
    let mut turns = Vec::new();
    for w in waiters {
        turns.push(w.await.unwrap());
    }
    // The first takes the token at once; each next one 100 ms after the one before: in the
    // order they asked, exactly when the refill has repaid the turns before theirs.
    let expected: Vec<Duration> = (0..8).map(|i| Duration::from_millis(100 * i)).collect();
    assert_eq!(turns, expected);
    assert_eq!(
        store.hooks.changes.load(Ordering::Relaxed),
        8,
        "one bucket write per grant, no retry"
    );
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_gives_up_before_its_turn_gives_its_reservation_back() {
    let store = Arc::new(Hooked::new(Counter::default()));
    let (first, quitter, next) = (process(&store), process(&store), process(&store));
    first.put_bucket(RPM, bucket()).await.unwrap();
    let _held = first.acquire(RPM).await.unwrap();
    // Its turn would come at 100 ms; it gives up at 50.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        quitter.acquire_within(RPM, Duration::from_secs(1)),
    )
    .await;
    assert!(gave_up.is_err(), "still waiting its turn when dropped");
    tokio::time::sleep(Duration::from_millis(10)).await;
    // What it reserved is back: the next caller's turn is at 100 ms, not 200.
    let started = Instant::now();
    let lease = next
        .acquire_within(RPM, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(40));
    lease.release().await.unwrap();
    let row = next.bucket(RPM).await.unwrap().unwrap();
    assert_eq!(row.available(next.now()), Tokens::ZERO, "two grants in all");
}

/// Loses the answer of the first bucket change after [`LosesAnswer::arm`], once it applied.
#[derive(Debug, Default)]
struct LosesAnswer {
    armed: AtomicBool,
    changes: AtomicUsize,
}

impl Hooks for LosesAnswer {
    fn change(&self, _: &BucketChange) -> Result<(), ChangeError> {
        self.changes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn answered(&self, _: &BucketChange) -> Result<(), ChangeError> {
        if self.armed.swap(false, Ordering::Relaxed) {
            return Err(ChangeError::Store(crate::store::StoreError::Timeout {
                source: None,
            }));
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_give_back_that_lost_its_answer_is_not_sent_again() {
    let store = Arc::new(Hooked::new(LosesAnswer::default()));
    let (first, quitter) = (process(&store), process(&store));
    first.put_bucket(RPM, bucket()).await.unwrap();
    let _held = first.acquire(RPM).await.unwrap();
    // Its turn would come at 100 ms; it gives up at 50 ms, and the write giving its
    // reservation back applies but its answer is lost.
    let mut waiting = Box::pin(quitter.acquire_within(RPM, Duration::from_secs(2)));
    let reserved = tokio::time::timeout(Duration::from_millis(10), &mut waiting).await;
    assert!(reserved.is_err(), "waiting its turn");
    store.hooks.armed.store(true, Ordering::Relaxed);
    let gave_up = tokio::time::timeout(Duration::from_millis(40), &mut waiting).await;
    assert!(gave_up.is_err(), "still waiting its turn when dropped");
    drop(waiting);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        !store.hooks.armed.load(Ordering::Relaxed),
        "given back once"
    );
    let sent = store.hooks.changes.load(Ordering::Relaxed);
    // Long enough for every retry a background give-back makes.
    tokio::time::sleep(Duration::from_secs(90)).await;
    assert_eq!(
        store.hooks.changes.load(Ordering::Relaxed),
        sent,
        "a give-back that may have applied is not sent again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_wait_is_a_deadline_that_counts_the_stores_answers_too() {
    let store = Arc::new(Hooked::new(Counter::default()));
    let sluice = process(&store);
    sluice.put_bucket(RPM, bucket()).await.unwrap();
    store.hooks.slow.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let answer = sluice.acquire_within(RPM, Duration::from_secs(1)).await;
    assert!(matches!(answer, Err(Error::Timeout(t)) if t == Duration::from_secs(1)));
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    // A turn further away than the time left is refused at once with the bucket's RetryIn.
    store.hooks.slow.store(false, Ordering::Relaxed);
    let other = process(&store);
    let held = other.acquire(RPM).await.unwrap();
    let started = Instant::now();
    let refused = other.acquire_within(RPM, Duration::from_millis(99)).await;
    assert_eq!(
        refused.unwrap_err().retry_in(),
        Some(Duration::from_millis(100))
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
    held.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_queues_callers_coming_back_for_their_next_turn_write_once_a_turn() {
    let store = Arc::new(Hooked::new(Counter::default()));
    // Ten a second, holding ten; 24 processes of one caller each, each coming back a second
    // after its turn: the queue is never empty, and each caller's memory of the row is
    // older than the bucket takes to fill, so that memory says "full" every time.
    let bucket = Bucket::requests(RefillRate::per_second(10)).with_capacity(10);
    process(&store).put_bucket(RPM, bucket).await.unwrap();
    let mut callers = Vec::new();
    for i in 0..24u64 {
        let sluice = process(&store);
        callers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(i * 3)).await;
            for _ in 0..5 {
                let lease = sluice
                    .acquire_within(RPM, Duration::from_secs(10))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
                lease.release().await.unwrap();
            }
        }));
    }
    for c in callers {
        c.await.unwrap();
    }
    // Taken from the debt, as last seen, not filled from memory's refill (which would
    // lose its race every turn): 120 grants, and at most one race lost per process, on
    // its first write, to the fills of the full bucket it found.
    let changes = store.hooks.changes.load(Ordering::Relaxed);
    assert!(changes <= 120 + 24, "{changes} writes for 120 grants");
}

#[tokio::test(start_paused = true)]
async fn a_turn_that_comes_only_at_the_deadline_is_refused_at_once_with_one_call() {
    let store = Arc::new(Hooked::new(Counter::default()));
    let first = process(&store);
    first.put_bucket(RPM, bucket()).await.unwrap();
    first.acquire(RPM).await.unwrap().release().await.unwrap();
    // Another process, which remembers nothing of the row: it asks the store.
    let sluice = process(&store);
    let before = store.hooks.changes.load(Ordering::Relaxed);
    let started = Instant::now();
    // The next token is exactly 100 ms away: a turn must come a millisecond before the
    // deadline, and asking again at the deadline would be answered after it: no wait.
    let refused = sluice.acquire_within(RPM, Duration::from_millis(100)).await;
    assert!(
        matches!(refused, Err(Error::RetryIn(crate::RetryIn { delay: d, .. })) if d == Duration::from_millis(100)),
        "{refused:?}"
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
    // One look at the store (a read of the row it had not seen, or a refused write).
    assert!(store.hooks.changes.load(Ordering::Relaxed) - before <= 1);
}

#[tokio::test(start_paused = true)]
async fn a_grant_answered_after_the_deadline_is_kept_for_the_callers_next_ask() {
    let store = Arc::new(Hooked::new(Counter::default()));
    let sluice = process(&store);
    sluice.put_bucket(RPM, bucket()).await.unwrap();
    // The store answers 1.5 s late: the caller waiting a second hears it did not answer.
    store.hooks.hold_ms.store(1_500, Ordering::Relaxed);
    let started = Instant::now();
    let late = sluice.acquire_within(RPM, Duration::from_secs(1)).await;
    assert!(matches!(late, Err(Error::Timeout(_))), "{late:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    // Asked again once the write has landed, the grant is there, with no other call.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let lease = sluice.acquire_within(RPM, Duration::from_secs(1)).await;
    assert_eq!(started.elapsed(), Duration::from_millis(1_600));
    assert!(lease.is_ok(), "{lease:?}");
    assert_eq!(store.hooks.changes.load(Ordering::Relaxed), 1);
    assert_eq!(sluice.parked.len(), 0);

    // Nobody asks again for the next one: it is given back a second after it landed.
    let late = sluice.acquire_within(RPM, Duration::from_secs(1)).await;
    assert!(matches!(late, Err(Error::Timeout(_))), "{late:?}");
    for _ in 0..1_000 {
        if sluice.parked.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(sluice.parked.len(), 1, "kept once it landed");
    let landed = store.hooks.changes.load(Ordering::Relaxed);
    store.hooks.hold_ms.store(0, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(1_020)).await;
    assert_eq!(sluice.parked.len(), 0);
    assert_eq!(
        store.hooks.changes.load(Ordering::Relaxed),
        landed + 1,
        "given back"
    );
}
