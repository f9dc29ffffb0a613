//! Changing a bucket's tokens by hand after an incident: reset it, or top it up (see
//! [`Sluice::restock`](crate::Sluice::restock)).

use crate::bucket::{BucketState, Level, LimitType};
use crate::clock::UnixMillis;
use crate::dimension::Dimension;
use crate::error::Error;
use crate::retry::Budget;
use crate::shared::Core;
use crate::store::{BucketWrite, Commit, CommitError, LeaseFilter};
use crate::tokens::Tokens;

use super::{lost_race, reshard};

/// What a change by hand does to a bucket's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Restock {
    /// Full again: as many tokens as the bucket holds at most; a `concurrent` bucket,
    /// every slot no lease row holds.
    Reset,
    /// This many more tokens, up to the most the bucket holds (a `concurrent` bucket: up
    /// to the slots no lease row holds).
    TopUp(Tokens),
}

/// Who changes a bucket by hand, why, and (to refuse a bucket changed since) the version
/// they decided from: logged with the change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audit {
    /// Who: a person or a tool.
    pub who: String,
    /// Why: an incident, a ticket.
    pub why: String,
    /// The version of the bucket's row (shard 0's, for a spread bucket) the change was
    /// decided from: refused with [`Error::BucketChanged`] when the stored row is at
    /// another. `None`: the change applies to the bucket as it is when written.
    pub if_version: Option<u64>,
}

/// What a change by hand did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Restocked {
    /// The tokens the bucket held before (every row, refilled to the change's time).
    pub before: Tokens,
    /// The tokens it holds after.
    pub after: Tokens,
    /// The version of its row (shard 0's) after the change; the one read when nothing
    /// was written (`before == after`).
    pub version: u64,
}

/// Applies `how` to `base`'s bucket (every row of a spread one) with one conditional
/// write, as `audit` says; read again and computed again when another writer moved it in
/// between, unless `audit` names the version it was decided from.
pub(crate) async fn restock(
    core: &Core,
    base: Dimension,
    how: Restock,
    audit: &Audit,
) -> Result<Restocked, Error> {
    let mut budget = Budget::new(core.config.max_retries);
    loop {
        let rows = reshard::rows_of(core, &base).await?;
        let stored = rows[0].version;
        if let Some(read) = audit.if_version.filter(|v| *v != stored) {
            return Err(changed(&base, read, stored));
        }
        let Some((levels, now)) = levels_of(core, &base, &rows, how).await? else {
            // A `concurrent` bucket's rows moved while they settled: look again.
            if budget.lose() {
                continue;
            }
            return Err(Error::Contention {
                dimension: base,
                attempts: budget.lost(),
            });
        };
        let before = sum(rows.iter().map(|r| r.refilled(now).tokens));
        let after = sum(levels.iter().map(|l| l.tokens));
        if after == before {
            return Ok(Restocked {
                before,
                after,
                version: stored,
            });
        }
        let commit = Commit {
            buckets: rows
                .iter()
                .zip(&levels)
                .map(|(row, level)| BucketWrite::new(row.clone(), *level))
                .collect(),
            leases: Vec::new(),
        };
        let written: Vec<BucketState> = commit.buckets.iter().map(BucketWrite::after).collect();
        match core.commit(commit).await {
            Ok(()) => {
                for row in written {
                    core.lanes.learn_written(row, now);
                }
                tracing::info!(
                    dimension = %base, who = %audit.who, why = %audit.why, ?how,
                    %before, %after, version = stored + 1,
                    "bucket changed by hand"
                );
                return Ok(Restocked {
                    before,
                    after,
                    version: stored + 1,
                });
            }
            Err(CommitError::Condition(_) | CommitError::TransactionConflict) => {
                if let Some(read) = audit.if_version {
                    // Changed between the read and the write: refused as well.
                    let now_stored = core.read_one(&base).await?.map_or(read, |r| r.version);
                    return Err(changed(&base, read, now_stored));
                }
                lost_race(&mut budget, &base).await?;
            }
            Err(CommitError::Store(e)) => return Err(e.into()),
        }
    }
}

/// Each row's level after `how`, and the instant it is computed at; for a `concurrent`
/// bucket from its lease rows once settled (`None`: they moved meanwhile).
async fn levels_of(
    core: &Core,
    base: &Dimension,
    rows: &[BucketState],
    how: Restock,
) -> Result<Option<(Vec<Level>, UnixMillis)>, Error> {
    let held = match rows[0].bucket.limit_type() {
        LimitType::Concurrent => match settled_slots(core, base, &rows[0]).await? {
            Some(held) => Some(held),
            None => return Ok(None),
        },
        _ => None,
    };
    let now = core.now();
    let mut levels = restocked(rows, how, held.map(|(slots, _)| slots), now);
    if let (Some((_, false)), [level]) = (held, levels.as_mut_slice()) {
        // A lease row nobody can read holds an unknown number of slots: never raised.
        level.tokens = level.tokens.min(rows[0].refilled(now).tokens);
    }
    Ok(Some((levels, now)))
}

fn changed(base: &Dimension, read: u64, stored: u64) -> Error {
    Error::BucketChanged {
        dimension: base.clone(),
        read,
        stored,
    }
}

fn sum(tokens: impl Iterator<Item = Tokens>) -> Tokens {
    tokens.fold(Tokens::ZERO, |s, t| s.saturating_add(t))
}

