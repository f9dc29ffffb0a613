//! The `sluice` binary against DynamoDB Local: every subcommand, its output, its exit codes,
//! and a crashed caller's slot given back by `sluice reconcile`.

mod cli_flags;
mod cli_harness;
mod cli_modes;
#[path = "../dynamo/mod.rs"]
mod dynamo;
mod iam_policies;

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use cli_harness::{Cli, FILE};

#[test]
fn table_create_is_idempotent_and_a_missing_table_is_a_clear_error() {
    let Some(cli) = Cli::new() else { return };
    cli.fails(
        &["bucket", "list"],
        3,
        "does not exist; create it with `sluice table create`",
    );
    cli.fails(&["status"], 3, "sluice table create");
    assert_eq!(
        cli.ok(&["table", "create"]),
        format!("created table {}\n", cli.table)
    );
    assert_eq!(
        cli.ok(&["table", "create"]),
        format!("table {} already exists\n", cli.table)
    );
    // No table configured at all.
    let run = cli
        .command(&["bucket", "list"])
        .env_remove("SLUICE_TABLE_NAME")
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("SLUICE_TABLE_NAME"));
}

#[test]
fn bucket_put_get_list_delete() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    assert_eq!(
        cli.ok(&[
            "bucket",
            "put",
            "openai#rpm",
            "--type",
            "requests",
            "--refill",
            "500/min"
        ]),
        "openai#rpm: requests, capacity 500, refill 500/min, cost per call 1\n"
    );
    cli.ok(&[
        "bucket",
        "put",
        "eleven#concurrent",
        "--type",
        "concurrent",
        "--capacity",
        "3",
    ]);
    let rpm = cli.json(&["bucket", "get", "openai#rpm", "--json"]);
    assert_eq!(rpm["type"], "requests");
    assert_eq!(rpm["capacity"], 500);
    assert_eq!(rpm["tokens"], 500);
    assert_eq!(rpm["refill"], "500/min");
    // The seed's tokens per second, as a JSON number (its 38 digits read as a float).
    assert!(rpm["refill_per_second"].is_f64());
    assert_eq!(rpm["cost_per_call"], 1);
    let text = cli.ok(&["bucket", "get", "eleven#concurrent"]);
    assert!(text.contains("type            concurrent"), "{text}");
    let list = cli.ok(&["bucket", "list"]);
    let lines: Vec<&str> = list.lines().collect();
    assert!(lines[0].starts_with("DIMENSION"), "{list}");
    assert!(
        lines[1].starts_with("eleven#concurrent  concurrent  3"),
        "{list}"
    );
    assert!(
        lines[2].starts_with("openai#rpm         requests    500"),
        "{list}"
    );
    let all = cli.json(&["bucket", "list", "--json"]);
    assert_eq!(all.as_array().unwrap().len(), 2);
    // Spread over four rows: the dimension's own row holds a quarter, and says so.
    assert_eq!(
        cli.ok(&["bucket", "shards", "openai#rpm", "4"]),
        "openai#rpm: 4 row(s)\n"
    );
    let shard0 = cli.json(&["bucket", "get", "openai#rpm", "--json"]);
    assert_eq!(
        (shard0["capacity"].clone(), shard0["shards"].clone()),
        (125.into(), 4.into())
    );
    // `status` shows the bucket whole, with its count of rows.
    let status = cli.ok(&["status", "openai#rpm"]);
    let (header, row) = (
        status.lines().next().unwrap(),
        status.lines().nth(1).unwrap(),
    );
    assert!(header.contains("ROWS"), "{status}");
    assert!(row.starts_with("openai#rpm  requests  500"), "{status}");
    assert!(row.trim_end().ends_with('4'), "{status}");
    let whole = cli.json(&["status", "openai#rpm", "--json"]);
    assert_eq!(
        (whole[0]["capacity"].clone(), whole[0]["shards"].clone()),
        (500.into(), 4.into())
    );
    assert_eq!(
        cli.ok(&["bucket", "shards", "openai#rpm", "1"]),
        "openai#rpm: 1 row(s)\n"
    );
    assert_eq!(
        cli.json(&["bucket", "get", "openai#rpm", "--json"])["tokens"],
        500
    );
    cli.fails(
        &["bucket", "shards", "eleven#concurrent", "2"],
        2,
        "stays in one row",
    );
    cli.fails(&["bucket", "shards", "openai#rpm", "33"], 2, "1 to 32 rows");
    assert_eq!(
        cli.ok(&["bucket", "delete", "eleven#concurrent"]),
        "deleted eleven#concurrent\n"
    );
    cli.fails(
        &["bucket", "delete", "eleven#concurrent"],
        3,
        "no bucket is defined for `eleven#concurrent`",
    );
    cli.fails(
        &["bucket", "get", "nobody#rpm"],
        3,
        "no bucket is defined for `nobody#rpm`",
    );
    cli.fails(&["bucket", "get", "no-hash"], 2, "exactly one `#`");
    cli.fails(
        &["bucket", "put", "a#b", "--type", "requests"],
        2,
        "needs a refill rate",
    );
    assert_eq!(
        cli.ok(&[
            "bucket", "put", "lean#rpm", "--type", "requests", "--refill", "10/s", "--lean"
        ]),
        "lean#rpm: requests, capacity 600, refill 10/s, cost per call 1, lean\n"
    );
    assert_eq!(
        cli.json(&["bucket", "get", "lean#rpm", "--json"])["lean"],
        true
    );
    assert_eq!(
        cli.json(&["bucket", "get", "openai#rpm", "--json"])["lean"],
        false
    );
    cli.fails(
        &[
            "bucket",
            "put",
            "a#b",
            "--type",
            "concurrent",
            "--capacity",
            "2",
            "--lean",
        ],
        2,
        "cannot be lean",
    );
    cli.fails(
        &[
            "bucket", "put", "a#b", "--type", "requests", "--refill", "fast",
        ],
        2,
        "is not a rate",
    );
}

