//! Changes to a bucket's level that commute: another writer's change, made between this
//! writer's last look at the row and its write, cannot make it fail, and it never
//! overwrites one. Pure: no I/O.
//!
//! Many processes write one bucket row. A write conditioned on the exact row it was
//! computed from (a version) loses every race, and every lost race is billed. A
//! [`Commute`] instead adds to or subtracts from the stored tokens (`ADD` on DynamoDB), on
//! conditions about the row as it stands when the write applies that guarantee the change
//! is right *whatever other writers did since*: the bucket holds what the grants need,
//! and adding to the stored tokens is the same as adding to the bucket's level (which is
//! the stored tokens plus the refill since the refill timestamp, capped at what the
//! bucket holds: the cap is what a plain addition could get wrong).
//!
//! | kind | when (from the remembered row) | change | conditions |
//! |---|---|---|---|
//! | take | the stored tokens alone serve the grants | `tokens += restored - taken` | `tokens ≥ need`, `tokens ≤ holds - restored - refill`, `last_refill_at ≥ anchor` |
//! | credit | the refill since the anchor is needed too | `tokens += restored - taken` | `last_refill_at = anchor`, `need - refill ≤ tokens ≤ holds - restored - refill` |
//! | fold | as credit, once the anchor is older than the fold interval | `tokens += refill + restored - taken`, `last_refill_at = now`, carry | as credit |
//! | fill | the bucket is full (refill has reached what it holds) | `tokens = holds - taken - e`, `last_refill_at = now`, no carry | `last_refill_at ≤ x`, `tokens ≥ holds - restored - refill(x → now)`; or, for `k` of 0 to 2, `last_refill_at ≤ now - k`, `tokens ≥ holds - restored - refill(k ms) - e` |
//!
//! | fill ahead | as fill, on a row other writers write often (see [`ahead`]) | as fill | as fill; `last_refill_at` set `d` after `now` |
//! | take behind | a stale writer's first attempt at a full row others write often | `tokens += restored - taken` | `tokens ≥ need`, `tokens ≤ holds - restored`, `last_refill_at ≥ now` |
//! | herd | a writer's first write to a full row of a slowly refilling bucket (see [`herd`]) | `tokens += restored - taken`, `last_refill_at` set once, by the first | see [`herd`] |
//!
//! A fill ahead leaves the row refilling nothing for `d` (up to a second): its level stays
//! below full, so every write in that time is a take, and takes commute, where on a full
//! row each write would be a fill and fills landing out of the order they were computed
//! in fail. A take behind is a take as of `now` on a row stamped at `now` or later (nothing
//! refilled since: the stored tokens are the level). It fails when nobody filled the row
//! ahead of `now`, and the row handed back is then filled.
//!
//! Takes and credits commute with each other and with every restore: they never move the
//! refill timestamp. A fold or a fill moves it, so a credit computed from the old one
//! fails once (and is computed again from the row the failure hands back): folds happen at
//! most once per fold interval, and fills only when the bucket is full. A fill's
//! conditions say "the bucket is full now" for any row they accept, so two fills of a
//! bucket that refills faster than it is drained both apply; they fail only when the
//! bucket is not full any more (another writer took from it within the time it takes to
//! refill what this writer takes), and then a take applies.
//!
//! Refill timestamps are whole milliseconds, but a fill happens at a microsecond of one:
//! `e` is the refill from the start of that millisecond to the microsecond the writer's
//! clock reads ([`Clock::now_micros`](crate::Clock::now_micros); zero for a clock of
//! milliseconds). A fill stores the level it leaves less `e` as of the millisecond's
//! start, so refill counted from there gives it back exactly by that microsecond and never
//! twice; and it also accepts a row another fill left in the last few milliseconds when
//! the refill since, `e` included, covers what that one took. By milliseconds alone such a
//! change is right too, only stricter by `e`, whatever the clocks read.
//!
//! `concurrent` buckets do not refill: their changes are takes, and fills only when a
//! restore would overflow.

use std::time::Duration;

use super::refill::{Level, RefillCarry};
use super::state::BucketState;
use crate::clock::{UnixMillis, micros_within};
use crate::rate::PerMilli;
use crate::tokens::Tokens;

/// What a change does to the stored tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokensOp {
    /// Adds this many (negative: takes).
    Add(Tokens),
    /// Sets them to this many.
    Set(Tokens),
}

