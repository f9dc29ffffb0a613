//! The tracing the client emits. Each test runs its body in a process of its own (this
//! binary again, with only that test selected): tracing caches per call site whether
//! anyone listens, and a test running in parallel without a subscriber, registering a
//! call site as this test sets its own, can leave the call site looking unwatched.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice::{Bucket, MemoryStore, RefillRate, Sluice, clock::ManualClock, clock::UnixMillis};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt as _};

/// Collects the fields of every closed `sluice.acquire` span.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<FieldList>>>);

type FieldList = Vec<(String, String)>;

#[derive(Default)]
struct Fields(FieldList);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.retain(|(k, _)| k != field.name());
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.retain(|(k, _)| k != field.name());
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S> Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        ctx.span(id).unwrap().extensions_mut().insert(fields);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut ext = span.extensions_mut();
        values.record(ext.get_mut::<Fields>().unwrap());
    }
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        if span.name() == "sluice.acquire" {
            let fields = span.extensions_mut().remove::<Fields>().unwrap();
            self.0.lock().unwrap().push(fields.0);
        }
    }
}

/// Set in the process a test runs its body in.
const ALONE: &str = "SLUICE_TEST_TRACING_ALONE";

/// Whether this is the process of its own that `test` runs in; otherwise runs it there and
/// checks that it passed.
fn alone(test: &str) -> bool {
    if std::env::var_os(ALONE).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &format!("tracing::{test}"),
            "--test-threads",
            "1",
        ])
        .env(ALONE, "1")
        .output()
        .expect("run the test in a process of its own");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

#[tokio::test]
async fn acquire_spans_record_dimension_outcome_attempts_and_retry_in() {
    if !alone("acquire_spans_record_dimension_outcome_attempts_and_retry_in") {
        return;
    }
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();

    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let sluice = Sluice::builder()
        .store(MemoryStore::new())
        .clock(clock)
        .build()
        .unwrap();
    sluice
        .put_bucket(
            "traced#rpm",
            Bucket::requests(RefillRate::per_second(4)).with_capacity(1),
        )
        .await
        .unwrap();
    sluice
        .acquire("traced#rpm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let e = sluice.acquire("traced#rpm").await.unwrap_err();
    assert_eq!(e.retry_in(), Some(Duration::from_millis(250)));

    let spans = spans.0.lock().unwrap().clone();
    let get = |i: usize, k: &str| {
        spans[i]
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(spans.len(), 2);
    assert_eq!(get(0, "dimensions").as_deref(), Some("traced#rpm"));
    assert_eq!(get(0, "outcome").as_deref(), Some("granted"));
    assert_eq!(get(0, "attempts").as_deref(), Some("1"));
    assert_eq!(get(1, "outcome").as_deref(), Some("retry_in"));
    assert_eq!(get(1, "retry_in_ms").as_deref(), Some("250"));
}
