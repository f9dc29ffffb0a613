//! A throttled lane write: back-pressure, waited out with a doubling, jittered wait.

use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::RngExt as _;

use crate::error::{Error, RetryIn};
use crate::shared::lanes::answer_each;
use crate::store::StoreError;

use super::{Next, Write};

/// Throttled attempts of one write's releases before they are answered with the throttle.
const MAX_THROTTLED: u32 = 16;

/// The first wait after a throttled write, and the longest: each throttle of the lane's
/// writes doubles it, each write that applies halves it again (so the processes sharing a
/// throttled row settle near the rate it takes), and a random half to all of it is waited
/// (or given as the RetryIn).
const THROTTLE_FIRST: Duration = Duration::from_millis(20);
const THROTTLE_MOST: Duration = Duration::from_millis(1_000);

/// The longest wait after a throttle of a bucket's only row while the client may spread
/// it: the throttles are what spreads it (see [`Sharding`](crate::Sharding)), and once
/// spread (by this client or another) the row takes the demand at once. A caller asleep
/// for the doubled wait would hear it up to a second later; in a fleet of 48
/// single-caller processes started one after another on one row at 100 write units a
/// second, those waits reached 640 ms, after the spread had landed.
const THROTTLE_MOST_LONE: Duration = Duration::from_millis(200);

/// Races a lane write loses in a row that it computes again and sends at once: a change
/// fails its condition only when the bucket is shorter than remembered or another writer
/// moved its refill timestamp, and the row handed back makes the next attempt right, so a
/// writer rarely loses more.
const FREE_RACES: u32 = 4;
/// The longest pause between two attempts of a write that keeps losing races: from the
/// fifth loss in a row, a random part of a bound that doubles from 1 ms up to this (each a
/// billed write on a row others keep winning; `MAX_FRESH_RETRIES` of them take about two
/// seconds, not a burst of back-to-back writes).
const RACE_PAUSE_MOST: Duration = Duration::from_millis(16);

impl Write<'_> {
    /// Pauses before the attempt after the `lost`th race this write lost, once it has lost
    /// more than [`FREE_RACES`]: a random part (full jitter) of a doubling bound.
    pub(super) async fn after_lost_race(&self, lost: u32) {
        let Some(beyond) = lost.checked_sub(FREE_RACES + 1) else {
            return;
        };
        let bound = Duration::from_millis(1)
            .saturating_mul(1 << beyond.min(10))
            .min(RACE_PAUSE_MOST);
        let pause = rand::rng().random_range(0..=bound.as_micros() as u64);
        tokio::time::sleep(Duration::from_micros(pause)).await;
    }

    /// A throttled write: back-pressure. Acquires hear a RetryIn of a jittered wait (a
    /// waiting caller waits it out, within its deadline, and asks again); releases wait it
    /// out here and are sent again.
    pub(super) async fn throttled(&mut self, e: &StoreError) -> Next {
        self.throttled += 1;
        let streak = self.lane.throttled.fetch_add(1, Ordering::Relaxed) + 1;
        // A limit the whole table shares: no other row of the bucket would do better, and
        // spreading it cannot help, so it is waited out at the longer bound.
        let table_wide = matches!(e, StoreError::TableThrottled { .. });
        let wait = throttle_wait(streak, !table_wide && self.spreads());
        self.lane.pushed_back.fetch_add(1, Ordering::Relaxed);
        if !table_wide {
            self.lane
                .pushed_at
                .store(self.core.now().as_millis(), Ordering::Relaxed);
        }
        let refusal = RetryIn::pressed(wait, self.core.now());
        answer_each(
            std::mem::take(&mut self.acquires),
            |a| a.reply,
            || Error::RetryIn(refusal.clone()),
        );
        if self.releases.is_empty() {
            return Next::Done;
        }
        if self.throttled > MAX_THROTTLED {
            self.fail_store(e);
            return Next::Done;
        }
        tokio::time::sleep(wait).await;
        Next::Again
    }

    /// Counts a read or write of the row the store pushed back (`e`).
    pub(super) fn count_throttle(&self, e: &StoreError) {
        crate::metrics::bucket_throttled(&self.core.lanes.labels, self.dimension.as_str(), e);
    }

    /// Whether the throttled row is one this client may spread for its throttles (see
    /// [`may_spread`](crate::protocol::sharded::may_spread)): they are then waited out
    /// briefly (see [`THROTTLE_MOST_LONE`]).
    fn spreads(&self) -> bool {
        crate::protocol::sharded::may_spread(self.core, self.lane, &self.dimension)
    }
}

/// The wait after the `n`th throttle in a row: half to all of a doubling bound, shorter
/// for a row that is being spread (`spreads`).
fn throttle_wait(n: u32, spreads: bool) -> Duration {
    let most = if spreads {
        THROTTLE_MOST_LONE
    } else {
        THROTTLE_MOST
    };
    let bound = THROTTLE_FIRST
        .saturating_mul(1 << n.saturating_sub(1).min(10))
        .min(most);
    let half = bound / 2;
    let jitter = rand::rng().random_range(0..=half.as_micros() as u64);
    half + Duration::from_micros(jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Throttles every change of `t#rpm`.
    #[derive(Debug)]
    struct Throttling;

    impl crate::shared::test_store::Hooks for Throttling {
        fn change(
            &self,
            change: &crate::store::BucketChange,
        ) -> Result<(), crate::store::ChangeError> {
            if change.dimension.as_str() == "t#rpm" {
                return Err(StoreError::Throttled { source: None }.into());
            }
            Ok(())
        }
    }

    /// The longest RetryIn of 12 acquires of `t#rpm`, every one throttled, by a client
    /// that spreads buckets over `max_shards` rows at most.
    async fn longest_wait(max_shards: u16) -> Duration {
        let store = std::sync::Arc::new(crate::shared::test_store::Hooked::new(Throttling));
        let config = crate::Config {
            sharding: crate::Sharding {
                max_shards,
                ..crate::Sharding::default()
            },
            ..crate::Config::default()
        };
        let sluice = crate::SluiceBuilder::from_config(config)
            .store_arc(store)
            .build()
            .unwrap();
        let bucket = crate::Bucket::requests(crate::RefillRate::per_second(1_000));
        sluice.put_bucket("t#rpm", bucket).await.unwrap();
        let mut longest = Duration::ZERO;
        for _ in 0..12 {
            match sluice.acquire("t#rpm").await {
                Err(Error::RetryIn(refusal)) => longest = longest.max(refusal.delay),
                other => panic!("{other:?}"),
            }
        }
        longest
    }

    #[tokio::test]
    async fn a_lone_row_a_client_may_spread_waits_its_throttles_out_briefly() {
        let lone = longest_wait(crate::MAX_SHARDS).await;
        assert!(lone <= THROTTLE_MOST_LONE, "{lone:?}");
        // One it never spreads waits them out as long as any row: after 12 throttles in a
        // row, half to all of a second.
        let kept = longest_wait(1).await;
        assert!(kept >= THROTTLE_MOST / 2, "{kept:?}");
    }

    #[test]
    fn throttle_waits_double_up_to_their_bound() {
        for n in 1..40 {
            for (spreads, most) in [(false, THROTTLE_MOST), (true, THROTTLE_MOST_LONE)] {
                let wait = throttle_wait(n, spreads);
                let bound = THROTTLE_FIRST
                    .saturating_mul(1 << (n - 1).min(10))
                    .min(most);
                assert!(wait >= bound / 2 && wait <= bound, "{n}: {wait:?}");
            }
        }
    }
}
