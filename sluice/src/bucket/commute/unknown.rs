//! A fill by a writer that does not know the row: a key's first write under a keyed bucket
//! (see [`Bucket::keyed`](crate::Bucket::keyed)).

use super::earn::{earned, millis_to_earn};
use super::{Commute, Condition, TokensOp};
use crate::bucket::{BucketState, Level};
use crate::clock::UnixMillis;
use crate::tokens::Tokens;

/// The most alternatives [`full_by_refill`] adds.
const MOST: usize = 6;

/// Adds to `fill` (a fill of `row`'s bucket computed at `at`, giving back nothing) the
/// rows that refill alone has made full by `at`, whatever they held: a row refilled by
/// `d` before `at` with what the refill of `d` leaves short of full, for `d` the refill of
/// one call, four times that, and so on up to the refill of all the bucket holds (by then
/// any row with no debt is full). A writer that never saw the row (an idle key's, full
/// again since its last calls, however many they were) so fills it in one write.
pub(crate) fn full_by_refill(fill: &mut Commute, row: &BucketState, at: UnixMillis) {
    let TokensOp::Set(_) = fill.tokens else {
        return;
    };
    let Some(rate) = row.bucket.effective_rate().per_milli() else {
        return;
    };
    let ceiling = row.holds();
    let (Some(first), Some(whole)) = (
        millis_to_earn(row.bucket.cost_per_call().max(Tokens::from_nanos(1)), rate),
        millis_to_earn(ceiling, rate),
    ) else {
        return;
    };
    let mut spans = Vec::with_capacity(MOST);
    let mut d = first.max(1);
    while spans.len() + 1 < MOST && d < whole {
        spans.push(d);
        d = d.saturating_mul(4);
    }
    spans.push(whole);
    for d in spans {
        let Some(by) = at.as_millis().checked_sub(d).map(UnixMillis::new) else {
            continue;
        };
        let since = earned(Level::new(Tokens::ZERO, by), rate, at).0;
        fill.or_when.push(vec![
            Condition::RefilledBy(by),
            Condition::TokensAtLeast(ceiling - since),
        ]);
    }
}
