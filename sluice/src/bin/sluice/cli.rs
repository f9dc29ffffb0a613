//! The command line: arguments and their parsing.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
pub(crate) use sluice::__cli::{Amount, bucket, rate, reserve};
use sluice::{Bucket, LimitType, Priority, RefillRate, Tokens};

/// Operate sluice's shared DynamoDB table: create it, define buckets, watch them, reconcile
/// crashed callers' leases, and try acquires by hand.
///
/// Reads the same environment as the SDK (SLUICE_TABLE_NAME, SLUICE_ENDPOINT_URL,
/// SLUICE_LEASE_TTL_MS, SLUICE_CALLER; AWS credentials and region from
/// the standard chain); flags override it.
///
/// Exit codes: 0 success; 1 failure (store or service error); 2 bad usage, bad input file or
/// bad definition; 3 not found (table or dimension); 75 denied for now (RetryIn; retry after
/// the printed delay). `apply --dry-run --detailed-exitcode`: 0 nothing to change, 2 changes
/// pending, 1 any failure.
///
/// Logs go to stderr: warnings by default, -v/-vv for more, or RUST_LOG directives
/// (`debug`, `sluice=debug,aws_smithy_runtime=info`) when no -v is given.
#[derive(Debug, Parser)]
#[command(name = "sluice", version)]
pub(crate) struct Cli {
    /// The DynamoDB table [env: SLUICE_TABLE_NAME].
    #[arg(long, global = true)]
    pub(crate) table: Option<String>,
    /// A DynamoDB endpoint, e.g. DynamoDB Local [env: SLUICE_ENDPOINT_URL].
    #[arg(long, global = true)]
    pub(crate) endpoint_url: Option<String>,
    /// The `caller` written on leases [env: SLUICE_CALLER].
    #[arg(long, global = true)]
    pub(crate) caller: Option<String>,
    /// More logging on stderr (-v: info, -vv: debug); overrides RUST_LOG.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub(crate) verbose: u8,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The table itself.
    #[command(subcommand)]
    Table(TableCommand),
    /// One bucket at a time.
    #[command(subcommand)]
    Bucket(BucketCommand),
    /// Makes the table's buckets match a declarative file (TOML), showing what changes.
    Apply {
        /// The file: one `["vendor#metric"]` table per bucket.
        file: PathBuf,
        #[command(flatten)]
        how: crate::apply::How,
    },
    /// Every bucket (or the named ones) right now: type, capacity, available, refill,
    /// live leases, time to full. A key's dimension (`ingest#rpm#@acme`) shows that key's
    /// bucket, as its template defines it and full when it has no row yet.
    Status {
        /// Only these dimensions.
        dimensions: Vec<String>,
        /// With a keyed bucket named: also its N hottest keys (the least available for
        /// their capacity first).
        #[arg(long, value_name = "N")]
        top: Option<usize>,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Refresh every INTERVAL (default 2s) until interrupted.
        #[arg(long, value_name = "INTERVAL", num_args = 0..=1, default_missing_value = "2s", value_parser = duration)]
        watch: Option<Duration>,
        /// With --watch: stop after this many refreshes.
        #[arg(long, requires = "watch")]
        count: Option<u64>,
    },
    /// Gives back expired leases' cost and heals `concurrent` buckets; once, or every
    /// DURATION.
    Reconcile {
        /// Run a pass every DURATION (e.g. 5m) until interrupted.
        #[arg(long, value_name = "DURATION", value_parser = duration)]
        every: Option<Duration>,
        /// With --every: stop after this many passes.
        #[arg(long, requires = "every")]
        count: Option<u64>,
        /// Print each pass's report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Takes capacity by hand: prints the lease, holds it, releases it.
    Acquire {
        /// The dimension.
        dimension: String,
        /// The cost (default: the bucket's cost per call).
        #[arg(long)]
        cost: Option<Tokens>,
        /// The acquire's priority (default: SLUICE_PRIORITY, else the highest).
        #[arg(long)]
        priority: Option<Priority>,
        /// How long to hold the lease before releasing it (e.g. 30s).
        #[arg(long, value_parser = duration, default_value = "0s")]
        hold: Duration,
        /// The lease's TTL (default: SLUICE_LEASE_TTL_MS, and at least --hold).
        #[arg(long, value_parser = duration)]
        ttl: Option<Duration>,
        /// Wait up to this long for capacity before answering RetryIn.
        #[arg(long, value_parser = duration, default_value = "0s")]
        wait: Duration,
        /// Do not release: leave the lease to expire (to try the reconciler).
        #[arg(long)]
        keep: bool,
        /// One JSON object per event (granted, retry_in, released, kept), one per line.
        #[arg(long)]
        json: bool,
    },
    /// Whether an acquire would be granted now, or its RetryIn, taking nothing: no write,
    /// at most one read. Exit 0 when it would be granted, 75 when not.
    Peek {
        /// The dimension.
        dimension: String,
        /// The cost (default: the bucket's cost per call).
        #[arg(long)]
        cost: Option<Tokens>,
        /// The acquire's priority (default: SLUICE_PRIORITY, else the highest).
        #[arg(long)]
        priority: Option<Priority>,
        /// One JSON object instead of a line of text.
        #[arg(long)]
        json: bool,
    },
    /// Prints a completion script for SHELL: e.g. `sluice completions bash >
    /// /etc/bash_completion.d/sluice`, or `sluice completions zsh > ~/.zfunc/_sluice`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum TableCommand {
    /// Creates the table (partition key `vendor_dimension`, on-demand, TTL on `ttl`, the
    /// `sluice-slots` index over slot leases) if it does not exist; adds the index to a table
    /// that lacks it; pre-warms it if asked (a new or an existing table).
    Create {
        /// Write units a second the table serves at once (warm throughput; a new on-demand
        /// table serves 4,000). See docs/dynamodb.md, capacity planning.
        #[arg(long, default_value_t = 0)]
        warm_writes: u64,
        /// Read units a second the table serves at once (a new on-demand table: 12,000).
        #[arg(long, default_value_t = 0)]
        warm_reads: u64,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum BucketCommand {
    /// Defines or redefines a bucket (redefining keeps its tokens, capped).
    Put {
        /// The dimension, `vendor#metric`.
        dimension: String,
        #[command(flatten)]
        definition: Definition,
    },
    /// Shows one bucket.
    Get {
        /// The dimension.
        dimension: String,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Lists every bucket.
    List {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Deletes a bucket.
    Delete {
        /// The dimension.
        dimension: String,
    },
    /// Fills a bucket again by hand (a `concurrent` one: every slot no lease row holds);
    /// conditional and logged.
    Reset {
        /// The dimension.
        dimension: String,
        #[command(flatten)]
        by: ByHand,
    },
    /// Adds tokens to a bucket by hand, up to what it holds at most; conditional and
    /// logged.
    TopUp {
        /// The dimension.
        dimension: String,
        /// How many tokens.
        tokens: Tokens,
        #[command(flatten)]
        by: ByHand,
    },
    /// Spreads a bucket over several rows (past one DynamoDB item's write ceiling), or
    /// gathers it into fewer; no token is made or lost.
    Shards {
        /// The dimension.
        dimension: String,
        /// How many rows, 1 to 32 (1: one row again).
        count: u16,
    },
}

/// Who changes a bucket by hand, and why (`bucket reset`, `bucket top-up`).
#[derive(Debug, Args)]
pub(crate) struct ByHand {
    /// Why: an incident, a ticket. Logged with the change.
    #[arg(long)]
    pub(crate) why: String,
    /// Who (default: the caller, --caller or SLUICE_CALLER).
    #[arg(long)]
    pub(crate) who: Option<String>,
    /// The version you decided from (`bucket get` shows it): refused, and nothing written,
    /// when the bucket is at another.
    #[arg(long)]
    pub(crate) if_version: Option<u64>,
    /// One JSON object instead of a line of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// A bucket definition from flags.
#[derive(Debug, Args)]
pub(crate) struct Definition {
    /// What the bucket counts.
    #[arg(long = "type", value_enum)]
    pub(crate) limit_type: Kind,
    /// The burst size (concurrent: the slots). Default for requests/tokens: one minute of
    /// refill.
    #[arg(long)]
    pub(crate) capacity: Option<Tokens>,
    /// The refill rate, AMOUNT/UNIT: `500/min`, `10/s`, `1000/h`, `50000/day`, `1/week`,
    /// or a multiple of a unit (`7/7.001s`); kept exactly.
    #[arg(long, value_parser = rate)]
    pub(crate) refill: Option<RefillRate>,
    /// Tokens an acquire takes when it names no cost.
    #[arg(long)]
    pub(crate) cost_per_call: Option<Tokens>,
    /// Lean mode (requests/tokens): one write per grant, no lease rows, no crash refund.
    #[arg(long)]
    pub(crate) lean: bool,
    /// Keep part of the capacity for a priority and those given before it:
    /// `PRIORITY=TOKENS` or `PRIORITY=PERCENT%`, e.g. `interactive=20%`. Repeat it, highest
    /// priority first; a priority not listed leaves every reserve.
    #[arg(long = "reserve", value_parser = reserve)]
    pub(crate) reserves: Vec<(Priority, Amount)>,
}

/// `--type`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Kind {
    Requests,
    Tokens,
    Concurrent,
}

impl From<Kind> for LimitType {
    fn from(kind: Kind) -> LimitType {
        match kind {
            Kind::Requests => LimitType::Requests,
            Kind::Tokens => LimitType::Tokens,
            Kind::Concurrent => LimitType::Concurrent,
        }
    }
}

impl Definition {
    pub(crate) fn bucket(&self) -> Result<Bucket, String> {
        bucket(
            self.limit_type.into(),
            self.capacity,
            self.refill,
            self.cost_per_call,
            self.lean,
            &self.reserves,
        )
    }
}

/// A duration: `250ms`, `30s`, `5m`, `1h`, `1h30m`.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration like 30s, 5m or 250ms ({e})"))
}
