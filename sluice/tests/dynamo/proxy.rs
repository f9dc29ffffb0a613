//! A loopback TCP proxy in front of DynamoDB Local that injects the faults of a real
//! network: it forwards every request, then loses some answers (the connection stays open
//! and silent until the client gives up), delays some by up to a bound, and resets some
//! connections after forwarding the request (the write applied, the answer never came).
//!
//! Each fault is drawn per chunk of an answer (a DynamoDB answer is one chunk nearly
//! always), with the probabilities of [`Faults`], which can be changed while it runs.
//! Dropped, the proxy stops accepting and closes what it holds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the proxy does to answers, in thousandths.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Answers lost: the client hears nothing more on that connection.
    pub lose_per_mille: u32,
    /// Answers delayed by a uniform draw from zero to `max_delay`.
    pub delay_per_mille: u32,
    /// The longest delay.
    pub max_delay: Duration,
    /// Connections reset in place of an answer.
    pub reset_per_mille: u32,
}

/// How many of each fault the proxy injected.
#[derive(Debug, Default)]
pub struct Injected {
    pub answers: AtomicU64,
    pub lost: AtomicU64,
    pub delayed: AtomicU64,
    pub reset: AtomicU64,
}

/// A running proxy.
pub struct Proxy {
    /// The endpoint clients use instead of DynamoDB Local's.
    pub endpoint: String,
    faults: Arc<Mutex<Faults>>,
    injected: Arc<Injected>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// A proxy on a free loopback port in front of `upstream` (`http://host:port`).
    pub async fn start(upstream: &str, faults: Faults) -> Proxy {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let faults = Arc::new(Mutex::new(faults));
        let injected = Arc::new(Injected::default());
        let accept = {
            let (faults, injected) = (faults.clone(), injected.clone());
            tokio::spawn(async move {
                let mut connections = tokio::task::JoinSet::new();
                while let Ok((client, _)) = listener.accept().await {
                    let (faults, injected) = (faults.clone(), injected.clone());
                    let upstream = upstream.clone();
                    connections.spawn(async move {
                        if let Ok(server) = TcpStream::connect(&upstream).await {
                            relay(client, server, &faults, &injected).await;
                        }
                    });
                }
            })
        };
        Proxy {
            endpoint,
            faults,
            injected,
            accept,
        }
    }

    /// Changes the faults from now on.
    pub fn set_faults(&self, faults: Faults) {
        *self.faults.lock().unwrap() = faults;
    }

    /// What was injected so far.
    pub fn injected(&self) -> &Injected {
        &self.injected
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection.
        self.accept.abort();
    }
}

/// Whether a draw in thousandths falls under `per_mille`.
fn draw(per_mille: u32) -> bool {
    per_mille > 0 && rand::random_range(0..1000) < per_mille
}

/// Relays one connection: requests as they come, answers through the faults.
async fn relay(client: TcpStream, server: TcpStream, faults: &Mutex<Faults>, injected: &Injected) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = async {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    };
    let answers = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            injected.answers.fetch_add(1, Ordering::Relaxed);
            let f = *faults.lock().unwrap();
            if draw(f.lose_per_mille) {
                injected.lost.fetch_add(1, Ordering::Relaxed);
                // Silence: swallow the rest of this connection's answers.
                while let Ok(n) = server_read.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
                std::future::pending::<()>().await;
            }
            if draw(f.reset_per_mille) {
                injected.reset.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            if draw(f.delay_per_mille) {
                injected.delayed.fetch_add(1, Ordering::Relaxed);
                let ms = rand::random_range(0..=f.max_delay.as_millis() as u64);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        false
    };
    // The connection ends when the client closes it (a lost answer's client gives up),
    // or at a reset.
    let reset = tokio::select! {
        () = requests => false,
        reset = answers => reset,
    };
    if reset {
        let client = client_read.reunite(client_write).unwrap();
        let _ = client.set_zero_linger();
        drop(client);
    }
}
