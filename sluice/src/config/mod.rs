//! Configuration from the environment (`SLUICE_*`) and from code: [`Config`], what
//! [`SluiceBuilder`](crate::SluiceBuilder) builds from, its choices and its defaults.

use std::collections::HashMap;
use std::time::Duration;

use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::priority::Priority;
use crate::tokens::Tokens;

mod choices;
mod error;
mod sharding;

#[cfg(feature = "unstable-store")]
#[cfg_attr(docsrs, doc(cfg(feature = "unstable-store")))]
pub use choices::Protocol;
#[cfg(not(feature = "unstable-store"))]
pub(crate) use choices::Protocol;
pub use choices::{DEFAULT_OPEN_PERCENT, FailurePolicy, Prefetch};
pub use error::ConfigError;
pub use sharding::Sharding;

pub use crate::dimension::MAX_SHARDS;

/// The variables sluice read once and reads no more, with what to do instead: a process
/// that sets one is refused at start ([`ConfigError::Removed`]).
const REMOVED: [(&str, &str); 8] = [
    (
        "SLUICE_LEASE_TTL",
        "set SLUICE_LEASE_TTL_MS (milliseconds; every duration variable is in milliseconds)",
    ),
    (
        "SLUICE_PROTOCOL",
        "the seed protocol is a client for testing a store, in code, with the feature `unstable-store`: `SluiceBuilder::protocol(Protocol::Seed)`",
    ),
    (
        "SLUICE_LEASE_RECORD_AFTER_MS",
        "a `requests`/`tokens` lease's row is written once it is held 1 s (at most half its TTL); a bucket that wants none is lean (`Bucket::lean`, `lean = true`)",
    ),
    (
        "SLUICE_MAX_RETRIES",
        "the seed protocol's retries are set in code: `SluiceBuilder::max_retries`",
    ),
    (
        "SLUICE_HEAL_SETTLE_MS",
        "the reconciler's settle time is set in code: `SluiceBuilder::heal_settle`",
    ),
    (
        "SLUICE_STORE_ATTEMPT_TIMEOUT_MS",
        "an attempt's deadline is set in code with the call's: `SluiceBuilder::store_timeouts`; SLUICE_STORE_TIMEOUT_MS sets the call's",
    ),
    (
        "SLUICE_MAX_SHARDS",
        "spreading is set in code: `Config::sharding` (`Sharding::max_shards`)",
    ),
    (
        "SLUICE_ITEM_WRITE_CEILING",
        "the ceiling is learned from the store's throttles; set it in code if needed: `Config::sharding` (`Sharding::item_write_ceiling`)",
    ),
];

/// The most dimensions one acquire may name: each takes two rows of one atomic write,
/// and DynamoDB transactions hold at most 100.
pub const MAX_DIMENSIONS: usize = 50;

/// Default lease TTL (`SLUICE_LEASE_TTL_MS`).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(60);
/// Default contention retries of the seed protocol before giving up
/// ([`SluiceBuilder::max_retries`](crate::SluiceBuilder::max_retries)).
pub const DEFAULT_MAX_RETRIES: u32 = 5;
/// Default slot poll interval (`SLUICE_SLOT_POLL_MS`): how long a short `concurrent` bucket
/// is remembered, and the longest a waiting caller sleeps before looking again.
pub const DEFAULT_SLOT_POLL: Duration = Duration::from_millis(300);
/// Default age of a bucket row's refill timestamp past which a grant that counts the refill
/// since folds it into the row (see [`Config::fold_after`]).
pub const DEFAULT_FOLD_AFTER: Duration = Duration::from_secs(60);
/// Default time a `concurrent` bucket that does not match its leases must stay unchanged
/// before the reconciler corrects it (see [`Config::heal_settle`]).
pub const DEFAULT_HEAL_SETTLE: Duration = Duration::from_secs(10);

