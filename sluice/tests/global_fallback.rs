//! Without `SLUICE_TABLE_NAME`, the environment's client falls back to memory and says so
//! once per process, and an acquire on a missing bucket names the store it looked in. (Its
//! own test binary: it installs the process's log subscriber.)

use std::io::Write;
use std::sync::{Arc, Mutex};

use sluice::{Error, Sluice};

/// Everything logged, as text.
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<u8>>>);

impl Write for Logged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_memory_fallback_is_announced_once_and_named_in_errors() {
    if std::env::var_os("SLUICE_TABLE_NAME").is_some() {
        // A developer's shell with a table configured: the fallback cannot happen here.
        return;
    }
    let logged = Logged::default();
    let writer = logged.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    let first = Sluice::from_env().await.unwrap();
    let _second = Sluice::from_env().await.unwrap();
    let global = Sluice::global().await.unwrap();
    let text = String::from_utf8(logged.0.lock().unwrap().clone()).unwrap();
    assert_eq!(
        text.matches("SLUICE_TABLE_NAME is not set").count(),
        1,
        "{text}"
    );
    assert!(
        text.contains("WARN") && text.contains("only this process sees"),
        "{text}"
    );
    for client in [first, global] {
        let error = client.acquire("openai#rpm").await.unwrap_err();
        assert!(matches!(error, Error::UnknownDimension { .. }), "{error}");
        let message = error.to_string();
        assert!(
            message.contains("`openai#rpm` in this process's in-memory store"),
            "{message}"
        );
        assert!(message.contains("set SLUICE_TABLE_NAME"), "{message}");
    }
}
