//! Keyed buckets: one definition (a template) serving a bucket per key.

use super::Bucket;

impl Bucket {
    /// This definition as a template: a bucket for every key (a tenant, a user, an API
    /// key), each acquired on the key's own dimension (`ingest#rpm#@tenant-42`, see
    /// [`Dimension::with_key`](crate::Dimension::with_key)). A key's row is created by its
    /// first acquire, from the template, in the same write; the template's own dimension
    /// is no bucket to acquire on.
    ///
    /// ```
    /// use sluice::{Bucket, RefillRate};
    ///
    /// let per_tenant = Bucket::requests(RefillRate::per_second(50)).keyed();
    /// assert!(per_tenant.is_keyed());
    /// ```
    pub fn keyed(mut self) -> Self {
        self.keyed = true;
        self
    }

    /// Whether this definition is a template for a bucket per key (see [`keyed`](Self::keyed)).
    pub fn is_keyed(&self) -> bool {
        self.keyed
    }

    /// Whether this is a key's own definition, put for that key over its template's (a
    /// bigger customer): kept when the key is idle, and whatever the template becomes.
    pub fn is_override(&self) -> bool {
        self.overrides
    }

    /// This definition as a key's own, over its template's (see
    /// [`is_override`](Self::is_override)): what a bucket put on a key's dimension is.
    pub(crate) fn overriding(self) -> Bucket {
        Bucket {
            keyed: false,
            overrides: true,
            ..self
        }
    }

    /// The definition of one key's bucket under this template: the same, not keyed.
    pub(crate) fn for_key(&self) -> Bucket {
        Bucket {
            keyed: false,
            overrides: false,
            ..self.clone()
        }
    }
}

impl super::BucketState {
    /// The row a client writes a key's first acquire from when it has never seen the key's
    /// row (`dimension`, under `template`): the key's bucket, full at `now`, as a row whose
    /// last write took a call's cost just long enough ago to be full again. A fill computed
    /// from it is conditioned on a row so (an idle key's, full again since its last call)
    /// and, the write creating the row when there is none (see
    /// [`BucketChange::creates`](crate::store::BucketChange::creates)), holds for no row
    /// at all. Any other row fails it, and the write is computed again from that row.
    pub(crate) fn unwritten_key(
        dimension: crate::dimension::Dimension,
        template: &Bucket,
        now: crate::clock::UnixMillis,
    ) -> Self {
        use crate::tokens::Tokens;
        let full = Self::full(dimension, template.for_key(), now);
        let cost = full.bucket.cost_per_call().min(full.holds());
        let per_second = full
            .bucket
            .effective_rate()
            .refill_over(std::time::Duration::from_secs(1));
        if cost <= Tokens::ZERO || per_second <= Tokens::ZERO {
            return full;
        }
        // The refill of `cost`, rounded up, and a millisecond more.
        let per_second = per_second.as_nanos();
        let millis = (cost.as_nanos().saturating_mul(1_000) + per_second - 1) / per_second + 1;
        let Some(then) = i64::try_from(millis)
            .ok()
            .and_then(|m| now.as_millis().checked_sub(m))
        else {
            return full;
        };
        let mut row = full.clone();
        row.tokens = full.tokens - cost;
        row.last_refill_at = crate::clock::UnixMillis::new(then);
        if row.available(now) < full.holds() {
            return full;
        }
        row
    }
}