/// How long a `requests`/`tokens` lease is held before its row is written (at most half
/// its time to live). Such a row is only the reconciler's record, should the holder die
/// before releasing, so a lease released sooner never has one: its grant costs one write
/// in all, like a lean grant. The price: a holder that dies within this time is refunded
/// nothing (the tokens stay used, as its call would have used them). A bucket whose leases
/// should have no row at all is [lean](crate::Bucket::lean): the one knob. A slot's row is
/// always written before the slot is handed out.
pub(crate) const LEASE_RECORD_AFTER: Duration = Duration::from_secs(1);
/// Default deadline of one store call, its retries included (`SLUICE_STORE_TIMEOUT_MS`;
/// see [`Config::store_timeout`]).
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(3);
/// Default deadline of one attempt of a store call (see [`Config::store_attempt_timeout`]).
pub const DEFAULT_STORE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default most two hosts' clocks may disagree (`SLUICE_CLOCK_SKEW_MS`; see
/// [`Config::clock_skew`]).
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(1);
/// The most [`Config::clock_skew`] may be: lease rows must still be there when they become
/// reclaimable (DynamoDB's TTL sweeper may delete them an hour after their expiry).
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(600);
/// How long, beyond [`Config::clock_skew`], a `requests` or `tokens` lease left unreleased
/// after its expiry is kept before anyone refunds it (see [`Config::reclaimable_at`]):
/// its holder goes on retrying a failed release meanwhile.
pub const RELEASE_GRACE: Duration = Duration::from_secs(60);
/// The caller recorded on cool-down leases: the pause a vendor asked for on a
/// `concurrent` bucket (see [`Tighten::PauseFor`](crate::Tighten::PauseFor)). Nothing runs
/// under one, so it is given back at its expiry exactly, without the clock-skew margin.
pub const COOLDOWN_CALLER: &str = "sluice-cooldown";

