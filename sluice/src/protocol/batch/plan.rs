//! What one lane write decides, computed from the row it starts from: the slots given back,
//! the acquires taken in order, the change that does both, and the lease rows of the
//! grants. Pure: no I/O.

use std::time::Duration;

use crate::bucket::{BucketState, Herd, LedgerChange, Mode, Take, Want, commute, shadow_take};
use crate::clock::UnixMillis;
use crate::config::Config;
use crate::grant::Kept;
use crate::ids::new_unique;
use crate::shared::lanes::{AcquireJob, ReleaseJob};
use crate::store::{BucketChange, LeaseKey, LeaseRecord};
use crate::tokens::Tokens;

/// What one attempt decided, from the row it started from.
pub(super) struct Plan {
    /// The row as this write leaves it, as computed from the remembered one: refilled, the
    /// released slots given back, then each grant taken in order.
    pub(super) after: BucketState,
    pub(super) granted: Vec<(AcquireJob, Tokens)>,
    pub(super) refused: Vec<AcquireJob>,
    /// Tokens this write gives back.
    pub(super) restored: Tokens,
    /// The level the grants need once the tokens are given back: each grant's cost, in
    /// order, and the reserves it must leave.
    pub(super) need: Tokens,
    /// Tokens taken ahead for this client, and until when (see
    /// [`Prefetch`](crate::Prefetch)).
    pub(super) prefetched: Option<(Tokens, UnixMillis)>,
    /// Whether the grants are shadow takes ([`Mode::Shadow`]: the bucket's, or the
    /// client's): each granted whatever the bucket holds, the level going into debt if
    /// need be, and counted in the row's ledger when an enforcing bucket would have
    /// refused it ([`shadow_take`]).
    pub(super) shadow: bool,
    /// For each grant, whether an enforcing bucket would have refused it (shadow takes).
    pub(super) would_refuse: Vec<bool>,
}

/// Gives back the released slots, then takes the acquires in order: as shadow takes when
/// the bucket is in shadow mode or `shadow` (the client is).
pub(super) fn plan(
    row: &BucketState,
    acquires: Vec<AcquireJob>,
    releases: &[ReleaseJob],
    (now, shadow): (UnixMillis, bool),
) -> Plan {
    let restored = releases
        .iter()
        .fold(Tokens::ZERO, |sum, r| sum + r.part.cost);
    let mut after = row.refilled_row(now);
    if restored > Tokens::ZERO {
        let level = after.restored(restored, now);
        after.set_level(level);
    }
    let shadow = shadow || row.bucket.mode() == Mode::Shadow;
    if shadow {
        return shadow_takes(row, after, restored, acquires, now);
    }
    let (after, granted, refused, need) = take_in_order(row, after, acquires, now);
    Plan {
        after,
        granted,
        refused,
        restored,
        need,
        prefetched: None,
        shadow: false,
        would_refuse: Vec::new(),
    }
}

/// Every acquire taken from `after` (the row refilled and given back to), in shadow:
/// granted whatever the bucket holds, and counted where an enforcing bucket would have
/// refused it.
fn shadow_takes(
    row: &BucketState,
    mut after: BucketState,
    restored: Tokens,
    mut acquires: Vec<AcquireJob>,
    now: UnixMillis,
) -> Plan {
    by_floor(row, &mut acquires);
    let mut granted = Vec::with_capacity(acquires.len());
    let mut would_refuse = Vec::with_capacity(acquires.len());
    for a in acquires {
        let cost = a.wanted.cost(row.bucket.cost_per_call());
        let (level, ledger, refused) = shadow_take(&after, cost, a.wanted.floor(&row.bucket), now);
        after.set_level(level);
        after.shadow = ledger;
        would_refuse.push(refused);
        granted.push((a, cost));
    }
    Plan {
        after,
        granted,
        refused: Vec::new(),
        restored,
        need: -Tokens::MAX,
        prefetched: None,
        shadow: true,
        would_refuse,
    }
}

/// How an attempt reads the row it computes its change from (see [`Want`]).
pub(super) struct Reading {
    /// The instant, and its microsecond.
    pub(super) now: (UnixMillis, i64),
    /// `false`: not filled, however long ago the row was seen (it was short when last
    /// seen, or is guessed drained).
    pub(super) fill: bool,
    /// It was short when last seen: its grants are credits, not takes.
    pub(super) short: bool,
    /// Other writers' writes a second to the row, in thousandths.
    pub(super) others_per_ks: u64,
    /// A full row is first taken from as another writer's fill stamped ahead leaves it.
    pub(super) behind: bool,
    /// Whether a full row gets a herd write.
    pub(super) herd: Herd,
}

/// The change that makes `plan` of `row` as `reading` says; `None` when the row cannot
/// serve it.
pub(super) fn change(
    row: &BucketState,
    plan: &Plan,
    reading: &Reading,
    fold_after: Duration,
) -> Option<BucketChange> {
    let granted = plan
        .granted
        .iter()
        .fold(Tokens::ZERO, |sum, (_, cost)| sum + *cost);
    if plan.shadow {
        return shadow_change(row, plan, reading, fold_after, granted);
    }
    let mut need = plan.need;
    let mut taken = granted;
    if let Some((ahead, _)) = plan.prefetched {
        // Taken ahead only from plenty: as much again left above every reserve.
        taken += ahead;
        need = need.max(granted + ahead + ahead + row.bucket.reserved());
    }
    let capacity = row.bucket.capacity();
    let want = Want {
        restored: plan.restored,
        taken,
        need: (taken > Tokens::ZERO).then_some(need),
        ceiling: row.holds().max(need.min(capacity)),
        fill: reading.fill,
        short: reading.short,
        others_per_ks: reading.others_per_ks,
        behind: reading.behind,
        herd: reading.herd,
    };
    commute(row, &want, reading.now, fold_after).map(|c| BucketChange::of(row, c))
}

