//! Leases: the tokens an acquire holds until it is released or expires.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::str::FromStr;
use std::time::Duration;

use futures::FutureExt as _;

use crate::client::Sluice;
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::store::LeaseKey;
use crate::tokens::Tokens;

/// Identifies a lease across processes: the keys of its lease rows.
///
/// Its text form (`Display`/`FromStr`) is the comma-separated row keys, e.g.
/// `lease#openai#rpm#4f1c…,lease#openai#tpm#4f1c…`, so a lease taken in one process can be
/// released in another with [`Sluice::release_id`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseId {
    keys: Vec<LeaseKey>,
}

impl LeaseId {
    pub(crate) fn new(keys: Vec<LeaseKey>) -> Self {
        LeaseId { keys }
    }

    /// The lease's row keys, one per dimension.
    pub fn keys(&self) -> &[LeaseKey] {
        &self.keys
    }

    /// The unique suffix shared by the lease's rows.
    pub fn unique(&self) -> &str {
        self.keys.first().map_or("", LeaseKey::unique)
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, k) in self.keys.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(k.as_str())?;
        }
        Ok(())
    }
}

/// A string that is not a lease id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a lease id; expected comma-separated `lease#{{vendor}}#{{metric}}#{{unique}}` keys"
)]
pub struct LeaseIdError(pub String);

impl FromStr for LeaseId {
    type Err = LeaseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let keys = s
            .split(',')
            .map(|k| LeaseKey::parse(k.trim()))
            .collect::<Option<Vec<_>>>()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| LeaseIdError(s.to_owned()))?;
        Ok(LeaseId { keys })
    }
}

/// One dimension's share of a lease.
#[derive(Debug, Clone)]
pub(crate) struct LeasePart {
    pub(crate) key: LeaseKey,
    pub(crate) dimension: Dimension,
    pub(crate) cost: Tokens,
    /// Whether release gives the cost back (`concurrent` buckets).
    pub(crate) restores: bool,
    /// Where the lease is kept.
    pub(crate) kept: Kept,
}

/// Where a lease part is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kept {
    /// Nowhere: a lean bucket's grant, or one from prefetched tokens (nothing to release).
    Nowhere,
    /// In a lease row of its own.
    Row,
    /// In its bucket's row ([`BucketState::held`](crate::BucketState::held)).
    InBucket,
}

impl Kept {
    /// Where the lease `record` describes is kept.
    pub(crate) fn of(record: &crate::store::LeaseRecord) -> Kept {
        if record.in_bucket {
            Kept::InBucket
        } else {
            Kept::Row
        }
    }
}

impl LeasePart {
    /// Whether there is a lease to end.
    pub(crate) fn is_kept(&self) -> bool {
        self.kept != Kept::Nowhere
    }
}

/// Tokens held on one or several dimensions, granted by [`Sluice::acquire`].
///
/// Release it when the vendor call is done ([`release`](Lease::release)); for `requests`
/// and `tokens` buckets the tokens stay consumed, for `concurrent` buckets they come
/// back. A lease dropped without release is released in the background when a tokio
/// runtime is available; otherwise it expires at [`expires_at`](Lease::expires_at) and the
/// reconciler cleans it up. [`Sluice::slot`] does all of this for you.
#[must_use = "a lease holds quota until it is released or expires"]
pub struct Lease {
    pub(crate) client: Sluice,
    pub(crate) id: LeaseId,
    pub(crate) parts: Vec<LeasePart>,
    pub(crate) created_at: UnixMillis,
    pub(crate) expires_at: UnixMillis,
    pub(crate) attempts: u32,
}

impl Lease {
    /// The lease's id.
    pub fn id(&self) -> &LeaseId {
        &self.id
    }

    /// When the lease was granted.
    pub fn created_at(&self) -> UnixMillis {
        self.created_at
    }

    /// When the lease expires unless released.
    pub fn expires_at(&self) -> UnixMillis {
        self.expires_at
    }

    /// Time left before the lease expires, by the client's clock.
    pub fn remaining(&self) -> Duration {
        self.expires_at.saturating_since(self.client.now())
    }

    /// The dimensions the lease holds tokens on.
    pub fn dimensions(&self) -> impl Iterator<Item = &Dimension> {
        self.parts.iter().map(|p| &p.dimension)
    }

    /// The tokens held on `dimension`, if the lease covers it.
    pub fn cost(&self, dimension: &str) -> Option<Tokens> {
        self.parts
            .iter()
            .find(|p| p.dimension.as_str() == dimension)
            .map(|p| p.cost)
    }

