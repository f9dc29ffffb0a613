//! Rows other writers write often: fills stamped ahead, and takes behind them.

use super::*;

#[test]
fn a_row_others_write_often_is_filled_ahead_and_then_taken_from_by_addition() {
    // A million a second, holding a million: full at every write.
    let (b, remembered, mut want) = requests(1_000_000, 1_000_000, 1_000_000, 1);
    let now = at(5_000);
    // Others write it 64 times in the 500 ms its refill takes to fill half of it (128 a
    // second) at the least: not yet.
    want.others_per_ks = 127_999;
    let c = change(&remembered, &want, now).unwrap();
    assert_eq!(c.refill, Some((now, RefillCarry::ZERO)));
    // 128 a second: the fill stamps the row 500 ms ahead, and the row refills nothing until
    // then.
    want.others_per_ks = 128_000;
    let c = change(&remembered, &want, now).unwrap();
    assert_eq!(c.tokens, TokensOp::Set(Tokens::new(999_999)));
    assert_eq!(c.refill, Some((at(5_500), RefillCarry::ZERO)));
    let filled = row(b.clone(), 999_999, 5_500);
    assert_eq!(filled.available(at(5_200)), Tokens::new(999_999));
    // A stale writer's first attempt 100 ms later takes from the stored tokens on any row
    // stamped at its instant or later, whatever others took meanwhile.
    want.behind = true;
    let later = at(5_100);
    let c = change(&remembered, &want, later).unwrap();
    assert_eq!(c.tokens, TokensOp::Add(Tokens::new(-1)));
    assert_eq!(c.refill, None);
    assert!(c.needs_later_refill(&remembered));
    assert!(c.holds(&filled));
    assert!(c.holds(&row(b.clone(), 999_990, 5_500)));
    assert_eq!(
        c.applied(&row(b.clone(), 999_990, 5_500)).tokens,
        Tokens::new(999_989)
    );
    // Nobody filled it since its instant: the row the failure hands back is full, and
    // the next attempt (not `behind`) fills it.
    assert!(!c.holds(&row(b.clone(), 999_999, 5_099)));
    want.behind = false;
    let c = change(&row(b.clone(), 999_999, 5_099), &want, later).unwrap();
    assert_eq!(c.refill, Some((at(5_600), RefillCarry::ZERO)));
    // A bucket holding little is stamped ahead no longer than the refill of half of it
    // takes: 10 a second, holding 4, 200 ms; a bucket refilling slowly a second at most.
    let (_, small, mut want) = requests(10, 4, 4, 1);
    want.others_per_ks = 1_000_000;
    let c = change(&small, &want, now).unwrap();
    assert_eq!(c.refill, Some((at(5_200), RefillCarry::ZERO)));
    let (_, slow, mut want) = requests(1, 100, 100, 1);
    want.others_per_ks = 1_000_000;
    let c = change(&slow, &want, now).unwrap();
    assert_eq!(c.refill, Some((at(6_000), RefillCarry::ZERO)));
}

#[test]
fn a_give_back_to_a_row_filled_ahead_stamps_it_ahead_of_the_clock_not_of_the_row() {
    // Filled ahead at 5 s to 5.5 s, 10 taken; 100 ms later those 10 are given back.
    let bucket = Bucket::tokens(RefillRate::per_second(1_000)).with_capacity(1_000);
    let filled = row(bucket, 990, 5_500);
    let want = Want {
        restored: Tokens::new(10),
        taken: Tokens::ZERO,
        need: None,
        ceiling: Tokens::new(1_000),
        fill: true,
        short: false,
        others_per_ks: 1_000_000,
        behind: true,
        herd: Herd::Not,
    };
    let c = change(&filled, &want, at(5_100)).unwrap();
    // Full again at the row's own timestamp: set full, stamped half a second after the
    // writer's clock (5.6 s), not after the row's (6 s); each cycle of a take and its
    // give-back moves the stamp no further than that.
    assert_eq!(c.tokens, TokensOp::Set(Tokens::new(1_000)));
    assert_eq!(c.refill, Some((at(5_600), RefillCarry::ZERO)));
    // A row stamped further ahead than that keeps its timestamp.
    let c = change(&row(filled.bucket.clone(), 990, 5_900), &want, at(5_100)).unwrap();
    assert_eq!(c.refill, Some((at(5_900), RefillCarry::ZERO)));
}
