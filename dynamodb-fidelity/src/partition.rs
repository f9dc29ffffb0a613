//! Where an item's throughput comes from: its partition, or a partition of its own.
//!
//! Real DynamoDB hashes each item's partition key onto a range of a hash space split among
//! the table's physical partitions, and the partition, not the item, has the 1,000 write
//! and 3,000 read units a second. Items of one partition share them, until adaptive
//! capacity moves a hot item onto a partition of its own. Without a partition count the
//! proxy gives every item its own (as if the table had a partition per item).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::item::ItemId;

/// A source of throughput: one bucket for writes and one for reads are kept per unit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Unit {
    /// One item alone: every item when partitions are not modelled, or an isolated one.
    Item(ItemId),
    /// A partition of a table: the items whose key hashes into its range.
    Partition { table: String, index: u32 },
}

/// How a table's items are laid onto partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Layout {
    /// How many partitions each table has; `None`: every item is a partition.
    pub(crate) partitions: Option<u32>,
    /// How long an item must stay hot before it gets a partition of its own; `None`:
    /// never.
    pub(crate) isolate_after: Option<Duration>,
}

impl Layout {
    /// The partition `id` hashes onto: its share of the hash space, as DynamoDB's key
    /// ranges are, so that `n` partitions split it evenly.
    pub(crate) fn unit(&self, id: &ItemId) -> Unit {
        match self.partitions {
            None => Unit::Item(id.clone()),
            Some(n) => {
                let hash = key_hash(id.partition_key().as_bytes());
                let index = ((u128::from(hash) * u128::from(n)) >> 64) as u32;
                Unit::Partition {
                    table: id.table().to_owned(),
                    index,
                }
            }
        }
    }
}

/// A 64-bit hash of a key's text, stable across runs and platforms (FNV-1a, then mixed
/// so that keys differing in their last byte land far apart).
fn key_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// An item's heat: whether it has taken at least half its partition's ceiling in every
/// second for a while.
#[derive(Debug, Clone, Copy)]
struct Heat {
    /// The second being counted and what the item took in it (thousandths of a unit).
    second: Instant,
    taken: u64,
    /// Since when every counted second was hot.
    hot_since: Option<Instant>,
}

/// Which items adaptive capacity has moved to partitions of their own, and the heat that
/// decides it.
#[derive(Debug, Default)]
pub(crate) struct Isolation {
    heat: HashMap<ItemId, Heat>,
    isolated: HashMap<ItemId, Instant>,
}

const SECOND: Duration = Duration::from_secs(1);

impl Isolation {
    /// Whether `id` has a partition of its own.
    pub(crate) fn is_isolated(&self, id: &ItemId) -> bool {
        self.isolated.contains_key(id)
    }

    /// `id` took `milli_units` at `now`, on a partition whose ceiling is `ceiling_milli`
    /// thousandths of a unit a second. An item that took at least half of it in each
    /// second for `after` (and in the second it is in) is isolated from then on: it is
    /// the partition's main load, and a partition of its own is what adaptive capacity
    /// gives it.
    pub(crate) fn note(
        &mut self,
        id: &ItemId,
        milli_units: u64,
        ceiling_milli: u64,
        after: Duration,
        now: Instant,
    ) {
        if self.isolated.contains_key(id) {
            return;
        }
        let half = ceiling_milli / 2;
        let heat = self.heat.entry(id.clone()).or_insert(Heat {
            second: now,
            taken: 0,
            hot_since: None,
        });
        let elapsed = now.saturating_duration_since(heat.second);
        if elapsed >= SECOND {
            let was_hot = heat.taken >= half;
            // A second with nothing taken at all breaks a hot run.
            let gap = elapsed >= 2 * SECOND;
            heat.hot_since = match (was_hot && !gap, heat.hot_since) {
                (true, Some(since)) => Some(since),
                (true, None) => Some(heat.second),
                (false, _) => None,
            };
            heat.second = now;
            heat.taken = 0;
        }
        heat.taken += milli_units;
        let hot_now = heat.taken >= half;
        if let Some(since) = heat.hot_since
            && hot_now
            && now.saturating_duration_since(since) >= after
        {
            tracing::info!(item = %id, "adaptive capacity: the item gets a partition of its own");
            self.heat.remove(id);
            self.isolated.insert(id.clone(), now);
        }
    }