#[test]
fn apply_shows_the_plan_applies_it_and_prunes_on_request() {
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
    let dry = cli.ok(&["apply", file, "--dry-run"]);
    assert_eq!(
        dry,
        "~ update    eleven#concurrent: capacity 5 -> 10\n\
         ? not in file old#rpm (kept; --prune deletes it)\n\
         + create    openai#rpm: requests, capacity 500, refill 500/min, cost per call 1\n\
         + create    openai#tpm: tokens, capacity 2000000, refill 2000000/min, cost per call 1\n\
         dry run: 3 change(s), nothing applied\n"
    );
    // A dry run changes nothing.
    assert_eq!(
        cli.json(&["bucket", "list", "--json"])
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let applied = cli.ok(&["apply", file]);
    assert!(applied.ends_with("applied 3 change(s)\n"), "{applied}");
    assert_eq!(
        cli.json(&["bucket", "get", "eleven#concurrent", "--json"])["capacity"],
        10
    );
    let again = cli.ok(&["apply", file, "--prune"]);
    assert_eq!(
        again,
        "= unchanged eleven#concurrent\n\
         - delete    old#rpm\n\
         = unchanged openai#rpm\n\
         = unchanged openai#tpm\n\
         applied 1 change(s)\n"
    );
    cli.fails(&["bucket", "get", "old#rpm"], 3, "old#rpm");
}

#[test]
fn apply_keeps_a_spread_bucket_whole() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    let file = cli.file(
        "[\"openai#rpm\"]\ntype = \"requests\"\nrefill = \"500/min\"\ncapacity = 500\nshards = 4\n",
    );
    let file = file.to_str().unwrap();
    let applied = cli.ok(&["apply", file]);
    assert!(
        applied.starts_with("+ create    openai#rpm: requests, capacity 500, refill 500/min, cost per call 1, rows 4\n"),
        "{applied}"
    );
    let rows = || {
        cli.json(&["bucket", "list", "--json"])
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["shards"] == 4)
            .count()
    };
    assert_eq!(rows(), 4, "every row of the bucket, each saying 4");
    // Applied again, pruning: the bucket is compared whole, its shard rows are its own.
    assert_eq!(
        cli.ok(&["apply", file, "--prune"]),
        "= unchanged openai#rpm\napplied 0 change(s)\n"
    );
    assert_eq!(rows(), 4, "no shard row pruned");
}

