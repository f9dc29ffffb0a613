//! Refusals, the same for every protocol: the capacity error, a refilling bucket's exact
//! wait, or a short `concurrent` bucket's outlook from its leases (giving back, exactly
//! once each, the expired ones found on the way).

use std::time::Duration;

use rand::RngExt as _;

use crate::acquire::Wanted;
use crate::bucket::{BucketState, Take, Waiting};
use crate::clock::UnixMillis;
use crate::config::COOLDOWN_CALLER;
use crate::error::Error;
use crate::shared::Core;
use crate::shared::lanes::Lane;
use crate::shared::remembered::{SlotsBack, retry_in};
use crate::store::LeaseRecord;
use crate::tokens::Tokens;

use super::ending::reclaim;

/// Slot leases read per page when a short `concurrent` bucket looks for expired ones.
const SLOT_PAGE: usize = 100;
/// Pages read at most per look: a bucket with more expired leases than this gives the
/// rest back at its next shortage (or the reconciler does).
const SLOT_PAGES: usize = 10;
/// How many times one acquire looks again at a short `concurrent` bucket because another
/// client gave back the expired leases it found (the bucket changed under it); after that
/// it answers from the leases it sees. A lagging index may show deleted leases for a moment.
const MAX_LOOKS_AGAIN: u32 = 3;

/// Why a confirmed row refuses a request.
pub(crate) enum Refusal {
    /// The cost can never be granted.
    Exceeds(Error),
    /// Wait this long (already at least a millisecond, and remembered as the row's).
    Wait(Duration),
    /// Expired leases of a short `concurrent` bucket were given back: look again.
    LookAgain,
}

/// Why `row`, which the store just confirmed, refuses `wanted` at `now` (`None`: it
/// grants). A refilling bucket opens its denial window; a short `concurrent` one answers
/// from memory within the poll interval, else from its leases.
pub(crate) async fn refusal(
    core: &Core,
    row: &BucketState,
    wanted: &Wanted,
    now: UnixMillis,
    looked_again: u32,
) -> Result<Option<Refusal>, Error> {
    match wanted.take_from(row, now) {
        Take::Granted { .. } => Ok(None),
        Take::Short { wait: None } => {
            let floor = wanted.floor(&row.bucket);
            slots_short(core, row, now, looked_again, floor)
                .await
                .map(Some)
        }
        _ => Ok(refused_now(core, row, wanted, now)),
    }
}

/// [`refusal`] for what the row alone answers: the capacity (or share) error, or a
/// refilling bucket's exact wait (`None` for anything else).
pub(crate) fn refused_now(
    core: &Core,
    row: &BucketState,
    wanted: &Wanted,
    now: UnixMillis,
) -> Option<Refusal> {
    let take = wanted.take_from(row, now);
    if let Some(error) = wanted.never(row, &take) {
        return Some(Refusal::Exceeds(error));
    }
    match take {
        Take::Short { wait: Some(wait) } => {
            let wait = retry_in(wait);
            let floor = wanted.floor(&row.bucket);
            core.lane(&row.dimension)
                .memory()
                .confirm_short(now, wait, floor);
            Some(Refusal::Wait(wait))
        }
        _ => None,
    }
}

/// The refusal of a short `concurrent` bucket (whatever the cost) to requests leaving at
/// least `floor`: from memory within the poll interval, else from its leases. Its RetryIn
/// is at most the poll interval while a holder may release a lease (rule 4 of
/// [`remembered`](crate::shared::remembered)).
pub(crate) async fn slots_short(
    core: &Core,
    row: &BucketState,
    now: UnixMillis,
    looked_again: u32,
    floor: Tokens,
) -> Result<Refusal, Error> {
    let lane = core.lane(&row.dimension);
    // However many callers wait, together they look about a hundred times a second.
    let poll = row.waiting.spacing(now, core.config.slot_poll);
    let known = lane.memory().slots_back(now, poll);
    let back = match known {
        Some(back) => back,
        None => {
            let (outlook, ()) = tokio::join!(
                slot_outlook(core, row, now, looked_again),
                count_waiting(core, &lane, row, now)
            );
            match outlook? {
                SlotOutlook::LookAgain => return Ok(Refusal::LookAgain),
                SlotOutlook::BackBy(back) => back,
            }
        }
    };
    Ok(Refusal::Wait(
        lane.memory().confirm_slots_short(now, back, poll, floor),
    ))
}

