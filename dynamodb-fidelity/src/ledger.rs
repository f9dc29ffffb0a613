//! The proxy's accounts: every item's buckets and counters, the totals, and which items
//! in-flight transactions hold. One owner, behind one mutex, never held across an await.

use std::collections::HashMap;
use std::time::Instant;

use crate::bucket::{Bucket, Rate};
use crate::item::ItemId;
use crate::stats::{ItemStats, Stats};

/// The per-item ceilings in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) write: Rate,
    pub(crate) read: Rate,
}

/// Reads or writes: each item has a bucket for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    Read,
    Write,
}

/// What became of a billed write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It went through.
    Written,
    /// Its condition failed.
    ConditionFailed,
    /// Nothing was written: a transaction's condition check, or an item of a transaction
    /// cancelled for another item's reason.
    NotWritten,
}

/// An in-flight transaction, to tell its own holds from others'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TxnId(u64);

#[derive(Debug)]
struct Entry {
    stats: ItemStats,
    write: Bucket,
    read: Bucket,
}

/// The accounts.
#[derive(Debug)]
pub(crate) struct Ledger {
    limits: Limits,
    totals: ItemStats,
    items: HashMap<ItemId, Entry>,
    holds: HashMap<ItemId, TxnId>,
    next_txn: u64,
}

impl Ledger {
    pub(crate) fn new(limits: Limits) -> Ledger {
        Ledger {
            limits,
            totals: ItemStats::default(),
            items: HashMap::new(),
            holds: HashMap::new(),
            next_txn: 0,
        }
    }

    fn entry(&mut self, id: &ItemId, now: Instant) -> &mut Entry {
        let limits = self.limits;
        self.items.entry(id.clone()).or_insert_with(|| Entry {
            stats: ItemStats::default(),
            write: Bucket::full(limits.write, now),
            read: Bucket::full(limits.read, now),
        })
    }

    /// Applies `count` to the item's counters and to the totals.
    fn count(&mut self, id: &ItemId, count: impl Fn(&mut ItemStats)) {
        count(&mut self.entry(id, Instant::now()).stats);
        count(&mut self.totals);
    }

    /// One more request on DynamoDB's API.
    pub(crate) fn count_api_request(&mut self) {
        self.totals.requests += 1;
    }

    /// One more request naming `id` (not added to the totals: they count API requests).
    pub(crate) fn count_request(&mut self, id: &ItemId) {
        self.entry(id, Instant::now()).stats.requests += 1;
    }

    /// Whether a transaction other than `except` holds `id`.
    pub(crate) fn is_held(&self, id: &ItemId, except: Option<TxnId>) -> bool {
        self.holds
            .get(id)
            .is_some_and(|holder| Some(*holder) != except)
    }

    /// A new transaction's id.
    pub(crate) fn new_txn(&mut self) -> TxnId {
        self.next_txn += 1;
        TxnId(self.next_txn)
    }

    /// `txn` holds `ids` until [`release`](Self::release).
    pub(crate) fn hold(&mut self, ids: &[ItemId], txn: TxnId) {
        for id in ids {
            self.holds.insert(id.clone(), txn);
        }
    }

    /// `txn` lets go of `ids`.
    pub(crate) fn release(&mut self, ids: &[ItemId], txn: TxnId) {
        for id in ids {
            if self.holds.get(id) == Some(&txn) {
                self.holds.remove(id);
            }
        }
    }

    /// Whether `id` has capacity left in `direction` (more than zero).
    pub(crate) fn has_capacity(&mut self, id: &ItemId, direction: Direction, now: Instant) -> bool {
        let limits = self.limits;
        let entry = self.entry(id, now);
        match direction {
            Direction::Write => entry.write.has_capacity(limits.write, now),
            Direction::Read => entry.read.has_capacity(limits.read, now),
        }
    }

    /// A request refused for want of `direction` capacity on `id`.
    pub(crate) fn count_throttled(&mut self, id: &ItemId, direction: Direction) {
        self.count(id, |s| match direction {
            Direction::Write => s.throttled_writes += 1,
            Direction::Read => s.throttled_reads += 1,
        });
    }

    /// A single write refused because a transaction holds `id`.
    pub(crate) fn count_conflict(&mut self, id: &ItemId) {
        self.count(id, |s| s.transaction_conflicts += 1);
    }

    /// A transaction cancelled because another held `id`.
    pub(crate) fn count_cancelled(&mut self, id: &ItemId) {
        self.count(id, |s| s.transactions_cancelled += 1);
    }

    /// Bills `units` write units to `id` for a write that ended as `outcome`, whose item
    /// was `sizes` (before and after) as far as known.
    pub(crate) fn bill_write(&mut self, id: &ItemId, units: u64, outcome: Outcome, sizes: &[u64]) {
        let now = Instant::now();
        let limits = self.limits;
        self.entry(id, now).write.take(2 * units, limits.write, now);
        let largest = sizes.iter().copied().max().unwrap_or(0);
        self.count(id, |s| {
            s.write_units += units;
            match outcome {
                Outcome::Written => s.successful_writes += 1,
                Outcome::ConditionFailed => s.failed_conditional_writes += 1,
                Outcome::NotWritten => {}
            }
            s.largest_item_size = s.largest_item_size.max(largest);
        });
    }

    /// Bills `half_units` of reading `id`, an item of `size` bytes.
    pub(crate) fn bill_read(&mut self, id: &ItemId, half_units: u64, size: u64) {
        let now = Instant::now();
        let limits = self.limits;
        self.entry(id, now).read.take(half_units, limits.read, now);
        self.count(id, |s| {
            s.read_half_units += half_units;
            s.largest_item_size = s.largest_item_size.max(size);
        });
    }

    /// Bills `half_units` of a read that returned no item (a Query or Scan's minimum).
    pub(crate) fn bill_read_of_nothing(&mut self, half_units: u64) {
        self.totals.read_half_units += half_units;
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> Stats {
        let items = self
            .items
            .iter()
            .map(|(id, entry)| (id.to_string(), entry.stats))
            .collect();
        Stats::new(self.totals, items)
    }

    /// Counters at zero and every bucket full again (holds of in-flight transactions stay).
    pub(crate) fn reset(&mut self) {
        self.totals = ItemStats::default();
        self.items.clear();
    }

    /// New ceilings from now on: buckets keep their level, up to the new burst.
    pub(crate) fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }
}