/// A condition on the stored row when a change applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// `tokens ≥` this.
    TokensAtLeast(Tokens),
    /// `tokens ≤` this.
    TokensAtMost(Tokens),
    /// `last_refill_at =` this.
    RefilledAt(UnixMillis),
    /// `last_refill_at ≥` this.
    RefilledSince(UnixMillis),
    /// `last_refill_at ≤` this.
    RefilledBy(UnixMillis),
    /// The row has no [`herd_at`](BucketState::herd_at).
    HerdAbsent,
    /// `last_refill_at = herd_at` (which the row has).
    StampIsHerd,
    /// `herd_at ≥` this (which the row has).
    HerdSince(UnixMillis),
}

impl Condition {
    /// Whether `row` satisfies it.
    pub fn holds(self, row: &BucketState) -> bool {
        match self {
            Condition::TokensAtLeast(t) => row.tokens >= t,
            Condition::TokensAtMost(t) => row.tokens <= t,
            Condition::RefilledAt(t) => row.last_refill_at == t,
            Condition::RefilledSince(t) => row.last_refill_at >= t,
            Condition::RefilledBy(t) => row.last_refill_at <= t,
            Condition::HerdAbsent => row.herd_at.is_none(),
            Condition::StampIsHerd => row.herd_at == Some(row.last_refill_at),
            Condition::HerdSince(t) => row.herd_at.is_some_and(|h| h >= t),
        }
    }
}

/// A change to a bucket's level that commutes with other writers' changes (see the module
/// documentation): what it does to the stored tokens, the refill timestamp and carry it
/// sets, if any, and the conditions the stored row must satisfy for it to be right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commute {
    /// What it does to the stored tokens.
    pub tokens: TokensOp,
    /// The refill timestamp and carry it sets (a fold or a fill), or `None` to leave them.
    /// A change that sets them also clears the row's [`herd_at`](BucketState::herd_at).
    pub refill: Option<(UnixMillis, RefillCarry)>,
    /// For a herd write (a process's first write to a full row, as a fleet starts): the
    /// refill timestamp it sets, and the row's [`herd_at`](BucketState::herd_at), when the
    /// row has no `herd_at`; else it sets the refill timestamp to the row's `herd_at`.
    /// `None` for every other change.
    pub herd: Option<UnixMillis>,
    /// What the stored row must satisfy.
    pub when: Vec<Condition>,
    /// Other sets of conditions, each of which makes the change right as well (for a fill:
    /// rows refilled within the last few milliseconds that are full by the microsecond the
    /// writer's clock reads, see [`Clock::now_micros`](crate::Clock::now_micros)): the
    /// change applies when every condition of `when` holds, or every one of a set here.
    pub or_when: Vec<Vec<Condition>>,
}

impl Commute {
    /// A change that applies on the one set of conditions `when` (no `or_when`).
    fn on(
        tokens: TokensOp,
        refill: Option<(UnixMillis, RefillCarry)>,
        when: Vec<Condition>,
    ) -> Self {
        Commute {
            tokens,
            refill,
            herd: None,
            when,
            or_when: Vec::new(),
        }
    }

    /// Whether `row` satisfies every condition of `when`, or every one of a set of
    /// `or_when`.
    pub fn holds(&self, row: &BucketState) -> bool {
        let all = |conditions: &[Condition]| conditions.iter().all(|c| c.holds(row));
        all(&self.when) || self.or_when.iter().any(|set| !set.is_empty() && all(set))
    }

    /// Whether it applies only to a row refilled later than `row` (the row it was computed
    /// from) was: a take from a row another writer filled ahead (see
    /// [`Want::behind`]).
    pub(crate) fn needs_later_refill(&self, row: &BucketState) -> bool {
        self.when
            .iter()
            .any(|c| matches!(c, Condition::RefilledSince(t) if *t > row.last_refill_at))
    }

    /// The [`herd_at`](BucketState::herd_at) `row` has once the change is applied to it.
    pub(crate) fn herd_after(&self, row: &BucketState) -> Option<UnixMillis> {
        match (self.refill, self.herd) {
            (Some(_), _) => None,
            (None, Some(stamp)) => Some(row.herd_at.unwrap_or(stamp)),
            (None, None) => row.herd_at,
        }
    }

    /// The level `row` has once the change is applied to it.
    pub fn applied(&self, row: &BucketState) -> Level {
        let tokens = match self.tokens {
            TokensOp::Add(delta) => row.tokens.saturating_add(delta),
            TokensOp::Set(tokens) => tokens,
        };
        match (self.refill, self.herd) {
            (Some((last_refill_at, carry)), _) => Level {
                tokens,
                last_refill_at,
                carry,
            },
            // A herd write drops the carry (see `herd`).
            (None, Some(stamp)) => Level {
                tokens,
                last_refill_at: row.herd_at.unwrap_or(stamp),
                carry: RefillCarry::ZERO,
            },
            (None, None) => Level {
                tokens,
                ..row.level()
            },
        }
    }
}