/// Counts this client's callers among the callers waiting for a slot of `row`'s bucket,
/// once an epoch (by chance when many wait: see [`Waiting::addition`]).
/// The count is an estimate, so a failure only leaves it as it was.
async fn count_waiting(core: &Core, lane: &Lane, row: &BucketState, now: UnixMillis) {
    let epoch = Waiting::epoch(now);
    if !lane.memory().count_in(epoch) {
        return;
    }
    // This client's callers waiting on it (an acquire that is not waiting counts as one).
    let mine = lane.waiting.load(std::sync::atomic::Ordering::Relaxed);
    let Some(addition) = row
        .waiting
        .addition(now, mine, |n| rand::rng().random_range(0..n))
    else {
        return;
    };
    let forget = row.waiting.stale(now);
    match core
        .store
        .count_waiting(&row.dimension, epoch, addition, &forget)
        .await
    {
        Ok(Some(after)) => lane.memory().learn_waiting(after.waiting),
        Ok(None) => {}
        Err(error) => tracing::debug!(%error, "the waiting callers were not counted"),
    }
}

/// What a short `concurrent` bucket's leases say.
enum SlotOutlook {
    /// Expired leases were given back (by this call or, meanwhile, another client): the
    /// bucket changed, look again.
    LookAgain,
    /// What the live leases say: when the earliest may be given back (the clock-skew margin
    /// after its expiry), and whether a holder may release one sooner.
    BackBy(SlotsBack),
}

/// What the leases of a short `concurrent` bucket say: when a slot comes back for sure
/// (when the earliest live lease may be given back) and whether a holder may release one
/// sooner, after giving back, exactly once each, the expired leases found on the way (the
/// reconciler's work). Reads the dimension's slot leases
/// earliest expiry first, a page at a time, never the whole table.
///
/// `looked_again`: how many times this acquire already looked again; from
/// [`MAX_LOOKS_AGAIN`] on, expired leases another client gave back first no longer send
/// it looking again.
async fn slot_outlook(
    core: &Core,
    row: &BucketState,
    now: UnixMillis,
    looked_again: u32,
) -> Result<SlotOutlook, Error> {
    let dimension = &row.dimension;
    let mut reclaimed = 0;
    let mut found_expired = false;
    let mut back = SlotsBack::default();
    // Every slot lease row on the dimension, earliest expiry first.
    for _ in 0..SLOT_PAGES {
        let page = core.store.slot_leases(dimension, SLOT_PAGE).await?;
        let more = page.len() >= SLOT_PAGE;
        let back_at = |l: &LeaseRecord| {
            core.config
                .lease_reclaimable_at(l.expires_at, true, &l.caller)
        };
        let (expired, live): (Vec<_>, Vec<_>) = page.into_iter().partition(|l| back_at(l) <= now);
        if !expired.is_empty() {
            found_expired = true;
            reclaimed += reclaim(core, expired).await?;
        }
        if !live.is_empty() || !more {
            // The earliest to come back (a cool-down lease has no margin: it may come back
            // before one that expires earlier). Nobody releases a cool-down; any other
            // lease, on this page or a later one, its holder may release at any moment.
            let cooling = |l: &&LeaseRecord| l.caller == COOLDOWN_CALLER;
            back = SlotsBack {
                earliest: live.iter().map(back_at).min(),
                releasable: more || live.iter().any(|l| !cooling(&l)),
                cooling_until: live.iter().filter(cooling).map(back_at).max(),
            };
            break;
        }
    }
    if reclaimed > 0 {
        return Ok(SlotOutlook::LookAgain);
    }
    if found_expired && looked_again < MAX_LOOKS_AGAIN {
        // Another client gave them back first: the bucket may hold their slots now.
        let current = core.read_one(dimension).await?;
        // Counting waiting callers changes nothing else.
        let unchanged = current.is_some_and(|mut c| {
            c.waiting = row.waiting.clone();
            c == *row
        });
        if !unchanged {
            return Ok(SlotOutlook::LookAgain);
        }
    }
    Ok(SlotOutlook::BackBy(back))
}
