//! The conditional writes of a [`Commit`], and why one did not apply.

use crate::bucket::{Bucket, BucketState, Commute, LedgerChange, Level, RefillCarry, WriteOutcome};
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::tokens::Tokens;

use super::{LeaseKey, LeaseRecord, StoreError};

/// One bucket row's part of a [`Commit`]: set the new tokens and refill timestamp, on
/// condition that the stored row is still exactly `expected`, the row the write was
/// computed from. The stored version becomes `expected.version + 1`, and the row's
/// [`write_id`](BucketState::write_id) this write's own.
///
/// What "exactly" means is the store's to check: the in-memory store compares the whole
/// row; DynamoDB compares the version and the write id, or, for a row no sluice write has
/// touched, the version, tokens, refill timestamp and definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketWrite {
    /// The row as the writer saw it.
    pub expected: BucketState,
    /// The new token count.
    pub tokens: Tokens,
    /// The new refill timestamp.
    pub last_refill_at: UnixMillis,
    /// What refill had earned by `last_refill_at` beyond `tokens` (see
    /// [`RefillCarry`](crate::RefillCarry)).
    pub refill_carry: RefillCarry,
    /// The id this write stamps on the row.
    pub write_id: u64,
    /// When the write was made, by this host's clock: the time the row lists it under
    /// (see [`RecentWrites`](crate::RecentWrites)).
    pub written_at: UnixMillis,
    /// The row's [`burst`](BucketState::burst) after the write (the expected row's unless
    /// the write learns a new one from the vendor).
    pub burst: Option<Tokens>,
    /// The row's [`shadow`](BucketState::shadow) ledger after the write (the expected
    /// row's unless a shadow acquire writes it).
    pub shadow: crate::bucket::ShadowLedger,
}

impl BucketWrite {
    /// A write of the level `to` (tokens, refill timestamp and carry) over the row
    /// `expected`, as computed from it ([`BucketState::refilled`],
    /// [`restored`](BucketState::restored), [`charged`](BucketState::charged), …).
    pub fn new(expected: BucketState, to: Level) -> Self {
        BucketWrite {
            burst: expected.burst,
            shadow: expected.shadow,
            expected,
            tokens: to.tokens,
            last_refill_at: to.last_refill_at,
            refill_carry: to.carry,
            write_id: crate::ids::new_write_id(),
            written_at: crate::clock::Clock::now(&crate::clock::SystemClock),
        }
    }

    /// This write, also setting the row's [`burst`](BucketState::burst).
    pub fn with_burst(mut self, burst: Option<Tokens>) -> Self {
        self.burst = burst;
        self
    }

    /// This write, also setting the row's [`shadow`](BucketState::shadow) ledger.
    pub fn with_shadow(mut self, shadow: crate::bucket::ShadowLedger) -> Self {
        self.shadow = shadow;
        self
    }

    /// The bucket's dimension.
    pub fn dimension(&self) -> &Dimension {
        &self.expected.dimension
    }

    /// The version the row gets, or `None` when the expected one is already at
    /// [`MAX_VERSION`](crate::bucket::MAX_VERSION) (a store refuses such a write).
    pub fn next_version(&self) -> Option<u64> {
        self.expected
            .version
            .checked_add(1)
            .filter(|v| *v <= crate::bucket::MAX_VERSION)
    }

    /// Checks that the row this write leaves is one a store may keep (the definition is the
    /// expected row's): its version, tokens and refill timestamp within bounds.
    pub fn validate(&self) -> Result<(), crate::bucket::BucketError> {
        use crate::bucket::BucketError;
        if self.next_version().is_none() {
            return Err(BucketError::Version(
                self.expected.version.saturating_add(1),
            ));
        }
        if !self.tokens.is_within_bounds() {
            return Err(BucketError::Tokens(self.tokens));
        }
        if !crate::bucket::timestamp_in_range(self.last_refill_at) {
            return Err(BucketError::RefillTimestamp(self.last_refill_at));
        }
        Ok(())
    }

    /// The row as it stands once this write is applied.
    pub fn after(&self) -> BucketState {
        BucketState {
            tokens: self.tokens,
            last_refill_at: self.last_refill_at,
            refill_carry: self.refill_carry,
            herd_at: None,
            version: self.expected.version.saturating_add(1),
            write_id: Some(self.write_id),
            recent_writes: self
                .expected
                .recent_after(self.write_id, self.last_refill_at),
            burst: self.burst,
            shadow: self.shadow,
            ..self.expected.clone()
        }
    }

    /// The condition `stored` fails for this write, if any: a different row.
    pub fn failure(&self, stored: Option<&BucketState>) -> Option<ConditionFailure> {
        match stored {
            Some(row) if row.same_row(&self.expected) => None,
            current => Some(ConditionFailure::BucketChanged {
                dimension: self.dimension().clone(),
                current: current.cloned().map(Box::new),
            }),
        }
    }
}

/// What a reader of a bucket row needs to learn whether a [`BucketWrite`] whose answer was
/// lost applied (see [`BucketWrite::probe`]).
#[derive(Debug, Clone)]
pub(crate) struct WriteProbe {
    /// The bucket's dimension.
    pub(crate) dimension: Dimension,
    write_id: u64,
    /// The version the write gives the row.
    version: u64,
    /// When it was made.
    at: UnixMillis,
}

impl WriteProbe {
    /// What became of the write, judged from `row`, read after it.
    pub(crate) fn outcome(&self, row: &BucketState) -> WriteOutcome {
        if row.wrote(self.write_id) {
            return WriteOutcome::Applied;
        }
        row.outcome_of(self.write_id, self.version, self.at)
    }
}

