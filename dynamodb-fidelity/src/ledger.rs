//! The proxy's accounts: every item's counters, the buckets of every partition (or item)
//! and table, the totals, and which items in-flight transactions hold. One owner, behind
//! one mutex, never held across an await.

use std::collections::HashMap;
use std::time::Instant;

use crate::bucket::{Bucket, Rate};
use crate::item::{ItemId, Shape};
use crate::partition::{Isolation, Layout, Unit};
use crate::stats::{ItemStats, Stats};
use crate::table::{TableBudget, TableModel};
use crate::units::write_units;

/// The per-partition (or per-item) ceilings in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) write: Rate,
    pub(crate) read: Rate,
    /// The same, in thousandths of a unit a second (for adaptive capacity's heat).
    pub(crate) write_milli: u64,
    pub(crate) read_milli: u64,
}

/// Which of DynamoDB's limits refused a request: the last part of its throttling reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Limit {
    /// The partition the item is on (`KeyRangeThroughputExceeded`).
    KeyRange,
    /// The table as a whole: a cold table beyond twice its previous peak, or the
    /// per-table account quota (`AccountLimitExceeded`).
    Table,
}

/// A request refused: the table it named and the limit that refused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Throttle {
    pub(crate) table: String,
    pub(crate) limit: Limit,
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

/// A partition's (or an item's) buckets.
#[derive(Debug)]
struct Buckets {
    write: Bucket,
    read: Bucket,
}

/// The accounts.
#[derive(Debug)]
pub(crate) struct Ledger {
    limits: Limits,
    layout: Layout,
    isolation: Isolation,
    table_model: Option<TableModel>,
    totals: ItemStats,
    items: HashMap<ItemId, ItemStats>,
    units: HashMap<Unit, Buckets>,
    tables: HashMap<(String, DirectionKey), TableBudget>,
    /// What each table was warmed to, write and read, in units a second.
    warmth: HashMap<String, (f64, f64)>,
    holds: HashMap<ItemId, TxnId>,
    next_txn: u64,
}

/// A `Direction` as a map key.
type DirectionKey = bool;

fn direction_key(direction: Direction) -> DirectionKey {
    direction == Direction::Write
}

impl Ledger {
    pub(crate) fn new(limits: Limits, layout: Layout, table_model: Option<TableModel>) -> Ledger {
        Ledger {
            limits,
            layout,
            isolation: Isolation::default(),
            table_model,
            totals: ItemStats::default(),
            items: HashMap::new(),
            units: HashMap::new(),
            tables: HashMap::new(),
            warmth: HashMap::new(),
            holds: HashMap::new(),
            next_txn: 0,
        }
    }

    fn stats_of(&mut self, id: &ItemId) -> &mut ItemStats {
        self.items.entry(id.clone()).or_default()
    }

    /// The unit whose throughput `id` uses.
    fn unit(&self, id: &ItemId) -> Unit {
        if self.isolation.is_isolated(id) {
            Unit::Item(id.clone())
        } else {
            self.layout.unit(id)
        }
    }

    fn buckets(&mut self, id: &ItemId, now: Instant) -> &mut Buckets {
        let limits = self.limits;
        let unit = self.unit(id);
        self.units.entry(unit).or_insert_with(|| Buckets {
            write: Bucket::full(limits.write, now),
            read: Bucket::full(limits.read, now),
        })
    }

    /// `id`'s table's budget in `direction`, if tables are modelled.
    fn table_budget(
        &mut self,
        id: &ItemId,
        direction: Direction,
        now: Instant,
    ) -> Option<&mut TableBudget> {
        let model = self.table_model?;
        let (initial, quota) = match direction {
            Direction::Write => (model.initial_write, model.quota_write),
            Direction::Read => (model.initial_read, model.quota_read),
        };
        let warm = self.warmth.get(id.table()).map(|&(w, r)| match direction {
            Direction::Write => w,
            Direction::Read => r,
        });
        let budget = self
            .tables
            .entry((id.table().to_owned(), direction_key(direction)))
            .or_insert_with(|| {
                TableBudget::new(milli(initial), milli(quota), model.peak_window, now)
            });
        if let Some(warm) = warm {
            budget.warm(milli(warm), now);
        }
        Some(budget)
    }

    /// Applies `count` to the item's counters and to the totals.
    fn count(&mut self, id: &ItemId, count: impl Fn(&mut ItemStats)) {
        count(self.stats_of(id));
        count(&mut self.totals);
    }

    /// One more request on DynamoDB's API.
    pub(crate) fn count_api_request(&mut self) {
        self.totals.requests += 1;
    }

