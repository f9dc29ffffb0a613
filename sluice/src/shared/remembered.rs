//! What a client remembers of each bucket row, and when it may answer from it: the
//! freshness model.
//!
//! A client keeps, per dimension, the bucket row as it last learned it from the store: the
//! row its own write produced, the row a read returned, or the current row a failed
//! condition handed back. Other clients and processes change that row all the time, so
//! what a client remembers is a cache with these rules, all held by `Remembered`:
//!
//! 1. **A grant never comes from memory.** A remembered row is only where a conditional
//!    write starts from, and the write applies only if the stored row is still exactly that
//!    row: version, tokens, refill timestamp and definition (see
//!    [`BucketWrite`](crate::store::BucketWrite)). A write that fails hands back the current
//!    row, which replaces the remembered one whatever its version: a bucket deleted and
//!    created again, or re-seeded by another tool, is simply the new truth. The one
//!    exception is [`Prefetch`](crate::Prefetch), with its written bound.
//! 2. **A denial comes from the store first.** The first denial on a dimension is computed
//!    from a row the store has just confirmed: one this client's write just produced, or
//!    one a read or a failed condition just returned. It opens a *denial window* that ends
//!    at its RetryIn. A write of this client's that leaves the bucket unable to serve its
//!    `cost_per_call` at its lowest priority (above every reserve) opens one too, until it
//!    can: the row it wrote is the store's. Each denial in a window is computed for its own
//!    request and priority.
//! 3. **Inside a denial window, denials come from memory**, with no call, each exact for the
//!    remembered row, until the window ends or until any denial this client answered on the
//!    dimension reaches its RetryIn (its caller may be asking again): then the next denial
//!    comes from the store again (rule 2). A denial is never derived again from a row nobody
//!    has looked at since a RetryIn ran out.
//! 4. **A short `concurrent` bucket is remembered for at most the slot poll interval**
//!    ([`Config::slot_poll`](crate::Config::slot_poll), 300 ms by default, spaced further
//!    when many clients wait on it: see [`Waiting`](crate::store::Waiting)): its tokens come
//!    back only through releases, which memory cannot see. Its RetryIn is a good time to
//!    look again: while any live lease could be released by its holder, the poll
//!    interval, or sooner if a lease may be given back sooner (its expiry plus the
//!    clock-skew margin); while a cool-down after a vendor's 429 holds every slot (nobody
//!    releases it, and no release reopens the bucket), exactly until it ends; the poll
//!    interval when no live lease shows.
//! 5. **`CostExceedsCapacity` is confirmed by the store** before it is answered, so a
//!    capacity raised elsewhere is seen at once.
//! 6. **A waiting caller** ([`Sluice::acquire_within`](crate::Sluice::acquire_within) and the
//!    waits of slots, `#[rate_limited]` and the layers, all built on it) accepts a denial
//!    only from a row learned after its wait began, and on a `concurrent` bucket waits at
//!    most one jittered poll interval at a time.
//! 7. **A store error forgets the row**: the write may or may not have applied. A write
//!    pushed back (the row throttled, or held by a transaction) applied nothing: the row
//!    is kept for refusals, but the next write is computed from the row read again (others
//!    wrote it meanwhile, and a write computed from what was remembered would most often
//!    fail its condition, a billed write on a row already at its ceiling).
//!
//! What a RetryIn promises follows from these rules. It is exact for the row it was
//! computed from: one millisecond earlier that row could not serve the request, at the
//! delay it can. That row is the store's own, as of the start of the current denial
//! window. Against the live bucket a RetryIn may be **early** (other clients took tokens
//! since: the retry is refused with a new, exact RetryIn), and it is **never late** except
//! when tokens came back other than by refill since that row was read (a refund, a
//! reconciled lease, a raised limit, a lowered reserve): the window ends at the RetryIn
//! itself, so the retry that follows always looks at the store. A short `concurrent`
//! bucket's RetryIn is at most the poll interval while a holder may release a slot (rule
//! 4), so a slot freed by any process is found by a caller that asks again at its RetryIn.

