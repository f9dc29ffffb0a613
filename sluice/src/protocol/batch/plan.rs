//! What one lane write decides, computed from the row it starts from: the released slots
//! given back, the acquires taken in order, expired kept leases reclaimed when a
//! `concurrent` row is short, and where each new lease is kept. Pure: no I/O.

use crate::bucket::{BucketState, HeldLease, Take};
use crate::clock::UnixMillis;
use crate::config::Config;
use crate::grant::Kept;
use crate::ids::{new_held_id, new_unique};
use crate::shared::lanes::{AcquireJob, ReleaseJob};
use crate::store::{HeldWrite, LeaseKey, LeaseRecord, LeaseWrite};
use crate::tokens::Tokens;

/// The most expired kept leases one write gives back.
const MAX_RECLAIMED: usize = 32;

/// What one attempt decided, from the row it started from.
pub(super) struct Plan {
    /// The row as it stands after this write: refilled, the released slots given back,
    /// then each grant taken in order.
    pub(super) after: BucketState,
    pub(super) granted: Vec<(AcquireJob, Tokens)>,
    pub(super) refused: Vec<AcquireJob>,
    /// Expired leases the row keeps, given back by this write.
    pub(super) reclaimed: Vec<HeldLease>,
    /// Tokens this write gives back.
    pub(super) restored: Tokens,
    /// Tokens taken ahead for this client, and until when (see
    /// [`Prefetch`](crate::Prefetch)).
    pub(super) prefetched: Option<(Tokens, UnixMillis)>,
}

/// The lease writes of one attempt, and where each grant's lease is kept.
pub(super) struct Writes {
    pub(super) leases: Vec<LeaseWrite>,
    pub(super) held: Vec<HeldWrite>,
    pub(super) issued: Vec<(LeaseKey, UnixMillis, Kept)>,
    /// Whether the bucket row itself is written (else only lease rows are).
    pub(super) bucket: bool,
}

/// A lease a write creates.
#[derive(Clone, Copy)]
struct NewLease<'a> {
    kept: Kept,
    cost: Tokens,
    created_at: UnixMillis,
    expires_at: UnixMillis,
    caller: &'a str,
}

/// Gives back the released slots, takes the acquires in order and, when a `concurrent`
/// row is short for some of them, gives its expired kept leases back in the same write
/// (those past [`Config::reclaimable_at`], which leaves their holders' clocks a margin)
/// (exactly once: each removal is conditioned on the lease still being there), then
/// grants again.
pub(super) fn plan(
    row: &BucketState,
    acquires: Vec<AcquireJob>,
    releases: &[ReleaseJob],
    now: UnixMillis,
    config: &Config,
) -> Plan {
    let base = row.refilled_row(now);
    let released: Tokens = releases
        .iter()
        .filter(|r| r.part.restores)
        .fold(Tokens::ZERO, |sum, r| sum + r.part.cost);
    let (mut after, mut granted, mut refused) =
        take_in_order(row, base.clone(), released, acquires, now);
    let mut reclaimed: Vec<HeldLease> = Vec::new();
    if !refused.is_empty() && row.bucket.limit_type().restores_on_release() {
        reclaimed = row
            .held
            .iter()
            .filter(|h| config.lease_reclaimable_at(h.expires_at, true, &h.caller) <= now)
            .filter(|h| !releases.iter().any(|r| r.part.key.unique() == h.id))
            .cloned()
            .collect();
        // The earliest first, and a bounded number per write (the write's expressions
        // must stay within DynamoDB's limits; the rest come back in later writes or
        // from the reconciler).
        reclaimed.sort_by_key(|h| h.expires_at);
        reclaimed.truncate(MAX_RECLAIMED);
        if !reclaimed.is_empty() {
            let back = reclaimed.iter().fold(released, |sum, h| sum + h.cost);
            (after, granted, refused) =
                take_in_order(row, base, back, jobs_of(granted, refused), now);
        }
    }
    let restored = reclaimed.iter().fold(released, |sum, h| sum + h.cost);
    Plan {
        after,
        granted,
        refused,
        reclaimed,
        restored,
        prefetched: None,
    }
}

/// How many leases the row keeps after this write's releases and reclaims.
pub(super) fn kept_in_row(row: &BucketState, releases: &[ReleaseJob], plan: &Plan) -> usize {
    let released_from_row = releases
        .iter()
        .filter(|r| r.part.kept == Kept::InBucket)
        .count();
    row.held
        .len()
        .saturating_sub(released_from_row + plan.reclaimed.len())
}

