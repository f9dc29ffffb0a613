//! The guide's pages and the README as a reader meets them: every markdown table has rows,
//! and every relative link reaches a file that exists (and, with `#anchor`, a heading in
//! it). Code blocks are skipped; their Rust is compiled by the examples crate's doctests.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The page's lines outside fenced code blocks, numbered from 1.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((i + 1, line));
        }
    }
    lines
}

/// GitHub's anchor for a heading: lower case, punctuation dropped but `-` and `_`, spaces
/// as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings (a repeated heading's second anchor ends `-1`).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let base = slug(heading.trim_start_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while !seen.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    seen
}

/// The targets of the page's inline links `[text](target)` on a line.
fn links(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        found.push(after[..end].trim().to_owned());
        rest = &after[end..];
    }
    found
}

/// What is wrong with the tables of `text`: a header and separator with no row under them.
fn empty_tables(text: &str) -> Vec<usize> {
    let lines = prose(text);
    let mut empty = Vec::new();
    for (k, (n, line)) in lines.iter().enumerate() {
        let separator = line.trim_start().starts_with('|')
            && line.contains("---")
            && line.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '));
        if !separator {
            continue;
        }
        let row = lines
            .get(k + 1)
            .filter(|(m, _)| *m == n + 1)
            .is_some_and(|(_, next)| next.trim_start().starts_with('|'));
        if !row {
            empty.push(*n);
        }
    }
    empty
}

/// What is wrong with the links of the page at `path`.
fn broken_links(path: &Path, text: &str) -> Vec<String> {
    let dir = path.parent().unwrap();
    let mut broken = Vec::new();
    for (n, line) in prose(text) {
        for target in links(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target.as_str(), ""));
            let file = file.split_whitespace().next().unwrap_or("");
            if file.is_empty() {
                if !anchors(text).contains(anchor) {
                    broken.push(format!(
                        "{}:{n}: {target} (no such heading)",
                        path.display()
                    ));
                }
                continue;
            }
            let linked = dir.join(file);
            if !linked.exists() {
                broken.push(format!("{}:{n}: {target} (no such file)", path.display()));
                continue;
            }
            let markdown = linked.extension().is_some_and(|e| e == "md");
            if !anchor.is_empty() && markdown {
                let page = std::fs::read_to_string(&linked).unwrap();
                if !anchors(&page).contains(anchor) {
                    broken.push(format!(
                        "{}:{n}: {target} (no such heading)",
                        path.display()
                    ));
                }
            }
        }
    }
    broken
}

#[test]
fn every_table_has_rows_and_every_relative_link_resolves() {
    let mut problems = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for n in empty_tables(&text) {
            problems.push(format!("{}:{n}: a table with no rows", page.display()));
        }
        problems.extend(broken_links(&page, &text));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn the_check_finds_an_empty_table_and_broken_links() {
    let text = "# Title\n\n| a | b |\n|---|---|\n\nSee [x](missing.md), [y](#nowhere) and [z](#title).\n\n```text\n[skipped](missing.md)\n```\n";
    assert_eq!(empty_tables(text), [4]);
    let here = root().join("docs").join("page.md");
    let broken = broken_links(&here, text);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].contains("missing.md") && broken[1].contains("#nowhere"));
    let across = broken_links(
        &root().join("README.md"),
        "[a](docs/layers.md#no-such-heading)\n",
    );
    assert_eq!(across.len(), 1, "{across:?}");
    assert_eq!(slug(" Tower: `SluiceLayer`"), "tower-sluicelayer");
    assert_eq!(
        slug("async-openai, and getting the delay back"),
        "async-openai-and-getting-the-delay-back"
    );
}
