//! The storage abstraction: the few conditional operations the acquisition protocol needs.
//!
//! A `Store` keeps bucket rows and lease rows. Its operations map one-to-one onto
//! DynamoDB's: a consistent read of bucket rows (`BatchGetItem`/`GetItem`), a
//! `BucketChange` (one `UpdateItem` that adds to the row), one atomic conditional
//! `Commit` (`TransactWriteItems`, or a single conditional write when it touches one
//! row), unconditional batch writes of new lease rows and deletes of lease rows that give
//! nothing back (`BatchWriteItem`), a read or scan of lease rows, a lookup of the leases
//! holding a dimension's slots (a secondary index), and bucket administration. The
//! protocols themselves (refill, costs, retries, RetryIn) live above the store, in the
//! client's protocols (see ARCHITECTURE.md), so every store gives the same answers.
//!
//! A grant, a give-back or a charge is a `BucketChange`: an addition to the stored
//! tokens on conditions that make it right whatever other writers did since it was
//! computed, so that many processes writing one row do not make each other's writes fail.
//! Rarer writes (a definition, a vendor's report, healing, the seed's protocol) are a
//! `BucketWrite`, conditioned on the whole row it was computed from
//! (`BucketWrite::expected`), not only on its version: versions repeat when a bucket is
//! deleted and created again, or re-seeded by another tool, and a write computed from the
//! old row must then fail.

#[cfg(feature = "dynamodb")]
mod dynamo;
mod memory;

#[cfg(feature = "dynamodb")]
pub use dynamo::{DynamoStats, DynamoStore, SLOTS_INDEX, TTL_GRACE_SECS};
#[cfg(feature = "fuzzing")]
pub(crate) use dynamo::{bucket_item, bucket_state, lease_item, lease_record};
pub use memory::MemoryStore;
mod error;
mod lease;
mod write;

pub use error::StoreError;
pub use lease::{LeaseFilter, LeaseKey, LeaseRecord};

/// Exported with the `unstable-store` feature, crate-private without it: what a store of
/// one's own implements, and the rows it keeps. Without the feature, `Store` cannot be
/// named outside sluice, so the stores are the two it ships; with it, these types may
/// change in any release.
macro_rules! unstable_store {
    ($($tree:tt)*) => {
        #[cfg(feature = "unstable-store")]
        #[cfg_attr(docsrs, doc(cfg(feature = "unstable-store")))]
        pub use $($tree)*;
        #[cfg(not(feature = "unstable-store"))]
        #[allow(unused_imports)]
        pub(crate) use $($tree)*;
    };
}

unstable_store!(error::BoxError);
unstable_store!(lease::LeaseScan);
unstable_store!(write::{
    BucketChange, BucketWrite, ChangeError, Commit, CommitError, ConditionFailure, LeaseWrite,
});
unstable_store!(crate::bucket::commute::{Commute, Condition, TokensOp});
unstable_store!(crate::bucket::definition::MAX_VERSION);
unstable_store!(crate::bucket::mode::{LedgerChange, ShadowLedger});
unstable_store!(crate::bucket::recent::{RECENT_WRITES, RecentWrites});
unstable_store!(crate::bucket::refill::{Level, RefillCarry, refill});
unstable_store!(crate::bucket::state::Take);
unstable_store!(crate::bucket::waiting::Waiting);
pub(crate) use write::WriteProbe;

mod contract;
unstable_store!(contract::Store);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dimension::Dimension;

    #[test]
    fn lease_keys_carry_dimension_and_unique_suffix() {
        let d = Dimension::new("openai#rpm").unwrap();
        let k = LeaseKey::new(&d, "a3f8c910");
        assert_eq!(k.as_str(), "lease#openai#rpm#a3f8c910");
        assert_eq!(k.unique(), "a3f8c910");
        assert_eq!(LeaseKey::parse("lease#openai#rpm#a3f8c910"), Some(k));
        assert_eq!(LeaseKey::parse("openai#rpm"), None);
        assert_eq!(LeaseKey::parse("lease#openai#a3f8"), None);
    }
}
