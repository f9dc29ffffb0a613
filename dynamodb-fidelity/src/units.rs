//! What each kind of request costs, from item sizes: write units (whole, per 1 KB) and
//! read units counted in halves (per 4 KB; an eventually consistent read costs half).

const WRITE_BLOCK: u64 = 1024;
const READ_BLOCK: u64 = 4096;

/// A write (put, update, delete) that went through: the larger of the item before and
/// after, rounded up to 1 KB, at least one unit.
pub(crate) fn write_units(before: u64, after: u64) -> u64 {
    before.max(after).div_ceil(WRITE_BLOCK).max(1)
}

/// A conditional write whose condition failed: the item as it is (it did not change),
/// rounded up to 1 KB, at least one unit (a missing item costs one).
pub(crate) fn failed_condition_units(before: u64) -> u64 {
    write_units(before, 0)
}

/// A read of one item of `size` bytes (0: missing), in half units: 4 KB blocks, at least
/// one; two halves each if strongly consistent, one if eventually consistent.
pub(crate) fn read_half_units(size: u64, consistent: bool) -> u64 {
    size.div_ceil(READ_BLOCK).max(1) * if consistent { 2 } else { 1 }
}

/// A transactional read of one item: twice a strongly consistent one (prepare and commit).
pub(crate) fn transact_read_half_units(size: u64) -> u64 {
    2 * read_half_units(size, true)
}

/// Query and Scan: the total size of the items, rounded up to 4 KB once.
pub(crate) fn bulk_read_half_units(total: u64, consistent: bool) -> u64 {
    read_half_units(total, consistent)
}

/// Shares `units` among items in proportion to their `sizes` (largest remainder), so the
/// shares add up to `units` exactly. Items of size zero share evenly if all are zero.
pub(crate) fn share(units: u64, sizes: &[u64]) -> Vec<u64> {
    if sizes.is_empty() {
        return Vec::new();
    }
    let weights: Vec<u128> = if sizes.iter().all(|&s| s == 0) {
        vec![1; sizes.len()]
    } else {
        sizes.iter().map(|&s| u128::from(s)).collect()
    };
    let total: u128 = weights.iter().sum();
    let units = u128::from(units);
    let mut shares: Vec<u128> = weights.iter().map(|w| units * w / total).collect();
    let mut left = units - shares.iter().sum::<u128>();
    let mut by_remainder: Vec<usize> = (0..weights.len()).collect();
    by_remainder.sort_by_key(|&i| std::cmp::Reverse(units * weights[i] % total));
    for i in by_remainder {
        if left == 0 {
            break;
        }
        shares[i] += 1;
        left -= 1;
    }
    shares
        .into_iter()
        .map(|s| u64::try_from(s).unwrap_or(u64::MAX))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_round_the_larger_size_up_to_a_kilobyte() {
        assert_eq!(write_units(0, 0), 1);
        assert_eq!(write_units(0, 500), 1);
        assert_eq!(write_units(0, 1024), 1);
        assert_eq!(write_units(0, 1025), 2);
        assert_eq!(write_units(1500, 200), 2);
        assert_eq!(write_units(200, 3000), 3);
    }

    #[test]
    fn a_failed_condition_costs_the_item_as_it_is_and_at_least_one() {
        assert_eq!(failed_condition_units(0), 1);
        assert_eq!(failed_condition_units(2048), 2);
        assert_eq!(failed_condition_units(2049), 3);
    }

    #[test]
    fn reads_round_up_to_four_kilobytes_and_eventual_ones_cost_half() {
        assert_eq!(read_half_units(0, true), 2);
        assert_eq!(read_half_units(0, false), 1);
        assert_eq!(read_half_units(4096, true), 2);
        assert_eq!(read_half_units(4097, true), 4);
        assert_eq!(read_half_units(6500, false), 2);
        assert_eq!(transact_read_half_units(100), 4);
    }

    #[test]
    fn a_query_rounds_its_total_once() {
        // The guide's example: 10 items of 40.8 KB in all cost 44 KB: 11 units.
        assert_eq!(bulk_read_half_units(40_800 * 1024 / 1000, true), 2 * 11);
    }

    #[test]
    fn shares_add_up_and_follow_the_sizes() {
        assert_eq!(share(4, &[100, 100]), vec![2, 2]);
        assert_eq!(share(3, &[100, 100]), vec![2, 1]);
        assert_eq!(share(2, &[3000, 1000]), vec![2, 0]);
        assert_eq!(share(1, &[0, 0, 0]).iter().sum::<u64>(), 1);
        assert_eq!(share(7, &[1, 2, 3, 4]).iter().sum::<u64>(), 7);
        assert!(share(5, &[]).is_empty());
    }
}
