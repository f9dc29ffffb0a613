use super::*;
use crate::bucket::testing::any_rate_in_nanos;
use crate::bucket::{RecentWrites, RefillCarry};

fn seed_row() -> Item {
    HashMap::from([
        (KEY.to_owned(), s("openai#rpm")),
        (CAPACITY.to_owned(), n("100")),
        (TOKENS.to_owned(), n("47.0")),
        (REFILL_RATE.to_owned(), n("1.667")),
        (LAST_REFILL_AT.to_owned(), n("1709550002")),
        (COST_PER_CALL.to_owned(), n("1")),
        (LIMIT_TYPE.to_owned(), s("requests")),
        (VERSION.to_owned(), n("42")),
    ])
}

#[test]
fn reads_the_seed_example_row_exactly() {
    let b = bucket_state(&seed_row()).unwrap();
    assert_eq!(b.dimension.as_str(), "openai#rpm");
    assert_eq!(b.bucket.capacity(), Tokens::new(100));
    assert_eq!(b.tokens, Tokens::new(47));
    assert_eq!(b.bucket.refill_rate(), "1.667".parse().unwrap());
    assert_eq!(b.last_refill_at, UnixMillis::from_secs(1_709_550_002));
    assert_eq!(b.version, 42);
    assert_eq!(b.write_id, None);
    assert_eq!(bucket_state(&bucket_item(&b)).unwrap(), b);
    let stamped = BucketState {
        write_id: Some(0x00ab_cdef_0123_4567),
        recent_writes: RecentWrites::default(),
        ..b
    };
    let item = bucket_item(&stamped);
    assert_eq!(item[WRITE_ID], s("00abcdef01234567"));
    assert_eq!(bucket_state(&item).unwrap(), stamped);
    let remembering = BucketState {
        recent_writes: RecentWrites {
            writes: vec![
                (1, UnixMillis::new(1_709_550_001_000)),
                (u64::MAX, UnixMillis::new(1_709_550_002_000)),
            ],
            forgotten: UnixMillis::new(1_709_550_000_500),
        },
        ..stamped
    };
    let item = bucket_item(&remembering);
    let mut bytes = Vec::new();
    for word in [
        1_709_550_000_500u64,
        1,
        1_709_550_001_000,
        u64::MAX,
        1_709_550_002_000,
    ] {
        bytes.extend_from_slice(&word.to_be_bytes());
    }
    assert_eq!(item[RECENT_WRITES], blob(bytes));
    assert_eq!(bucket_state(&item).unwrap(), remembering);
    // Only a forgotten time (every listed write dropped by another writer): kept too.
    let forgetting = BucketState {
        recent_writes: RecentWrites {
            writes: Vec::new(),
            forgotten: UnixMillis::new(1_709_550_000_500),
        },
        ..remembering
    };
    let item = bucket_item(&forgetting);
    assert!(item.contains_key(RECENT_WRITES));
    assert_eq!(bucket_state(&item).unwrap(), forgetting);
    // A burst learned from the vendor: kept only when there is one.
    assert!(!item.contains_key(BURST));
    let learned = BucketState {
        burst: Some(Tokens::new(10)),
        ..forgetting
    };
    let item = bucket_item(&learned);
    assert_eq!(item[BURST], n("10"));
    assert_eq!(bucket_state(&item).unwrap(), learned);
    // A bound on its rows: kept only when there is one.
    assert!(!item.contains_key(SHARD_LIMIT));
    let capped = BucketState {
        bucket: learned
            .bucket
            .clone()
            .with_shards(crate::ShardLimit::AtMost(8)),
        ..learned
    };
    let item = bucket_item(&capped);
    assert_eq!(item[SHARD_LIMIT], s("<=8"));
    assert_eq!(bucket_state(&item).unwrap(), capped);
}

