//! `sluice-fuzz`: runs the fuzz targets, or replays one input.
//!
//! ```text
//! sluice-fuzz [TARGET…]            run the targets (all by default) for the budget
//! sluice-fuzz replay TARGET FILE…  run files through a target, once each
//! ```
//!
//! The budget comes from `SLUICE_FUZZ_ITERATIONS`, `SLUICE_FUZZ_SECONDS` and
//! `SLUICE_FUZZ_SEED` (see `Budget::from_env`).

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::time::Instant;

use sluice_fuzz::{Budget, TARGETS, Target, driver};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("replay") => replay(&args[1..]),
        Some("-h" | "--help") => {
            println!("usage: sluice-fuzz [TARGET…] | sluice-fuzz replay TARGET FILE…");
            println!("targets: {}", names());
            Ok(())
        }
        _ => run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

fn names() -> String {
    TARGETS.map(|t| t.name).join(", ")
}

fn lookup(name: &str) -> Result<&'static Target, String> {
    sluice_fuzz::target(name)
        .ok_or_else(|| format!("no fuzz target `{name}`; the targets are {}", names()))
}

fn run(names: &[String]) -> Result<(), String> {
    let budget = Budget::from_env(|v| std::env::var(v).ok()).map_err(|e| e.to_string())?;
    let targets: Vec<&Target> = if names.is_empty() {
        TARGETS.iter().collect()
    } else {
        names.iter().map(|n| lookup(n)).collect::<Result<_, _>>()?
    };
    let mut crashes = Vec::new();
    for target in targets {
        let seeds = sluice_fuzz::seeds(target)
            .map_err(|e| format!("{}: cannot read the seeds: {e}", target.name))?;
        let seeds: Vec<Vec<u8>> = seeds.into_iter().map(|(_, bytes)| bytes).collect();
        let started = Instant::now();
        match driver::fuzz(target, &seeds, &budget, &sluice_fuzz::crash_dir()) {
            Ok(report) => println!(
                "{:<12} {} inputs ({} seeds) in {:.1?}: {} behaviours, corpus {}, no panic",
                target.name,
                report.executions,
                seeds.len(),
                started.elapsed(),
                report.behaviours,
                report.corpus
            ),
            Err(crash) => {
                println!("{:<12} PANIC", target.name);
                crashes.push(crash.to_string());
            }
        }
    }
    if crashes.is_empty() {
        Ok(())
    } else {
        Err(crashes.join("\n\n"))
    }
}

fn replay(args: &[String]) -> Result<(), String> {
    let (name, files) = args
        .split_first()
        .ok_or("usage: sluice-fuzz replay TARGET FILE…")?;
    let target = lookup(name)?;
    let mut failed = Vec::new();
    for file in files {
        let input = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
        match driver::check(target, &input) {
            Ok(fingerprint) => println!("{file}: no panic (behaviour {fingerprint:016x})"),
            Err(message) => failed.push(format!("{file}: {message}")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("\n"))
    }
}
