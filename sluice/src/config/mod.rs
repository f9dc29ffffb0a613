//! Configuration from the environment (`SLUICE_*`) and from code.

use std::collections::HashMap;
use std::time::Duration;

use crate::dimension::Dimension;
use crate::tokens::Tokens;

mod choices;

pub use choices::{DEFAULT_OPEN_PERCENT, FailurePolicy, Prefetch, Protocol};

/// Default lease TTL (`SLUICE_LEASE_TTL`), seconds.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(60);
/// Default contention retries before giving up (`SLUICE_MAX_RETRIES`).
pub const DEFAULT_MAX_RETRIES: u32 = 5;
/// Default slot poll interval (`SLUICE_SLOT_POLL_MS`): how long a short `concurrent` bucket
/// is remembered, and the longest a waiting caller sleeps before looking again.
pub const DEFAULT_SLOT_POLL: Duration = Duration::from_millis(300);
/// Default most leases a bucket row keeps itself (`SLUICE_LEASES_PER_ROW`; see
/// [`Config::leases_per_row`]).
pub const DEFAULT_LEASES_PER_ROW: usize = 32;
/// Default deadline of one store call, its retries included (`SLUICE_STORE_TIMEOUT_MS`;
/// see [`Config::store_timeout`]).
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(3);
/// Default deadline of one attempt of a store call (`SLUICE_STORE_ATTEMPT_TIMEOUT_MS`; see
/// [`Config::store_attempt_timeout`]).
pub const DEFAULT_STORE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// The most [`Config::leases_per_row`] may be: the row must stay well within DynamoDB's
/// 400 KB item limit.
pub const MAX_LEASES_PER_ROW: usize = 1_000;

/// An environment variable with a value sluice cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A variable's value is invalid.
    #[error("{variable}={value:?} is invalid: {reason}")]
    Invalid {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What was expected.
        reason: &'static str,
    },
    /// A table is configured but this build has no DynamoDB support.
    #[error(
        "SLUICE_TABLE_NAME={0:?} is set, but sluice was built without the `dynamodb` feature; enable it or unset the variable to use the in-memory store"
    )]
    NoDynamoDb(String),
    /// A table is configured, but the client was built synchronously.
    #[error(
        "SLUICE_TABLE_NAME={0:?} is set: build the client with `SluiceBuilder::connect().await` (or `Sluice::from_env().await`), which sets up the DynamoDB client"
    )]
    NeedsConnect(String),
}

/// Settings of a [`Sluice`](crate::Sluice) client.
///
/// [`Config::from_env`] reads:
///
/// | variable | meaning | default |
/// |---|---|---|
/// | `SLUICE_TABLE_NAME` | DynamoDB table; unset: the in-memory store | — |
/// | `SLUICE_ENDPOINT_URL` | DynamoDB endpoint override | AWS default |
/// | `SLUICE_LEASE_TTL` | default lease TTL, seconds | 60 |
/// | `SLUICE_MAX_RETRIES` | contention retries before giving up | 5 |
/// | `SLUICE_CALLER` | `caller` written on leases | Lambda function name or host name |
/// | `SLUICE_PROTOCOL` | `fast` or `seed` (see [`Protocol`]) | `fast` |
/// | `SLUICE_SLOT_POLL_MS` | slot poll interval, milliseconds (see [`Config::slot_poll`]) | 300 |
/// | `SLUICE_LEASES_PER_ROW` | most leases a bucket row keeps itself (see [`Config::leases_per_row`]) | 32 |
/// | `SLUICE_STORE_TIMEOUT_MS` | deadline of one store call, retries included, milliseconds (see [`Config::store_timeout`]) | 3000 |
/// | `SLUICE_STORE_ATTEMPT_TIMEOUT_MS` | deadline of one attempt of a store call, milliseconds | 1000 |
/// | `SLUICE_FAILURE_POLICY` | `closed`, `open` or `open:N` when the store cannot answer (see [`FailurePolicy`]) | `closed` |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The DynamoDB table, if any.
    pub table_name: Option<String>,
    /// The DynamoDB endpoint override, if any.
    pub endpoint_url: Option<String>,
    /// How long a lease lives unless released.
    pub lease_ttl: Duration,
    /// How many times to retry a write lost to another writer.
    pub max_retries: u32,
    /// Who takes leases, written on lease rows.
    pub caller: String,
    /// How acquires talk to the store.
    pub protocol: Protocol,
    /// Local prefetch for hot lean dimensions (see [`Prefetch`]); set from code only.
    pub prefetch: HashMap<Dimension, Prefetch>,
    /// How long a `concurrent` bucket found short is remembered, and the longest a waiting
    /// caller ([`acquire_within`](crate::Sluice::acquire_within) and the waits built on it)
    /// sleeps on one before asking the store again: a slot freed by any process reaches a
    /// waiting one within this interval plus a read and a write. Each waiting process reads
    /// the bucket row about once per half interval to once per interval (its waiters on one
    /// dimension share the reads), plus a lease query when the row changed. At least 1 ms.
    pub slot_poll: Duration,
    /// On the fast path, the most live leases a bucket row keeps itself, so that a grant
    /// and its lease are one single-item write: each lease adds about 60 bytes to the row,
    /// and on DynamoDB every write of the row costs one write unit per started kilobyte.
    /// A grant beyond it gets a lease row of its own, written with the bucket in one
    /// transaction. `0`: every lease in a row of its own. At most [`MAX_LEASES_PER_ROW`].
    pub leases_per_row: usize,
    /// The longest one call to the store may take, its retries included: a store that
    /// stops answering makes a call fail with [`StoreError::Timeout`](crate::store::StoreError::Timeout)
    /// after this long, not after the SDK's own limits. Applied to the DynamoDB client
    /// [`DynamoStore::from_config`](crate::DynamoStore::from_config) builds (a client
    /// passed to `DynamoStore::new` keeps its own settings). At least 1 ms.
    pub store_timeout: Duration,
    /// The longest one attempt of a store call may take before the SDK tries again (within
    /// [`store_timeout`](Self::store_timeout)). At least 1 ms and at most `store_timeout`.
    pub store_attempt_timeout: Duration,
    /// What an acquire does when the store cannot answer (see [`FailurePolicy`]).
    pub failure_policy: FailurePolicy,
    /// The failure policy of particular dimensions, over
    /// [`failure_policy`](Self::failure_policy); set from code only.
    pub failure_policies: HashMap<Dimension, FailurePolicy>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            table_name: None,
            endpoint_url: None,
            lease_ttl: DEFAULT_LEASE_TTL,
            max_retries: DEFAULT_MAX_RETRIES,
            caller: default_caller(),
            protocol: Protocol::default(),
            prefetch: HashMap::new(),
            slot_poll: DEFAULT_SLOT_POLL,
            leases_per_row: DEFAULT_LEASES_PER_ROW,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            store_attempt_timeout: DEFAULT_STORE_ATTEMPT_TIMEOUT,
            failure_policy: FailurePolicy::Closed,
            failure_policies: HashMap::new(),
        }
    }
}

