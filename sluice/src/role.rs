//! Which role's code a DynamoDB call serves, for recording the operations each role sends
//! (see `store/dynamo/record.rs` and the IAM policies under `deploy/iam/`).
//!
//! Three roles share the table, each with its own policy: the application (everything a
//! client does to serve its callers, and the work it leaves to background tasks), the
//! reconciler (`Sluice::reconcile`) and the operator (defining and looking at buckets,
//! creating the table, and the whole `sluice` binary). Entry points scope their work in
//! their role; the outermost scope wins, so a reconcile pass the operator runs stays the
//! operator's. Nothing is scoped, and nothing costs anything, unless
//! [`RECORD_VARIABLE`] names a directory.

// Only the DynamoDB store records, with the `record-operations` feature; without it, the
// scopes are all there is.
#![cfg_attr(not(feature = "record-operations"), allow(dead_code))]

use std::future::Future;
use std::path::Path;
#[cfg(feature = "record-operations")]
use std::path::PathBuf;
use std::sync::OnceLock;

/// The environment variable naming the directory operations are recorded in (read with
/// the `record-operations` feature only).
#[cfg_attr(not(feature = "record-operations"), allow(dead_code))]
pub(crate) const RECORD_VARIABLE: &str = "SLUICE_RECORD_DYNAMODB_OPERATIONS";

/// A role with a policy of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    /// Serving callers: acquires, slots, releases, adjustments, feedback, background work.
    Application,
    /// Giving back expired leases and healing `concurrent` buckets.
    Reconciler,
    /// Creating the table, defining, listing and deleting buckets, looking at leases.
    Operator,
}

impl Role {
    /// The role's name, as the recorded lines and the policy files spell it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Application => "application",
            Role::Reconciler => "reconciler",
            Role::Operator => "operator",
        }
    }
}

tokio::task_local! {
    static ROLE: Role;
}

/// The role of every call this process makes, when it declared one (the `sluice` binary).
static PROCESS_ROLE: OnceLock<Role> = OnceLock::new();

/// The directory operations are recorded in, read once from [`RECORD_VARIABLE`]; never
/// without the `record-operations` feature (a test hook: production builds read no such
/// variable).
#[cfg(not(feature = "record-operations"))]
pub(crate) fn recording_dir() -> Option<&'static Path> {
    None
}

/// The directory operations are recorded in, read once from [`RECORD_VARIABLE`].
#[cfg(feature = "record-operations")]
pub(crate) fn recording_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        std::env::var_os(RECORD_VARIABLE)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    })
    .as_deref()
}

/// The role the current call serves: the outermost scope's, or the process's, or the
/// application's (background tasks a client spawns serve its callers).
pub(crate) fn current() -> Role {
    ROLE.try_with(|r| *r)
        .ok()
        .or_else(|| PROCESS_ROLE.get().copied())
        .unwrap_or(Role::Application)
}

/// Runs `work` as `role`'s, unless an outer scope (or the process) already says whose it
/// is. A plain `await` when operations are not recorded.
pub(crate) async fn within<F: Future>(role: Role, work: F) -> F::Output {
    let scoped = ROLE.try_with(|_| ()).is_ok() || PROCESS_ROLE.get().is_some();
    if scoped || recording_dir().is_none() {
        work.await
    } else {
        ROLE.scope(role, work).await
    }
}

/// Declares every call of this process the operator's.
pub(crate) fn operator_process() {
    // A second declaration says the same.
    let _ = PROCESS_ROLE.set(Role::Operator);
}
