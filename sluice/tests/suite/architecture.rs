//! The shape of the core, checked: small files, short functions, and modules that depend
//! on each other in one direction only (see ARCHITECTURE.md).
//!
//! Reads `sluice/src` as text: a module's dependencies are the `crate::…`, `super::…` and
//! `self::…` paths in its code (test modules left out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 500;
const MAX_FN_LINES: usize = 80;

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The module path of a library file (`protocol/batch/mod.rs`: `protocol::batch`); `None`
/// for the binary's files.
fn module_of(file: &Path) -> Option<Vec<String>> {
    let relative = file.strip_prefix(src()).unwrap();
    if relative.starts_with("bin") {
        return None;
    }
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    if parts.last().is_some_and(|p| p == "private") {
        parts.pop();
        parts.push("__private".to_owned());
    }
    Some(parts)
}

/// The file's code without its test module and comments.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_test_file(file: &Path) -> bool {
    file.file_name().is_some_and(|n| n == "tests.rs")
}

/// The modules `code` (of module `me`) refers to, among `known`.
fn references(me: &[String], code: &str, known: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    for (i, _) in code.match_indices("::") {
        // The path this `::` belongs to, from its first segment.
        let mut start = i;
        while start > 0 && (ident(bytes[start - 1]) || code[..start].ends_with("::")) {
            start -= if code[..start].ends_with("::") { 2 } else { 1 };
        }
        if start > 0 && bytes[start - 1] == b':' {
            continue;
        }
        let end = code[i..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .map_or(code.len(), |e| i + e);
        let path: Vec<&str> = code[start..end]
            .split("::")
            .filter(|s| !s.is_empty())
            .collect();
        let mut base: Vec<String> = match path.first() {
            Some(&"crate") => Vec::new(),
            Some(&"super") => me[..me.len().saturating_sub(1)].to_vec(),
            Some(&"self") => me.to_vec(),
            _ => continue,
        };
        let mut target = base.clone();
        for segment in &path[1..] {
            if *segment == "super" {
                base.pop();
                target = base.clone();
                continue;
            }
            base.push((*segment).to_owned());
            if known.contains(&base) {
                target = base.clone();
            } else {
                break;
            }
        }
        found.insert(target);
    }
    found
}

/// Whether `a` contains `b` or `b` contains `a`.
fn nested(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// A cycle in `graph`, if any.
fn cycle(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    fn visit(
        node: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        path: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            return Some(path[i..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

fn show(path: &[Vec<String>]) -> String {
    path.iter()
        .map(|m| m.join("::"))
        .collect::<Vec<_>>()
        .join(" -> ")
}

#[test]
fn no_source_file_is_over_500_lines() {
    let long: Vec<String> = sources(&src())
        .into_iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(&f).unwrap().lines().count();
            (lines > MAX_FILE_LINES).then(|| format!("{}: {lines} lines", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "{long:#?}");
}

#[test]
fn no_function_is_over_80_lines() {
    let mut long = Vec::new();
    for file in sources(&src()) {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            let is_fn = [
                "fn ",
                "pub fn ",
                "async fn ",
                "pub(crate) fn ",
                "pub(super) fn ",
            ]
            .iter()
            .chain(&[
                "pub async fn ",
                "pub(crate) async fn ",
                "pub(super) async fn ",
            ])
            .chain(&["const fn ", "pub const fn ", "pub(crate) const fn "])
            .any(|p| trimmed.starts_with(p));
            if !is_fn || line.trim_end().ends_with(';') {
                continue;
            }
            let indent = &line[..line.len() - trimmed.len()];
            let end = lines[i..]
                .iter()
                .position(|l| *l == format!("{indent}}}"))
                .map_or(lines.len() - i, |n| n + 1);
            if end > MAX_FN_LINES {
                long.push(format!("{}:{}: {end} lines", file.display(), i + 1));
            }
        }
    }
    assert!(long.is_empty(), "{long:#?}");
}

#[test]
fn the_core_modules_depend_on_each_other_in_one_direction() {
    let files: Vec<(Vec<String>, PathBuf)> = sources(&src())
        .into_iter()
        .filter(|f| !is_test_file(f))
        .filter_map(|f| module_of(&f).map(|m| (m, f)))
        .collect();
    let known: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    let mut top: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &files {
        let text = code(&std::fs::read_to_string(file).unwrap());
        for target in references(module, &text, &known) {
            // A module and what it contains are one unit.
            if target.is_empty() || nested(module, &target) {
                continue;
            }
            graph
                .entry(module.clone())
                .or_default()
                .insert(target.clone());
            if module[0] != target[0] {
                top.entry(module[..1].to_vec())
                    .or_default()
                    .insert(target[..1].to_vec());
            }
        }
    }
    assert_eq!(
        cycle(&top),
        None,
        "top-level modules import each other in a circle"
    );
    if let Some(c) = cycle(&graph) {
        panic!("modules import each other in a circle: {}", show(&c));
    }
    // The store is below the protocols and the client: it never imports them.
    let store = &top[&vec!["store".to_owned()]];
    for above in ["client", "protocol", "shared", "lease"] {
        assert!(
            !store.contains(&vec![above.to_owned()]),
            "the store imports `{above}`"
        );
    }
}

#[test]
fn the_circle_check_sees_a_circle() {
    let known: BTreeSet<Vec<String>> = [vec!["a".to_owned()], vec!["b".to_owned()]]
        .into_iter()
        .collect();
    let a = references(&["a".to_owned()], "use crate::b::Thing;", &known);
    let b = references(&["b".to_owned()], "fn f() { super::a::g() }", &known);
    assert_eq!(a, BTreeSet::from([vec!["b".to_owned()]]));
    assert_eq!(b, BTreeSet::from([vec!["a".to_owned()]]));
    let graph = BTreeMap::from([(vec!["a".to_owned()], a), (vec!["b".to_owned()], b)]);
    assert!(cycle(&graph).is_some());
}