/// Settings of a [`Sluice`](crate::Sluice) client.
///
/// [`Config::from_env`] reads:
///
/// | variable | meaning | default |
/// |---|---|---|
/// | `SLUICE_TABLE_NAME` | DynamoDB table every process shares; required unless `SLUICE_STORE=memory` | — |
/// | `SLUICE_STORE` | `dynamodb`, or `memory`: an in-memory store only this process sees (see [`Config::in_memory`]) | `dynamodb` |
/// | `SLUICE_ENDPOINT_URL` | DynamoDB endpoint override | AWS default |
/// | `SLUICE_LEASE_TTL_MS` | default lease TTL, milliseconds | 60000 |
/// | `SLUICE_CALLER` | `caller` written on leases | Lambda function name or host name |
/// | `SLUICE_MODE` | `enforce` or `shadow`: this client's acquires never refused, what would have been counted (see [`Mode`](crate::Mode)) | `enforce` |
/// | `SLUICE_SLOT_POLL_MS` | slot poll interval, milliseconds (see [`Config::slot_poll`]) | 300 |
/// | `SLUICE_STORE_TIMEOUT_MS` | deadline of one store call, retries included, milliseconds (see [`Config::store_timeout`]) | 3000 |
/// | `SLUICE_CLOCK_SKEW_MS` | most two hosts' clocks may disagree, milliseconds (see [`Config::clock_skew`]) | 1000 |
/// | `SLUICE_FAILURE_POLICY` | `closed`, `open` or `open:N` when the store cannot answer (see [`FailurePolicy`]) | `closed` |
/// | `SLUICE_PRIORITY` | the priority of acquires that name none (see [`Config::priority`]) | none: the highest |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The DynamoDB table, if any.
    pub table_name: Option<String>,
    /// The in-memory store, chosen explicitly (`SLUICE_STORE=memory`): a client built
    /// with neither a store, a table nor this choice is refused with
    /// [`ConfigError::NoStore`], so a forgotten `SLUICE_TABLE_NAME` never makes a fleet's
    /// limiter silently per-process. Conflicts with [`table_name`](Self::table_name).
    pub in_memory: bool,
    /// The DynamoDB endpoint override, if any.
    pub endpoint_url: Option<String>,
    /// How long a lease lives unless released.
    pub lease_ttl: Duration,
    /// How many times to retry a write lost to another writer.
    pub max_retries: u32,
    /// Who takes leases, written on lease rows.
    pub caller: String,
    /// How acquires talk to the store: the fast path (the only one without the feature
    /// `unstable-store`), or the seed's protocol, a client for testing a store against the
    /// interoperability contract (see [`Protocol`]).
    #[cfg(feature = "unstable-store")]
    #[cfg_attr(docsrs, doc(cfg(feature = "unstable-store")))]
    pub protocol: Protocol,
    /// Local prefetch for hot lean dimensions (see [`Prefetch`]); set from code only.
    pub prefetch: HashMap<Dimension, Prefetch>,
    /// How long a `concurrent` bucket found short is remembered, and the longest a waiting
    /// caller ([`acquire_within`](crate::Sluice::acquire_within) and the waits built on it)
    /// sleeps on one before asking the store again: a slot freed by any process reaches a
    /// waiting one within this interval plus a read and a write. Each waiting process reads
    /// the bucket row about once per half interval to once per interval (its waiters on one
    /// dimension share the reads), plus a lease query when the row changed. When more
    /// callers wait on one bucket than a hundred looks a second allow, each spaces its
    /// looks further, by the count of waiting callers the row keeps (see
    /// `Waiting`): together they look about a hundred times a
    /// second however many wait, and a freed slot still reaches one of them within about
    /// this interval. At least 1 ms.
    pub slot_poll: Duration,
    /// On the fast path, how old a bucket row's refill timestamp may get before a grant
    /// that counts the refill since it folds that refill into the row's tokens and moves
    /// the timestamp on. Grants that count refill are conditioned on the timestamp they
    /// counted from, so other processes' grants computed from the old one fail once after a
    /// fold (and are computed again from the row the failure hands back): folds are kept
    /// to about one per this interval. A full bucket moves the timestamp on its own (a
    /// grant from a full bucket sets it). At least 1 ms.
    pub fold_after: Duration,
    /// How long a `concurrent` bucket that does not match its lease rows must stay as it
    /// is, its row and its lease rows unchanged, before the reconciler sets its tokens to
    /// match them. A slot's acquire and its release each write the bucket row and a lease
    /// row one after the other; between the two the bucket looks off by the slot. A
    /// mismatch that outlasts this interval unchanged is no write in flight but one lost
    /// (a holder that died between its writes, an answer lost): it must exceed the longest
    /// time between a client's two writes, the store's deadline and retries included.
    /// At least 1 ms.
    pub heal_settle: Duration,
    /// The longest one call to the store may take, its retries included: a store that
    /// stops answering makes a call fail with [`StoreError::Timeout`](crate::store::StoreError::Timeout)
    /// after this long, not after the SDK's own limits. Applied to the DynamoDB client
    /// [`DynamoStore::from_config`](crate::DynamoStore::from_config) builds (a client
    /// passed to `DynamoStore::new` keeps its own settings). At least 1 ms.
    pub store_timeout: Duration,
    /// The longest one attempt of a store call may take before the SDK tries again (within
    /// [`store_timeout`](Self::store_timeout)). At least 1 ms and at most `store_timeout`.
    pub store_attempt_timeout: Duration,
    /// The most the clocks of any two hosts sharing the table may disagree. A lease's
    /// expiry is a wall-clock time written by its holder, so no client gives an expired
    /// lease back before this long after its expiry by its own clock (see
    /// [`reclaimable_at`](Self::reclaimable_at)); and a slot's body ends by the lease's
    /// expiry by its holder's clock (see [`Lease::run`](crate::Lease::run)). Together: a
    /// slot in use is never handed to another caller while clocks agree within this much.
    /// `0` trusts every clock exactly. At most [`MAX_CLOCK_SKEW`].
    ///
    /// The promise holds under three conditions: every client and the reconciler use at
    /// least this margin (each reclaims by its own setting), the holder is a sluice client
    /// (another SDK's body deadline is its own), and the body stops at its deadline (a
    /// future is dropped only when it yields: leave a little more than the true skew for a
    /// body that blocks or computes).
    pub clock_skew: Duration,
    /// What an acquire does when the store cannot answer (see [`FailurePolicy`]).
    pub failure_policy: FailurePolicy,
    /// The failure policy of particular dimensions, over
    /// [`failure_policy`](Self::failure_policy); set from code only.
    pub failure_policies: HashMap<Dimension, FailurePolicy>,
    /// The priority of this client's acquires that name none (see
    /// [`Acquire::priority`](crate::Acquire::priority)). `None`: the highest, which may take
    /// everything, as other SDKs sharing the table do.
    pub priority: Option<Priority>,
    /// When this client spreads a hot bucket over more rows (see [`Sharding`]).
    pub sharding: Sharding,
    /// [`Mode::Shadow`](crate::Mode::Shadow): every acquire of this client is taken in
    /// shadow mode, whatever its buckets say (else only on buckets defined in shadow).
    pub mode: crate::Mode,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            table_name: None,
            in_memory: false,
            endpoint_url: None,
            lease_ttl: DEFAULT_LEASE_TTL,
            max_retries: DEFAULT_MAX_RETRIES,
            caller: default_caller(),
            #[cfg(feature = "unstable-store")]
            protocol: Protocol::default(),
            prefetch: HashMap::new(),
            slot_poll: DEFAULT_SLOT_POLL,
            fold_after: DEFAULT_FOLD_AFTER,
            heal_settle: DEFAULT_HEAL_SETTLE,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            store_attempt_timeout: DEFAULT_STORE_ATTEMPT_TIMEOUT,
            clock_skew: DEFAULT_CLOCK_SKEW,
            failure_policy: FailurePolicy::Closed,
            failure_policies: HashMap::new(),
            priority: None,
            sharding: Sharding::default(),
            mode: crate::Mode::Enforce,
        }
    }
}

