//! The `sluice` binary's flags for scripts and people: `RUST_LOG`, `apply --dry-run
//! --detailed-exitcode`, `--json` for `apply` and `acquire`, shell completions, and the bars
//! of `status --watch` (against DynamoDB Local).

use crate::cli_harness;

use serde_json::Value;

use cli_harness::{Cli, FILE};

#[test]
fn rust_log_chooses_what_is_logged_unless_verbose_flags_do() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    let run = |rust_log: &str, args: &[&str]| {
        let output = cli
            .command(args)
            .env("RUST_LOG", rust_log)
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        (output.status.code(), stderr)
    };
    let (code, quiet) = run("", &["bucket", "list"]);
    assert_eq!(code, Some(0));
    assert!(!quiet.contains("DEBUG"), "{quiet}");
    let (code, debug) = run("debug", &["bucket", "list"]);
    assert_eq!(code, Some(0));
    assert!(debug.contains("DEBUG"), "{debug}");
    // Directives by target: the SDK's debug lines only.
    let (_, smithy) = run("warn,aws_smithy_runtime=debug", &["bucket", "list"]);
    assert!(smithy.contains("aws_smithy_runtime"), "{smithy}");
    assert!(!smithy.contains("aws_config"), "{smithy}");
    // -v wins over RUST_LOG.
    let (_, verbose) = run("debug", &["-v", "bucket", "list"]);
    assert!(!verbose.contains("DEBUG"), "{verbose}");
    let (code, bad) = run("sluice=loud", &["bucket", "list"]);
    assert_eq!(code, Some(2), "{bad}");
    assert!(
        bad.contains("RUST_LOG=\"sluice=loud\" is not a log filter"),
        "{bad}"
    );
}

#[test]
fn apply_dry_run_with_a_detailed_exit_code_says_whether_changes_are_pending() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    let file = cli.file(FILE);
    let file = file.to_str().unwrap();
    let args = ["apply", file, "--dry-run", "--detailed-exitcode"];
    let pending = cli.fails(&args, 2, "3 change(s) pending");
    assert!(
        pending
            .stdout
            .ends_with("dry run: 3 change(s), nothing applied\n"),
        "{}",
        pending.stdout
    );
    cli.ok(&["apply", file]);
    let none = cli.ok(&args);
    assert!(
        none.ends_with("dry run: 0 change(s), nothing applied\n"),
        "{none}"
    );
    // Bad input is a failure (1), never mistaken for "changes pending" (2).
    let bad = cli.file("not toml at all");
    cli.fails(
        &[
            "apply",
            bad.to_str().unwrap(),
            "--dry-run",
            "--detailed-exitcode",
        ],
        1,
        "expected",
    );
    // So is a missing table (otherwise 3), and a bad RUST_LOG (otherwise 2).
    let missing = cli
        .command(&args)
        .env("SLUICE_TABLE_NAME", "sluice-no-such-table")
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let bad_log = cli
        .command(&args)
        .env("RUST_LOG", "x=loud")
        .output()
        .unwrap();
    assert_eq!(bad_log.status.code(), Some(1));
    // Only with --dry-run (a usage error clap reports before anything runs).
    cli.fails(&["apply", file, "--detailed-exitcode"], 2, "--dry-run");
}

#[test]
fn apply_json_gives_the_plan_and_what_was_applied() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    cli.ok(&[
        "bucket",
        "put",
        "eleven#concurrent",
        "--type",
        "concurrent",
        "--capacity",
        "5",
    ]);
    cli.ok(&[
        "bucket", "put", "old#rpm", "--type", "requests", "--refill", "1/s",
    ]);
    let file = cli.file(FILE);
    let file = file.to_str().unwrap();
    let plan = cli.json(&["apply", file, "--dry-run", "--json"]);
    assert_eq!(plan["dry_run"], true);
    assert_eq!(plan["writes"], 3);
    assert_eq!(plan["applied"], 0);
    let changes = plan["changes"].as_array().unwrap();
    let actions: Vec<(&str, &str)> = changes
        .iter()
        .map(|c| {
            (
                c["dimension"].as_str().unwrap(),
                c["action"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("eleven#concurrent", "update"),
            ("old#rpm", "not_in_file"),
            ("openai#rpm", "create"),
            ("openai#tpm", "create"),
        ]
    );
    assert_eq!(changes[0]["from"]["capacity"], 5);
    assert_eq!(changes[0]["to"]["capacity"], 10);
    assert_eq!(changes[2]["to"]["type"], "requests");
    assert_eq!(changes[2]["to"]["capacity"], 500);
    let applied = cli.json(&["apply", file, "--prune", "--json"]);
    assert_eq!(applied["dry_run"], false);
    assert_eq!(applied["writes"], 4);
    assert_eq!(applied["applied"], 4);
    let listed = cli.json(&["bucket", "list", "--json"]);
    let dimensions: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["dimension"].as_str().unwrap())
        .collect();
    assert_eq!(
        dimensions,
        ["eleven#concurrent", "openai#rpm", "openai#tpm"]
    );
}

