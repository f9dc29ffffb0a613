//! Several dimensions on the fast path: one single-item conditional write per bucket, no
//! transaction.
//!
//! An acquire on `openai#rpm` and `openai#tpm` takes each dimension through its own lane
//! (see [`fast`](super::fast)): each take is a change of that one bucket row (and its lease
//! row), batched with whatever else this client is writing to that row. The dimensions
//! whose remembered row refuses the request are taken first, one at a time in name order
//! (at the limit the bottleneck refuses before anything is taken); the others are taken
//! together. A caller that waits its turn takes the scarcest dimension first, always (see
//! `order`). When
//! one is short, the dimensions already taken are given back, each exactly once (the
//! give-back deletes the lease row it created, on condition that it is still there, and
//! gives its cost back if it did), and then the caller gets the RetryIn: all or nothing as
//! the caller sees it, and never more than the buckets hold. A dimension refused by
//! back-pressure (its row throttled, or held by another writer's transaction) rather than
//! by its bucket is asked again after the wait while the others stay held, a few times. An
//! acquire dropped half-way gives back what it took in the background.
//!
//! A dimension taken in shadow (its bucket is, or the client) is never refused, so it is
//! taken last, once every enforcing one is held, and never given back for another's
//! refusal (its ledger would keep a refusal the call never made): when its write cannot
//! be made (no answer, pushed back, every race lost) its part is granted unrecorded (see
//! [`shadow`](super::shadow)).
//!
//! The price is a brief hold: between its take and its give-back (one write), a dimension
//! taken for a request that is then refused shows other clients fewer tokens than it will
//! have.

use std::sync::Arc;
use std::time::Duration;

use crate::acquire::Wanted;
use crate::clock::UnixMillis;
use crate::error::{Error, RetryIn};
use crate::grant::{Grant, LeasePart};
use crate::shared::Core;
use crate::shared::remembered::{Recall, retry_in};

use super::release::{give_back_parts, in_background};

/// How many times the dimensions of a request refused by back-pressure (their rows
/// throttled, or held by a transaction; no bucket short) are asked again while the others
/// are held: giving those back and taking them again would cost two more writes of rows
/// already under pressure.
const BACK_PRESSURE_RETRIES: u32 = 8;

/// What every take of one request is asked with: the lease's time to live, since when a
/// denial must be fresh (see [`fast::acquire`](super::fast::acquire)), and when the
/// request's leases expire at the latest (what is held is given back as of then).
#[derive(Clone, Copy)]
struct Terms {
    ttl: Duration,
    fresh_after: Option<UnixMillis>,
    expires_by: UnixMillis,
    /// Whether each wanted is a row of a spread bucket (a gather), taken on that row alone
    /// (else a bucket, taken on any of its rows).
    rows: bool,
}

/// One dimension taken for a request not yet granted whole.
struct Taken {
    holding: Holding,
    attempts: u32,
    created_at: UnixMillis,
    expires_at: UnixMillis,
    ready_at: UnixMillis,
}

impl Taken {
    /// `grant`, one dimension's, held for the request (given back if it is never granted
    /// whole).
    fn held(core: &Arc<Core>, grant: Grant, terms: Terms) -> Taken {
        Taken {
            attempts: grant.attempts,
            created_at: grant.created_at,
            expires_at: grant.expires_at,
            ready_at: grant.ready_at,
            holding: Holding {
                core: core.clone(),
                parts: grant.parts,
                expires_at: terms.expires_by,
            },
        }
    }
}

/// Parts taken for a request not yet granted whole: given back if it never is, also when
/// the caller drops the acquire half-way.
struct Holding {
    core: Arc<Core>,
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
        if !parts.is_empty() {
            in_background(&self.core, parts, self.expires_at, true);
        }
    }
}

/// What the takes of one request came to so far.
struct Takes {
    taken: Vec<Option<Taken>>,
    refusal: Option<Error>,
    /// When the longest RetryIn seen so far ends: the answer counts down from it, however
    /// long the other takes and the give-back took.
    retry_at: UnixMillis,
}