mod pace;

use std::collections::BTreeSet;
use std::time::Duration;

use crate::acquire::Wanted;
use crate::bucket::{BucketState, Take};
use crate::clock::UnixMillis;
use crate::tokens::Tokens;

/// The shortest RetryIn: a denial never says "now".
const MIN_RETRY_IN: Duration = Duration::from_millis(1);

/// `wait` as a RetryIn: at least [`MIN_RETRY_IN`].
pub(crate) fn retry_in(wait: Duration) -> Duration {
    wait.max(MIN_RETRY_IN)
}

/// The most outstanding denials memory keeps track of; beyond it, denials come from the
/// store until it is consulted again.
const MAX_OUTSTANDING: usize = 64;

/// What a client remembers of one dimension's bucket row.
#[derive(Debug, Default)]
pub(crate) struct Remembered {
    row: Option<BucketState>,
    /// When the row was learned from the store, by the client's clock.
    learned_at: UnixMillis,
    /// Denial windows (rules 3 and 4): denials may come from `row` until each one's end, for
    /// requests whose priority must leave at least its floor (a row short for one priority
    /// says nothing of a priority that may take more of it). One per floor.
    windows: Vec<Window>,
    /// When the RetryIns this client answered on the dimension end, for those that had not
    /// ended when the store was last consulted (rule 3).
    outstanding: BTreeSet<UnixMillis>,
    /// The latest end of a RetryIn that did not fit in `outstanding`: memory answers no
    /// refusal until the store is consulted after it.
    overflow_until: Option<UnixMillis>,
    /// For a short `concurrent` row: when its leases were looked up, what they said, and
    /// when the RetryIn answered from them ends. Cleared whenever the row changes.
    slots_back: Option<(UnixMillis, SlotsBack, UnixMillis)>,
    /// Tokens this client took ahead (see [`Prefetch`](crate::Prefetch)).
    reservoir: Option<Reservoir>,
    /// Whether a row was ever learned here (kept when it is forgotten).
    seen: bool,
    /// Whether the row last learned was in shadow mode (kept when it is forgotten).
    shadow: bool,
    /// Whether a write of this client was pushed back since the row was learned (rule 7).
    stale: bool,
    /// Whether a write of this client to the row ever applied (kept when it is forgotten).
    wrote: bool,
    /// How often other writers write the row (kept when it is forgotten).
    pace: pace::Pace,
    /// The last epoch this client counted itself among the clients waiting for a slot
    /// (see [`Waiting`](crate::bucket::Waiting); kept when the row is forgotten).
    counted_in: Option<u64>,
}

/// What the live leases of a short `concurrent` bucket say about when a slot comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SlotsBack {
    /// The earliest time one of them may be given back by anyone but its holder (its
    /// expiry plus the clock-skew margin), if one showed.
    pub(crate) earliest: Option<UnixMillis>,
    /// Whether one of them could be released by its holder at any moment (any lease but a
    /// cool-down after a vendor's 429).
    pub(crate) releasable: bool,
    /// When the last live cool-down comes back, if one showed: each holds every slot, so
    /// nothing is granted before then, whatever is released.
    pub(crate) cooling_until: Option<UnixMillis>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    floor: Tokens,
    until: UnixMillis,
}

#[derive(Debug, Clone, Copy)]
struct Reservoir {
    tokens: Tokens,
    until: UnixMillis,
}

/// What memory says about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recall {
    /// Nothing remembered: read the row.
    Nothing,
    /// The remembered row would serve it: write from it (the write's condition decides).
    Serves,
    /// Refused from memory (rule 3 or 4), with this RetryIn.
    Denied(Duration),
    /// The remembered row refuses it, but that refusal must come from the store: read it.
    Unconfirmed,
}

impl Remembered {
    /// The remembered row.
    pub(crate) fn row(&self) -> Option<&BucketState> {
        self.row.as_ref()
    }

