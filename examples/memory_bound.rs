//! What one client keeps as it meets dimension after dimension: 100,000 distinct
//! dimensions, ten acquires each, through one client, with the client's resident memory
//! printed every 10,000 dimensions (the curve `docs/performance.md` publishes).
//!
//! The store keeps nothing (every bucket row it is asked for is full, every change it is
//! sent applies to a full row): the process's memory is the client's, not the store's.
//!
//! ```sh
//! cargo run --release -p sluice-examples --example memory_bound
//! ```

#![allow(clippy::print_stdout)]

use std::time::Instant;

use sluice::store::{
    BucketChange, ChangeError, Commit, CommitError, LeaseFilter, LeaseKey, LeaseRecord, LeaseScan,
    Store, StoreError,
};
use sluice::{
    Bucket, Dimension, RefillRate, Sluice, bucket::BucketState, clock::Clock as _,
    clock::SystemClock, clock::UnixMillis,
};

const DIMENSIONS: usize = 100_000;
const ACQUIRES_EACH: usize = 10;
const REPORT_EVERY: usize = 10_000;

/// A store with every bucket full and nothing remembered.
#[derive(Debug)]
struct Forgetful;

fn full(dimension: &Dimension) -> BucketState {
    BucketState::full(
        dimension.clone(),
        Bucket::requests(RefillRate::per_second(1_000)),
        SystemClock.now(),
    )
}

#[async_trait::async_trait]
impl Store for Forgetful {
    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        Ok(dimensions.iter().map(|d| Some(full(d))).collect())
    }

    async fn commit(&self, _commit: Commit) -> Result<(), CommitError> {
        Ok(())
    }

    async fn delete_leases(&self, _keys: &[LeaseKey]) -> Result<(), StoreError> {
        Ok(())
    }

    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        Ok(vec![None; keys.len()])
    }

    async fn scan_leases(&self, _filter: &LeaseFilter) -> Result<LeaseScan, StoreError> {
        Ok(LeaseScan::default())
    }

    async fn slot_leases(
        &self,
        _dimension: &Dimension,
        _limit: usize,
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        Ok(Vec::new())
    }

    async fn respread_buckets(
        &self,
        _expected: &[BucketState],
        _rows: &[BucketState],
        _moves: &[Option<sluice::store::Commute>],
    ) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        let stored = full(&change.dimension);
        if change.holds(&stored) {
            Ok(change.applied(&stored))
        } else {
            Err(ChangeError::Condition(Some(Box::new(stored))))
        }
    }

    async fn put_leases(&self, _leases: &[LeaseRecord]) -> Result<(), StoreError> {
        Ok(())
    }

    async fn end_lease(
        &self,
        _key: &LeaseKey,
        _expiring_at: Option<UnixMillis>,
    ) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn renew_lease(
        &self,
        _key: &LeaseKey,
        _from: UnixMillis,
        _to: UnixMillis,
    ) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn put_bucket(
        &self,
        _state: &BucketState,
        _expected: Option<&BucketState>,
    ) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError> {
        Ok(Vec::new())
    }

    async fn delete_bucket(&self, _dimension: &Dimension) -> Result<bool, StoreError> {
        Ok(true)
    }
}

/// The process's resident memory in MiB, to a tenth (Linux; `0.0` elsewhere).
fn resident_mib() -> String {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    let tenths = pages * 4 * 10 / 1024;
    format!("{}.{}", tenths / 10, tenths % 10)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), sluice::Error> {
    let sluice = Sluice::builder().store(Forgetful).build()?;
    let started = Instant::now();
    println!("| dimensions met | acquires | resident memory (MiB) |");
    println!("|---|---|---|");
    println!("| 0 | 0 | {} |", resident_mib());
    for i in 0..DIMENSIONS {
        let dimension = format!("tenant{i}#rpm");
        for _ in 0..ACQUIRES_EACH {
            sluice.acquire(dimension.as_str()).await?.release().await?;
        }
        if (i + 1) % REPORT_EVERY == 0 {
            println!(
                "| {} | {} | {} |",
                i + 1,
                (i + 1) * ACQUIRES_EACH,
                resident_mib()
            );
        }
    }
    println!(
        "\n{DIMENSIONS} dimensions x {ACQUIRES_EACH} acquires in {} ms",
        started.elapsed().as_millis()
    );
    Ok(())
}
