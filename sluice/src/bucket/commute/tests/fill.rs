//! Fills: a full bucket set to what it holds less the take.

use super::*;

#[test]
fn a_full_bucket_is_filled_and_another_writers_earlier_fill_does_not_fail_it() {
    // 1,000 a second: one token refills in a millisecond.
    let (b, remembered, want) = requests(1_000, 1_000, 1_000, 1);
    let now = at(5_000);
    let c = change(&remembered, &want, now).unwrap();
    assert_eq!(c.tokens, TokensOp::Set(Tokens::new(999)));
    assert_eq!(c.refill, Some((now, RefillCarry::ZERO)));
    // Another writer filled it 2 ms ago, taking one: full again now, and accepted.
    assert!(c.holds(&row(b.clone(), 999, 4_998)));
    // ... but not half a millisecond's refill ago, taking two: not full, refused.
    assert!(!c.holds(&row(b, 998, 5_000)));
}

#[test]
fn fills_within_one_millisecond_count_refill_to_the_microsecond() {
    // A million a second: a token refills every microsecond, so two fills of one token
    // within the same millisecond are right as far apart as the refill covers.
    let (b, remembered, want) = requests(1_000_000, 1_000, 1_000, 1);
    let now = at(5_000);
    let c = commute(
        &remembered,
        &want,
        (now, now.as_millis() * 1_000 + 600),
        Duration::from_secs(60),
    )
    .unwrap();
    // 999 left at µs 600, stored as of the millisecond's start: the 600 that refill by
    // then are not counted again.
    assert_eq!(c.tokens, TokensOp::Set(Tokens::new(399)));
    assert_eq!(c.refill, Some((now, RefillCarry::ZERO)));
    let rate = b.effective_rate();
    let next = refill(
        c.applied(&row(b.clone(), 1_000, 0)),
        Tokens::new(1_000),
        rate,
        at(5_001),
    );
    assert_eq!(next.tokens, Tokens::new(1_000));
    // Another writer filled it at µs 599 of the same millisecond, taking one (its row:
    // 400 as of the start): full again by µs 600.
    assert!(c.holds(&row(b.clone(), 400, 5_000)));
    assert_eq!(
        c.applied(&row(b.clone(), 400, 5_000)).tokens,
        Tokens::new(399)
    );
    // ... taking two, or at µs 600 as well: not full yet, refused.
    assert!(!c.holds(&row(b.clone(), 399, 5_000)));
    // A row refilled after this millisecond (a clock ahead): refused.
    assert!(!c.holds(&row(b.clone(), 1_000, 5_001)));
    // A clock of milliseconds: two fills in one millisecond never both apply.
    let c = change(&remembered, &want, now).unwrap();
    assert_eq!(c.tokens, TokensOp::Set(Tokens::new(999)));
    assert!(!c.holds(&row(b, 999, 5_000)));
}
