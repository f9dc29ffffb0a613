//! The local buckets of the `open` failure policy ([`FailurePolicy::Open`]): while the
//! store cannot answer, acquires on dimensions that fail open are granted from a bucket in
//! this process holding a share of the shared bucket's capacity and rate.
//!
//! An outage begins with the first acquire the store failed, and ends with the first one
//! it answered. During it, acquires go to the local buckets at once; one acquire per
//! [`PROBE`] asks the store first, to learn whether it is back. Each outage starts its
//! local buckets empty.

use crate::shared::recent::Recent;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::bucket::{Bucket, BucketState, LimitType, Take};
use crate::clock::UnixMillis;
use crate::config::FailurePolicy;
use crate::dimension::Dimension;
use crate::priority::{Priority, Reserve};
use crate::tokens::Tokens;

/// How often, during an outage, one acquire asks the store whether it is back.
pub(crate) const PROBE: Duration = Duration::from_secs(1);

/// The failure policy's state: whether the store is down, and the local buckets.
#[derive(Debug, Default)]
pub(crate) struct Fallback {
    /// Whether an outage is under way (read without the lock by every acquire).
    down: AtomicBool,
    state: Mutex<Outage>,
}

#[derive(Debug, Default)]
struct Outage {
    /// When the next acquire asks the store.
    probe_at: Option<UnixMillis>,
    /// The local buckets of this outage.
    buckets: Recent<BucketState>,
    /// The shared buckets' definitions as last seen, for the local buckets.
    known: Recent<Bucket>,
}

/// One dimension of a local take: the dimension, its failure policy, and its cost given
/// the shared bucket's definition.
pub(crate) type Wanted<'a> = (
    &'a Dimension,
    FailurePolicy,
    &'a dyn Fn(&Bucket) -> Tokens,
    Option<&'a Priority>,
);

/// What the local buckets answered.
pub(crate) enum Local {
    /// Granted: the cost taken from each dimension, in order.
    Granted(Vec<Tokens>),
    /// Short: the exact wait until every dimension has enough, and each short one's.
    Short(Duration, Vec<(Dimension, Duration)>),
    /// Some dimension cannot fail open (closed, `concurrent`, or a bucket this client has
    /// not seen, or a cost above the local capacity): the store's error stands.
    Closed,
}

impl Fallback {
    fn state(&self) -> std::sync::MutexGuard<'_, Outage> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether an acquire at `now` should skip the store: an outage is under way and it
    /// is not this acquire's turn to ask whether the store is back.
    pub(crate) fn skip_store(&self, now: UnixMillis) -> bool {
        if !self.down.load(Ordering::Relaxed) {
            return false;
        }
        let mut state = self.state();
        match state.probe_at {
            Some(at) if at > now => true,
            _ => {
                // This acquire asks; the others keep to the local buckets meanwhile.
                state.probe_at = Some(now.saturating_add(PROBE));
                false
            }
        }
    }