#[test]
fn acquire_json_prints_one_event_per_line() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    cli.ok(&[
        "bucket",
        "put",
        "slow#rpm",
        "--type",
        "requests",
        "--refill",
        "1/min",
        "--capacity",
        "2",
    ]);
    let events = |out: &str| -> Vec<Value> {
        out.lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect()
    };
    let granted = events(&cli.ok(&["acquire", "slow#rpm", "--json"]));
    assert_eq!(granted.len(), 2, "{granted:?}");
    assert_eq!(granted[0]["event"], "granted");
    assert_eq!(granted[0]["dimension"], "slow#rpm");
    assert_eq!(granted[0]["cost"], 1);
    assert!(granted[0]["expires_in_ms"].as_u64().unwrap() > 0);
    let lease = granted[0]["lease"].as_str().unwrap();
    assert!(lease.starts_with("lease#slow#rpm#"), "{lease}");
    assert_eq!(
        granted[1],
        serde_json::json!({"event": "released", "lease": lease})
    );
    let kept = events(&cli.ok(&["acquire", "slow#rpm", "--json", "--keep"]));
    assert_eq!(kept[1]["event"], "kept");
    let denied = cli.fails(&["acquire", "slow#rpm", "--json"], 75, "retry in");
    let denied = events(&denied.stdout);
    assert_eq!(denied[0]["event"], "retry_in");
    let delay = denied[0]["retry_in_ms"].as_u64().unwrap();
    assert!(delay > 0 && delay <= 61_000, "{delay}");
}

#[test]
fn completions_are_printed_for_each_shell_without_a_table() {
    // No table, no endpoint: completions need neither (nor DynamoDB Local).
    let completions = |shell: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["completions", shell])
            .env_remove("SLUICE_TABLE_NAME")
            .env_remove("SLUICE_ENDPOINT_URL")
            .output()
            .unwrap()
    };
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef sluice"),
        ("fish", "complete -c sluice"),
        ("powershell", "Register-ArgumentCompleter"),
        ("elvish", "edit:completion"),
    ] {
        let output = completions(shell);
        assert_eq!(output.status.code(), Some(0), "{shell}");
        let script = String::from_utf8(output.stdout).unwrap();
        assert!(script.contains(marker), "{shell}: {script}");
        // Every subcommand and a flag of one are in it.
        for word in [
            "apply",
            "status",
            "reconcile",
            "acquire",
            "detailed-exitcode",
        ] {
            assert!(script.contains(word), "{shell} lacks {word}");
        }
    }
    let unknown = completions("tcsh");
    assert_eq!(unknown.status.code(), Some(2));
    let stderr = String::from_utf8(unknown.stderr).unwrap();
    assert!(stderr.contains("invalid value 'tcsh'"), "{stderr}");
}

#[test]
fn status_watch_draws_a_bar_and_a_sparkline_per_bucket() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    cli.ok(&[
        "bucket",
        "put",
        "eleven#concurrent",
        "--type",
        "concurrent",
        "--capacity",
        "4",
    ]);
    cli.ok(&["acquire", "eleven#concurrent", "--keep", "--ttl", "10m"]);
    let watched = cli.ok(&["status", "--watch", "50ms", "--count", "3"]);
    let bars: Vec<&str> = watched
        .lines()
        .filter(|l| l.starts_with("eleven#concurrent") && l.contains('░'))
        .collect();
    assert_eq!(bars.len(), 3, "{watched}");
    // Three of four slots free: 15 of 20 cells, 75%, and one sample more each frame.
    assert!(
        bars[0].contains(&format!("{}{}", "█".repeat(15), "░".repeat(5))),
        "{}",
        bars[0]
    );
    assert!(bars[0].contains("3/4   75%  ▆"), "{}", bars[0]);
    assert!(bars[2].ends_with("75%  ▆▆▆"), "{}", bars[2]);
    assert_eq!(watched.matches("LAST 3s").count(), 3, "{watched}");
    // Without --watch, no bars.
    assert!(!cli.ok(&["status"]).contains('░'));
}

#[test]
fn table_create_warms_the_table_when_asked() {
    let Some(local) = Cli::new() else { return };
    // DynamoDB Local through dynamodb-fidelity, whose tables are cold on-demand tables of
    // 10 write units a second until warmed.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let proxy = runtime
        .block_on(dynamodb_fidelity::Fidelity::start(
            dynamodb_fidelity::Config {
                upstream: local.endpoint.clone(),
                table: Some(dynamodb_fidelity::TableModel {
                    initial_write: 10.0,
                    quota_write: 1_000.0,
                    peak_window: std::time::Duration::from_secs(3_600),
                    ..dynamodb_fidelity::TableModel::default()
                }),
                ..dynamodb_fidelity::Config::default()
            },
        ))
        .unwrap();
    let cli = Cli {
        endpoint: proxy.endpoint(),
        table: local.table.clone(),
    };
    let said = cli.ok(&["table", "create", "--warm-writes", "500"]);
    assert!(
        said.contains(&format!(
            "warming table {} to 500 writes and 0 reads a second",
            cli.table
        )),
        "{said}"
    );
    // 100 writes at once: a cold table of 10 a second would throttle from the eleventh.
    let client = crate::dynamo::client(&proxy.endpoint());
    runtime.block_on(async {
        for i in 0..100 {
            client
                .put_item()
                .table_name(&cli.table)
                .item("vendor_dimension", crate::dynamo::s(&format!("warm#{i}")))
                .send()
                .await
                .unwrap_or_else(|e| panic!("write {i} of a warmed table: {e:?}"));
        }
    });
    let throttled = proxy.stats().totals().throttled_writes;
    assert_eq!(throttled, 0);
}
