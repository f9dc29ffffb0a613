//! Per-item locks: the proxy serializes the writes of each item, so the sizes (and index
//! entries) it knows before and after a write are that write's own. Each lock keeps the
//! item's shape (its size and index entries) as the proxy's last single write of it left it, so that the next one is sized with no read of
//! the item while it is locked: each of those reads was one more upstream call per write,
//! made while the item's other writes queued behind the lock (DynamoDB Local then spent
//! about as much on the proxy's reads as on the writes measured, and one item's writes
//! were capped by two round trips each, which real DynamoDB does not do).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

use crate::item::{ItemId, Shape};

/// The lock of one item, and its shape as the proxy last knew it, with the caller
/// scope it is known in (`None`: not known, read it). DynamoDB Local keeps one database
/// per scope (access key and region), so an item of one table and key may be two items.
type ItemLock = Arc<tokio::sync::Mutex<Known>>;

/// An item's shape and the caller scope it is known in, if known.
type Known = Option<(String, Shape)>;

/// One async lock per item ever written.
#[derive(Debug, Default)]
pub(crate) struct Locks {
    items: Mutex<HashMap<ItemId, ItemLock>>,
}

/// Locks held, in the items' order; dropped, they are released.
#[derive(Debug)]
pub(crate) struct Locked {
    guards: Vec<(ItemId, OwnedMutexGuard<Known>)>,
}

impl Locked {
    /// The shape of `id` in `scope` as the proxy's last single write of it left it, if
    /// known (and `id` is locked here).
    pub(crate) fn shape(&self, id: &ItemId, scope: &str) -> Option<Shape> {
        self.guards
            .iter()
            .find(|(held, _)| held == id)
            .and_then(|(_, known)| known.as_ref())
            .and_then(|(known_in, shape)| (known_in == scope).then(|| shape.clone()))
    }

    /// Notes the shape `id` has now in `scope` (`None`: not known, as after a write whose
    /// answer was lost, or a read of the item that failed).
    pub(crate) fn set_shape(&mut self, id: &ItemId, scope: &str, shape: Option<Shape>) {
        if let Some((_, known)) = self.guards.iter_mut().find(|(held, _)| held == id) {
            **known = shape.map(|shape| (scope.to_owned(), shape));
        }
    }

    /// Forgets the shape of every item locked here: a batch or a transaction writes them
    /// and sizes them by reads of its own.
    pub(crate) fn forget_shapes(&mut self) {
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

    /// Forgets every item of `table`, their sizes with them: the table is being deleted
    /// or created, and its items may come back as others. A write in flight keeps the lock
    /// it holds.
    pub(crate) fn forget_table(&self, table: &str) {
        self.items
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| id.table() != table);
    }

    /// Whether a write of `id` is in flight now.
    pub(crate) fn is_locked(&self, id: &ItemId) -> bool {
        self.of(id).try_lock().is_err()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::item::KeySchema;

    fn id(table: &str, key: &str) -> ItemId {
        let schema = KeySchema::from_description(&json!({
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}]
        }))
        .unwrap();
        let item = json!({"pk": {"S": key}});
        schema.item_id(table, item.as_object().unwrap()).unwrap()
    }

    fn sized(size: u64) -> Shape {
        Shape {
            size,
            index: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_shape_is_known_in_the_scope_that_wrote_it_until_forgotten() {
        let locks = Locks::default();
        let (a, b) = (id("t", "a"), id("t", "b"));
        {
            let mut locked = locks.lock_all(&[a.clone(), b.clone()]).await;
            locked.set_shape(&a, "key1/us-east-1", Some(sized(300)));
            locked.set_shape(&b, "key1/us-east-1", Some(sized(20)));
        }
        let mut locked = locks.lock_all(std::slice::from_ref(&a)).await;
        assert_eq!(locked.shape(&a, "key1/us-east-1"), Some(sized(300)));
        // Another scope's database holds another item of the same key.
        assert_eq!(locked.shape(&a, "key2/us-east-1"), None);
        // Not locked here: not known here.
        assert_eq!(locked.shape(&b, "key1/us-east-1"), None);
        locked.set_shape(&a, "key1/us-east-1", None);
        assert_eq!(locked.shape(&a, "key1/us-east-1"), None);
        drop(locked);
        // A table deleted or created forgets its items; other tables keep theirs.
        let c = id("u", "c");
        locks
            .lock_all(std::slice::from_ref(&c))
            .await
            .set_shape(&c, "s", Some(sized(7)));
        locks.forget_table("t");
        let locked = locks.lock_all(&[b.clone(), c.clone()]).await;
        assert_eq!(locked.shape(&b, "key1/us-east-1"), None);
        assert_eq!(locked.shape(&c, "s"), Some(sized(7)));
    }
}