#[test]
fn apply_rejects_a_bad_file_before_touching_the_table() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    let cases = [
        (
            "[\"openai#rpm\"]\ntype = \"requests\"\n",
            "[\"openai#rpm\"]: a requests bucket needs a refill rate",
        ),
        (
            "[\"openai\"]\ntype = \"concurrent\"\ncapacity = 1\n",
            "exactly one `#`",
        ),
        (
            "[\"a#b\"]\ntype = \"concurrent\"\ncapacty = 1\n",
            "unknown field `capacty`",
        ),
        (
            "[\"a#b\"]\ntype = \"tokens\"\nrefill = \"10/s\"\ncapacity = 5\ncost_per_call = 6\n",
            "cost per call",
        ),
        ("this is not toml", "expected"),
    ];
    for (text, message) in cases {
        let file = cli.file(text);
        cli.fails(&["apply", file.to_str().unwrap()], 2, message);
    }
    cli.fails(
        &["apply", "/nonexistent/buckets.toml"],
        2,
        "cannot read /nonexistent/buckets.toml",
    );
    assert_eq!(
        cli.json(&["bucket", "list", "--json"]),
        serde_json::json!([])
    );
}

#[test]
fn status_shows_every_bucket_as_a_table_or_json_and_watches() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    cli.ok(&["apply", cli.file(FILE).to_str().unwrap()]);
    cli.ok(&["acquire", "eleven#concurrent", "--keep", "--ttl", "10m"]);
    cli.ok(&[
        "bucket",
        "put",
        "vendor#tpm",
        "--type",
        "tokens",
        "--refill",
        "10/s",
        "--lean",
    ]);
    let table = cli.ok(&["status"]);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        [
            "DIMENSION",
            "TYPE",
            "CAPACITY",
            "AVAILABLE",
            "REFILL",
            "LEASES",
            "TIME",
            "TO",
            "FULL"
        ]
    );
    assert_eq!(
        rows[1],
        [
            "eleven#concurrent",
            "concurrent",
            "10",
            "9",
            "0/s",
            "1",
            "on",
            "release"
        ]
    );
    assert_eq!(
        rows[2],
        [
            "openai#rpm",
            "requests",
            "500",
            "500",
            "500/min",
            "0",
            "full"
        ]
    );
    assert_eq!(rows[3][0], "openai#tpm");
    assert_eq!(rows[4][0], "vendor#tpm");
    assert_eq!(rows[4][5], "lean", "a lean bucket has no leases to count");
    // Columns line up.
    let at = |line: &str, word: &str| line.find(word).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(at(lines[0], "AVAILABLE"), at(lines[1], " 9 ") + 1);
    let json = cli.json(&["status", "--json"]);
    let rows = json.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[3]["lean"], true);
    assert_eq!(rows[0]["lean"], false);
    let concurrent = &rows[0];
    let mut keys: Vec<&str> = concurrent
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "available",
            "available_by_priority",
            "burst",
            "capacity",
            "cost_per_call",
            "dimension",
            "expired_leases",
            "lean",
            "leased",
            "live_leases",
            "mode",
            "next_change",
            "refill",
            "refill_per_second",
            "reserves",
            "shadow_refused",
            "shards",
            "time_to_full_ms",
            "type",
            "version"
        ]
    );
    assert_eq!(concurrent["dimension"], "eleven#concurrent");
    assert_eq!(concurrent["available"], 9);
    assert_eq!(concurrent["live_leases"], 1);
    assert_eq!(concurrent["time_to_full_ms"], Value::Null);
    assert_eq!(rows[1]["time_to_full_ms"], 0);
    let one = cli.json(&["status", "openai#tpm", "--json"]);
    assert_eq!(one.as_array().unwrap().len(), 1);
    cli.fails(&["status", "nobody#rpm"], 3, "nobody#rpm");
    let watched = cli.ok(&["status", "--watch", "100ms", "--count", "3"]);
    assert_eq!(watched.matches("TIME TO FULL").count(), 3, "{watched}");
    assert_eq!(watched.matches(&format!("{} at ", cli.table)).count(), 3);
}

