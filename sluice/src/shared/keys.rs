//! What a client knows of keyed buckets: their templates.

use std::time::Duration;

use super::Core;
use crate::bucket::BucketState;
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::store::StoreError;

/// How long a client writes new keys' rows from a template it read before it reads the
/// template again: a redefinition (or removal) of a keyed bucket reaches every client's
/// new keys within this time. A key's row already written keeps the definition it has.
pub(crate) const TEMPLATE_FRESH: Duration = Duration::from_secs(60);

impl Core {
    /// The keyed bucket that `key` (a key's dimension) is a bucket of, as this client knows
    /// it: remembered within [`TEMPLATE_FRESH`] of `now`, else read (and remembered).
    /// `None` when there is no bucket of that name, or one that is not keyed.
    pub(crate) async fn template(
        &self,
        key: &Dimension,
        now: UnixMillis,
    ) -> Result<Option<BucketState>, StoreError> {
        let name = key.template();
        let lane = self.lane(&name);
        let known = {
            let memory = lane.memory();
            memory
                .row()
                .filter(|_| now.saturating_since(memory.learned_at()) < TEMPLATE_FRESH)
                .cloned()
        };
        let row = match known {
            Some(row) => Some(row),
            None => self.read_into(&lane, &name).await?,
        };
        Ok(row.filter(|r| r.bucket.is_keyed()))
    }
}