impl BucketWrite {
    /// What tells whether this write applied, once its answer is lost.
    pub(crate) fn probe(&self) -> WriteProbe {
        WriteProbe {
            dimension: self.dimension().clone(),
            write_id: self.write_id,
            version: self.expected.version.saturating_add(1),
            at: self.written_at,
        }
    }
}

/// A change to one bucket row that commutes with other writers' changes (see
/// [`Commute`]): applied to the row as it stands, when the row satisfies the change's
/// conditions and still has the definition the writer computed it from. Every change adds
/// one to the version (so the seed's version-conditioned writes see it) and leaves the
/// write id and recent writes as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketChange {
    /// The bucket's dimension.
    pub dimension: Dimension,
    /// The bucket's definition as the writer knows it.
    pub bucket: Bucket,
    /// The vendor's learned burst as the writer knows it.
    pub burst: Option<Tokens>,
    /// What it does, and on which conditions.
    pub commute: Commute,
    /// What it does to the row's shadow ledger (a shadow take's; nothing for others).
    pub ledger: LedgerChange,
    /// When there may be no row (a key's under a [keyed](Bucket::keyed) bucket, whose
    /// first write creates it), the instant a missing row is the bucket full at: the change
    /// then applies to that row ([`BucketChange::created`]), whatever its conditions, and
    /// the store creates it. `None`: a missing row fails the change.
    pub creates: Option<UnixMillis>,
}

impl BucketChange {
    /// The change `commute`, computed from `row`.
    pub fn of(row: &BucketState, commute: Commute) -> Self {
        BucketChange {
            dimension: row.dimension.clone(),
            bucket: row.bucket.clone(),
            burst: row.burst,
            commute,
            ledger: LedgerChange::default(),
            creates: None,
        }
    }

    /// The change with `ledger` as what it does to the row's shadow ledger.
    pub fn with_ledger(self, ledger: LedgerChange) -> Self {
        BucketChange { ledger, ..self }
    }

    /// The change, creating the row full as of `at` when there is none (see
    /// [`creates`](Self::creates)).
    pub fn creating(self, at: UnixMillis) -> Self {
        BucketChange {
            creates: Some(at),
            ..self
        }
    }

    /// The row a change that [`creates`](Self::creates) applies to when there is none: the
    /// bucket full at that instant, at the first version of a bucket created then.
    pub fn created(&self) -> Option<BucketState> {
        let at = self.creates?;
        let mut row = BucketState::full(self.dimension.clone(), self.bucket.clone(), at);
        row.version = crate::bucket::first_version(at);
        Some(row)
    }

    /// Whether `stored` satisfies the change's conditions and has its definition.
    pub fn holds(&self, stored: &BucketState) -> bool {
        stored.bucket == self.bucket
            && stored.burst == self.burst
            && stored.version < crate::bucket::MAX_VERSION
            && self.commute.holds(stored)
            && self.ledger.holds(&stored.shadow)
    }

    /// `stored` once the change is applied to it.
    pub fn applied(&self, stored: &BucketState) -> BucketState {
        let mut after = stored.clone();
        after.set_level(self.commute.applied(stored));
        after.herd_at = self.commute.herd_after(stored);
        after.shadow = self.ledger.applied(&stored.shadow);
        after.version = stored.version.saturating_add(1);
        after
    }

    /// Checks that the row the change leaves within bounds.
    pub fn validate(&self, stored: &BucketState) -> Result<(), crate::bucket::BucketError> {
        self.applied(stored).validate()
    }
}

/// Why a [`BucketChange`] did not apply.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// A condition did not hold; nothing was written. The row as it stands (`None`: there
    /// is no bucket).
    #[error("change condition failed")]
    Condition(Option<Box<BucketState>>),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One lease row's part of a [`Commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseWrite {
    /// Create the row, on condition that it does not exist.
    Create(LeaseRecord),
    /// Delete the row, on condition that it exists.
    Delete(LeaseKey),
    /// Change the row's cost, on condition that it exists.
    SetCost {
        /// The row's key.
        key: LeaseKey,
        /// The new cost.
        cost: Tokens,
    },
}

impl LeaseWrite {
    /// The key of the row this write touches.
    pub fn key(&self) -> &LeaseKey {
        match self {
            LeaseWrite::Create(r) => &r.key,
            LeaseWrite::Delete(k) | LeaseWrite::SetCost { key: k, .. } => k,
        }
    }
}

/// An all-or-nothing set of conditional writes: every condition holds and every write is
/// applied, or nothing changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Commit {
    /// Bucket rows to update.
    pub buckets: Vec<BucketWrite>,
    /// Lease rows to create, delete or change.
    pub leases: Vec<LeaseWrite>,
}

impl Commit {
    /// The number of rows the commit touches.
    pub fn len(&self) -> usize {
        self.buckets.len() + self.leases.len()
    }

    /// Whether the commit touches nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The condition of a [`Commit`] that did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConditionFailure {
    /// The bucket's version changed (another writer won) or the bucket is gone.
    BucketChanged {
        /// The bucket's dimension.
        dimension: Dimension,
        /// The row as it stands now, when the store returns it (`None`: gone, or unknown).
        current: Option<Box<BucketState>>,
    },
    /// A lease row to create already exists.
    LeaseExists(LeaseKey),
    /// A lease row to delete or change no longer exists.
    LeaseMissing(LeaseKey),
}

/// Why a [`Commit`] was not applied.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// A condition did not hold; nothing was written.
    #[error("commit condition failed: {0:?}")]
    Condition(ConditionFailure),
    /// The store refused the write because another transaction on the same rows was in
    /// progress (DynamoDB's `TransactionConflict`); nothing was written, retrying may work.
    #[error("another transaction on the same rows was in progress")]
    TransactionConflict,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