    /// One more request naming `id` (not added to the totals: they count API requests).
    pub(crate) fn count_request(&mut self, id: &ItemId) {
        self.stats_of(id).requests += 1;
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

    /// Why a request of `direction` on `id` may not start now, if it may not: its table
    /// or its partition (or its own bucket) has nothing left. Counted as a throttle of
    /// `id`.
    pub(crate) fn throttle(
        &mut self,
        id: &ItemId,
        direction: Direction,
        now: Instant,
    ) -> Option<Throttle> {
        let table_full = self
            .table_budget(id, direction, now)
            .is_some_and(|budget| !budget.has_capacity(now));
        let limit = if table_full {
            Limit::Table
        } else {
            let limits = self.limits;
            let buckets = self.buckets(id, now);
            let has = match direction {
                Direction::Write => buckets.write.has_capacity(limits.write, now),
                Direction::Read => buckets.read.has_capacity(limits.read, now),
            };
            if has {
                return None;
            }
            Limit::KeyRange
        };
        self.count(id, |s| match direction {
            Direction::Write => s.throttled_writes += 1,
            Direction::Read => s.throttled_reads += 1,
        });
        Some(Throttle {
            table: id.table().to_owned(),
            limit,
        })
    }

    /// Takes `half_units` of `direction` from `id`'s partition (or own bucket) and table,
    /// and counts them towards the item's heat.
    fn take(&mut self, id: &ItemId, direction: Direction, half_units: u64, now: Instant) {
        let limits = self.limits;
        let buckets = self.buckets(id, now);
        let ceiling = match direction {
            Direction::Write => {
                buckets.write.take(half_units, limits.write, now);
                limits.write_milli
            }
            Direction::Read => {
                buckets.read.take(half_units, limits.read, now);
                limits.read_milli
            }
        };
        if let Some(budget) = self.table_budget(id, direction, now) {
            budget.take(half_units, now);
        }
        if let (Some(after), Some(_)) = (self.layout.isolate_after, self.layout.partitions) {
            self.isolation
                .note(id, half_units * 500, ceiling, after, now);
        }
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
        self.take(id, Direction::Write, 2 * units, Instant::now());
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

    /// Bills the index writes of a write that changed an item from `before` to `after`:
    /// an entry the item leaves is deleted, one it gains is put, one it keeps is
    /// rewritten (every attribute is projected), each billed by the item's size to its
    /// index key's partition, as DynamoDB bills a global secondary index's writes. Not
    /// counted as writes (no request made them).
    pub(crate) fn bill_index(&mut self, before: &Shape, after: &Shape) {
        for id in &before.index {
            let after_size = if after.index.contains(id) {
                after.size
            } else {
                0
            };
            let units = write_units(before.size, after_size);
            self.bill_write(id, units, Outcome::NotWritten, &[before.size, after_size]);
        }
        for id in after.index.iter().filter(|id| !before.index.contains(id)) {
            let units = write_units(0, after.size);
            self.bill_write(id, units, Outcome::NotWritten, &[after.size]);
        }
    }

    /// Why the index writes a write from `before` to `after` would make may not start
    /// now: an index key's partition has nothing left (DynamoDB throttles the table's
    /// write when an index cannot take it). Counted as throttles of the index entries.
    pub(crate) fn index_throttles(
        &mut self,
        before: &Shape,
        after: &Shape,
        now: Instant,
    ) -> Vec<Throttle> {
        let mut ids: Vec<&ItemId> = before.index.iter().chain(&after.index).collect();
        ids.sort();
        ids.dedup();
        ids.into_iter()
            .filter_map(|id| self.throttle(id, Direction::Write, now))
            .collect()
    }

    /// Bills `half_units` of reading `id`, an item of `size` bytes.
    pub(crate) fn bill_read(&mut self, id: &ItemId, half_units: u64, size: u64) {
        self.take(id, Direction::Read, half_units, Instant::now());
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
            .map(|(id, stats)| (id.to_string(), *stats))
            .collect();
        Stats::new(self.totals, items)
    }

    /// Counters at zero, every bucket full again, every table new and cold and no item
    /// isolated (holds of in-flight transactions stay; so does what tables were warmed
    /// to).
    pub(crate) fn reset(&mut self) {
        self.totals = ItemStats::default();
        self.items.clear();
        self.units.clear();
        self.tables.clear();
        self.isolation.clear();
    }

    /// New ceilings from now on: buckets keep their level, up to the new burst.
    pub(crate) fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// A new layout from now on: every partition starts full, no item isolated.
    pub(crate) fn set_layout(&mut self, layout: Layout) {
        self.layout = layout;
        self.units.clear();
        self.isolation.clear();
    }

    /// `table` was created or deleted: its partitions, budgets and warmth start over.
    pub(crate) fn forget_table(&mut self, table: &str) {
        let of_table = |t: &str| {
            t.strip_prefix(table)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("/index/"))
        };
        self.units.retain(|unit, _| match unit {
            Unit::Item(id) => !id.of_table(table),
            Unit::Partition { table: t, .. } => !of_table(t),
        });
        self.tables.retain(|(t, _), _| !of_table(t));
        self.warmth.remove(table);
        self.isolation.forget_table(table);
    }

    /// `table` was warmed to `write` and `read` units a second (`WarmThroughput`).
    pub(crate) fn warm(&mut self, table: &str, write: f64, read: f64) {
        let entry = self.warmth.entry(table.to_owned()).or_insert((0.0, 0.0));
        entry.0 = entry.0.max(write);
        entry.1 = entry.1.max(read);
    }
}

/// Units a second as thousandths (already checked finite and in range by the config).
#[allow(
    clippy::float_arithmetic,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a checked ceiling becomes the integer the buckets count in"
)]
fn milli(units: f64) -> u64 {
    (units.max(0.0) * 1000.0).round() as u64
}
