//! A fleet's first writes to a full row (see [`herd`](crate::bucket::commute::herd)).

use super::*;

/// `row` once `change` is applied to it.
fn applied(row: &BucketState, change: &Commute) -> BucketState {
    let mut after = row.clone();
    after.set_level(change.applied(row));
    after.herd_at = change.herd_after(row);
    after
}

/// A take of one, as a writer's first write to the row (`herd`).
fn first(taken: i64, ceiling: i64, debt: i64) -> Want {
    Want {
        need: Some(Tokens::new(taken - debt)),
        herd: Herd::First,
        ..take(taken, ceiling)
    }
}

/// Whether every set of conditions of `c` is one some row satisfies (its floor on the
/// tokens no higher than its ceiling on them).
pub(super) fn satisfiable(c: &Commute) -> bool {
    std::iter::once(&c.when).chain(&c.or_when).all(|set| {
        let least = set.iter().find_map(|c| match c {
            Condition::TokensAtLeast(t) => Some(*t),
            _ => None,
        });
        let most = set.iter().find_map(|c| match c {
            Condition::TokensAtMost(t) => Some(*t),
            _ => None,
        });
        least.zip(most).is_none_or(|(least, most)| least <= most)
    })
}

/// 20 a second, 10 at most: a call refills in 50 ms, far slower than a fill accepts
/// another writer's fill within.
fn slow() -> Bucket {
    Bucket::requests(RefillRate::per_second(20)).with_capacity(10)
}

/// `writers` first writes, computed from the same full row (as written by another SDK,
/// long ago) one every `apart` ms and landing in that order, each sent again from the row
/// handed back when it fails; how many attempts each took, and the row left.
fn fleet(writers: i64, apart: i64, want: &Want) -> (Vec<u32>, BucketState) {
    let seen = row(slow(), 10, -60_000);
    let mut stored = seen.clone();
    let mut attempts = Vec::new();
    for w in 0..writers {
        let now = at(w * apart);
        let mut from = seen.clone();
        let mut n = 0;
        while let Some(c) = change(&from, want, now) {
            n += 1;
            if c.holds(&stored) {
                stored = applied(&stored, &c);
                break;
            }
            from = stored.clone();
            if n > 4 {
                break;
            }
        }
        attempts.push(n);
    }
    (attempts, stored)
}

#[test]
fn a_fleets_first_writes_to_a_full_row_each_apply_at_the_first_attempt() {
    // 48 processes 2 ms apart, each the row it read before any of them wrote: the first
    // leads, the next nine join; the rest find the bucket empty and are refused.
    let (attempts, stored) = fleet(48, 2, &first(1, 10, 0));
    assert_eq!(attempts[..10], [1; 10], "{attempts:?}");
    // One more once the refill since the lead's timestamp brought a call (50 ms).
    assert_eq!(stored.tokens, Tokens::new(-1));
    // The lead's timestamp, kept by every join: the refill since it is the bucket's.
    assert_eq!(stored.last_refill_at, at(0));
    assert_eq!(stored.herd_at, Some(at(0)));
    // Waiting callers that may leave a debt of 20 join as well: 30 writes, one each.
    let (attempts, stored) = fleet(48, 2, &first(1, 10, 20));
    assert_eq!(attempts[..30], [1; 30], "{attempts:?}");
    assert_eq!(stored.tokens, Tokens::new(-21));
    // As fills instead, every write after the first fails at least once.
    let fill = Want {
        herd: Herd::Not,
        ..first(1, 10, 0)
    };
    let (attempts, _) = fleet(10, 2, &fill);
    assert!(attempts[1..].iter().all(|n| *n > 1), "{attempts:?}");
}

