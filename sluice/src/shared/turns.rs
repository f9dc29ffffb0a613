//! Turns on a dimension: this client's shadow acquires of one dimension take their turn,
//! so they never race each other's conditional writes (other processes still may).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::dimension::Dimension;

/// One async lock per dimension, made on first use.
#[derive(Debug, Default)]
pub(crate) struct Turns(Mutex<HashMap<Dimension, Arc<tokio::sync::Mutex<()>>>>);

impl Turns {
    /// Waits for `dimension`'s turn; it lasts as long as the guard.
    pub(crate) async fn take(&self, dimension: &Dimension) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(dimension.clone())
            .or_default()
            .clone();
        lock.lock_owned().await
    }
}