impl Takes {
    /// Takes in the outcome of dimension `i`'s take; whether it was granted.
    fn record(&mut self, core: &Core, i: usize, outcome: Result<Taken, Error>) -> bool {
        match outcome {
            Ok(t) => {
                self.taken[i] = Some(t);
                true
            }
            Err(error) => {
                if let Error::RetryIn(refusal) = &error {
                    self.retry_at = self.retry_at.max(core.now().saturating_add(refusal.delay));
                }
                self.refusal = Some(worse(self.refusal.take(), error));
                false
            }
        }
    }
}

/// An acquire on several dimensions on the fast path.
pub(crate) async fn acquire(
    core: &Arc<Core>,
    wanted: Vec<Wanted>,
    ttl: Duration,
    fresh_after: Option<UnixMillis>,
) -> Result<Grant, Error> {
    take_all(core, wanted, ttl, fresh_after, false).await
}

/// A grant of a spread bucket gathered from several of its rows, `parts` naming each row
/// and what it gives (see [`sharded`]): each part is the fast path's write of its row, all
/// or nothing as the dimensions of a request are.
pub(crate) async fn gather(
    core: &Arc<Core>,
    parts: Vec<Wanted>,
    ttl: Duration,
) -> Result<Grant, Error> {
    take_all(core, parts, ttl, None, true).await
}

/// Takes every one of `wanted`, all or nothing; `rows`: see [`Terms::rows`].
async fn take_all(
    core: &Arc<Core>,
    wanted: Vec<Wanted>,
    ttl: Duration,
    fresh_after: Option<UnixMillis>,
    rows: bool,
) -> Result<Grant, Error> {
    let now = core.now();
    // Denials memory may answer for the whole request, with no call.
    let denied = wanted
        .iter()
        .filter_map(
            |w| match core.lane(&w.dimension).memory().recall(w, now, fresh_after) {
                Recall::Denied(wait) => Some(wait),
                _ => None,
            },
        )
        .max();
    if let Some(wait) = denied {
        let nothing = RetryIn::pressed(Duration::ZERO, now);
        return Err(refused(
            core,
            &wanted,
            &[],
            now,
            (wait, nothing),
            fresh_after,
        ));
    }
    let expires_by = now.saturating_add(ttl);
    // A caller waiting its turn may wait it on any dimension: each part's lease row
    // outlives the longest wait (the grant itself expires its TTL after it is ready).
    let queue = wanted.iter().map(|w| w.queue).max().unwrap_or_default();
    let terms = Terms {
        ttl: ttl.saturating_add(queue),
        fresh_after,
        expires_by,
        rows,
    };
    let mut takes = Takes {
        taken: (0..wanted.len()).map(|_| None).collect(),
        refusal: None,
        retry_at: now,
    };
    let (shadow, enforcing): (Vec<usize>, Vec<usize>) =
        (0..wanted.len()).partition(|&i| super::shadow::takes_in_shadow(core, &wanted[i]));
    // The enforcing dimensions that refuse go first, one by one (for a waiting caller the
    // scarcest too; see `order`); the others are taken together.
    let (first, together) = order::order(core, &wanted, &enforcing, now);
    for &i in &first {
        let outcome = take_one(core, &wanted[i], terms).await;
        if !takes.record(core, i, outcome) {
            break;
        }
    }
    if takes.refusal.is_none() {
        take_together(core, &wanted, &together, &mut takes, terms).await;
    }
    if !rows {
        // A gather's row pushed back answers at once (see `sharded`): holding the other
        // rows' parts through its waits would keep them from every other caller.
        ask_again_under_pressure(core, &wanted, &enforcing, &mut takes, terms).await;
    }
    if takes.refusal.is_none() {
        take_in_shadow(core, &wanted, &shadow, &mut takes, terms).await;
    }
    let took: Vec<bool> = takes.taken.iter().map(Option::is_some).collect();
    if let Some(error) = takes.refusal.take() {
        return Err(refuse(core, &wanted, takes, &took, error, terms).await);
    }
    Ok(granted(&wanted, takes.taken, now, ttl))
}

