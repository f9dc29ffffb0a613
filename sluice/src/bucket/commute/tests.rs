use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::bucket::{Bucket, refill};
use crate::rate::RefillRate;

const T0: i64 = 1_700_000_000_000;

fn at(ms: i64) -> UnixMillis {
    UnixMillis::new(T0 + ms)
}

/// `t` to the microsecond, as a clock that keeps milliseconds only reads it.
fn ms(t: UnixMillis) -> (UnixMillis, i64) {
    (t, t.as_millis() * 1_000)
}

fn row(bucket: Bucket, tokens: i64, last_ms: i64) -> BucketState {
    let mut row = BucketState::full("a#b".parse().unwrap(), bucket, at(last_ms));
    row.tokens = Tokens::new(tokens);
    row
}

/// What the bucket really does: refilled to `now` (up to `ceiling`), `restored` given back
/// (capped there), `taken` taken; the level, and whether it could serve `need`.
fn exact(actual: &BucketState, want: &Want, now: UnixMillis) -> (Level, bool) {
    let rate = actual.bucket.effective_rate();
    let level = refill(actual.level(), want.ceiling, rate, now);
    let served = want
        .need
        .is_none_or(|need| level.tokens + want.restored >= need);
    let restored = if level.tokens + want.restored >= want.ceiling {
        Level::new(want.ceiling, level.last_refill_at)
    } else {
        Level {
            tokens: level.tokens + want.restored,
            ..level
        }
    };
    (
        Level {
            tokens: restored.tokens - want.taken,
            ..restored
        },
        served,
    )
}

/// Whether level `a` of a bucket holds no more than level `b` at every later time (and, with
/// `exactly`, the same).
fn within(
    a: Level,
    b: Level,
    bucket: &Bucket,
    ceiling: Tokens,
    from: UnixMillis,
    exactly: bool,
) -> bool {
    let rate = bucket.effective_rate();
    let start = from.max(a.last_refill_at).max(b.last_refill_at);
    [0, 1, 7, 333, 60_000, 86_400_000].iter().all(|ms| {
        let t = start.saturating_add(Duration::from_millis(*ms));
        let (x, y) = (refill(a, ceiling, rate, t), refill(b, ceiling, rate, t));
        if exactly {
            x.tokens == y.tokens && (x.tokens >= ceiling || same_carry(x.carry, y.carry))
        } else {
            x.tokens <= y.tokens
        }
    })
}

/// Whether two carries are the same fraction of a billionth.
fn same_carry(a: RefillCarry, b: RefillCarry) -> bool {
    U256::from(a.units()) * U256::from(b.per()) == U256::from(b.units()) * U256::from(a.per())
}

#[test]
fn a_take_from_stored_tokens_needs_no_anchor_and_commutes_with_other_takes() {
    let b = Bucket::requests(RefillRate::per_second(10)).with_capacity(100);
    let remembered = row(b.clone(), 50, 0);
    let want = Want {
        restored: Tokens::ZERO,
        taken: Tokens::new(5),
        need: Some(Tokens::new(5)),
        ceiling: Tokens::new(100),
    };
    let c = commute(&remembered, &want, ms(at(1_000)), Duration::from_secs(60)).unwrap();
    assert_eq!(c.tokens, TokensOp::Add(Tokens::new(-5)));
    assert_eq!(c.refill, None);
    // Another writer took 20 meanwhile: still right.
    let other = row(b.clone(), 30, 0);
    assert!(c.holds(&other));
    assert_eq!(c.applied(&other).tokens, Tokens::new(25));
    // Another writer's fold moved the anchor: still right.
    let folded = row(b, 35, 1_000);
    assert!(c.holds(&folded));
}

#[test]
fn a_full_bucket_is_filled_and_another_writers_earlier_fill_does_not_fail_it() {
    // 1,000 a second: one token refills in a millisecond.
    let b = Bucket::requests(RefillRate::per_second(1_000)).with_capacity(1_000);
    let remembered = row(b.clone(), 1_000, 0);
    let want = Want {
        restored: Tokens::ZERO,
        taken: Tokens::new(1),
        need: Some(Tokens::new(1)),
        ceiling: Tokens::new(1_000),
    };
    let now = at(5_000);
    let c = commute(&remembered, &want, ms(now), Duration::from_secs(60)).unwrap();
    assert_eq!(c.tokens, TokensOp::Set(Tokens::new(999)));
    assert_eq!(c.refill, Some((now, RefillCarry::ZERO)));
    // Another writer filled it 2 ms ago, taking one: full again now, and accepted.
    assert!(c.holds(&row(b.clone(), 999, 4_998)));
    // ... but not half a millisecond's refill ago, taking two: not full, refused.
    assert!(!c.holds(&row(b, 998, 5_000)));
}

