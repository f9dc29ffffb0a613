//! What a client keeps per dimension, bounded: a map that forgets the dimensions used
//! least recently once it holds more than [`MAX_DIMENSIONS_KEPT`], so a client that meets
//! dimension after dimension (per model, per tenant, per key) keeps a bounded memory.

use std::collections::HashMap;

use crate::dimension::Dimension;

/// The most dimensions (or rows of spread buckets) a client keeps anything about in each
/// of its per-dimension maps, the most recently used first; it holds up to twice this
/// many before it forgets the oldest. Forgetting costs a dimension that comes back one
/// read of its row, and what the client had measured of it (heat, a learned ceiling).
pub(crate) const MAX_DIMENSIONS_KEPT: usize = 4_096;

/// A map by dimension that keeps about `limit` entries, the most recently used.
///
/// Each use stamps its entry; past twice the limit, one pass keeps the `limit` most
/// recent (and those `busy` says are in use) and drops the rest: a linear pass every
/// `limit` insertions, so O(1) amortized per insertion.
#[derive(Debug)]
pub(crate) struct Recent<V> {
    map: HashMap<Dimension, (V, u64)>,
    stamp: u64,
    limit: usize,
}

impl<V> Default for Recent<V> {
    fn default() -> Self {
        Recent::with_limit(MAX_DIMENSIONS_KEPT)
    }
}

impl<V> Recent<V> {
    /// An empty map keeping about `limit` entries (at least one).
    pub(crate) fn with_limit(limit: usize) -> Self {
        Recent {
            map: HashMap::new(),
            stamp: 0,
            limit: limit.max(1),
        }
    }

    fn next(&mut self) -> u64 {
        self.stamp += 1;
        self.stamp
    }

    /// The entry of `key`, used now.
    pub(crate) fn get(&mut self, key: &Dimension) -> Option<&V> {
        self.get_mut(key).map(|v| &*v)
    }

    /// The entry of `key`, used now, to change.
    pub(crate) fn get_mut(&mut self, key: &Dimension) -> Option<&mut V> {
        let stamp = self.next();
        self.map.get_mut(key).map(|(v, at)| {
            *at = stamp;
            v
        })
    }

    /// Whether `key` has an entry (not a use).
    #[cfg(test)]
    pub(crate) fn contains_key(&self, key: &Dimension) -> bool {
        self.map.contains_key(key)
    }

    /// Sets `key`'s entry, used now; forgets the least recently used past the bound.
    pub(crate) fn insert(&mut self, key: Dimension, value: V) -> Option<V> {
        self.insert_keeping(key, value, |_| false)
    }

    /// [`insert`](Self::insert), never forgetting an entry `busy` says is in use.
    pub(crate) fn insert_keeping(
        &mut self,
        key: Dimension,
        value: V,
        busy: impl Fn(&V) -> bool,
    ) -> Option<V> {
        let stamp = self.next();
        let old = self.map.insert(key, (value, stamp)).map(|(v, _)| v);
        if old.is_none() && self.map.len() > 2 * self.limit {
            self.forget_oldest(busy);
        }
        old
    }

    /// The entry of `key`, made with `make` if it has none, used now.
    pub(crate) fn get_or_insert_with(
        &mut self,
        key: &Dimension,
        make: impl FnOnce() -> V,
    ) -> &mut V {
        if !self.map.contains_key(key) {
            self.insert(key.clone(), make());
        }
        self.get_mut(key)
            .unwrap_or_else(|| unreachable!("inserted above"))
    }

    /// Removes `key`'s entry.
    pub(crate) fn remove(&mut self, key: &Dimension) -> Option<V> {
        self.map.remove(key).map(|(v, _)| v)
    }

    /// Every entry's value (not a use).
    #[cfg(test)]
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.map.values().map(|(v, _)| v)
    }

    /// Keeps only the entries `keep` says to.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Dimension, &mut V) -> bool) {
        self.map.retain(|k, (v, _)| keep(k, v));
    }

    /// Forgets every entry.
    pub(crate) fn clear(&mut self) {
        self.map.clear();
    }

    /// How many entries it holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Keeps the `limit` most recently used entries, and those in use.
    fn forget_oldest(&mut self, busy: impl Fn(&V) -> bool) {
        let mut stamps: Vec<u64> = self.map.values().map(|(_, at)| *at).collect();
        let cut = stamps.len() - self.limit;
        let (_, oldest_kept, _) = stamps.select_nth_unstable(cut);
        let oldest_kept = *oldest_kept;
        self.map.retain(|_, (v, at)| *at >= oldest_kept || busy(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(i: usize) -> Dimension {
        Dimension::new(&format!("v{i}#rpm")).unwrap()
    }

    #[test]
    fn it_keeps_the_most_recently_used_and_stays_within_twice_its_limit() {
        let mut recent = Recent::with_limit(100);
        for i in 0..10_000 {
            recent.insert(d(i), i);
            // The first dimension is used all along: never forgotten.
            assert_eq!(recent.get(&d(0)), Some(&0));
            assert!(recent.len() <= 200, "{} entries", recent.len());
        }
        assert!(recent.contains_key(&d(9_999)));
        assert!(!recent.contains_key(&d(5_000)));
    }

    #[test]
    fn entries_in_use_are_kept_past_the_limit() {
        let mut recent = Recent::with_limit(10);
        for i in 0..100 {
            recent.insert_keeping(d(i), i, |v| *v < 5);
        }
        for i in 0..5 {
            assert!(recent.contains_key(&d(i)), "{i} was in use");
        }
        assert!(recent.len() <= 25);
    }
}
