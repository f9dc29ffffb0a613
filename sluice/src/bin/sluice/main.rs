//! `sluice`: the operator CLI for sluice's shared DynamoDB table.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod acquire;
mod apply;
mod cli;
mod show;
mod watch;

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser as _;
use sluice::admin::{Audit, Restock, Snapshot};
use sluice::store::StoreError;
use sluice::{Config, DynamoStore, Error, Sluice};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::cli::{BucketCommand, ByHand, Cli, Command, TableCommand};

/// Exit codes a shell script can rely on.
pub(crate) mod exit {
    pub(crate) const FAILURE: u8 = 1;
    pub(crate) const USAGE: u8 = 2;
    /// `apply --dry-run --detailed-exitcode`: changes are pending.
    pub(crate) const PENDING: u8 = 2;
    pub(crate) const NOT_FOUND: u8 = 3;
    /// RetryIn: denied for now (sysexits' EX_TEMPFAIL).
    pub(crate) const RETRY: u8 = 75;
}

/// A failure with its exit code and the message for stderr.
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
    /// Not a failure: `apply --dry-run --detailed-exitcode` found changes to make.
    pub(crate) pending: bool,
}

impl Failure {
    pub(crate) fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: exit::USAGE,
            message: message.into(),
            pending: false,
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        let code = match &error {
            Error::RetryIn(_) => exit::RETRY,
            Error::UnknownDimension { .. }
            | Error::LeaseNotFound(_)
            | Error::Store(StoreError::TableNotFound { .. }) => exit::NOT_FOUND,
            Error::InvalidDimension(_)
            | Error::InvalidBucket { .. }
            | Error::InvalidCost { .. }
            | Error::CostExceedsCapacity { .. }
            | Error::CostExceedsShare { .. }
            | Error::InvalidPriority(_)
            | Error::DimensionCount { .. }
            | Error::Config(_)
            | Error::Shards(_) => exit::USAGE,
            _ => exit::FAILURE,
        };
        Failure {
            code,
            message: error.to_string(),
            pending: false,
        }
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Failure {
        Error::from(error).into()
    }
}