/// The lease writes: each grant's lease joins the row while it has room, the rest get
/// rows of their own (a lean bucket's have none); each release's and reclaim's end.
pub(super) fn writes(
    config: &Config,
    row: &BucketState,
    releases: &[ReleaseJob],
    plan: &Plan,
    now: UnixMillis,
) -> Writes {
    let lean = !row.bucket.keeps_leases();
    let room = config.leases_per_row;
    let mut kept_in_row = kept_in_row(row, releases, plan);
    let mut leases = Vec::with_capacity(plan.granted.len() + releases.len());
    let mut held = Vec::with_capacity(plan.granted.len() + releases.len());
    let mut issued = Vec::with_capacity(plan.granted.len());
    for (a, cost) in &plan.granted {
        let expires_at = now.saturating_add(a.ttl);
        let kept = if lean {
            Kept::Nowhere
        } else if kept_in_row < room {
            kept_in_row += 1;
            Kept::InBucket
        } else {
            Kept::Row
        };
        let new = NewLease {
            kept,
            cost: *cost,
            created_at: now,
            expires_at,
            caller: &config.caller,
        };
        let key = new_lease(row, &new, &mut leases, &mut held);
        issued.push((key, expires_at, kept));
    }
    for r in releases {
        let id = r.part.key.unique().to_owned();
        match (r.part.kept, r.part.restores) {
            (Kept::InBucket, true) => held.push(HeldWrite::Remove(id)),
            (Kept::InBucket, false) => held.push(HeldWrite::Forget(id)),
            (Kept::Row, _) => leases.push(LeaseWrite::Delete(r.part.key.clone())),
            // A grant given back that had no lease (lean, or prefetched; a local one never
            // reaches a lane).
            (Kept::Nowhere | Kept::Local, _) => {}
        }
    }
    held.extend(
        plan.reclaimed
            .iter()
            .map(|h| HeldWrite::Remove(h.id.clone())),
    );
    // Releases of slots that hold nothing (adjusted to zero) kept in rows of their own
    // only delete those rows.
    let bucket = !plan.granted.is_empty()
        || plan.restored > Tokens::ZERO
        || held.iter().any(|h| matches!(h, HeldWrite::Remove(_)));
    Writes {
        leases,
        held,
        issued,
        bucket,
    }
}

/// A new lease kept as `kept`, written into `leases` or `held`; its key.
fn new_lease(
    row: &BucketState,
    new: &NewLease<'_>,
    leases: &mut Vec<LeaseWrite>,
    held: &mut Vec<HeldWrite>,
) -> LeaseKey {
    let NewLease {
        kept,
        cost,
        created_at: now,
        expires_at,
        caller,
    } = *new;
    let dimension = &row.dimension;
    match kept {
        Kept::InBucket => {
            let id = new_held_id(row, held.iter().map(HeldWrite::id));
            held.push(HeldWrite::Add(HeldLease {
                id: id.clone(),
                cost,
                created_at: now,
                expires_at,
                caller: caller.to_owned(),
            }));
            LeaseKey::new(dimension, &id)
        }
        Kept::Row => {
            let key = LeaseKey::new(dimension, &new_unique());
            leases.push(LeaseWrite::Create(LeaseRecord {
                slot: row.bucket.limit_type().restores_on_release(),
                key: key.clone(),
                dimension: dimension.clone(),
                cost,
                created_at: now,
                expires_at,
                caller: caller.to_owned(),
                in_bucket: false,
            }));
            key
        }
        Kept::Nowhere | Kept::Local => LeaseKey::new(dimension, &new_unique()),
    }
}

/// `after` (the row refilled to `now`) with `restored` given back, then as many of
/// `acquires` taken as it can serve, highest priority first and in order within each
/// priority, each keeping the reserves above its own: the row as it then stands, the
/// grants and the refusals.
fn take_in_order(
    row: &BucketState,
    mut after: BucketState,
    restored: Tokens,
    mut acquires: Vec<AcquireJob>,
    now: UnixMillis,
) -> (BucketState, Vec<(AcquireJob, Tokens)>, Vec<AcquireJob>) {
    if !row.bucket.reserves().is_empty() {
        acquires.sort_by_key(|a| a.wanted.floor(&row.bucket));
    }
    if restored > Tokens::ZERO {
        let level = after.restored(restored, now);
        after.set_level(level);
    }
    let mut granted = Vec::with_capacity(acquires.len());
    let mut refused = Vec::new();
    for a in acquires {
        let cost = a.wanted.cost(row.bucket.cost_per_call());
        match a.wanted.take_from(&after, now) {
            Take::Granted { level } => {
                after.set_level(level);
                granted.push((a, cost));
            }
            _ => refused.push(a),
        }
    }
    (after, granted, refused)
}

pub(super) fn jobs_of(
    granted: Vec<(AcquireJob, Tokens)>,
    refused: Vec<AcquireJob>,
) -> Vec<AcquireJob> {
    granted.into_iter().map(|(a, _)| a).chain(refused).collect()
}
