//! Failures of the store itself.

use std::error::Error as StdError;
use std::fmt;

use super::{BucketWrite, ConditionFailure};
use crate::bucket::BucketState;

/// A boxed error from a store's underlying client.
#[cfg_attr(not(feature = "unstable-store"), allow(unreachable_pub))]
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// A failure of the store itself (as opposed to a condition that did not hold).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The table does not exist.
    #[error(
        "table `{table}` does not exist; create it with `sluice table create` or `DynamoStore::create_table`"
    )]
    TableNotFound {
        /// The table's name.
        table: String,
    },
    /// The store is throttling requests.
    #[error(
        "the store is throttling requests (provisioned throughput or request rate exceeded); retry later"
    )]
    Throttled {
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// A limit the whole table shares is throttling it, not the throughput of the rows
    /// written: a cold on-demand table beyond twice its previous peak, the per-table
    /// account quota, a configured on-demand maximum, provisioned capacity, or an index
    /// (DynamoDB's throttling reasons other than the table's key range). Spreading a
    /// bucket over more rows cannot help; waiting, warming the table or raising its limits
    /// does.
    #[error(
        "the table is throttled as a whole ({reasons}): not a hot row, so spreading the bucket cannot help; retry later, and warm the table or raise its limits (see docs/dynamodb.md, capacity planning)"
    )]
    TableThrottled {
        /// DynamoDB's throttling reasons and resources, as it gave them
        /// (`TableWriteAccountLimitExceeded on arn:…:table/sluice`).
        reasons: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The row is held by another writer's transaction in flight (DynamoDB's
    /// `TransactionConflictException`): the write did not apply; retry shortly.
    #[error(
        "another writer's transaction holds the row (transaction conflict); the write did not apply, retry shortly"
    )]
    TransactionConflict {
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The store did not answer in time.
    #[error("the store did not answer in time")]
    Timeout {
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// A row exists but cannot be read as a bucket or lease.
    #[error("row `{key}` is not a valid sluice row: {reason}")]
    CorruptRow {
        /// The row's key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A write conditioned on the exact row lost its answer, and the row no longer tells
    /// whether it applied (it tells while the write is among the row's
    /// `BucketState::recent_writes`). sluice then never assumes it applied where that
    /// could over-grant: a grant is not given; the tokens it took may be lost. (A change,
    /// which adds to the row, never tells: its lost answer stays the error that lost it.)
    #[error(
        "a write to `{dimension}` lost its answer and the bucket no longer tells whether it applied"
    )]
    OutcomeUnknown {
        /// The bucket's dimension.
        dimension: String,
    },
    /// The store could not be reached, so the request was never sent (the connection was
    /// refused): nothing it carried applied.
    #[error("the store could not be reached (nothing was sent): {message}")]
    Unreachable {
        /// What happened.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The connection to the store failed; a request it carried may have been sent.
    #[error("the store could not be reached: {message}")]
    Unavailable {
        /// What happened.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The store refused the request as one it cannot take (an invalid request, a missing
    /// permission): it did not apply, and asking again will not help.
    #[error("the store refused the request: {message}")]
    Rejected {
        /// What it said.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The store answered with an error.
    #[error("the store failed: {message}")]
    Service {
        /// What happened.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
}

impl StoreError {
    /// Whether retrying the same request later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Throttled { .. }
                | StoreError::TableThrottled { .. }
                | StoreError::TransactionConflict { .. }
                | StoreError::Timeout { .. }
                | StoreError::Unavailable { .. }
                | StoreError::Unreachable { .. }
                | StoreError::OutcomeUnknown { .. }
        )
    }

    /// Whether the store refused the call to pace its callers (throttling, or a row held
    /// by a transaction in flight): nothing applied, and the call is worth making again
    /// after a short, jittered wait.
    pub fn is_back_pressure(&self) -> bool {
        matches!(
            self,
            StoreError::Throttled { .. }
                | StoreError::TableThrottled { .. }
                | StoreError::TransactionConflict { .. }
        )
    }

    /// Whether the store failed a call in a way the `open` failure policy and shadow mode
    /// cover: it could not answer (no answer in time, unreachable, throttling, a row held
    /// by a transaction, failing). A missing table, a corrupt row or a lost write's unknown
    /// outcome are answers: they stand.
    pub(crate) fn cannot_answer(&self) -> bool {
        matches!(
            self,
            StoreError::Timeout { .. }
                | StoreError::Unavailable { .. }
                | StoreError::Unreachable { .. }
                | StoreError::Throttled { .. }
                | StoreError::TableThrottled { .. }
                | StoreError::TransactionConflict { .. }
                | StoreError::Service { .. }
        )
    }

    /// Whether a write that failed so may still have applied: its answer may have been
    /// lost (no answer in time, a connection lost after sending, a server error).
    pub(crate) fn answer_lost(&self) -> bool {
        matches!(
            self,
            StoreError::Timeout { .. }
                | StoreError::Unavailable { .. }
                | StoreError::Service { .. }
        )
    }

    /// Whether the call that failed so may have applied anyway: its answer was lost (no
    /// answer in time, a connection lost after sending, a server error) or the store could
    /// not tell ([`StoreError::OutcomeUnknown`]). An acquire that failed so may have taken
    /// its tokens without granting them (never the reverse); a release or an adjustment
    /// may have applied, once.
    ///
    /// ```
    /// use sluice::store::StoreError;
    ///
    /// let lost = StoreError::Timeout { source: None };
    /// assert!(lost.may_have_applied());
    /// let refused = StoreError::Unreachable { message: "connection refused".into(), source: None };
    /// assert!(!refused.may_have_applied());
    /// ```
    pub fn may_have_applied(&self) -> bool {
        self.answer_lost() || matches!(self, StoreError::OutcomeUnknown { .. })
    }
}

impl StoreError {
    /// A failure the store reported in words.
    pub(crate) fn service(message: impl Into<String>) -> StoreError {
        StoreError::Service {
            message: message.into(),
            source: None,
        }
    }

    /// A store that reports a condition failure the writes it was given cannot have is
    /// broken: a lease missing while creating it, one existing while deleting it.
    pub(crate) fn impossible(failure: &ConditionFailure) -> StoreError {
        StoreError::service(match failure {
            ConditionFailure::LeaseMissing(key) => {
                format!("store reported missing lease `{key}` while creating it")
            }
            ConditionFailure::LeaseExists(key) => {
                format!("store reported existing lease `{key}` while deleting it")
            }
            ConditionFailure::BucketChanged { dimension, .. } => {
                format!("store reported bucket `{dimension}` changed where no bucket was written")
            }
        })
    }

    /// `Ok` for a row that passes [`BucketState::validate`], else its
    /// [`invalid_bucket`](Self::invalid_bucket) error.
    pub(crate) fn check_row(state: &BucketState) -> Result<(), StoreError> {
        state
            .validate()
            .map_err(|e| StoreError::invalid_bucket(state.dimension.as_str(), &e))
    }

    /// `Ok` for a write whose row passes [`BucketWrite::validate`].
    pub(crate) fn check_write(w: &BucketWrite) -> Result<(), StoreError> {
        w.validate()
            .map_err(|e| StoreError::invalid_bucket(w.dimension().as_str(), &e))
    }

    /// A bucket row that fails [`BucketState::validate`], naming the attribute.
    pub(crate) fn invalid_bucket(key: &str, error: &crate::bucket::BucketError) -> StoreError {
        StoreError::CorruptRow {
            key: key.to_owned(),
            reason: format!("`{}`: {error}", error.attribute()),
        }
    }

    /// The same error for another waiter: same variant and fields, the underlying source
    /// kept as its message.
    pub(crate) fn clone_lossy(&self) -> StoreError {
        let source = |s: &Option<BoxError>| -> Option<BoxError> {
            s.as_ref()
                .map(|e| Box::new(Message(e.to_string())) as BoxError)
        };
        match self {
            StoreError::TableNotFound { table } => StoreError::TableNotFound {
                table: table.clone(),
            },
            StoreError::Throttled { source: s } => StoreError::Throttled { source: source(s) },
            StoreError::TableThrottled { reasons, source: s } => StoreError::TableThrottled {
                reasons: reasons.clone(),
                source: source(s),
            },
            StoreError::Timeout { source: s } => StoreError::Timeout { source: source(s) },
            StoreError::TransactionConflict { source: s } => {
                StoreError::TransactionConflict { source: source(s) }
            }
            StoreError::CorruptRow { key, reason } => StoreError::CorruptRow {
                key: key.clone(),
                reason: reason.clone(),
            },
            StoreError::OutcomeUnknown { dimension } => StoreError::OutcomeUnknown {
                dimension: dimension.clone(),
            },
            StoreError::Unreachable { message, source: s } => StoreError::Unreachable {
                message: message.clone(),
                source: source(s),
            },
            StoreError::Unavailable { message, source: s } => StoreError::Unavailable {
                message: message.clone(),
                source: source(s),
            },
            StoreError::Rejected { message, source: s } => StoreError::Rejected {
                message: message.clone(),
                source: source(s),
            },
            StoreError::Service { message, source: s } => StoreError::Service {
                message: message.clone(),
                source: source(s),
            },
        }
    }
}

/// An error carried as its message.
#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Message {}
