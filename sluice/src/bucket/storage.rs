//! The storage fields of a [`BucketState`], for a store of one's own (feature
//! `unstable-store`): what the protocols keep in a row beside its tokens.

use super::{BucketState, RecentWrites, RefillCarry, ShadowLedger, Waiting};
use crate::clock::UnixMillis;

impl BucketState {
    /// How many acquires shadow mode would have refused on this row (see
    /// [`Mode::Shadow`](crate::Mode::Shadow)); 0 unless the bucket, or a client of it, ran
    /// in shadow mode.
    pub fn shadow_refused(&self) -> u64 {
        self.shadow.refused
    }

    storage_fn! {
        /// What refill had earned by `last_refill_at` beyond `tokens`: less than a
        /// billionth of a token.
        fn refill_carry(&self) -> RefillCarry {
            self.refill_carry
        }
    }

    storage_fn! {
        /// When the writers of a fleet's start took their first grants from the row full:
        /// the refill timestamp the first of them set, which the others keep; `None` once
        /// any other write moved the refill timestamp.
        fn herd_at(&self) -> Option<UnixMillis> {
            self.herd_at
        }
    }

    storage_fn! {
        /// The id of the sluice write that produced this row; `None` when no sluice write
        /// has touched it since another tool wrote it whole.
        fn write_id(&self) -> Option<u64> {
            self.write_id
        }
    }

    storage_fn! {
        /// Sets the id of the write that produced this row (a store writing a row whole).
        fn set_write_id(&mut self, write_id: Option<u64>) {
            self.write_id = write_id;
        }
    }

    storage_fn! {
        /// The last sluice writes that produced this row and its predecessors.
        fn recent_writes(&self) -> &RecentWrites {
            &self.recent_writes
        }
    }

    storage_fn! {
        /// Sets the last sluice writes that produced this row.
        fn set_recent_writes(&mut self, recent_writes: RecentWrites) {
            self.recent_writes = recent_writes;
        }
    }

    storage_fn! {
        /// The most writes a second one row of the bucket took while the store throttled
        /// it, as the client that spread the bucket learned it; `None` until one learns it.
        fn write_ceiling(&self) -> Option<u32> {
            self.write_ceiling
        }
    }

    storage_fn! {
        /// Sets the write ceiling the rows of the bucket carry.
        fn set_write_ceiling(&mut self, write_ceiling: Option<u32>) {
            self.write_ceiling = write_ceiling;
        }
    }

    storage_fn! {
        /// What shadow acquires left on the row.
        fn shadow(&self) -> &ShadowLedger {
            &self.shadow
        }
    }

    storage_fn! {
        /// The callers waiting for a slot, as the row counts them.
        fn waiting(&self) -> &Waiting {
            &self.waiting
        }
    }

    storage_fn! {
        /// Sets the count of waiting callers the row carries.
        fn set_waiting(&mut self, waiting: Waiting) {
            self.waiting = waiting;
        }
    }
}
