//! Telling DynamoDB's failures apart.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::{
    delete_item::DeleteItemError, put_item::PutItemError, update_item::UpdateItemError,
};
use aws_sdk_dynamodb::types::CancellationReason;

use super::row::Item;

use crate::store::StoreError;

/// A single-item write's error that may be its condition failing.
pub(super) trait ConditionFailed {
    /// When the write's condition failed: the item as it stood, if DynamoDB returned it.
    fn item(&self) -> Option<Option<&Item>>;
}

macro_rules! condition_failed {
    ($($error:ident),*) => {$(
        impl ConditionFailed for $error {
            fn item(&self) -> Option<Option<&Item>> {
                match self {
                    $error::ConditionalCheckFailedException(c) => Some(c.item()),
                    _ => None,
                }
            }
        }
    )*};
}

condition_failed!(PutItemError, UpdateItemError, DeleteItemError);

/// Error codes that mean "slow down".
const THROTTLING: [&str; 5] = [
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "ThrottlingError",
    "ProvisionedThroughputExceeded",
];

pub(crate) fn is_throttling(code: &str) -> bool {
    THROTTLING.contains(&code)
}

/// The throttling reasons of a throttled request, as `reason on resource` (empty if
/// DynamoDB gave none: an older endpoint, or a store that does not say).
fn throttling_reasons(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
    use aws_sdk_dynamodb::types::ThrottlingReason;
    use aws_sdk_dynamodb::types::error::{
        ProvisionedThroughputExceededException, RequestLimitExceeded, ThrottlingException,
    };
    let mut next = Some(err);
    while let Some(e) = next {
        let reasons: Option<&[ThrottlingReason]> =
            if let Some(t) = e.downcast_ref::<ProvisionedThroughputExceededException>() {
                Some(t.throttling_reasons())
            } else if let Some(t) = e.downcast_ref::<ThrottlingException>() {
                Some(t.throttling_reasons())
            } else if let Some(t) = e.downcast_ref::<RequestLimitExceeded>() {
                Some(t.throttling_reasons())
            } else {
                None
            };
        if let Some(reasons) = reasons {
            return reasons
                .iter()
                .map(|r| {
                    format!(
                        "{} on {}",
                        r.reason().unwrap_or("?"),
                        r.resource().unwrap_or("?")
                    )
                })
                .collect();
        }
        next = e.source();
    }
    Vec::new()
}

/// Whether a throttle is of a limit the whole table shares (its reasons, joined) rather
/// than of the key range of the rows written: DynamoDB said why, and no reason is the
/// table's key range. A throttle without reasons is taken as the rows' own (what it
/// usually is, and what every throttle was before DynamoDB gave reasons).
fn table_wide(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let reasons = throttling_reasons(err);
    let rows =
        |r: &String| r.starts_with("TableWriteKeyRange") || r.starts_with("TableReadKeyRange");
    if reasons.is_empty() || reasons.iter().any(rows) {
        return None;
    }
    Some(reasons.join(", "))
}

/// Whether DynamoDB refused a query because the index it names does not exist (or is still
/// being built).
pub(crate) fn is_missing_index<E, R>(err: &SdkError<E, R>) -> bool
where
    E: ProvideErrorMetadata,
{
    err.code() == Some("ValidationException")
        && err
            .message()
            .is_some_and(|m| m.contains("index") || m.contains("Index"))
}

