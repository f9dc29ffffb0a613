//! `api-check JSON FILE [--bless]`: renders the public API in rustdoc's JSON output `JSON`
//! (one item a line, sorted; blanket, auto-trait and derived impls left out) and compares it
//! with `FILE`, or writes it there with `--bless`. A difference is printed as the lines
//! removed and added, and fails the check.
//!
//! rustdoc writes JSON on a stable toolchain with `RUSTC_BOOTSTRAP=1` (see
//! `scripts/check-api.sh`); the format changes between toolchains, so the version this
//! reader understands is checked first.

#![forbid(unsafe_code)]
// A command-line check: its report is its output.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitCode;

/// The rustdoc JSON format `public-api` 0.52 reads (Rust 1.95's).
const FORMAT_VERSION: u64 = 57;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bless = args.iter().any(|a| a == "--bless");
    let paths: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let [json, file] = paths.as_slice() else {
        eprintln!("usage: api-check RUSTDOC_JSON API_FILE [--bless]");
        return ExitCode::from(2);
    };
    match check(Path::new(json), Path::new(file), bless) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(message) => {
            eprintln!("api-check: {message}");
            ExitCode::from(2)
        }
    }
}

fn check(json: &Path, file: &Path, bless: bool) -> Result<bool, String> {
    let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
    let version = serde_json::from_str::<serde_json::Value>(&text)
        .map_err(|e| format!("{}: {e}", json.display()))?
        .get("format_version")
        .and_then(serde_json::Value::as_u64);
    if version != Some(FORMAT_VERSION) {
        return Err(format!(
            "{} is rustdoc JSON format {version:?}; this check reads format {FORMAT_VERSION} \
             (the workspace's toolchain): pin a public-api release that reads it",
            json.display()
        ));
    }
    let api = public_api::Builder::from_rustdoc_json(json)
        .omit_blanket_impls(true)
        .omit_auto_trait_impls(true)
        .omit_auto_derived_impls(true)
        .build()
        .map_err(|e| format!("{}: {e}", json.display()))?;
    let rendered: String = api.items().map(|item| format!("{item}\n")).collect();
    if bless {
        std::fs::write(file, &rendered).map_err(|e| format!("{}: {e}", file.display()))?;
        println!("wrote {}", file.display());
        return Ok(true);
    }
    let committed = std::fs::read_to_string(file).unwrap_or_default();
    if committed == rendered {
        println!("ok: the public API matches {}", file.display());
        return Ok(true);
    }
    eprintln!(
        "FAILED: the public API differs from {} (`scripts/check-api.sh --bless` writes it, \
         and CHANGELOG.md says why):",
        file.display()
    );
    for line in difference(&committed, &rendered) {
        eprintln!("{line}");
    }
    Ok(false)
}

/// The lines only in `committed` (`- `) and only in `rendered` (`+ `), each sorted.
fn difference(committed: &str, rendered: &str) -> Vec<String> {
    let old: BTreeSet<&str> = committed.lines().collect();
    let new: BTreeSet<&str> = rendered.lines().collect();
    let removed = old.difference(&new).map(|line| format!("- {line}"));
    let added = new.difference(&old).map(|line| format!("+ {line}"));
    removed.chain(added).collect()
}

#[cfg(test)]
mod tests {
    use super::difference;

    #[test]
    fn a_difference_lists_what_was_removed_and_what_was_added() {
        let committed = "pub fn a::f()\npub struct a::S\n";
        let rendered = "pub struct a::S\npub fn a::g()\n";
        assert_eq!(
            difference(committed, rendered),
            ["- pub fn a::f()", "+ pub fn a::g()"]
        );
        assert!(difference(committed, committed).is_empty());
    }
}
