//! Recording the DynamoDB operations each role sends, to check the IAM policies under
//! `deploy/iam/` against them (`sluice/tests/cli/iam_policies.rs`).
//!
//! When `SLUICE_RECORD_DYNAMODB_OPERATIONS` names a directory, every client a
//! [`DynamoStore`](super::DynamoStore) is built on gets an interceptor that sees every
//! request the SDK transmits, whichever code path sends it (its operation is the one the
//! request's `X-Amz-Target` names), and appends `<role>
//! <operation>` to `<directory>/<process id>.operations` the first time this process sends
//! that pair (so the file stays small however long the process runs, and a process that is
//! killed has already written what it sent). A transaction is recorded once per kind of
//! item it carries (`TransactWriteItems.Update`, `.Put`, `.Delete`, `.ConditionCheck`):
//! IAM authorizes each item by its own action, not the transaction's. Unset, clients are
//! left as they are and nothing is read or written.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Mutex, OnceLock, PoisonError};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::interceptors::{
    BeforeSerializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsInput;

use crate::role::{self, Role};

/// `client` with the recording interceptor when operations are recorded; `client` itself
/// otherwise.
pub(super) fn recording(client: Client) -> Client {
    if role::recording_dir().is_none() {
        return client;
    }
    let config = client.config().to_builder().interceptor(Recorder).build();
    Client::from_conf(config)
}

/// The operation whose items are recorded one kind at a time.
const TRANSACTION: &str = "TransactWriteItems";

/// Sees every operation before it is sent.
#[derive(Debug)]
struct Recorder;

impl Intercept for Recorder {
    fn name(&self) -> &'static str {
        "sluice::Recorder"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(input) = context.input().downcast_ref::<TransactWriteItemsInput>() else {
            return Ok(());
        };
        let role = role::current();
        for item in input.transact_items() {
            let kind = if item.update().is_some() {
                "Update"
            } else if item.put().is_some() {
                "Put"
            } else if item.delete().is_some() {
                "Delete"
            } else {
                "ConditionCheck"
            };
            record(role, &format!("{TRANSACTION}.{kind}"));
        }
        Ok(())
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        // The operation as the wire names it: `X-Amz-Target: DynamoDB_20120810.GetItem`.
        let operation = context
            .request()
            .headers()
            .get("x-amz-target")
            .and_then(|target| target.rsplit_once('.'))
            .map(|(_, operation)| operation);
        match operation {
            // Recorded by the kinds of its items, above.
            Some(TRANSACTION) => {}
            Some(operation) => record(role::current(), operation),
            None => record(role::current(), "Unknown"),
        }
        Ok(())
    }
}

/// This process's recording: the pairs written so far and the file.
struct Recording {
    seen: HashSet<(Role, String)>,
    file: File,
}

/// Appends `role operation` unless this process has written it already. A file that
/// cannot be written is reported once and the call goes on: recording never fails a call.
fn record(role: Role, operation: &str) {
    static RECORDING: OnceLock<Option<Mutex<Recording>>> = OnceLock::new();
    let Some(dir) = role::recording_dir() else {
        return;
    };
    let Some(recording) = RECORDING.get_or_init(|| open(dir).map(Mutex::new)) else {
        return;
    };
    let mut recording = recording.lock().unwrap_or_else(PoisonError::into_inner);
    if !recording.seen.insert((role, operation.to_owned())) {
        return;
    }
    if let Err(error) = writeln!(recording.file, "{} {operation}", role.as_str()) {
        tracing::warn!(%error, "could not record a DynamoDB operation");
    }
}

fn open(dir: &Path) -> Option<Recording> {
    let path = dir.join(format!("{}.operations", std::process::id()));
    let file = std::fs::create_dir_all(dir)
        .and_then(|()| File::options().create(true).append(true).open(&path));
    match file {
        Ok(file) => Some(Recording {
            seen: HashSet::new(),
            file,
        }),
        Err(error) => {
            tracing::warn!(%error, path = %path.display(), "cannot record DynamoDB operations");
            None
        }
    }
}
