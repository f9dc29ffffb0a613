//! The last sluice writes a bucket row remembers, so that a writer whose answer was lost
//! can learn whether its write applied.

// Public with the `unstable-store` feature (`sluice::store`), crate-private without it.
#![cfg_attr(not(feature = "unstable-store"), allow(unreachable_pub))]

use crate::clock::UnixMillis;

/// How many writes a bucket's row lists at most ([`RecentWrites::writes`]): 16 bytes each
/// on DynamoDB, plus 8 for [`RecentWrites::forgotten`] (136 bytes at most). Only the
/// writes conditioned on the exact row list themselves (a definition, a vendor's report,
/// healing, the seed's protocol): the grants and give-backs that commute with other
/// writers' (see [`Commute`](crate::Commute)) leave the list as it is.
#[cfg_attr(not(feature = "unstable-store"), allow(unreachable_pub))]
pub const RECENT_WRITES: usize = 8;

/// The last sluice writes to a bucket row (see
/// [`BucketState::recent_writes`](super::BucketState::recent_writes)).
///
/// A write whose answer was lost applied if its id is listed. If it is not, it did not
/// apply when it would still be listed: when the row never reached the write's version,
/// when fewer than [`RECENT_WRITES`] writes followed it, or when every write dropped from
/// the list so far was made earlier than it. The last rule settles a write computed from a
/// long-stale copy of the row, which never applied however far the row has moved since.
/// Each write is listed under the time its writer's clock gave it, and
/// [`forgotten`](Self::forgotten) keeps the latest time of those dropped: a write that was
/// dropped is compared with its own time, so clocks that disagree only make the answer
/// "unknown", never wrong.
///
/// ```
/// use sluice::{store::RecentWrites, clock::UnixMillis};
///
/// let recent = RecentWrites::default();
/// assert!(!recent.contains(7));
/// assert_eq!(recent.forgotten, UnixMillis::new(0));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecentWrites {
    /// The listed writes, oldest first: each one's id and when it was made.
    pub writes: Vec<(u64, UnixMillis)>,
    /// The latest time of a write no longer listed (0: none dropped).
    pub forgotten: UnixMillis,
}

impl RecentWrites {
    /// Whether the write `write_id` is listed: it applied.
    pub fn contains(&self, write_id: u64) -> bool {
        self.writes.iter().any(|(id, _)| *id == write_id)
    }

    /// The list after a write `write_id` made at `at`, keeping at most `limit`.
    pub(crate) fn after(&self, write_id: u64, at: UnixMillis, limit: usize) -> RecentWrites {
        let drop = (self.writes.len() + 1).saturating_sub(limit.max(1));
        let forgotten = self.writes[..drop]
            .iter()
            .map(|(_, at)| *at)
            .fold(self.forgotten, UnixMillis::max);
        let mut writes = self.writes[drop..].to_vec();
        writes.push((write_id, at));
        RecentWrites { writes, forgotten }
    }
}
