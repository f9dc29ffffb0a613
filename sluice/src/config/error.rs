//! What is wrong with a configuration.

/// An environment variable with a value sluice cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A variable's value is invalid.
    #[error("{variable}={value:?} is invalid: {reason}")]
    Invalid {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What was expected.
        reason: &'static str,
    },
    /// A table is configured but this build has no DynamoDB support.
    #[error(
        "SLUICE_TABLE_NAME={0:?} is set, but sluice was built without the `dynamodb` feature; enable it or unset the variable to use the in-memory store"
    )]
    NoDynamoDb(String),
    /// A table is configured, but the client was built synchronously.
    #[error(
        "SLUICE_TABLE_NAME={0:?} is set: build the client with `SluiceBuilder::connect().await` (or `Sluice::from_env().await`), which sets up the DynamoDB client"
    )]
    NeedsConnect(String),
    /// The table is a global table, with replicas in other Regions: writes in two Regions
    /// to one bucket row overwrite each other (last writer wins), so the shared quota
    /// would be exceeded with no error. Refused at start.
    #[error(
        "the DynamoDB table {table:?} has replicas in other Regions ({regions}): on a global table, two Regions' writes to one bucket row overwrite each other (last writer wins) and the shared quota is exceeded silently; use a table without replicas (one per Region, each with its own share of the quota)",
        regions = regions.join(", ")
    )]
    GlobalTable {
        /// The table.
        table: String,
        /// The Regions of its replicas.
        regions: Vec<String>,
    },
    /// A variable sluice no longer reads is set: refused rather than ignored, since the
    /// process that sets it expects what it asked for.
    #[error("{variable} is no longer read: {instead}")]
    Removed {
        /// The variable.
        variable: &'static str,
        /// What to do instead.
        instead: &'static str,
    },
    /// No store was chosen: no table and no explicit choice of the in-memory store.
    #[error(
        "no store chosen: set SLUICE_TABLE_NAME to the DynamoDB table every process shares, or choose the in-memory store (only this process sees it) explicitly with SLUICE_STORE=memory, `Sluice::in_memory()` or `SluiceBuilder::store(MemoryStore::new())`"
    )]
    NoStore,
}