impl Config {
    /// How acquires talk to the store: always the fast path without the feature
    /// `unstable-store`.
    pub(crate) fn protocol(&self) -> Protocol {
        #[cfg(feature = "unstable-store")]
        return self.protocol;
        #[cfg(not(feature = "unstable-store"))]
        Protocol::Fast
    }

    /// The failure policy of `dimension`.
    pub fn failure_policy_of(&self, dimension: &Dimension) -> FailurePolicy {
        self.failure_policies
            .get(dimension)
            .copied()
            .unwrap_or(self.failure_policy)
    }

    /// The earliest time, by this client's clock, at which a lease that expires at
    /// `expires_at` may be ended by anyone but its holder: [`clock_skew`](Self::clock_skew)
    /// after its expiry for a `concurrent` slot (`slot`), and [`RELEASE_GRACE`] later still
    /// for a `requests` or `tokens` lease, which is refunded then: its holder, whose
    /// release failed, keeps retrying until this time, so a lease it released is not
    /// refunded unless the store refused that release for the whole grace.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::{Config, clock::UnixMillis};
    ///
    /// let config = Config { clock_skew: Duration::from_secs(2), ..Config::default() };
    /// let expires = UnixMillis::from_secs(1_700_000_000);
    /// assert_eq!(config.reclaimable_at(expires, true), UnixMillis::from_secs(1_700_000_002));
    /// assert_eq!(config.reclaimable_at(expires, false), UnixMillis::from_secs(1_700_000_062));
    /// ```
    pub fn reclaimable_at(&self, expires_at: UnixMillis, slot: bool) -> UnixMillis {
        let after = expires_at.saturating_add(self.clock_skew);
        if slot {
            after
        } else {
            after.saturating_add(RELEASE_GRACE)
        }
    }

    /// [`reclaimable_at`](Self::reclaimable_at) for a lease taken by `caller`: a cool-down
    /// lease ([`COOLDOWN_CALLER`]) at its expiry exactly.
    pub(crate) fn lease_reclaimable_at(
        &self,
        expires_at: UnixMillis,
        slot: bool,
        caller: &str,
    ) -> UnixMillis {
        if caller == COOLDOWN_CALLER {
            expires_at
        } else {
            self.reclaimable_at(expires_at, slot)
        }
    }

