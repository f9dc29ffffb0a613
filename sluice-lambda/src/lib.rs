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
//! let sluice = sluice_lambda::client_from_env().await?;
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
use sluice::{Sluice, admin::ReconcileReport};

/// How long a handler waits, before it returns, for the client's background work (see
/// `Sluice::flush`): Lambda freezes the process once the handler returns.
pub const FLUSH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// One reconcile pass; returns the report's counts, or fails when the pass hit errors.
/// Before it returns, the client's background work is flushed (within [`FLUSH_DEADLINE`]),
/// as every Lambda handler using sluice should: a frozen process runs none.
pub async fn handler(sluice: &Sluice, event: LambdaEvent<Value>) -> Result<Value, Error> {
    let report = sluice.reconcile().await;
    if let Err(error) = sluice.flush(FLUSH_DEADLINE).await {
        tracing::warn!(%error, "background work not settled before the handler returned");
    }
    let report = report?;
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

/// The client the function runs on: configured from the environment like any sluice
/// client, except that the table is required even with `SLUICE_STORE=memory` (a reconciler
/// on a store only it sees would report empty passes forever).
pub async fn client_from_env() -> Result<Sluice, Error> {
    let config = sluice::Config::from_env()?;
    require_table(&config)?;
    Ok(sluice::SluiceBuilder::from_config(config).connect().await?)
}

/// Fails when `config` names no table.
pub fn require_table(config: &sluice::Config) -> Result<(), Error> {
    if config.table_name.is_none() {
        return Err("SLUICE_TABLE_NAME is not set: the reconciler needs the shared table".into());
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reconciler_without_a_table_refuses_to_start() {
        let mut config = sluice::Config::default();
        let error = require_table(&config).unwrap_err();
        assert!(
            error.to_string().contains("SLUICE_TABLE_NAME is not set"),
            "{error}"
        );
        config.table_name = Some("vendor-buckets".to_owned());
        assert!(require_table(&config).is_ok());
    }
}
