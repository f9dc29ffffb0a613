//! Configuration from the environment and from code.

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

/// The configuration read from an environment holding only `pairs`.
fn lookup(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::from_lookup(env(pairs))
}

/// Asserts that an environment holding only `variable=value` is refused, naming `variable`.
fn assert_refused(variable: &str, value: &str) {
    let e = lookup(&[(variable, value)]).unwrap_err();
    assert!(e.to_string().contains(variable), "{e}");
}

#[test]
fn defaults_apply_when_nothing_is_set() {
    let c = lookup(&[]).unwrap();
    assert_eq!(c.table_name, None);
    assert_eq!(c.lease_ttl, Duration::from_secs(60));
    assert_eq!(c.protocol(), Protocol::Fast);
    assert!(!c.caller.is_empty());
}

#[test]
fn every_variable_is_read() {
    let c = lookup(&[
        ("SLUICE_TABLE_NAME", "vendor-buckets-pre"),
        ("SLUICE_ENDPOINT_URL", "http://127.0.0.1:8000"),
        ("SLUICE_LEASE_TTL_MS", "30000"),
        ("SLUICE_CALLER", "audit-service"),
        ("SLUICE_SLOT_POLL_MS", "150"),
    ])
    .unwrap();
    assert_eq!(c.slot_poll, Duration::from_millis(150));
    let defaults = lookup(&[]).unwrap();
    assert_eq!(defaults.slot_poll, DEFAULT_SLOT_POLL);
    for refused in [
        ("SLUICE_LEASE_RECORD_AFTER_MS", "1000"),
        ("SLUICE_SLOT_POLL_MS", "0"),
        ("SLUICE_LEASE_TTL_MS", "0"),
    ] {
        assert!(lookup(&[refused]).is_err(), "{refused:?}");
    }
    assert_eq!(c.table_name.as_deref(), Some("vendor-buckets-pre"));
    assert_eq!(c.endpoint_url.as_deref(), Some("http://127.0.0.1:8000"));
    assert_eq!(c.lease_ttl, Duration::from_secs(30));
    assert_eq!(c.caller, "audit-service");
}

/// The client variables, each read, each in the table of `Config`'s documentation; at
/// most twelve.
#[test]
fn the_client_reads_twelve_variables_at_most() {
    let read = std::cell::RefCell::new(Vec::new());
    Config::from_lookup(|name| {
        read.borrow_mut().push(name.to_owned());
        None
    })
    .unwrap();
    let read: Vec<String> = read
        .into_inner()
        .into_iter()
        .filter(|name| name.starts_with("SLUICE_"))
        .filter(|name| !REMOVED.iter().any(|(removed, _)| removed == name))
        .collect();
    assert!(read.len() <= 12, "{read:?}");
    let docs = include_str!("../../../docs/operating.md");
    for name in &read {
        assert!(
            docs.contains(&format!("| `{name}` |")),
            "{name} is not in operating.md"
        );
        let durations = ["_MS", "TABLE_NAME", "STORE", "ENDPOINT_URL", "CALLER"];
        let kinds = ["FAILURE_POLICY", "PRIORITY", "MODE"];
        assert!(
            durations
                .iter()
                .chain(&kinds)
                .any(|end| name.ends_with(end)),
            "{name}: a duration's unit is in its name"
        );
    }
}

#[test]
fn removed_variables_are_refused_with_what_to_do_instead() {
    for (variable, _) in REMOVED {
        let e = lookup(&[(variable, "1")]).unwrap_err();
        assert!(matches!(e, ConfigError::Removed { .. }), "{e}");
        assert!(e.to_string().contains(variable), "{e}");
    }
    let e = lookup(&[("SLUICE_LEASE_TTL", "30")]).unwrap_err();
    assert!(e.to_string().contains("SLUICE_LEASE_TTL_MS"), "{e}");
    // Empty is unset, as for every variable.
    assert!(lookup(&[("SLUICE_PROTOCOL", " ")]).is_ok());
}

#[test]
fn lambda_function_name_is_the_default_caller() {
    let c = lookup(&[("AWS_LAMBDA_FUNCTION_NAME", "stats-service")]).unwrap();
    assert_eq!(c.caller, "stats-service");
}

#[test]
fn bad_values_are_named_in_the_error() {
    let e = lookup(&[("SLUICE_LEASE_TTL_MS", "1m")]).unwrap_err();
    assert!(e.to_string().contains("SLUICE_LEASE_TTL_MS=\"1m\""), "{e}");
    assert!(lookup(&[("SLUICE_LEASE_TTL_MS", "0")]).is_err());
}