    /// Whether any dimension fails open.
    pub(crate) fn may_fail_open(&self) -> bool {
        self.failure_policy != FailurePolicy::Closed
            || self
                .failure_policies
                .values()
                .any(|p| *p != FailurePolicy::Closed)
    }

    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the configuration through `lookup` (a testable stand-in for the environment).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let non_empty = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let mut config = Config {
            table_name: non_empty("SLUICE_TABLE_NAME"),
            endpoint_url: non_empty("SLUICE_ENDPOINT_URL"),
            ..Config::default()
        };
        refuse_removed(&non_empty)?;
        config.in_memory = choices::in_memory(&non_empty)?;
        let millis = |variable| millis_from(1, variable, non_empty(variable));
        if let Some(ttl) = millis("SLUICE_LEASE_TTL_MS")? {
            config.lease_ttl = ttl;
        }
        if let Some(poll) = millis("SLUICE_SLOT_POLL_MS")? {
            config.slot_poll = poll;
        }
        if let Some(timeout) = millis("SLUICE_STORE_TIMEOUT_MS")? {
            config.store_timeout = timeout;
            // An attempt never outlasts its call.
            config.store_attempt_timeout = config.store_attempt_timeout.min(timeout);
        }
        if let Some(skew) =
            millis_from(0, "SLUICE_CLOCK_SKEW_MS", non_empty("SLUICE_CLOCK_SKEW_MS"))?
        {
            config.clock_skew = skew;
        }
        config.mode = choices::mode(&non_empty)?;
        if let Some(v) = non_empty("SLUICE_FAILURE_POLICY") {
            config.failure_policy = v.parse().map_err(|_| ConfigError::Invalid {
                variable: "SLUICE_FAILURE_POLICY",
                value: v.clone(),
                reason: "expected `closed`, `open` or `open:N` (N percent, 1 to 100)",
            })?;
        }
        if let Some(v) = non_empty("SLUICE_PRIORITY") {
            config.priority = Some(v.trim().parse().map_err(|_| ConfigError::Invalid {
                variable: "SLUICE_PRIORITY",
                value: v.clone(),
                reason: "expected a priority name: 1 to 64 ASCII letters, digits, `-`, `_`, `.`",
            })?);
        }
        if let Some(v) = non_empty("SLUICE_CALLER") {
            config.caller = v;
        } else if let Some(f) = non_empty("AWS_LAMBDA_FUNCTION_NAME") {
            config.caller = f;
        }
        Ok(config)
    }

    /// Checks what the environment cannot express wrongly but code can: a TTL, a slot poll
    /// interval and a fold interval of at least a millisecond, and prefetches of a positive
    /// number of tokens held at least a millisecond. Every client is built through it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        choices::one_store(self)?;
        let at_least_a_millisecond = [
            ("SLUICE_LEASE_TTL_MS", self.lease_ttl),
            ("fold_after", self.fold_after),
            ("heal_settle", self.heal_settle),
            ("SLUICE_SLOT_POLL_MS", self.slot_poll),
            ("SLUICE_STORE_TIMEOUT_MS", self.store_timeout),
        ];
        for (variable, value) in at_least_a_millisecond {
            if value < Duration::from_millis(1) {
                return Err(ConfigError::Invalid {
                    variable,
                    value: format!("{value:?}"),
                    reason: "must be at least one millisecond",
                });
            }
        }
        if self.clock_skew > MAX_CLOCK_SKEW {
            return Err(ConfigError::Invalid {
                variable: "SLUICE_CLOCK_SKEW_MS",
                value: format!("{:?}", self.clock_skew),
                reason: "at most 600000 ms (ten minutes)",
            });
        }
        if self.store_attempt_timeout < Duration::from_millis(1)
            || self.store_attempt_timeout > self.store_timeout
        {
            return Err(ConfigError::Invalid {
                variable: "store_attempt_timeout",
                value: format!("{:?}", self.store_attempt_timeout),
                reason: "an attempt's timeout must be at least one millisecond and at most the store timeout",
            });
        }
        self.sharding.validate()?;
        let policies = self.failure_policies.iter().map(|(d, p)| (Some(d), p));
        for (dimension, policy) in policies.chain([(None, &self.failure_policy)]) {
            if !policy.is_valid() {
                return Err(ConfigError::Invalid {
                    variable: "SLUICE_FAILURE_POLICY",
                    value: format!(
                        "{policy:?} for {}",
                        dimension.map_or("the client", |d| d.as_str())
                    ),
                    reason: "an open failure policy's share is 1 to 100 percent",
                });
            }
        }
        for (dimension, p) in &self.prefetch {
            if p.tokens() <= Tokens::ZERO
                || p.tokens() > Tokens::MAX
                || p.hold() < Duration::from_millis(1)
            {
                return Err(ConfigError::Invalid {
                    variable: "prefetch",
                    value: format!("{dimension}: {} tokens, hold {:?}", p.tokens(), p.hold()),
                    reason: "prefetch needs a positive number of tokens and a hold of at least one millisecond",
                });
            }
        }
        Ok(())
    }
}

/// A duration in whole milliseconds, at least 1, from `variable`'s value (if set).
/// A whole number of seconds, at least 1, from `variable`'s value `v`.
/// [`ConfigError::Removed`] for the first variable of [`REMOVED`] the environment sets.
fn refuse_removed(non_empty: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
    match REMOVED.iter().find(|(v, _)| non_empty(v).is_some()) {
        Some((variable, instead)) => Err(ConfigError::Removed { variable, instead }),
        None => Ok(()),
    }
}

/// A whole number of milliseconds of at least `min` (0 or 1) from `variable`'s `value`.
fn millis_from(
    min: u64,
    variable: &'static str,
    value: Option<String>,
) -> Result<Option<Duration>, ConfigError> {
    let Some(v) = value else {
        return Ok(None);
    };
    let ms: u64 = v
        .trim()
        .parse()
        .ok()
        .filter(|ms| *ms >= min)
        .ok_or_else(|| ConfigError::Invalid {
            variable,
            value: v.clone(),
            reason: if min == 0 {
                "expected a whole number of milliseconds, 0 or more"
            } else {
                "expected a whole number of milliseconds, at least 1"
            },
        })?;
    Ok(Some(Duration::from_millis(ms)))
}

fn default_caller() -> String {
    std::env::var("AWS_LAMBDA_FUNCTION_NAME")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| gethostname::gethostname().to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests;
