//! The run loop: seeds first, then mutations of the working corpus for a budget; a panic
//! stops the target and leaves the input that caused it in a file.

use std::cell::RefCell;
use std::collections::HashSet;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

use crate::Target;
use crate::mutate::{self, Rng};

/// How long a target runs: a number of mutated inputs, optionally cut short by a time limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Mutated inputs to run (the seeds come on top).
    pub iterations: u64,
    /// Stop earlier when this much time has passed.
    pub time: Option<Duration>,
    /// The seed of the mutator: the same seed runs the same inputs.
    pub seed: u64,
}

/// Inputs the working corpus keeps at most (the seeds plus inputs that behaved newly).
const MAX_CORPUS: usize = 2_048;

/// What a target's run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Inputs run, seeds included.
    pub executions: u64,
    /// Distinct behaviours seen (the targets' fingerprints).
    pub behaviours: usize,
    /// Inputs in the working corpus at the end.
    pub corpus: usize,
}

/// A panic in a target, and where its input was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crash {
    /// The target that panicked.
    pub target: &'static str,
    /// The panic's message and location.
    pub message: String,
    /// The file holding the input.
    pub input: PathBuf,
}

impl std::fmt::Display for Crash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fuzz target `{}` panicked: {}\n  input written to {}\n  replay it with: \
             cargo run -p sluice-fuzz -- replay {} {}",
            self.target,
            self.message,
            self.input.display(),
            self.target,
            self.input.display()
        )
    }
}

/// Runs `target` from `seeds` for `budget`; a panic is returned as a [`Crash`] whose input
/// is written under `crash_dir`.
pub fn fuzz(
    target: &Target,
    seeds: &[Vec<u8>],
    budget: &Budget,
    crash_dir: &Path,
) -> Result<Report, Crash> {
    let started = Instant::now();
    let mut rng = Rng::new(budget.seed);
    let mut corpus: Vec<Vec<u8>> = Vec::new();
    let mut seen = HashSet::new();
    let mut executions = 0;
    let mut run = |input: Vec<u8>, corpus: &mut Vec<Vec<u8>>| -> Result<(), Crash> {
        executions += 1;
        match check(target, &input) {
            Ok(fingerprint) => {
                if seen.insert(fingerprint) && corpus.len() < MAX_CORPUS {
                    corpus.push(input);
                }
                Ok(())
            }
            Err(message) => Err(crash(target, message, &input, crash_dir)),
        }
    };
    for seed in seeds {
        run(seed.clone(), &mut corpus)?;
        // Every seed stays a parent, whatever it fingerprints as.
        if corpus.last() != Some(seed) && corpus.len() < MAX_CORPUS {
            corpus.push(seed.clone());
        }
    }
    if corpus.is_empty() {
        corpus.push(Vec::new());
    }
    for i in 0..budget.iterations {
        if i % 256 == 0 && budget.time.is_some_and(|t| started.elapsed() >= t) {
            break;
        }
        let mut input = corpus[rng.below(corpus.len())].clone();
        mutate::mutate(&mut rng, &mut input, &corpus, target.dictionary);
        run(input, &mut corpus)?;
    }
    Ok(Report {
        executions,
        behaviours: seen.len(),
        corpus: corpus.len(),
    })
}

/// Runs one input through `target`: its fingerprint, or the panic's message.
pub fn check(target: &Target, input: &[u8]) -> Result<u64, String> {
    install_hook();
    CAUGHT.with(|c| *c.borrow_mut() = Some(String::new()));
    let result = panic::catch_unwind(AssertUnwindSafe(|| (target.check)(input)));
    let message = CAUGHT.with(|c| c.borrow_mut().take()).unwrap_or_default();
    result.map_err(|_| message)
}

thread_local! {
    /// `Some` while this thread runs a target: its panic's message, recorded by the hook
    /// instead of being printed.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs, once per process, a panic hook that records the panics of targets and passes
/// every other panic (a failing test's) to the hook it replaced.
fn install_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let recorded = CAUGHT.with(|c| match c.borrow_mut().as_mut() {
                Some(message) => {
                    *message = info.to_string();
                    true
                }
                None => false,
            });
            if !recorded {
                previous(info);
            }
        }));
    });
}

/// Writes the input of a panic to `crash_dir`, named after the target and the input's hash.
fn crash(target: &Target, message: String, input: &[u8], crash_dir: &Path) -> Crash {
    let path = crash_dir.join(format!("{}-{:016x}", target.name, fnv(input)));
    let written = std::fs::create_dir_all(crash_dir).and_then(|()| std::fs::write(&path, input));
    let message = match written {
        Ok(()) => message,
        Err(e) => format!("{message} (and the input could not be written: {e})"),
    };
    Crash {
        target: target.name,
        message,
        input: path,
    }
}

/// FNV-1a: a stable hash for file names and fingerprints.
pub fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
