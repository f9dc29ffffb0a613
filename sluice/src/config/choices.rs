//! The choices a [`Config`](super::Config) makes beyond numbers: the protocol, local
//! prefetch, and what to do when the store cannot answer.

use std::str::FromStr;
use std::time::Duration;

use crate::rate::RefillRate;
use crate::tokens::Tokens;

/// Local prefetch for a hot dimension whose bucket is in lean mode: when this client
/// writes a grant, it takes `tokens` more in the same write and grants later acquires from
/// them locally, with no call, for up to `hold`.
///
/// It lifts the ceiling of one bucket row (each write carries many grants, across
/// processes too) at a bounded price:
///
/// - **Overshoot**: every token granted from a prefetch was taken from the bucket at most
///   `hold` earlier, so the grants in any window of length `W` stay within
///   `capacity + refill_rate × (W + hold)` (instead of `W`), whatever the number of
///   clients. Choose `hold` so that `refill_rate × hold` is a burst the vendor tolerates.
/// - **Waste**: prefetched tokens not granted within `hold` (or too few for the next
///   request) are dropped, never given back: they count as used.
/// - **No effect at the limit**: a client prefetches only from plenty, when the bucket
///   still holds at least as much again afterwards, so a bucket near empty is shared
///   exactly as without prefetch.
///
/// Only lean buckets (`requests`, `tokens`) are prefetched: a grant from a bucket with
/// leases needs its own lease row. Only single-dimension acquires use it.
///
/// ```
/// use std::time::Duration;
/// use sluice::{Prefetch, Sluice};
///
/// let sluice = Sluice::builder().store(sluice::MemoryStore::new())
///     .prefetch("openai#rpm".parse()?, Prefetch::new(20, Duration::from_millis(250)))
///     .build()?;
/// # let _ = sluice;
/// # Ok::<(), sluice::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefetch {
    tokens: Tokens,
    hold: Duration,
}

impl Prefetch {
    /// Prefetch `tokens` per write, granted locally for up to `hold` (both must be
    /// positive; [`SluiceBuilder::build`](crate::SluiceBuilder::build) checks).
    pub fn new(tokens: impl Into<Tokens>, hold: Duration) -> Self {
        Prefetch {
            tokens: tokens.into(),
            hold,
        }
    }

    /// Tokens taken per write.
    pub fn tokens(&self) -> Tokens {
        self.tokens
    }

    /// How long prefetched tokens may be granted.
    pub fn hold(&self) -> Duration {
        self.hold
    }
}

/// How acquires talk to the store ([`SluiceBuilder::protocol`](crate::SluiceBuilder::protocol),
/// with the feature `unstable-store`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(not(feature = "unstable-store"), allow(unreachable_pub))]
pub enum Protocol {
    /// One conditional write per grant, from the row this client last saw (one or several
    /// dimensions); a denial it already knows costs no call; releases and cost adjustments
    /// write without reading; concurrent acquires and releases on one dimension share a
    /// write (`fast`, the default).
    #[default]
    Fast,
    /// The seed design's protocol: a consistent read, then one conditional transaction of
    /// every bucket and lease row (`seed`): the interoperability contract other SDKs write
    /// by, and the baseline the fast path is measured against. A client for testing a store
    /// and for the model tests (a fast client honours what it writes), not for production.
    #[cfg_attr(not(feature = "unstable-store"), allow(dead_code))]
    Seed,
}

/// Reads `SLUICE_MODE` through `non_empty` (its default when unset).
pub(super) fn mode(
    non_empty: &dyn Fn(&str) -> Option<String>,
) -> Result<crate::Mode, super::ConfigError> {
    match non_empty("SLUICE_MODE") {
        None => Ok(crate::Mode::default()),
        Some(v) => v.parse().map_err(|_| super::ConfigError::Invalid {
            variable: "SLUICE_MODE",
            value: v.clone(),
            reason: "expected `enforce` or `shadow`",
        }),
    }
}

