//! However many clients wait for a slot of a short `concurrent` bucket, together they look
//! at its row about a hundred times a second: each counts itself on the row once an epoch
//! and spaces its looks by the count. A slot given back still reaches one of them at once.
//! Paused time, one store counting the calls on the bucket's row.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sluice::{Bucket, MemoryStore, Sluice, clock::TokioClock, clock::UnixMillis};
use tokio::time::Instant;

use crate::counted::Counted;

const DIM: &str = "waiting#slots";

/// `clients` clients of `callers` callers each wait on a bucket whose two slots another
/// client holds, started one after another. Once the count has settled, a minute is
/// measured: the calls on the row and the lease queries, a second, and the counts in the
/// minute. Then the slot given back must reach a waiter within a second.
async fn waiting(clients: u64, callers: u64) -> (u64, u64, u64) {
    let store = Arc::new(Counted::new(Arc::new(MemoryStore::new())));
    // Calls on the bucket's row (reads, writes, counts of waiting callers), counts alone,
    // and queries of slot leases, since the last take.
    let take = |c: &Counted| {
        let counts = c.waits.swap(0, Ordering::SeqCst);
        let row = c.calls.swap(0, Ordering::SeqCst) + counts;
        (row, counts, c.slot_queries.swap(0, Ordering::SeqCst))
    };
    let clock = TokioClock::starting_at(UnixMillis::from_secs(1_700_000_000));
    let client = |caller: String| {
        Sluice::builder()
            .store_arc(store.clone())
            .clock(clock)
            .caller(caller)
            .build()
            .unwrap()
    };
    let holder = client("holder".to_owned());
    holder.put_bucket(DIM, Bucket::concurrent(2)).await.unwrap();
    let mut held = vec![
        holder.acquire(DIM).await.unwrap(),
        holder.acquire(DIM).await.unwrap(),
    ];
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = tokio::task::JoinSet::new();
    for i in 0..clients {
        let sluice = client(format!("waiter-{i}"));
        // Started one after another, as a fleet starts.
        tokio::time::sleep(Duration::from_millis(10)).await;
        for _ in 0..callers {
            let (sluice, tx) = (sluice.clone(), granted_tx.clone());
            waiters.spawn(async move {
                let lease = sluice
                    .acquire_within(DIM, Duration::from_secs(600))
                    .await
                    .unwrap();
                tx.send(Instant::now()).unwrap();
                // Held to the end: the test counts one grant per slot given back.
                std::future::pending::<()>().await;
                drop(lease);
            });
        }
    }
    // Two epochs for the count to settle, then a minute measured.
    tokio::time::sleep(Duration::from_secs(40)).await;
    take(&store);
    let minute = Duration::from_secs(60);
    tokio::time::sleep(minute).await;
    let (row, counts, leases) = take(&store);
    assert!(granted.try_recv().is_err(), "nothing was given back yet");
    // A slot given back reaches one of the waiters at once.
    let freed = Instant::now();
    held.pop().unwrap().release().await.unwrap();
    let reached = tokio::time::timeout(Duration::from_secs(1), granted.recv())
        .await
        .expect("a waiter got the slot given back within a second")
        .unwrap();
    assert!(reached - freed <= Duration::from_secs(1));
    waiters.abort_all();
    drop(held);
    let seconds = minute.as_secs();
    (row / seconds, leases / seconds, counts)
}

/// 200 single-caller clients (the old spacing, every client at the 300 ms poll interval,
/// jittered, looked at the row about 900 times a second): about a hundred, with a few
/// counts an epoch.
#[tokio::test(start_paused = true)]
async fn two_hundred_waiting_clients_look_about_a_hundred_times_a_second() {
    let (row, leases, counts) = waiting(200, 1).await;
    assert!(
        row <= 150,
        "{row} calls a second on the row ({counts} counts)"
    );
    assert!(leases <= 150, "{leases} lease queries a second");
    assert!(counts <= 3 * 2 * 40, "{counts} counts in three epochs");
}

/// 20 clients of 10 callers each: the callers are counted, not the clients (counting the
/// clients, each caller of a client looked about every 300 ms: several hundred looks a
/// second).
#[tokio::test(start_paused = true)]
async fn two_hundred_waiting_callers_in_twenty_clients_look_about_a_hundred_times_a_second() {
    let (row, leases, counts) = waiting(20, 10).await;
    assert!(
        row <= 150,
        "{row} calls a second on the row ({counts} counts)"
    );
    assert!(leases <= 150, "{leases} lease queries a second");
    assert!(counts <= 3 * 2 * 40, "{counts} counts in three epochs");
}
