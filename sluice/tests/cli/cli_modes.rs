//! The `sluice` binary against DynamoDB Local: shadow mode and scheduled limits, from a
//! bucket file to `status`.

use crate::cli_harness;

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

/// `HH:MM` (UTC) `offset` minutes from now.
fn utc_in(offset: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let minute = (i64::try_from(now / 60).unwrap() + offset).rem_euclid(24 * 60);
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

#[test]
fn a_schedule_is_applied_from_a_file_shown_by_a_dry_run_and_its_next_change_in_status() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    // A window from an hour ago until two hours from now: it holds while the test runs.
    let (from, to) = (utc_in(-60), utc_in(120));
    let file = cli.file(&format!(
        r#"
["batch#tpm"]
type = "tokens"
refill = "100/s"
capacity = 1000
schedule = [{{ from = "{from}", to = "{to}", capacity = 5000, refill = "500/s" }}]
"#
    ));
    let file = file.to_str().unwrap();
    let dry = cli.ok(&["apply", file, "--dry-run"]);
    assert!(
        dry.starts_with(&format!(
            "+ create    batch#tpm: tokens, capacity 5000, refill 500/s, cost per call 1, schedule {from}-{to} UTC capacity=5000 refill=500/s\n"
        )),
        "{dry}"
    );
    assert!(
        dry.contains(":00Z: capacity=1000 refill=100/s\n") && dry.contains("next change"),
        "{dry}"
    );
    cli.ok(&["apply", file]);
    assert_eq!(
        cli.json(&["bucket", "get", "batch#tpm", "--json"])["capacity"],
        5000
    );
    let status = cli.json(&["status", "--json"]);
    let next = &status[0]["next_change"];
    assert_eq!(next["capacity"], 1000);
    assert!(
        next["at"].as_str().unwrap().contains(&format!("T{to}:00Z")),
        "{next}"
    );
    assert!(cli.ok(&["status"]).contains("NEXT CHANGE"));
    // Nothing is due: the reconciler and a second apply leave it.
    assert!(cli.ok(&["reconcile"]).contains("0 schedules applied"));
    assert!(
        cli.ok(&["apply", file])
            .starts_with("= unchanged batch#tpm\n")
    );
    std::fs::remove_file(file).unwrap();
}