/// What a write asks of a bucket: give `restored` back, then take `taken`, the bucket
/// holding at least `need` once given back (the grants' costs and the reserves they must
/// leave, less the debt a waiting caller may leave; `None`: anything, even debt, as for a
/// charge after the fact). The level is capped at `ceiling` (what the bucket holds, or
/// more for a take larger than a vendor's burst: see [`BucketState::take_as`]). With
/// `fill` false, a row the refill since it was remembered would fill is taken from as if
/// it were not full (the writer last saw it short, so a queue is likely still in its debt):
/// the change then fails, once, if it is full after all. With `short` (the writer last saw
/// it short), a grant the stored tokens alone would serve is a credit all the same: in a
/// queue's debt the refill timestamp stands still while every waiter's take lowers the
/// stored tokens, so a take's floor on them, computed from a row a queue's turn old, fails
/// where the credit's floor (lower by the refill since the timestamp) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Want {
    pub(crate) restored: Tokens,
    pub(crate) taken: Tokens,
    pub(crate) need: Option<Tokens>,
    pub(crate) ceiling: Tokens,
    pub(crate) fill: bool,
    pub(crate) short: bool,
    /// How many writes a second (in thousandths) other writers made to the row, as this
    /// writer last measured it: a row they write often enough is filled ahead (see
    /// [`ahead`]).
    pub(crate) others_per_ks: u64,
    /// Whether a row the refill since it was remembered would fill is first taken from as
    /// another writer's fill stamped ahead leaves it (a stale writer's first attempt on a
    /// row others fill ahead): the change then fails, once, if nobody did.
    pub(crate) behind: bool,
    /// Whether a full row gets a herd write (see [`herd`](self::herd)).
    pub(crate) herd: Herd,
}

/// Whether a write's attempt on a full row of a slowly refilling bucket is a herd write
/// (see [`herd`](self::herd)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Herd {
    /// No: a retry (computed from the row the store handed back, which a fill's exact
    /// conditions fit), or not a write to a bucket's level.
    Not,
    /// The first attempt of this writer's first write to the row: a fleet's start, when
    /// every process's first write is computed from the row as it was before the others
    /// wrote. It leads a herd, or joins one under way.
    First,
    /// The first attempt of a later write: it joins a herd under way that others joined
    /// since this writer's last write (guessed where the stored tokens its last write left
    /// are at least two calls below full).
    Later,
}

impl Herd {
    /// A write's attempt: its first or a retry, by a writer that has had a write to the
    /// row applied or not.
    pub(crate) fn of(first_attempt: bool, wrote: bool) -> Herd {
        match (first_attempt, wrote) {
            (false, _) => Herd::Not,
            (true, false) => Herd::First,
            (true, true) => Herd::Later,
        }
    }
}

/// The longest a fill stamps a row ahead of its instant (see [`ahead`]).
const AHEAD_MILLIS: i64 = 1_000;

/// The fewest writes by others within the time a fill stamps the row ahead for a fill to
/// be stamped ahead at all (see [`ahead`]).
const AHEAD_WRITES: u64 = 64;

/// How far ahead of its instant a fill of `row` stamps the refill timestamp, when other
/// writers write the row at least [`AHEAD_WRITES`] times within it: at most
/// [`AHEAD_MILLIS`], and no longer than the refill of half of what the bucket holds
/// takes. Until then the row refills nothing, so its level stays below full and every
/// write in between is a take, which commutes with every other (where each write of a
/// full row would be a fill, and fills landing out of the order they were computed in
/// fail). The refill of that time is dropped (the bucket holds less, never more): within
/// it the bucket holds what it held at the fill less what was taken since, not its
/// capacity, so a burst late in it is refused up to that much sooner; and that much refill
/// is lost once when it turns to draining. `None`: stamped at its instant.
fn ahead(want: &Want, rate: PerMilli) -> Option<i64> {
    let half = Tokens::from_nanos(want.ceiling.as_nanos() / 2);
    let millis = millis_to_earn(half, rate)?.min(AHEAD_MILLIS);
    let writes = u128::from(want.others_per_ks) * u128::try_from(millis).ok()?;
    (millis > 0 && writes >= u128::from(AHEAD_WRITES) * 1_000_000).then_some(millis)
}