    /// Forgets every item of `table` (deleted or created again).
    pub(crate) fn forget_table(&mut self, table: &str) {
        self.heat.retain(|id, _| !id.of_table(table));
        self.isolated.retain(|id, _| !id.of_table(table));
    }

    /// Forgets everything.
    pub(crate) fn clear(&mut self) {
        self.heat.clear();
        self.isolated.clear();
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::item::KeySchema;

    fn id(table: &str, key: &str) -> ItemId {
        let schema = KeySchema::from_description(&json!({
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"},
                          {"AttributeName": "sk", "KeyType": "RANGE"}]
        }))
        .unwrap();
        let item = json!({"pk": {"S": key}, "sk": {"S": "x"}});
        schema.item_id(table, item.as_object().unwrap()).unwrap()
    }

    #[test]
    fn keys_spread_evenly_over_the_partitions_and_stay_where_they_hashed() {
        let layout = Layout {
            partitions: Some(4),
            isolate_after: None,
        };
        let mut counts = [0u32; 4];
        for k in 0..4000 {
            let Unit::Partition { index, .. } = layout.unit(&id("t", &format!("k{k}"))) else {
                panic!("a partition is expected");
            };
            counts[index as usize] += 1;
        }
        // 1,000 expected in each; a fair hash stays well within 10%.
        assert!(
            counts.iter().all(|&c| (900..=1100).contains(&c)),
            "{counts:?}"
        );
        assert_eq!(layout.unit(&id("t", "a")), layout.unit(&id("t", "a")));
        // The partition key alone places an item (the sort key does not).
        let schema = KeySchema::from_description(&json!({
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"},
                          {"AttributeName": "sk", "KeyType": "RANGE"}]
        }))
        .unwrap();
        let other_sort = json!({"pk": {"S": "a"}, "sk": {"S": "y"}});
        let other = schema
            .item_id("t", other_sort.as_object().unwrap())
            .unwrap();
        assert_eq!(layout.unit(&other), layout.unit(&id("t", "a")));
        // Another table's partitions are its own.
        assert_ne!(layout.unit(&id("u", "a")), layout.unit(&id("t", "a")));
        // Without a partition count every item is its own unit.
        assert_eq!(
            Layout::default().unit(&id("t", "a")),
            Unit::Item(id("t", "a"))
        );
    }

    #[test]
    fn an_item_hot_for_long_enough_is_isolated_and_a_cool_second_starts_over() {
        let t0 = Instant::now();
        let ceiling = 1_000_000; // 1,000 units a second, in thousandths
        let after = Duration::from_secs(3);
        let hot = id("t", "hot");
        let mut iso = Isolation::default();
        // Hot (600 units) in seconds 0 and 1, cool (100) in second 2: not isolated.
        for s in 0..3u64 {
            let taken = if s == 2 { 100_000 } else { 600_000 };
            iso.note(&hot, taken, ceiling, after, t0 + SECOND * s as u32);
        }
        // Hot from second 3 on: isolated once three seconds have passed hot.
        for s in 3..6u64 {
            iso.note(&hot, 600_000, ceiling, after, t0 + SECOND * s as u32);
            assert!(!iso.is_isolated(&hot), "second {s}");
        }
        iso.note(&hot, 600_000, ceiling, after, t0 + SECOND * 6);
        assert!(iso.is_isolated(&hot));
        // An item below half the ceiling is never isolated.
        let warm = id("t", "warm");
        for s in 0..20u64 {
            iso.note(&warm, 499_999, ceiling, after, t0 + SECOND * s as u32);
        }
        assert!(!iso.is_isolated(&warm));
        iso.forget_table("t");
        assert!(!iso.is_isolated(&hot));
    }
}
