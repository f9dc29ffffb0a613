//! The update and condition expressions of changes.

use super::*;
use crate::bucket::{Bucket, LedgerChange, RefillCarry};
use crate::clock::UnixMillis;
use crate::rate::RefillRate;
use crate::tokens::Tokens;

fn change(commute: Commute) -> BucketChange {
    let row = BucketState::full(
        "a#b".parse().unwrap(),
        Bucket::requests(RefillRate::per_second(10)).with_capacity(10),
        UnixMillis::new(5_000),
    );
    BucketChange::of(&row, commute)
}

/// Every name and value an expression declares, it uses (DynamoDB refuses the rest).
fn all_used(update: &str, e: &Expr) {
    let condition = e.condition();
    for placeholder in e.names.keys().chain(e.values.keys()) {
        assert!(
            update.contains(placeholder.as_str()) || condition.contains(placeholder.as_str()),
            "{placeholder} unused in `{update}` / `{condition}`"
        );
    }
}

#[test]
fn other_sets_of_conditions_are_one_parenthesised_alternative() {
    let fill = change(Commute {
        tokens: TokensOp::Set(Tokens::new(9)),
        refill: Some((UnixMillis::new(5_000), RefillCarry::ZERO)),
        herd: None,
        when: vec![
            Condition::RefilledBy(UnixMillis::new(4_900)),
            Condition::TokensAtLeast(Tokens::new(9)),
        ],
        or_when: vec![
            vec![
                Condition::RefilledBy(UnixMillis::new(5_000)),
                Condition::TokensAtLeast(Tokens::new(10)),
            ],
            Vec::new(),
            vec![
                Condition::RefilledBy(UnixMillis::new(4_999)),
                Condition::TokensAtLeast(Tokens::new(8)),
            ],
        ],
    });
    let (update, e) = update_of(&fill);
    assert!(
        e.condition().ends_with(
            " AND ((#l <= :w0 AND #t >= :w1) OR (#l <= :o0n0 AND #t >= :o0n1) \
             OR (#l <= :o1n0 AND #t >= :o1n1))"
        ),
        "{}",
        e.condition()
    );
    all_used(&update, &e);
    // A take with no other set: its conditions alone.
    let take = change(Commute {
        tokens: TokensOp::Add(Tokens::new(-1)),
        refill: None,
        herd: None,
        when: vec![Condition::TokensAtLeast(Tokens::new(1))],
        or_when: Vec::new(),
    });
    let (update, e) = update_of(&take);
    assert!(
        e.condition().ends_with(" AND #t >= :w0"),
        "{}",
        e.condition()
    );
    assert!(!e.names.contains_key("#l"));
    all_used(&update, &e);
    // An empty first set holds for any row: the others say nothing more.
    let any = change(Commute {
        tokens: TokensOp::Add(Tokens::new(1)),
        refill: None,
        herd: None,
        when: Vec::new(),
        or_when: vec![vec![Condition::RefilledBy(UnixMillis::new(5_000))]],
    });
    let (update, e) = update_of(&any);
    assert!(!e.names.contains_key("#l"), "{}", e.condition());
    all_used(&update, &e);
}

#[test]
fn a_shadow_take_adds_to_the_ledger_and_conditions_a_lower_debt() {
    let take = || Commute {
        tokens: TokensOp::Add(Tokens::new(-4)),
        refill: None,
        herd: None,
        when: vec![Condition::TokensAtMost(Tokens::new(10))],
        or_when: Vec::new(),
    };
    let refused = change(take()).with_ledger(LedgerChange {
        owed: Tokens::new(4),
        refused: 1,
        owed_was: None,
    });
    let (update, e) = update_of(&refused);
    assert_eq!(update, "ADD #v :one, #t :delta, #so :sod, #sr :srd");
    assert!(!e.condition().contains("#so"), "{}", e.condition());
    all_used(&update, &e);
    let paid = change(take()).with_ledger(LedgerChange {
        owed: Tokens::new(-2),
        refused: 0,
        owed_was: Some(Tokens::new(5)),
    });
    let (update, e) = update_of(&paid);
    assert_eq!(update, "ADD #v :one, #t :delta, #so :sod");
    assert!(
        e.condition().contains(" AND #so = :sow"),
        "{}",
        e.condition()
    );
    all_used(&update, &e);
    let from_nothing = change(take()).with_ledger(LedgerChange {
        owed: Tokens::ZERO,
        refused: 0,
        owed_was: Some(Tokens::ZERO),
    });
    let (update, e) = update_of(&from_nothing);
    assert_eq!(update, "ADD #v :one, #t :delta");
    assert!(
        e.condition()
            .contains(" AND (attribute_not_exists(#so) OR #so = :sow)"),
        "{}",
        e.condition()
    );
    all_used(&update, &e);
    // Nothing for the ledger: nothing about it in the request.
    let (update, e) = update_of(&change(take()));
    for name in ["#so", "#sr"] {
        assert!(!update.contains(name) && !e.condition().contains(name));
    }
}

#[test]
fn a_herd_write_keeps_the_herds_timestamp_and_a_fill_clears_it() {
    let herd = change(Commute {
        tokens: TokensOp::Add(Tokens::new(-1)),
        refill: None,
        herd: Some(UnixMillis::new(5_000)),
        when: vec![
            Condition::HerdAbsent,
            Condition::TokensAtMost(Tokens::new(10)),
        ],
        or_when: vec![vec![
            Condition::StampIsHerd,
            Condition::HerdSince(UnixMillis::new(4_950)),
        ]],
    });
    let (update, e) = update_of(&herd);
    assert_eq!(
        update,
        "SET #l = if_not_exists(#h, :herd), #h = if_not_exists(#h, :herd) \
         ADD #v :one, #t :delta REMOVE #rc"
    );
    assert!(
        e.condition().ends_with(
            " AND ((attribute_not_exists(#h) AND #t <= :w1) \
             OR (#l = #h AND #h >= :o0n1))"
        ),
        "{}",
        e.condition()
    );
    all_used(&update, &e);
    let fill = change(Commute {
        tokens: TokensOp::Set(Tokens::new(9)),
        refill: Some((UnixMillis::new(5_000), RefillCarry::ZERO)),
        herd: None,
        when: vec![Condition::RefilledBy(UnixMillis::new(4_900))],
        or_when: Vec::new(),
    });
    let (update, e) = update_of(&fill);
    assert!(update.ends_with(" REMOVE #h, #rc"), "{update}");
    all_used(&update, &e);
}