/// The change of a plan of shadow takes: the costs taken whatever the bucket holds (no
/// floor on the level), and the ledger's additions.
fn shadow_change(
    row: &BucketState,
    plan: &Plan,
    reading: &Reading,
    fold_after: Duration,
    taken: Tokens,
) -> Option<BucketChange> {
    let want = Want {
        restored: plan.restored,
        taken,
        need: None,
        ceiling: row.holds(),
        fill: reading.fill,
        short: reading.short,
        others_per_ks: reading.others_per_ks,
        behind: reading.behind,
        herd: reading.herd,
    };
    let refused_costs = plan
        .granted
        .iter()
        .zip(&plan.would_refuse)
        .filter(|(_, refused)| **refused)
        .fold(Tokens::ZERO, |sum, ((_, cost), _)| sum + *cost);
    let ledger = LedgerChange::between(&row.shadow, &plan.after.shadow, refused_costs);
    commute(row, &want, reading.now, fold_after)
        .map(|c| BucketChange::of(row, c).with_ledger(ledger))
}

/// When each grant of a write that left `written` is ready, in order: at `now`, or for a
/// reservation once the refill has brought the level back to the grant's floor, the level
/// as this write left it with the batch's later grants counted back (the reservations of
/// other writes that landed before this one are counted: they are ahead in the queue).
pub(super) fn ready(
    written: &BucketState,
    granted: &[(AcquireJob, Tokens)],
    now: UnixMillis,
) -> Vec<UnixMillis> {
    let mut later = Tokens::ZERO;
    let mut ready = vec![now; granted.len()];
    for (i, (a, cost)) in granted.iter().enumerate().rev() {
        if !a.wanted.queue.is_zero() {
            let mut before = written.clone();
            before.tokens = before.tokens.saturating_add(later + *cost);
            let floor = a.wanted.floor(&written.bucket);
            if let Take::Short { wait: Some(wait) } = before.take_above(*cost, floor, now) {
                ready[i] = now.saturating_add(wait);
            }
        }
        later += *cost;
    }
    ready
}

/// The lease rows of the grants of a write that applied to `row` (none for a lean bucket),
/// each expiring its TTL after it is `ready`, and for each grant its lease's key, expiry
/// and where it is kept.
pub(super) fn leases(
    config: &Config,
    row: &BucketState,
    granted: &[(AcquireJob, Tokens)],
    (now, ready): (UnixMillis, &[UnixMillis]),
) -> (Vec<LeaseRecord>, Vec<(LeaseKey, UnixMillis, Kept)>) {
    let lean = !row.bucket.keeps_leases();
    let mut records = Vec::with_capacity(if lean { 0 } else { granted.len() });
    let mut issued = Vec::with_capacity(granted.len());
    for ((a, cost), ready) in granted.iter().zip(ready) {
        let key = LeaseKey::new(&row.dimension, &new_unique());
        let expires_at = ready.saturating_add(a.ttl);
        if lean {
            issued.push((key, expires_at, Kept::Nowhere));
            continue;
        }
        records.push(LeaseRecord {
            slot: row.bucket.limit_type().restores_on_release(),
            key: key.clone(),
            dimension: row.dimension.clone(),
            cost: *cost,
            created_at: now,
            expires_at,
            caller: config.caller.clone(),
        });
        issued.push((key, expires_at, Kept::Row));
    }
    (records, issued)
}

/// `acquires` in the order a row with reserves takes them: the lowest floor (the highest
/// priority) first, in arrival order among equals.
fn by_floor(row: &BucketState, acquires: &mut [AcquireJob]) {
    if !row.bucket.reserves().is_empty() {
        acquires.sort_by_key(|a| a.wanted.floor(&row.bucket));
    }
}

/// `after` (the row refilled to `now`, with what the write gives back), then as many of
/// `acquires` taken as it can serve, highest priority first and in order within each
/// priority, each keeping the reserves above its own: the row as it then stands, the
/// grants, the refusals, and the level the grants need once `restored` is back.
fn take_in_order(
    row: &BucketState,
    mut after: BucketState,
    mut acquires: Vec<AcquireJob>,
    now: UnixMillis,
) -> (
    BucketState,
    Vec<(AcquireJob, Tokens)>,
    Vec<AcquireJob>,
    Tokens,
) {
    by_floor(row, &mut acquires);
    let mut granted = Vec::with_capacity(acquires.len());
    let mut refused = Vec::new();
    // The strictest of the grants' needs (only reservations need less than nothing).
    let (mut taken, mut need) = (Tokens::ZERO, -Tokens::MAX);
    for a in acquires {
        let cost = a.wanted.cost(row.bucket.cost_per_call());
        match a.wanted.take_from(&after, now) {
            Take::Granted { level } => {
                after.set_level(level);
                taken += cost;
                // A reservation (a caller waiting its turn) may leave the bucket below
                // its floor by what refills within its wait.
                let floor = a.wanted.floor(&row.bucket) - a.wanted.allowance(row);
                need = need.max(taken + floor);
                granted.push((a, cost));
            }
            _ => refused.push(a),
        }
    }
    (after, granted, refused, need)
}

pub(super) fn jobs_of(
    granted: Vec<(AcquireJob, Tokens)>,
    refused: Vec<AcquireJob>,
) -> Vec<AcquireJob> {
    granted.into_iter().map(|(a, _)| a).chain(refused).collect()
}