    /// The remembered row to compute a conditional write from: none after a write was
    /// pushed back (rule 7), until the row is learned again.
    pub(crate) fn row_to_write(&self) -> Option<&BucketState> {
        self.row.as_ref().filter(|_| !self.stale)
    }

    /// A write of this client was throttled, or refused while a transaction held the row
    /// (rule 7).
    pub(crate) fn pushed_back(&mut self) {
        self.stale = true;
    }

    /// Whether `wanted` is taken in [shadow mode](crate::Mode::Shadow): asked in shadow (by
    /// a client in shadow), or of a row last learned in shadow, forgotten since or not. A
    /// shadow take is never refused: it is always written, or granted unrecorded.
    pub(crate) fn takes_in_shadow(&self, wanted: &Wanted) -> bool {
        wanted.shadow || self.shadow
    }

    /// Whether a write of this client to the row ever applied, forgotten since or not (see
    /// [`Want::herd`](crate::bucket::Want)).
    pub(crate) fn wrote(&self) -> bool {
        self.wrote
    }

    /// Whether this client is to count itself among the clients waiting for a slot in
    /// `epoch`: once an epoch.
    pub(crate) fn count_in(&mut self, epoch: u64) -> bool {
        let first = self.counted_in != Some(epoch);
        self.counted_in = Some(epoch);
        first
    }

    /// The waiting callers as this client's count left them: the row's new counts (the
    /// count changed nothing else in it).
    pub(crate) fn learn_waiting(&mut self, waiting: crate::bucket::Waiting) {
        if let Some(row) = self.row.as_mut() {
            row.waiting = waiting;
        }
    }

    /// When the remembered row was learned from the store, by the client's clock.
    pub(crate) fn learned_at(&self) -> UnixMillis {
        self.learned_at
    }

    /// Whether the row was short of a call when it was learned (callers queued in its
    /// debt, or refused): then it likely still is, however much refill the time since
    /// would count, as a queue's callers come back for their next turn.
    pub(crate) fn seen_short(&self) -> bool {
        self.row
            .as_ref()
            .is_some_and(|r| r.available(self.learned_at) < r.bucket.cost_per_call())
    }

    /// Takes `row`, just learned from the store at `now`, as the truth (whatever its
    /// version). A denial window belongs to the row that opened it.
    pub(crate) fn learn(&mut self, row: BucketState, now: UnixMillis) {
        self.learn_as(row, now, false);
    }

    /// Other writers' writes a second to the row, in thousandths, as last measured (see
    /// [`Want::others_per_ks`](crate::bucket::Want)).
    pub(crate) fn others_per_ks(&self) -> u64 {
        self.pace.others_per_ks()
    }

    /// [`Remembered::learn`], the row produced by this client's own write when `own`.
    fn learn_as(&mut self, row: BucketState, now: UnixMillis, own: bool) {
        self.pace.note(row.version, now, own);
        if self.row.as_ref() != Some(&row) {
            self.slots_back = None;
        }
        self.shadow = row.bucket.mode() == crate::bucket::Mode::Shadow;
        self.row = Some(row);
        self.seen = true;
        self.stale = false;
        self.learned_at = now;
        self.windows.clear();
        // A RetryIn ending at this millisecond or before has run out: the bucket could
        // serve it from then on, and this look is that late or later.
        self.outstanding.retain(|end| *end > now);
        self.overflow_until = self.overflow_until.filter(|end| *end > now);
    }

    /// Takes `row`, which this client's own write just produced at `now`, as the truth; if
    /// it cannot serve the bucket's `cost_per_call` at its lowest priority (above every
    /// reserve), that is a denial the store confirmed (rule 2).
    pub(crate) fn learn_written(&mut self, row: BucketState, now: UnixMillis) {
        let lowest = row.bucket.reserved();
        let short = match row.take_above(row.bucket.cost_per_call(), lowest, now) {
            Take::Short { wait: Some(wait) } => Some(wait),
            _ => None,
        };
        self.learn_as(row, now, true);
        self.wrote = true;
        if let Some(wait) = short {
            self.confirm_short(now, wait, lowest);
        }
    }

