//! The metrics sluice reports through the `metrics` facade, read back from a recorder.
//! (The recorder is local to the test's thread: each test runs on a current-thread runtime.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, SharedString, Unit,
};
use sluice::store::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    StoreError,
};
use sluice::{
    Acquire, Bucket, Dimension, MemoryStore, RefillRate, Sluice, bucket::BucketState,
    clock::ManualClock, clock::UnixMillis, store::Store,
};

/// The in-memory store, except that the first change loses a race and reads of
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

    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        // The first change loses a race: the row it hands back is the current one.
        if !self.raced.swap(true, Ordering::SeqCst) {
            let current = self
                .inner
                .read_buckets(std::slice::from_ref(&change.dimension))
                .await?;
            return Err(ChangeError::Condition(
                current.into_iter().next().flatten().map(Box::new),
            ));
        }
        self.inner.change(change).await
    }

    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        self.inner.put_leases(leases).await
    }

    async fn end_lease(
        &self,
        key: &LeaseKey,
        expiring_at: Option<sluice::clock::UnixMillis>,
    ) -> Result<bool, StoreError> {
        self.inner.end_lease(key, expiring_at).await
    }
    async fn renew_lease(
        &self,
        key: &LeaseKey,
        from: sluice::clock::UnixMillis,
        to: sluice::clock::UnixMillis,
    ) -> Result<bool, StoreError> {
        self.inner.renew_lease(key, from, to).await
    }

    async fn respread_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
        moves: &[Option<sluice::store::Commute>],
    ) -> Result<bool, StoreError> {
        self.inner.respread_buckets(expected, rows, moves).await
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

/// What the recorder kept of one metric.
#[derive(Debug)]
enum Value {
    Counter(Arc<AtomicU64>),
    Histogram(Arc<Mutex<Vec<f64>>>),
    /// Gauges are registered but not read by these tests.
    Gauge,
}

/// A recorder that keeps every counter and histogram by name and labels.
#[derive(Debug, Default)]
struct Recorder {
    metrics: Mutex<Vec<(Key, Value)>>,
}

#[derive(Debug)]
struct CounterCell(Arc<AtomicU64>);

impl CounterFn for CounterCell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::SeqCst);
    }

    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::SeqCst);
    }
}

#[derive(Debug)]
struct HistogramCell(Arc<Mutex<Vec<f64>>>);

impl HistogramFn for HistogramCell {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

impl metrics::Recorder for Recorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let cell = Arc::new(AtomicU64::new(0));
        let mut metrics = self.metrics.lock().unwrap();
        metrics.push((key.clone(), Value::Counter(cell.clone())));
        Counter::from_arc(Arc::new(CounterCell(cell)))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.metrics
            .lock()
            .unwrap()
            .push((key.clone(), Value::Gauge));
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let cell = Arc::new(Mutex::new(Vec::new()));
        let mut metrics = self.metrics.lock().unwrap();
        metrics.push((key.clone(), Value::Histogram(cell.clone())));
        Histogram::from_arc(Arc::new(HistogramCell(cell)))
    }
}

impl Recorder {
    /// The metrics named `name` carrying every one of `labels`.
    fn matching<T>(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        read: impl Fn(&Value) -> Option<T>,
    ) -> Vec<T> {
        let metrics = self.metrics.lock().unwrap();
        metrics
            .iter()
            .filter(|(key, _)| key.name() == name)
            .filter(|(key, _)| {
                labels
                    .iter()
                    .all(|(l, v)| key.labels().any(|x| x.key() == *l && x.value() == *v))
            })
            .map(|(_, value)| read(value).unwrap_or_else(|| panic!("{name}: {value:?}")))
            .collect()
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let read = |value: &Value| match value {
            Value::Counter(n) => Some(n.load(Ordering::SeqCst)),
            _ => None,
        };
        self.matching(name, labels, read).into_iter().sum()
    }

    fn histogram_len(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        let read = |value: &Value| match value {
            Value::Histogram(values) => Some(values.lock().unwrap().len()),
            _ => None,
        };
        self.matching(name, labels, read).into_iter().sum()
    }
}

#[test]
fn acquires_contention_errors_and_reconcile_passes_are_counted() {
    let recorder = Recorder::default();
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
    let snapshot = &recorder;
    let rpm = [("dimension", "openai#rpm")];
    assert_eq!(snapshot.counter("sluice_grants_total", &rpm), 2);
    assert_eq!(snapshot.counter("sluice_retry_in_total", &rpm), 1);
    // Labelled by priority: empty for none.
    let at = |priority| [("dimension", "openai#rpm"), ("priority", priority)];
    assert_eq!(snapshot.counter("sluice_grants_total", &at("")), 2);
    assert_eq!(snapshot.counter("sluice_retry_in_total", &at("batch")), 1);
    assert_eq!(snapshot.counter("sluice_retry_in_total", &at("")), 0);
    assert_eq!(snapshot.counter("sluice_contention_retries_total", &rpm), 1);
    assert_eq!(
        snapshot.counter(
            "sluice_errors_total",
            &[
                ("dimension", "anthropic#rpm"),
                ("error", "unknown_dimension")
            ]
        ),
        1
    );
    // A throttled store is back-pressure: a RetryIn, counted as a throttle, not an error.
    assert_eq!(
        snapshot.counter(
            "sluice_errors_total",
            &[("dimension", "broken#rpm"), ("error", "store_throttled")]
        ),
        0
    );
    assert_eq!(
        snapshot.counter(
            "sluice_bucket_throttles_total",
            &[("dimension", "broken#rpm")]
        ),
        1
    );
    assert_eq!(
        snapshot.counter(
            "sluice_grants_total",
            &[("dimension", "elevenlabs#concurrent")]
        ),
        1
    );
    assert_eq!(
        snapshot.histogram_len("sluice_acquire_duration_seconds", &[("outcome", "granted")]),
        3
    );
    assert_eq!(
        snapshot.histogram_len(
            "sluice_acquire_duration_seconds",
            &[("outcome", "retry_in")]
        ),
        2
    );
    assert_eq!(
        snapshot.histogram_len("sluice_acquire_duration_seconds", &[("outcome", "error")]),
        1
    );
    assert_eq!(snapshot.counter("sluice_reconcile_passes_total", &[]), 2);
    assert_eq!(
        snapshot.counter("sluice_reconcile_leases_restored_total", &[]),
        1
    );
    assert_eq!(snapshot.counter("sluice_reconcile_errors_total", &[]), 0);
    assert_eq!(
        snapshot.histogram_len("sluice_reconcile_duration_seconds", &[]),
        2
    );
}
