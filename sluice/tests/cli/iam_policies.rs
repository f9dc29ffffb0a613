//! The IAM policies under `deploy/iam/` against the DynamoDB operations each role's code
//! sends, recorded with `SLUICE_RECORD_DYNAMODB_OPERATIONS` (see ARCHITECTURE.md).
//!
//! Standalone, against DynamoDB Local: a child process of this binary runs the
//! application's and the reconciler's whole surface and the `sluice` binary runs every
//! command, recording into a directory of their own; every recorded operation must be
//! allowed by its role's policy, and every action a policy allows must have been recorded
//! for its role (or be one of the few [`RARE`] ones). Suite-wide: `scripts/test.sh` records
//! the whole suite, then runs [`every_operation_the_suite_sent_is_allowed_by_its_role`]
//! over that directory (`SLUICE_CHECK_RECORDED_OPERATIONS`).

use crate::dynamo;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use sluice::{
    Acquire, Bucket, Config, Dimension, DynamoStore, Prefetch, RefillRate, Sluice, SluiceBuilder,
    admin::Tighten, clock::ManualClock, clock::UnixMillis, config::Protocol, store::SLOTS_INDEX,
};

const ROLES: [&str; 3] = ["application", "reconciler", "operator"];

/// Selects the scenario a child process of this binary runs.
const SCENARIO: &str = "SLUICE_IAM_SCENARIO";

/// Actions a role's code calls only on paths no scenario reaches on purpose, and why.
const RARE: &[(&str, &str)] = &[
    // A slots-index query that fails with an internal error asks whether the index is still
    // being built (DynamoDB Local answers a query of an unbuilt index that way).
    ("application", "dynamodb:DescribeTable"),
    // Reclaiming an expired lease of several parts whose transaction failed because one part
    // was already gone (a release racing the pass) reads which of the others remain. The
    // operator runs the same pass (`sluice reconcile`).
    ("reconciler", "dynamodb:BatchGetItem"),
    // A give-back to a bucket the pass no longer remembers (a write to it failed, or it
    // was read too long ago) reads that one bucket again.
    ("reconciler", "dynamodb:GetItem"),
    ("operator", "dynamodb:BatchGetItem"),
];

/// The resource an action is allowed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum On {
    Table,
    SlotsIndex,
}

/// A policy: each allowed action and the resources it is allowed on.
type Policy = BTreeMap<String, BTreeSet<String>>;

fn resource(on: On) -> String {
    let table = "arn:aws:dynamodb:REGION:ACCOUNT_ID:table/TABLE_NAME";
    match on {
        On::Table => table.to_owned(),
        On::SlotsIndex => format!("{table}/index/{SLOTS_INDEX}"),
    }
}

/// The IAM action (and its resource) a recorded operation needs. A transaction's items are
/// authorized by their own actions; there is no action for the transaction itself.
fn needs(operation: &str) -> (String, On) {
    let action = match operation.strip_prefix("TransactWriteItems.") {
        Some("ConditionCheck") => "ConditionCheckItem".to_owned(),
        Some(kind) => format!("{kind}Item"),
        None => operation.to_owned(),
    };
    let on = if action == "Query" {
        On::SlotsIndex
    } else {
        On::Table
    };
    (format!("dynamodb:{action}"), on)
}

fn policy_path(role: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/iam")
        .join(format!("{role}.json"))
}

/// A role's policy, checked to be a plain IAM policy: version, named statements that
/// allow `dynamodb:` actions on listed resources.
fn policy(role: &str) -> Policy {
    let path = policy_path(role);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    assert_eq!(doc["Version"], "2012-10-17", "{role}: Version");
    let mut policy = Policy::new();
    let mut sids = BTreeSet::new();
    for statement in doc["Statement"].as_array().expect("Statement is a list") {
        let sid = statement["Sid"]
            .as_str()
            .expect("every statement has a Sid");
        assert!(
            !sid.is_empty() && sid.chars().all(|c| c.is_ascii_alphanumeric()),
            "{role}: Sid `{sid}` must be alphanumeric"
        );
        assert!(sids.insert(sid.to_owned()), "{role}: Sid `{sid}` twice");
        assert_eq!(statement["Effect"], "Allow", "{role}/{sid}: Effect");
        let strings = |key: &str| -> Vec<String> {
            statement[key]
                .as_array()
                .unwrap_or_else(|| panic!("{role}/{sid}: {key} is a list"))
                .iter()
                .map(|v| v.as_str().expect("a string").to_owned())
                .collect()
        };
        let resources = strings("Resource");
        for action in strings("Action") {
            assert!(action.starts_with("dynamodb:"), "{role}/{sid}: {action}");
            policy
                .entry(action)
                .or_default()
                .extend(resources.iter().cloned());
        }
    }
    policy
}