impl Config {
    /// The failure policy of `dimension`.
    pub fn failure_policy_of(&self, dimension: &Dimension) -> FailurePolicy {
        self.failure_policies
            .get(dimension)
            .copied()
            .unwrap_or(self.failure_policy)
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
        if let Some(v) = non_empty("SLUICE_LEASE_TTL") {
            let secs: u64 = v.trim().parse().map_err(|_| ConfigError::Invalid {
                variable: "SLUICE_LEASE_TTL",
                value: v.clone(),
                reason: "expected a whole number of seconds, at least 1",
            })?;
            if secs == 0 {
                return Err(ConfigError::Invalid {
                    variable: "SLUICE_LEASE_TTL",
                    value: v,
                    reason: "expected a whole number of seconds, at least 1",
                });
            }
            config.lease_ttl = Duration::from_secs(secs);
        }
        if let Some(v) = non_empty("SLUICE_MAX_RETRIES") {
            config.max_retries = v.trim().parse().map_err(|_| ConfigError::Invalid {
                variable: "SLUICE_MAX_RETRIES",
                value: v.clone(),
                reason: "expected a whole number, 0 or more",
            })?;
        }
        let millis = |variable| millis(variable, non_empty(variable));
        if let Some(poll) = millis("SLUICE_SLOT_POLL_MS")? {
            config.slot_poll = poll;
        }
        if let Some(timeout) = millis("SLUICE_STORE_TIMEOUT_MS")? {
            config.store_timeout = timeout;
        }
        if let Some(timeout) = millis("SLUICE_STORE_ATTEMPT_TIMEOUT_MS")? {
            config.store_attempt_timeout = timeout;
        }
        if let Some(v) = non_empty("SLUICE_LEASES_PER_ROW") {
            config.leases_per_row = v
                .trim()
                .parse()
                .ok()
                .filter(|n| *n <= MAX_LEASES_PER_ROW)
                .ok_or_else(|| ConfigError::Invalid {
                    variable: "SLUICE_LEASES_PER_ROW",
                    value: v.clone(),
                    reason: "expected a whole number from 0 to 1000",
                })?;
        }
        if let Some(v) = non_empty("SLUICE_PROTOCOL") {
            config.protocol = match v.trim() {
                "fast" => Protocol::Fast,
                "seed" => Protocol::Seed,
                _ => {
                    return Err(ConfigError::Invalid {
                        variable: "SLUICE_PROTOCOL",
                        value: v,
                        reason: "expected `fast` or `seed`",
                    });
                }
            };
        }
        if let Some(v) = non_empty("SLUICE_FAILURE_POLICY") {
            config.failure_policy = v.parse().map_err(|_| ConfigError::Invalid {
                variable: "SLUICE_FAILURE_POLICY",
                value: v.clone(),
                reason: "expected `closed`, `open` or `open:N` (N percent, 1 to 100)",
            })?;
        }
        if let Some(v) = non_empty("SLUICE_CALLER") {
            config.caller = v;
        } else if let Some(f) = non_empty("AWS_LAMBDA_FUNCTION_NAME") {
            config.caller = f;
        }
        Ok(config)
    }

