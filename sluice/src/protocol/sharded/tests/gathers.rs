//! A gather that lost its race: not sent again, and the next one waits longer.

use super::*;

/// Counts reshard transactions, and loses every one once `lose` is set.
#[derive(Debug, Default)]
struct LosingGathers {
    lose: std::sync::atomic::AtomicBool,
    respreads: std::sync::atomic::AtomicU32,
}

impl crate::shared::test_store::Hooks for LosingGathers {
    fn respread(
        &self,
        _moves: &[Option<crate::bucket::Commute>],
    ) -> Result<bool, crate::store::StoreError> {
        if !self.lose.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(true);
        }
        self.respreads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(false)
    }
}

#[tokio::test]
async fn a_gather_that_lost_its_race_is_not_sent_again_and_the_next_waits_longer() {
    use std::sync::atomic::Ordering::Relaxed;
    let store = Arc::new(crate::shared::test_store::Hooked::new(
        LosingGathers::default(),
    ));
    let clock = crate::clock::ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let sluice = client_of(store.clone(), &clock, Some(1_000));
    let ample = crate::Bucket::requests(crate::RefillRate::per_second(1_000)).with_capacity(1_000);
    sluice.put_bucket("cool#rpm", ample).await.unwrap();
    sluice.reshard("cool#rpm", 4).await.unwrap();
    // From now on, every gather loses its race (the rows are written meanwhile).
    store.hooks.lose.store(true, Relaxed);
    // A cool bucket: one write a second over four rows of a 1,000-write ceiling. The
    // first gather comes after 30 cool measures, the next after 60 more, then 120.
    let mut tried_at = Vec::new();
    for second in 0..200 {
        let before = store.hooks.respreads.load(Relaxed);
        drop(sluice.acquire("cool#rpm").await.unwrap());
        settled(&sluice).await;
        if store.hooks.respreads.load(Relaxed) > before {
            tried_at.push(second);
        }
        clock.advance(Duration::from_secs(1));
    }
    // Each gather one transaction, not one per retry; two in 200 s, the second after
    // twice the cool measures (about 60 s, where it came after about 30 before).
    assert_eq!(store.hooks.respreads.load(Relaxed), 2, "{tried_at:?}");
    assert!(tried_at[1] - tried_at[0] >= 50, "{tried_at:?}");
}
