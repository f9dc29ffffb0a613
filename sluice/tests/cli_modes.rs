//! The `sluice` binary against DynamoDB Local: shadow mode and scheduled limits, from a
//! bucket file to `status`.

mod cli_harness;
mod dynamo;

use cli_harness::Cli;

const SHADOW: &str = r#"
["slow#rpm"]
type = "requests"
refill = "1/min"
capacity = 1
mode = "shadow"
"#;

const ENFORCE: &str = r#"
["slow#rpm"]
type = "requests"
refill = "1/min"
capacity = 1
"#;

#[test]
fn shadow_mode_is_applied_from_a_file_counted_in_status_and_switched_off_by_one_apply() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    let shadow = cli.file(SHADOW);
    let applied = cli.ok(&["apply", shadow.to_str().unwrap()]);
    assert!(
        applied.contains(
            "+ create    slow#rpm: requests, capacity 1, refill 1/min, cost per call 1, shadow"
        ),
        "{applied}"
    );
    // Beyond capacity, never refused.
    for _ in 0..3 {
        cli.ok(&["acquire", "slow#rpm"]);
    }
    let status = cli.json(&["status", "--json"]);
    assert_eq!(status[0]["mode"], "shadow");
    assert_eq!(status[0]["shadow_refused"], 2);
    let text = cli.ok(&["status"]);
    assert!(text.contains("shadow (2 would refuse)"), "{text}");
    // One apply switches it to enforce.
    let enforce = cli.file(ENFORCE);
    let dry = cli.ok(&["apply", enforce.to_str().unwrap(), "--dry-run"]);
    assert!(
        dry.starts_with("~ update    slow#rpm: mode shadow -> enforce\n"),
        "{dry}"
    );
    cli.ok(&["apply", enforce.to_str().unwrap()]);
    cli.fails(&["acquire", "slow#rpm"], 75, "slow#rpm is short; retry in");
    // A client in shadow (`SLUICE_MODE`) is granted on an enforcing bucket, and counts.
    let out = cli
        .command(&["acquire", "slow#rpm"])
        .env("SLUICE_MODE", "shadow")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(cli.json(&["status", "--json"])[0]["shadow_refused"], 1);
    let bad = cli
        .command(&["acquire", "slow#rpm"])
        .env("SLUICE_MODE", "lenient")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("SLUICE_MODE"));
    for file in [shadow, enforce] {
        std::fs::remove_file(file).unwrap();
    }
}