/// Every `(role, operation)` recorded in `dir`, and the files they came from.
fn recorded(dir: &Path) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut seen: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
    for entry in entries {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let (role, operation) = line
                .split_once(' ')
                .unwrap_or_else(|| panic!("{file}: a line that is not `role operation`: {line}"));
            assert!(ROLES.contains(&role), "{file}: unknown role `{role}`");
            seen.entry((role.to_owned(), operation.to_owned()))
                .or_default()
                .insert(file.clone());
        }
    }
    seen
}

/// Every recorded operation is allowed to its role, on the resource it touches.
fn check_allowed(dir: &Path) -> usize {
    let policies: BTreeMap<&str, Policy> = ROLES.iter().map(|r| (*r, policy(r))).collect();
    let seen = recorded(dir);
    let mut missing = Vec::new();
    for ((role, operation), files) in &seen {
        let (action, on) = needs(operation);
        let allowed = policies[role.as_str()]
            .get(&action)
            .is_some_and(|resources| resources.contains(&resource(on)));
        if !allowed {
            missing.push(format!(
                "the {role} policy does not allow {action} on {} (sent as {operation}, recorded in {})",
                resource(on),
                files.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    seen.len()
}

/// Every action a policy allows was recorded for its role, on exactly the resources its
/// operations touch (or is a [`RARE`] one).
fn check_least_privilege(dir: &Path) {
    let seen = recorded(dir);
    let mut excess = Vec::new();
    for role in ROLES {
        let mut needed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (r, operation) in seen.keys() {
            if r == role {
                let (action, on) = needs(operation);
                needed.entry(action).or_default().insert(resource(on));
            }
        }
        for (action, resources) in policy(role) {
            if RARE.contains(&(role, action.as_str())) {
                continue;
            }
            match needed.get(&action) {
                None => excess.push(format!(
                    "the {role} policy allows {action}, which its code never sent"
                )),
                Some(used) => excess.extend(resources.difference(used).map(|r| {
                    format!(
                        "the {role} policy allows {action} on {r}, which its code never touched"
                    )
                })),
            }
        }
    }
    assert!(excess.is_empty(), "{}", excess.join("\n"));
}

fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-{what}-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn each_role_policy_allows_exactly_what_its_code_sends() {
    if std::env::var_os(SCENARIO).is_some() {
        return;
    }
    let Some(endpoint) = dynamo::endpoint() else {
        return;
    };
    let dir = temp_dir("iam-operations");
    let table = format!("sluice-iam-{:016x}", rand::random::<u64>());
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "iam_policies::library_scenario",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(SCENARIO, "library")
        .env("SLUICE_RECORD_DYNAMODB_OPERATIONS", &dir)
        .env("SLUICE_TABLE_NAME", &table)
        .env("SLUICE_ENDPOINT_URL", &endpoint)
        .status()
        .expect("run the library scenario");
    assert!(status.success(), "the library scenario failed");
    operator_scenario(&endpoint, &dir);
    assert!(check_allowed(&dir) > 0, "nothing was recorded in {dir:?}");
    check_least_privilege(&dir);
    std::fs::remove_dir_all(&dir).ok();
}

/// Run by `scripts/test.sh` after the whole suite, over what the suite recorded.
#[test]
#[allow(clippy::print_stderr)]
fn every_operation_the_suite_sent_is_allowed_by_its_role() {
    let Some(dir) = std::env::var_os("SLUICE_CHECK_RECORDED_OPERATIONS") else {
        return;
    };
    let pairs = check_allowed(Path::new(&dir));
    eprintln!("{pairs} recorded (role, operation) pairs, each allowed by its role's policy");
}

/// The application's and the reconciler's surface, in a child process that records.
#[test]
fn library_scenario() {
    if std::env::var_os(SCENARIO).is_none_or(|s| s != "library") {
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(library());
}

const RPM: &str = "iam#rpm";
const TPM: &str = "iam#tpm";
const LEAN: &str = "iam#lean";
const SLOTS: &str = "iam#slots";

async fn library() {
    let config = Config::from_env().unwrap();
    let store = DynamoStore::from_config(&config).await.unwrap();
    store.create_table().await.unwrap();
    let clock = ManualClock::new(UnixMillis::from_secs(dynamo::future_secs()));
    let operator = Sluice::builder()
        .store(store.clone())
        .clock(clock.clone())
        .heal_settle(Duration::from_millis(300))
        .build()
        .unwrap();
    define_buckets(&operator).await;
    global_client().await;
    let prefetch = Prefetch::new(100, Duration::from_secs(5));
    let fast = Sluice::builder()
        .store(store.clone())
        .clock(clock.clone())
        .prefetch(Dimension::new(TPM).unwrap(), prefetch)
        .build()
        .unwrap();
    let mut seed_config = config.clone();
    seed_config.protocol = Protocol::Seed;
    let seed = SluiceBuilder::from_config(seed_config)
        .store(store.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    fast_paths(&fast, &store, &clock).await;
    seed_paths(&seed).await;
    slots(&fast, &seed, &clock).await;
    feedback(&fast, &seed, &clock).await;
    reconcile(&operator, &fast, &seed, &clock).await;
    look(&operator).await;
}

async fn define_buckets(operator: &Sluice) {
    let buckets = [
        (RPM, Bucket::requests(RefillRate::per_second(100))),
        (TPM, Bucket::tokens(RefillRate::per_second(10_000))),
        (LEAN, Bucket::requests(RefillRate::per_second(100)).lean()),
        (SLOTS, Bucket::concurrent(2)),
    ];
    for (dimension, bucket) in buckets {
        operator.put_bucket(dimension, bucket).await.unwrap();
    }
}

/// `Sluice::global()` from the environment the parent set.
async fn global_client() {
    let global = Sluice::global().await.unwrap();
    global.acquire(RPM).await.unwrap().release().await.unwrap();
}

/// One dimension, several, lean, prefetch, adjust, and many callers sharing writes.
async fn fast_paths(fast: &Sluice, store: &DynamoStore, clock: &ManualClock) {
    let mut lease = fast.acquire(RPM).await.unwrap();
    lease.adjust(RPM, 2).await.unwrap();
    lease.release().await.unwrap();
    let mut both = fast
        .acquire(Acquire::new(RPM).and_cost(TPM, 50))
        .await
        .unwrap();
    both.adjust(TPM, 80).await.unwrap();
    both.release().await.unwrap();
    fast.acquire(LEAN).await.unwrap().release().await.unwrap();
    for _ in 0..3 {
        let lease = fast.acquire(Acquire::with_cost(TPM, 10)).await.unwrap();
        lease.release().await.unwrap();
    }
    let many = futures::future::join_all((0..20).map(|_| fast.acquire(RPM))).await;
    let releases = many.into_iter().map(|l| l.unwrap().release());
    for released in futures::future::join_all(releases).await {
        released.unwrap();
    }
    let own_rows = Sluice::builder()
        .store(store.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    let plain = own_rows.acquire(RPM).await.unwrap();
    plain.release().await.unwrap();
    // Dropped without a release: given back in the background.
    drop(fast.acquire(RPM).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// The seed protocol: a read, then one transaction of buckets and lease rows.
async fn seed_paths(seed: &Sluice) {
    let mut lease = seed.acquire(RPM).await.unwrap();
    lease.adjust(RPM, 3).await.unwrap();
    lease.release().await.unwrap();
    let mut both = seed.acquire(Acquire::new(RPM).and(TPM)).await.unwrap();
    both.adjust(TPM, 5).await.unwrap();
    both.release().await.unwrap();
    drop(seed.acquire(RPM).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Slots, waits, and expired slot leases found through the index and reclaimed.
async fn slots(fast: &Sluice, seed: &Sluice, clock: &ManualClock) {
    let answer = fast
        .slot(SLOTS, Duration::from_secs(5), async { 42 })
        .await
        .unwrap();
    assert_eq!(answer, 42);
    let ttl = Duration::from_secs(2);
    for _ in 0..2 {
        std::mem::forget(seed.acquire(Acquire::new(SLOTS).ttl(ttl)).await.unwrap());
    }
    // Long enough for the store to answer on a busy machine (the wait is a deadline that
    // the store's answers count against: one not yet answered by then is a Timeout).
    let waited = fast
        .acquire_within(SLOTS, Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(waited.retry_in().is_some(), "{waited}");
    clock.advance(Duration::from_secs(3));
    for client in [fast, seed] {
        let lease = client.acquire(SLOTS).await.unwrap();
        lease.release().await.unwrap();
    }
    // On a slow store the wait's last ask can still be in flight at its deadline, be
    // answered after the clock moved on (the seed's leases then reclaimable) and be granted
    // a slot, which the client keeps for its next wait for a second of real time, then
    // gives back. The steps after this one count on both slots free.
    let both_free = async {
        loop {
            let state = fast.bucket(SLOTS).await.unwrap().unwrap();
            if state.available(fast.now()) >= 2.into() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), both_free)
        .await
        .expect("both slots free again within 10 s");
}

/// Feedback from the vendor, and a release by id from another client.
async fn feedback(fast: &Sluice, seed: &Sluice, clock: &ManualClock) {
    fast.tighten(RPM, Tighten::AtMost(50.into())).await.unwrap();
    fast.tighten(SLOTS, Tighten::PauseFor(Duration::from_secs(1)))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(2));
    for client in [fast, seed] {
        let lease = client.acquire(TPM).await.unwrap();
        lease.recorded().await;
        assert!(seed.release_id(lease.id()).await.unwrap());
        std::mem::forget(lease);
    }
}

/// Expired leases of both kinds given back, and a `concurrent` bucket healed.
async fn reconcile(operator: &Sluice, fast: &Sluice, seed: &Sluice, clock: &ManualClock) {
    let ttl = Duration::from_secs(2);
    for client in [fast, seed] {
        std::mem::forget(client.acquire(Acquire::new(RPM).ttl(ttl)).await.unwrap());
        std::mem::forget(client.acquire(Acquire::new(SLOTS).ttl(ttl)).await.unwrap());
    }
    clock.advance(Duration::from_secs(60));
    let report = operator.reconcile().await.unwrap();
    assert!(report.leases_restored > 0, "{report}");
    // A slot lost without its lease: the pass puts the slot back.
    let lost = Bucket::concurrent(3);
    operator.put_bucket("iam#heal", lost).await.unwrap();
    std::mem::forget(seed.acquire("iam#heal").await.unwrap());
    let key = operator.leases(&Default::default()).await.unwrap();
    for lease in key.iter().filter(|l| l.dimension.as_str() == "iam#heal") {
        dynamo::client(&std::env::var("SLUICE_ENDPOINT_URL").unwrap())
            .delete_item()
            .table_name(std::env::var("SLUICE_TABLE_NAME").unwrap())
            .key("vendor_dimension", dynamo::s(lease.key.as_str()))
            .send()
            .await
            .unwrap();
    }
    let report = operator.reconcile().await.unwrap();
    assert_eq!(report.buckets_healed, 1, "{report}");
    // Scheduled limits falling due, on a bucket in one row and on one spread over two.
    let now = clock.now().as_millis();
    let minute = |offset: i64| {
        let m = (now / 60_000 + offset).rem_euclid(24 * 60);
        format!("{:02}:{:02}", m / 60, m % 60)
    };
    let window = sluice::bucket::Window {
        from: minute(1).parse().unwrap(),
        to: minute(30).parse().unwrap(),
        limits: sluice::bucket::Limits {
            capacity: 50.into(),
            refill: RefillRate::per_second(5),
            reserves: Vec::new(),
        },
    };
    let scheduled = Bucket::requests(RefillRate::per_second(1))
        .with_capacity(10)
        .with_schedule(vec![window]);
    operator
        .put_bucket("iam#scheduled", scheduled.clone())
        .await
        .unwrap();
    operator.put_bucket("iam#spread", scheduled).await.unwrap();
    operator.reshard("iam#spread", 2).await.unwrap();
    clock.advance(Duration::from_secs(120));
    let report = operator.reconcile().await.unwrap();
    assert_eq!(report.schedules_applied, 2, "{report}");
}

/// What an operator looks at, and a bucket deleted.
async fn look(operator: &Sluice) {
    operator.snapshot(RPM).await.unwrap();
    operator.snapshots().await.unwrap();
    operator.bucket(TPM).await.unwrap();
    operator.buckets().await.unwrap();
    operator.leases(&Default::default()).await.unwrap();
    assert!(operator.delete_bucket(LEAN).await.unwrap());
}

/// One run of the `sluice` binary on `table`, recording into `dir`: its exit code and
/// standard error.
fn sluice(endpoint: &str, table: &str, dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    sluice_with(endpoint, table, dir, args, &[])
}

/// [`sluice`] with more environment.
fn sluice_with(
    endpoint: &str,
    table: &str,
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .envs(env.iter().copied())
        .env_remove("SLUICE_LEASE_TTL_MS")
        .env("SLUICE_ENDPOINT_URL", endpoint)
        .env("SLUICE_TABLE_NAME", table)
        .env("SLUICE_RECORD_DYNAMODB_OPERATIONS", dir)
        .env("AWS_ACCESS_KEY_ID", "sluicelocal")
        .env("AWS_SECRET_ACCESS_KEY", "sluicelocal")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("run sluice");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.code(), stderr)
}

/// Every command of the `sluice` binary, recording into `dir`.
fn operator_scenario(endpoint: &str, dir: &Path) {
    let table = format!("sluice-iam-cli-{:016x}", rand::random::<u64>());
    let file = std::env::temp_dir().join(format!("{table}.toml"));
    std::fs::write(
        &file,
        "[\"cli#rpm\"]\ntype = \"requests\"\nrefill = \"10/s\"\n\n\
         [\"cli#slots\"]\ntype = \"concurrent\"\ncapacity = 1\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let run = |args: &[&str]| sluice(endpoint, &table, dir, args);
    let ok = |args: &[&str]| {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(0), "sluice {args:?}: {stderr}");
    };
    ok(&["table", "create"]);
    ok(&["apply", path]);
    ok(&["apply", path, "--dry-run"]);
    ok(&[
        "bucket", "put", "cli#tpm", "--type", "tokens", "--refill", "100/s",
    ]);
    ok(&["bucket", "get", "cli#tpm"]);
    ok(&["bucket", "list"]);
    ok(&["acquire", "cli#rpm"]);
    ok(&["acquire", "cli#slots", "--keep", "--ttl", "1s"]);
    // Denied while the slot is held: its outlook comes from the slots index.
    let (code, stderr) = run(&["acquire", "cli#slots"]);
    assert_eq!(code, Some(75), "{stderr}");
    ok(&["status"]);
    ok(&["status", "--json"]);
    std::thread::sleep(Duration::from_millis(1_100));
    ok(&["reconcile"]);
    ok(&["bucket", "delete", "cli#tpm"]);
    ok(&["apply", path, "--prune"]);
    std::fs::remove_file(&file).ok();
    table_without_index(endpoint, dir);
}

/// `sluice table create` on a table made without the slots index (by another tool, or
/// before sluice had it) adds the index.
fn table_without_index(endpoint: &str, dir: &Path) {
    let table = format!("sluice-iam-bare-{:016x}", rand::random::<u64>());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        dynamo::create_bare_table(&dynamo::client(endpoint), &table).await;
    });
    let (code, stderr) = sluice(endpoint, &table, dir, &["table", "create"]);
    assert_eq!(code, Some(0), "{stderr}");
}
