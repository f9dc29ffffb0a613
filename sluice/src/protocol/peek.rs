//! Whether an acquire would be granted now, without taking anything (see
//! [`Sluice::peek`](crate::Sluice::peek)).

use std::time::Duration;

use crate::acquire::Wanted;
use crate::bucket::{BucketState, Take};
use crate::clock::UnixMillis;
use crate::config::Protocol;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::shared::Core;
use crate::shared::remembered::{Recall, retry_in};

use super::{reshard, sharded};

/// What an acquire would get now, as [`Sluice::peek`](crate::Sluice::peek) answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Peek {
    /// Every bucket the acquire names could serve it now, at its priority.
    Granted,
    /// Some bucket is short: the acquire would be refused with this RetryIn (for several
    /// short buckets, the longest), exact for the rows the answer was computed from.
    RetryIn(Duration),
}

impl Peek {
    /// Whether the acquire would be granted now.
    pub fn is_granted(&self) -> bool {
        matches!(self, Peek::Granted)
    }

    /// The wait, when the acquire would be refused.
    pub fn retry_in(&self) -> Option<Duration> {
        match self {
            Peek::Granted => None,
            Peek::RetryIn(wait) => Some(*wait),
        }
    }
}

/// Answers `wanted` (one acquire's dimensions) without a write: from memory when the
/// freshness rules let memory refuse it, or it takes prefetched tokens; else from one read
/// of every row it names (a second only when a bucket was resharded since this client
/// last saw it).
pub(crate) async fn peek(core: &Core, wanted: &[Wanted]) -> Result<Peek, Error> {
    let now = core.now();
    if let Some(answer) = from_memory(core, wanted, now) {
        return Ok(answer);
    }
    // The rows of each bucket as known now, once: another task of this client may learn
    // a reshard while the read is out.
    let counts: Vec<u16> = wanted
        .iter()
        .map(|w| rows_known(core, &w.dimension))
        .collect();
    let mut named: Vec<Dimension> = Vec::new();
    for (w, n) in wanted.iter().zip(&counts) {
        named.extend((0..*n).map(|k| w.dimension.shard(k)));
    }
    let mut read = core.store.read_buckets(&named).await?.into_iter();
    let now = core.now();
    let mut longest: Option<Duration> = None;
    for (w, known) in wanted.iter().zip(counts) {
        let mut rows: Vec<BucketState> = read.by_ref().take(usize::from(known)).flatten().collect();
        let mut stored = true;
        let seed = core.config.protocol() == Protocol::Seed;
        let complete = rows.len() == usize::from(known)
            && rows
                .first()
                .is_some_and(|first| seed || first.shards == known);
        if !complete {
            // Resharded (or deleted) since this client last looked: its rows as they are
            // (a key's not written yet: its template's bucket, full, learned by no one).
            (rows, stored) = reshard::rows_or_unwritten(core, &w.dimension).await?;
        }
        if rows.first().is_some_and(|r| r.bucket.is_keyed()) {
            return Err(Error::KeyRequired {
                dimension: w.dimension.clone(),
            });
        }
        if stored {
            core.lanes
                .note_shards(&w.dimension, u16::try_from(rows.len()).unwrap_or(1));
            for row in &rows {
                core.lanes.learn(row.clone(), now);
            }
        }
        if let Some(wait) = wait_of(core, w, &rows, now)? {
            longest = longest.max(Some(retry_in(wait)));
        }
    }
    Ok(longest.map_or(Peek::Granted, Peek::RetryIn))
}

/// The rows of `dimension`'s bucket this client answers from: as many as it knows on the
/// fast protocol; the dimension's own row alone on the seed's (as its acquire does, and
/// the seed's other SDKs: a spread bucket is its shard 0's share there).
fn rows_known(core: &Core, dimension: &Dimension) -> u16 {
    match core.config.protocol() {
        Protocol::Seed => 1,
        _ => core.lanes.shards(dimension),
    }
}

/// The answer memory may give alone: every dimension refused under the freshness rules
/// (the longest wait), or one dimension served by this client's prefetched tokens.
/// `None`: the store must be read. A grant is never answered from a remembered row.
fn from_memory(core: &Core, wanted: &[Wanted], now: UnixMillis) -> Option<Peek> {
    if let [one] = wanted
        && rows_known(core, &one.dimension) == 1
        && core
            .lane(&one.dimension)
            .memory()
            .prefetched_serves(one, now)
    {
        return Some(Peek::Granted);
    }
    let mut longest = Duration::ZERO;
    let mut rows: Vec<Dimension> = Vec::new();
    for w in wanted {
        let wait = if rows_known(core, &w.dimension) > 1 {
            let (remembered, wait) = sharded::remembered_short(core, w, None, now)?;
            rows.extend(remembered.into_iter().map(|r| r.dimension));
            wait
        } else {
            match core.lane(&w.dimension).memory().recall(w, now, None) {
                Recall::Denied(wait) => {
                    rows.push(w.dimension.clone());
                    wait
                }
                _ => return None,
            }
        };
        longest = longest.max(retry_in(wait));
    }
    if wanted.is_empty() {
        return None;
    }
    // A refusal told from memory is one this client answered (rule 3 of the freshness
    // rules): once its wait runs out, the next refusal comes from the store again.
    for row in &rows {
        core.lane(row)
            .memory()
            .answered(now.saturating_add(longest));
    }
    Some(Peek::RetryIn(longest))
}

/// How long `w` waits on the bucket of `rows` (one row, or every row of a spread bucket)
/// at `now`: `None` when it could take its cost now. A cost the bucket can never grant at
/// the acquire's priority is the acquire's own error.
fn wait_of(
    core: &Core,
    w: &Wanted,
    rows: &[BucketState],
    now: UnixMillis,
) -> Result<Option<Duration>, Error> {
    let cost = sharded::within_bucket(rows, w)?;
    if let [row] = rows {
        let take = w.take_from(row, now);
        if let Some(never) = w.never(row, &take) {
            return Err(never);
        }
        return Ok(match take {
            Take::Granted { .. } => None,
            Take::Short { wait: Some(wait) } => Some(wait),
            // A short `concurrent` bucket: slots come back when their holders release
            // them, which no row tells; ask again after the poll interval.
            _ => Some(core.config.slot_poll),
        });
    }
    let free = sharded::free_at(rows, w, now);
    Ok((sharded::total(&free) < cost).then(|| sharded::wait_for(rows, w, cost, now)))
}