/// What an acquire does when the store cannot answer it (a timeout, a lost connection, a
/// throttled or failing store): `SLUICE_FAILURE_POLICY`, for the whole client, or per
/// dimension with [`SluiceBuilder::failure_policy_for`](crate::SluiceBuilder::failure_policy_for).
///
/// The trade-off: `closed` never lets a call out that the shared bucket did not grant, so
/// the product stops calling the vendor while the store is down; `open` keeps the product
/// running at a reduced, uncoordinated rate, which stays within the vendor's limit only if
/// the share times the number of processes does (10% each with 10 processes: the whole
/// rate). Each process's local bucket starts empty when the outage begins, so nothing is
/// let out in a burst.
///
/// ```
/// use sluice::FailurePolicy;
///
/// assert_eq!("closed".parse::<FailurePolicy>()?, FailurePolicy::Closed);
/// assert_eq!("open".parse::<FailurePolicy>()?, FailurePolicy::Open { percent: 10 });
/// assert_eq!("open:25".parse::<FailurePolicy>()?, FailurePolicy::Open { percent: 25 });
/// assert!("open:0".parse::<FailurePolicy>().is_err());
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// The acquire fails with the store's typed error (`closed`, the default).
    #[default]
    Closed,
    /// The acquire is granted from a local, in-process bucket holding `percent`% of the
    /// dimension's capacity and refilling at `percent`% of its rate (`open`: 10%, or
    /// `open:N` for N% from 1 to 100), with a warning when the outage begins and the
    /// metric `sluice_fail_open_grants_total`, until the store answers again. While the
    /// store is down, acquires go to the local bucket at once; one acquire a second asks
    /// the store whether it is back. Only for buckets this client has seen (it needs
    /// their definition) and never for `concurrent` ones, which stay closed: a slot
    /// granted locally could be one another process holds.
    Open {
        /// The share of the bucket's capacity and rate, 1 to 100.
        percent: u8,
    },
}

/// The share of [`FailurePolicy::Open`] given as plain `open`.
pub const DEFAULT_OPEN_PERCENT: u8 = 10;

impl FailurePolicy {
    /// `amount` scaled to this policy's share (nothing when closed).
    pub(crate) fn share_of(self, amount: Tokens) -> Tokens {
        match self {
            FailurePolicy::Closed => Tokens::ZERO,
            FailurePolicy::Open { percent } => {
                Tokens::from_nanos(amount.as_nanos() * i128::from(percent) / 100)
            }
        }
    }

    /// `rate` scaled to this policy's share (nothing when closed).
    pub(crate) fn share_of_rate(self, rate: RefillRate) -> RefillRate {
        match self {
            FailurePolicy::Closed => RefillRate::ZERO,
            FailurePolicy::Open { percent } => rate.scaled(u32::from(percent), 100),
        }
    }

    /// Whether the policy is valid: an open share from 1 to 100 percent.
    pub(crate) fn is_valid(self) -> bool {
        match self {
            FailurePolicy::Closed => true,
            FailurePolicy::Open { percent } => (1..=100).contains(&percent),
        }
    }
}

impl FromStr for FailurePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let expected =
            || format!("`{s}`: expected `closed`, `open` or `open:N` (N percent, 1 to 100)");
        match s.trim() {
            "closed" => Ok(FailurePolicy::Closed),
            "open" => Ok(FailurePolicy::Open {
                percent: DEFAULT_OPEN_PERCENT,
            }),
            other => {
                let percent: u8 = other
                    .strip_prefix("open:")
                    .and_then(|n| n.trim().trim_end_matches('%').parse().ok())
                    .ok_or_else(expected)?;
                let policy = FailurePolicy::Open { percent };
                if policy.is_valid() {
                    Ok(policy)
                } else {
                    Err(expected())
                }
            }
        }
    }
}

/// Whether `SLUICE_STORE` chose the in-memory store (see
/// [`Config::in_memory`](super::Config::in_memory)).
pub(super) fn in_memory(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<bool, super::ConfigError> {
    match lookup("SLUICE_STORE") {
        None => Ok(false),
        Some(v) => match v.trim() {
            "memory" => Ok(true),
            "dynamodb" => Ok(false),
            _ => Err(super::ConfigError::Invalid {
                variable: "SLUICE_STORE",
                value: v.clone(),
                reason: "expected `dynamodb` (the table SLUICE_TABLE_NAME names) or `memory` (a store only this process sees)",
            }),
        },
    }
}

/// Refuses a configuration that chose both the in-memory store and a table.
pub(super) fn one_store(config: &super::Config) -> Result<(), super::ConfigError> {
    if config.in_memory && config.table_name.is_some() {
        return Err(super::ConfigError::Invalid {
            variable: "SLUICE_STORE",
            value: "memory".into(),
            reason: "the in-memory store was chosen while SLUICE_TABLE_NAME names a table: choose one",
        });
    }
    Ok(())
}
