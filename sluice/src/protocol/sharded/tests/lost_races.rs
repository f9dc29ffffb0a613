//! A row's throttles teach its ceiling only where the client's own writes of it did not
//! lose races meanwhile.

use super::*;

/// [`ItemCeiling`], where every other write of `hot#rpm` also fails its condition (lost
/// to another writer: billed, but not counted in the row's version).
#[derive(Debug)]
struct RacedCeiling {
    ceiling: ItemCeiling,
    writes: std::sync::atomic::AtomicU32,
}

impl crate::shared::test_store::Hooks for RacedCeiling {
    fn change(&self, change: &crate::store::BucketChange) -> Result<(), crate::store::ChangeError> {
        self.ceiling.change(change)?;
        let n = self
            .writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if change.dimension.as_str() == "hot#rpm" && n.is_multiple_of(2) {
            return Err(crate::store::ChangeError::Condition(None));
        }
        Ok(())
    }
}

#[tokio::test]
async fn throttles_of_a_row_whose_writes_lose_races_teach_no_ceiling() {
    use crate::clock::ManualClock;
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let store = Arc::new(crate::shared::test_store::Hooked::new(RacedCeiling {
        ceiling: ItemCeiling {
            clock: clock.clone(),
            per_second: 20,
            landed: std::sync::Mutex::new((0, 0)),
        },
        writes: std::sync::atomic::AtomicU32::default(),
    }));
    let sluice = crate::Sluice::builder()
        .store_arc(store)
        .clock(clock.clone())
        .build()
        .unwrap();
    let ample =
        crate::Bucket::requests(crate::RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
    sluice.put_bucket("hot#rpm", ample).await.unwrap();
    // As in `a_bucket_whose_row_the_store_throttles_spreads_with_no_ceiling_told`, which
    // spreads it; but what the row took while throttled is not what it could take.
    let throttled = hammer(&sluice, &clock, Duration::ZERO).await;
    assert!(throttled > 0, "the store throttled the row");
    let row = sluice.bucket("hot#rpm").await.unwrap().unwrap();
    assert_eq!(row.shards, 1, "spread for a ceiling its lost races hid");
    assert_eq!(row.write_ceiling, None);
}
