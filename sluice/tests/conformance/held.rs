//! Leases kept in the bucket row (the fast path), and several dimensions taken one write
//! per bucket: what another client, a reconciler, a redefinition or a caller that goes
//! away half-way sees.

use std::sync::Arc;
use std::time::Duration;

use sluice::store::{
    BoxError, BucketWrite, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    Store, StoreError,
};
use sluice::{
    Acquire, Bucket, BucketState, Config, Dimension, Protocol, RefillRate, Sluice, Tokens,
};

use super::{Env, requests, retry_in};

/// The row of `metric` as stored.
async fn row(env: &Env, metric: &str) -> BucketState {
    env.sluice
        .bucket(&env.dim(metric))
        .await
        .unwrap()
        .expect("bucket")
}

/// The leases of `metric`, wherever they are kept.
async fn leases(env: &Env, metric: &str) -> Vec<LeaseRecord> {
    env.store
        .list_leases(&LeaseFilter {
            dimension: Some(env.dim(metric).parse().unwrap()),
            expired_before: None,
        })
        .await
        .unwrap()
}

/// A client of `env` keeping at most `per_row` leases in a bucket row.
pub fn client_keeping(env: &Env, caller: &str, per_row: usize) -> Sluice {
    sluice::SluiceBuilder::from_config(Config {
        caller: caller.to_owned(),
        lease_ttl: Duration::from_secs(60),
        max_retries: 50,
        protocol: env.sluice.config().protocol,
        leases_per_row: per_row,
        clock_skew: super::SKEW,
        ..Config::default()
    })
    .store_arc(env.store.clone())
    .clock(env.clock.clone())
    .build()
    .unwrap()
}

fn fast(env: &Env) -> bool {
    env.sluice.config().protocol == Protocol::Fast
}

pub async fn a_grant_keeps_its_lease_where_one_write_carries_it(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    let before = row(&env, "rpm").await;
    let lease = env
        .sluice
        .acquire(Acquire::with_cost(env.dim("rpm"), 2))
        .await
        .unwrap();
    let after = row(&env, "rpm").await;
    assert_eq!(after.tokens, before.tokens - Tokens::new(2));
    let listed = leases(&env, "rpm").await;
    assert_eq!(listed.len(), 1);
    let record = &listed[0];
    assert_eq!(record.key, lease.id().keys()[0]);
    assert_eq!(record.cost, Tokens::new(2));
    assert_eq!(record.caller, "conformance");
    assert_eq!(record.expires_at, lease.expires_at());
    // The fast path keeps it in the bucket row; the seed's protocol in a row of its own.
    assert_eq!(record.in_bucket, fast(&env));
    assert_eq!(after.held.len(), usize::from(fast(&env)));
    // Read back by key, like any lease.
    let read = env.store.read_leases(lease.id().keys()).await.unwrap();
    assert_eq!(read, vec![Some(record.clone())]);
    lease.release().await.unwrap();
    assert!(leases(&env, "rpm").await.is_empty());
    let released = row(&env, "rpm").await;
    assert_eq!(
        released.tokens, after.tokens,
        "a requests lease gives nothing back"
    );
    assert!(released.held.is_empty());
}

pub async fn releasing_a_kept_lease_leaves_other_clients_writes_valid(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    let b = env.client("b");
    let mine = env.sluice.acquire(env.dim("rpm").as_str()).await.unwrap();
    let theirs = b.acquire(env.dim("rpm").as_str()).await.unwrap();
    let version = row(&env, "rpm").await.version;
    mine.release().await.unwrap();
    if fast(&env) {
        // No new version: B's next write, computed from the row it wrote, still applies.
        assert_eq!(row(&env, "rpm").await.version, version);
    }
    let again = b.acquire(env.dim("rpm").as_str()).await.unwrap();
    assert_eq!(again.attempts(), 1, "B's write was not turned away");
    assert_eq!(env.available("rpm").await, Tokens::new(7));
    theirs.release().await.unwrap();
    again.release().await.unwrap();
    assert!(leases(&env, "rpm").await.is_empty());
}

