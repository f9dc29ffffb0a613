//! Spreading a bucket over more rows, or gathering it into fewer: every row of the bucket
//! read at once, the rows of the new count computed from them
//! ([`bucket::shards::reshard`](crate::bucket::shards)), and all of them replaced in one
//! conditional transaction, read again and computed again when another writer moved a
//! row in between.

use std::sync::Arc;
use std::time::Duration;

use crate::bucket::{BucketState, ShardError};
use crate::dimension::Dimension;
use crate::error::Error;
use crate::retry::Budget;
use crate::shared::Core;
use crate::store::StoreError;

use super::lost_race;

/// How many times a spread the store throttled (its reads or its transaction) is read and
/// sent again before it is given up. A spread over a hot bucket's rows writes all of them
/// in one transaction, which passes only when each of their partitions has room at that
/// moment: at the ceiling a partition has room a fraction of the time. Through
/// dynamodb-fidelity, a bucket over eight rows on a table of twenty partitions (demand 2.4
/// times what its partitions serve) saw 94 spreads given up in ten seconds, each after its
/// first throttle, before one passed; sent again soon, the first passed 2.8 s after the
/// first was decided. Throttled requests are not billed; each attempt reads the rows again
/// (a read unit each).
pub(crate) const SPREAD_THROTTLED: u32 = 16;

/// The pause before a throttled spread is sent again: a random half to all of it, so that
/// the attempts fall at different moments of the partitions' refill.
const SPREAD_PAUSE: Duration = Duration::from_millis(40);

/// The throttles a reshard met so far.
#[derive(Debug, Default)]
struct Throttled(u32);

impl Throttled {
    /// After throttle `e`: a pause of a random half to all of [`SPREAD_PAUSE`] before a
    /// spread (`spreading`) is read and sent again, within [`SPREAD_THROTTLED`]; else `e`.
    async fn again(&mut self, e: StoreError, spreading: bool) -> Result<(), Error> {
        if !spreading || self.0 >= SPREAD_THROTTLED {
            return Err(e.into());
        }
        self.0 += 1;
        let jitter = rand::random_range(0..=SPREAD_PAUSE.as_millis() as u64);
        tokio::time::sleep(SPREAD_PAUSE / 2 + Duration::from_millis(jitter / 2)).await;
        Ok(())
    }
}

/// What this client learns of a reshard that landed, from the rows it read and the rows
/// it wrote (`next`, given the write ids they keep).
fn learn_resharded(
    core: &Core,
    rows: &[BucketState],
    next: &mut [BucketState],
    moves: &[Option<crate::bucket::Commute>],
    now: crate::clock::UnixMillis,
) {
    for (k, row) in next.iter_mut().enumerate() {
        // A moved row keeps the write id it had (a move is a commuting change).
        if let (Some(Some(_)), Some(old)) = (moves.get(k), rows.get(k)) {
            row.write_id = old.write_id;
            row.recent_writes = old.recent_writes.clone();
        }
        core.lanes.learn_written(row.clone(), now);
    }
    for gone in rows.iter().skip(next.len()) {
        core.lanes.forget(&gone.dimension);
    }
}

/// A key's row that is not there (never written, or removed when idle), as its bucket is:
/// its template's, full now. `None`: not a key's own row, or no keyed bucket for it.
pub(crate) async fn unwritten_key(
    core: &Core,
    dimension: &Dimension,
) -> Result<Option<BucketState>, Error> {
    if dimension.key().is_none() || dimension.shard_index() != 0 {
        return Ok(None);
    }
    let now = core.now();
    Ok(core
        .template(dimension, now)
        .await?
        .map(|t| BucketState::full(dimension.clone(), t.bucket.for_key(), now)))
}

/// The rows of `dimension`'s bucket as they are now (see [`rows_of`]), and whether they
/// are stored: a key with no row yet is its template's bucket, full (what its first
/// acquire finds), and `false`.
pub(crate) async fn rows_or_unwritten(
    core: &Core,
    dimension: &Dimension,
) -> Result<(Vec<BucketState>, bool), Error> {
    match rows_of(core, dimension).await {
        Err(Error::UnknownDimension { .. }) if dimension.key().is_some() => {
            match unwritten_key(core, dimension).await? {
                Some(row) => Ok((vec![row], false)),
                None => Err(core.unknown(dimension)),
            }
        }
        rows => Ok((rows?, true)),
    }
}

/// Every row of `base`'s bucket as stored now, shard 0 first: one read of its own row,
/// then one of the other shards it counts.
pub(crate) async fn rows_of(core: &Core, base: &Dimension) -> Result<Vec<BucketState>, Error> {
    let first = core
        .read_existing(std::slice::from_ref(base))
        .await?
        .remove(0);
    if first.shards <= 1 {
        return Ok(vec![first]);
    }
    let others: Vec<Dimension> = (1..first.shards).map(|k| base.shard(k)).collect();
    let mut rows = vec![first];
    for (row, d) in core
        .store
        .read_buckets(&others)
        .await?
        .into_iter()
        .zip(&others)
    {
        match row {
            Some(row) => rows.push(row),
            None => {
                return Err(ShardError::Inconsistent(d.base(), "a shard's row is missing").into());
            }
        }
    }
    Ok(rows)
}