#[test]
fn reserves_are_put_applied_shown_and_kept_from_lower_priorities() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    cli.ok(&[
        "bucket",
        "put",
        "team#rpm",
        "--type",
        "requests",
        "--refill",
        "1/min",
        "--capacity",
        "10",
        "--reserve",
        "interactive=20%",
        "--reserve",
        "standard=3",
    ]);
    let row = cli.json(&["bucket", "get", "team#rpm", "--json"]);
    assert_eq!(
        row["reserves"],
        serde_json::json!([
            {"priority": "interactive", "tokens": 2},
            {"priority": "standard", "tokens": 3}
        ])
    );
    // `batch` leaves 5: five grants, then denied; `interactive` takes the rest.
    for _ in 0..5 {
        cli.ok(&["acquire", "team#rpm", "--priority", "batch"]);
    }
    cli.fails(
        &["acquire", "team#rpm", "--priority", "batch"],
        75,
        "retry in",
    );
    cli.ok(&[
        "acquire",
        "team#rpm",
        "--priority",
        "standard",
        "--cost",
        "3",
    ]);
    // Whole tokens: the bucket refills a little while the test runs.
    let whole = |v: &Value| v.to_string().split('.').next().unwrap().to_owned();
    let status = cli.json(&["status", "team#rpm", "--json"]);
    let by_priority = &status[0]["available_by_priority"];
    assert_eq!(
        ["interactive", "standard", "*"].map(|p| whole(&by_priority[p])),
        ["2", "0", "0"]
    );
    let table = cli.ok(&["status", "team#rpm"]);
    assert!(
        table.lines().next().unwrap().ends_with("BY PRIORITY"),
        "{table}"
    );
    for shown in [" interactive=2", " standard=0", " *=0"] {
        assert!(table.contains(shown), "{table}");
    }
    cli.fails(
        &["acquire", "team#rpm", "--priority", "batch", "--cost", "6"],
        2,
        "priority `batch` may take",
    );
    cli.fails(
        &[
            "bucket",
            "put",
            "team#rpm",
            "--type",
            "requests",
            "--refill",
            "1/min",
            "--reserve",
            "x=lots",
        ],
        2,
        "not a number of tokens or a percentage",
    );
    // The file's reserves replace them, and the plan says so.
    let file = cli.file(
        "[\"team#rpm\"]\ntype = \"requests\"\nrefill = \"1/min\"\ncapacity = 10\nreserves = [{ priority = \"interactive\", reserve = 4 }]\n",
    );
    let plan = cli.ok(&["apply", file.to_str().unwrap(), "--dry-run"]);
    assert!(
        plan.contains("reserves interactive=2, standard=3 -> interactive=4"),
        "{plan}"
    );
    cli.ok(&["apply", file.to_str().unwrap()]);
    let text = cli.ok(&["bucket", "get", "team#rpm"]);
    assert!(text.contains("reserves        interactive=4"), "{text}");
}

#[test]
fn a_burst_learned_from_the_vendor_is_shown_and_kept_by_a_redefinition() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    let put = [
        "bucket",
        "put",
        "openai#rpm",
        "--type",
        "requests",
        "--refill",
        "600/min",
    ];
    cli.ok(&put);
    // Another process's middleware saw the vendor: 9 left, full in 100 ms.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = sluice::DynamoStore::new(dynamo::client(&cli.endpoint), cli.table.clone());
        let sluice = sluice::Sluice::builder().store(store).build().unwrap();
        let report = sluice::bucket::Report {
            remaining: sluice::Tokens::new(9),
            full_in: Duration::from_millis(100),
            counted_after: sluice.now(),
        };
        assert!(
            sluice
                .tighten("openai#rpm", sluice::admin::Tighten::Reported(report))
                .await
                .unwrap()
        );
    });
    let status = cli.ok(&["status"]);
    assert!(status.contains("600 (burst 10)"), "{status}");
    let json = cli.json(&["status", "openai#rpm", "--json"]);
    assert_eq!(json[0]["burst"], 10);
    assert_eq!(json[0]["capacity"], 600);
    // Putting the same definition again keeps what the vendor showed.
    cli.ok(&put);
    let row = cli.json(&["bucket", "get", "openai#rpm", "--json"]);
    assert_eq!(row["burst"], 10);
    let text = cli.ok(&["bucket", "get", "openai#rpm"]);
    assert!(text.contains("burst           10"), "{text}");
}

#[test]
fn acquire_grants_releases_and_answers_retry_in_with_its_own_exit_code() {
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
        "1",
    ]);
    let out = cli.ok(&["acquire", "slow#rpm"]);
    assert!(out.starts_with("granted lease#slow#rpm#"), "{out}");
    assert!(out.ends_with("released\n"), "{out}");
    let denied = cli.fails(&["acquire", "slow#rpm"], 75, "slow#rpm is short; retry in");
    assert!(denied.stdout.starts_with("retry in "), "{}", denied.stdout);
    cli.fails(
        &["acquire", "slow#rpm", "--cost", "2"],
        2,
        "exceeds the capacity",
    );
    // The message names the table it looked in.
    cli.fails(
        &["acquire", "nobody#rpm"],
        3,
        &format!(
            "no bucket is defined for `nobody#rpm` in DynamoDB table `{}`",
            cli.table
        ),
    );
    cli.fails(
        &["acquire", "slow#rpm", "--hold", "2m", "--ttl", "1m"],
        2,
        "longer than the lease",
    );
    cli.fails(
        &["acquire", "slow#rpm", "--hold", "soon"],
        2,
        "is not a duration",
    );
}

