//! A row's throttles teach its ceiling only where the client's own writes of it did not
//! lose races meanwhile, or, on a bucket no refill binds, lost no more than applied.

use super::*;

/// [`ItemCeiling`], where `lost.0` writes of `hot#rpm` in every `lost.1` also fail their
/// condition (lost to another writer: billed, but not counted in the row's version).
#[derive(Debug)]
struct RacedCeiling {
    ceiling: ItemCeiling,
    writes: std::sync::atomic::AtomicU32,
    lost: (u32, u32),
}

impl crate::shared::test_store::Hooks for RacedCeiling {
    fn change(&self, change: &crate::store::BucketChange) -> Result<(), crate::store::ChangeError> {
        self.ceiling.change(change)?;
        let n = self
            .writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if change.dimension.as_str() == "hot#rpm" && n % self.lost.1 < self.lost.0 {
            return Err(crate::store::ChangeError::Condition(None));
        }
        Ok(())
    }
}

/// A client of a store that throttles `hot#rpm` past 20 writes in a second and fails
/// `lost.0` of every `lost.1` of its writes, on a bucket there refilling `per_second`,
/// told a ceiling of 1,000 writes a second (as DynamoDB's store tells it); the row after
/// 400 acquires 10 ms apart, and how many the store throttled.
async fn hammered_losing(lost: (u32, u32), per_second: u64) -> (crate::BucketState, u32) {
    use crate::clock::ManualClock;
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let store = Arc::new(crate::shared::test_store::Hooked::new(RacedCeiling {
        ceiling: ItemCeiling::new(&clock, 20),
        writes: std::sync::atomic::AtomicU32::default(),
        lost,
    }));
    let sluice = client_of(store, &clock, Some(1_000));
    let bucket =
        crate::Bucket::requests(crate::RefillRate::per_second(per_second)).with_capacity(1_000_000);
    sluice.put_bucket("hot#rpm", bucket).await.unwrap();
    let throttled = hammer(&sluice, &clock, Duration::ZERO).await;
    (sluice.bucket("hot#rpm").await.unwrap().unwrap(), throttled)
}

#[tokio::test]
async fn throttles_of_a_row_whose_writes_lose_races_teach_no_ceiling() {
    // As in `a_bucket_whose_row_the_store_throttles_spreads_with_no_ceiling_told`, which
    // spreads it; but what the row took while throttled is not what it could take: two
    // writes in three lost their race.
    let (row, throttled) = hammered_losing((2, 3), 1_000_000).await;
    assert!(throttled > 0, "the store throttled the row");
    assert_eq!(row.shards, 1, "spread for a ceiling its lost races hid");
    assert_eq!(row.write_ceiling, None);
}

#[tokio::test]
async fn on_a_bucket_no_refill_binds_a_few_lost_races_still_teach() {
    // One write in five lost its race (two fills of a full row at once): on a bucket
    // refilling far past what a row takes, the throttles spread it.
    let (row, throttled) = hammered_losing((1, 5), 1_000_000).await;
    assert!(throttled > 0, "the store throttled the row");
    assert!(row.shards > 1, "not spread: {row:?}");
    assert!(row.write_ceiling.is_some());
    // Refilling 1,500 calls a second, within twice the ceiling told: its lost races teach
    // nothing.
    let (row, _) = hammered_losing((1, 5), 1_500).await;
    assert_eq!(row.shards, 1, "spread for a ceiling its lost races hid");
}
