//! The freshness rules, one by one.

use super::*;
use crate::acquire::Acquire;
use crate::bucket::Bucket;
use crate::rate::RefillRate;

/// The slot poll interval of the `concurrent` tests.
const POLL: Duration = Duration::from_millis(300);

fn t(ms: i64) -> UnixMillis {
    UnixMillis::new(1_700_000_000_000 + ms)
}

fn wanted(cost: i64) -> Wanted {
    Acquire::with_cost("v#rpm", cost)
        .resolve()
        .unwrap()
        .remove(0)
}

fn empty_row(bucket: Bucket) -> BucketState {
    let mut row = BucketState::full("v#rpm".parse().unwrap(), bucket, t(0));
    row.tokens = Tokens::ZERO;
    row
}

/// An empty row of a `requests` bucket refilling 10 a second: 1 token is 100 ms away.
fn empty_ten_per_second() -> BucketState {
    empty_row(Bucket::requests(RefillRate::per_second(10)))
}

/// What `memory` says at `at_ms` about a request of `cost`, for a caller not waiting.
fn recall(memory: &Remembered, cost: i64, at_ms: i64) -> Recall {
    memory.recall(&wanted(cost), t(at_ms), None)
}

/// A refusal from memory with a RetryIn of `ms`.
fn denied(ms: u64) -> Recall {
    Recall::Denied(Duration::from_millis(ms))
}

/// A memory that learned an empty [`empty_ten_per_second`] row at 0.
fn ten_per_second_learned() -> Remembered {
    let mut memory = Remembered::default();
    memory.learn(empty_ten_per_second(), t(0));
    memory
}

/// A memory that learned an empty `concurrent` row of 2 slots at 0.
fn two_slots_learned() -> Remembered {
    let mut memory = Remembered::default();
    memory.learn(empty_row(Bucket::concurrent(2)), t(0));
    memory
}

/// A [`two_slots_learned`] memory whose shortage the store confirmed at 0, with what the
/// leases said (`back`); and the RetryIn that confirmation answers.
fn slots_short(back: SlotsBack) -> (Remembered, Duration) {
    let mut memory = two_slots_learned();
    let retry_in = memory.confirm_slots_short(t(0), back, POLL, Tokens::ZERO);
    (memory, retry_in)
}

/// Live leases that their holder may release, one of them given back at `earliest_ms`
/// by anyone, and a cool-down until `cooling_ms` if one showed.
fn releasable(earliest_ms: i64, cooling_ms: Option<i64>) -> SlotsBack {
    SlotsBack {
        earliest: Some(t(earliest_ms)),
        releasable: true,
        cooling_until: cooling_ms.map(t),
    }
}

#[test]
fn a_denial_from_memory_needs_a_window_the_store_opened() {
    let mut memory = Remembered::default();
    assert_eq!(recall(&memory, 1, 0), Recall::Nothing);
    // 10 per second, empty: 1 token is 100 ms away.
    memory.learn(empty_ten_per_second(), t(0));
    assert_eq!(recall(&memory, 1, 0), Recall::Unconfirmed);
    memory.confirm_short(t(0), Duration::from_millis(100), Tokens::ZERO);
    assert_eq!(recall(&memory, 1, 40), denied(60));
    // A larger cost, inside the window: exact for the same row.
    assert_eq!(recall(&memory, 3, 40), denied(260));
    // The window ends at the RetryIn: then the row serves 1, but 3 must ask the store.
    assert_eq!(recall(&memory, 1, 100), Recall::Serves);
    assert_eq!(recall(&memory, 3, 100), Recall::Unconfirmed);
    // A waiter that began waiting after the row was learned does not take it.
    let waiting_since = |since_ms| memory.recall(&wanted(3), t(50), Some(t(since_ms)));
    assert_eq!(waiting_since(10), Recall::Unconfirmed);
    assert_eq!(waiting_since(0), Recall::Unconfirmed);
    // A new row closes the window.
    memory.learn(empty_ten_per_second(), t(60));
    assert_eq!(recall(&memory, 1, 60), Recall::Unconfirmed);
}

#[test]
fn a_write_that_empties_the_bucket_opens_a_window_until_it_can_serve_a_call() {
    let mut memory = Remembered::default();
    memory.learn_written(empty_ten_per_second(), t(0));
    assert_eq!(recall(&memory, 1, 30), denied(70));
    assert_eq!(recall(&memory, 1, 100), Recall::Serves);
    // A write that leaves enough for a call opens none: a refusal of more asks the store.
    let mut row = empty_ten_per_second();
    row.tokens = Tokens::new(5);
    memory.learn_written(row, t(200));
    assert_eq!(recall(&memory, 9, 200), Recall::Unconfirmed);
}

#[test]
fn a_write_that_leaves_only_reserves_opens_a_window_each_priority_answers_exactly() {
    let at = |cost: i64, priority: &str| {
        let mut w = wanted(cost);
        w.priority = Some(priority.parse().unwrap());
        w
    };
    let bucket = Bucket::requests(RefillRate::per_second(10))
        .with_capacity(10)
        .with_reserve("interactive".parse().unwrap(), 3);
    let mut row = empty_row(bucket);
    row.tokens = Tokens::new(3);
    let mut memory = Remembered::default();
    memory.learn_written(row, t(0));
    // `batch` (not listed) must leave 3: one call is 100 ms away, from memory.
    assert_eq!(memory.recall(&at(1, "batch"), t(0), None), denied(100));
    // `interactive` may take the reserve: served, though inside the window.
    assert_eq!(
        memory.recall(&at(3, "interactive"), t(0), None),
        Recall::Serves
    );
    assert_eq!(memory.recall(&at(1, "batch"), t(100), None), Recall::Serves);
}

