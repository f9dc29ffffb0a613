//! One attempt budget and one backoff for every loop that retries a write lost to another
//! writer (acquires, releases, adjusts, redefinitions, tightening) and for the store's
//! batched operations.

use std::time::Duration;

use std::convert::Infallible;

use rand::{Rng, RngExt as _, TryRng};

/// The first backoff delay's upper bound.
const BASE: Duration = Duration::from_millis(25);
/// The longest backoff delay.
const MAX: Duration = Duration::from_millis(200);

/// Exponential backoff with jitter: the `n`-th delay is drawn from `[d/2, d]` with
/// `d = min(25 ms × 2^(n-1), 200 ms)`, so that writers that lost the same race do not come
/// back at the same moment.
#[derive(Debug)]
pub(crate) struct Backoff<R = ThreadJitter> {
    rng: R,
}

/// Jitter from the thread's generator, drawn when a delay is: a backoff that never waits
/// costs nothing.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ThreadJitter;

impl TryRng for ThreadJitter {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(rand::rng().next_u32())
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(rand::rng().next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        rand::rng().fill_bytes(dst);
        Ok(())
    }
}

impl Backoff {
    /// A backoff drawing its jitter from the thread's generator.
    pub(crate) fn new() -> Self {
        Backoff::with_rng(ThreadJitter)
    }
}

impl<R: Rng> Backoff<R> {
    /// A backoff drawing its jitter from `rng` (a seeded one makes it deterministic).
    pub(crate) fn with_rng(rng: R) -> Self {
        Backoff { rng }
    }

    /// The delay before the attempt that follows the `lost`-th lost one.
    pub(crate) fn delay(&mut self, lost: u32) -> Duration {
        let exp = BASE.saturating_mul(1u32 << lost.saturating_sub(1).min(16));
        let cap = exp.min(MAX);
        let half = cap / 2;
        half + Duration::from_millis(self.rng.random_range(0..=half.as_millis() as u64))
    }

    /// Sleeps the delay after the `lost`-th lost attempt.
    pub(crate) async fn sleep(&mut self, lost: u32) {
        let delay = self.delay(lost);
        tokio::time::sleep(delay).await;
    }
}

/// How many attempts lost to other writers a loop may retry: `max_retries`
/// ([`Config::max_retries`](crate::Config::max_retries)), with the backoff between them.
#[derive(Debug)]
pub(crate) struct Budget {
    max_retries: u32,
    lost: u32,
    backoff: Backoff,
}

impl Budget {
    pub(crate) fn new(max_retries: u32) -> Self {
        Budget {
            max_retries,
            lost: 0,
            backoff: Backoff::new(),
        }
    }

    /// Counts one lost attempt; `false` when that spent the budget.
    pub(crate) fn lose(&mut self) -> bool {
        self.lost += 1;
        self.lost <= self.max_retries
    }

    /// How many attempts were lost so far.
    pub(crate) fn lost(&self) -> u32 {
        self.lost
    }

    /// Sleeps the backoff after the `lost`-th lost attempt.
    pub(crate) async fn back_off(&mut self, lost: u32) {
        self.backoff.sleep(lost).await;
    }
}

/// The rounds of a batched operation that resends what the store handed back unprocessed
/// (throughput): each resend after a backoff, at most `max` rounds in all.
#[cfg(feature = "dynamodb")]
#[derive(Debug)]
pub(crate) struct Rounds {
    max: u32,
    sent: u32,
    backoff: Backoff,
}

#[cfg(feature = "dynamodb")]
impl Rounds {
    pub(crate) fn new(max: u32) -> Self {
        Rounds {
            max,
            sent: 0,
            backoff: Backoff::new(),
        }
    }

    /// Before each round: `false` once `max` rounds were sent (give up); from the second
    /// round on, sleeps the backoff first.
    pub(crate) async fn next(&mut self) -> bool {
        if self.sent >= self.max {
            return false;
        }
        if self.sent > 0 {
            self.backoff.sleep(self.sent).await;
        }
        self.sent += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn backoff_grows_from_25ms_to_a_200ms_cap_with_jitter() {
        let mut backoff = Backoff::new();
        for _ in 0..200 {
            let first = backoff.delay(1);
            assert!(first >= Duration::from_micros(12_500) && first <= Duration::from_millis(25));
            let later = backoff.delay(10);
            assert!(later >= Duration::from_millis(100) && later <= Duration::from_millis(200));
        }
    }

    #[test]
    fn a_seeded_backoff_is_deterministic() {
        let delays = |seed| {
            let mut backoff = Backoff::with_rng(StdRng::seed_from_u64(seed));
            (1..=8).map(|n| backoff.delay(n)).collect::<Vec<_>>()
        };
        assert_eq!(delays(7), delays(7));
        assert_ne!(delays(7), delays(8));
    }

    #[cfg(feature = "dynamodb")]
    #[tokio::test(start_paused = true)]
    async fn rounds_back_off_between_resends_and_stop_at_their_bound() {
        let mut rounds = Rounds::new(3);
        let started = tokio::time::Instant::now();
        assert!(rounds.next().await);
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "the first round goes at once"
        );
        assert!(rounds.next().await);
        assert!(started.elapsed() >= Duration::from_micros(12_500));
        assert!(rounds.next().await);
        let slept = started.elapsed();
        assert!(slept >= Duration::from_micros(37_500), "{slept:?}");
        assert!(!rounds.next().await);
        assert_eq!(started.elapsed(), slept, "giving up does not wait");
    }

    #[test]
    fn the_budget_allows_max_retries_lost_attempts() {
        let mut budget = Budget::new(2);
        assert!(budget.lose());
        assert!(budget.lose());
        assert!(!budget.lose());
        assert_eq!(budget.lost(), 3);
    }
}