    /// Checks what the environment cannot express wrongly but code can: a TTL and a slot
    /// poll interval of at least a millisecond, at most [`MAX_LEASES_PER_ROW`], and
    /// prefetches of a positive number of tokens held at least a millisecond. Every client
    /// is built through it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.lease_ttl < Duration::from_millis(1) {
            return Err(ConfigError::Invalid {
                variable: "SLUICE_LEASE_TTL",
                value: format!("{:?}", self.lease_ttl),
                reason: "the lease TTL must be at least one millisecond",
            });
        }
        if self.leases_per_row > MAX_LEASES_PER_ROW {
            return Err(ConfigError::Invalid {
                variable: "SLUICE_LEASES_PER_ROW",
                value: self.leases_per_row.to_string(),
                reason: "at most 1000 leases per bucket row",
            });
        }
        if self.slot_poll < Duration::from_millis(1) {
            return Err(ConfigError::Invalid {
                variable: "SLUICE_SLOT_POLL_MS",
                value: format!("{:?}", self.slot_poll),
                reason: "the slot poll interval must be at least one millisecond",
            });
        }
        if self.store_timeout < Duration::from_millis(1) {
            return Err(ConfigError::Invalid {
                variable: "SLUICE_STORE_TIMEOUT_MS",
                value: format!("{:?}", self.store_timeout),
                reason: "the store timeout must be at least one millisecond",
            });
        }
        if self.store_attempt_timeout < Duration::from_millis(1)
            || self.store_attempt_timeout > self.store_timeout
        {
            return Err(ConfigError::Invalid {
                variable: "SLUICE_STORE_ATTEMPT_TIMEOUT_MS",
                value: format!("{:?}", self.store_attempt_timeout),
                reason: "an attempt's timeout must be at least one millisecond and at most the store timeout",
            });
        }
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
fn millis(variable: &'static str, value: Option<String>) -> Result<Option<Duration>, ConfigError> {
    let Some(v) = value else {
        return Ok(None);
    };
    let ms: u64 =
        v.trim()
            .parse()
            .ok()
            .filter(|ms| *ms >= 1)
            .ok_or_else(|| ConfigError::Invalid {
                variable,
                value: v.clone(),
                reason: "expected a whole number of milliseconds, at least 1",
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
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn defaults_apply_when_nothing_is_set() {
        let c = Config::from_lookup(env(&[])).unwrap();
        assert_eq!(c.table_name, None);
        assert_eq!(c.lease_ttl, Duration::from_secs(60));
        assert_eq!(c.max_retries, 5);
        assert!(!c.caller.is_empty());
    }

    #[test]
    fn every_variable_is_read() {
        let c = Config::from_lookup(env(&[
            ("SLUICE_TABLE_NAME", "vendor-buckets-pre"),
            ("SLUICE_ENDPOINT_URL", "http://127.0.0.1:8000"),
            ("SLUICE_LEASE_TTL", "30"),
            ("SLUICE_MAX_RETRIES", "2"),
            ("SLUICE_CALLER", "audit-service"),
            ("SLUICE_PROTOCOL", "seed"),
            ("SLUICE_SLOT_POLL_MS", "150"),
            ("SLUICE_LEASES_PER_ROW", "0"),
        ]))
        .unwrap();
        assert_eq!(c.leases_per_row, 0);
        assert_eq!(
            Config::from_lookup(env(&[])).unwrap().leases_per_row,
            DEFAULT_LEASES_PER_ROW
        );
        assert!(Config::from_lookup(env(&[("SLUICE_LEASES_PER_ROW", "1001")])).is_err());
        assert!(Config::from_lookup(env(&[("SLUICE_LEASES_PER_ROW", "-1")])).is_err());
        assert_eq!(c.slot_poll, Duration::from_millis(150));
        assert!(Config::from_lookup(env(&[("SLUICE_SLOT_POLL_MS", "0")])).is_err());
        assert_eq!(
            Config::from_lookup(env(&[])).unwrap().slot_poll,
            DEFAULT_SLOT_POLL
        );
        assert_eq!(c.protocol, Protocol::Seed);
        assert!(Config::from_lookup(env(&[("SLUICE_PROTOCOL", "turbo")])).is_err());
        assert_eq!(c.table_name.as_deref(), Some("vendor-buckets-pre"));
        assert_eq!(c.endpoint_url.as_deref(), Some("http://127.0.0.1:8000"));
        assert_eq!(c.lease_ttl, Duration::from_secs(30));
        assert_eq!(c.max_retries, 2);
        assert_eq!(c.caller, "audit-service");
    }

    #[test]
    fn lambda_function_name_is_the_default_caller() {
        let c = Config::from_lookup(env(&[("AWS_LAMBDA_FUNCTION_NAME", "stats-service")])).unwrap();
        assert_eq!(c.caller, "stats-service");
    }

    #[test]
    fn bad_values_are_named_in_the_error() {
        let e = Config::from_lookup(env(&[("SLUICE_LEASE_TTL", "1m")])).unwrap_err();
        assert!(e.to_string().contains("SLUICE_LEASE_TTL=\"1m\""), "{e}");
        assert!(Config::from_lookup(env(&[("SLUICE_LEASE_TTL", "0")])).is_err());
        assert!(Config::from_lookup(env(&[("SLUICE_MAX_RETRIES", "-1")])).is_err());
    }

    #[test]
    fn store_timeouts_come_from_the_environment_and_are_validated() {
        let c = Config::from_lookup(env(&[])).unwrap();
        assert_eq!(
            (c.store_timeout, c.store_attempt_timeout),
            (DEFAULT_STORE_TIMEOUT, DEFAULT_STORE_ATTEMPT_TIMEOUT)
        );
        assert_eq!(c.validate(), Ok(()));
        let c = Config::from_lookup(env(&[
            ("SLUICE_STORE_TIMEOUT_MS", "800"),
            ("SLUICE_STORE_ATTEMPT_TIMEOUT_MS", "250"),
        ]))
        .unwrap();
        assert_eq!(c.store_timeout, Duration::from_millis(800));
        assert_eq!(c.store_attempt_timeout, Duration::from_millis(250));
        for (variable, value) in [
            ("SLUICE_STORE_TIMEOUT_MS", "0"),
            ("SLUICE_STORE_TIMEOUT_MS", "soon"),
            ("SLUICE_STORE_ATTEMPT_TIMEOUT_MS", "-1"),
        ] {
            let e = Config::from_lookup(env(&[(variable, value)])).unwrap_err();
            assert!(e.to_string().contains(variable), "{e}");
        }
        // An attempt may not outlast the whole call.
        let c = Config::from_lookup(env(&[
            ("SLUICE_STORE_TIMEOUT_MS", "500"),
            ("SLUICE_STORE_ATTEMPT_TIMEOUT_MS", "900"),
        ]))
        .unwrap();
        let e = c.validate().unwrap_err();
        assert!(
            e.to_string().contains("SLUICE_STORE_ATTEMPT_TIMEOUT_MS"),
            "{e}"
        );
    }

    #[test]
    fn the_failure_policy_comes_from_the_environment_and_is_validated() {
        let c = Config::from_lookup(env(&[])).unwrap();
        assert_eq!(c.failure_policy, FailurePolicy::Closed);
        assert!(!c.may_fail_open());
        for (value, policy) in [
            ("closed", FailurePolicy::Closed),
            ("open", FailurePolicy::Open { percent: 10 }),
            (" open:25% ", FailurePolicy::Open { percent: 25 }),
            ("open:100", FailurePolicy::Open { percent: 100 }),
        ] {
            let c = Config::from_lookup(env(&[("SLUICE_FAILURE_POLICY", value)])).unwrap();
            assert_eq!(c.failure_policy, policy, "{value}");
        }
        for value in ["opened", "open:0", "open:101", "open:ten", "half"] {
            let e = Config::from_lookup(env(&[("SLUICE_FAILURE_POLICY", value)])).unwrap_err();
            assert!(e.to_string().contains("SLUICE_FAILURE_POLICY"), "{e}");
        }
        // Set from code: validated when the client is built.
        let d: Dimension = "openai#rpm".parse().unwrap();
        let mut c = Config::default();
        c.failure_policies
            .insert(d.clone(), FailurePolicy::Open { percent: 0 });
        assert!(c.may_fail_open());
        let e = c.validate().unwrap_err();
        assert!(e.to_string().contains("openai#rpm"), "{e}");
        c.failure_policies.insert(d.clone(), FailurePolicy::Closed);
        c.failure_policy = FailurePolicy::Open { percent: 30 };
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.failure_policy_of(&d), FailurePolicy::Closed);
        assert_eq!(
            c.failure_policy_of(&"openai#tpm".parse().unwrap()),
            FailurePolicy::Open { percent: 30 }
        );
    }
}
