//! The freshness rules, one by one.

use super::*;
use crate::acquire::Acquire;
use crate::bucket::Bucket;
use crate::rate::RefillRate;

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

#[test]
fn a_denial_from_memory_needs_a_window_the_store_opened() {
    let mut memory = Remembered::default();
    assert_eq!(memory.recall(&wanted(1), t(0), None), Recall::Nothing);
    // 10 per second, empty: 1 token is 100 ms away.
    memory.learn(
        empty_row(Bucket::requests(RefillRate::per_second(10))),
        t(0),
    );
    assert_eq!(memory.recall(&wanted(1), t(0), None), Recall::Unconfirmed);
    memory.confirm_short(t(0), Duration::from_millis(100), Tokens::ZERO);
    assert_eq!(
        memory.recall(&wanted(1), t(40), None),
        Recall::Denied(Duration::from_millis(60))
    );
    // A larger cost, inside the window: exact for the same row.
    assert_eq!(
        memory.recall(&wanted(3), t(40), None),
        Recall::Denied(Duration::from_millis(260))
    );
    // The window ends at the RetryIn: then the row serves 1, but 3 must ask the store.
    assert_eq!(memory.recall(&wanted(1), t(100), None), Recall::Serves);
    assert_eq!(memory.recall(&wanted(3), t(100), None), Recall::Unconfirmed);
    // A waiter that began waiting after the row was learned does not take it.
    assert_eq!(
        memory.recall(&wanted(3), t(50), Some(t(10))),
        Recall::Unconfirmed
    );
    assert_eq!(
        memory.recall(&wanted(3), t(50), Some(t(0))),
        Recall::Unconfirmed
    );
    // A new row closes the window.
    memory.learn(
        empty_row(Bucket::requests(RefillRate::per_second(10))),
        t(60),
    );
    assert_eq!(memory.recall(&wanted(1), t(60), None), Recall::Unconfirmed);
}

#[test]
fn a_write_that_empties_the_bucket_opens_a_window_until_it_can_serve_a_call() {
    let mut memory = Remembered::default();
    memory.learn_written(
        empty_row(Bucket::requests(RefillRate::per_second(10))),
        t(0),
    );
    assert_eq!(
        memory.recall(&wanted(1), t(30), None),
        Recall::Denied(Duration::from_millis(70))
    );
    assert_eq!(memory.recall(&wanted(1), t(100), None), Recall::Serves);
    // A write that leaves enough for a call opens none: a refusal of more asks the store.
    let mut row = empty_row(Bucket::requests(RefillRate::per_second(10)));
    row.tokens = Tokens::new(5);
    memory.learn_written(row, t(200));
    assert_eq!(memory.recall(&wanted(9), t(200), None), Recall::Unconfirmed);
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
    assert_eq!(
        memory.recall(&at(1, "batch"), t(0), None),
        Recall::Denied(Duration::from_millis(100))
    );
    // `interactive` may take the reserve: served, though inside the window.
    assert_eq!(
        memory.recall(&at(3, "interactive"), t(0), None),
        Recall::Serves
    );
    assert_eq!(memory.recall(&at(1, "batch"), t(100), None), Recall::Serves);
}

#[test]
fn memory_stops_answering_once_any_answered_retry_in_runs_out() {
    let mut memory = Remembered::default();
    memory.learn(
        empty_row(Bucket::requests(RefillRate::per_second(10))),
        t(0),
    );
    // A store denial of 5 tokens opens a 500 ms window; one of 1 token was answered too,
    // ending at 100 ms.
    memory.confirm_short(t(0), Duration::from_millis(500), Tokens::ZERO);
    memory.answered(t(500));
    memory.answered(t(100));
    assert_eq!(
        memory.recall(&wanted(4), t(50), None),
        Recall::Denied(Duration::from_millis(350))
    );
    // At 100 ms the 1-token caller may be back: from then on, the store answers.
    assert_eq!(memory.recall(&wanted(4), t(100), None), Recall::Unconfirmed);
    // A look at the store drops the RetryIns that ended before it.
    memory.learn(
        empty_row(Bucket::requests(RefillRate::per_second(10))),
        t(120),
    );
    memory.confirm_short(t(120), Duration::from_millis(400), Tokens::ZERO);
    assert_eq!(
        memory.recall(&wanted(4), t(130), None),
        Recall::Denied(Duration::from_millis(270))
    );
    // The 500 ms one is still outstanding.
    assert_eq!(
        memory.recall(&wanted(9), t(499), None),
        Recall::Denied(Duration::from_millis(401))
    );
    assert_eq!(memory.recall(&wanted(9), t(500), None), Recall::Unconfirmed);
}

