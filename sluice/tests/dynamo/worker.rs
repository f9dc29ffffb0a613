//! Child processes of a multi-process test: the test binary runs itself with
//! `--child TEST` and talks to each child over its stdin and stdout, one line at a time. A worker that
//! is dropped before it exited (a failed assertion in the parent) is killed by its PID, so
//! no test leaves a process behind.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

/// The test the binary is running now: its children are started as that test's.
static CURRENT: Mutex<&str> = Mutex::new("");

/// The arguments that start this test binary as a child of the test running now.
pub fn child_args() -> [&'static str; 2] {
    ["--child", *CURRENT.lock().unwrap()]
}

/// The `main` of a binary of multi-process tests, each a `(name, main)`: started as
/// `--child NAME …`, runs that test's `main` (which calls [`start`]); with `--list`,
/// lists them as the test harness would; otherwise runs, one after another, every test
/// whose name contains one of the arguments that are not flags (all of them if none).
#[allow(clippy::print_stdout)]
pub fn dispatch(tests: &[(&'static str, fn())]) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        let name = args.get(1).expect("--child names its test");
        let (name, main) = tests
            .iter()
            .find(|(n, _)| n == name)
            .expect("--child names one of this binary's tests");
        *CURRENT.lock().unwrap() = name;
        return main();
    }
    if args.iter().any(|a| a == "--list") {
        for (name, _) in tests {
            println!("{name}: test");
        }
        return;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    for (name, main) in tests {
        // A long test runs only when named exactly.
        let long = name.starts_with("long_");
        let named = |f: &&String| {
            if long {
                f.as_str() == *name
            } else {
                name.contains(f.as_str())
            }
        };
        if (filters.is_empty() && !long) || filters.iter().any(named) {
            println!("running {name}");
            *CURRENT.lock().unwrap() = name;
            main();
        }
    }
}

/// One child process.
pub struct Worker {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The name it acquires under (`SLUICE_CALLER`).
    pub caller: String,
}

impl Worker {
    /// Starts this test binary as `--child` with `args`; `caller` names it.
    pub fn spawn(caller: &str, args: &[&str]) -> Worker {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args(child_args())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        Worker {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
            caller: caller.to_owned(),
        }
    }

    /// Reads the child's next line, which must start with `prefix`; returns the rest.
    pub fn expect_line(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert!(
            line.starts_with(prefix),
            "{}: expected `{prefix}…`, got {line:?}",
            self.caller
        );
        line.trim()[prefix.len()..].trim().to_owned()
    }

    /// Reads the child's next line, whatever it is (empty at end of output).
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim_end().to_owned()
    }

    /// Sends the child a line.
    pub fn say(&mut self, text: &str) {
        writeln!(self.stdin, "{text}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits for the child to exit; whether it succeeded.
    pub fn finish(&mut self) -> bool {
        self.child.wait().unwrap().success()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How a multi-process test binary was started.
pub enum Start {
    /// As a child: the arguments after `--child TEST`.
    Child(tokio::runtime::Runtime, Vec<String>),
    /// As the test itself.
    Parent(tokio::runtime::Runtime),
}

/// Starts a multi-process test (from [`dispatch`]): the runtime every such test runs on
/// (two worker threads, as CI has two cores) and what it was started as. A child logs to
/// stderr at `child_level` (`SLUICE_TEST_DEBUG` turns on debug logs).
pub fn start(child_level: tracing::Level) -> Start {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if args.get(1).map(String::as_str) == Some("--child") {
        let level = if std::env::var_os("SLUICE_TEST_DEBUG").is_some() {
            tracing::Level::DEBUG
        } else {
            child_level
        };
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(level)
            .init();
        return Start::Child(runtime, args[3..].to_vec());
    }
    Start::Parent(runtime)
}

/// Prints the outcome of one run named `name` as the test harness would: `None` skipped.
#[allow(clippy::print_stdout)]
pub fn report(name: &str, outcome: Option<()>) -> bool {
    match outcome {
        Some(()) => println!("{name}: 1 passed, 0 failed"),
        None => println!("0 passed, 0 failed, 1 skipped"),
    }
    outcome.is_some()
}

/// Runs `workers` together for `run`: waits until each says `ready`, tells them all
/// `go DEADLINE` (milliseconds since the epoch, system clock), then collects every line
/// each prints until its `done`, and checks that each exited successfully. Returns the
/// lines and when the run started and ended (system clock, milliseconds).
pub fn run_together(workers: &mut [Worker], run: std::time::Duration) -> (Vec<String>, i64, i64) {
    use sluice::clock::Clock as _;
    for w in workers.iter_mut() {
        w.expect_line("ready");
    }
    let started = sluice::clock::SystemClock.now().as_millis();
    let deadline = started + run.as_millis() as i64;
    for w in workers.iter_mut() {
        w.say(&format!("go {deadline}"));
    }
    let mut lines = Vec::new();
    for w in workers.iter_mut() {
        loop {
            let line = w.line();
            assert!(!line.is_empty(), "{} stopped before it was done", w.caller);
            if line == "done" {
                break;
            }
            lines.push(line);
        }
        assert!(w.finish(), "{} failed", w.caller);
    }
    (lines, started, deadline)
}