/// The change that does `want` to `row`'s bucket at `now` (`now_micros` to the
/// microsecond, by the same clock), computed from `row` (what this writer remembers; the
/// conditions make it right whatever the row has become), or `None` when `row` cannot
/// serve it. An anchor older than `fold_after` is folded.
pub(crate) fn commute(
    row: &BucketState,
    want: &Want,
    (now, now_micros): (UnixMillis, i64),
    fold_after: Duration,
) -> Option<Commute> {
    let net = want.restored - want.taken;
    let Some(rate) = row.bucket.effective_rate().per_milli() else {
        return without_refill(row, want, net);
    };
    let anchor = row.last_refill_at;
    // A clock behind the refill timestamp refills nothing, and never moves it back.
    let at = now.max(anchor);
    let (refill, carry) = earned(row.level(), rate, at);
    if want.fill && row.tokens + refill + want.restored >= want.ceiling {
        if want.herd != Herd::Not
            && let Some(change) = herd::herd(row, want, rate, at)
        {
            return Some(change);
        }
        let ahead = ahead(want, rate);
        if ahead.is_some() && want.behind && at > anchor {
            return want
                .need
                .is_none_or(|need| need <= want.ceiling)
                .then(|| take(want, at, Tokens::ZERO));
        }
        let micros = micros_within(at, now_micros);
        // Ahead of the writer's clock, not of a row already stamped ahead (a give-back
        // fills that one at its own timestamp): never more than `d` ahead of any writer.
        let stamp = ahead.map_or(at, |d| {
            at.max(UnixMillis::new(now.as_millis().saturating_add(d)))
        });
        return fill(row, want, rate, (at, micros), stamp);
    }
    let level = row.tokens + refill;
    if want.need.is_some_and(|need| level + want.restored < need) {
        return None;
    }
    let at_most = Condition::TokensAtMost(want.ceiling - want.restored - refill);
    let stored_serves = want
        .need
        .is_none_or(|need| row.tokens + want.restored >= need && !want.short);
    if stored_serves {
        return Some(take(want, anchor, refill));
    }
    let mut when = vec![Condition::RefilledAt(anchor), at_most];
    when.extend(
        want.need
            .map(|n| Condition::TokensAtLeast(n - want.restored - refill)),
    );
    if at.saturating_since(anchor) >= fold_after {
        return Some(Commute::on(
            TokensOp::Add(refill + net),
            Some((at, carry)),
            when,
        ));
    }
    Some(Commute::on(TokensOp::Add(net), None, when))
}

/// A `concurrent` bucket's change: a take, or a fill when a restore would overflow.
fn without_refill(row: &BucketState, want: &Want, net: Tokens) -> Option<Commute> {
    let restored = row.tokens + want.restored;
    if restored > want.ceiling {
        // More given back than the bucket holds (its accounting drifted): it is full.
        if want.need.is_some_and(|need| want.ceiling < need) {
            return None;
        }
        return Some(Commute::on(
            TokensOp::Set(want.ceiling - want.taken),
            None,
            vec![Condition::TokensAtLeast(want.ceiling - want.restored)],
        ));
    }
    if want.need.is_some_and(|need| restored < need) {
        return None;
    }
    let mut when = Vec::with_capacity(2);
    when.extend(
        want.need
            .map(|n| Condition::TokensAtLeast(n - want.restored)),
    );
    if want.restored > Tokens::ZERO {
        when.push(Condition::TokensAtMost(want.ceiling - want.restored));
    }
    Some(Commute::on(TokensOp::Add(net), None, when))
}

/// A take of the stored tokens (see the module documentation), on any row refilled since
/// `anchor`, `refill` being the refill from `anchor` to the change's instant. A take behind
/// a fill stamped ahead is one anchored at its instant, with no refill since: the stored
/// tokens of a row stamped then or later are its level.
fn take(want: &Want, anchor: UnixMillis, refill: Tokens) -> Commute {
    let mut when = vec![
        Condition::TokensAtMost(want.ceiling - want.restored - refill),
        Condition::RefilledSince(anchor),
    ];
    when.extend(
        want.need
            .map(|n| Condition::TokensAtLeast(n - want.restored)),
    );
    Commute::on(TokensOp::Add(want.restored - want.taken), None, when)
}

/// How many milliseconds back a fill looks for another writer's fill to accept by the
/// refill since (besides the one refill timestamp its first set of conditions accepts).
const RECENT_FILL_MILLIS: i64 = 2;