/// Whether the connection was refused: the request was never sent.
fn refused(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// Maps any SDK failure that is not a condition of ours to a [`StoreError`].
pub(crate) fn store_error<E, R>(err: SdkError<E, R>, table: &str) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match &err {
        SdkError::TimeoutError(_) => StoreError::Timeout {
            source: Some(Box::new(err)),
        },
        SdkError::DispatchFailure(d) => {
            let message = if d.is_timeout() {
                return StoreError::Timeout {
                    source: Some(Box::new(err)),
                };
            } else if refused(&err) {
                return StoreError::Unreachable {
                    message: "connection refused".to_owned(),
                    source: Some(Box::new(err)),
                };
            } else if d.is_io() {
                "connection failed".to_owned()
            } else {
                "request could not be sent".to_owned()
            };
            StoreError::Unavailable {
                message,
                source: Some(Box::new(err)),
            }
        }
        _ => {
            let code = err.code().unwrap_or_default().to_owned();
            let message = match err.message() {
                Some(m) if !m.is_empty() => format!("{code}: {m}"),
                _ => code.clone(),
            };
            match code.as_str() {
                "ResourceNotFoundException" => StoreError::TableNotFound {
                    table: table.to_owned(),
                },
                c if is_throttling(c) => match table_wide(&err) {
                    Some(reasons) => StoreError::TableThrottled {
                        reasons,
                        source: Some(Box::new(err)),
                    },
                    None => StoreError::Throttled {
                        source: Some(Box::new(err)),
                    },
                },
                "TransactionConflictException" => StoreError::TransactionConflict {
                    source: Some(Box::new(err)),
                },
                // Refused before anything applied.
                "ValidationException"
                | "AccessDeniedException"
                | "UnrecognizedClientException"
                | "SerializationException" => StoreError::Rejected {
                    message,
                    source: Some(Box::new(err)),
                },
                "" => StoreError::Service {
                    message: "DynamoDB request failed".to_owned(),
                    source: Some(Box::new(err)),
                },
                _ => StoreError::Service {
                    message,
                    source: Some(Box::new(err)),
                },
            }
        }
    }
}

/// What a cancelled transaction's per-item reasons (in request order) say, by priority:
/// a failed condition, then a conflict, then throttling, then anything else.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Cancelled {
    /// The condition of the item at this index failed.
    Condition(usize),
    /// Another transaction was touching one of the items.
    Conflict,
    /// DynamoDB throttled the transaction.
    Throttled,
    /// Some other reason.
    Other(String),
}

pub(crate) fn cancelled(reasons: &[CancellationReason]) -> Cancelled {
    let code = |r: &CancellationReason| r.code().unwrap_or("None").to_owned();
    if let Some(i) = reasons
        .iter()
        .position(|r| code(r) == "ConditionalCheckFailed")
    {
        return Cancelled::Condition(i);
    }
    if reasons.iter().any(|r| code(r) == "TransactionConflict") {
        return Cancelled::Conflict;
    }
    if reasons.iter().any(|r| is_throttling(&code(r))) {
        return Cancelled::Throttled;
    }
    let others: Vec<String> = reasons
        .iter()
        .filter(|r| code(r) != "None")
        .map(|r| match r.message() {
            Some(m) => format!("{}: {m}", code(r)),
            None => code(r),
        })
        .collect();
    Cancelled::Other(others.join("; "))
}

pub(super) fn build_error(e: aws_sdk_dynamodb::error::BuildError) -> StoreError {
    StoreError::Service {
        message: format!("could not build the DynamoDB request: {e}"),
        source: Some(Box::new(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(code: &str) -> CancellationReason {
        CancellationReason::builder().code(code).build()
    }

    #[test]
    fn cancellation_reasons_are_read_per_item_in_request_order() {
        assert_eq!(
            cancelled(&[
                reason("None"),
                reason("ConditionalCheckFailed"),
                reason("None")
            ]),
            Cancelled::Condition(1)
        );
        assert_eq!(
            cancelled(&[reason("TransactionConflict"), reason("None")]),
            Cancelled::Conflict
        );
        assert_eq!(
            cancelled(&[
                reason("TransactionConflict"),
                reason("ConditionalCheckFailed")
            ]),
            Cancelled::Condition(1),
            "a failed condition is decisive: retrying the same write cannot succeed"
        );
        assert_eq!(
            cancelled(&[reason("ThrottlingError")]),
            Cancelled::Throttled
        );
        assert_eq!(
            cancelled(&[reason("None"), reason("ValidationError")]),
            Cancelled::Other("ValidationError".to_owned())
        );
    }
}
