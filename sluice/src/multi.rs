//! Several dimensions on the fast path: one single-item conditional write per bucket, no
//! transaction.
//!
//! An acquire on `openai#rpm` and `openai#tpm` takes each dimension through its own lane
//! (see [`fast`](crate::fast)), one after the other: each take is the conditional write of
//! that one bucket row, carrying its lease in the row, batched with whatever else this
//! client is writing to that row. When a later dimension is short, the dimensions already
//! taken are given back at once, each exactly once (the give-back removes the lease it
//! created, on condition that it is still there), and then the caller gets the RetryIn:
//! all or nothing as the caller sees it, and never more than the buckets hold. An acquire
//! dropped half-way gives back what it took in the background.
//!
//! The price is a brief hold: between its take and its give-back (one write), a dimension
//! taken for a request that is then refused shows other clients fewer tokens than it will
//! have. The order keeps it rare: the dimensions this client last saw short are taken
//! first (at the limit, the bottleneck refuses before anything was taken), then the others
//! in name order, the same order for every client.

use std::time::Duration;

use crate::acquire::Wanted;
use crate::bucket::Take;
use crate::client::Sluice;
use crate::clock::UnixMillis;
use crate::error::Error;
use crate::lease::{Lease, LeaseId, LeasePart};
use crate::remembered::Recall;

/// Parts taken for a request not yet granted whole: given back if it never is, also when
/// the caller drops the acquire half-way.
struct Holding {
    client: Sluice,
    parts: Vec<LeasePart>,
    expires_at: UnixMillis,
}

impl Holding {
    fn take(&mut self) -> Vec<LeasePart> {
        std::mem::take(&mut self.parts)
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let parts = self.take();
        if parts.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let client = self.client.clone();
                let expires_at = self.expires_at;
                handle.spawn(async move { client.give_back_parts(parts, expires_at).await });
            }
            Err(_) => tracing::warn!(
                "an acquire dropped outside a tokio runtime held tokens; its leases expire and are reconciled"
            ),
        }
    }
}

impl Sluice {
    /// An acquire on several dimensions on the fast path.
    pub(crate) async fn acquire_many_fast(
        &self,
        wanted: Vec<Wanted>,
        ttl: Duration,
        fresh_after: Option<UnixMillis>,
    ) -> Result<Lease, Error> {
        let now = self.now();
        // Denials memory may answer for the whole request, with no call.
        let recalled: Vec<Recall> = wanted
            .iter()
            .map(|w| {
                self.lanes()
                    .lane(&w.dimension)
                    .memory()
                    .recall(w, now, fresh_after)
            })
            .collect();
        let denied = recalled
            .iter()
            .filter_map(|r| match r {
                Recall::Denied(wait) => Some(*wait),
                _ => None,
            })
            .max();
        if let Some(wait) = denied {
            return Err(self.refused(&wanted, &[], now, wait));
        }
        // The dimensions last seen short first, then the others in name order.
        let mut order: Vec<usize> = (0..wanted.len()).collect();
        order.sort_by_cached_key(|&i| {
            let w = &wanted[i];
            let short = self
                .lanes()
                .lane(&w.dimension)
                .memory()
                .row()
                .is_some_and(|row| {
                    !matches!(
                        row.take(w.cost(row.bucket.cost_per_call()), now),
                        Take::Granted { .. }
                    )
                });
            (!short, w.dimension.clone())
        });
        let mut holding = Holding {
            client: self.clone(),
            parts: Vec::with_capacity(wanted.len()),
            expires_at: now.saturating_add(ttl),
        };
        let mut taken: Vec<Option<LeasePart>> = vec![None; wanted.len()];
        let mut attempts = 0;
        let mut created_at = now;
        let mut expires_at = None;
        for i in order {
            match self
                .acquire_fast(wanted[i].clone(), ttl, fresh_after, false)
                .await
            {
                Ok(lease) => {
                    attempts += lease.attempts;
                    created_at = created_at.max(lease.created_at);
                    expires_at = Some(
                        expires_at
                            .map_or(lease.expires_at, |e: UnixMillis| e.min(lease.expires_at)),
                    );
                    let parts = lease.into_parts();
                    holding.parts.extend(parts.iter().cloned());
                    taken[i] = parts.into_iter().next();
                }
                Err(error) => {
                    // Give back what this request took (riding on the lanes' writes) before
                    // answering: when the caller sees the refusal, nothing is held.
                    let parts = holding.take();
                    if !parts.is_empty() {
                        // It finishes even if the caller goes away meanwhile.
                        let (client, expires_at) = (self.clone(), holding.expires_at);
                        crate::detach::Detached::new(async move {
                            client.give_back_parts(parts, expires_at).await;
                        })
                        .await;
                    }
                    return Err(match error {
                        Error::RetryIn(wait) => {
                            let took: Vec<bool> = taken.iter().map(Option::is_some).collect();
                            self.refused(&wanted, &took, self.now(), wait)
                        }
                        other => other,
                    });
                }
            }
        }
        holding.take();
        let parts: Vec<LeasePart> = taken.into_iter().flatten().collect();
        let id = LeaseId::new(parts.iter().map(|p| p.key.clone()).collect());
        Ok(Lease {
            client: self.clone(),
            id,
            parts,
            created_at,
            expires_at: expires_at.unwrap_or(holding.expires_at),
            attempts,
        })
    }

    /// The RetryIn of a several-dimension request refused for `wait` on one dimension: the
    /// longest of it and of the waits memory may answer on the others, except those this
    /// request took (`took`; they are being given back). The caller may be back when it
    /// runs out, asking every dimension again: each remembers that.
    fn refused(&self, wanted: &[Wanted], took: &[bool], now: UnixMillis, wait: Duration) -> Error {
        let mut longest = wait;
        for (i, w) in wanted.iter().enumerate() {
            if took.get(i).copied().unwrap_or(false) {
                continue;
            }
            let lane = self.lanes().lane(&w.dimension);
            if let Recall::Denied(other) = lane.memory().recall(w, now, None) {
                longest = longest.max(other);
            }
        }
        for w in wanted {
            self.lanes()
                .lane(&w.dimension)
                .memory()
                .answered(now.saturating_add(longest));
        }
        Error::RetryIn(longest)
    }

    /// Gives parts of a grant nobody will use back to their buckets through their lanes,
    /// whatever their limit type, each exactly once (see
    /// [`release_parts`](Self::release_parts)).
    pub(crate) async fn give_back_parts(&self, mut parts: Vec<LeasePart>, expires_at: UnixMillis) {
        for part in &mut parts {
            part.restores = true;
        }
        if let Err(error) = self.release_parts(parts, expires_at).await {
            tracing::warn!(%error, "giving back tokens a refused acquire took failed; its leases expire and are reconciled");
        }
    }
}
