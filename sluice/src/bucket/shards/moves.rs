//! A reshard that commutes with the writes it races: each row that stays is changed by
//! what moves in or out of it, not overwritten with what it held when read.
//!
//! A row spread because it is hot takes writes every few milliseconds; a reshard
//! conditioned on every row being exactly as read (one read, then one transaction) almost
//! never lands there, and at a real row's thousand writes a second it never does. Every
//! other write to a bucket row is a commuting change (an `ADD` on conditions, see
//! [`Commute`]), so the reshard is one too, for each row it keeps: the row's refill up to
//! the reshard's instant is settled on the condition that nobody settled it since (its
//! refill timestamp unchanged), and the tokens it gives to (or takes from) the other rows
//! are added, on conditions that keep the row inside its new bounds however many takes and
//! gives landed since the read. A row full at that instant is full whatever the takes
//! since (the refill covers them) and is set to its new part. What the other writers did
//! in between stays on the row: the whole keeps every token.

use super::super::commute::earned;
use super::super::{BucketState, Commute, Condition, RefillCarry, TokensOp};
use crate::clock::UnixMillis;
use crate::tokens::Tokens;

/// How much of a full row's holds a move after a lost race may drop: 1%.
const FULL_TOLERANCE: i128 = 100;

/// For each row of `next` that `rows` (as read) already had, the change that turns the
/// stored row into its part of `next` whatever commuting changes landed on it since the
/// read; `None` for a row that has to be as read (a vendor-learned burst, a row refilled
/// after the new rows' timestamp): that row is conditioned on being unchanged. A row is settled at `now` and stamped as the new rows are, which may be
/// later (see [`reshard`](super::reshard)): it refills nothing until then.
///
/// A full row is moved exactly while nobody refilled it since the read. On a row every
/// grant refills (a full bucket's grants set its refill timestamp), that race is lost
/// again and again; so after a lost race (`raced`) a row read full with at least 99% of
/// what it holds stored is moved by what it stores instead, its refill settled at `now`:
/// it gives exactly what its part says it gives and keeps what it stores, dropping what it
/// had refilled beyond that (at most 1% of the row: typically the last grant's cost, which
/// a full bucket had refilled already). Never more than the whole held.
pub(crate) fn moves(
    rows: &[BucketState],
    next: &[BucketState],
    now: UnixMillis,
    raced: bool,
) -> Vec<Option<Commute>> {
    rows.iter()
        .zip(next)
        .map(|(old, new)| move_of(old, new, now, raced))
        .collect()
}

fn move_of(old: &BucketState, new: &BucketState, now: UnixMillis, raced: bool) -> Option<Commute> {
    // A burst learned from the vendor bounds the row by more than its definition: left
    // to the exact condition. A row another SDK wrote (no write id) is moved like any
    // other: the fast path's own changes apply to it, on the same conditions, and what
    // it read of the row was rounded the safe way (tokens down, the refill timestamp
    // up), so a move computed from it gives out no more than the row holds, and its
    // conditions, on the stored values themselves, fail where the rounding would matter.
    if old.burst.is_some() || new.burst.is_some() {
        return None;
    }
    // Settled at `now` (refill counted to it, none for a row refilled later) and stamped
    // as the new rows are, never before the row's own timestamp.
    let anchor = old.last_refill_at;
    let stamp = new.last_refill_at;
    if stamp < anchor.max(now) {
        return None;
    }
    let holds = old.holds();
    let (refill, _) = match old.bucket.effective_rate().per_milli() {
        Some(rate) => earned(old.level(), rate, now),
        None => (Tokens::ZERO, RefillCarry::ZERO),
    };
    let settled = Some((stamp, RefillCarry::ZERO));
    let tolerance = Tokens::from_nanos(holds.as_nanos() / FULL_TOLERANCE);
    let level = old.tokens.saturating_add(refill);
    let full = level >= holds;
    if raced && full && old.tokens >= holds - tolerance && anchor <= now {
        // Gives what it holds beyond its part, from what it stores now; ends within
        // [part - 1%, part], never below nothing.
        let gives = holds - new.tokens;
        return Some(Commute {
            tokens: TokensOp::Add(new.tokens - holds),
            refill: settled,
            herd: None,
            when: vec![
                Condition::RefilledSince(anchor),
                Condition::RefilledBy(now),
                Condition::TokensAtLeast((holds - tolerance).max(gives)),
                Condition::TokensAtMost(holds),
            ],
            or_when: Vec::new(),
        });
    }
    if full {
        // Full at `now` while the takes since the read leave the refill enough to cover
        // them: then it is exactly full, and set to its part.
        let surplus = level - holds;
        return Some(Commute {
            tokens: TokensOp::Set(new.tokens),
            refill: settled,
            herd: None,
            when: vec![
                Condition::RefilledAt(anchor),
                Condition::TokensAtLeast(old.tokens - surplus),
            ],
            or_when: Vec::new(),
        });
    }
    // Not full: its level is what it stores plus the refill, whatever it stores now, and
    // it ends at its part plus what the other writers did since the read; on condition
    // that it is still not full, and ends within its new bounds (no lower than its part
    // when that is a debt).
    let delta = new.tokens - old.tokens;
    let not_full = holds - refill;
    let within = old.tokens + new.holds() - new.tokens;
    Some(Commute {
        tokens: TokensOp::Add(delta),
        refill: settled,
        herd: None,
        when: vec![
            Condition::RefilledAt(anchor),
            Condition::TokensAtMost(not_full.min(within)),
            Condition::TokensAtLeast(old.tokens - new.tokens + new.tokens.min(Tokens::ZERO)),
        ],
        or_when: Vec::new(),
    })
}