fn main() -> ExitCode {
    sluice::__private::operator_process();
    let cli = Cli::parse();
    // `apply --detailed-exitcode` keeps 2 for "changes pending": any failure is then 1.
    let detailed = matches!(
        cli.command,
        Command::Apply {
            how: apply::How {
                detailed_exitcode: true,
                ..
            },
            ..
        }
    );
    let fail = |failure: Failure| {
        eprintln!("sluice: {}", failure.message);
        let code = match (detailed, failure.pending) {
            (false, _) => failure.code,
            (true, true) => exit::PENDING,
            (true, false) => exit::FAILURE,
        };
        ExitCode::from(code)
    };
    let filter = match log_filter(cli.verbose, std::env::var("RUST_LOG").ok()) {
        Ok(filter) => filter,
        Err(message) => return fail(Failure::usage(message)),
    };
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(filter)
        .init();
    if let Command::Completions { shell } = cli.command {
        let mut command = <Cli as clap::CommandFactory>::command();
        clap_complete::generate(shell, &mut command, "sluice", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            return fail(Failure {
                code: exit::FAILURE,
                message: format!("cannot start the async runtime: {e}"),
                pending: false,
            });
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => fail(failure),
    }
}

/// What is logged: -v/-vv if given, else the `RUST_LOG` directives if set, else warnings.
fn log_filter(verbose: u8, rust_log: Option<String>) -> Result<Targets, String> {
    let level = match verbose {
        0 => match rust_log.filter(|spec| !spec.trim().is_empty()) {
            Some(spec) => {
                return spec
                    .parse::<Targets>()
                    .map_err(|e| format!("RUST_LOG={spec:?} is not a log filter: {e}"));
            }
            None => LevelFilter::WARN,
        },
        1 => LevelFilter::INFO,
        _ => LevelFilter::DEBUG,
    };
    Ok(Targets::new().with_default(level))
}

/// No bucket for `dimension` in `store`.
fn unknown(store: &dyn sluice::store::Store, dimension: sluice::Dimension) -> Failure {
    Error::UnknownDimension {
        dimension,
        store: store.describe(),
    }
    .into()
}

/// The client and store for the configured table.
async fn connect(cli: &Cli) -> Result<(Sluice, DynamoStore), Failure> {
    let mut config = Config::from_env().map_err(|e| Failure::usage(e.to_string()))?;
    if let Some(table) = &cli.table {
        config.table_name = Some(table.clone());
    }
    if let Some(url) = &cli.endpoint_url {
        config.endpoint_url = Some(url.clone());
    }
    if let Some(caller) = &cli.caller {
        config.caller = caller.clone();
    }
    if config.table_name.is_none() {
        return Err(Failure::usage(
            "no table: set SLUICE_TABLE_NAME or pass --table",
        ));
    }
    let store = DynamoStore::from_config(&config)
        .await
        .map_err(|e| Failure::usage(e.to_string()))?;
    let sluice = sluice::SluiceBuilder::from_config(config)
        .store(store.clone())
        .build()?;
    Ok((sluice, store))
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let (sluice, store) = connect(&cli).await?;
    match cli.command {
        Command::Table(TableCommand::Create {
            warm_writes,
            warm_reads,
        }) => {
            if store.create_table().await? {
                println!("created table {}", store.table());
            } else {
                println!("table {} already exists", store.table());
            }
            if warm_writes > 0 || warm_reads > 0 {
                store.warm_table(warm_writes, warm_reads).await?;
                println!(
                    "warming table {} to {warm_writes} writes and {warm_reads} reads a second",
                    store.table()
                );
            }
            Ok(())
        }
        Command::Bucket(command) => bucket(&sluice, command).await,
        Command::Apply { file, how } => apply::run(&sluice, &file, how).await,
        Command::Status {
            dimensions,
            top,
            json,
            watch,
            count,
        } => {
            let shown = Shown { dimensions, top };
            status(&sluice, &store, &shown, json, watch, count).await
        }
        Command::Reconcile { every, count, json } => reconcile(&sluice, every, count, json).await,
        Command::Peek {
            dimension,
            cost,
            priority,
            json,
        } => {
            let request = acquire::request(&dimension, cost, priority);
            acquire::peek(&sluice, &dimension, request, json).await
        }
        Command::Acquire {
            dimension,
            cost,
            priority,
            hold,
            ttl,
            wait,
            keep,
            json,
        } => {
            let ttl = ttl.unwrap_or(sluice.config().lease_ttl.max(hold));
            if hold > ttl {
                return Err(Failure::usage(format!(
                    "--hold {} is longer than the lease's --ttl {}",
                    humantime::format_duration(hold),
                    humantime::format_duration(ttl)
                )));
            }
            let request = acquire::request(&dimension, cost, priority).ttl(ttl);
            let how = acquire::How {
                wait,
                hold,
                keep,
                json,
            };
            acquire::run(&sluice, &dimension, request, how).await
        }
        Command::Completions { .. } => Ok(()),
    }
}

/// `sluice status`: the buckets' snapshots, once or every `watch`.
async fn status(
    sluice: &Sluice,
    store: &DynamoStore,
    wanted: &Shown,
    json: bool,
    watch: Option<Duration>,
    count: Option<u64>,
) -> Result<(), Failure> {
    let mut shown: u64 = 0;
    let mut history = watch::History::default();
    loop {
        let snapshots = wanted.of(sluice, store).await?;
        if json {
            let all: Vec<_> = snapshots.iter().map(show::snapshot_json).collect();
            println!("{}", serde_json::Value::Array(all));
        } else {
            if watch.is_some() && std::io::stdout().is_terminal() {
                print!("\x1b[2J\x1b[H");
            }
            if watch.is_some() {
                println!("{} at {}", store.table(), sluice.now());
            }
            print!("{}", show::status_table(&snapshots));
            if let Some(every) = watch {
                let levels: Vec<_> = snapshots.iter().map(watch::Level::of).collect();
                history.record(&levels);
                print!("\n{}", history.frame(&levels, every));
            }
        }
        let _ = std::io::stdout().flush();
        shown += 1;
        match watch {
            Some(every) if count.is_none_or(|c| shown < c) => tokio::time::sleep(every).await,
            _ => break,
        }
    }
    Ok(())
}

/// What `sluice status` shows: every bucket, or the named ones, with a keyed bucket's `top`
/// hottest keys.
struct Shown {
    dimensions: Vec<String>,
    top: Option<usize>,
}

impl Shown {
    /// The snapshots to show, now.
    async fn of(&self, sluice: &Sluice, store: &DynamoStore) -> Result<Vec<Snapshot>, Failure> {
        let all = sluice.snapshots().await?;
        if self.dimensions.is_empty() {
            return Ok(all);
        }
        let mut shown = Vec::new();
        for d in &self.dimensions {
            let d = sluice::Dimension::new(d).map_err(Error::from)?;
            match all.iter().find(|s| s.dimension == d) {
                Some(s) => shown.push(s.clone()),
                // A key with no row yet: its template's bucket, full (or unknown).
                None if d.key().is_some() => shown.push(sluice.snapshot(d.as_str()).await?),
                None => return Err(unknown(store, d)),
            }
            if let Some(n) = self.top.filter(|_| d.key().is_none()) {
                shown.extend(hottest_keys(&all, &d, n));
            }
        }
        // A key named and among the hottest is shown once.
        let mut seen = std::collections::HashSet::new();
        shown.retain(|s| seen.insert(s.dimension.clone()));
        Ok(shown)
    }
}

/// The `n` keys of `template` with the least available for their capacity (the closest to
/// their limit), the longest to full first among equals.
fn hottest_keys(all: &[Snapshot], template: &sluice::Dimension, n: usize) -> Vec<Snapshot> {
    let mut keys: Vec<&Snapshot> = all
        .iter()
        .filter(|s| s.dimension.key().is_some() && s.dimension.template() == *template)
        .collect();
    let fill = |s: &Snapshot| {
        let capacity = s.capacity.as_nanos().max(1);
        let fraction = s.available.as_nanos().saturating_mul(1_000_000) / capacity;
        (fraction, std::cmp::Reverse(s.time_to_full))
    };
    keys.sort_by_key(|s| fill(s));
    keys.into_iter().take(n).cloned().collect()
}

/// `sluice reconcile`: one pass, or one every `every`.
async fn reconcile(
    sluice: &Sluice,
    every: Option<Duration>,
    count: Option<u64>,
    json: bool,
) -> Result<(), Failure> {
    let mut passes: u64 = 0;
    loop {
        let report = sluice.reconcile().await?;
        if json {
            println!("{}", show::report_json(&report));
        } else {
            println!("{report}");
            for e in &report.errors {
                println!("  error: {e}");
            }
        }
        let _ = std::io::stdout().flush();
        passes += 1;
        match every {
            Some(every) if count.is_none_or(|c| passes < c) => {
                tokio::time::sleep(every).await;
            }
            _ => {
                if !report.errors.is_empty() {
                    return Err(Failure {
                        code: exit::FAILURE,
                        message: format!("{} error(s) in the last pass", report.errors.len()),
                        pending: false,
                    });
                }
                break;
            }
        }
    }
    Ok(())
}

async fn bucket(sluice: &Sluice, command: BucketCommand) -> Result<(), Failure> {
    match command {
        BucketCommand::Put {
            dimension,
            definition,
        } => {
            let bucket = definition
                .bucket()
                .map_err(|e| Failure::usage(format!("{dimension}: {e}")))?;
            let state = sluice.put_bucket(&dimension, bucket).await?;
            println!("{}: {}", state.dimension, apply::Describe(&state.bucket));
        }
        BucketCommand::Get { dimension, json } => {
            let dim = sluice::Dimension::new(&dimension).map_err(Error::from)?;
            let state = sluice
                .bucket(&dimension)
                .await?
                .ok_or_else(|| unknown(sluice.store().as_ref(), dim))?;
            if json {
                println!("{}", show::bucket_json(&state));
            } else {
                print!("{}", show::bucket_text(&state));
            }
        }
        BucketCommand::List { json } => {
            let mut buckets = sluice.buckets().await?;
            buckets.sort_by(|a, b| a.dimension.as_str().cmp(b.dimension.as_str()));
            if json {
                let all: Vec<_> = buckets.iter().map(show::bucket_json).collect();
                println!("{}", serde_json::Value::Array(all));
            } else {
                print!("{}", show::buckets_table(&buckets));
            }
        }
        BucketCommand::Delete { dimension } => {
            let dim = sluice::Dimension::new(&dimension).map_err(Error::from)?;
            if !sluice.delete_bucket(&dimension).await? {
                return Err(unknown(sluice.store().as_ref(), dim));
            }
            println!("deleted {dimension}");
        }
        BucketCommand::Reset { dimension, by } => {
            by_hand(sluice, &dimension, Restock::Reset, by).await?;
        }
        BucketCommand::TopUp {
            dimension,
            tokens,
            by,
        } => {
            by_hand(sluice, &dimension, Restock::TopUp(tokens), by).await?;
        }
        BucketCommand::Shards { dimension, count } => {
            let rows = sluice.reshard(&dimension, count).await?;
            println!("{dimension}: {} row(s)", rows.len());
        }
    }
    Ok(())
}

/// `bucket reset` and `bucket top-up`: the change, and what it did.
async fn by_hand(
    sluice: &Sluice,
    dimension: &str,
    how: Restock,
    by: ByHand,
) -> Result<(), Failure> {
    let audit = Audit {
        who: by.who.unwrap_or_else(|| sluice.config().caller.clone()),
        why: by.why,
        if_version: by.if_version,
    };
    let done = sluice.restock(dimension, how, &audit).await?;
    if by.json {
        let event = serde_json::json!({
            "dimension": dimension,
            "before": show::tokens(done.before),
            "after": show::tokens(done.after),
            "version": done.version,
            "who": audit.who,
            "why": audit.why,
        });
        println!("{event}");
    } else {
        println!(
            "{dimension}: {} -> {} tokens (version {}), by {}: {}",
            done.before, done.after, done.version, audit.who, audit.why
        );
    }
    Ok(())
}