    /// Closes the denial window: a refusal the store gave for part of a request that was
    /// answered otherwise (its caller got another error) is not a denial anyone was told.
    pub(crate) fn withdraw_denials(&mut self) {
        self.windows.clear();
    }

    /// The end of the denial window that holds at `now` for a request that must leave
    /// `floor`, if any.
    fn window_until(&self, floor: Tokens, now: UnixMillis) -> Option<UnixMillis> {
        self.windows
            .iter()
            .filter(|w| w.floor <= floor && now < w.until)
            .map(|w| w.until)
            .max()
    }

    /// Opens (or extends) the denial window for requests leaving at least `floor`.
    fn open_window(&mut self, floor: Tokens, until: UnixMillis, extend: bool) {
        match self.windows.iter_mut().find(|w| w.floor == floor) {
            Some(w) if extend => w.until = w.until.max(until),
            Some(w) => w.until = until,
            None => self.windows.push(Window { floor, until }),
        }
    }

    /// Forgets everything about the row (rule 7, or the bucket was deleted).
    pub(crate) fn forget(&mut self) {
        *self = Remembered {
            reservoir: self.reservoir,
            outstanding: std::mem::take(&mut self.outstanding),
            overflow_until: self.overflow_until,
            seen: self.seen,
            shadow: self.shadow,
            wrote: self.wrote,
            pace: self.pace,
            counted_in: self.counted_in,
            ..Remembered::default()
        };
    }

    /// Whether the remembered row is a `concurrent` bucket's.
    pub(crate) fn holds_slots(&self) -> bool {
        self.row
            .as_ref()
            .is_some_and(|r| !r.bucket.limit_type().refills())
    }

    /// What memory may answer to `wanted` at `now`. `fresh_after`: a waiting caller's wait
    /// began then, and it accepts a denial only from a row learned since (rule 6).
    pub(crate) fn recall(
        &self,
        wanted: &Wanted,
        now: UnixMillis,
        fresh_after: Option<UnixMillis>,
    ) -> Recall {
        let Some(row) = &self.row else {
            return Recall::Nothing;
        };
        if self.takes_in_shadow(wanted) {
            return Recall::Serves;
        }
        let floor = wanted.floor(&row.bucket);
        let window = self.window_until(floor, now);
        let in_window = window.is_some()
            && fresh_after.is_none_or(|t| self.learned_at > t)
            && self.overflow_until.is_none()
            && self.outstanding.first().is_none_or(|end| now < *end);
        match wanted.take_from(row, now) {
            Take::Granted { .. } => Recall::Serves,
            Take::ExceedsCapacity | Take::ExceedsShare { .. } => Recall::Unconfirmed,
            Take::Short { .. } if !in_window => Recall::Unconfirmed,
            Take::Short { wait: Some(wait) } => Recall::Denied(retry_in(wait)),
            Take::Short { wait: None } => {
                // The RetryIn the store's answer gave, counted down (the window ends there,
                // or at the poll interval when that is sooner).
                let until = self
                    .slots_back
                    .map(|(_, _, end)| end)
                    .filter(|end| *end > now)
                    .or(window)
                    .unwrap_or(now);
                Recall::Denied(retry_in(until.saturating_since(now)))
            }
        }
    }

    /// The store confirmed the remembered row short of a refilling bucket's tokens at `now`
    /// for `wait`, for a request leaving `floor`: denials to requests leaving at least as
    /// much may come from memory until then (rule 2).
    pub(crate) fn confirm_short(&mut self, now: UnixMillis, wait: Duration, floor: Tokens) {
        self.open_window(floor, now.saturating_add(wait), true);
    }

    /// A RetryIn ending at `end` was answered on this dimension: once it has passed, its
    /// caller may ask again, and that answer comes from the store (rule 3).
    pub(crate) fn answered(&mut self, end: UnixMillis) {
        if self.outstanding.len() < MAX_OUTSTANDING {
            self.outstanding.insert(end);
        } else {
            self.overflow_until = Some(self.overflow_until.map_or(end, |u| u.max(end)));
        }
    }