#[test]
fn a_write_ceiling_learned_is_kept_only_when_there_is_one() {
    let row = bucket_state(&seed_row()).unwrap();
    let item = bucket_item(&row);
    assert!(!item.contains_key(WRITE_CEILING));
    let ceiling = BucketState {
        write_ceiling: Some(160),
        ..row
    };
    let item = bucket_item(&ceiling);
    assert_eq!(item[WRITE_CEILING], n("160"));
    assert_eq!(bucket_state(&item).unwrap(), ceiling);
}

#[test]
fn float_noise_from_other_sdks_rounds_toward_fewer_tokens_and_rates_are_read_exactly() {
    let mut row = seed_row();
    row.insert(TOKENS.to_owned(), n("46.666666666666664"));
    row.insert(REFILL_RATE.to_owned(), n("1.6666666666666667"));
    row.insert(LAST_REFILL_AT.to_owned(), n("1709550002.1234567"));
    let b = bucket_state(&row).unwrap();
    assert_eq!(b.tokens.to_string(), "46.666666666");
    assert_eq!(
        b.bucket.refill_rate().stored_decimal(),
        ("1.6666666666666667".to_owned(), true)
    );
    assert_eq!(b.last_refill_at, UnixMillis::new(1_709_550_002_124));
}

#[test]
fn a_per_day_rate_another_sdk_wrote_is_read_exactly_and_honoured() {
    let mut row = seed_row();
    row.insert(TOKENS.to_owned(), n("0"));
    row.insert(REFILL_RATE.to_owned(), n("0.000011574074074074"));
    let b = bucket_state(&row).unwrap();
    assert_eq!(
        b.bucket.refill_rate(),
        RefillRate::from_parts(11_574_074_074_074, 1_000_000_000_000_000_000).unwrap()
    );
    let day = b
        .last_refill_at
        .saturating_add(std::time::Duration::from_secs(86_400));
    // 86,400 s at 0.000011574074074074 a second: 0.9999999999999936 tokens.
    assert_eq!(b.available(day), Tokens::from_nanos(999_999_999));
    // One token takes 86,400.0000000000055 s: RetryIn rounds it up to the millisecond.
    assert_eq!(
        b.take(Tokens::new(1), b.last_refill_at),
        crate::Take::Short {
            wait: Some(std::time::Duration::from_millis(86_400_001))
        }
    );
    // Written back, the rate is the same decimal and needs nothing else.
    let item = bucket_item(&b);
    assert_eq!(item[REFILL_RATE], n("0.000011574074074074"));
    assert!(!item.contains_key(REFILL_AMOUNT) && !item.contains_key(REFILL_PERIOD));
    assert_eq!(bucket_state(&item).unwrap(), b);
}

#[test]
fn a_rate_refill_rate_cannot_hold_is_stored_in_parts_too() {
    let mut b = bucket_state(&seed_row()).unwrap();
    b.bucket = Bucket::requests(RefillRate::per_minute(500)).with_capacity(100);
    let item = bucket_item(&b);
    assert_eq!(item[REFILL_RATE], n(format!("8.{}", "3".repeat(37))));
    assert_eq!(
        (&item[REFILL_AMOUNT], &item[REFILL_PERIOD]),
        (&n("500"), &n("60"))
    );
    assert_eq!(bucket_state(&item).unwrap(), b);
    // Another tool sets `refill_rate` alone: the parts no longer agree with it and are
    // not used.
    let mut changed = item.clone();
    changed.insert(REFILL_RATE.to_owned(), n("10"));
    assert_eq!(
        bucket_state(&changed).unwrap().bucket.refill_rate(),
        RefillRate::per_second(10)
    );
    let mut bad = item;
    bad.insert(REFILL_PERIOD.to_owned(), n("0"));
    assert!(
        matches!(bucket_state(&bad), Err(StoreError::CorruptRow { reason, .. }) if reason.contains(REFILL_AMOUNT))
    );
}

