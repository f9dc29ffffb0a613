use super::*;
use crate::bucket::LimitType;

/// 2027-01-15 00:00 UTC.
const DAY: i64 = 1_800_057_600_000;

fn at(hour: i64, minute: i64) -> UnixMillis {
    UnixMillis::new(DAY + hour * 3_600_000 + minute * 60_000)
}

fn limits(capacity: i64, per_second: u64) -> Limits {
    Limits {
        capacity: Tokens::new(capacity),
        refill: RefillRate::per_second(per_second),
        reserves: Vec::new(),
    }
}

fn window(from: &str, to: &str, limits: Limits) -> Window {
    Window {
        from: from.parse().unwrap(),
        to: to.parse().unwrap(),
        limits,
    }
}

fn scheduled() -> Bucket {
    Bucket::tokens(RefillRate::per_second(100))
        .with_capacity(1_000)
        .with_schedule(vec![
            window("22:00", "06:00", limits(5_000, 500)),
            window("12:00", "13:00", limits(2_000, 200)),
        ])
}

#[test]
fn the_limits_follow_the_windows_across_midnight() {
    let b = scheduled();
    assert_eq!(b.at(at(0, 0)).capacity(), Tokens::new(5_000));
    assert_eq!(b.at(at(5, 59)).capacity(), Tokens::new(5_000));
    assert_eq!(b.at(at(6, 0)).capacity(), Tokens::new(1_000));
    assert_eq!(b.at(at(12, 30)).refill_rate(), RefillRate::per_second(200));
    assert_eq!(b.at(at(13, 0)).capacity(), Tokens::new(1_000));
    assert_eq!(b.at(at(22, 0)).capacity(), Tokens::new(5_000));
    assert_eq!(b.at(at(21, 59)).limit_type(), LimitType::Tokens);
    // The bucket as applied keeps its schedule.
    assert_eq!(b.at(at(0, 0)).schedule(), b.schedule());
}

#[test]
fn the_next_change_is_the_next_boundary_that_changes_the_limits() {
    let b = scheduled();
    let s = b.schedule().unwrap();
    assert_eq!(s.next_change(at(7, 0)).unwrap().0, at(12, 0));
    assert_eq!(s.next_change(at(12, 0)).unwrap().0, at(13, 0));
    let (t, l) = s.next_change(at(13, 0)).unwrap();
    assert_eq!((t, l.capacity), (at(22, 0), Tokens::new(5_000)));
    // Past midnight, into the next day.
    assert_eq!(s.next_change(at(23, 0)).unwrap().0, at(30, 0));
    let always = Bucket::tokens(RefillRate::per_second(1)).with_schedule(vec![window(
        "00:00",
        "24:00",
        limits(5, 1),
    )]);
    assert_eq!(always.schedule().unwrap().next_change(at(3, 0)), None);
}

#[test]
fn the_text_form_round_trips() {
    let b = scheduled().with_schedule(Vec::new());
    assert!(b.schedule().is_none(), "no windows: no schedule");
    let mut reserved = limits(5_000, 500);
    reserved.reserves.push(Reserve {
        priority: "interactive".parse().unwrap(),
        tokens: Tokens::new(400),
    });
    let b = Bucket::tokens(RefillRate::per_minute(500))
        .with_capacity(500)
        .with_schedule(vec![window("22:30", "06:00", reserved)]);
    let s = b.schedule().unwrap();
    let text = s.to_string();
    assert_eq!(
        text,
        "base capacity=500 refill=500/min; 22:30-06:00 capacity=5000 refill=500/s reserves=interactive:400"
    );
    assert_eq!(&text.parse::<Schedule>().unwrap(), s);
    for bad in [
        "",
        "capacity=1",
        "base capacity=1",
        "base capacity=1 refill=1/s; 25:00-01:00 capacity=1 refill=1/s",
        "base capacity=1 refill=1/s; 01:00 capacity=1",
        "base capacity=1 refill=1/s colour=red",
    ] {
        assert!(bad.parse::<Schedule>().is_err(), "{bad}");
    }
}

#[test]
fn every_window_is_checked_as_a_bucket() {
    assert!(scheduled().validate().is_ok());
    let empty = Bucket::tokens(RefillRate::per_second(1)).with_schedule(vec![window(
        "06:00",
        "06:00",
        limits(5, 1),
    )]);
    assert_eq!(empty.validate(), Err(BucketError::EmptyWindow(0)));
    let no_refill = Bucket::tokens(RefillRate::per_second(1)).with_schedule(vec![
        window("06:00", "07:00", limits(5, 1)),
        window("08:00", "09:00", limits(5, 0)),
    ]);
    let e = no_refill.validate().unwrap_err();
    assert!(matches!(e, BucketError::Window { window: 1, .. }), "{e}");
    assert_eq!(e.attribute(), "schedule");
}