    /// How many commits the acquire attempted (1 when there was no contention; 0 for a
    /// grant from tokens this client prefetched, see [`Prefetch`](crate::Prefetch)).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Ends the lease: deletes its rows and, for `concurrent` buckets, gives the tokens back.
    ///
    /// Releasing a lease that has already expired and been reconciled changes nothing.
    ///
    /// A release whose caller stops waiting (a timeout around it, a cancelled request)
    /// still happens: it finishes on its own.
    pub async fn release(mut self) -> Result<(), Error> {
        let parts = self.take_rows();
        if parts.is_empty() {
            return Ok(());
        }
        let (sent, outcome) = tokio::sync::oneshot::channel();
        let (client, expires_at) = (self.client.clone(), self.expires_at);
        crate::detach::Detached::new(async move {
            let result = client.release_parts(parts, expires_at).await;
            if let Err(Err(error)) = sent.send(result) {
                tracing::warn!(%error, "a release nobody waited for failed; the lease will expire and be reconciled");
            }
        })
        .await;
        outcome.await.unwrap_or_else(|_| {
            Err(crate::store::StoreError::service("the release was abandoned").into())
        })
    }

    /// Runs `body` under this lease, then releases it: the lease's slot.
    ///
    /// `timeout` is the body's deadline (give the lease the same TTL when acquiring): a body
    /// still running then is dropped and the result is [`Error::Timeout`]. The lease is
    /// released on every path: when the body finishes, when it times out, when it panics
    /// (the panic then continues), and when this future is dropped (released in the
    /// background).
    pub async fn run<F>(self, timeout: Duration, body: F) -> Result<F::Output, Error>
    where
        F: Future,
    {
        let outcome = tokio::time::timeout(timeout, AssertUnwindSafe(body).catch_unwind()).await;
        let release = self.release().await;
        let value = match outcome {
            Err(_elapsed) => {
                if let Err(error) = release {
                    tracing::warn!(%error, "release after timeout failed; the lease will expire and be reconciled");
                }
                return Err(Error::Timeout(timeout));
            }
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Ok(Ok(value)) => value,
        };
        if let Err(error) = release {
            // The body's work is done and must not be lost; the lease will expire.
            tracing::warn!(%error, "release after the slot's body failed; the lease will expire and be reconciled");
        }
        Ok(value)
    }

    /// Corrects the cost held on `dimension` to `actual` (e.g. 500 tokens estimated, 2,000
    /// used). The difference is charged to the bucket now, which may go negative (debt,
    /// repaid by refill); a lower cost refunds the difference, capped at capacity.
    pub async fn adjust(
        &mut self,
        dimension: &str,
        actual: impl Into<Tokens>,
    ) -> Result<(), Error> {
        let actual = actual.into();
        let part = self
            .parts
            .iter_mut()
            .find(|p| p.dimension.as_str() == dimension)
            .ok_or_else(|| {
                Error::LeaseNotFound(format!("{} (no part on `{dimension}`)", self.id))
            })?;
        if actual.is_negative() || actual > Tokens::MAX {
            return Err(Error::InvalidCost {
                dimension: part.dimension.clone(),
                cost: actual,
            });
        }
        self.client.adjust_part(part, actual).await?;
        part.cost = actual;
        Ok(())
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.id.to_string())
            .field("expires_at", &self.expires_at)
            .field("released", &self.parts.is_empty())
            .finish()
    }
}

impl Lease {
    /// Takes every part out (the lease then ends nothing when dropped).
    pub(crate) fn into_parts(mut self) -> Vec<LeasePart> {
        std::mem::take(&mut self.parts)
    }

    /// Takes the parts that have leases to end; lean parts need nothing.
    pub(crate) fn take_rows(&mut self) -> Vec<LeasePart> {
        let mut parts = std::mem::take(&mut self.parts);
        parts.retain(LeasePart::is_kept);
        parts
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let parts = self.take_rows();
        if parts.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let client = self.client.clone();
                let id = self.id.to_string();
                let expires_at = self.expires_at;
                tracing::debug!(lease = %id, "lease dropped without release; releasing in the background");
                handle.spawn(async move {
                    if let Err(error) = client.release_parts(parts, expires_at).await {
                        tracing::warn!(lease = %id, %error, "background release failed; the lease will expire and be reconciled");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(
                    lease = %self.id,
                    expires_at = %self.expires_at,
                    "lease dropped outside a tokio runtime; it will expire and be reconciled"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_round_trip_through_text() {
        let a = Dimension::new("openai#rpm").unwrap();
        let b = Dimension::new("openai#tpm").unwrap();
        let id = LeaseId::new(vec![LeaseKey::new(&a, "abc"), LeaseKey::new(&b, "abc")]);
        let text = id.to_string();
        assert_eq!(text, "lease#openai#rpm#abc,lease#openai#tpm#abc");
        assert_eq!(text.parse::<LeaseId>().unwrap(), id);
        assert_eq!(id.unique(), "abc");
        assert!("openai#rpm".parse::<LeaseId>().is_err());
        assert!("".parse::<LeaseId>().is_err());
    }
}