#[test]
fn a_carry_is_kept_only_beside_the_refill_timestamp_it_was_earned_by() {
    let mut b = bucket_state(&seed_row()).unwrap();
    b.bucket = Bucket::requests(RefillRate::per_day(1)).with_capacity(10);
    b.tokens = Tokens::ZERO;
    let later = b
        .last_refill_at
        .saturating_add(std::time::Duration::from_millis(1));
    b.set_level(b.refilled(later));
    assert_eq!(b.tokens, Tokens::from_nanos(11));
    assert_eq!(b.refill_carry, RefillCarry::new(31, 54).unwrap());
    let item = bucket_item(&b);
    assert_eq!(
        item[REFILL_CARRY],
        s(format!("31/54@{}", later.as_millis()))
    );
    assert_eq!(bucket_state(&item).unwrap(), b);
    // Another SDK refilled the row since (a new `last_refill_at`): the carry is not its.
    let mut moved = item.clone();
    moved.insert(LAST_REFILL_AT.to_owned(), n("1709550003"));
    assert_eq!(
        bucket_state(&moved).unwrap().refill_carry,
        RefillCarry::ZERO
    );
    for bad in ["31/54", "54/54@1", "x/54@1", "31/0@1"] {
        let mut broken = item.clone();
        broken.insert(REFILL_CARRY.to_owned(), s(bad));
        assert!(bucket_state(&broken).is_err(), "{bad}");
    }
}

proptest::proptest! {
    /// Any rate, and any level refill leaves a bucket at, reads back from the row exactly.
    #[test]
    fn rates_and_levels_round_trip_through_the_row(
        rate in any_rate_in_nanos(),
        tokens in -1_000_000i64..1_000_000,
        elapsed in 0u64..100_000_000,
    ) {
        let mut b = bucket_state(&seed_row()).unwrap();
        b.bucket = Bucket::tokens(rate).with_capacity(Tokens::MAX);
        b.tokens = Tokens::new(tokens);
        let level = b.refilled(b.last_refill_at.saturating_add(std::time::Duration::from_millis(elapsed)));
        b.set_level(level);
        proptest::prop_assert_eq!(bucket_state(&bucket_item(&b)).unwrap(), b);
    }
}

type Mutation = Box<dyn Fn(&mut Item)>;

/// A mutation that sets `attribute` to `value`.
fn setting(attribute: &'static str, value: AttributeValue) -> Mutation {
    Box::new(move |r| {
        r.insert(attribute.to_owned(), value.clone());
    })
}

/// A binary attribute of these bytes.
fn blob(bytes: Vec<u8>) -> AttributeValue {
    AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(bytes))
}

/// Each mutated seed row is refused as corrupt, naming the attribute and the reason.
fn assert_named(cases: Vec<(&str, Mutation)>) {
    for (expected, mutate) in cases {
        let mut row = seed_row();
        mutate(&mut row);
        let e = bucket_state(&row).unwrap_err();
        assert!(
            matches!(e, StoreError::CorruptRow { ref key, .. } if key == "openai#rpm"),
            "{e}"
        );
        assert!(
            e.to_string().contains(expected),
            "`{e}` should mention `{expected}`"
        );
    }
}

#[test]
fn malformed_rows_are_named_with_the_reason() {
    let cases: Vec<(&str, Mutation)> = vec![
        (
            "missing attribute `tokens`",
            Box::new(|r| {
                r.remove(TOKENS);
            }),
        ),
        (
            "`capacity` must be a number (N), found a string (S)",
            setting(CAPACITY, s("100")),
        ),
        ("`capacity` must be positive", setting(CAPACITY, n("-5"))),
        (
            "unknown limit type `bursty`",
            setting(LIMIT_TYPE, s("bursty")),
        ),
        (
            "`version` must be a whole number",
            setting(VERSION, n("4.5")),
        ),
        (
            "`tokens`: `abc` is not a decimal number",
            setting(TOKENS, n("abc")),
        ),
        (
            "`refill_rate` must not be negative",
            setting(REFILL_RATE, n("-1")),
        ),
    ];
    assert_named(cases);
}

