//! Many tasks on one in-memory bucket, for real (multi-threaded runtime, wall clock):
//! exact conservation of tokens, slots and leases.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use sluice::store::LeaseFilter;
use sluice::{
    Bucket, Error, MemoryStore, RefillRate, Sluice, Tokens, clock::Clock as _, clock::SystemClock,
};

const TASKS: usize = 64;
const RUN: Duration = Duration::from_millis(2_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_never_over_grant_and_account_for_every_token() {
    let sluice = Sluice::builder()
        .store(MemoryStore::new())
        .clock(SystemClock)
        .max_retries(1_000)
        .build()
        .unwrap();
    let capacity = 1_000_u64;
    let per_second = 2_000_u64;
    let initial = sluice
        .put_bucket(
            "load#rpm",
            Bucket::requests(RefillRate::per_second(per_second)).with_capacity(capacity),
        )
        .await
        .unwrap();
    sluice
        .put_bucket("load#concurrent", Bucket::concurrent(8))
        .await
        .unwrap();
    // Start half empty, so the bookkeeping below is not cut short by the cap.
    sluice
        .acquire(sluice::Acquire::with_cost("load#rpm", capacity / 2))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let baseline = sluice.bucket("load#rpm").await.unwrap().unwrap();

    let granted = Arc::new(AtomicI64::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let max_in_flight = Arc::new(AtomicUsize::new(0));
    let deadline = tokio::time::Instant::now() + RUN;
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let sluice = sluice.clone();
        let granted = granted.clone();
        let in_flight = in_flight.clone();
        let max_in_flight = max_in_flight.clone();
        tasks.push(tokio::spawn(async move {
            while tokio::time::Instant::now() < deadline {
                if i % 2 == 0 {
                    match sluice.acquire("load#rpm").await {
                        Ok(lease) => {
                            granted.fetch_add(1, Ordering::SeqCst);
                            lease.release().await.unwrap();
                        }
                        Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => {
                            tokio::time::sleep(d).await
                        }
                        Err(e) => panic!("unexpected: {e}"),
                    }
                } else {
                    let r = sluice
                        .slot("load#concurrent", Duration::from_secs(10), async {
                            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                            max_in_flight.fetch_max(now, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            in_flight.fetch_sub(1, Ordering::SeqCst);
                        })
                        .await;
                    match r {
                        Ok(()) => {}
                        Err(Error::RetryIn(_)) => tokio::task::yield_now().await,
                        Err(e) => panic!("unexpected: {e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let end = SystemClock.now();
    let grants = granted.load(Ordering::SeqCst);

    // Never more than the bucket held (after the first half) plus what refilled since it was created.
    let elapsed_ms = i128::from(end.as_millis() - initial.last_refill_at.as_millis());
    let bound = initial.tokens - Tokens::new(capacity as i64 / 2)
        + Tokens::from_nanos(elapsed_ms * i128::from(per_second) * 1_000_000);
    assert!(
        Tokens::new(grants) <= bound,
        "{grants} grants exceed the bound {bound}"
    );
    // Demand far exceeds supply, so nearly all of it was handed out.
    assert!(
        Tokens::new(grants) >= Tokens::from_nanos(bound.as_nanos() * 9 / 10),
        "{grants} of {bound}"
    );

    // Exact bookkeeping: what is left is what was there, plus refill up to the last
    // write's timestamp, minus every grant. (The bucket never filled up: 64 hungry tasks
    // drain it far faster than it refills.)
    let row = sluice.bucket("load#rpm").await.unwrap().unwrap();
    let refilled_ms =
        i128::from(row.last_refill_at.as_millis() - baseline.last_refill_at.as_millis());
    let refilled = Tokens::from_nanos(refilled_ms * i128::from(per_second) * 1_000_000);
    assert_eq!(row.tokens, baseline.tokens + refilled - Tokens::new(grants));

    // Slots: never more than 8 held at once, and all 8 back at the end.
    assert!(max_in_flight.load(Ordering::SeqCst) <= 8);
    let concurrent = sluice.bucket("load#concurrent").await.unwrap().unwrap();
    assert_eq!(concurrent.tokens, Tokens::new(8));
    // Every lease released.
    assert!(
        sluice
            .leases(&LeaseFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
}