/// A fill: the bucket is full at `at` (refill has reached its ceiling), whoever wrote it
/// last, so it is set to the ceiling less what is taken, less `e`, the refill from the
/// start of `at` to `micros` (`at` to the microsecond; see the module documentation). Its
/// conditions accept any row that is full at `at` by a refill counted without the row's
/// carry, else (`row` is full only thanks to its carry, less than a billionth) exactly
/// `row`'s refill timestamp; or any row refilled by `k` ms before `at` (`k` up to
/// [`RECENT_FILL_MILLIS`]) that the refill of those `k` ms and `e` make full. The refill
/// timestamp it sets is `stamp`: `at`, or later for a fill ahead (see [`ahead`]). `None`
/// when the take is more than the bucket ever holds.
fn fill(
    row: &BucketState,
    want: &Want,
    rate: PerMilli,
    (at, micros): (UnixMillis, i64),
    stamp: UnixMillis,
) -> Option<Commute> {
    if want.need.is_some_and(|need| want.ceiling < need) {
        return None;
    }
    // The refill `row` needs to be full: any row refilled by `x` with at least the tokens
    // that refill since `x` leaves short of full is full too. The earlier `x`, the more
    // other writers' fills it accepts (one that took `g` at `t` is full again once refill
    // since `t` reaches `g`): `x` is as early as a take of this size, or of the bucket's
    // cost per call, needs, and no earlier than `row`'s own refill timestamp.
    let gap = (want.ceiling - want.restored - row.tokens).max(Tokens::ZERO);
    let typical = gap
        .max(want.taken)
        .max(row.bucket.cost_per_call())
        .min(want.ceiling);
    let x = millis_to_earn(typical, rate)
        .and_then(|millis| at.as_millis().checked_sub(millis))
        .map(|x| UnixMillis::new(x).max(row.last_refill_at))
        .filter(|x| earned(Level::new(Tokens::ZERO, *x), rate, at).0 >= gap);
    let when = match x {
        Some(x) => {
            let earned_since_x = earned(Level::new(Tokens::ZERO, x), rate, at).0;
            vec![
                Condition::RefilledBy(x),
                Condition::TokensAtLeast(want.ceiling - want.restored - earned_since_x),
            ]
        }
        None => {
            let (refill, _) = earned(row.level(), rate, at);
            vec![
                Condition::RefilledAt(row.last_refill_at),
                Condition::TokensAtLeast(want.ceiling - want.restored - refill),
            ]
        }
    };
    // Rounded up: stored as of the millisecond's start, the level is never more than the
    // fill leaves at `micros`. Any part of it is right too (stricter by milliseconds the
    // more of it is counted), and what is counted is missing, until the next millisecond,
    // to takes that count milliseconds: so only for a bucket that refills a take within a
    // millisecond (another fill can then apply in the same one), and no more than leaves
    // what the grants need as of the millisecond's start (never in debt).
    let per_take = want.taken.max(row.bucket.cost_per_call());
    let e = if micros_to_earn(per_take, rate).is_some_and(|m| m < 1_000) {
        earned_in_micros_ceil(micros - at.as_millis().saturating_mul(1_000), rate)
            .min((want.ceiling - want.need.unwrap_or(want.taken).max(want.taken)).max(Tokens::ZERO))
    } else {
        Tokens::ZERO
    };
    // By `micros`, any row refilled by `k` ms before `at` with the refill of those `k` ms
    // and `e` more than this is full: the rows other fills left in the last few
    // milliseconds, when the refill since covers what they took.
    let or_when = (0..=RECENT_FILL_MILLIS)
        .filter_map(|k| {
            let by = UnixMillis::new(at.as_millis().checked_sub(k)?);
            let since = earned(Level::new(Tokens::ZERO, by), rate, at).0;
            Some(vec![
                Condition::RefilledBy(by),
                Condition::TokensAtLeast(want.ceiling - want.restored - since - e),
            ])
        })
        .collect();
    Some(Commute {
        tokens: TokensOp::Set((want.ceiling - want.taken).saturating_sub(e)),
        refill: Some((stamp, RefillCarry::ZERO)),
        herd: None,
        when,
        or_when,
    })
}

mod earn;
pub(crate) mod herd;
mod unknown;

pub(crate) use self::unknown::full_by_refill;

pub(super) use self::earn::earned;
use self::earn::{earned_in_micros_ceil, micros_to_earn, millis_to_earn};
#[cfg(test)]
mod tests;
