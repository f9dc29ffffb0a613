//! Administering buckets: what an operator, the CLI and the reconciler ask of the table
//! beside acquiring: a bucket's [`Snapshot`], a dry run ([`Peek`]), a vendor's report
//! ([`Tighten`]), a reset of a bucket's tokens ([`Restock`]) and the reconciler's
//! [`ReconcileReport`].
//!
//! ```
//! use sluice::admin::Snapshot;
//! use sluice::{Bucket, RefillRate, Sluice};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let sluice = Sluice::in_memory();
//! sluice.put_bucket("openai#rpm", Bucket::requests(RefillRate::per_minute(500))).await?;
//! let snapshot: Snapshot = sluice.snapshot("openai#rpm").await?;
//! assert_eq!(snapshot.capacity, 500.into());
//! # Ok::<(), sluice::Error>(()) }).unwrap();
//! ```

pub use crate::protocol::peek::Peek;
pub use crate::protocol::reconcile::{ReconcileError, ReconcileReport};
pub use crate::protocol::restock::{Audit, Restock, Restocked};
pub use crate::protocol::tighten::Tighten;
pub use crate::snapshot::Snapshot;
