//! What an acquire asks for: one or several dimensions, each with an optional cost.

use std::time::Duration;

use crate::bucket::{Bucket, BucketState, Take};
use crate::clock::UnixMillis;
use crate::config::MAX_DIMENSIONS;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::priority::Priority;
use crate::tokens::Tokens;

/// A request for capacity on one or several dimensions, all or nothing.
///
/// A dimension without a cost takes its bucket's `cost_per_call`.
///
/// ```
/// use std::time::Duration;
/// use sluice::Acquire;
///
/// // One request and an estimated 1,500 tokens, held for at most 30 seconds.
/// let request = Acquire::new("openai#rpm")
///     .and_cost("openai#tpm", 1_500)
///     .ttl(Duration::from_secs(30));
/// # let _ = request;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acquire {
    parts: Vec<(String, Option<Tokens>)>,
    ttl: Option<Duration>,
    priority: Option<Priority>,
}

impl Acquire {
    /// Asks for `dimension`'s `cost_per_call`.
    pub fn new(dimension: impl AsRef<str>) -> Self {
        Acquire::default().and(dimension)
    }

    /// Asks for `cost` tokens of `dimension`.
    pub fn with_cost(dimension: impl AsRef<str>, cost: impl Into<Tokens>) -> Self {
        Acquire::default().and_cost(dimension, cost)
    }

    /// Also asks for `dimension`'s `cost_per_call`.
    pub fn and(mut self, dimension: impl AsRef<str>) -> Self {
        self.parts.push((dimension.as_ref().to_owned(), None));
        self
    }

    /// Also asks for `cost` tokens of `dimension`.
    pub fn and_cost(mut self, dimension: impl AsRef<str>, cost: impl Into<Tokens>) -> Self {
        self.parts
            .push((dimension.as_ref().to_owned(), Some(cost.into())));
        self
    }

    /// Sets the lease's time to live (default: the client's lease TTL); at least one
    /// millisecond (the acquire refuses a shorter one with [`Error::InvalidTtl`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The lease's time to live, if set.
    pub fn ttl_value(&self) -> Option<Duration> {
        self.ttl
    }

    /// Sets the acquire's priority (default: the client's, see
    /// [`Config::priority`](crate::Config::priority)): on a bucket that keeps reserves
    /// for higher priorities, it is granted only while they stay kept (see
    /// [`Bucket::with_reserve`](crate::Bucket::with_reserve)).
    ///
    /// ```
    /// use sluice::{Acquire, Priority};
    ///
    /// let request = Acquire::with_cost("openai#tpm", 4_000).priority("batch".parse()?);
    /// assert_eq!(request.priority_value().map(Priority::as_str), Some("batch"));
    /// # Ok::<(), sluice::error::PriorityError>(())
    /// ```
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Sets the priority unless one is set already.
    pub fn or_priority(mut self, priority: Option<Priority>) -> Self {
        if self.priority.is_none() {
            self.priority = priority;
        }
        self
    }

    /// The acquire's priority, if set.
    pub fn priority_value(&self) -> Option<&Priority> {
        self.priority.as_ref()
    }