#[test]
fn a_burst_that_is_not_positive_is_named_with_the_reason() {
    assert_named(vec![(
        "`burst`: a learned burst must be positive",
        setting(BURST, n("0")),
    )]);
}

#[test]
fn a_shard_limit_that_is_not_one_is_named_with_the_reason() {
    assert_named(vec![
        (
            "a shard limit is `=N` (pinned) or `<=N` (at most)",
            setting(SHARD_LIMIT, s("<=64")),
        ),
        (
            "`shard_limit` must be a string (S)",
            setting(SHARD_LIMIT, n("4")),
        ),
    ]);
}

#[test]
fn a_write_ceiling_that_is_not_a_positive_whole_number_is_named_with_the_reason() {
    for bad in ["0", "1.5", "-3", "4294967296"] {
        assert_named(vec![(
            "`write_ceiling` must be a whole number from 1 to 4294967295",
            setting(WRITE_CEILING, n(bad)),
        )]);
    }
}

#[test]
fn rows_beyond_a_buckets_bounds_are_named_with_the_reason() {
    let cases: Vec<(&str, Mutation)> = vec![
        (
            "`refill_rate`: a `requests` bucket needs a positive refill rate",
            setting(REFILL_RATE, n("0")),
        ),
        (
            "`lean`: a `concurrent` bucket cannot be lean",
            Box::new(|r| {
                r.insert(LIMIT_TYPE.to_owned(), s("concurrent"));
                r.insert(REFILL_RATE.to_owned(), n("0"));
                r.insert(LEAN.to_owned(), AttributeValue::Bool(true));
            }),
        ),
        (
            "`version`: version must be at most 9007199254740991",
            setting(VERSION, n("18446744073709551615")),
        ),
        (
            "`tokens`: tokens must be between",
            setting(TOKENS, n("-2000000000000000000")),
        ),
        (
            "`capacity`: capacity must be positive and at most 10^18",
            setting(CAPACITY, n("2e18")),
        ),
        (
            "`recent_writes` must be 8 bytes and at most 8 writes of 16, found 9 bytes",
            setting(RECENT_WRITES, blob(vec![0u8; 9])),
        ),
        (
            "`recent_writes` must be 8 bytes and at most 8 writes of 16, found 536 bytes",
            setting(RECENT_WRITES, blob(vec![0u8; 536])),
        ),
        (
            "`recent_writes`: a timestamp out of range",
            setting(RECENT_WRITES, blob(vec![0xff; 8])),
        ),
        (
            "`recent_writes` must be binary (B), found a string (S)",
            setting(RECENT_WRITES, s("00")),
        ),
        (
            "`write_id` must be 16 hex digits",
            setting(WRITE_ID, s("xyz")),
        ),
    ];
    assert_named(cases);
}

/// A `reserves` list of one entry with these attributes.
fn reserves_of(entry: &[(&str, AttributeValue)]) -> AttributeValue {
    let map = entry.iter().map(|(k, v)| ((*k).to_owned(), v.clone()));
    AttributeValue::L(vec![AttributeValue::M(map.collect())])
}

