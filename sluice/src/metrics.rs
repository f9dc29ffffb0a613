//! Metrics through the [`metrics`](https://docs.rs/metrics) facade: install any recorder
//! (Prometheus, CloudWatch EMF, StatsD, …) and these appear; without one they cost nothing
//! but a check.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `sluice_grants_total` | counter | `dimension`, `priority` | acquires granted |
//! | `sluice_retry_in_total` | counter | `dimension`, `priority` | acquires answered RetryIn |
//! | `sluice_shadow_refusals_total` | counter | `dimension`, `priority` | acquires granted in [shadow mode](crate::Mode::Shadow) that an enforcing bucket would have refused (`dimension`: the bucket that would have) |
//! | `sluice_shadow_unrecorded_total` | counter | `dimension` | acquires granted in shadow mode without a write because the store could not answer (or the row stayed too contended): not taken from the bucket |
//! | `sluice_peeks_total` | counter | `dimension`, `outcome` (`granted`, `retry_in`, `error`) | peeks ([`Sluice::peek`](crate::Sluice::peek)): what an acquire would have got, nothing taken |
//! | `sluice_errors_total` | counter | `dimension`, `priority`, `error` | acquires failed otherwise (`error`: the cause, e.g. `store_throttled`, `contention`) |
//! | `sluice_contention_retries_total` | counter | `dimension` | commits lost to another writer and retried |
//! | `sluice_acquire_duration_seconds` | histogram | `outcome` (`granted`, `retry_in`, `error`) | acquire latency |
//! | `sluice_grants_per_write` | histogram | | grants carried by one fast-path write |
//! | `sluice_fail_open_grants_total` | counter | `dimension` | grants from a local bucket while the store could not answer ([`FailurePolicy::Open`](crate::FailurePolicy::Open)) |
//! | `sluice_lost_answers_total` | counter | `dimension`, `outcome` (`applied`, `not_applied`, `unknown`) | writes whose answer was lost, and what the row then told of them |
//! | `sluice_bucket_write_units_total` | counter | `dimension` | write units the store billed for successful writes of the bucket row (as it reported them; DynamoDB Local reports one per write) |
//! | `sluice_bucket_failed_writes_total` | counter | `dimension` | writes of the bucket row whose condition failed (DynamoDB bills them too) |
//! | `sluice_bucket_throttles_total` | counter | `dimension` | reads and writes of the bucket row the store throttled, or a transaction in flight refused (back-pressure: retried, or a RetryIn) |
//! | `sluice_table_throttles_total` | counter | | reads and writes of bucket rows throttled by a limit of the whole table (a cold on-demand table, its quota, provisioned capacity, an index; DynamoDB's throttling reasons other than the key range): back-pressure, never a reason to spread a bucket; logged at most once a minute |
//! | `sluice_bucket_shards` | gauge | `dimension` | rows a bucket is spread over, as set by this client's last reshard of it (see [`Sharding`](crate::Sharding)) |
//! | `sluice_slot_renewals_total` | counter | `outcome` (`renewed`, `failed`) | heartbeats of held `concurrent` slots: renewals of their lease rows (one write each), and those the store failed (sent again sooner) |
//! | `sluice_reconcile_passes_total` | counter | | reconcile passes |
//! | `sluice_reconcile_leases_restored_total` | counter | | expired leases given back |
//! | `sluice_reconcile_leases_skipped_total` | counter | | expired leases already gone |
//! | `sluice_reconcile_buckets_healed_total` | counter | | `concurrent` buckets recomputed |
//! | `sluice_reconcile_errors_total` | counter | | failures inside passes |
//! | `sluice_reconcile_tokens_restored` | histogram | | tokens given back per pass |
//! | `sluice_reconcile_duration_seconds` | histogram | | pass duration |
//!
//! `dimension` is the acquire's dimensions, comma-separated (one, usually); on the
//! `sluice_bucket_*` counters, the row's key (`{dimension}#{k}` for shard `k` of a sharded
//! bucket); `priority` the acquire's priority, empty for none (see [`Priority`]). Labels
//! stay bounded however many dimensions a client meets (per tenant, per key): the first
//! 1,000 distinct `dimension` values a client reports are reported as they are, any
//! other as `other`.

