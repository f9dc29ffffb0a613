//! `dynamodb-fidelity`: the proxy as a process, for load generators and tests in other
//! languages. It prints its endpoint (`http://host:port`, one line) once listening, also
//! to `--address-file` if given, and runs until SIGTERM, SIGINT, or the end of its standard
//! input: a parent that dies closes the pipe, and the proxy does not outlive it
//! (`--ignore-stdin` to run it detached).

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use dynamodb_fidelity::{Config, Fidelity, TableModel, ThrottleAs};

/// A loopback proxy in front of DynamoDB Local that adds real DynamoDB's per-item
/// throughput ceilings, capacity billing, throttling and transaction conflicts.
#[derive(Debug, Parser)]
#[command(name = "dynamodb-fidelity", version)]
struct Args {
    /// The DynamoDB Local to stand in front of: http://host:port.
    #[arg(long)]
    upstream: String,
    /// Where to listen: a loopback address (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Write units per second each item may consume.
    #[arg(long, default_value_t = 1000.0)]
    write_ceiling: f64,
    /// Read units per second each item may consume.
    #[arg(long, default_value_t = 3000.0)]
    read_ceiling: f64,
    /// Unused capacity an item saves up, in milliseconds of its ceiling.
    #[arg(long, default_value_t = 1000)]
    burst_ms: u64,
    /// How long a transaction keeps holding its items after the upstream has answered it.
    #[arg(long, default_value_t = 0)]
    transaction_hold_ms: u64,
    /// Milliseconds added to every DynamoDB call (half before forwarding it, half before
    /// answering).
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// The mean, in milliseconds, of a random part added to every call besides (an
    /// exponential draw: a tail).
    #[arg(long, default_value_t = 0)]
    latency_tail_ms: u64,
    /// The throttling error: a provisioned table's or an on-demand table's.
    #[arg(long, value_enum, default_value_t = Mode::Provisioned)]
    throttle_as: Mode,
    /// How many partitions each table has: items hashed onto one share its ceilings
    /// (default: every item has ceilings of its own).
    #[arg(long)]
    partitions: Option<u32>,
    /// Adaptive capacity: an item taking at least half its partition's ceiling every second
    /// for this many milliseconds gets a partition of its own (default: never).
    #[arg(long)]
    isolate_after_ms: Option<u64>,
    /// Give each table an on-demand table's own ceiling: a cold start, twice the previous
    /// peak, warm throughput and the per-table quota (AWS's numbers unless the options
    /// below change them).
    #[arg(long)]
    on_demand_table: bool,
    /// What a new table sustains at once, in write units a second.
    #[arg(long, default_value_t = 4000.0, requires = "on_demand_table")]
    table_initial_write: f64,
    /// What a new table sustains at once, in read units a second.
    #[arg(long, default_value_t = 12000.0, requires = "on_demand_table")]
    table_initial_read: f64,
    /// How many seconds after a peak it counts as the previous peak.
    #[arg(long, default_value_t = 1800, requires = "on_demand_table")]
    table_peak_window_s: u64,
    /// The per-table quota, in write units a second.
    #[arg(long, default_value_t = 40000.0, requires = "on_demand_table")]
    table_quota_write: f64,
    /// The per-table quota, in read units a second.
    #[arg(long, default_value_t = 40000.0, requires = "on_demand_table")]
    table_quota_read: f64,
    /// A file to write the endpoint to (replaced whole, so a reader never sees half of it).
    #[arg(long)]
    address_file: Option<PathBuf>,
    /// Keep running when standard input ends (stop with SIGTERM or SIGINT only).
    #[arg(long)]
    ignore_stdin: bool,
}

/// A table's capacity mode, as it shows in its throttling errors.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    /// ProvisionedThroughputExceededException.
    Provisioned,
    /// ThrottlingException.
    OnDemand,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .init();
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = %error_chain(error.as_ref()), "dynamodb-fidelity failed");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let running = Fidelity::start(Config {
        upstream: args.upstream,
        listen: args.listen,
        write_ceiling: args.write_ceiling,
        read_ceiling: args.read_ceiling,
        burst: Duration::from_millis(args.burst_ms),
        transaction_hold: Duration::from_millis(args.transaction_hold_ms),
        throttle_as: match args.throttle_as {
            Mode::Provisioned => ThrottleAs::ProvisionedThroughputExceeded,
            Mode::OnDemand => ThrottleAs::Throttling,
        },
        latency: dynamodb_fidelity::Latency {
            base: Duration::from_millis(args.latency_ms),
            tail: Duration::from_millis(args.latency_tail_ms),
        },
        partitions: args.partitions,
        isolate_after: args.isolate_after_ms.map(Duration::from_millis),
        table: args.on_demand_table.then_some(TableModel {
            initial_write: args.table_initial_write,
            initial_read: args.table_initial_read,
            peak_window: Duration::from_secs(args.table_peak_window_s),
            quota_write: args.table_quota_write,
            quota_read: args.table_quota_read,
        }),
    })
    .await?;
    let endpoint = running.endpoint();
    if let Some(path) = &args.address_file {
        write_whole(path, &endpoint)?;
    }
    announce(&endpoint)?;
    let reason = stopped(!args.ignore_stdin).await?;
    tracing::info!(reason, "stopping");
    running.shutdown().await;
    Ok(())
}

/// The endpoint on standard output, one line.
#[allow(clippy::print_stdout, reason = "the endpoint is the binary's output")]
fn announce(endpoint: &str) -> std::io::Result<()> {
    println!("{endpoint}");
    std::io::stdout().flush()
}

/// Writes `text` to `path` through a sibling file renamed over it.
fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path)
}

/// Waits for a reason to stop, and names it.
async fn stopped(watch_stdin: bool) -> std::io::Result<&'static str> {
    let (closed_tx, closed) = tokio::sync::oneshot::channel::<()>();
    if watch_stdin {
        // A plain thread, not the runtime's blocking pool: a read that never returns
        // must not keep the runtime from shutting down.
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 1024];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = closed_tx.send(());
        });
    } else {
        // Kept alive, so `closed` never resolves.
        std::mem::forget(closed_tx);
    }
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    Ok(tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
        _ = closed => "standard input closed",
    })
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