pub async fn leases_beyond_the_row_limit_get_rows_of_their_own(env: Env) {
    let dim = env.dim("concurrent");
    env.sluice
        .put_bucket(&dim, Bucket::concurrent(5))
        .await
        .unwrap();
    let client = client_keeping(&env, "limited", 2);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(client.acquire(dim.as_str()).await.unwrap());
    }
    let listed = leases(&env, "concurrent").await;
    assert_eq!(listed.len(), 4);
    let kept = listed.iter().filter(|l| l.in_bucket).count();
    assert_eq!(kept, if fast(&env) { 2 } else { 0 });
    assert_eq!(row(&env, "concurrent").await.held.len(), kept);
    assert_eq!(env.available("concurrent").await, Tokens::new(1));
    // Another client keeping none sees the same bucket.
    let other = client_keeping(&env, "rows", 0);
    let fifth = other.acquire(dim.as_str()).await.unwrap();
    assert!(
        !leases(&env, "concurrent")
            .await
            .iter()
            .any(|l| { l.key == fifth.id().keys()[0] && l.in_bucket })
    );
    // Every lease may be released by its holder: ask again after the poll interval.
    assert_eq!(
        retry_in(client.acquire(dim.as_str()).await),
        super::SLOT_POLL
    );
    fifth.release().await.unwrap();
    for lease in held {
        lease.release().await.unwrap();
    }
    assert_eq!(env.available("concurrent").await, Tokens::new(5));
    assert!(leases(&env, "concurrent").await.is_empty());
    assert!(row(&env, "concurrent").await.held.is_empty());
}

pub async fn leases_released_elsewhere_make_room_in_the_row_again(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    let dim = env.dim("rpm");
    let a = client_keeping(&env, "a", 2);
    let b = client_keeping(&env, "b", 2);
    let theirs = vec![
        b.acquire(dim.as_str()).await.unwrap(),
        b.acquire(dim.as_str()).await.unwrap(),
    ];
    // The row keeps two: A's grant gets a lease row of its own.
    let first = a.acquire(dim.as_str()).await.unwrap();
    let in_bucket = |lease: &sluice::Lease, listed: &[LeaseRecord]| {
        listed
            .iter()
            .find(|l| l.key == lease.id().keys()[0])
            .is_some_and(|l| l.in_bucket)
    };
    assert!(!in_bucket(&first, &leases(&env, "rpm").await));
    // B releases its leases: removed from the row with no new version, so A still
    // remembers the row keeping them; A finds the room all the same.
    for lease in theirs {
        lease.release().await.unwrap();
    }
    let second = a.acquire(dim.as_str()).await.unwrap();
    assert_eq!(in_bucket(&second, &leases(&env, "rpm").await), fast(&env));
    first.release().await.unwrap();
    second.release().await.unwrap();
    assert_eq!(env.available("rpm").await, Tokens::new(6));
    assert!(leases(&env, "rpm").await.is_empty());
}

pub async fn a_redefinition_keeps_the_leases_a_row_keeps(env: Env) {
    let dim = env.dim("concurrent");
    env.sluice
        .put_bucket(&dim, Bucket::concurrent(2))
        .await
        .unwrap();
    let held = env.sluice.acquire(dim.as_str()).await.unwrap();
    env.sluice
        .put_bucket(&dim, Bucket::concurrent(3))
        .await
        .unwrap();
    assert_eq!(
        leases(&env, "concurrent").await.len(),
        1,
        "the lease survives"
    );
    assert_eq!(env.available("concurrent").await, Tokens::new(2));
    held.release().await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(3));
    // Given back once: the reconciler finds nothing left to give.
    env.advance_ms(61_000);
    assert!(env.sluice.reconcile().await.unwrap().is_noop());
    assert_eq!(env.available("concurrent").await, Tokens::new(3));
}

pub async fn an_expired_kept_slot_is_reclaimed_once_by_a_short_bucket_or_the_reconciler(env: Env) {
    let dim = env.dim("concurrent");
    env.sluice
        .put_bucket(&dim, Bucket::concurrent(2))
        .await
        .unwrap();
    let b = env.client("b");
    let crashed = b
        .acquire(Acquire::new(dim.as_str()).ttl(Duration::from_secs(5)))
        .await
        .unwrap();
    let id = crashed.id().clone();
    std::mem::forget(crashed);
    let live = env.sluice.acquire(dim.as_str()).await.unwrap();
    // Both holders may release any moment: the poll interval.
    assert_eq!(
        retry_in(env.sluice.acquire(dim.as_str()).await),
        super::SLOT_POLL
    );
    env.advance_ms(5_000 + super::SKEW.as_millis() as u64);
    // The short bucket gives the expired slot back and grants it, in the same write or the
    // next one.
    let reclaimed = env.sluice.acquire(dim.as_str()).await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::ZERO);
    // The crashed holder's release and the reconciler now find nothing to give back.
    assert!(!b.release_id(&id).await.unwrap());
    assert!(env.sluice.reconcile().await.unwrap().is_noop());
    assert_eq!(env.available("concurrent").await, Tokens::ZERO);
    live.release().await.unwrap();
    reclaimed.release().await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(2));
}