    /// What the live leases of the remembered (short, `concurrent`) row said, if looked up
    /// for this very row and their earliest give-back has not passed: no need to look
    /// again (any lease taken or given back since would have changed the row). That no
    /// live lease showed holds at most `poll`: the lease index may lag a lease just written.
    pub(crate) fn slots_back(&self, now: UnixMillis, poll: Duration) -> Option<SlotsBack> {
        match self.slots_back? {
            (_, back, _) if back.earliest.is_some_and(|t| t > now) => Some(back),
            (looked, back, _) if back.earliest.is_none() && now < looked.saturating_add(poll) => {
                Some(back)
            }
            _ => None,
        }
    }

    /// The store confirmed the remembered `concurrent` row short at `now`, its live leases
    /// saying `back`. Returns the RetryIn, and remembers the shortage until then, at most
    /// `poll` (rule 4).
    pub(crate) fn confirm_slots_short(
        &mut self,
        now: UnixMillis,
        back: SlotsBack,
        poll: Duration,
        floor: Tokens,
    ) -> Duration {
        let retry_in = slot_retry_in(back, now, poll);
        self.slots_back = Some((now, back, now.saturating_add(retry_in)));
        self.open_window(floor, now.saturating_add(retry_in.min(poll)), false);
        retry_in
    }

    /// Takes `cost` from the prefetched tokens, if they are still fresh and enough.
    pub(crate) fn take_prefetched(&mut self, wanted: &Wanted, now: UnixMillis) -> Option<Tokens> {
        let reservoir = self.reservoir.as_mut()?;
        if now >= reservoir.until {
            // Held too long: dropped, never granted (the overshoot bound depends on it).
            self.reservoir = None;
            return None;
        }
        let row = self.row.as_ref()?;
        if row.bucket.keeps_leases() {
            // Redefined since: prefetched tokens are only ever a lean bucket's.
            self.reservoir = None;
            return None;
        }
        let cost = wanted.cost(row.bucket.cost_per_call());
        if cost > reservoir.tokens {
            return None;
        }
        reservoir.tokens -= cost;
        Some(cost)
    }

    /// Whether the prefetched tokens would serve `wanted` at `now` (fresh and enough); this
    /// only looks.
    pub(crate) fn prefetched_serves(&self, wanted: &Wanted, now: UnixMillis) -> bool {
        match (&self.reservoir, &self.row) {
            (Some(reservoir), Some(row)) => {
                now < reservoir.until
                    && !row.bucket.keeps_leases()
                    && wanted.cost(row.bucket.cost_per_call()) <= reservoir.tokens
            }
            _ => false,
        }
    }

    /// Replaces what is left of an earlier prefetch (too little, or stale) with `tokens`,
    /// grantable until `until`; `None` drops it.
    pub(crate) fn set_prefetched(&mut self, prefetched: Option<(Tokens, UnixMillis)>) {
        self.reservoir = prefetched.map(|(tokens, until)| Reservoir { tokens, until });
    }
}

/// The RetryIn of a `concurrent` bucket found short at `now` (rule 4): exactly until the
/// last cool-down ends while one holds the slots; else the poll interval while a holder
/// may release a lease at any moment (sooner if a lease may be given back sooner); the
/// poll interval when no live lease showed.
pub(crate) fn slot_retry_in(back: SlotsBack, now: UnixMillis, poll: Duration) -> Duration {
    if let Some(cooling) = back.cooling_until.filter(|t| *t > now) {
        return retry_in(cooling.saturating_since(now));
    }
    let until_back = back
        .earliest
        .filter(|t| *t > now)
        .map(|t| t.saturating_since(now));
    retry_in(match until_back {
        Some(wait) if back.releasable => wait.min(poll),
        Some(wait) => wait,
        None => poll,
    })
}

#[cfg(test)]
mod tests;
