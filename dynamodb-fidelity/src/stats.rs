//! The counters the proxy keeps, per item and in total, as `GET /_fidelity/stats` reports
//! them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Counters of one item, or of all of them.
///
/// Capacity is exact: writes are billed in whole write units and reads in half read units
/// (an eventually consistent read of up to 4 KB costs one half).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ItemStats {
    /// Requests that named the item, whatever became of them. In the totals: every request
    /// on DynamoDB's API that reached the proxy.
    pub requests: u64,
    /// Writes that went through (puts, updates, deletes, batch entries, each item of a
    /// transaction that committed).
    pub successful_writes: u64,
    /// Writes whose condition failed (a single write's `ConditionalCheckFailedException`,
    /// or a transaction item cancelled with `ConditionalCheckFailed`).
    pub failed_conditional_writes: u64,
    /// Write units billed.
    pub write_units: u64,
    /// Read units billed, in halves.
    pub read_half_units: u64,
    /// Writes refused because the item's write capacity was spent.
    pub throttled_writes: u64,
    /// Reads refused because the item's read capacity was spent.
    pub throttled_reads: u64,
    /// Single writes (and batch writes) refused with `TransactionConflictException`
    /// because a transaction held the item.
    pub transaction_conflicts: u64,
    /// Transactions cancelled with reason `TransactionConflict` on this item, because
    /// another transaction (or, for a read transaction, any write) held it.
    pub transactions_cancelled: u64,
    /// The largest size of the item seen, in bytes (as billed: names and values).
    pub largest_item_size: u64,
}

/// A snapshot of the proxy's counters, as `GET /_fidelity/stats` serves it:
///
/// ```json
/// {"totals": {"requests": 2, "successful_writes": 1, "write_units": 2, …},
///  "items": {"my-table/some-key": {"requests": 2, "successful_writes": 1, …}}}
/// ```
///
/// Items are named `<table>/<partition key>` or `<table>/<partition key>/<sort key>`, each
/// key value as text: a string as is, a number in plain canonical form (`1.5`, never
/// `1.50` or `15E-1`), binary as its base64.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    totals: ItemStats,
    items: BTreeMap<String, ItemStats>,
}

impl Stats {
    pub(crate) fn new(totals: ItemStats, items: BTreeMap<String, ItemStats>) -> Stats {
        Stats { totals, items }
    }

    /// The counters of all items together. Each is the sum of the items' counters, but for
    /// `requests` (every API request) and `read_half_units`, which also holds the minimum
    /// charge of a Query or Scan that returned no item.
    pub fn totals(&self) -> &ItemStats {
        &self.totals
    }

    /// The counters of the item of `table` whose key is `key` (`<partition>` or
    /// `<partition>/<sort>`), if a request has named it.
    pub fn item(&self, table: &str, key: &str) -> Option<&ItemStats> {
        self.items.get(&format!("{table}/{key}"))
    }

    /// Every item seen, by name (`<table>/<key>`), in order.
    pub fn items(&self) -> impl Iterator<Item = (&str, &ItemStats)> {
        self.items
            .iter()
            .map(|(name, stats)| (name.as_str(), stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_read_back_from_their_json() {
        let mut items = BTreeMap::new();
        items.insert(
            "t/a".to_owned(),
            ItemStats {
                requests: 2,
                write_units: 3,
                ..ItemStats::default()
            },
        );
        let stats = Stats::new(ItemStats::default(), items);
        let json = serde_json::to_string(&stats).unwrap();
        assert!(json.contains(r#""items":{"t/a":{"requests":2,"#), "{json}");
        let back: Stats = serde_json::from_str(&json).unwrap();
        assert_eq!(back, stats);
        assert_eq!(back.item("t", "a").unwrap().write_units, 3);
        assert_eq!(back.item("t", "b"), None);
    }
}
