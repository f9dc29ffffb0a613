use std::time::Duration;

use proptest::prelude::*;

use ethnum::U256;

use super::*;
use crate::bucket::{Bucket, refill};
use crate::rate::RefillRate;

mod ahead;
mod fill;
mod herd;
mod short;

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
#[test]
fn stale_writers_fill_one_bucket_several_times_within_one_millisecond() {
    // A token every microsecond; four writers 10 µs apart, each from its own older row.
    let bucket = Bucket::tokens(RefillRate::per_second(1_000_000)).with_capacity(1_000);
    let steps: Vec<_> = (0..4)
        .map(|w| (w, if w == 0 { 2_000 } else { 10 }, 1))
        .collect();
    let granted = stale_writers(&bucket, &steps, 0).unwrap();
    assert_eq!(granted.len(), 4);
    // A bucket that refills ten times what it holds within a millisecond: a fill counts
    // no more of the millisecond's refill than leaves it empty as of its start, never in
    // debt.
    let small = Bucket::tokens(RefillRate::per_second(1_000_000)).with_capacity(100);
    let want = want_one(100);
    let now = at(5);
    let reading = (now, now.as_millis() * 1_000 + 999);
    let c = commute(&row(small, 100, 0), &want, reading, Duration::from_secs(2)).unwrap();
    assert_eq!(c.tokens, TokensOp::Set(Tokens::ZERO));
    // A bucket that takes longer than a millisecond to refill a take counts none of the
    // millisecond's refill: a full bucket of 5 a minute grants its 5 at once, at any
    // microsecond.
    let slow = Bucket::requests(RefillRate::per_minute(5)).with_capacity(5);
    let c = commute(
        &row(slow, 5, 0),
        &want_one(5),
        reading,
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(c.tokens, TokensOp::Set(Tokens::new(4)));
}

/// One token taken from a bucket holding `ceiling`.
fn want_one(ceiling: i64) -> Want {
    take(1, ceiling)
}

/// `taken` tokens taken (and needed) from a bucket holding `ceiling`, nothing given back.
fn take(taken: i64, ceiling: i64) -> Want {
    Want {
        restored: Tokens::ZERO,
        taken: Tokens::new(taken),
        need: Some(Tokens::new(taken)),
        ceiling: Tokens::new(ceiling),
        fill: true,
        short: false,
        others_per_ks: 0,
        behind: false,
        herd: Herd::Not,
    }
}

/// A requests bucket of `capacity` refilling `per_second`, the row a writer remembers of it
/// (`tokens` as of `at(0)`), and a take of `taken` from it.
fn requests(
    per_second: u64,
    capacity: u64,
    tokens: i64,
    taken: i64,
) -> (Bucket, BucketState, Want) {
    let bucket = Bucket::requests(RefillRate::per_second(per_second)).with_capacity(capacity);
    let remembered = row(bucket.clone(), tokens, 0);
    let ceiling = i64::try_from(capacity).unwrap();
    (bucket, remembered, take(taken, ceiling))
}

/// The change doing `want` to `row` at `now` by a clock of milliseconds, folding an anchor
/// older than a minute.
fn change(row: &BucketState, want: &Want, now: UnixMillis) -> Option<Commute> {
    commute(row, want, ms(now), Duration::from_secs(60))
}

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
    let (b, remembered, want) = requests(10, 100, 50, 5);
    let c = change(&remembered, &want, at(1_000)).unwrap();
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
fn a_credit_needs_the_anchor_it_counted_refill_from() {
    let (b, remembered, want) = requests(10, 100, 0, 5);
    let c = change(&remembered, &want, at(1_000)).unwrap();
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
    let (_, remembered, want) = requests(10, 100, 0, 20);
    assert_eq!(change(&remembered, &want, at(1_000)), None);
}

#[test]
fn concurrent_slots_are_taken_and_given_back_by_addition() {
    let b = Bucket::concurrent(4);
    let take = want_one(4);
    let c = change(&row(b.clone(), 2, 0), &take, at(1)).unwrap();
    assert_eq!(c.tokens, TokensOp::Add(Tokens::new(-1)));
    assert!(c.holds(&row(b.clone(), 1, 0)));
    assert!(!c.holds(&row(b.clone(), 0, 0)));
    let back = Want {
        restored: Tokens::new(1),
        taken: Tokens::ZERO,
        need: None,
        ceiling: Tokens::new(4),
        fill: true,
        short: false,
        others_per_ks: 0,
        behind: false,
        herd: Herd::Not,
    };
    let c = change(&row(b.clone(), 2, 0), &back, at(1)).unwrap();
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
    (
        -capacity..=capacity,
        -5_000i64..5_000,
        0i64..5_000,
        prop_oneof![
            Just(None),
            Just(Some(0i64)),
            (-5_000i64..5_000).prop_map(Some)
        ],
    )
        .prop_map(move |(t, last, step, herd)| {
            let mut r = row(bucket.clone(), 0, last - step);
            r.tokens = Tokens::from_nanos(t);
            // A herd's timestamp: none, the row's own refill timestamp, or any other.
            r.herd_at = herd.map(|h| if h == 0 { at(last) } else { at(h) });
            // Refilled to `last` from `step` before, so that it carries what a rate leaves.
            let level = refill(r.level(), Tokens::MAX, r.bucket.effective_rate(), at(last));
            r.set_level(Level {
                tokens: Tokens::from_nanos(t),
                ..level
            });
            r
        })
}

/// Other writers' pace on the row (none, or any up to a million a second), and whether a
/// full row is first taken from behind a fill stamped ahead.
fn any_pace() -> impl Strategy<Value = (u64, bool)> {
    (prop_oneof![Just(0u64), 0u64..1_000_000_000], any::<bool>())
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
            (
                0..=capacity,
                any::<bool>(),
                any::<bool>(),
                any_pace(),
                prop_oneof![Just(Herd::Not), Just(Herd::First), Just(Herd::Later)],
            ),
        )
            .prop_map(
                move |(
                    remembered,
                    actual,
                    restored,
                    taken,
                    need,
                    now,
                    (debt, fill, short, p, herd),
                )| {
                    // A waiting caller's need is less by the debt it may leave (below zero).
                    let want = Want {
                        restored: Tokens::from_nanos(restored / 4),
                        taken: Tokens::from_nanos(taken / 2),
                        need: need.map(|n| Tokens::from_nanos(n.max(taken / 2) - debt / 2)),
                        ceiling: remembered.holds(),
                        fill: fill && !short,
                        short,
                        others_per_ks: p.0,
                        behind: p.1,
                        herd,
                    };
                    (remembered, actual, want, now)
                },
            )
    })
}

