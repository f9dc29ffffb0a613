//! Grants kept for a waiting caller's next ask. An acquire of a caller that waits
//! (`acquire_within`) runs on after the caller stops waiting for it (its deadline passed
//! on a slow store, or it went away); a grant it brings was never handed to anyone, and is
//! kept here: the client's next wait for the same request takes it with no call, rather
//! than the grant being given back and taken again (two more writes on a store already
//! too slow). A grant nobody comes for within [`GRACE`] after its turn is given back.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::acquire::Wanted;
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::lease::Lease;
use crate::priority::Priority;
use crate::tokens::Tokens;

/// How long after its turn (or after it was kept, when that is later) a kept grant waits
/// for its caller before it is given back.
pub(crate) const GRACE: Duration = Duration::from_secs(1);

/// The most grants one client keeps; one beyond them is given back at once.
pub(crate) const MAX_PARKED: usize = 1_024;

/// What a kept grant serves: the same dimensions, costs and priorities.
pub(crate) type Key = Vec<(Dimension, Tokens, u32, Option<Priority>)>;

/// The key of a request.
pub(crate) fn key(wanted: &[Wanted]) -> Key {
    wanted
        .iter()
        .map(|w| {
            (
                w.dimension.clone(),
                w.explicit,
                w.default_calls,
                w.priority.clone(),
            )
        })
        .collect()
}

struct Kept {
    id: u64,
    key: Key,
    ready_at: UnixMillis,
    /// Given back if nobody claimed it by then: [`GRACE`] after its turn, or after it was
    /// kept when that was later.
    until: UnixMillis,
    lease: Lease,
}

/// One client's kept grants (shared by its clones).
#[derive(Default)]
pub(crate) struct Parked {
    kept: Mutex<(u64, Vec<Kept>)>,
}

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked")
            .field("kept", &self.lock().1.len())
            .finish()
    }
}

impl Parked {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Vec<Kept>)> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The kept grant for `key` whose turn comes first, if it comes by `by`; those whose
    /// caller is late past [`GRACE`] at `now` are given back.
    pub(crate) fn claim(&self, key: &Key, by: UnixMillis, now: UnixMillis) -> Option<Lease> {
        let (late, claimed) = {
            let mut kept = self.lock();
            let late = take_where(&mut kept.1, |k| k.until < now);
            let first = kept
                .1
                .iter()
                .enumerate()
                .filter(|(_, k)| k.key == *key && k.ready_at <= by)
                .min_by_key(|(_, k)| k.ready_at)
                .map(|(i, _)| i);
            (late, first.map(|i| kept.1.swap_remove(i).lease))
        };
        // Dropped outside the lock: each gives its grant back.
        drop(late);
        claimed
    }

    /// Keeps `lease`, a grant whose turn is at `ready_at` (`wait` from `now`, zero when it
    /// has come), for `key`; given back if nobody claims it within [`GRACE`] after its
    /// turn. False: no room, and the lease is dropped (given back, as it was never used).
    pub(crate) fn park(
        self: &Arc<Self>,
        key: Key,
        lease: Lease,
        (ready_at, now): (UnixMillis, UnixMillis),
        wait: Duration,
    ) -> bool {
        let id = {
            let mut kept = self.lock();
            if kept.1.len() >= MAX_PARKED {
                drop(kept);
                drop(lease);
                return false;
            }
            kept.0 += 1;
            let id = kept.0;
            kept.1.push(Kept {
                id,
                key,
                ready_at,
                until: ready_at.max(now).saturating_add(GRACE),
                lease,
            });
            id
        };
        let parked: Weak<Parked> = Arc::downgrade(self);
        // Bounded: one per kept grant (at most MAX_PARKED), each over by its turn
        // and the grace after it; it owns nothing but the way back to the grant.
        tokio::spawn(async move {
            tokio::time::sleep(wait.saturating_add(GRACE)).await;
            if let Some(parked) = parked.upgrade() {
                let late = take_where(&mut parked.lock().1, |k| k.id == id);
                if !late.is_empty() {
                    tracing::debug!("a kept grant nobody came for is given back");
                }
                drop(late);
            }
        });
        true
    }

    /// Whether no grant is kept.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().1.is_empty()
    }

    /// How many grants are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().1.len()
    }
}

/// Removes and returns the kept grants `which` selects.
fn take_where(kept: &mut Vec<Kept>, which: impl Fn(&Kept) -> bool) -> Vec<Kept> {
    let mut taken = Vec::new();
    let mut i = 0;
    while i < kept.len() {
        if which(&kept[i]) {
            taken.push(kept.swap_remove(i));
        } else {
            i += 1;
        }
    }
    taken
}
