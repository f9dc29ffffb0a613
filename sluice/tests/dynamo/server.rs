//! A DynamoDB Local server of a test's own, for tests that freeze, kill or restart it
//! (the shared one other tests use must stay up). Started from the directory
//! `scripts/dynamodb-local.sh` exports (`SLUICE_TEST_DYNAMODB_JAR_DIR`), on a free loopback
//! port, in memory; stopped by its PID when dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server.
pub struct Server {
    child: Child,
    jar_dir: String,
    port: u16,
}

impl Server {
    /// Starts a server and waits until it answers, or `None` to skip (no DynamoDB Local).
    pub async fn start() -> Option<Server> {
        super::endpoint()?;
        let jar_dir = std::env::var("SLUICE_TEST_DYNAMODB_JAR_DIR")
            .expect("SLUICE_TEST_DYNAMODB_JAR_DIR is set by scripts/dynamodb-local.sh");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = spawn(&jar_dir, port);
        let server = Server {
            child,
            jar_dir,
            port,
        };
        server.wait_until_up().await;
        Some(server)
    }

    /// The server's endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Freezes the server (SIGSTOP): connections are accepted by the kernel and nothing
    /// answers.
    pub fn freeze(&self) {
        signal("-STOP", self.pid());
    }

    /// Resumes a frozen server (SIGCONT): it goes on with what was sent meanwhile.
    pub fn resume(&self) {
        signal("-CONT", self.pid());
    }

    /// Kills the server (SIGKILL): everything it held is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a new, empty server on the same port.
    pub async fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(20);
        // The port may take a moment to be free again.
        while TcpListener::bind(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "port {} stays taken", self.port);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.child = spawn(&self.jar_dir, self.port);
        self.wait_until_up().await;
    }

    async fn wait_until_up(&self) {
        let client = super::client(&self.endpoint());
        let deadline = Instant::now() + Duration::from_secs(60);
        while client.list_tables().send().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "DynamoDB Local on port {} did not answer within 60 s",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A frozen server must be resumed to die of anything but SIGKILL: kill it outright.
        self.kill();
    }
}

fn spawn(jar_dir: &str, port: u16) -> Child {
    Command::new("java")
        .arg(format!("-Djava.library.path={jar_dir}/DynamoDBLocal_lib"))
        .args(["-jar", &format!("{jar_dir}/DynamoDBLocal.jar")])
        .args(["-inMemory", "-port", &port.to_string(), "-disableTelemetry"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start DynamoDB Local (java)")
}

fn signal(signal: &str, pid: u32) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid} failed");
}
