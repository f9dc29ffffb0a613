//! Changes of a writer that last saw the bucket short: a queue's debt.

use super::*;

#[test]
fn a_writer_that_last_saw_the_bucket_short_credits_and_a_queues_takes_meanwhile_do_not_fail_it() {
    // 20 a second, holding 10, last refilled at 0: a queue of waiters owes 150, and this
    // one may leave the bucket 190 in debt (what refills within its wait).
    let (b, remembered, mut want) = requests(20, 10, -150, 1);
    want.need = Some(Tokens::new(-189));
    want.fill = false;
    want.short = true;
    let now = at(8_000);
    let c = change(&remembered, &want, now).unwrap();
    assert_eq!(c.tokens, TokensOp::Add(Tokens::new(-1)));
    assert_eq!(c.refill, None);
    // A credit: its floor counts the 160 refilled since the timestamp.
    assert!(c.when.contains(&Condition::RefilledAt(at(0))));
    assert!(
        c.when
            .contains(&Condition::TokensAtLeast(Tokens::new(-349)))
    );
    // The queue's other waiters took 45 meanwhile: the stored tokens alone no longer
    // reach the take's floor (-189), but the level does, and the credit is right.
    let drained = row(b.clone(), -195, 0);
    assert!(c.holds(&drained));
    assert_eq!(c.applied(&drained).tokens, Tokens::new(-196));
    // The same writer not knowing the row short takes from the stored tokens: that take
    // fails on the same row.
    want.short = false;
    let t = change(&remembered, &want, now).unwrap();
    assert!(t.when.contains(&Condition::RefilledSince(at(0))));
    assert!(!t.holds(&drained));
    // A row filled since (the queue drained, the bucket full again) fails the credit once.
    assert!(!c.holds(&row(b, 9, 7_990)));
}