    /// Validates the request: dimensions parsed, costs between 0 and [`Tokens::MAX`], a
    /// dimension named twice merged into one with the costs summed (a missing cost counts
    /// as the bucket's `cost_per_call` when the bucket is read), a TTL of at least one
    /// millisecond.
    pub(crate) fn resolve(&self) -> Result<Vec<Wanted>, Error> {
        if let Some(ttl) = self.ttl.filter(|t| *t < MIN_TTL) {
            return Err(Error::InvalidTtl(ttl));
        }
        let mut wanted: Vec<Wanted> = Vec::with_capacity(self.parts.len());
        for (name, cost) in &self.parts {
            let dimension = Dimension::new(name)?;
            if let Some(c) = cost.filter(|c| c.is_negative() || *c > Tokens::MAX) {
                return Err(Error::InvalidCost { dimension, cost: c });
            }
            match wanted.iter_mut().find(|w| w.dimension == dimension) {
                Some(w) => match cost {
                    Some(c) => {
                        let sum = w.explicit.checked_add(*c).filter(|t| *t <= Tokens::MAX);
                        w.explicit = sum.ok_or_else(|| Error::InvalidCost {
                            dimension,
                            cost: Tokens::from_nanos(
                                w.explicit.as_nanos().saturating_add(c.as_nanos()),
                            ),
                        })?;
                    }
                    None => w.default_calls = w.default_calls.saturating_add(1),
                },
                None => wanted.push(Wanted {
                    dimension,
                    explicit: cost.unwrap_or(Tokens::ZERO),
                    default_calls: u32::from(cost.is_none()),
                    priority: self.priority.clone(),
                    queue: Duration::ZERO,
                    shadow: false,
                }),
            }
        }
        if wanted.is_empty() || wanted.len() > MAX_DIMENSIONS {
            return Err(Error::DimensionCount {
                got: wanted.len(),
                max: MAX_DIMENSIONS,
            });
        }
        Ok(wanted)
    }
}

/// One dimension of a resolved request.
#[derive(Debug, Clone)]
pub(crate) struct Wanted {
    pub(crate) dimension: Dimension,
    /// The sum of the explicit costs.
    pub(crate) explicit: Tokens,
    /// How many times the bucket's `cost_per_call` is added.
    pub(crate) default_calls: u32,
    /// The acquire's priority (`None`: the highest).
    pub(crate) priority: Option<Priority>,
    /// How long the caller waits for its turn (zero: it does not). A short bucket that
    /// refills this request within it grants a reservation: the tokens are taken now, the
    /// level going below the floor by at most what refills in that time (a debt the
    /// refill repays in order), and the grant is ready once it is repaid (see
    /// [`Grant::ready_at`](crate::grant::Grant::ready_at)).
    pub(crate) queue: Duration,
    /// Whether it is taken in [shadow mode](crate::Mode::Shadow) whatever its bucket's mode
    /// (the client's mode): granted whatever the bucket holds, and counted where an
    /// enforcing bucket would have refused it.
    pub(crate) shadow: bool,
}

impl Wanted {
    /// The cost, given the bucket's `cost_per_call`. A total beyond [`Tokens::MAX`] is
    /// reported just above it: more than any bucket holds, so it can never be granted.
    pub(crate) fn cost(&self, cost_per_call: Tokens) -> Tokens {
        cost_per_call
            .checked_mul(self.default_calls)
            .and_then(|defaults| self.explicit.checked_add(defaults))
            .unwrap_or(Tokens::MAX + Tokens::from_nanos(1))
    }

    /// What this request must leave in `bucket`: the reserves above its priority.
    pub(crate) fn floor(&self, bucket: &Bucket) -> Tokens {
        bucket.floor_for(self.priority.as_ref())
    }

    /// Tries to take this dimension's cost from `row` at `now`, at its priority: granted
    /// when the bucket serves it now, or, for a caller that waits its turn
    /// ([`queue`](Self::queue)), when refill serves it within that wait, counting every
    /// reservation taken before it (the level then goes below the floor, see
    /// [`allowance`](Self::allowance)).
    pub(crate) fn take_from(&self, row: &BucketState, now: UnixMillis) -> Take {
        let cost = self.cost(row.bucket.cost_per_call());
        let take = row.take_above(cost, self.floor(&row.bucket), now);
        match take {
            Take::Short { wait: Some(wait) } if wait <= self.queue => Take::Granted {
                level: crate::bucket::Level {
                    tokens: row.refilled(now).tokens - cost,
                    ..row.refilled(now)
                },
            },
            take => take,
        }
    }

    /// How far below its floor a take of this request may leave `row`'s bucket: what the
    /// bucket refills within the caller's [`queue`](Self::queue) (zero for a caller that
    /// does not wait, and for a bucket that does not refill), rounded down.
    pub(crate) fn allowance(&self, row: &BucketState) -> Tokens {
        if self.queue.is_zero() || row.bucket.effective_rate().per_milli().is_none() {
            return Tokens::ZERO;
        }
        row.bucket.effective_rate().refill_over(self.queue)
    }

