//! How long the proxy takes to answer, as a region's network and service add to every call:
//! DynamoDB Local on loopback answers in well under a millisecond, real DynamoDB in a few,
//! and the window between a client reading its clock and its write landing is where
//! writers race.

use std::time::Duration;

use rand::RngExt as _;

/// The time the proxy adds to every DynamoDB call it forwards: a fixed part, and a random
/// part drawn for each call from an exponential distribution of mean `tail` (its median is
/// 0.69 times the mean, its 99th percentile 4.6 times), half of it before the request is
/// forwarded and half before the answer is sent, as a network adds it both ways. Zero (the
/// default) adds nothing.
///
/// ```
/// use std::time::Duration;
///
/// // In-region DynamoDB, roughly: 3 ms always, and a tail of mean 2 ms
/// // (median about 4.4 ms, 99th percentile about 12 ms).
/// let latency = dynamodb_fidelity::Latency {
///     base: Duration::from_millis(3),
///     tail: Duration::from_millis(2),
/// };
/// assert!(latency.draw(&mut rand::rng()) >= Duration::from_millis(3));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latency {
    /// Added to every call.
    pub base: Duration,
    /// The mean of the random part (zero: none).
    pub tail: Duration,
}

impl Latency {
    /// One call's added time: `base` and a draw of the tail.
    #[allow(
        clippy::float_arithmetic,
        reason = "a random delay, not accounting: an exponential draw is a logarithm"
    )]
    pub fn draw(&self, rng: &mut impl rand::Rng) -> Duration {
        if self.tail.is_zero() {
            return self.base;
        }
        // 1 - u is in (0, 1]: its logarithm is finite.
        let u: f64 = rng.random();
        let tail = self.tail.as_secs_f64() * -(1.0 - u).ln();
        self.base + Duration::try_from_secs_f64(tail).unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;

    use super::*;

    #[test]
    fn a_latency_is_its_base_and_an_exponential_tail_of_its_mean() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let none = Latency::default();
        assert_eq!(none.draw(&mut rng), Duration::ZERO);
        let fixed = Latency {
            base: Duration::from_millis(5),
            tail: Duration::ZERO,
        };
        assert_eq!(fixed.draw(&mut rng), Duration::from_millis(5));
        let region = Latency {
            base: Duration::from_millis(3),
            tail: Duration::from_millis(2),
        };
        let mut draws: Vec<Duration> = (0..20_000).map(|_| region.draw(&mut rng)).collect();
        assert!(draws.iter().all(|d| *d >= region.base));
        draws.sort_unstable();
        let at = |p: usize| draws[(draws.len() - 1) * p / 100].as_micros();
        // Median 3 + 2 x 0.69 = 4.4 ms; 99th percentile 3 + 2 x 4.6 = 12.2 ms.
        assert!((4_200..=4_600).contains(&at(50)), "median {} µs", at(50));
        assert!((11_000..=13_500).contains(&at(99)), "p99 {} µs", at(99));
    }
}
