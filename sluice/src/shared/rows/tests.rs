use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use super::*;
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::shared::test_store::{Hooked, Hooks};
use crate::store::{Commit, LeaseFilter, LeaseWrite};
use crate::tokens::Tokens;

/// Lease deletes that wait for a gate, count, and fail while `fail`.
#[derive(Debug)]
struct Held {
    calls: AtomicU32,
    gate: tokio::sync::Semaphore,
    fail: AtomicBool,
}

#[async_trait::async_trait]
impl Hooks for Held {
    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let _pass = self.gate.acquire().await.unwrap();
        if self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::Throttled { source: None });
        }
        let mut sorted = keys.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len(), "a batch names a row twice");
        Ok(())
    }
}

/// A lease row of one token on `d`, named `unique`.
fn lease(d: &Dimension, unique: &str) -> LeaseRecord {
    LeaseRecord {
        slot: false,
        key: LeaseKey::new(d, unique),
        dimension: d.clone(),
        cost: Tokens::new(1),
        created_at: UnixMillis::from_secs(1_700_000_000),
        expires_at: UnixMillis::from_secs(1_700_000_060),
        caller: "test".to_owned(),
    }
}

/// The batcher under test, on a store whose lease deletes are held, with lease rows.
struct Rig {
    store: Arc<Hooked<Held>>,
    /// The same store, as the batcher sees it.
    shared: Arc<dyn Store>,
    batcher: LeaseRows,
    /// The keys of the lease rows written at the start.
    keys: Vec<LeaseKey>,
}

impl Rig {
    /// A held store with `n` lease rows on one dimension, and a new batcher.
    async fn new(n: usize) -> Rig {
        let store = Arc::new(Hooked::new(Held {
            calls: AtomicU32::new(0),
            gate: tokio::sync::Semaphore::new(0),
            fail: AtomicBool::new(false),
        }));
        let d: Dimension = "openai#rpm".parse().unwrap();
        let leases: Vec<LeaseRecord> = (0..n).map(|i| lease(&d, &format!("k{i}"))).collect();
        let keys = leases.iter().map(|l| l.key.clone()).collect();
        if n > 0 {
            let leases = leases.into_iter().map(LeaseWrite::Create).collect();
            let commit = Commit {
                buckets: vec![],
                leases,
            };
            store.inner.commit(commit).await.unwrap();
        }
        let shared: Arc<dyn Store> = store.clone();
        Rig {
            store,
            shared,
            batcher: LeaseRows::default(),
            keys,
        }
    }

    /// Deletes `keys` through the batcher on a task of its own.
    fn spawn_delete(&self, keys: &[LeaseKey]) -> tokio::task::JoinHandle<Result<(), StoreError>> {
        let (batcher, store, keys) = (self.batcher.clone(), self.shared.clone(), keys.to_vec());
        tokio::spawn(async move { batcher.delete(&store, keys).await })
    }

    /// Deletes `keys` through the batcher and waits for the answer.
    async fn delete(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        self.batcher.delete(&self.shared, keys.to_vec()).await
    }

    /// How many lease deletes reached the store.
    fn calls(&self) -> u32 {
        self.store.hooks.calls.load(Ordering::SeqCst)
    }

    /// Waits until the first lease delete reached the store.
    async fn until_sent(&self) {
        while self.calls() == 0 {
            tokio::task::yield_now().await;
        }
    }

    /// Lets `n` more lease deletes through.
    fn open(&self, n: usize) {
        self.store.hooks.gate.add_permits(n);
    }

    /// Makes the lease deletes let through fail, or not.
    fn fail(&self, fail: bool) {
        self.store.hooks.fail.store(fail, Ordering::SeqCst);
    }

    /// The lease rows in the store.
    async fn leases(&self) -> Vec<LeaseRecord> {
        let inner = &self.store.inner;
        inner.list_leases(&LeaseFilter::default()).await.unwrap()
    }

    /// How many lease rows are left in the store.
    async fn left(&self) -> usize {
        self.leases().await.len()
    }
}

#[tokio::test]
async fn releases_queued_behind_a_batch_in_flight_go_in_one_batch_after_it() {
    let rig = Rig::new(21).await;
    let first = rig.spawn_delete(&rig.keys[..1]);
    rig.until_sent().await;
    // 20 releases while the first batch is in flight, one of them naming a row twice.
    let queued: Vec<_> = rig.keys[1..]
        .iter()
        .map(|k| {
            let mut ks = vec![k.clone()];
            if k == &rig.keys[5] {
                ks.push(k.clone());
            }
            rig.spawn_delete(&ks)
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(rig.calls(), 1);
    rig.open(2);
    first.await.unwrap().unwrap();
    for q in queued {
        q.await.unwrap().unwrap();
    }
    assert_eq!(rig.calls(), 2, "one batch for the 20");
    assert_eq!(rig.left().await, 0);
}

#[tokio::test]
async fn a_failed_batch_fails_each_release_in_it_and_the_next_one_is_sent() {
    let rig = Rig::new(3).await;
    rig.fail(true);
    rig.open(1);
    let e = rig.delete(&rig.keys[..2]).await;
    assert!(matches!(e, Err(StoreError::Throttled { .. })), "{e:?}");
    rig.fail(false);
    rig.open(1);
    rig.delete(&rig.keys).await.unwrap();
    assert_eq!(rig.left().await, 0);
}

#[tokio::test]
async fn a_release_that_stops_waiting_leaves_its_batch_going() {
    let rig = Rig::new(2).await;
    let gone = rig.spawn_delete(&rig.keys);
    rig.until_sent().await;
    gone.abort();
    rig.open(1);
    for _ in 0..100 {
        if rig.left().await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(rig.left().await, 0);
    // And the queue is free for the next.
    rig.open(1);
    rig.delete(&rig.keys).await.unwrap();
    assert_eq!(rig.calls(), 2);
}

#[tokio::test]
async fn nothing_to_delete_sends_nothing() {
    let rig = Rig::new(0).await;
    rig.delete(&[]).await.unwrap();
    assert_eq!(rig.calls(), 0);
}

#[tokio::test]
async fn rows_written_and_deleted_meanwhile_go_in_the_next_batch_together() {
    let rig = Rig::new(3).await;
    let first = rig.spawn_delete(&rig.keys[..1]);
    rig.until_sent().await;
    let new = lease(&"openai#rpm".parse().unwrap(), "new");
    let put = tokio::spawn({
        let (b, s) = (rig.batcher.clone(), rig.shared.clone());
        async move { b.put(&s, vec![new]).await }
    });
    let deleted = rig.spawn_delete(&rig.keys[1..]);
    tokio::time::sleep(Duration::from_millis(20)).await;
    rig.open(2);
    first.await.unwrap().unwrap();
    put.await.unwrap().unwrap();
    deleted.await.unwrap().unwrap();
    assert_eq!(rig.calls(), 2, "one batch of deletes after the first");
    let left = rig.leases().await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].key.unique(), "new");
}