#[test]
fn a_lone_writers_first_take_from_a_full_row_leaves_what_a_fill_would() {
    let full = row(slow(), 10, -60_000);
    let herd = change(&full, &first(1, 10, 0), at(0)).unwrap();
    let fill = Want {
        herd: Herd::Not,
        ..first(1, 10, 0)
    };
    assert_eq!(herd.herd, Some(at(0)));
    assert_eq!(
        herd.applied(&full),
        change(&full, &fill, at(0)).unwrap().applied(&full)
    );
    // Its stored tokens short of full, refill making up the rest: the lead stamps the row
    // back by the whole milliseconds of that refill, and leaves exactly what a fill would,
    // at every later instant.
    let rate = slow().effective_rate();
    for stored in [9, 5, 0] {
        let short = row(slow(), stored, -60_000);
        let lead = change(&short, &first(1, 10, 0), at(0)).unwrap();
        assert!(lead.herd.is_some());
        let filled = change(&short, &fill, at(0)).unwrap().applied(&short);
        for later in [0, 1, 17, 50, 333, 60_000] {
            let t = at(later);
            let ceiling = Tokens::new(10);
            assert_eq!(
                refill(lead.applied(&short), ceiling, rate, t).tokens,
                refill(filled, ceiling, rate, t).tokens
            );
        }
    }
    // Short by a refill no whole number of milliseconds makes (a third of a token, at 20 a
    // second: 16.67 ms): a fill.
    let mut odd = row(slow(), 0, -60_000);
    odd.tokens = Tokens::from_nanos(9_666_666_667);
    assert_eq!(change(&odd, &first(1, 10, 0), at(0)).unwrap().herd, None);
    // Or by one whose whole milliseconds leave a part of a billionth to carry (500 a
    // minute refill 8,333,333⅓ billionths a millisecond): a fill.
    let minute = Bucket::requests(RefillRate::per_minute(500)).with_capacity(10);
    let mut carried = row(minute, 0, -60_000);
    carried.tokens = Tokens::from_nanos(10_000_000_000 - 8_333_333);
    assert_eq!(
        change(&carried, &first(1, 10, 0), at(0)).unwrap().herd,
        None
    );
    // A bucket that refills a call within a millisecond: a fill.
    let fast = Bucket::requests(RefillRate::per_second(1_000)).with_capacity(10);
    let c = change(&row(fast, 10, -60_000), &first(1, 10, 0), at(0)).unwrap();
    assert_eq!(c.herd, None);
}

#[test]
fn a_row_with_a_herd_gets_fills_and_a_fill_ends_the_herd() {
    let (_, mut stored) = fleet(3, 2, &first(1, 10, 0));
    assert_eq!(stored.herd_at, Some(at(0)));
    // Refilled since: full again, a fill, which clears the herd's timestamp.
    let later = at(10_000);
    let c = change(&stored, &first(1, 10, 0), later).unwrap();
    assert_eq!(c.herd, None);
    stored = applied(&stored, &c);
    assert_eq!(stored.herd_at, None);
    assert_eq!(stored.last_refill_at, later);
    // A first write computed before that fill fails on it: the row has no herd to join,
    // and was refilled after its instant, so it leads none.
    let seen = row(slow(), 10, -60_000);
    let late = change(&seen, &first(1, 10, 0), at(4)).unwrap();
    assert!(!late.holds(&stored));
    // One computed from it once it is full again leads a new herd, stamped back by the
    // 50 ms its missing call took to refill.
    let again = at(10_100);
    let next = change(&stored, &first(1, 10, 0), again).unwrap();
    let led = applied(&stored, &next);
    assert_eq!(led.herd_at, Some(at(10_050)));
    assert_eq!(led.tokens, Tokens::new(8));
    assert_eq!(
        refill(led.level(), Tokens::new(10), slow().effective_rate(), again).tokens,
        Tokens::new(9)
    );
}