#[test]
fn fills_within_one_millisecond_are_ordered_by_the_microsecond() {
    // A million a second: a token refills every microsecond, so two fills of one token
    // within the same millisecond are right as far apart as the refill covers.
    let b = Bucket::requests(RefillRate::per_second(1_000_000)).with_capacity(1_000);
    let remembered = row(b.clone(), 1_000, 0);
    let want = Want {
        restored: Tokens::ZERO,
        taken: Tokens::new(1),
        need: Some(Tokens::new(1)),
        ceiling: Tokens::new(1_000),
    };
    let now = at(5_000);
    let micros = now.as_millis() * 1_000 + 600;
    let c = commute(&remembered, &want, (now, micros), Duration::from_secs(60)).unwrap();
    assert_eq!(c.refill_micros, Some(micros));
    // Another writer filled it 1 µs earlier in the same millisecond, taking one: the
    // refill since (1,000 a millisecond: one token a microsecond) covers it.
    let mut filled = row(b.clone(), 999, 5_000);
    filled.last_refill_micros = Some(micros - 1);
    assert!(c.holds(&filled));
    let mut after = filled.clone();
    c.apply_to(&mut after);
    assert_eq!(
        (after.tokens, after.last_refill_at, after.refilled_micros()),
        (Tokens::new(999), now, Some(micros))
    );
    // Taking two, 1 µs earlier: not full again yet, refused.
    filled.tokens = Tokens::new(998);
    assert!(!c.holds(&filled));
    // At the same microsecond, or later: refused.
    for later in [micros, micros + 1] {
        let mut filled = row(b.clone(), 999, 5_000);
        filled.last_refill_micros = Some(later);
        assert!(!c.holds(&filled), "{later}");
    }
    // The same millisecond written by a writer that keeps no microsecond (another SDK, a
    // clock of milliseconds): refused.
    assert!(!c.holds(&row(b.clone(), 999, 5_000)));
    // A microsecond left from an earlier millisecond says nothing of this one.
    let mut moved = row(b.clone(), 999, 5_000);
    moved.last_refill_micros = Some(micros - 1_000);
    assert_eq!(moved.refilled_micros(), None);
    assert!(!c.holds(&moved));
    // A clock of milliseconds: fills within one millisecond never both apply.
    let c = commute(&remembered, &want, ms(now), Duration::from_secs(60)).unwrap();
    assert!(c.or_when.is_empty());
    let mut filled = row(b, 999, 5_000);
    filled.last_refill_micros = Some(now.as_millis() * 1_000);
    assert!(!c.holds(&filled));
}

#[test]
fn a_credit_needs_the_anchor_it_counted_refill_from() {
    let b = Bucket::requests(RefillRate::per_second(10)).with_capacity(100);
    let remembered = row(b.clone(), 0, 0);
    let want = Want {
        restored: Tokens::ZERO,
        taken: Tokens::new(5),
        need: Some(Tokens::new(5)),
        ceiling: Tokens::new(100),
    };
    let c = commute(&remembered, &want, ms(at(1_000)), Duration::from_secs(60)).unwrap();
    assert_eq!(c.tokens, TokensOp::Add(Tokens::new(-5)));
    assert!(c.when.contains(&Condition::RefilledAt(at(0))));
    // Other credits on the same anchor: still right while the bucket has them.
    assert!(c.holds(&row(b.clone(), -4, 0)));
    assert!(!c.holds(&row(b.clone(), -6, 0)));
    // A fold since: refused (computed again from the row handed back).
    assert!(!c.holds(&row(b, 5, 500)));
    // Older than the fold interval: folded.
    let c = commute(
        &remembered,
        &want,
        ms(at(1_000)),
        Duration::from_millis(500),
    )
    .unwrap();
    assert_eq!(c.tokens, TokensOp::Add(Tokens::new(5)));
    assert_eq!(c.refill, Some((at(1_000), RefillCarry::ZERO)));
}