/// Takes the dimensions `shadow` (taken in shadow) at once, once every other is held: a
/// take whose write cannot be made is granted unrecorded (see
/// [`shadow::answer`](super::shadow::answer)).
async fn take_in_shadow(
    core: &Arc<Core>,
    wanted: &[Wanted],
    shadow: &[usize],
    takes: &mut Takes,
    terms: Terms,
) {
    let outcomes =
        futures::future::join_all(shadow.iter().map(|&i| take_one(core, &wanted[i], terms))).await;
    for (&i, outcome) in shadow.iter().zip(outcomes) {
        let outcome = outcome.or_else(|error| {
            let one = std::slice::from_ref(&wanted[i]);
            let grant = super::shadow::answer(core, one, terms.ttl, Err(error))?;
            Ok(Taken::held(core, grant, terms))
        });
        takes.record(core, i, outcome);
    }
}

/// While the dimensions not taken were refused by back-pressure on their rows (no bucket
/// short: the refusal names none, and nothing of theirs is remembered as denied), and
/// others are held: waits and asks for them again, [`BACK_PRESSURE_RETRIES`] times at
/// most. A bucket short (a spread one's refusal, from its rows read together, is not in
/// its lane's memory) is answered at once.
async fn ask_again_under_pressure(
    core: &Arc<Core>,
    wanted: &[Wanted],
    enforcing: &[usize],
    takes: &mut Takes,
    terms: Terms,
) {
    for _ in 0..BACK_PRESSURE_RETRIES {
        let Some(Error::RetryIn(refusal)) = &takes.refusal else {
            return;
        };
        if !refusal.short.is_empty() {
            return;
        }
        let wait = refusal.delay;
        let left: Vec<usize> = enforcing
            .iter()
            .copied()
            .filter(|&i| takes.taken[i].is_none())
            .collect();
        let denied = left.iter().any(|&i| {
            let w = &wanted[i];
            let recall = core
                .lane(&w.dimension)
                .memory()
                .recall(w, core.now(), terms.fresh_after);
            matches!(recall, Recall::Denied(_))
        });
        if denied || takes.taken.iter().all(Option::is_none) {
            return;
        }
        tokio::time::sleep(wait).await;
        takes.refusal = None;
        takes.retry_at = core.now();
        take_together(core, wanted, &left, takes, terms).await;
    }
}

/// Takes the dimensions `together` at once. Each take is held as soon as it is granted:
/// a caller going away half-way has it given back.
async fn take_together(
    core: &Arc<Core>,
    wanted: &[Wanted],
    together: &[usize],
    takes: &mut Takes,
    terms: Terms,
) {
    let outcomes =
        futures::future::join_all(together.iter().map(|&i| take_one(core, &wanted[i], terms)))
            .await;
    let mut refused_for_now = Vec::new();
    for (&i, outcome) in together.iter().zip(outcomes) {
        let for_now = matches!(outcome, Err(Error::RetryIn(_)));
        if !takes.record(core, i, outcome) && for_now {
            refused_for_now.push(i);
        }
    }
    if takes
        .refusal
        .as_ref()
        .is_some_and(|e| !matches!(e, Error::RetryIn(_)))
    {
        // The caller is told something else (the cost can never be granted, the store
        // failed): no denial window opens on the dimensions refused for now.
        for i in refused_for_now {
            core.lane(&wanted[i].dimension).memory().withdraw_denials();
        }
    }
}