#[test]
fn peek_says_what_an_acquire_would_get_takes_nothing_and_exits_like_it() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    cli.ok(&[
        "bucket",
        "put",
        "peeked#rpm",
        "--type",
        "requests",
        "--refill",
        "1/min",
        "--capacity",
        "2",
    ]);
    for _ in 0..3 {
        assert_eq!(
            cli.ok(&["peek", "peeked#rpm", "--cost", "2"]),
            "would be granted now\n"
        );
    }
    let json = cli.ok(&["peek", "peeked#rpm", "--json"]);
    let event: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(event["event"], "would_grant", "{json}");
    // Nothing was taken: both tokens are still there to acquire.
    cli.ok(&["acquire", "peeked#rpm", "--cost", "2"]);
    let denied = cli.fails(
        &["peek", "peeked#rpm"],
        75,
        "peeked#rpm is short; an acquire would be told to retry in",
    );
    assert!(
        denied.stdout.starts_with("would retry in "),
        "{}",
        denied.stdout
    );
    cli.fails(
        &["peek", "peeked#rpm", "--cost", "3"],
        2,
        "exceeds the capacity",
    );
    cli.fails(
        &["peek", "nobody#rpm"],
        3,
        "no bucket is defined for `nobody#rpm`",
    );
}

#[test]
fn bucket_reset_and_top_up_are_conditional_and_say_who_and_why() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    cli.ok(&[
        "bucket",
        "put",
        "fixed#tpm",
        "--type",
        "tokens",
        "--refill",
        "1/day",
        "--capacity",
        "100",
    ]);
    cli.ok(&["acquire", "fixed#tpm", "--cost", "90"]);
    let version = |cli: &Cli| {
        let row: Value =
            serde_json::from_str(&cli.ok(&["bucket", "get", "fixed#tpm", "--json"])).unwrap();
        row["version"].as_u64().unwrap()
    };
    let read = version(&cli);
    let done = cli.ok(&[
        "bucket",
        "top-up",
        "fixed#tpm",
        "30",
        "--why",
        "INC-7 refund",
        "--who",
        "alice",
        "--if-version",
        &read.to_string(),
    ]);
    assert!(done.contains("by alice: INC-7 refund"), "{done}");
    let stale = read.to_string();
    let refused = cli.fails(
        &[
            "bucket",
            "reset",
            "fixed#tpm",
            "--why",
            "again",
            "--if-version",
            &stale,
        ],
        1,
        "changed since it was read",
    );
    assert!(refused.stdout.is_empty(), "{}", refused.stdout);
    let json = cli.ok(&["bucket", "reset", "fixed#tpm", "--why", "INC-7", "--json"]);
    let event: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(event["version"].as_u64(), Some(version(&cli)), "{json}");
    assert_eq!(event["after"], serde_json::json!(100), "{json}");
    cli.fails(&["bucket", "reset", "fixed#tpm"], 2, "--why");
}

#[test]
fn reconcile_once_or_every_interval() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    let once = cli.ok(&["reconcile"]);
    assert_eq!(
        once,
        "0 expired leases: 0 restored (0 tokens), 0 already gone, 0 in their release grace; 0 concurrent buckets checked: 0 healed (0 tokens), 0 busy, 0 not raised (unreadable leases); 0 schedules applied; 0 idle keys removed; 0 errors\n"
    );
    let json = cli.json(&["reconcile", "--json"]);
    for key in [
        "leases_seen",
        "leases_restored",
        "tokens_restored",
        "leases_skipped",
        "leases_in_grace",
        "buckets_checked",
        "buckets_healed",
        "tokens_healed",
        "buckets_busy",
        "buckets_not_raised",
        "errors",
    ] {
        assert!(json.get(key).is_some(), "{key} missing from {json}");
    }
    let twice = cli.ok(&["reconcile", "--every", "100ms", "--count", "2", "--json"]);
    assert_eq!(twice.lines().count(), 2, "{twice}");
}