#[test]
fn a_first_write_from_a_row_read_after_the_lead_joins_the_herd() {
    // The lead took one at 0 ms; the row as read then: 9, stamped at 0, the herd's.
    let (_, seen) = fleet(1, 0, &first(1, 10, 0));
    assert_eq!((seen.tokens, seen.herd_at), (Tokens::new(9), Some(at(0))));
    // Others have drained it since, to a debt of 20 (waiting callers).
    let mut stored = seen.clone();
    stored.tokens = Tokens::new(-20);
    // 300 ms later the row as read has refilled to full: a fill from it would fail on the
    // takes since; the first write joins instead, which the drained row accepts.
    let waiting = first(1, 10, 30);
    let join = change(&seen, &waiting, at(300)).unwrap();
    assert_eq!(join.herd, Some(at(0)));
    // Sent though the row as read (full by now) refuses it: it fails, once, on a row that
    // is full after all, and the retry fills.
    assert!(!join.holds(&seen));
    assert!(join.holds(&stored));
    assert_eq!(applied(&stored, &join).tokens, Tokens::new(-21));
    let fill = Want {
        herd: Herd::Not,
        ..waiting
    };
    assert!(!change(&seen, &fill, at(300)).unwrap().holds(&stored));
    // A later write joins only where its own row shows others' takes: one that took one
    // call from a full row may be alone, and fills.
    let later = Want {
        herd: Herd::Later,
        ..waiting
    };
    assert_eq!(change(&seen, &later, at(300)).unwrap().herd, None);
    let mut taken = seen.clone();
    taken.tokens = Tokens::new(5);
    let joined = change(&taken, &later, at(300)).unwrap();
    assert_eq!(joined.herd, Some(at(0)));
    assert!(joined.holds(&stored));
    // A herd more than a second old is over: a fill.
    assert_eq!(change(&seen, &waiting, at(1_001)).unwrap().herd, None);
    // A caller that may leave no debt joins only a window whose refill leaves it a call:
    // 300 ms after the lead, none does (each would need at most 3.5 stored and at least
    // one, of a full row's 10 less 6.5 refilled, and 3.5 < 1 + the refill), so a fill.
    let plain = first(1, 10, 0);
    let two = Bucket::requests(RefillRate::per_second(20)).with_capacity(2);
    let mut small = row(two, 1, 0);
    small.herd_at = Some(at(0));
    assert_eq!(change(&small, &first(1, 2, 0), at(100)).unwrap().herd, None);
    let c = change(&seen, &plain, at(300)).unwrap();
    assert!(c.or_when.iter().chain([&c.when]).all(|set| {
        set.iter()
            .all(|cond| !matches!(cond, Condition::TokensAtMost(m) if *m < Tokens::new(1)))
    }));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// First writes (and later writes' first attempts) computed from one full row, or from
    /// the row as any earlier write left it, at any instants, landing in any order (a lost
    /// one sent again from the row handed back): every write that applies was served
    /// by the bucket and leaves no more than giving back and taking would have, and no
    /// window holds more grants than capacity + rate × window.
    #[test]
    fn a_fleets_first_writes_never_grant_more_than_capacity_and_rate(
        per_second in 1u64..200,
        capacity in 1u64..20,
        writes in proptest::collection::vec((0i64..400, 0i64..3), 1..64),
        order in proptest::collection::vec(any::<proptest::sample::Index>(), 64),
        seen_at in proptest::collection::vec((any::<proptest::sample::Index>(), any::<bool>()), 64),
    ) {
        let bucket = Bucket::requests(RefillRate::per_second(per_second)).with_capacity(capacity);
        let ceiling = i64::try_from(capacity).unwrap();
        let seen = row(bucket.clone(), ceiling, -60_000);
        let mut stored = seen.clone();
        // Computed at `at(ms)`, in any order of arrival.
        let mut pending: Vec<_> = writes.clone();
        let mut granted = Vec::new();
        let mut clock = 0;
        // The row as it stood after each landing: a writer computes from any of them (read
        // before the fleet wrote, after the lead, or as its own earlier write left it).
        let mut rows = vec![seen.clone()];
        for (i, (read, later)) in order.into_iter().zip(seen_at) {
            if pending.is_empty() {
                break;
            }
            let (ms, debt) = pending.remove(i.index(pending.len()));
            clock = clock.max(ms);
            let now = at(clock);
            let mut want = Want {
                need: Some(Tokens::new(1 - debt)),
                herd: if later { Herd::Later } else { Herd::First },
                ..take(1, ceiling)
            };
            let mut from = rows[read.index(rows.len())].clone();
            for _ in 0..3 {
                let Some(c) = change(&from, &want, now) else { break };
                if c.holds(&stored) {
                    let (level, served) = exact(&stored, &want, now);
                    prop_assert!(served, "{:?} granted from {:?}", c, stored);
                    let after = applied(&stored, &c);
                    prop_assert!(
                        within(after.level(), level, &bucket, want.ceiling, now, false),
                        "{:?} left {:?}, more than {:?}", c, after, level
                    );
                    stored = after;
                    rows.push(stored.clone());
                    granted.push(clock);
                    break;
                }
                from = stored.clone();
                // A retry, from the row handed back, is not a herd write.
                want.herd = Herd::Not;
            }
        }
        let rate = bucket.effective_rate();
        for (i, from) in granted.iter().enumerate() {
            for (n, to) in granted[i..].iter().enumerate() {
                let supply = bucket.capacity()
                    + refill(Level::new(Tokens::ZERO, at(*from)), Tokens::MAX, rate, at(*to)).tokens;
                // Granted in debt: the debt is owed to the refill after the window.
                let debt = Tokens::new(2);
                prop_assert!(
                    Tokens::new(i64::try_from(n + 1).unwrap()) <= supply + debt,
                    "{} granted from {} to {} ms: {:?}", n + 1, from, to, granted
                );
            }
        }
    }
}