#[test]
fn retry_ins_beyond_what_memory_tracks_stop_memory_answers_until_the_next_look() {
    let mut memory = Remembered::default();
    memory.learn(
        empty_row(Bucket::requests(RefillRate::per_second(10))),
        t(0),
    );
    memory.confirm_short(t(0), Duration::from_secs(10), Tokens::ZERO);
    for i in 0..MAX_OUTSTANDING as i64 {
        memory.answered(t(5_000 + i));
    }
    assert!(matches!(
        memory.recall(&wanted(5), t(10), None),
        Recall::Denied(_)
    ));
    // One more does not fit: until a look after it, refusals come from the store.
    memory.answered(t(200));
    assert_eq!(memory.recall(&wanted(5), t(10), None), Recall::Unconfirmed);
    memory.learn(
        empty_row(Bucket::requests(RefillRate::per_second(10))),
        t(100),
    );
    memory.confirm_short(t(100), Duration::from_secs(10), Tokens::ZERO);
    assert_eq!(memory.recall(&wanted(5), t(150), None), Recall::Unconfirmed);
    memory.learn(
        empty_row(Bucket::requests(RefillRate::per_second(10))),
        t(200),
    );
    memory.confirm_short(t(200), Duration::from_secs(10), Tokens::ZERO);
    assert!(matches!(
        memory.recall(&wanted(5), t(250), None),
        Recall::Denied(_)
    ));
}

#[test]
fn a_short_slot_bucket_is_remembered_at_most_the_poll_interval() {
    let poll = Duration::from_millis(300);
    let mut memory = Remembered::default();
    memory.learn(empty_row(Bucket::concurrent(2)), t(0));
    assert_eq!(memory.recall(&wanted(1), t(0), None), Recall::Unconfirmed);
    // The earliest lease may be given back in 60 s, but its holder may release it any
    // moment: look again after the poll interval, and remember the shortage until then.
    let back = SlotsBack {
        earliest: Some(t(60_000)),
        releasable: true,
        cooling_until: None,
    };
    assert_eq!(
        memory.confirm_slots_short(t(0), back, poll, Tokens::ZERO),
        poll
    );
    assert_eq!(memory.slots_back(t(100), poll), Some(back));
    assert_eq!(
        memory.recall(&wanted(1), t(100), None),
        Recall::Denied(Duration::from_millis(200))
    );
    assert_eq!(memory.recall(&wanted(1), t(300), None), Recall::Unconfirmed);
    // Read again, unchanged: the lookup still holds; changed: it is looked up again.
    let row = memory.row().cloned().unwrap();
    memory.learn(row.clone(), t(300));
    assert_eq!(memory.slots_back(t(300), poll), Some(back));
    memory.learn(
        BucketState {
            version: row.version + 1,
            ..row
        },
        t(300),
    );
    assert_eq!(memory.slots_back(t(300), poll), None);
    // No live lease explains the shortage: look again after the poll interval.
    let none = SlotsBack::default();
    assert_eq!(
        memory.confirm_slots_short(t(300), none, poll, Tokens::ZERO),
        poll
    );
    assert_eq!(
        memory.recall(&wanted(1), t(400), None),
        Recall::Denied(Duration::from_millis(200))
    );
    // That no lease showed holds the poll interval for the same row, no longer.
    memory.learn(memory.row().cloned().unwrap(), t(450));
    assert_eq!(memory.slots_back(t(450), poll), Some(none));
    assert_eq!(memory.slots_back(t(600), poll), None);
    // A cost above the capacity is never answered from memory.
    assert_eq!(memory.recall(&wanted(3), t(400), None), Recall::Unconfirmed);
}

#[test]
fn a_slot_back_sooner_than_the_poll_interval_is_the_retry_in() {
    let poll = Duration::from_millis(300);
    let mut memory = Remembered::default();
    memory.learn(empty_row(Bucket::concurrent(2)), t(0));
    let soon = SlotsBack {
        earliest: Some(t(120)),
        releasable: true,
        cooling_until: None,
    };
    assert_eq!(
        memory.confirm_slots_short(t(0), soon, poll, Tokens::ZERO),
        Duration::from_millis(120)
    );
    assert_eq!(
        memory.recall(&wanted(1), t(20), None),
        Recall::Denied(Duration::from_millis(100))
    );
    assert_eq!(memory.recall(&wanted(1), t(120), None), Recall::Unconfirmed);
}

#[test]
fn a_cool_down_nobody_releases_is_waited_out_exactly() {
    let poll = Duration::from_millis(300);
    let mut memory = Remembered::default();
    memory.learn(empty_row(Bucket::concurrent(2)), t(0));
    // A cool-down after a vendor's 429 holds every slot: nothing is granted before it ends,
    // 7 s from now, whatever the holder of another lease releases; the shortage is still
    // remembered no longer than the poll interval.
    let cooling = SlotsBack {
        earliest: Some(t(3_000)),
        releasable: true,
        cooling_until: Some(t(7_000)),
    };
    assert_eq!(
        memory.confirm_slots_short(t(0), cooling, poll, Tokens::ZERO),
        Duration::from_secs(7)
    );
    assert_eq!(
        memory.recall(&wanted(1), t(100), None),
        Recall::Denied(Duration::from_millis(6_900))
    );
    assert_eq!(memory.recall(&wanted(1), t(300), None), Recall::Unconfirmed);
}

#[test]
fn a_row_whose_version_went_down_replaces_the_remembered_one() {
    let mut memory = Remembered::default();
    let mut newer = empty_row(Bucket::requests(RefillRate::per_second(10)));
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