#[test]
fn memory_stops_answering_once_any_answered_retry_in_runs_out() {
    let mut memory = ten_per_second_learned();
    // A store denial of 5 tokens opens a 500 ms window; one of 1 token was answered too,
    // ending at 100 ms.
    memory.confirm_short(t(0), Duration::from_millis(500), Tokens::ZERO);
    memory.answered(t(500));
    memory.answered(t(100));
    assert_eq!(recall(&memory, 4, 50), denied(350));
    // At 100 ms the 1-token caller may be back: from then on, the store answers.
    assert_eq!(recall(&memory, 4, 100), Recall::Unconfirmed);
    // A look at the store drops the RetryIns that ended before it.
    memory.learn(empty_ten_per_second(), t(120));
    memory.confirm_short(t(120), Duration::from_millis(400), Tokens::ZERO);
    assert_eq!(recall(&memory, 4, 130), denied(270));
    // The 500 ms one is still outstanding.
    assert_eq!(recall(&memory, 9, 499), denied(401));
    assert_eq!(recall(&memory, 9, 500), Recall::Unconfirmed);
}

#[test]
fn retry_ins_beyond_what_memory_tracks_stop_memory_answers_until_the_next_look() {
    let mut memory = ten_per_second_learned();
    memory.confirm_short(t(0), Duration::from_secs(10), Tokens::ZERO);
    for i in 0..MAX_OUTSTANDING as i64 {
        memory.answered(t(5_000 + i));
    }
    assert!(matches!(recall(&memory, 5, 10), Recall::Denied(_)));
    // One more does not fit: until a look after it, refusals come from the store.
    memory.answered(t(200));
    assert_eq!(recall(&memory, 5, 10), Recall::Unconfirmed);
    // A look at the store, and a store denial it confirms, at `at_ms`.
    let look = |memory: &mut Remembered, at_ms| {
        memory.learn(empty_ten_per_second(), t(at_ms));
        memory.confirm_short(t(at_ms), Duration::from_secs(10), Tokens::ZERO);
    };
    look(&mut memory, 100);
    assert_eq!(recall(&memory, 5, 150), Recall::Unconfirmed);
    look(&mut memory, 200);
    assert!(matches!(recall(&memory, 5, 250), Recall::Denied(_)));
}

#[test]
fn a_short_slot_bucket_is_remembered_at_most_the_poll_interval() {
    let mut memory = two_slots_learned();
    assert_eq!(recall(&memory, 1, 0), Recall::Unconfirmed);
    // The earliest lease may be given back in 60 s, but its holder may release it any
    // moment: look again after the poll interval, and remember the shortage until then.
    let back = releasable(60_000, None);
    assert_eq!(
        memory.confirm_slots_short(t(0), back, POLL, Tokens::ZERO),
        POLL
    );
    assert_eq!(memory.slots_back(t(100), POLL), Some(back));
    assert_eq!(recall(&memory, 1, 100), denied(200));
    assert_eq!(recall(&memory, 1, 300), Recall::Unconfirmed);
    // Read again, unchanged: the lookup still holds; changed: it is looked up again.
    let row = memory.row().cloned().unwrap();
    memory.learn(row.clone(), t(300));
    assert_eq!(memory.slots_back(t(300), POLL), Some(back));
    memory.learn(
        BucketState {
            version: row.version + 1,
            ..row
        },
        t(300),
    );
    assert_eq!(memory.slots_back(t(300), POLL), None);
    // No live lease explains the shortage: look again after the poll interval.
    let none = SlotsBack::default();
    assert_eq!(
        memory.confirm_slots_short(t(300), none, POLL, Tokens::ZERO),
        POLL
    );
    assert_eq!(recall(&memory, 1, 400), denied(200));
    // That no lease showed holds the poll interval for the same row, no longer.
    memory.learn(memory.row().cloned().unwrap(), t(450));
    assert_eq!(memory.slots_back(t(450), POLL), Some(none));
    assert_eq!(memory.slots_back(t(600), POLL), None);
    // A cost above the capacity is never answered from memory.
    assert_eq!(recall(&memory, 3, 400), Recall::Unconfirmed);
}

#[test]
fn a_slot_back_sooner_than_the_poll_interval_is_the_retry_in() {
    let (memory, retry_in) = slots_short(releasable(120, None));
    assert_eq!(retry_in, Duration::from_millis(120));
    assert_eq!(recall(&memory, 1, 20), denied(100));
    assert_eq!(recall(&memory, 1, 120), Recall::Unconfirmed);
}

#[test]
fn a_cool_down_nobody_releases_is_waited_out_exactly() {
    // A cool-down after a vendor's 429 holds every slot: nothing is granted before it ends,
    // 7 s from now, whatever the holder of another lease releases; the shortage is still
    // remembered no longer than the poll interval.
    let (memory, retry_in) = slots_short(releasable(3_000, Some(7_000)));
    assert_eq!(retry_in, Duration::from_secs(7));
    assert_eq!(recall(&memory, 1, 100), denied(6_900));
    assert_eq!(recall(&memory, 1, 300), Recall::Unconfirmed);
}

#[test]
fn a_row_whose_version_went_down_replaces_the_remembered_one() {
    let mut memory = Remembered::default();
    let mut newer = empty_ten_per_second();
    newer.version = 42;
    memory.learn(newer, t(0));
    let reseeded = BucketState::full(
        "v#rpm".parse().unwrap(),
        Bucket::requests(RefillRate::per_second(10)),
        t(5),
    );
    memory.learn(reseeded.clone(), t(5));
    assert_eq!(memory.row(), Some(&reseeded));
}
