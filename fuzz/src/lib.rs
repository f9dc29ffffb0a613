//! A fuzz harness for sluice's parsers that runs on stable Rust.
//!
//! Each [`Target`] turns arbitrary bytes into a parser's input, runs the parser, checks a
//! few cheap properties (a panic is a failure) and returns a fingerprint of what the input
//! did. The [driver](driver::fuzz) runs the committed seeds (`fuzz/seeds/<target>/`), then
//! mutations of them for a fixed budget; inputs that behave in a new way join the working
//! corpus, so the run digs past one check to the next. A panic writes the input to
//! `target/fuzz-crashes/` and fails the run with the file's name.
//!
//! ```text
//! cargo run -p sluice-fuzz                          # every target, the CI budget
//! SLUICE_FUZZ_ITERATIONS=2000000 cargo run --release -p sluice-fuzz -- row
//! SLUICE_FUZZ_SECONDS=600 SLUICE_FUZZ_SEED=7 cargo run --release -p sluice-fuzz
//! cargo run -p sluice-fuzz -- replay row target/fuzz-crashes/row-0123456789abcdef
//! ```

#![forbid(unsafe_code)]

pub mod driver;
pub mod input;
pub mod mutate;
pub mod targets;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use driver::{Budget, Crash, Report};

/// One parser under test.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// The name on the command line and of the seed folder.
    pub name: &'static str,
    /// Tokens the mutator drops into inputs: the parser's keywords and edge values.
    pub dictionary: &'static [&'static [u8]],
    /// Runs one input; panics on a parser panic or a broken property; returns a
    /// fingerprint of the input's behaviour (which branch, which error).
    pub check: fn(&[u8]) -> u64,
}

/// Every target, in the order a full run takes them.
pub const TARGETS: [Target; 4] = [
    targets::decimal::TARGET,
    targets::row::TARGET,
    targets::headers::TARGET,
    targets::bucket_file::TARGET,
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The committed seed folder of `target`.
pub fn seed_dir(target: &Target) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target.name)
}

/// The committed seeds of `target`, in file-name order, with their paths.
pub fn seeds(target: &Target) -> std::io::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(seed_dir(target))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    paths.sort();
    paths
        .into_iter()
        .map(|p| std::fs::read(&p).map(|bytes| (p, bytes)))
        .collect()
}

/// Where panicking inputs are written: `fuzz-crashes` in cargo's target directory.
pub fn crash_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("fuzz-crashes")
}

/// Mutated inputs per target when neither `SLUICE_FUZZ_ITERATIONS` nor
/// `SLUICE_FUZZ_SECONDS` is set: a few seconds per target on a small CI machine.
pub const DEFAULT_ITERATIONS: u64 = 200_000;

/// The time limit per target when neither is set, so a slow machine still finishes the four
/// targets within a minute.
pub const DEFAULT_TIME: Duration = Duration::from_secs(12);

/// Why the environment does not describe a budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetError(String);

impl std::fmt::Display for BudgetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BudgetError {}

impl Budget {
    /// The budget from `SLUICE_FUZZ_ITERATIONS` (mutated inputs per target),
    /// `SLUICE_FUZZ_SECONDS` (a time limit per target; alone, it lifts the iteration limit)
    /// and `SLUICE_FUZZ_SEED` (the mutator's seed), read through `var`. With neither of the
    /// first two: [`DEFAULT_ITERATIONS`] within [`DEFAULT_TIME`].
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Budget, BudgetError> {
        let number = |name: &str| -> Result<Option<u64>, BudgetError> {
            var(name)
                .map(|v| {
                    v.trim().parse().map_err(|_| {
                        BudgetError(format!("{name} must be a whole number, found {v:?}"))
                    })
                })
                .transpose()
        };
        let iterations = number("SLUICE_FUZZ_ITERATIONS")?;
        let seconds = number("SLUICE_FUZZ_SECONDS")?;
        Ok(Budget {
            iterations: match (iterations, seconds) {
                (Some(n), _) => n,
                (None, Some(_)) => u64::MAX,
                (None, None) => DEFAULT_ITERATIONS,
            },
            time: match (iterations, seconds) {
                (_, Some(s)) => Some(Duration::from_secs(s)),
                (Some(_), None) => None,
                (None, None) => Some(DEFAULT_TIME),
            },
            seed: number("SLUICE_FUZZ_SEED")?.unwrap_or(0),
        })
    }
}
