//! The process-wide client ([`Sluice::global`], the default of `#[rate_limited]` and of both
//! layers) and [`Sluice::from_env`] never fall back to a store only one process sees: with
//! no table and no explicit choice they fail with an error naming what to set; the
//! in-memory store is had by choosing it (`SLUICE_STORE=memory`). Each environment runs in a
//! child process of its own, started with every `SLUICE_*` variable removed from this one's,
//! as the process-wide client is built once per process.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice::{Error, Sluice, error::ConfigError};

use crate::dynamo::worker::{self, Start};

/// The environments, each with what its child checks.
const CASES: &[(&str, &[(&str, &str)])] = &[
    ("none", &[]),
    ("memory", &[("SLUICE_STORE", "memory")]),
    (
        "both",
        &[
            ("SLUICE_STORE", "memory"),
            ("SLUICE_TABLE_NAME", "vendor-buckets"),
        ],
    ),
    ("typo", &[("SLUICE_STORE", "memroy")]),
];

/// The longest a child may run before it is killed and the test fails.
const CHILD_LIMIT: Duration = Duration::from_secs(30);

pub(crate) fn main() {
    match worker::start(tracing::Level::ERROR) {
        Start::Child(runtime, args) => runtime.block_on(child(&args[0])),
        Start::Parent(_) => {
            parent();
            worker::report("the process-wide client's store", Some(()));
        }
    }
}

fn parent() {
    for (case, vars) in CASES {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(worker::child_args())
            .arg(case)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SLUICE_") {
                command.env_remove(name);
            }
        }
        command.envs(vars.iter().copied());
        let child = command.spawn().unwrap();
        let output = bounded(child, CHILD_LIMIT);
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && out.contains(&format!("checked {case}")),
            "the child for `{case}` failed: {out}"
        );
    }
}

/// Waits for `child` at most `limit`, then kills it by its PID and fails.
fn bounded(mut child: Child, limit: Duration) -> std::process::Output {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a child ran over {limit:?} and was killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[allow(clippy::print_stdout)]
async fn child(case: &str) {
    match case {
        "none" => {
            for attempt in 0..2 {
                let error = Sluice::global().await.unwrap_err();
                assert!(
                    matches!(error, Error::Config(ConfigError::NoStore)),
                    "{attempt}: {error}"
                );
                let message = error.to_string();
                assert!(message.contains("SLUICE_TABLE_NAME"), "{message}");
                assert!(message.contains("SLUICE_STORE=memory"), "{message}");
            }
            let error = Sluice::from_env().await.unwrap_err();
            assert!(
                matches!(error, Error::Config(ConfigError::NoStore)),
                "{error}"
            );
            // A client set explicitly is the process-wide one from then on.
            Sluice::set_global(Sluice::in_memory());
            assert!(Sluice::global().await.is_ok());
        }
        "memory" => {
            let client = Sluice::global().await.unwrap();
            assert!(client.config().in_memory && client.config().table_name.is_none());
            let error = client.acquire("openai#rpm").await.unwrap_err();
            assert!(matches!(error, Error::UnknownDimension { .. }), "{error}");
            let message = error.to_string();
            assert!(
                message.contains("`openai#rpm` in this process's in-memory store"),
                "{message}"
            );
        }
        "both" | "typo" => {
            let error = Sluice::global().await.unwrap_err();
            match &error {
                Error::Config(ConfigError::Invalid { variable, .. }) => {
                    assert_eq!(*variable, "SLUICE_STORE", "{error}");
                }
                other => panic!("expected SLUICE_STORE refused, got {other}"),
            }
        }
        other => panic!("no case {other}"),
    }
    println!("checked {case}");
}