/// Gives back what a refused request took (riding on the lanes' writes) before answering:
/// when the caller sees the refusal, nothing is held. The answer to give.
async fn refuse(
    core: &Arc<Core>,
    wanted: &[Wanted],
    mut takes: Takes,
    took: &[bool],
    error: Error,
    terms: Terms,
) -> Error {
    let parts: Vec<LeasePart> = takes
        .taken
        .iter_mut()
        .flatten()
        .flat_map(|t| t.holding.take())
        .collect();
    if !parts.is_empty() {
        // It finishes even if the caller goes away meanwhile.
        let core = core.clone();
        crate::detach::Detached::new(async move {
            give_back_parts(&core, parts, terms.expires_by).await;
        })
        .await;
    }
    match error {
        Error::RetryIn(refusal) => {
            let now = core.now();
            let wait = retry_in(takes.retry_at.saturating_since(now));
            refused(core, wanted, took, now, (wait, refusal), terms.fresh_after)
        }
        other => other,
    }
}

/// The grant of a request every dimension of which was taken: ready when its last part
/// is, expiring its `ttl` after that (or with its first part).
fn granted(wanted: &[Wanted], taken: Vec<Option<Taken>>, now: UnixMillis, ttl: Duration) -> Grant {
    let taken: Vec<Taken> = taken.into_iter().flatten().collect();
    let attempts = taken.iter().map(|t| t.attempts).sum();
    let created_at = taken.iter().map(|t| t.created_at).max().unwrap_or(now);
    let ready_at = taken.iter().map(|t| t.ready_at).max().unwrap_or(created_at);
    let expires_at = taken
        .iter()
        .map(|t| t.expires_at)
        .fold(ready_at.saturating_add(ttl), UnixMillis::min);
    // The parts in the order the request named them.
    let mut parts: Vec<LeasePart> = taken
        .into_iter()
        .flat_map(|mut t| t.holding.take())
        .collect();
    parts.sort_by_key(|p| {
        wanted
            .iter()
            .position(|w| w.dimension == p.dimension.base())
    });
    Grant::new(parts, created_at, expires_at, attempts).ready_at(ready_at)
}

/// One dimension of a several-dimension acquire, held (given back if dropped) from the
/// moment it is granted.
async fn take_one(core: &Arc<Core>, wanted: &Wanted, terms: Terms) -> Result<Taken, Error> {
    let grant = super::take_part(
        core,
        wanted.clone(),
        terms.ttl,
        terms.fresh_after,
        terms.rows,
    )
    .await?;
    Ok(Taken::held(core, grant, terms))
}

/// Of two reasons to refuse one request, the one to answer: any error before a RetryIn, the
/// longer of two RetryIns.
fn worse(a: Option<Error>, b: Error) -> Error {
    match (a, b) {
        (Some(Error::RetryIn(x)), Error::RetryIn(y)) => Error::RetryIn(x.and(y)),
        (Some(Error::RetryIn(_)) | None, b) => b,
        (Some(a), _) => a,
    }
}

/// The RetryIn of a several-dimension request refused for `wait` (`so_far` naming the
/// dimensions refused, each with its instant): the longest of it and of the waits memory
/// may answer on the others, except those this request took (`took`; they are being given
/// back), every short dimension named. The caller may be back when it runs out, asking
/// every dimension again: each remembers that.
fn refused(
    core: &Core,
    wanted: &[Wanted],
    took: &[bool],
    now: UnixMillis,
    (wait, so_far): (Duration, RetryIn),
    fresh_after: Option<UnixMillis>,
) -> Error {
    let mut refusal = RetryIn::pressed(wait, now);
    for s in so_far.short {
        let own = retry_in(s.at.saturating_since(now));
        refusal = refusal.and(RetryIn::on(&s.dimension, own, now));
    }
    for (i, w) in wanted.iter().enumerate() {
        if took.get(i).copied().unwrap_or(false) {
            continue;
        }
        if let Recall::Denied(other) = core.lane(&w.dimension).memory().recall(w, now, fresh_after)
        {
            refusal = refusal.and(RetryIn::on(&w.dimension, other, now));
        }
    }
    for w in wanted {
        core.lane(&w.dimension)
            .memory()
            .answered(now.saturating_add(refusal.delay));
    }
    Error::RetryIn(refusal)
}

mod order;

#[cfg(test)]
mod tests;