/// Spreads `base`'s bucket over `to` rows (gathers it, when fewer): the rows as they stand
/// once it is done.
pub(crate) async fn reshard(
    core: &Arc<Core>,
    base: &Dimension,
    to: u16,
) -> Result<Vec<BucketState>, Error> {
    reshard_from(core, base, None, to).await
}

/// [`reshard`], only while the bucket has `from` rows (when given): a client that decided
/// from what it saw of `from` rows leaves a bucket another client resharded since. With
/// `from` given (a client's own decision, not an operator's), a gather into fewer rows is
/// sent once: one that lost its race answers [`Error::Contention`] rather than retrying.
pub(crate) async fn reshard_from(
    core: &Arc<Core>,
    base: &Dimension,
    from: Option<u16>,
    to: u16,
) -> Result<Vec<BucketState>, Error> {
    let mut budget = Budget::new(core.config.max_retries);
    let mut throttled = Throttled::default();
    // A client's own spread (past the check below, the rows are the `from` it decided on).
    let spreading = from.is_some_and(|from| to > from);
    loop {
        let rows = match rows_of(core, base).await {
            Ok(rows) => rows,
            // The rows' reads, throttled on their busy partitions too.
            Err(Error::Store(e @ StoreError::Throttled { .. })) => {
                throttled.again(e, spreading).await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        if let Some(limit) = rows[0].bucket.shard_limit().filter(|l| !l.allows(to)) {
            return Err(ShardError::Limited {
                dimension: base.clone(),
                shards: to,
                limit,
            }
            .into());
        }
        let now_at = rows.len();
        if usize::from(to) == now_at || from.is_some_and(|f| usize::from(f) != now_at) {
            return Ok(rows);
        }
        // As of this client's clock; a row refilled later (a fill stamped ahead) counts what
        // it holds, and the new rows refill nothing until then (see `shards::reshard`).
        let now = core.now();
        let mut next = crate::bucket::shards::reshard(&rows, to, now)?;
        // The ceiling this client learned from the store's throttles goes on every row,
        // so that clients that never met them measure the rows against it too.
        if let Some(learned) = core.heat.learned(base) {
            for row in &mut next {
                row.write_ceiling = Some(row.write_ceiling.map_or(learned, |c| c.max(learned)));
            }
        }
        // Rows that stay are moved by what they give or take, not conditioned on being as
        // read: a hot bucket's rows change between any read and any write. A spread this
        // client decided on is of a row it measured hot: a full one is moved as after a lost
        // race from the first attempt (its exact move fails on the next grant's refill,
        // costing the spread a round of reads and a cancelled transaction).
        let raced = spreading || budget.lost() > 0;
        let moves = crate::bucket::shards::moves(&rows, &next, now, raced);
        let applied = match core.store.respread_buckets(&rows, &next, &moves).await {
            Ok(applied) => applied,
            // A spread writes the rows it relieves, which the store throttles as it does
            // the takes racing them: the transaction passes only at a moment when every
            // partition it writes has room, which on busy rows is rare, so it is read and
            // sent again soon, up to `SPREAD_THROTTLED` times (given up, the rows stay
            // throttled until a client decides again to spread them).
            Err(e @ StoreError::Throttled { .. }) if spreading => {
                throttled.again(e, true).await?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if applied {
            tracing::info!(dimension = %base, from = rows.len(), to, "bucket resharded");
            learn_resharded(core, &rows, &mut next, &moves, now);
            return Ok(next);
        }
        // A client's own gather that lost its race is not asked again: the rows it would
        // remove are being written (by takes, or by another client's reshard), and will be
        // again at once; the client's next gather waits longer (see `Heat::cool`).
        if from.is_some() && usize::from(to) < now_at {
            return Err(Error::Contention {
                dimension: base.clone(),
                attempts: 1,
            });
        }
        lost_race(&mut budget, base).await?;
    }
}

/// Reshards `base`'s bucket from `n` rows to `to` in a task of its own, which owns the
/// bucket's reshard claim (taken by the caller: one such task per bucket and client) and
/// gives it up however the task ends: never in a caller's future, so a caller dropped
/// meanwhile loses nothing and leaves no claim set.
pub(crate) fn in_background(core: &Arc<Core>, base: &Dimension, n: u16, to: u16) {
    let (core, base) = (core.clone(), base.clone());
    tokio::spawn(async move {
        // Given up if the task ends early (its runtime shutting down): no claim is left set.
        let mut claim = Claimed {
            core: &core,
            base: &base,
            failed_gather: to < n,
        };
        let done = reshard_from(&core, &base, Some(n), to).await;
        match &done {
            Ok(rows) => {
                core.lanes
                    .note_shards(&base, u16::try_from(rows.len()).unwrap_or(1));
                crate::metrics::resharded(&core.lanes.labels, base.as_str(), rows.len());
            }
            Err(e) => tracing::warn!(dimension = %base, error = %e, "resharding a bucket failed"),
        }
        claim.failed_gather = to < n && done.is_err();
    });
}

/// A bucket's reshard claim, given up when dropped.
struct Claimed<'a> {
    core: &'a Core,
    base: &'a Dimension,
    /// Whether it ends a gather that failed (the next one waits longer).
    failed_gather: bool,
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        self.core
            .heat
            .done(self.base, self.core.now(), self.failed_gather);
    }
}
