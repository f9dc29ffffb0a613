//! Random and unique identifiers: lease suffixes and write ids.

use rand::RngExt as _;

/// 128 random bits in hex: the unique suffix of a lease's rows.
pub(crate) fn new_unique() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

/// A new [`BucketState::write_id`](crate::BucketState::write_id): distinct within the process (a counter through a
/// bijective mix), and unrelated to other processes' (the counter starts at random).
pub(crate) fn new_write_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let start = *START.get_or_init(rand::random);
    let n = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
    // SplitMix64's finalizer: a bijection, so distinct counters give distinct ids.
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_ids_never_repeat_within_a_process() {
        let ids: std::collections::HashSet<u64> = (0..100_000).map(|_| new_write_id()).collect();
        assert_eq!(ids.len(), 100_000);
    }
}
