//! Per-item locks: the proxy serializes the writes of each item, so the sizes it reads
//! before and after a write are that write's own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

use crate::item::ItemId;

/// One async lock per item ever written.
#[derive(Debug, Default)]
pub(crate) struct Locks {
    items: Mutex<HashMap<ItemId, Arc<tokio::sync::Mutex<()>>>>,
}

/// Locks held; dropped, they are released.
#[derive(Debug)]
pub(crate) struct Locked {
    _guards: Vec<OwnedMutexGuard<()>>,
}

impl Locks {
    fn of(&self, id: &ItemId) -> Arc<tokio::sync::Mutex<()>> {
        self.items
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.clone())
            .or_default()
            .clone()
    }

    /// Locks every item of `ids`, waiting for writes in flight. Always in the items'
    /// order, whoever asks, so that two writers of several items never wait on each other
    /// in a circle.
    pub(crate) async fn lock_all(&self, ids: &[ItemId]) -> Locked {
        let mut sorted: Vec<&ItemId> = ids.iter().collect();
        sorted.sort();
        sorted.dedup();
        let mut guards = Vec::with_capacity(sorted.len());
        for id in sorted {
            guards.push(self.of(id).lock_owned().await);
        }
        Locked { _guards: guards }
    }

    /// Whether a write of `id` is in flight now.
    pub(crate) fn is_locked(&self, id: &ItemId) -> bool {
        self.of(id).try_lock().is_err()
    }
}