#[test]
fn a_killed_callers_slot_is_restored_by_one_reconcile_pass() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    cli.ok(&[
        "bucket",
        "put",
        "eleven#concurrent",
        "--type",
        "concurrent",
        "--capacity",
        "2",
    ]);
    // A caller takes a slot and is killed with SIGKILL while holding it.
    let mut child = cli
        .command(&[
            "acquire",
            "eleven#concurrent",
            "--ttl",
            "2s",
            "--hold",
            "2s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("granted"), "{line}");
    child.kill().unwrap();
    child.wait().unwrap();
    let status = cli.json(&["status", "--json"]);
    assert_eq!(status[0]["available"], 1);
    assert_eq!(status[0]["live_leases"], 1);
    // Before expiry there is nothing to restore.
    assert_eq!(cli.json(&["reconcile", "--json"])["leases_restored"], 0);
    // Expired, then the default clock-skew margin (1 s) has passed.
    std::thread::sleep(Duration::from_millis(3_100));
    let pass = cli.json(&["reconcile", "--json"]);
    assert_eq!(pass["leases_seen"], 1, "{pass}");
    assert_eq!(pass["leases_restored"], 1, "{pass}");
    assert_eq!(pass["tokens_restored"], 1, "{pass}");
    assert_eq!(pass["buckets_healed"], 0, "{pass}");
    let status = cli.json(&["status", "--json"]);
    assert_eq!(status[0]["available"], 2);
    assert_eq!(status[0]["live_leases"], 0);
    assert_eq!(status[0]["expired_leases"], 0);
    let second = cli.json(&["reconcile", "--json"]);
    assert_eq!(second["leases_seen"], 0, "{second}");
    assert_eq!(second["leases_restored"], 0, "{second}");
    assert_eq!(second["buckets_healed"], 0, "{second}");
    assert_eq!(cli.json(&["status", "--json"])[0]["available"], 2);
}

#[test]
fn status_shows_one_tenant_s_bucket_and_a_template_s_hottest_keys() {
    let Some(cli) = Cli::new() else { return };
    cli.ok(&["table", "create"]);
    let file = r#"
["ingest#rpm"]
type = "requests"
refill = "1/s"
capacity = 10
keyed = true

["ingest#rpm#@big"]
type = "requests"
refill = "5/s"
capacity = 100
"#;
    cli.ok(&["apply", cli.file(file).to_str().unwrap()]);
    let fields = |table: String| -> Vec<String> {
        table
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    // A tenant never seen: its template's bucket, full, with nothing written.
    let fresh = fields(cli.ok(&["status", "ingest#rpm#@fresh"]));
    assert_eq!(
        fresh[..5],
        ["ingest#rpm#@fresh", "requests", "10", "10", "1/s"]
    );
    // Tenants that took some: `acme` 6, `initech` 2, the override `big` 1.
    for (tenant, cost) in [("acme", "6"), ("initech", "2"), ("big", "1")] {
        let d = format!("ingest#rpm#@{tenant}");
        cli.ok(&["acquire", &d, "--cost", cost]);
    }
    let acme = fields(cli.ok(&["status", "ingest#rpm#@acme"]));
    assert_eq!(acme[..3], ["ingest#rpm#@acme", "requests", "10"]);
    let available: f64 = acme[3].parse().unwrap();
    // 4 left, and what refilled since (1 a second; the processes in between take time).
    assert!((4.0..10.0).contains(&available), "{acme:?}");
    assert_eq!(acme[4], "1/s");
    let big = fields(cli.ok(&["status", "ingest#rpm#@big"]));
    assert_eq!(big[..3], ["ingest#rpm#@big", "requests", "100"]);
    // The template and its two hottest keys, the closest to their limit first.
    let top = cli.ok(&["status", "ingest#rpm", "--top", "2"]);
    let names: Vec<&str> = top
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        names,
        ["ingest#rpm", "ingest#rpm#@acme", "ingest#rpm#@initech"]
    );
    let json = cli.json(&["status", "ingest#rpm#@initech", "--json"]);
    assert_eq!(json[0]["dimension"], "ingest#rpm#@initech");
    assert_eq!(json[0]["capacity"], 10);
    // A key of no keyed bucket is unknown, as any dimension.
    cli.fails(&["status", "nothing#rpm#@acme"], 3, "nothing#rpm");
}
