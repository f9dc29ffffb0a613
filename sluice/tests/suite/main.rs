//! sluice's integration tests, one module per subject, in one test binary: each binary
//! links the AWS SDK, and on CI's two cores linking thirty of them took minutes.
//!
//! The multi-process tests (`tests/processes/`, the process-wide default client's
//! included) and the command-line tests (`tests/cli/`, which need the `cli` feature) are
//! binaries of their own.

mod architecture;
mod client;
mod concurrency;
mod conformance;
mod counted;
mod docs;
#[path = "../dynamo/mod.rs"]
mod dynamo;
mod dynamo_clients;
mod dynamo_errors;
mod dynamo_peek;
mod dynamo_pressure;
mod dynamo_reshard_faults;
mod dynamo_rows;
mod dynamo_store;
mod dynamo_timeouts;
mod failure_policy;
#[path = "../faults/mod.rs"]
mod faults;
mod lanes;
mod lease_rows;
mod lease_time;
mod memory_store;
mod metrics;
mod model;
mod model_keys;
mod model_modes;
mod priorities;
mod properties;
mod retry_partitions;
mod tracing;
mod waiting;