/// Stale writers (each remembers the row its own last write left) taking from one bucket
/// at microseconds of increasing milliseconds, a change computed again from the row handed
/// back when its conditions fail; the grants, at their milliseconds.
fn stale_writers(
    bucket: &Bucket,
    steps: &[(usize, i64, i64)],
    others_per_ks: u64,
) -> Result<Vec<(i64, Tokens)>, TestCaseError> {
    let capacity = bucket.capacity();
    let mut stored = row(bucket.clone(), 0, 0);
    stored.tokens = capacity;
    let mut remembered = vec![stored.clone(); 4];
    let mut granted = Vec::new();
    let mut micros = at(0).as_millis() * 1_000;
    for (writer, advance, taken) in steps {
        micros += advance;
        let now = UnixMillis::new(micros.div_euclid(1_000));
        let taken = Tokens::new(*taken).min(capacity);
        let mut want = Want {
            restored: Tokens::ZERO,
            taken,
            need: Some(taken),
            ceiling: capacity,
            fill: true,
            short: false,
            others_per_ks,
            behind: true,
            herd: Herd::Not,
        };
        for _ in 0..3 {
            let Some(c) = commute(
                &remembered[*writer],
                &want,
                (now, micros),
                Duration::from_secs(2),
            ) else {
                remembered[*writer] = stored.clone();
                break;
            };
            if c.holds(&stored) {
                let (_, served) = exact(&stored, &want, now);
                prop_assert!(served, "{:?} granted from {:?}", c, stored);
                stored.set_level(c.applied(&stored));
                remembered[*writer] = stored.clone();
                granted.push((now.as_millis(), taken));
                break;
            }
            remembered[*writer] = stored.clone();
            want.behind = false;
        }
    }
    Ok(granted)
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
            // Less where a fill stamped ahead of its instant drops the refill until then.
            // Less by the carry a herd write drops, or a fold computed from a row with
            // another carry at the same timestamp (under a billionth; never more).
            let exactly = actual.last_refill_at >= remembered.last_refill_at
                && c.refill.is_none_or(|(last, _)| last <= now)
                && (c.herd.is_none() || actual.refill_carry.is_zero())
                && (c.refill.is_none() || actual.refill_carry == remembered.refill_carry);
            prop_assert!(
                within(c.applied(&actual), level, &actual.bucket, want.ceiling, now, exactly),
                "{:?} left {:?}, not {:?}", c, c.applied(&actual), level
            );
            if let Some((last, _)) = c.refill {
                prop_assert!(last >= actual.last_refill_at, "moved the refill timestamp back");
            }
            prop_assert!(
                c.applied(&actual).last_refill_at >= actual.last_refill_at,
                "moved the refill timestamp back"
            );
        }
    }

    /// Whatever microsecond of its millisecond the writer's clock reads, a change is right
    /// by milliseconds: it applies only where the bucket serves it, and leaves no more than
    /// giving back, then taking, would have.
    #[test]
    fn a_change_at_any_microsecond_is_right_by_the_millisecond(
        (remembered, actual, want, now) in any_case(),
        micros in 0i64..1_000,
    ) {
        let now = at(now);
        let reading = (now, now.as_millis() * 1_000 + micros);
        if let Some(c) = commute(&remembered, &want, reading, Duration::from_secs(2))
            && c.holds(&actual)
        {
            let (level, served) = exact(&actual, &want, now);
            prop_assert!(served, "granted from a bucket that could not serve it: {:?}", c);
            prop_assert!(
                within(c.applied(&actual), level, &actual.bucket, want.ceiling, now, false),
                "{:?} left {:?}, more than {:?}", c, c.applied(&actual), level
            );
        }
    }

    /// Fast buckets taken from by stale writers at any microsecond: no window of
    /// milliseconds holds more grants than capacity + rate × window, and within one
    /// millisecond a fill after another one applies when the refill between covers it.
    #[test]
    fn stale_writers_never_grant_more_than_capacity_and_rate(
        per_second in prop_oneof![10_000u64..200_000, 200_000u64..5_000_000],
        capacity in 1u64..50,
        steps in proptest::collection::vec(
            (0usize..4, prop_oneof![0i64..50, 0i64..700, 0i64..5_000], 1i64..=3),
            1..200,
        ),
        (others_per_ks, _) in any_pace(),
    ) {
        let bucket = Bucket::tokens(RefillRate::per_second(per_second)).with_capacity(capacity);
        let granted = stale_writers(&bucket, &steps, others_per_ks)?;
        let rate = bucket.effective_rate();
        for (i, (from, _)) in granted.iter().enumerate() {
            let mut sum = Tokens::ZERO;
            for (to, taken) in &granted[i..] {
                sum += *taken;
                let supply = bucket.capacity()
                    + refill(Level::new(Tokens::ZERO, at(*from - T0)), Tokens::MAX, rate, at(*to - T0)).tokens;
                prop_assert!(sum <= supply, "{:?} granted from {} to {} ms: {:?}", sum, from, to, granted);
            }
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
        // A row the refill fills, taken from as if it were not (`fill` false), is refused
        // by design: the writer then learns it is full.
        let rate = remembered.bucket.effective_rate();
        let full = refill(remembered.level(), Tokens::MAX, rate, now).tokens + want.restored
            >= want.ceiling;
        // Nor is a take behind a fill stamped ahead, which needs a row refilled since, nor a
        // join of a herd under way, sent on the guess that the herd drained the row since.
        let guess = |c: &Commute| c.herd.is_some() && remembered.herd_at.is_some();
        // Every set of conditions of a herd write is one some row satisfies.
        if let Some(c) = c.as_ref().filter(|c| c.herd.is_some()) {
            prop_assert!(herd::satisfiable(c), "{:?} has a set no row satisfies", c);
        }
        if let Some(c) = c.filter(|c| {
            (want.fill || !full) && !c.needs_later_refill(&remembered) && !guess(c)
        }) {
            prop_assert!(c.holds(&remembered), "{:?} refused its own row", c);
        }
    }
}