#[test]
fn store_timeouts_come_from_the_environment_and_code_and_are_validated() {
    let c = lookup(&[]).unwrap();
    assert_eq!(
        (c.store_timeout, c.store_attempt_timeout),
        (DEFAULT_STORE_TIMEOUT, DEFAULT_STORE_ATTEMPT_TIMEOUT)
    );
    assert_eq!(c.validate(), Ok(()));
    let c = lookup(&[("SLUICE_STORE_TIMEOUT_MS", "800")]).unwrap();
    assert_eq!(c.store_timeout, Duration::from_millis(800));
    // An attempt never outlasts its call.
    assert_eq!(c.store_attempt_timeout, Duration::from_millis(800));
    assert_eq!(c.validate(), Ok(()));
    let c = lookup(&[("SLUICE_STORE_TIMEOUT_MS", "5000")]).unwrap();
    assert_eq!(c.store_attempt_timeout, DEFAULT_STORE_ATTEMPT_TIMEOUT);
    for value in ["0", "soon"] {
        assert_refused("SLUICE_STORE_TIMEOUT_MS", value);
    }
    // Set in code, an attempt may not outlast the whole call either.
    let c = Config {
        store_timeout: Duration::from_millis(500),
        store_attempt_timeout: Duration::from_millis(900),
        ..Config::default()
    };
    let e = c.validate().unwrap_err();
    assert!(e.to_string().contains("store_attempt_timeout"), "{e}");
}

#[test]
fn the_failure_policy_comes_from_the_environment_and_is_validated() {
    let c = lookup(&[]).unwrap();
    assert_eq!(c.failure_policy, FailurePolicy::Closed);
    assert!(!c.may_fail_open());
    for (value, policy) in [
        ("closed", FailurePolicy::Closed),
        ("open", FailurePolicy::Open { percent: 10 }),
        (" open:25% ", FailurePolicy::Open { percent: 25 }),
        ("open:100", FailurePolicy::Open { percent: 100 }),
    ] {
        let c = lookup(&[("SLUICE_FAILURE_POLICY", value)]).unwrap();
        assert_eq!(c.failure_policy, policy, "{value}");
    }
    for value in ["opened", "open:0", "open:101", "open:ten", "half"] {
        assert_refused("SLUICE_FAILURE_POLICY", value);
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

#[test]
fn the_clock_skew_comes_from_the_environment_and_may_be_zero() {
    assert_eq!(lookup(&[]).unwrap().clock_skew, DEFAULT_CLOCK_SKEW);
    let c = lookup(&[("SLUICE_CLOCK_SKEW_MS", "2500")]).unwrap();
    assert_eq!(c.clock_skew, Duration::from_millis(2_500));
    let c = lookup(&[("SLUICE_CLOCK_SKEW_MS", "0")]).unwrap();
    assert_eq!(c.clock_skew, Duration::ZERO);
    let e = lookup(&[("SLUICE_CLOCK_SKEW_MS", "600001")])
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("SLUICE_CLOCK_SKEW_MS"), "{e}");
    for bad in ["-1", "2s", "1.5"] {
        assert_refused("SLUICE_CLOCK_SKEW_MS", bad);
    }
}

#[test]
fn a_slot_is_reclaimable_after_the_skew_and_a_requests_lease_after_the_grace_too() {
    let c = Config {
        clock_skew: Duration::from_millis(1_500),
        ..Config::default()
    };
    let expires = UnixMillis::new(10_000);
    assert_eq!(c.reclaimable_at(expires, true), UnixMillis::new(11_500));
    let grace = i64::try_from(RELEASE_GRACE.as_millis()).unwrap();
    assert_eq!(
        c.reclaimable_at(expires, false),
        UnixMillis::new(11_500 + grace)
    );
}

#[test]
fn the_default_priority_comes_from_the_environment_and_is_checked() {
    assert_eq!(lookup(&[]).unwrap().priority, None);
    let c = lookup(&[("SLUICE_PRIORITY", " batch ")]).unwrap();
    assert_eq!(c.priority.as_ref().map(|p| p.as_str()), Some("batch"));
    assert_refused("SLUICE_PRIORITY", "batch jobs");
}

#[test]
fn shadow_mode_comes_from_the_environment_and_is_checked() {
    assert_eq!(lookup(&[]).unwrap().mode, crate::Mode::Enforce);
    let c = lookup(&[("SLUICE_MODE", " shadow ")]).unwrap();
    assert_eq!(c.mode, crate::Mode::Shadow);
    assert_refused("SLUICE_MODE", "lenient");
}
