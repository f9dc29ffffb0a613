//! The metrics sluice reports through the `metrics` facade, read back from a recorder.
//! (Its own test binary: a recorder is process-wide state.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use sluice::store::{
    Commit, CommitError, ConditionFailure, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    StoreError,
};
use sluice::{
    Acquire, Bucket, BucketState, Dimension, ManualClock, MemoryStore, RefillRate, Sluice, Store,
    UnixMillis,
};

/// The in-memory store, except that the first commit loses a race and reads of
/// `broken#rpm` are throttled.
#[derive(Debug, Default)]
struct Scripted {
    inner: MemoryStore,
    raced: AtomicBool,
}

#[async_trait::async_trait]
impl Store for Scripted {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        if dimensions.iter().any(|d| d.as_str() == "broken#rpm") {
            return Err(StoreError::Throttled { source: None });
        }
        self.inner.read_buckets(dimensions).await
    }

    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        // The first commit that writes a lease (a lease row, or one kept in the row) loses
        // a race.
        let writes_lease =
            !commit.leases.is_empty() || commit.buckets.iter().any(|b| !b.held.is_empty());
        if let (true, Some(bucket)) = (writes_lease, commit.buckets.first())
            && !self.raced.swap(true, Ordering::SeqCst)
        {
            let dimension = bucket.dimension().clone();
            return Err(CommitError::Condition(ConditionFailure::BucketChanged {
                dimension,
                current: None,
            }));
        }
        self.inner.commit(commit).await
    }

    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        self.inner.delete_leases(keys).await
    }

    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        self.inner.read_leases(keys).await
    }

    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError> {
        self.inner.scan_leases(filter).await
    }

    async fn forget_held(&self, dimension: &Dimension, ids: &[String]) -> Result<(), StoreError> {
        self.inner.forget_held(dimension, ids).await
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

type Snapshot = Vec<(CompositeKey, DebugValue)>;

fn counter(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> u64 {
    snapshot
        .iter()
        .filter(|(k, _)| k.kind() == MetricKind::Counter && k.key().name() == name)
        .filter(|(k, _)| {
            labels
                .iter()
                .all(|(l, v)| k.key().labels().any(|x| x.key() == *l && x.value() == *v))
        })
        .map(|(_, v)| match v {
            DebugValue::Counter(n) => *n,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

fn histogram_len(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> usize {
    snapshot
        .iter()
        .filter(|(k, _)| k.kind() == MetricKind::Histogram && k.key().name() == name)
        .filter(|(k, _)| {
            labels
                .iter()
                .all(|(l, v)| k.key().labels().any(|x| x.key() == *l && x.value() == *v))
        })
        .map(|(_, v)| match v {
            DebugValue::Histogram(values) => values.len(),
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .sum()
}

#[test]
fn acquires_contention_errors_and_reconcile_passes_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let clock = ManualClock::new(UnixMillis::from_secs(1_800_000_000));
            let sluice = Sluice::builder()
                .store(Scripted::default())
                .clock(clock.clone())
                .build()
                .unwrap();
            sluice
                .put_bucket(
                    "openai#rpm",
                    Bucket::requests(RefillRate::per_second(1)).with_capacity(2),
                )
                .await
                .unwrap();
            sluice
                .put_bucket("elevenlabs#concurrent", Bucket::concurrent(1))
                .await
                .unwrap();
            // Two grants (the first after one lost race), then a RetryIn.
            for _ in 0..2 {
                sluice
                    .acquire("openai#rpm")
                    .await
                    .unwrap()
                    .release()
                    .await
                    .unwrap();
            }
            sluice
                .acquire(Acquire::new("openai#rpm").priority("batch".parse().unwrap()))
                .await
                .unwrap_err();
            // A dimension without a bucket, and a throttled store.
            sluice.acquire("anthropic#rpm").await.unwrap_err();
            sluice.acquire("broken#rpm").await.unwrap_err();
            // A crashed slot, given back by a reconcile pass.
            let lease = sluice
                .acquire(Acquire::new("elevenlabs#concurrent").ttl(Duration::from_secs(5)))
                .await
                .unwrap();
            std::mem::forget(lease);
            clock.advance(Duration::from_secs(6));
            let report = sluice.reconcile().await.unwrap();
            assert_eq!(report.leases_restored, 1);
            sluice.reconcile().await.unwrap();
        });
    });
    let snapshot: Snapshot = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect();
    let rpm = [("dimension", "openai#rpm")];
    assert_eq!(counter(&snapshot, "sluice_grants_total", &rpm), 2);
    assert_eq!(counter(&snapshot, "sluice_retry_in_total", &rpm), 1);
    // Labelled by priority: empty for none.
    let at = |priority| [("dimension", "openai#rpm"), ("priority", priority)];
    assert_eq!(counter(&snapshot, "sluice_grants_total", &at("")), 2);
    assert_eq!(counter(&snapshot, "sluice_retry_in_total", &at("batch")), 1);
    assert_eq!(counter(&snapshot, "sluice_retry_in_total", &at("")), 0);
    assert_eq!(
        counter(&snapshot, "sluice_contention_retries_total", &rpm),
        1
    );
    assert_eq!(
        counter(
            &snapshot,
            "sluice_errors_total",
            &[
                ("dimension", "anthropic#rpm"),
                ("error", "unknown_dimension")
            ]
        ),
        1
    );
    assert_eq!(
        counter(
            &snapshot,
            "sluice_errors_total",
            &[("dimension", "broken#rpm"), ("error", "store_throttled")]
        ),
        1
    );
    assert_eq!(
        counter(
            &snapshot,
            "sluice_grants_total",
            &[("dimension", "elevenlabs#concurrent")]
        ),
        1
    );
    assert_eq!(
        histogram_len(
            &snapshot,
            "sluice_acquire_duration_seconds",
            &[("outcome", "granted")]
        ),
        3
    );
    assert_eq!(
        histogram_len(
            &snapshot,
            "sluice_acquire_duration_seconds",
            &[("outcome", "retry_in")]
        ),
        1
    );
    assert_eq!(
        histogram_len(
            &snapshot,
            "sluice_acquire_duration_seconds",
            &[("outcome", "error")]
        ),
        2
    );
    assert_eq!(counter(&snapshot, "sluice_reconcile_passes_total", &[]), 2);
    assert_eq!(
        counter(&snapshot, "sluice_reconcile_leases_restored_total", &[]),
        1
    );
    assert_eq!(counter(&snapshot, "sluice_reconcile_errors_total", &[]), 0);
    assert_eq!(
        histogram_len(&snapshot, "sluice_reconcile_duration_seconds", &[]),
        2
    );
}