#[test]
fn reserves_read_back_exactly_or_the_row_is_named_corrupt() {
    let mut row = seed_row();
    row.insert(
        RESERVES.to_owned(),
        reserves_of(&[("priority", s("interactive")), ("tokens", n("20.5"))]),
    );
    let b = bucket_state(&row).unwrap();
    assert_eq!(
        b.bucket.floor_for(Some(&"batch".parse().unwrap())),
        "20.5".parse().unwrap()
    );
    assert_eq!(bucket_item(&b)[RESERVES], row[RESERVES]);
    // What would not read back to what the row holds (the write's condition compares the
    // list whole) is refused, not rounded.
    let entry = |extra: Vec<(&'static str, AttributeValue)>| {
        let mut e = vec![("priority", s("interactive")), ("tokens", n("1"))];
        for (k, v) in extra {
            e.retain(|(x, _)| *x != k);
            e.push((k, v));
        }
        reserves_of(&e)
    };
    let cases: Vec<(&str, Mutation)> = vec![
        (
            "`reserves`: an entry holds `note`",
            setting(RESERVES, entry(vec![("note", s("x"))])),
        ),
        (
            "`reserves`: `tokens`",
            setting(
                RESERVES,
                reserves_of(&[("priority", s("a")), ("tokens", n("0.0000000005"))]),
            ),
        ),
        (
            "`reserves`: priority `a b` contains ` `",
            setting(
                RESERVES,
                reserves_of(&[("priority", s("a b")), ("tokens", n("1"))]),
            ),
        ),
        (
            "`reserves` must be a list (L)",
            setting(RESERVES, s("interactive=1")),
        ),
        (
            "the reserves add up to 200, more than the capacity 100",
            setting(
                RESERVES,
                reserves_of(&[("priority", s("a")), ("tokens", n("200"))]),
            ),
        ),
    ];
    assert_named(cases);
}

#[test]
fn lease_rows_round_trip_and_seed_leases_without_expires_at_use_ttl() {
    let d = Dimension::new("openai#rpm").unwrap();
    let lease = LeaseRecord {
        slot: false,
        key: LeaseKey::new(&d, "a3f8c910"),
        dimension: d,
        cost: Tokens::new(1),
        created_at: UnixMillis::new(1_709_550_100_250),
        expires_at: UnixMillis::new(1_709_550_160_250),
        caller: "audit-service".to_owned(),
    };
    let item = lease_item(&lease);
    assert_eq!(item[TTL], n((1_709_550_161 + TTL_GRACE_SECS).to_string()));
    assert_eq!(lease_record(&item).unwrap(), lease);
    assert!(!item.contains_key(SLOT_DIMENSION));
    // A slot lease carries one of its dimension's index keys, picked by its own key: the
    // same for every write of the row, and every one of the keys taken by some leases.
    let slot = LeaseRecord {
        slot: true,
        ..lease.clone()
    };
    let slot_item = lease_item(&slot);
    assert_eq!(slot_item[SLOT_DIMENSION], s(slot_key(&slot)));
    assert_eq!(lease_record(&slot_item).unwrap(), slot);
    let keys: std::collections::BTreeSet<String> = (0..64)
        .map(|i| {
            let slot = LeaseRecord {
                key: LeaseKey::new(&slot.dimension, &format!("{i:08x}")),
                ..slot.clone()
            };
            let item = lease_item(&slot);
            assert_eq!(lease_record(&item).unwrap(), slot);
            match &item[SLOT_DIMENSION] {
                AttributeValue::S(key) => key.clone(),
                other => panic!("{other:?}"),
            }
        })
        .collect();
    let all: std::collections::BTreeSet<String> = (0..SLOT_KEYS)
        .map(|k| slot_index_key("openai#rpm", k))
        .collect();
    assert_eq!(keys, all);
    assert!(all.contains("openai#rpm") && all.contains("openai#rpm 3"));
    // Another dimension's key (or none of the four) is a corrupt row.
    let mut foreign = slot_item.clone();
    foreign.insert(SLOT_DIMENSION.to_owned(), s("openai#rpm 4"));
    assert!(lease_record(&foreign).is_err());
    let mut negative = item.clone();
    negative.insert(COST.to_owned(), n("-1"));
    let refused = lease_record(&negative).unwrap_err().to_string();
    assert!(refused.contains("`cost`"), "{refused}");
    let mut seed = item.clone();
    seed.remove(EXPIRES_AT);
    seed.insert(TTL.to_owned(), n("1709550160"));
    // A whole-second `ttl` written by another SDK: its holder's deadline may be up to a
    // second later.
    assert_eq!(
        lease_record(&seed).unwrap().expires_at,
        UnixMillis::from_secs(1_709_550_161)
    );
}
