//! The reconciler function: one `Sluice` client per execution environment, one reconcile
//! pass per invocation. Logs go to stdout (CloudWatch) filtered by `RUST_LOG` directives
//! (default `info`).

#![forbid(unsafe_code)]

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::Value;
use sluice::Sluice;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => spec
            .parse::<Targets>()
            .map_err(|e| format!("RUST_LOG={spec:?} is not a log filter: {e}"))?,
        _ => Targets::new().with_default(LevelFilter::INFO),
    };
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_target(false)
                .without_time(),
        )
        .with(filter)
        .init();
    let sluice: Sluice = sluice_lambda::client_from_env().await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        let sluice = sluice.clone();
        async move { sluice_lambda::handler(&sluice, event).await }
    }))
    .await
}
