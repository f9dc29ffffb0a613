//! The binary: it announces its endpoint, serves, and stops when its standard input
//! closes. Needs no DynamoDB Local: nothing is forwarded.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the child on the way out, if the test fails before it exits.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Waits up to `bound` for `check` to hold, polling.
fn wait_for<T>(bound: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(found) = check() {
            return Some(found);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_binary_writes_its_address_file_and_exits_when_its_stdin_closes() {
    let dir = std::env::temp_dir().join(crate::common::unique("dynamodb-fidelity-binary"));
    std::fs::create_dir_all(&dir).unwrap();
    let address_file = dir.join("address");
    let mut child = Reaped(
        Command::new(env!("CARGO_BIN_EXE_dynamodb-fidelity"))
            .args(["--upstream", "http://127.0.0.1:9", "--write-ceiling", "10"])
            .args(["--throttle-as", "on-demand", "--address-file"])
            .arg(&address_file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the binary"),
    );

    let endpoint = wait_for(Duration::from_secs(20), || {
        std::fs::read_to_string(&address_file).ok()
    })
    .expect("the address file within 20 s");
    assert!(endpoint.starts_with("http://127.0.0.1:"), "{endpoint}");
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim_end(), endpoint, "the same endpoint on stdout");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stats = runtime
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(10),
                dynamodb_fidelity::fetch_stats(&endpoint),
            )
            .await
        })
        .expect("the stats within 10 s")
        .expect("the stats");
    assert_eq!(stats, dynamodb_fidelity::Stats::default());

    drop(child.0.stdin.take());
    let status = wait_for(Duration::from_secs(10), || child.0.try_wait().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    let status = status.expect("the binary exits within 10 s of its stdin closing");
    assert!(status.success(), "{status}");
}

#[test]
fn the_binary_refuses_an_address_off_loopback() {
    let mut child = Reaped(
        Command::new(env!("CARGO_BIN_EXE_dynamodb-fidelity"))
            .args(["--upstream", "http://127.0.0.1:9", "--listen", "0.0.0.0:0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the binary"),
    );
    let status = wait_for(Duration::from_secs(10), || child.0.try_wait().unwrap())
        .expect("the binary exits within 10 s");
    assert!(!status.success());
}