use std::time::Duration;

use crate::error::Error;
use crate::priority::Priority;
use crate::store::StoreError;
use crate::tokens::Tokens;

/// The most distinct `dimension` label values one client reports; past them, `other`.
const MAX_DIMENSION_LABELS: usize = 1_000;

/// The `dimension` label values one client has reported: at most
/// [`MAX_DIMENSION_LABELS`], so a recorder's series stay bounded however many dimensions
/// the client meets.
#[derive(Debug, Default)]
pub(crate) struct Labels(std::sync::Mutex<std::collections::HashSet<String>>);

impl Labels {
    /// The label of `dimension`: itself while fewer than [`MAX_DIMENSION_LABELS`] distinct
    /// ones were reported (or it is one of them), else `other`.
    fn of(&self, dimension: &str) -> String {
        let dimension: &str = &crate::dimension::by_template(dimension);
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // One allocation, the label's own: the set is only written on a label's first report.
        if !seen.contains(dimension) {
            if seen.len() >= MAX_DIMENSION_LABELS {
                return "other".to_owned();
            }
            seen.insert(dimension.to_owned());
        }
        dimension.to_owned()
    }
}

/// Records an acquire's outcome and latency.
/// `dimension` is moved into the label: one allocation per acquire, made by the caller.
pub(crate) fn acquired<T>(
    labels: &Labels,
    dimension: String,
    priority: Option<&Priority>,
    result: &Result<T, Error>,
    elapsed: Duration,
) {
    let priority = priority.map_or_else(String::new, |p| p.as_str().to_owned());
    let outcome = match result {
        Ok(_) => {
            metrics::counter!("sluice_grants_total", "dimension" => labels.of(&dimension), "priority" => priority)
                .increment(1);
            "granted"
        }
        Err(Error::RetryIn(_)) => {
            metrics::counter!("sluice_retry_in_total", "dimension" => labels.of(&dimension), "priority" => priority)
                .increment(1);
            "retry_in"
        }
        Err(e) => {
            metrics::counter!(
                "sluice_errors_total",
                "dimension" => labels.of(&dimension),
                "priority" => priority,
                "error" => error_label(e)
            )
            .increment(1);
            "error"
        }
    };
    metrics::histogram!("sluice_acquire_duration_seconds", "outcome" => outcome)
        .record(elapsed.as_secs_f64());
}

/// Records a commit lost to another writer, to be retried.
pub(crate) fn contention_retry(labels: &Labels, dimension: &str) {
    metrics::counter!("sluice_contention_retries_total", "dimension" => labels.of(dimension))
        .increment(1);
}

/// Records a heartbeat of a slot lease's `rows`.
pub(crate) fn slot_renewed(rows: usize, failed: bool) {
    let outcome = if failed { "failed" } else { "renewed" };
    metrics::counter!("sluice_slot_renewals_total", "outcome" => outcome).increment(rows as u64);
}

/// Records how many grants one fast-path write carried.
pub(crate) fn batch(grants: usize) {
    metrics::histogram!("sluice_grants_per_write").record(grants as f64);
}

/// Records a grant from a local bucket of the `open` failure policy.
pub(crate) fn fail_open_grant(labels: &Labels, dimension: &str) {
    metrics::counter!("sluice_fail_open_grants_total", "dimension" => labels.of(dimension))
        .increment(1);
}

/// Records a write whose answer was lost, and what became of it.
pub(crate) fn lost_answer(labels: &Labels, dimension: &str, outcome: crate::bucket::WriteOutcome) {
    use crate::bucket::WriteOutcome;
    let outcome = match outcome {
        WriteOutcome::Applied => "applied",
        WriteOutcome::NotApplied => "not_applied",
        WriteOutcome::Unknown => "unknown",
    };
    metrics::counter!(
        "sluice_lost_answers_total",
        "dimension" => labels.of(dimension),
        "outcome" => outcome
    )
    .increment(1);
}

