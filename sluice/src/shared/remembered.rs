//! What a client remembers of each bucket row, and when it may answer from it: the
//! freshness model.
//!
//! A client keeps, per dimension, the bucket row as it last learned it from the store: the
//! row its own write produced, the row a read returned, or the current row a failed
//! condition handed back. Other clients and processes change that row all the time, so
//! what a client remembers is a cache with these rules, all held by [`Remembered`]:
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
//!    `cost_per_call` opens one too, until it can: the row it wrote is the store's.
//! 3. **Inside a denial window, denials come from memory**, with no call, each exact for the
//!    remembered row, until the window ends or until any denial this client answered on the
//!    dimension reaches its RetryIn (its caller may be asking again): then the next denial
//!    comes from the store again (rule 2). A denial is never derived again from a row nobody
//!    has looked at since a RetryIn ran out.
//! 4. **A short `concurrent` bucket is remembered for at most the slot poll interval**
//!    ([`Config::slot_poll`](crate::Config::slot_poll), 300 ms by default): its tokens come
//!    back only through releases, which memory cannot see. Its RetryIn is the earliest
//!    time one of its live leases may be given back (its expiry plus the clock-skew
//!    margin; an upper bound: a release may free a slot sooner), or the poll interval when
//!    no live lease shows.
//! 5. **`CostExceedsCapacity` is confirmed by the store** before it is answered, so a
//!    capacity raised elsewhere is seen at once.
//! 6. **A waiting caller** ([`Sluice::acquire_within`](crate::Sluice::acquire_within) and the
//!    waits of slots, `#[rate_limited]` and the layers, all built on it) accepts a denial
//!    only from a row learned after its wait began, and on a `concurrent` bucket waits at
//!    most one jittered poll interval at a time.
//! 7. **A store error forgets the row**: the write may or may not have applied.
//!
//! What a RetryIn promises follows from these rules. It is exact for the row it was
//! computed from: one millisecond earlier that row could not serve the request, at the
//! delay it can. That row is the store's own, as of the start of the current denial
//! window. Against the live bucket a RetryIn may be **early** (other clients took tokens
//! since: the retry is refused with a new, exact RetryIn), and it is **never late** except
//! when tokens came back other than by refill since that row was read (a refund, a
//! reconciled lease, a raised limit, a released slot): the window ends at the RetryIn
//! itself, so the retry that follows always looks at the store.

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
    /// Denials may come from `row` until this time (rules 3 and 4).
    denials_until: Option<UnixMillis>,
    /// When the RetryIns this client answered on the dimension end, for those that had not
    /// ended when the store was last consulted (rule 3).
    outstanding: BTreeSet<UnixMillis>,
    /// The latest end of a RetryIn that did not fit in `outstanding`: memory answers no
    /// refusal until the store is consulted after it.
    overflow_until: Option<UnixMillis>,
    /// For a short `concurrent` row: when its leases were looked up, and the earliest time
    /// one of the live ones may be given back, when one showed (`None`: none did). Cleared whenever the
    /// row changes.
    slots_back: Option<(UnixMillis, Option<UnixMillis>)>,
    /// Tokens this client took ahead (see [`Prefetch`](crate::Prefetch)).
    reservoir: Option<Reservoir>,
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
    /// The remembered row, to compute a conditional write from.
    pub(crate) fn row(&self) -> Option<&BucketState> {
        self.row.as_ref()
    }

    /// Takes `row`, just learned from the store at `now`, as the truth (whatever its
    /// version). A denial window belongs to the row that opened it.
    pub(crate) fn learn(&mut self, row: BucketState, now: UnixMillis) {
        if self.row.as_ref() != Some(&row) {
            self.slots_back = None;
        }
        self.row = Some(row);
        self.learned_at = now;
        self.denials_until = None;
        // A RetryIn ending at this millisecond or before has run out: the bucket could
        // serve it from then on, and this look is that late or later.
        self.outstanding.retain(|end| *end > now);
        self.overflow_until = self.overflow_until.filter(|end| *end > now);
    }

    /// Takes `row`, which this client's own write just produced at `now`, as the truth; if
    /// it cannot serve the bucket's `cost_per_call`, that is a denial the store confirmed
    /// (rule 2).
    pub(crate) fn learn_written(&mut self, row: BucketState, now: UnixMillis) {
        let short = match row.take(row.bucket.cost_per_call(), now) {
            Take::Short { wait: Some(wait) } => Some(wait),
            _ => None,
        };
        self.learn(row, now);
        if let Some(wait) = short {
            self.confirm_short(now, wait);
        }
    }

    /// Closes the denial window: a refusal the store gave for part of a request that was
    /// answered otherwise (its caller got another error) is not a denial anyone was told.
    pub(crate) fn withdraw_denials(&mut self) {
        self.denials_until = None;
    }

    /// The leases `ids` are no longer kept in the row (released without a new version).
    pub(crate) fn drop_held(&mut self, ids: &[String]) {
        if let Some(row) = self.row.as_mut() {
            row.held.retain(|h| !ids.contains(&h.id));
        }
    }

    /// Forgets everything about the row (rule 7, or the bucket was deleted).
    pub(crate) fn forget(&mut self) {
        *self = Remembered {
            reservoir: self.reservoir,
            outstanding: std::mem::take(&mut self.outstanding),
            overflow_until: self.overflow_until,
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
        let in_window = self.denials_until.is_some_and(|until| now < until)
            && fresh_after.is_none_or(|t| self.learned_at > t)
            && self.overflow_until.is_none()
            && self.outstanding.first().is_none_or(|end| now < *end);
        match wanted.take_from(row, now) {
            Take::Granted { .. } => Recall::Serves,
            Take::ExceedsCapacity | Take::ExceedsShare { .. } => Recall::Unconfirmed,
            Take::Short { .. } if !in_window => Recall::Unconfirmed,
            Take::Short { wait: Some(wait) } => Recall::Denied(retry_in(wait)),
            Take::Short { wait: None } => {
                let back = self
                    .slots_back
                    .and_then(|(_, back)| back)
                    .filter(|t| *t > now);
                let until = back.or(self.denials_until).unwrap_or(now);
                Recall::Denied(retry_in(until.saturating_since(now)))
            }
        }
    }

    /// The store confirmed the remembered row short of a refilling bucket's tokens at `now`
    /// for `wait`: denials may come from memory until then (rule 2).
    pub(crate) fn confirm_short(&mut self, now: UnixMillis, wait: Duration) {
        let until = now.saturating_add(wait);
        self.denials_until = Some(self.denials_until.map_or(until, |u| u.max(until)));
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

    /// When the first live lease of the remembered (short, `concurrent`) row may be given
    /// back, if looked up for this very row and not passed: no need to look again (any
    /// lease taken or given back since would have changed the row). That no live lease
    /// showed holds at most `poll`: the lease index may lag a lease just written.
    pub(crate) fn slots_back(&self, now: UnixMillis, poll: Duration) -> Option<Option<UnixMillis>> {
        match self.slots_back? {
            (_, Some(back)) if back > now => Some(Some(back)),
            (looked, None) if now < looked.saturating_add(poll) => Some(None),
            _ => None,
        }
    }

    /// The store confirmed the remembered `concurrent` row short at `now`, with `back` when
    /// the first of its live leases may be given back (`None`: none showed). Returns the RetryIn, and
    /// remembers the shortage for at most `poll` (rule 4).
    pub(crate) fn confirm_slots_short(
        &mut self,
        now: UnixMillis,
        back: Option<UnixMillis>,
        poll: Duration,
    ) -> Duration {
        let retry_in = slot_retry_in(back, now, poll);
        self.slots_back = Some((now, back));
        self.denials_until = Some(now.saturating_add(retry_in.min(poll)));
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

    /// Replaces what is left of an earlier prefetch (too little, or stale) with `tokens`,
    /// grantable until `until`; `None` drops it.
    pub(crate) fn set_prefetched(&mut self, prefetched: Option<(Tokens, UnixMillis)>) {
        self.reservoir = prefetched.map(|(tokens, until)| Reservoir { tokens, until });
    }
}

/// The RetryIn of a `concurrent` bucket found short at `now`: until the first live lease may
/// be given back (`back`), or the poll interval when no live lease showed.
pub(crate) fn slot_retry_in(back: Option<UnixMillis>, now: UnixMillis, poll: Duration) -> Duration {
    retry_in(
        back.filter(|t| *t > now)
            .map_or(poll, |t| t.saturating_since(now)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acquire::Acquire;
    use crate::bucket::Bucket;
    use crate::tokens::RefillRate;

    fn t(ms: i64) -> UnixMillis {
        UnixMillis::new(1_700_000_000_000 + ms)
    }

    fn wanted(cost: i64) -> Wanted {
        Acquire::with_cost("v#rpm", cost)
            .resolve()
            .unwrap()
            .remove(0)
    }

    fn empty_row(bucket: Bucket) -> BucketState {
        let mut row = BucketState::full("v#rpm".parse().unwrap(), bucket, t(0));
        row.tokens = Tokens::ZERO;
        row
    }

    #[test]
    fn a_denial_from_memory_needs_a_window_the_store_opened() {
        let mut memory = Remembered::default();
        assert_eq!(memory.recall(&wanted(1), t(0), None), Recall::Nothing);
        // 10 per second, empty: 1 token is 100 ms away.
        memory.learn(
            empty_row(Bucket::requests(RefillRate::per_second(10))),
            t(0),
        );
        assert_eq!(memory.recall(&wanted(1), t(0), None), Recall::Unconfirmed);
        memory.confirm_short(t(0), Duration::from_millis(100));
        assert_eq!(
            memory.recall(&wanted(1), t(40), None),
            Recall::Denied(Duration::from_millis(60))
        );
        // A larger cost, inside the window: exact for the same row.
        assert_eq!(
            memory.recall(&wanted(3), t(40), None),
            Recall::Denied(Duration::from_millis(260))
        );
        // The window ends at the RetryIn: then the row serves 1, but 3 must ask the store.
        assert_eq!(memory.recall(&wanted(1), t(100), None), Recall::Serves);
        assert_eq!(memory.recall(&wanted(3), t(100), None), Recall::Unconfirmed);
        // A waiter that began waiting after the row was learned does not take it.
        assert_eq!(
            memory.recall(&wanted(3), t(50), Some(t(10))),
            Recall::Unconfirmed
        );
        assert_eq!(
            memory.recall(&wanted(3), t(50), Some(t(0))),
            Recall::Unconfirmed
        );
        // A new row closes the window.
        memory.learn(
            empty_row(Bucket::requests(RefillRate::per_second(10))),
            t(60),
        );
        assert_eq!(memory.recall(&wanted(1), t(60), None), Recall::Unconfirmed);
    }

    #[test]
    fn a_write_that_empties_the_bucket_opens_a_window_until_it_can_serve_a_call() {
        let mut memory = Remembered::default();
        memory.learn_written(
            empty_row(Bucket::requests(RefillRate::per_second(10))),
            t(0),
        );
        assert_eq!(
            memory.recall(&wanted(1), t(30), None),
            Recall::Denied(Duration::from_millis(70))
        );
        assert_eq!(memory.recall(&wanted(1), t(100), None), Recall::Serves);
        // A write that leaves enough for a call opens none: a refusal of more asks the store.
        let mut row = empty_row(Bucket::requests(RefillRate::per_second(10)));
        row.tokens = Tokens::new(5);
        memory.learn_written(row, t(200));
        assert_eq!(memory.recall(&wanted(9), t(200), None), Recall::Unconfirmed);
    }

    #[test]
    fn memory_stops_answering_once_any_answered_retry_in_runs_out() {
        let mut memory = Remembered::default();
        memory.learn(
            empty_row(Bucket::requests(RefillRate::per_second(10))),
            t(0),
        );
        // A store denial of 5 tokens opens a 500 ms window; one of 1 token was answered too,
        // ending at 100 ms.
        memory.confirm_short(t(0), Duration::from_millis(500));
        memory.answered(t(500));
        memory.answered(t(100));
        assert_eq!(
            memory.recall(&wanted(4), t(50), None),
            Recall::Denied(Duration::from_millis(350))
        );
        // At 100 ms the 1-token caller may be back: from then on, the store answers.
        assert_eq!(memory.recall(&wanted(4), t(100), None), Recall::Unconfirmed);
        // A look at the store drops the RetryIns that ended before it.
        memory.learn(
            empty_row(Bucket::requests(RefillRate::per_second(10))),
            t(120),
        );
        memory.confirm_short(t(120), Duration::from_millis(400));
        assert_eq!(
            memory.recall(&wanted(4), t(130), None),
            Recall::Denied(Duration::from_millis(270))
        );
        // The 500 ms one is still outstanding.
        assert_eq!(
            memory.recall(&wanted(9), t(499), None),
            Recall::Denied(Duration::from_millis(401))
        );
        assert_eq!(memory.recall(&wanted(9), t(500), None), Recall::Unconfirmed);
    }

    #[test]
    fn retry_ins_beyond_what_memory_tracks_stop_memory_answers_until_the_next_look() {
        let mut memory = Remembered::default();
        memory.learn(
            empty_row(Bucket::requests(RefillRate::per_second(10))),
            t(0),
        );
        memory.confirm_short(t(0), Duration::from_secs(10));
        for i in 0..MAX_OUTSTANDING as i64 {
            memory.answered(t(5_000 + i));
        }
        assert!(matches!(
            memory.recall(&wanted(5), t(10), None),
            Recall::Denied(_)
        ));
        // One more does not fit: until a look after it, refusals come from the store.
        memory.answered(t(200));
        assert_eq!(memory.recall(&wanted(5), t(10), None), Recall::Unconfirmed);
        memory.learn(
            empty_row(Bucket::requests(RefillRate::per_second(10))),
            t(100),
        );
        memory.confirm_short(t(100), Duration::from_secs(10));
        assert_eq!(memory.recall(&wanted(5), t(150), None), Recall::Unconfirmed);
        memory.learn(
            empty_row(Bucket::requests(RefillRate::per_second(10))),
            t(200),
        );
        memory.confirm_short(t(200), Duration::from_secs(10));
        assert!(matches!(
            memory.recall(&wanted(5), t(250), None),
            Recall::Denied(_)
        ));
    }

    #[test]
    fn a_short_slot_bucket_is_remembered_at_most_the_poll_interval() {
        let poll = Duration::from_millis(300);
        let mut memory = Remembered::default();
        memory.learn(empty_row(Bucket::concurrent(2)), t(0));
        assert_eq!(memory.recall(&wanted(1), t(0), None), Recall::Unconfirmed);
        // The earliest lease expires in 60 s: that is the RetryIn, remembered 300 ms.
        let back = Some(t(60_000));
        assert_eq!(
            memory.confirm_slots_short(t(0), back, poll),
            Duration::from_secs(60)
        );
        assert_eq!(memory.slots_back(t(100), poll), Some(back));
        assert_eq!(
            memory.recall(&wanted(1), t(100), None),
            Recall::Denied(Duration::from_millis(59_900))
        );
        assert_eq!(memory.recall(&wanted(1), t(300), None), Recall::Unconfirmed);
        // Read again, unchanged: the lookup still holds; changed: it is looked up again.
        let row = memory.row().cloned().unwrap();
        memory.learn(row.clone(), t(300));
        assert_eq!(memory.slots_back(t(300), poll), Some(back));
        memory.learn(
            BucketState {
                version: row.version + 1,
                ..row
            },
            t(300),
        );
        assert_eq!(memory.slots_back(t(300), poll), None);
        // No live lease explains the shortage: look again after the poll interval.
        assert_eq!(memory.confirm_slots_short(t(300), None, poll), poll);
        assert_eq!(
            memory.recall(&wanted(1), t(400), None),
            Recall::Denied(Duration::from_millis(200))
        );
        // That no lease showed holds the poll interval for the same row, no longer.
        memory.learn(memory.row().cloned().unwrap(), t(450));
        assert_eq!(memory.slots_back(t(450), poll), Some(None));
        assert_eq!(memory.slots_back(t(600), poll), None);
        // A cost above the capacity is never answered from memory.
        assert_eq!(memory.recall(&wanted(3), t(400), None), Recall::Unconfirmed);
    }

    #[test]
    fn a_row_whose_version_went_down_replaces_the_remembered_one() {
        let mut memory = Remembered::default();
        let mut newer = empty_row(Bucket::requests(RefillRate::per_second(10)));
        newer.version = 42;
        memory.learn(newer, t(0));
        let reseeded = BucketState::full(
            "v#rpm".parse().unwrap(),
            Bucket::requests(RefillRate::per_second(10)),
            t(5),
        );
        memory.learn(reseeded.clone(), t(5));
        assert_eq!(memory.row(), Some(&reseeded));
    }
}
