//! Turns on a dimension: this client's shadow acquires of one dimension take their turn,
//! so they never race each other's conditional writes (other processes still may). And
//! which buckets this client last saw in shadow, kept when the row itself is forgotten
//! (after a write whose answer was lost): shadow mode holds through a store outage.

use std::sync::{Arc, Mutex, PoisonError};

use crate::dimension::Dimension;
use crate::shared::recent::Recent;

/// One async lock per dimension, made on first use.
#[derive(Debug, Default)]
pub(crate) struct Turns(
    Mutex<Recent<Arc<tokio::sync::Mutex<()>>>>,
    Mutex<Recent<()>>,
);

impl Turns {
    /// Waits for `dimension`'s turn; it lasts as long as the guard.
    pub(crate) async fn take(&self, dimension: &Dimension) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut turns = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            match turns.get(dimension) {
                Some(lock) => lock.clone(),
                None => {
                    let lock = Arc::default();
                    // A turn taken or waited for is never forgotten under its holders.
                    turns.insert_keeping(dimension.clone(), Arc::clone(&lock), |l| {
                        Arc::strong_count(l) > 1
                    });
                    lock
                }
            }
        };
        lock.lock_owned().await
    }

    /// Notes whether `dimension`'s bucket was seen in shadow.
    pub(crate) fn saw(&self, dimension: &Dimension, shadow: bool) {
        let mut seen = self.1.lock().unwrap_or_else(PoisonError::into_inner);
        if shadow {
            seen.insert(dimension.clone(), ());
        } else {
            seen.remove(dimension);
        }
    }

    /// Whether `dimension`'s bucket was last seen in shadow.
    pub(crate) fn was_shadow(&self, dimension: &Dimension) -> bool {
        self.1
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(dimension)
    }
}
