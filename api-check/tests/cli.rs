//! The checker as CI runs it: its answers to JSON it cannot read, a matching description
//! and a differing one. (The rendering itself is the `public-api` crate's; the committed
//! descriptions under `api/` are its output for this workspace's crates.)

use std::path::PathBuf;
use std::process::Command;

fn check(args: &[&std::ffi::OsStr]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_api-check"))
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("api-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn json_of_another_format_is_refused_with_the_version_it_reads() {
    let json = scratch("old.json");
    std::fs::write(&json, r#"{"format_version": 56}"#).unwrap();
    let file = scratch("old.txt");
    let (code, text) = check(&[json.as_os_str(), file.as_os_str()]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("format Some(56)") && text.contains("format 57"),
        "{text}"
    );
}

#[test]
fn without_two_paths_it_says_how_to_call_it() {
    let (code, text) = check(&[]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("usage: api-check"), "{text}");
}
