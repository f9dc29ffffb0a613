//! A throttled lane write: back-pressure, waited out with a doubling, jittered wait.

use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::RngExt as _;

use crate::error::Error;
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

impl Write<'_> {
    /// A throttled write: back-pressure. Acquires hear a RetryIn of a jittered wait (a
    /// waiting caller waits it out, within its deadline, and asks again); releases wait it
    /// out here and are sent again.
    pub(super) async fn throttled(&mut self) -> Next {
        self.throttled += 1;
        let streak = self.lane.throttled.fetch_add(1, Ordering::Relaxed) + 1;
        let wait = throttle_wait(streak);
        self.lane.pushed_back.fetch_add(1, Ordering::Relaxed);
        answer_each(
            std::mem::take(&mut self.acquires),
            |a| a.reply,
            || Error::RetryIn(wait),
        );
        if self.releases.is_empty() {
            return Next::Done;
        }
        if self.throttled > MAX_THROTTLED {
            self.fail_store(&StoreError::Throttled { source: None });
            return Next::Done;
        }
        tokio::time::sleep(wait).await;
        Next::Again
    }
}

/// The wait after the `n`th throttle in a row: half to all of a doubling bound.
fn throttle_wait(n: u32) -> Duration {
    let bound = THROTTLE_FIRST
        .saturating_mul(1 << n.saturating_sub(1).min(10))
        .min(THROTTLE_MOST);
    let half = bound / 2;
    let jitter = rand::rng().random_range(0..=half.as_micros() as u64);
    half + Duration::from_micros(jitter)
}