    /// The store failed an acquire at `now`: an outage begins, or goes on.
    pub(crate) fn store_failed(&self, now: UnixMillis, error: &dyn std::fmt::Display) {
        let mut state = self.state();
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(%error, "the store cannot answer: acquires on dimensions that fail open are granted from local buckets until it does");
            state.buckets.clear();
        }
        state.probe_at = Some(now.saturating_add(PROBE));
    }

    /// The store answered an acquire: the outage, if any, is over.
    pub(crate) fn store_answered(&self) {
        if self.down.load(Ordering::Relaxed) && self.down.swap(false, Ordering::Relaxed) {
            tracing::warn!("the store answers again: acquires use the shared buckets");
            let mut state = self.state();
            state.buckets.clear();
            state.probe_at = None;
        }
    }

    /// Remembers the definition of `dimension`'s shared bucket, for a later outage.
    pub(crate) fn learn(&self, dimension: &Dimension, bucket: &Bucket) {
        let mut state = self.state();
        if state.known.get(dimension) != Some(bucket) {
            state.known.insert(dimension.clone(), bucket.clone());
        }
    }

    /// Takes the costs of `wanted` from the local buckets of their dimensions at `now`,
    /// all or nothing.
    pub(crate) fn take(&self, wanted: &[Wanted<'_>], now: UnixMillis) -> Local {
        let mut state = self.state();
        let state = &mut *state;
        let mut taken = Vec::with_capacity(wanted.len());
        let mut longest = Duration::ZERO;
        let mut short = Vec::new();
        let mut after = Vec::with_capacity(wanted.len());
        for (dimension, policy, cost_of, priority) in wanted {
            let Some(bucket) = state.known.get(dimension) else {
                return Local::Closed;
            };
            if *policy == FailurePolicy::Closed || bucket.limit_type() == LimitType::Concurrent {
                return Local::Closed;
            }
            let cost = cost_of(bucket);
            let local = state
                .buckets
                .get_or_insert_with(dimension, || local_bucket(dimension, bucket, *policy, now));
            match local.take_as(cost, *priority, now) {
                Take::Granted { level } => after.push(((*dimension).clone(), level)),
                Take::Short { wait: Some(wait) } => {
                    longest = longest.max(wait);
                    short.push(((*dimension).clone(), wait));
                }
                Take::Short { wait: None } | Take::ExceedsCapacity | Take::ExceedsShare { .. } => {
                    return Local::Closed;
                }
            }
            taken.push(cost);
        }
        if longest > Duration::ZERO {
            return Local::Short(longest, short);
        }
        for (dimension, level) in after {
            if let Some(local) = state.buckets.get_mut(&dimension) {
                local.set_level(level);
            }
        }
        Local::Granted(taken)
    }

    /// Charges `delta` more to `dimension`'s local bucket (a negative one refunds): the
    /// adjustment of a grant it gave. Nothing when the outage is over.
    pub(crate) fn charge(&self, dimension: &Dimension, delta: Tokens, now: UnixMillis) {
        let mut state = self.state();
        if let Some(local) = state.buckets.get_mut(dimension) {
            let level = local.charged(delta, now);
            local.set_level(level);
        }
    }
}

/// A local bucket for `dimension`, whose shared bucket is `shared`: `policy`'s share of
/// its capacity and rate, its reserves scaled alike, empty at `now`.
fn local_bucket(
    dimension: &Dimension,
    shared: &Bucket,
    policy: FailurePolicy,
    now: UnixMillis,
) -> BucketState {
    // At least one token (a small bucket still lets a call through now and then), never
    // more than the shared bucket holds.
    let capacity = policy
        .share_of(shared.capacity())
        .max(Tokens::new(1).min(shared.capacity()));
    let bucket = Bucket::new(
        shared.limit_type(),
        capacity,
        policy.share_of_rate(shared.refill_rate()),
    )
    .with_cost_per_call(shared.cost_per_call())
    .with_reserves(local_reserves(shared, capacity));
    BucketState {
        tokens: Tokens::ZERO,
        ..BucketState::full(dimension.clone(), bucket, now)
    }
}

/// `shared`'s reserves scaled as its capacity was, to the local `capacity`: a lower
/// priority keeps leaving the higher ones their part of the local bucket.
fn local_reserves(shared: &Bucket, capacity: Tokens) -> Vec<Reserve> {
    let mut left = capacity;
    let mut reserves = Vec::with_capacity(shared.reserves().len());
    for r in shared.reserves() {
        let scaled = r
            .tokens
            .as_nanos()
            .saturating_mul(capacity.as_nanos())
            .checked_div(shared.capacity().as_nanos())
            .unwrap_or(0);
        let tokens = Tokens::from_nanos(scaled).min(left);
        if tokens > Tokens::ZERO {
            left = left.saturating_sub(tokens);
            reserves.push(Reserve {
                priority: r.priority.clone(),
                tokens,
            });
        }
    }
    reserves
}
