//! The embedded in-memory store.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{
    BucketChange, BucketWrite, ChangeError, Commit, CommitError, ConditionFailure, LeaseFilter,
    LeaseKey, LeaseRecord, LeaseScan, LeaseWrite, Store, StoreError,
};
use crate::bucket::{BucketState, Commute};
use crate::clock::UnixMillis;
use crate::dimension::Dimension;

/// The embedded store: buckets and leases in this process's memory.
///
/// It has the same semantics as the DynamoDB store (versioned buckets, conditional
/// all-or-nothing commits, leases with expiry) and is the default when no table is
/// configured. Quotas it holds are shared by every clone of the store and every
/// [`Sluice`](crate::Sluice) built on it, but not with other processes.
///
/// ```
/// use sluice::{Bucket, MemoryStore, RefillRate, Sluice};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let sluice = Sluice::builder().store(MemoryStore::new()).build()?;
/// sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(500))).await?;
/// let lease = sluice.acquire("openai#rpm").await?;
/// lease.release().await?;
/// # Ok::<(), sluice::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    rows: Arc<Mutex<Rows>>,
}

#[derive(Debug, Default)]
struct Rows {
    buckets: HashMap<Dimension, BucketState>,
    leases: BTreeMap<LeaseKey, LeaseRecord>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn rows(&self) -> MutexGuard<'_, Rows> {
        // A panic while holding the lock cannot leave rows half-written: every mutation
        // below checks all conditions before changing anything.
        self.rows
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Rows {
    /// The write applies only to exactly the row it was computed from.
    fn check_bucket(&self, w: &BucketWrite) -> Result<(), ConditionFailure> {
        match w.failure(self.buckets.get(w.dimension())) {
            None => Ok(()),
            Some(failure) => Err(failure),
        }
    }

    /// Checks that the rows a commit leaves are valid, before anything changes.
    fn check_written(commit: &Commit) -> Result<(), StoreError> {
        for w in &commit.buckets {
            StoreError::check_write(w)?;
        }
        Ok(())
    }

    fn check_lease(&self, w: &LeaseWrite) -> Result<(), ConditionFailure> {
        let exists = self.leases.contains_key(w.key());
        match w {
            LeaseWrite::Create(r) if exists => Err(ConditionFailure::LeaseExists(r.key.clone())),
            LeaseWrite::Delete(k) | LeaseWrite::SetCost { key: k, .. } if !exists => {
                Err(ConditionFailure::LeaseMissing(k.clone()))
            }
            _ => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    fn describe(&self) -> String {
        "this process's in-memory store (no other process sees it; set SLUICE_TABLE_NAME to share a DynamoDB table)".to_owned()
    }

    async fn read_buckets(
        &self,
        dimensions: &[Dimension],
    ) -> Result<Vec<Option<BucketState>>, StoreError> {
        let rows = self.rows();
        Ok(dimensions
            .iter()
            .map(|d| rows.buckets.get(d).cloned())
            .collect())
    }

    fn loses_answers(&self) -> bool {
        false
    }

    async fn commit(&self, commit: Commit) -> Result<(), CommitError> {
        Rows::check_written(&commit)?;
        let mut rows = self.rows();
        for w in &commit.buckets {
            rows.check_bucket(w).map_err(CommitError::Condition)?;
        }
        for w in &commit.leases {
            rows.check_lease(w).map_err(CommitError::Condition)?;
        }
        for w in commit.buckets {
            if let Some(b) = rows.buckets.get_mut(w.dimension()) {
                b.tokens = w.tokens;
                b.last_refill_at = w.last_refill_at;
                b.burst = w.burst;
                b.shadow = w.shadow;
                b.version = w.expected.version + 1;
                b.write_id = Some(w.write_id);
                b.recent_writes = b.recent_after(w.write_id, w.written_at);
            }
        }
        for w in commit.leases {
            match w {
                LeaseWrite::Create(r) => {
                    rows.leases.insert(r.key.clone(), r);
                }
                LeaseWrite::Delete(k) => {
                    rows.leases.remove(&k);
                }
                LeaseWrite::SetCost { key, cost } => {
                    if let Some(r) = rows.leases.get_mut(&key) {
                        r.cost = cost;
                    }
                }
            }
        }
        Ok(())
    }

    async fn delete_leases(&self, keys: &[LeaseKey]) -> Result<(), StoreError> {
        let mut rows = self.rows();
        for key in keys {
            rows.leases.remove(key);
        }
        Ok(())
    }

    async fn read_leases(&self, keys: &[LeaseKey]) -> Result<Vec<Option<LeaseRecord>>, StoreError> {
        let rows = self.rows();
        Ok(keys.iter().map(|k| rows.leases.get(k).cloned()).collect())
    }

    async fn change(&self, change: BucketChange) -> Result<BucketState, ChangeError> {
        let mut rows = self.rows();
        if !rows.buckets.contains_key(&change.dimension)
            && let Some(created) = change.created()
        {
            let after = change.applied(&created);
            StoreError::check_row(&after)?;
            rows.buckets.insert(change.dimension.clone(), after.clone());
            return Ok(after);
        }
        let Some(stored) = rows.buckets.get_mut(&change.dimension) else {
            return Err(ChangeError::Condition(None));
        };
        if !change.holds(stored) {
            return Err(ChangeError::Condition(Some(Box::new(stored.clone()))));
        }
        let after = change.applied(stored);
        StoreError::check_row(&after)?;
        *stored = after.clone();
        Ok(after)
    }

    async fn end_lease(
        &self,
        key: &LeaseKey,
        expiring_at: Option<UnixMillis>,
    ) -> Result<bool, StoreError> {
        let mut rows = self.rows();
        let holds = |r: &LeaseRecord| expiring_at.is_none_or(|at| r.expires_at == at);
        if !rows.leases.get(key).is_some_and(holds) {
            return Ok(false);
        }
        Ok(rows.leases.remove(key).is_some())
    }

    async fn count_waiting(
        &self,
        dimension: &Dimension,
        epoch: u64,
        weight: u64,
        forget: &[u64],
    ) -> Result<Option<BucketState>, StoreError> {
        let mut rows = self.rows();
        Ok(rows.buckets.get_mut(dimension).map(|row| {
            row.waiting.add(epoch, weight, forget);
            row.clone()
        }))
    }

    async fn renew_lease(
        &self,
        key: &LeaseKey,
        from: UnixMillis,
        to: UnixMillis,
    ) -> Result<bool, StoreError> {
        match self.rows().leases.get_mut(key) {
            Some(row) if row.expires_at == from || row.expires_at == to => {
                row.expires_at = to;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn put_leases(&self, leases: &[LeaseRecord]) -> Result<(), StoreError> {
        let mut rows = self.rows();
        for lease in leases {
            rows.leases.insert(lease.key.clone(), lease.clone());
        }
        Ok(())
    }

    async fn slot_leases(
        &self,
        dimension: &Dimension,
        limit: usize,
    ) -> Result<Vec<LeaseRecord>, StoreError> {
        // Lease keys start with `lease#{dimension}#`: one range of the ordered map, whatever
        // else the store holds.
        let prefix = LeaseKey::new(dimension, "");
        let rows = self.rows();
        let mut leases: Vec<LeaseRecord> = rows
            .leases
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.as_str().starts_with(prefix.as_str()))
            .map(|(_, r)| r)
            .filter(|r| r.slot && r.dimension == *dimension)
            .cloned()
            .collect();
        leases.sort_by_key(|r| r.expires_at);
        leases.truncate(limit);
        Ok(leases)
    }

    async fn scan_leases(&self, filter: &LeaseFilter) -> Result<LeaseScan, StoreError> {
        let rows = self.rows();
        let mut leases: Vec<LeaseRecord> = rows
            .leases
            .values()
            .filter(|r| filter.dimension.as_ref().is_none_or(|d| &r.dimension == d))
            .filter(|r| filter.expired_before.is_none_or(|t| r.expires_at < t))
            .cloned()
            .collect();
        leases.sort_by(|a, b| a.key.cmp(&b.key));
        // Every row here was written through the typed API.
        Ok(LeaseScan {
            leases,
            unreadable: Vec::new(),
        })
    }

    async fn put_bucket(
        &self,
        state: &BucketState,
        expected: Option<&BucketState>,
    ) -> Result<bool, StoreError> {
        StoreError::check_row(state)?;
        let mut rows = self.rows();
        let stored = rows.buckets.get(&state.dimension);
        match (stored, expected) {
            (None, None) => {}
            (Some(stored), Some(expected)) if stored.same_row(expected) => {}
            _ => return Ok(false),
        }
        rows.buckets.insert(state.dimension.clone(), state.clone());
        Ok(true)
    }

    async fn respread_buckets(
        &self,
        expected: &[BucketState],
        rows: &[BucketState],
        moves: &[Option<Commute>],
    ) -> Result<bool, StoreError> {
        for row in rows {
            StoreError::check_row(row)?;
        }
        let mut stored = self.rows();
        let mut next = Vec::with_capacity(rows.len());
        for (k, row) in rows.iter().enumerate() {
            let read = expected.iter().find(|e| e.dimension == row.dimension);
            let now = stored.buckets.get(&row.dimension);
            let written = match (read, now, moves.get(k).and_then(Option::as_ref)) {
                (None, None, _) => row.clone(),
                (Some(read), Some(now), Some(commute)) => {
                    let change = BucketChange::of(read, commute.clone());
                    if now.shards != read.shards || !change.holds(now) {
                        return Ok(false);
                    }
                    let mut after = change.applied(now);
                    after.bucket = row.bucket.clone();
                    after.burst = row.burst;
                    after.shards = row.shards;
                    after.write_ceiling = row.write_ceiling;
                    StoreError::check_row(&after)?;
                    after
                }
                (Some(read), Some(now), None) if now.same_row(read) => row.clone(),
                _ => return Ok(false),
            };
            next.push(written);
        }
        let dropped = expected
            .iter()
            .filter(|e| rows.iter().all(|r| r.dimension != e.dimension));
        for e in dropped {
            if !stored
                .buckets
                .get(&e.dimension)
                .is_some_and(|s| s.same_row(e))
            {
                return Ok(false);
            }
        }
        for e in expected {
            stored.buckets.remove(&e.dimension);
        }
        for r in next {
            stored.buckets.insert(r.dimension.clone(), r);
        }
        Ok(true)
    }

    async fn list_buckets(&self) -> Result<Vec<BucketState>, StoreError> {
        let rows = self.rows();
        let mut all: Vec<_> = rows.buckets.values().cloned().collect();
        all.sort_by(|a, b| a.dimension.cmp(&b.dimension));
        Ok(all)
    }

    async fn delete_bucket(&self, dimension: &Dimension) -> Result<bool, StoreError> {
        Ok(self.rows().buckets.remove(dimension).is_some())
    }

    async fn delete_bucket_as(&self, expected: &BucketState) -> Result<bool, StoreError> {
        let mut rows = self.rows();
        if !rows
            .buckets
            .get(&expected.dimension)
            .is_some_and(|stored| stored.same_row(expected))
        {
            return Ok(false);
        }
        Ok(rows.buckets.remove(&expected.dimension).is_some())
    }
}