/// Records a write of `dimension`'s bucket row whose condition failed.
pub(crate) fn bucket_failed_write(labels: &Labels, dimension: &str) {
    metrics::counter!("sluice_bucket_failed_writes_total", "dimension" => labels.of(dimension))
        .increment(1);
}

/// Records a read or write of a bucket row that the store pushed back (`error`); a
/// throttle of the whole table is also counted on its own and logged, at most once a
/// minute per process with how many were not.
pub(crate) fn bucket_throttled(labels: &Labels, dimension: &str, error: &StoreError) {
    metrics::counter!("sluice_bucket_throttles_total", "dimension" => labels.of(dimension))
        .increment(1);
    if let StoreError::TableThrottled { reasons, .. } = error {
        metrics::counter!("sluice_table_throttles_total").increment(1);
        TABLE_THROTTLES.note(reasons);
    }
}

/// Throttles of the whole table since the last log line, and when that was.
static TABLE_THROTTLES: Quiet = Quiet::new(Duration::from_secs(60));

/// A log line repeated at most once per `every`, with how many times it was not.
#[derive(Debug)]
struct Quiet {
    every: Duration,
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl Quiet {
    const fn new(every: Duration) -> Quiet {
        Quiet {
            every,
            state: std::sync::Mutex::new((None, 0)),
        }
    }

    /// One more throttle of the whole table, for `reasons`: logged if the last line is
    /// older than `every`.
    fn note(&self, reasons: &str) {
        let now = std::time::Instant::now();
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.1 += 1;
        if state
            .0
            .is_some_and(|last| now.duration_since(last) < self.every)
        {
            return;
        }
        let count = std::mem::take(&mut state.1);
        state.0 = Some(now);
        drop(state);
        tracing::warn!(
            reasons,
            throttles = count,
            "DynamoDB is throttling the table as a whole, not a hot row: callers are paced (RetryIn) and no bucket is spread for it; warm the table or raise its limits (docs/dynamodb.md, capacity planning)"
        );
    }
}

/// Records a peek's answer.
pub(crate) fn peeked(labels: &Labels, dimension: String, answer: &Result<crate::Peek, Error>) {
    let outcome = match answer {
        Ok(crate::Peek::Granted) => "granted",
        Ok(crate::Peek::RetryIn(_)) => "retry_in",
        Err(_) => "error",
    };
    metrics::counter!("sluice_peeks_total", "dimension" => labels.of(&dimension), "outcome" => outcome)
        .increment(1);
}

/// Records an acquire granted in shadow mode that `dimension`'s bucket would have refused.
pub(crate) fn shadow_refused(labels: &Labels, dimension: &str, priority: Option<&Priority>) {
    let priority = priority.map_or_else(String::new, |p| p.as_str().to_owned());
    metrics::counter!("sluice_shadow_refusals_total", "dimension" => labels.of(dimension), "priority" => priority)
        .increment(1);
}

/// Records a grant in shadow mode that no write recorded.
pub(crate) fn shadow_unrecorded(labels: &Labels, dimension: &str) {
    metrics::counter!("sluice_shadow_unrecorded_total", "dimension" => labels.of(dimension))
        .increment(1);
}

/// Records that this client resharded `dimension`'s bucket into `rows` rows.
pub(crate) fn resharded(labels: &Labels, dimension: &str, rows: usize) {
    metrics::gauge!("sluice_bucket_shards", "dimension" => labels.of(dimension)).set(rows as f64);
}

/// Records a reconcile pass.
/// What one reconcile pass did, as counted.
pub(crate) struct Reconciled {
    pub(crate) restored: usize,
    pub(crate) skipped: usize,
    pub(crate) healed: usize,
    pub(crate) errors: usize,
    pub(crate) tokens_restored: Tokens,
}

pub(crate) fn reconciled(pass: Reconciled, elapsed: Duration) {
    metrics::counter!("sluice_reconcile_passes_total").increment(1);
    metrics::counter!("sluice_reconcile_leases_restored_total").increment(pass.restored as u64);
    metrics::counter!("sluice_reconcile_leases_skipped_total").increment(pass.skipped as u64);
    metrics::counter!("sluice_reconcile_buckets_healed_total").increment(pass.healed as u64);
    metrics::counter!("sluice_reconcile_errors_total").increment(pass.errors as u64);
    metrics::histogram!("sluice_reconcile_tokens_restored")
        .record(tokens_f64(pass.tokens_restored));
    metrics::histogram!("sluice_reconcile_duration_seconds").record(elapsed.as_secs_f64());
}

#[allow(clippy::float_arithmetic)]
fn tokens_f64(tokens: Tokens) -> f64 {
    tokens.as_nanos() as f64 / 1e9
}

/// A short, stable name for an error's cause.
pub(crate) fn error_label(error: &Error) -> &'static str {
    match error {
        Error::RetryIn(_) => "retry_in",
        Error::CostExceedsCapacity { .. } => "cost_exceeds_capacity",
        Error::CostExceedsShare { .. } => "cost_exceeds_share",
        Error::InvalidPriority(_) => "invalid_priority",
        Error::InvalidDimension(_) => "invalid_dimension",
        Error::UnknownDimension { .. } => "unknown_dimension",
        Error::KeyRequired { .. } => "key_required",
        Error::InvalidCost { .. } => "invalid_cost",
        Error::InvalidTtl(_) => "invalid_ttl",
        Error::DimensionCount { .. } => "dimension_count",
        Error::InvalidBucket { .. } => "invalid_bucket",
        Error::Timeout(_) => "timeout",
        Error::Contention { .. } => "contention",
        Error::LeaseNotFound(_) => "lease_not_found",
        Error::Config(_) => "config",
        Error::Shards(_) => "shards",
        Error::BucketChanged { .. } => "bucket_changed",
        Error::Store(e) => match e {
            StoreError::TableNotFound { .. } => "store_table_not_found",
            StoreError::Throttled { .. } => "store_throttled",
            StoreError::TableThrottled { .. } => "store_table_throttled",
            StoreError::TransactionConflict { .. } => "store_transaction_conflict",
            StoreError::Timeout { .. } => "store_timeout",
            StoreError::CorruptRow { .. } => "store_corrupt_row",
            StoreError::Unavailable { .. } | StoreError::Unreachable { .. } => "store_unavailable",
            StoreError::OutcomeUnknown { .. } => "store_outcome_unknown",
            StoreError::Rejected { .. } => "store_rejected",
            StoreError::Service { .. } => "store_service",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_reports_at_most_a_thousand_dimension_labels_then_other() {
        let labels = Labels::default();
        for i in 0..MAX_DIMENSION_LABELS {
            assert_eq!(labels.of(&format!("t{i}#rpm")), format!("t{i}#rpm"));
        }
        assert_eq!(labels.of("t-late#rpm"), "other");
        // Those already reported keep their label.
        assert_eq!(labels.of("t7#rpm"), "t7#rpm");
        assert_eq!(labels.0.lock().unwrap().len(), MAX_DIMENSION_LABELS);
    }

    #[test]
    fn every_key_of_a_keyed_bucket_shares_its_template_s_label() {
        let labels = Labels::default();
        for i in 0..5_000 {
            assert_eq!(labels.of(&format!("ingest#rpm#@t{i}")), "ingest#rpm#@*");
        }
        assert_eq!(labels.of("ingest#rpm#@t1#3"), "ingest#rpm#@*");
        assert_eq!(
            labels.of("ingest#rpm#@t1,openai#tpm,v#@m"),
            "ingest#rpm#@*,openai#tpm,v#@m"
        );
        assert_eq!(labels.of("v#@m#@k"), "v#@m#@*");
        assert_eq!(labels.of("openai#rpm#3"), "openai#rpm#3");
        assert_eq!(labels.0.lock().unwrap().len(), 4);
    }
}