pub async fn a_pair_refused_on_one_dimension_holds_nothing_on_the_other(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    env.sluice
        .put_bucket(
            &env.dim("tpm"),
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000),
        )
        .await
        .unwrap();
    // Another client empties tpm: this client has not seen it, and its memory says both
    // buckets are full, so it takes rpm first and must give it back.
    let b = env.client("b");
    let pair = Acquire::new(env.dim("rpm")).and_cost(env.dim("tpm"), 500);
    env.sluice
        .acquire(pair.clone())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let drained = b
        .acquire(Acquire::with_cost(env.dim("tpm"), 500))
        .await
        .unwrap();
    let rpm_before = row(&env, "rpm").await;
    let d = retry_in(env.sluice.acquire(pair.clone()).await);
    assert_eq!(d, Duration::from_secs(5), "500 tpm at 100/s");
    let rpm_after = row(&env, "rpm").await;
    assert_eq!(
        rpm_after.available(env.clock.now()),
        rpm_before.available(env.clock.now()),
        "rpm given back exactly when the caller sees the refusal"
    );
    assert!(leases(&env, "rpm").await.is_empty());
    assert_eq!(leases(&env, "tpm").await.len(), 1);
    // At the RetryIn it is granted, both dimensions.
    env.advance_ms(5_000);
    let granted = env.sluice.acquire(pair).await.unwrap();
    assert_eq!(granted.id().keys().len(), 2);
    assert_eq!(env.available("tpm").await, Tokens::ZERO);
    granted.release().await.unwrap();
    drained.release().await.unwrap();
}

/// A store that holds every commit touching one dimension until told to go on.
#[derive(Debug)]
struct Gate {
    inner: Arc<dyn Store>,
    gated: Dimension,
    open: tokio::sync::watch::Receiver<bool>,
    arrived: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl Store for Gate {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        self.inner.read_buckets(dimensions).await
    }
    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        if commit
            .buckets
            .iter()
            .any(|w: &BucketWrite| *w.dimension() == self.gated)
        {
            self.arrived.notify_one();
            let mut open = self.open.clone();
            open.wait_for(|o| *o)
                .await
                .map_err(|e| StoreError::Service {
                    message: "gate dropped".to_owned(),
                    source: Some(Box::new(e) as BoxError),
                })?;
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

pub async fn a_pair_dropped_half_way_gives_back_what_it_took(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    requests(&env, "tpm", 1_000, 100).await;
    let (open, gate_open) = tokio::sync::watch::channel(false);
    let gate = Arc::new(Gate {
        inner: env.store.clone(),
        gated: env.dim("tpm").parse().unwrap(),
        open: gate_open,
        arrived: tokio::sync::Notify::new(),
    });
    let client = sluice::SluiceBuilder::from_config(env.sluice.config().clone())
        .store_arc(gate.clone())
        .clock(env.clock.clone())
        .build()
        .unwrap();
    let pair = Acquire::new(env.dim("rpm")).and_cost(env.dim("tpm"), 100);
    let acquiring = tokio::spawn({
        let client = client.clone();
        async move { client.acquire(pair).await }
    });
    // The pair's write of tpm is in flight (rpm was taken first, by name); the caller goes
    // away.
    gate.arrived.notified().await;
    acquiring.abort();
    assert!(acquiring.await.unwrap_err().is_cancelled());
    open.send(true).unwrap();
    // Whatever was taken comes back, in the background; nothing stays held.
    for _ in 0..200 {
        if leases(&env, "rpm").await.is_empty()
            && leases(&env, "tpm").await.is_empty()
            && env.available("rpm").await == Tokens::new(10)
            && env.available("tpm").await == Tokens::new(1_000)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "held after the caller went away: rpm {} tpm {} leases {:?} {:?}",
        env.available("rpm").await,
        env.available("tpm").await,
        leases(&env, "rpm").await,
        leases(&env, "tpm").await
    );
}
