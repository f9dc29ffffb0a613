//! sluice's scheduled reconciler as an AWS Lambda function: one reconcile pass per
//! invocation gives back the quota of callers that crashed holding it, and heals
//! `concurrent` buckets (see `Sluice::reconcile` in the
//! [sluice-limiter](https://docs.rs/sluice-limiter) crate).
//!
//! The binary `sluice-reconciler-lambda` is the function: deploy it as `bootstrap` on the
//! `provided.al2023` runtime with the environment of any sluice client
//! (`SLUICE_TABLE_NAME`, optionally `RUST_LOG`), under a role with the reconciler policy,
//! and schedule it with an EventBridge rule (`rate(5 minutes)`); the event's content is
//! ignored. `deploy/cloudformation/sluice.yaml` in the repository does all of that.
//!
//! A pass that hit errors fails the invocation, so Lambda's error metric and alarms see it;
//! the report is in the function's logs and in its result.
//!
//! ```no_run
//! use lambda_runtime::{LambdaEvent, service_fn};
//! use serde_json::Value;
//!
//! # async fn run() -> Result<(), lambda_runtime::Error> {
//! let sluice = sluice::Sluice::from_env().await?;
//! lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
//!     let sluice = sluice.clone();
//!     async move { sluice_lambda::handler(&sluice, event).await }
//! }))
//! .await
//! # }
//! ```

#![forbid(unsafe_code)]

use lambda_runtime::{Error, LambdaEvent};
use serde_json::{Value, json};
use sluice::{ReconcileReport, Sluice};

/// One reconcile pass; returns the report's counts, or fails when the pass hit errors.
pub async fn handler(sluice: &Sluice, event: LambdaEvent<Value>) -> Result<Value, Error> {
    let report = sluice.reconcile().await?;
    tracing::info!(request_id = %event.context.request_id, %report, "reconcile pass");
    if let Some(first) = report.errors.first() {
        return Err(format!(
            "{} error(s) in the reconcile pass, first: {first}",
            report.errors.len()
        )
        .into());
    }
    Ok(counts(&report))
}

/// A report's counts as the invocation's result.
pub fn counts(report: &ReconcileReport) -> Value {
    json!({
        "leases_seen": report.leases_seen,
        "leases_restored": report.leases_restored,
        "tokens_restored": report.tokens_restored.to_string(),
        "leases_skipped": report.leases_skipped,
        "leases_in_grace": report.leases_in_grace,
        "buckets_checked": report.buckets_checked,
        "buckets_healed": report.buckets_healed,
        "tokens_healed": report.tokens_healed.to_string(),
        "buckets_busy": report.buckets_busy,
        "buckets_not_raised": report.buckets_not_raised,
    })
}