/// The slots the lease rows of `base` hold (live or expired: an expired one is given back
/// by the reconciler, once), and whether every one of its lease rows could be read;
/// `None` when the bucket row (`row`, as read) or its lease rows moved while they settled.
///
/// A slot's acquire writes the bucket row, then its lease row, and its release deletes the
/// lease row, then gives the slot back: one look may fall between the two. So, as the
/// reconciler does, the rows are looked at twice, [`Config::heal_settle`] apart, and
/// trusted only if both looks agree (the write that follows is conditioned on the bucket
/// row being as read).
///
/// [`Config::heal_settle`]: crate::Config::heal_settle
async fn settled_slots(
    core: &Core,
    base: &Dimension,
    row: &BucketState,
) -> Result<Option<(Tokens, bool)>, Error> {
    let look = || async {
        let scan = core
            .store
            .scan_leases(&LeaseFilter {
                dimension: Some(base.clone()),
                expired_before: None,
            })
            .await?;
        let mut keys: Vec<_> = scan.leases.iter().map(|l| l.key.clone()).collect();
        keys.sort();
        let held = sum(scan.leases.iter().filter(|l| l.slot).map(|l| l.cost));
        let readable = !scan.unreadable.iter().any(|key| {
            crate::store::LeaseKey::parse(key)
                .and_then(|k| k.dimension())
                .is_none_or(|d| d == *base)
        });
        Ok::<_, Error>((keys, held, readable))
    };
    let first = look().await?;
    tokio::time::sleep(core.config.heal_settle).await;
    let second = look().await?;
    let again = core.read_one(base).await?;
    if first.0 != second.0 || again.as_ref() != Some(row) {
        return Ok(None);
    }
    Ok(Some((second.1, first.2 && second.2)))
}

/// Each row's level after `how` at `now`: a reset fills every row to the most it holds
/// (a `concurrent` bucket's one row to its slots less those `held`); a top-up adds to the
/// rows in order, each up to that most, never lowering one.
fn restocked(
    rows: &[BucketState],
    how: Restock,
    held: Option<Tokens>,
    now: UnixMillis,
) -> Vec<Level> {
    let mut left = match how {
        Restock::Reset => Tokens::MAX,
        Restock::TopUp(tokens) => tokens.max(Tokens::ZERO),
    };
    rows.iter()
        .map(|row| {
            let level = row.refilled(now);
            let most = match held {
                Some(held) => row.bucket.capacity().saturating_sub(held),
                None => row.holds(),
            };
            let to = match (how, held) {
                // A `concurrent` bucket's free slots, exactly: lowered too, when it said more.
                (Restock::Reset, Some(_)) => most,
                (Restock::Reset, None) => most.max(level.tokens),
                (Restock::TopUp(_), _) => level
                    .tokens
                    .saturating_add(left)
                    .min(most)
                    .max(level.tokens),
            };
            left = left.saturating_sub(to.saturating_sub(level.tokens).max(Tokens::ZERO));
            Level {
                tokens: to,
                ..level
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::Bucket;
    use crate::rate::RefillRate;

    fn row(k: u16, tokens: i64, now: UnixMillis) -> BucketState {
        let base: Dimension = "openai#tpm".parse().unwrap();
        let mut row = BucketState::full(
            base.shard(k),
            Bucket::tokens(RefillRate::per_second(1)).with_capacity(100),
            now,
        );
        row.set_level(Level::new(Tokens::new(tokens), now));
        row
    }

    #[test]
    fn a_reset_fills_every_row_and_a_top_up_fills_them_in_order_never_lowering_one() {
        let now = UnixMillis::from_secs(1_700_000_000);
        let rows = [row(0, 10, now), row(1, 95, now), row(2, 100, now)];
        let tokens = |levels: Vec<Level>| levels.iter().map(|l| l.tokens).collect::<Vec<_>>();
        let t = |v: &[i64]| v.iter().map(|t| Tokens::new(*t)).collect::<Vec<_>>();
        assert_eq!(
            tokens(restocked(&rows, Restock::Reset, None, now)),
            t(&[100, 100, 100])
        );
        assert_eq!(
            tokens(restocked(&rows, Restock::TopUp(Tokens::new(30)), None, now)),
            t(&[40, 95, 100])
        );
        assert_eq!(
            tokens(restocked(&rows, Restock::TopUp(Tokens::new(93)), None, now)),
            t(&[100, 98, 100])
        );
        // A concurrent bucket's slots: its capacity less those held, whatever it said.
        let slots = |tokens: i64| {
            let mut r = BucketState::full(
                "eleven#concurrent".parse().unwrap(),
                Bucket::concurrent(10),
                now,
            );
            r.set_level(Level::new(Tokens::new(tokens), now));
            r
        };
        let held = Some(Tokens::new(3));
        assert_eq!(
            tokens(restocked(&[slots(2)], Restock::Reset, held, now)),
            t(&[7])
        );
        assert_eq!(
            tokens(restocked(&[slots(9)], Restock::Reset, held, now)),
            t(&[7])
        );
        let up = Restock::TopUp(Tokens::new(4));
        assert_eq!(tokens(restocked(&[slots(2)], up, held, now)), t(&[6]));
        assert_eq!(tokens(restocked(&[slots(5)], up, held, now)), t(&[7]));
    }
}