    /// The error for a cost `row` can never grant at this priority, if it is one.
    pub(crate) fn never(&self, row: &BucketState, take: &Take) -> Option<Error> {
        let dimension = self.dimension.clone();
        let cost = self.cost(row.bucket.cost_per_call());
        let capacity = row.bucket.capacity();
        match (take, &self.priority) {
            (Take::ExceedsShare { share }, Some(priority)) => Some(Error::CostExceedsShare {
                dimension,
                cost,
                priority: priority.clone(),
                share: *share,
            }),
            // No priority leaves no reserve: its share is the whole capacity.
            (Take::ExceedsCapacity | Take::ExceedsShare { .. }, _) => {
                Some(Error::CostExceedsCapacity {
                    dimension,
                    cost,
                    capacity,
                })
            }
            _ => None,
        }
    }
}

/// The shortest lease TTL.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(1);

impl From<&str> for Acquire {
    fn from(dimension: &str) -> Self {
        Acquire::new(dimension)
    }
}

impl From<String> for Acquire {
    fn from(dimension: String) -> Self {
        Acquire::new(dimension)
    }
}

impl From<&String> for Acquire {
    fn from(dimension: &String) -> Self {
        Acquire::new(dimension)
    }
}

impl From<Dimension> for Acquire {
    fn from(dimension: Dimension) -> Self {
        Acquire::new(dimension)
    }
}

impl From<&Dimension> for Acquire {
    fn from(dimension: &Dimension) -> Self {
        Acquire::new(dimension)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dimension_named_twice_is_merged() {
        let w = Acquire::new("openai#rpm")
            .and_cost("openai#tpm", 10)
            .and_cost("openai#tpm", 5)
            .and("openai#rpm")
            .resolve()
            .unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].cost(Tokens::new(2)), Tokens::new(4));
        assert_eq!(w[1].cost(Tokens::new(2)), Tokens::new(15));
    }

    #[test]
    fn bad_requests_are_refused_before_any_io() {
        assert!(matches!(
            Acquire::default().resolve(),
            Err(Error::DimensionCount { got: 0, .. })
        ));
        assert!(matches!(
            Acquire::new("nohash").resolve(),
            Err(Error::InvalidDimension(_))
        ));
        assert!(matches!(
            Acquire::with_cost("a#b", -1).resolve(),
            Err(Error::InvalidCost { .. })
        ));
        let many = (0..51).fold(Acquire::default(), |a, i| a.and(format!("v#m{i}")));
        assert!(matches!(
            many.resolve(),
            Err(Error::DimensionCount { got: 51, .. })
        ));
        assert!(matches!(
            Acquire::new("a#b").ttl(Duration::ZERO).resolve(),
            Err(Error::InvalidTtl(d)) if d.is_zero()
        ));
        assert!(
            Acquire::new("a#b")
                .ttl(Duration::from_millis(1))
                .resolve()
                .is_ok()
        );
    }

    #[test]
    fn costs_beyond_the_bounds_are_refused_and_never_overflow() {
        assert!(matches!(
            Acquire::with_cost("a#b", Tokens::MAX + Tokens::from_nanos(1)).resolve(),
            Err(Error::InvalidCost { .. })
        ));
        // Two costs whose sum overflows: a typed error, not a panic.
        assert!(matches!(
            Acquire::with_cost("a#b", Tokens::MAX)
                .and_cost("a#b", Tokens::MAX)
                .resolve(),
            Err(Error::InvalidCost { .. })
        ));
        assert!(matches!(
            Acquire::with_cost("a#b", Tokens::from_nanos(i128::MAX))
                .and_cost("a#b", Tokens::from_nanos(i128::MAX))
                .resolve(),
            Err(Error::InvalidCost { .. })
        ));
        // A default cost times many calls beyond every capacity: never grantable.
        let w = Acquire::new("a#b").and("a#b").resolve().unwrap().remove(0);
        assert!(w.cost(Tokens::MAX) > Tokens::MAX);
    }
}
