//! Per-item locks: the proxy serializes the writes of each item, so the sizes it knows
//! before and after a write are that write's own. Each lock keeps the item's size as the
//! proxy's last single write of it left it, so that the next one is sized with no read of
//! the item while it is locked: each of those reads was one more upstream call per write,
//! made while the item's other writes queued behind the lock (DynamoDB Local then spent
//! about as much on the proxy's reads as on the writes measured, and one item's writes
//! were capped by two round trips each, which real DynamoDB does not do).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

use crate::item::ItemId;

/// The lock of one item, and its size in bytes as the proxy last knew it (`None`: not
/// known, read it).
type ItemLock = Arc<tokio::sync::Mutex<Option<u64>>>;

/// One async lock per item ever written.
#[derive(Debug, Default)]
pub(crate) struct Locks {
    items: Mutex<HashMap<ItemId, ItemLock>>,
}

/// Locks held, in the items' order; dropped, they are released.
#[derive(Debug)]
pub(crate) struct Locked {
    guards: Vec<(ItemId, OwnedMutexGuard<Option<u64>>)>,
}

impl Locked {
    /// The size of `id` as the proxy's last single write of it left it, if known (and
    /// `id` is locked here).
    pub(crate) fn size(&self, id: &ItemId) -> Option<u64> {
        self.guards
            .iter()
            .find(|(held, _)| held == id)
            .and_then(|(_, size)| **size)
    }

    /// Notes the size `id` has now (`None`: not known, as after a write whose answer was
    /// lost, or one that changed it by a rule the proxy does not evaluate).
    pub(crate) fn set_size(&mut self, id: &ItemId, size: Option<u64>) {
        if let Some((_, known)) = self.guards.iter_mut().find(|(held, _)| held == id) {
            **known = size;
        }
    }

    /// Forgets the size of every item locked here: a batch or a transaction writes them
    /// and sizes them by reads of its own.
    pub(crate) fn forget_sizes(&mut self) {
        for (_, known) in &mut self.guards {
            **known = None;
        }
    }
}

impl Locks {
    fn of(&self, id: &ItemId) -> ItemLock {
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
            guards.push((id.clone(), self.of(id).lock_owned().await));
        }
        Locked { guards }
    }

    /// Whether a write of `id` is in flight now.
    pub(crate) fn is_locked(&self, id: &ItemId) -> bool {
        self.of(id).try_lock().is_err()
    }
}