#[test]
fn a_short_bucket_has_no_change() {
    let b = Bucket::requests(RefillRate::per_second(10)).with_capacity(100);
    let want = Want {
        restored: Tokens::ZERO,
        taken: Tokens::new(20),
        need: Some(Tokens::new(20)),
        ceiling: Tokens::new(100),
    };
    assert_eq!(
        commute(&row(b, 0, 0), &want, ms(at(1_000)), Duration::from_secs(60)),
        None
    );
}

#[test]
fn concurrent_slots_are_taken_and_given_back_by_addition() {
    let b = Bucket::concurrent(4);
    let take = Want {
        restored: Tokens::ZERO,
        taken: Tokens::new(1),
        need: Some(Tokens::new(1)),
        ceiling: Tokens::new(4),
    };
    let c = commute(
        &row(b.clone(), 2, 0),
        &take,
        ms(at(1)),
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(c.tokens, TokensOp::Add(Tokens::new(-1)));
    assert!(c.holds(&row(b.clone(), 1, 0)));
    assert!(!c.holds(&row(b.clone(), 0, 0)));
    let back = Want {
        restored: Tokens::new(1),
        taken: Tokens::ZERO,
        need: None,
        ceiling: Tokens::new(4),
    };
    let c = commute(
        &row(b.clone(), 2, 0),
        &back,
        ms(at(1)),
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(c.tokens, TokensOp::Add(Tokens::new(1)));
    assert!(!c.holds(&row(b, 4, 0)), "never above the capacity");
}

fn any_rate() -> impl Strategy<Value = RefillRate> {
    prop_oneof![
        (1u64..5_000).prop_map(RefillRate::per_second),
        (1u64..100_000).prop_map(RefillRate::per_minute),
        (1u64..1_000).prop_map(RefillRate::per_day),
        (1i128..100_000_000_000, 1u64..10_000_000_000)
            .prop_map(|(a, p)| { RefillRate::new(Tokens::from_nanos(a), Duration::from_nanos(p)) }),
    ]
}

fn any_bucket() -> impl Strategy<Value = Bucket> {
    prop_oneof![
        (any_rate(), 1u64..1_000).prop_map(|(r, c)| Bucket::tokens(r).with_capacity(c)),
        (1u64..50).prop_map(Bucket::concurrent),
    ]
}

/// A row of `bucket`: tokens from debt to full (in billionths), refilled at some time
/// around `T0`, carrying what refill to then left.
fn any_row(bucket: Bucket) -> impl Strategy<Value = BucketState> {
    let capacity = bucket.capacity().as_nanos();
    (-capacity..=capacity, -5_000i64..5_000, 0i64..5_000).prop_map(move |(t, last, step)| {
        let mut r = row(bucket.clone(), 0, last - step);
        r.tokens = Tokens::from_nanos(t);
        // Refilled to `last` from `step` before, so that it carries what a rate leaves.
        let level = refill(r.level(), Tokens::MAX, r.bucket.effective_rate(), at(last));
        r.set_level(Level {
            tokens: Tokens::from_nanos(t),
            ..level
        });
        r
    })
}

fn any_case() -> impl Strategy<Value = (BucketState, BucketState, Want, i64)> {
    any_bucket().prop_flat_map(|b| {
        let capacity = b.capacity().as_nanos();
        (
            any_row(b.clone()),
            any_row(b),
            0..=capacity,
            0..=capacity,
            proptest::option::of(0..=capacity),
            0i64..10_000,
        )
            .prop_map(move |(remembered, actual, restored, taken, need, now)| {
                let want = Want {
                    restored: Tokens::from_nanos(restored / 4),
                    taken: Tokens::from_nanos(taken / 2),
                    need: need.map(|n| Tokens::from_nanos(n.max(taken / 2))),
                    ceiling: remembered.holds(),
                };
                (remembered, actual, want, now)
            })
    })
}

/// How often the same-millisecond property found a fill accepted by its second set of
/// conditions (it must, or it tests nothing).
static HITS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A fast bucket (a token every 100 µs or faster) nearly full; a row another fill
/// set at microsecond `fine` of a millisecond; a take computed from an older full row at a
/// later microsecond `micros` of the same millisecond, or a few later.
fn same_millisecond_fills() -> impl Strategy<Value = (BucketState, BucketState, Want, i64, i64)> {
    (
        10_000u64..20_000_000,
        1u64..1_000,
        0i64..=20,
        0i64..=10,
        0i64..=3,
        0i64..1_000,
        prop_oneof![0i64..30, 0i64..300, 0i64..2_500],
    )
        .prop_map(
            |(per_second, capacity, lacks, taken, restored, fine_at, after)| {
                let b = Bucket::tokens(RefillRate::per_second(per_second)).with_capacity(capacity);
                let cap = i64::try_from(capacity).unwrap();
                let remembered = row(b.clone(), cap, -5);
                let mut actual = row(b, (cap - lacks).max(0), 0);
                let fine = at(0).as_millis() * 1_000 + fine_at;
                actual.last_refill_micros = Some(fine);
                let want = Want {
                    restored: Tokens::new(restored.min(cap)),
                    taken: Tokens::new(taken.min(cap)),
                    need: Some(Tokens::new(taken.min(cap))),
                    ceiling: Tokens::new(cap),
                };
                (remembered, actual, want, fine, fine + after)
            },
        )
}

#[test]
fn the_same_millisecond_property_finds_fills_to_check() {
    a_fill_after_another_in_the_same_millisecond_finds_the_bucket_full();
    assert!(HITS.load(std::sync::atomic::Ordering::Relaxed) > 100);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_048, ..ProptestConfig::default() })]

    /// Whatever the row has become since it was remembered, a change applies only where it
    /// is right: the bucket could serve what it takes, and it leaves the bucket exactly as
    /// giving back, then taking, would have; never more, even on a row whose refill
    /// timestamp went back (which no writer does), where it may leave less.
    #[test]
    fn a_change_that_applies_is_exact_on_the_row_it_applies_to(
        (remembered, actual, want, now) in any_case()
    ) {
        let now = at(now);
        if let Some(c) = commute(&remembered, &want, ms(now), Duration::from_secs(2))
            && c.holds(&actual)
        {
            let (level, served) = exact(&actual, &want, now);
            prop_assert!(served, "granted from a bucket that could not serve it: {:?}", c);
            let exactly = actual.last_refill_at >= remembered.last_refill_at;
            prop_assert!(
                within(c.applied(&actual), level, &actual.bucket, want.ceiling, now, exactly),
                "{:?} left {:?}, not {:?}", c, c.applied(&actual), level
            );
            if let Some((last, _)) = c.refill {
                prop_assert!(last >= actual.last_refill_at, "moved the refill timestamp back");
            }
        }
    }

    /// A fill that applies to a row another fill set earlier in the same millisecond finds
    /// the bucket full, to the microsecond: what that row lacks was refilled by then.
    #[test]
    fn a_fill_after_another_in_the_same_millisecond_finds_the_bucket_full(
        (remembered, actual, want, fine, micros) in same_millisecond_fills()
    ) {
        let rate = actual.bucket.effective_rate().per_milli().unwrap();
        let now = UnixMillis::new(micros.div_euclid(1_000));
        if let Some(c) = commute(&remembered, &want, (now, micros), Duration::from_secs(2))
            && !c.when.iter().all(|w| w.holds(&actual))
            && c.holds(&actual)
        {
            let refilled = actual.tokens + want.restored + earned_in_micros(micros - fine, rate);
            prop_assert!(
                refilled >= want.ceiling,
                "{:?} applied to {:?} at {} µs: only {:?} of {:?}",
                c, actual, micros, refilled, want.ceiling
            );
            prop_assert_eq!(c.tokens, TokensOp::Set(want.ceiling - want.taken));
            HITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// On the row it was computed from, a change applies whenever that row serves it.
    #[test]
    fn a_change_applies_to_the_row_it_was_computed_from(
        (remembered, _actual, want, now) in any_case()
    ) {
        let now = at(now);
        let (_, served) = exact(&remembered, &want, now);
        let c = commute(&remembered, &want, ms(now), Duration::from_secs(2));
        prop_assert_eq!(c.is_some(), served, "{:?}", c);
        if let Some(c) = c {
            prop_assert!(c.holds(&remembered), "{:?} refused its own row", c);
        }
    }
}
