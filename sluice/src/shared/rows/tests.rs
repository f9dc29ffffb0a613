use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::*;
use crate::bucket::BucketState;
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::store::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseRecord, LeaseScan,
    LeaseWrite, MemoryStore,
};
use crate::tokens::Tokens;

/// A store whose lease deletes wait for a gate while `held`, and count.
#[derive(Debug)]
struct Held {
    inner: MemoryStore,
    calls: AtomicU32,
    gate: tokio::sync::Semaphore,
    fail: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Store for Held {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        self.inner.read_buckets(dimensions).await
    }
    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        self.inner.commit(commit).await
    }
    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        self.inner.change(change).await
    }
    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        self.inner.put_leases(leases).await
    }
    async fn end_lease(&self, key: &LeaseKey) -> Result<bool, StoreError> {
        self.inner.end_lease(key).await
    }
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
        self.inner.delete_leases(keys).await
    }
    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        self.inner.read_leases(keys).await
    }
    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError> {
        self.inner.scan_leases(filter).await
    }
    async fn replace_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
    ) -> Result<bool, StoreError> {
        self.inner.replace_buckets(expected, rows).await
    }
    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError> {
        self.inner.put_bucket(state, expected).await
    }
    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError> {
        self.inner.list_buckets().await
    }
    async fn delete_bucket(&self, dimension: &Dimension) -> Result<bool, StoreError> {
        self.inner.delete_bucket(dimension).await
    }
}

fn held() -> Arc<Held> {
    Arc::new(Held {
        inner: MemoryStore::new(),
        calls: AtomicU32::new(0),
        gate: tokio::sync::Semaphore::new(0),
        fail: std::sync::atomic::AtomicBool::new(false),
    })
}

async fn rows(store: &Held, n: usize) -> Vec<LeaseKey> {
    let d: Dimension = "openai#rpm".parse().unwrap();
    let keys: Vec<LeaseKey> = (0..n)
        .map(|i| LeaseKey::new(&d, &format!("k{i}")))
        .collect();
    let leases = keys
        .iter()
        .map(|key| {
            LeaseWrite::Create(LeaseRecord {
                slot: false,
                key: key.clone(),
                dimension: d.clone(),
                cost: Tokens::new(1),
                created_at: UnixMillis::from_secs(1_700_000_000),
                expires_at: UnixMillis::from_secs(1_700_000_060),
                caller: "test".to_owned(),
            })
        })
        .collect();
    store
        .inner
        .commit(Commit {
            buckets: vec![],
            leases,
        })
        .await
        .unwrap();
    keys
}

async fn left(store: &Held) -> usize {
    store
        .inner
        .list_leases(&LeaseFilter::default())
        .await
        .unwrap()
        .len()
}

#[tokio::test]
async fn releases_queued_behind_a_batch_in_flight_go_in_one_batch_after_it() {
    let store = held();
    let keys = rows(&store, 21).await;
    let dyn_store: Arc<dyn Store> = store.clone();
    let deletes = LeaseRows::default();
    let first = tokio::spawn({
        let (d, s, k) = (deletes.clone(), dyn_store.clone(), keys[..1].to_vec());
        async move { d.delete(&s, k).await }
    });
    while store.calls.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    // 20 releases while the first batch is in flight, one of them naming a row twice.
    let queued: Vec<_> = keys[1..]
        .iter()
        .map(|k| {
            let (d, s) = (deletes.clone(), dyn_store.clone());
            let mut ks = vec![k.clone()];
            if k == &keys[5] {
                ks.push(k.clone());
            }
            tokio::spawn(async move { d.delete(&s, ks).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.calls.load(Ordering::SeqCst), 1);
    store.gate.add_permits(2);
    first.await.unwrap().unwrap();
    for q in queued {
        q.await.unwrap().unwrap();
    }
    assert_eq!(
        store.calls.load(Ordering::SeqCst),
        2,
        "one batch for the 20"
    );
    assert_eq!(left(&store).await, 0);
}

#[tokio::test]
async fn a_failed_batch_fails_each_release_in_it_and_the_next_one_is_sent() {
    let store = held();
    let keys = rows(&store, 3).await;
    let dyn_store: Arc<dyn Store> = store.clone();
    let deletes = LeaseRows::default();
    store.fail.store(true, Ordering::SeqCst);
    store.gate.add_permits(1);
    let e = deletes.delete(&dyn_store, keys[..2].to_vec()).await;
    assert!(matches!(e, Err(StoreError::Throttled { .. })), "{e:?}");
    store.fail.store(false, Ordering::SeqCst);
    store.gate.add_permits(1);
    deletes.delete(&dyn_store, keys.clone()).await.unwrap();
    assert_eq!(left(&store).await, 0);
}

#[tokio::test]
async fn a_release_that_stops_waiting_leaves_its_batch_going() {
    let store = held();
    let keys = rows(&store, 2).await;
    let dyn_store: Arc<dyn Store> = store.clone();
    let deletes = LeaseRows::default();
    let gone = tokio::spawn({
        let (d, s, k) = (deletes.clone(), dyn_store.clone(), keys.clone());
        async move { d.delete(&s, k).await }
    });
    while store.calls.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    gone.abort();
    store.gate.add_permits(1);
    for _ in 0..100 {
        if left(&store).await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(left(&store).await, 0);
    // And the queue is free for the next.
    store.gate.add_permits(1);
    deletes.delete(&dyn_store, keys).await.unwrap();
    assert_eq!(store.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn nothing_to_delete_sends_nothing() {
    let store = held();
    let dyn_store: Arc<dyn Store> = store.clone();
    LeaseRows::default()
        .delete(&dyn_store, Vec::new())
        .await
        .unwrap();
    assert_eq!(store.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn rows_written_and_deleted_meanwhile_go_in_the_next_batch_together() {
    let store = held();
    let keys = rows(&store, 3).await;
    let dyn_store: Arc<dyn Store> = store.clone();
    let batcher = LeaseRows::default();
    let first = tokio::spawn({
        let (b, s, k) = (batcher.clone(), dyn_store.clone(), keys[..1].to_vec());
        async move { b.delete(&s, k).await }
    });
    while store.calls.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let d: Dimension = "openai#rpm".parse().unwrap();
    let new = LeaseRecord {
        slot: false,
        key: LeaseKey::new(&d, "new"),
        dimension: d.clone(),
        cost: Tokens::new(1),
        created_at: UnixMillis::from_secs(1_700_000_000),
        expires_at: UnixMillis::from_secs(1_700_000_060),
        caller: "test".to_owned(),
    };
    let put = tokio::spawn({
        let (b, s) = (batcher.clone(), dyn_store.clone());
        async move { b.put(&s, vec![new]).await }
    });
    let deleted = tokio::spawn({
        let (b, s, k) = (batcher.clone(), dyn_store.clone(), keys[1..].to_vec());
        async move { b.delete(&s, k).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.gate.add_permits(2);
    first.await.unwrap().unwrap();
    put.await.unwrap().unwrap();
    deleted.await.unwrap().unwrap();
    assert_eq!(
        store.calls.load(Ordering::SeqCst),
        2,
        "one batch of deletes after the first"
    );
    let left = store
        .inner
        .list_leases(&LeaseFilter::default())
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].key.unique(), "new");
}
