//! The DynamoDB store against DynamoDB Local over the real wire protocol: the conformance
//! suite, interoperability with the seed's schema, and typed errors for bad input.

use crate::conformance;
use crate::dynamo;

use dynamo::{n, s};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use sluice::store::{LeaseFilter, StoreError};
use sluice::{
    Acquire, Bucket, Config, DynamoStore, Error, RefillRate, Sluice, Tokens, clock::ManualClock,
    clock::UnixMillis, config::Protocol, store::Level, store::Store,
};

/// Each conformance test on a table of its own: the reconciler works table-wide.
async fn dynamo_store() -> Option<Arc<dyn Store>> {
    Some(Arc::new(dynamo::fresh_store().await?))
}

conformance::suite!(dynamo_store);

fn vendor() -> String {
    format!("interop{:08x}", rand::random::<u32>())
}

async fn put_raw(store: &DynamoStore, item: HashMap<String, AttributeValue>) {
    store
        .client()
        .put_item()
        .table_name(store.table())
        .set_item(Some(item))
        .send()
        .await
        .expect("raw put");
}

async fn get_raw(store: &DynamoStore, key: &str) -> Option<HashMap<String, AttributeValue>> {
    store
        .client()
        .get_item()
        .table_name(store.table())
        .key("vendor_dimension", s(key))
        .consistent_read(true)
        .send()
        .await
        .expect("raw get")
        .item
}

/// A bucket row as another SDK following the seed would write it, last refilled at the
/// whole second `t`.
fn seed_row_at(dimension: &str, t: i64) -> HashMap<String, AttributeValue> {
    let mut row = seed_row(dimension);
    row.insert("last_refill_at".to_owned(), n(&t.to_string()));
    row
}

/// The seed's example bucket row.
fn seed_row(dimension: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([
        ("vendor_dimension".to_owned(), s(dimension)),
        ("capacity".to_owned(), n("100")),
        ("tokens".to_owned(), n("47.0")),
        ("refill_rate".to_owned(), n("1.667")),
        ("last_refill_at".to_owned(), n("1709550002")),
        ("cost_per_call".to_owned(), n("1")),
        ("limit_type".to_owned(), s("requests")),
        ("version".to_owned(), n("42")),
    ])
}

fn client_at(store: &DynamoStore, clock: &ManualClock) -> Sluice {
    Sluice::builder()
        .store(store.clone())
        .clock(clock.clone())
        .caller("interop-test")
        .build()
        .unwrap()
}

#[tokio::test]
async fn rows_written_by_other_sdks_are_acquired_exactly() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let dim = format!("{}#rpm", vendor());
    let t = dynamo::future_secs();
    put_raw(&store, seed_row_at(&dim, t)).await;
    // 3 seconds after the row's integer timestamp, at 1.667/s: 47 + 5.001 = 52.001 tokens.
    let clock = ManualClock::new(UnixMillis::from_secs(t + 3));
    let sluice = client_at(&store, &clock);
    let lease = sluice.acquire(Acquire::with_cost(&dim, 52)).await.unwrap();
    let row = sluice.bucket(&dim).await.unwrap().unwrap();
    assert_eq!(row.available(clock.now()), "0.001".parse().unwrap());
    assert_eq!(row.version, 43);
    // The grant added -52 to the stored 47 and left the refill where it was (a write that
    // commutes with other clients' grants): the seed's own arithmetic reads the same
    // 47 - 52 + 3 x 1.667 from the row.
    assert_eq!(row.tokens, Tokens::new(-5));
    assert_eq!(row.last_refill_at, UnixMillis::from_secs(t));
    // The next token is 0.999 / 1.667 s = 599.28 ms away, rounded up.
    let e = sluice.acquire(dim.as_str()).await.unwrap_err();
    assert_eq!(e.retry_in(), Some(Duration::from_millis(600)));
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_per_day_rate_another_sdk_wrote_is_read_exactly_and_honoured() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let t = dynamo::future_secs();
    let dim = format!("{}#daily", vendor());
    // One a day, as another SDK writes it: tokens per second to 18 places.
    let mut row = seed_row_at(&dim, t);
    row.insert("capacity".to_owned(), n("10"));
    row.insert("tokens".to_owned(), n("0"));
    row.insert("refill_rate".to_owned(), n("0.000011574074074074"));
    put_raw(&store, row).await;
    let clock = ManualClock::new(UnixMillis::from_secs(t));
    let sluice = client_at(&store, &clock);
    // 86,400.0000000000055 s for one token at that rate: the RetryIn rounds it up.
    let e = sluice.acquire(&dim).await.unwrap_err();
    assert_eq!(e.retry_in(), Some(Duration::from_millis(86_400_001)));
    clock.advance(Duration::from_millis(86_400_000));
    let e = sluice.acquire(&dim).await.unwrap_err();
    assert_eq!(e.retry_in(), Some(Duration::from_millis(1)));
    clock.advance(Duration::from_millis(1));
    sluice.acquire(&dim).await.unwrap().release().await.unwrap();
    // Written back with the same rate, to the digit; the other SDK reads what it wrote.
    let after = get_raw(&store, &dim).await.unwrap();
    assert_eq!(after["refill_rate"], n("0.000011574074074074"));
    assert!(!after.contains_key("refill_amount"));
    assert_eq!(
        sluice
            .bucket(&dim)
            .await
            .unwrap()
            .unwrap()
            .bucket
            .refill_rate(),
        "0.000011574074074074".parse().unwrap()
    );
}

#[tokio::test]
async fn a_rate_sluice_writes_reads_back_exactly_and_other_sdks_read_its_decimal() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let t = dynamo::future_secs();
    let clock = ManualClock::new(UnixMillis::from_secs(t));
    let sluice = client_at(&store, &clock);
    let dim = format!("{}#daily", vendor());
    let bucket = Bucket::requests(RefillRate::per_day(1_000)).with_capacity(1_000);
    sluice.put_bucket(&dim, bucket.clone()).await.unwrap();
    sluice
        .acquire(Acquire::with_cost(&dim, 1_000))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Granted whenever a token is there, looked at every 9,973 ms for a day: each grant
    // writes the refill with what it carries, and the day refills exactly 1,000.
    let mut granted = 0;
    let mut carried = 0;
    for _ in 0..8_663 {
        clock.advance(Duration::from_millis(9_973));
        while let Ok(lease) = sluice.acquire(&dim).await {
            lease.release().await.unwrap();
            granted += 1;
            carried += usize::from(
                get_raw(&store, &dim)
                    .await
                    .unwrap()
                    .contains_key("refill_carry"),
            );
        }
    }
    clock.advance(Duration::from_millis(86_400_000 - 8_663 * 9_973));
    let row = sluice.bucket(&dim).await.unwrap().unwrap();
    assert_eq!(row.bucket, bucket);
    assert_eq!(
        row.available(clock.now()) + Tokens::from(granted),
        Tokens::new(1_000)
    );
    assert!(carried > 0, "a part of a billionth was carried");
    // Another SDK reads `refill_rate`: 1,000 a day to 38 digits.
    let raw = get_raw(&store, &dim).await.unwrap();
    assert_eq!(
        raw["refill_rate"],
        n("0.011574074074074074074074074074074074074")
    );
    assert_eq!(
        (&raw["refill_amount"], &raw["refill_period"]),
        (&n("1000"), &n("86400"))
    );
    sluice.acquire(&dim).await.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn reserves_are_one_list_attribute_other_sdks_keep_and_untouched_rows_compare() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let dim = format!("{}#tpm", vendor());
    let t = dynamo::future_secs();
    let clock = ManualClock::new(UnixMillis::from_secs(t));
    let sluice = client_at(&store, &clock);
    let interactive: sluice::Priority = "interactive".parse().unwrap();
    let tpm = sluice::Bucket::tokens(sluice::RefillRate::per_second(1))
        .with_capacity(100)
        .with_reserve(interactive, 25);
    sluice.put_bucket(&dim, tpm.clone()).await.unwrap();
    let raw = get_raw(&store, &dim).await.unwrap();
    let reserves = HashMap::from([
        ("priority".to_owned(), s("interactive")),
        ("tokens".to_owned(), n("25")),
    ]);
    assert_eq!(
        raw.get("reserves"),
        Some(&AttributeValue::L(vec![AttributeValue::M(reserves)]))
    );
    // Another SDK's grant: it ignores the reserves (as the highest priority) and keeps them.
    let mut other = raw.clone();
    other.insert("tokens".to_owned(), n("70"));
    other.insert("version".to_owned(), n("1"));
    other.remove("write_id");
    other.remove("recent_writes");
    put_raw(&store, other).await;
    // An untouched row carrying reserves: the write's condition compares them as well.
    let batch = Acquire::with_cost(&dim, 45).priority("batch".parse().unwrap());
    sluice
        .acquire(batch.clone())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(
        sluice.acquire(batch).await.unwrap_err().retry_in(),
        Some(Duration::from_secs(45))
    );
    let row = sluice.bucket(&dim).await.unwrap().unwrap();
    assert_eq!((row.tokens, row.bucket), (Tokens::new(25), tpm));
    // Another tool writes the row whole with an empty list (and no write id): no reserves,
    // and the next write's condition holds against it.
    let mut rewritten = get_raw(&store, &dim).await.unwrap();
    rewritten.remove("write_id");
    rewritten.remove("recent_writes");
    rewritten.insert("reserves".to_owned(), AttributeValue::L(Vec::new()));
    rewritten.insert("version".to_owned(), n(&(row.version + 1).to_string()));
    put_raw(&store, rewritten).await;
    let e = client_at(&store, &clock)
        .acquire(Acquire::with_cost(&dim, 10).priority("batch".parse().unwrap()))
        .await;
    assert!(e.is_ok(), "no reserves any more: {e:?}");
}

#[tokio::test]
async fn rows_sluice_writes_carry_exactly_the_seed_attributes_and_types() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let t = dynamo::future_secs();
    let clock = ManualClock::new(UnixMillis::new(t * 1_000 + 125));
    let sluice = client_at(&store, &clock);
    let dim = format!("{}#tpm", vendor());
    sluice
        .put_bucket(
            &dim,
            Bucket::tokens(RefillRate::per_minute(100)).with_cost_per_call(2),
        )
        .await
        .unwrap();
    let lease = sluice
        .acquire(Acquire::with_cost(&dim, "1.5".parse::<Tokens>().unwrap()))
        .await
        .unwrap();
    // Its lease row now, not once it has been held a while.
    lease.recorded().await;

    let bucket = get_raw(&store, &dim).await.unwrap();
    let mut names: Vec<&str> = bucket.keys().map(String::as_str).collect();
    names.sort();
    // The seed's attributes, the exact rate and sluice's write ids: nothing per lease.
    assert_eq!(
        names,
        [
            "capacity",
            "cost_per_call",
            "last_refill_at",
            "limit_type",
            "recent_writes",
            "refill_amount",
            "refill_period",
            "refill_rate",
            "tokens",
            "vendor_dimension",
            "version",
            "write_id"
        ]
    );
    // sluice's `recent_writes`: 8 bytes, then 16 per write listed: the definition's (a
    // grant adds to the row and lists nothing).
    let AttributeValue::B(recent) = &bucket["recent_writes"] else {
        panic!("recent_writes is binary: {:?}", bucket["recent_writes"]);
    };
    assert_eq!(recent.as_ref().len(), 8 + 16);
    assert_eq!(bucket["vendor_dimension"], s(&dim));
    assert_eq!(bucket["capacity"], n("100"));
    assert_eq!(bucket["tokens"], n("98.5"));
    // 100 a minute: the seed's tokens per second to DynamoDB's 38 digits, and the exact
    // rate beside it.
    assert_eq!(bucket["refill_rate"], n(&format!("1.{}", "6".repeat(37))));
    assert_eq!(bucket["refill_amount"], n("100"));
    assert_eq!(bucket["refill_period"], n("60"));
    assert_eq!(bucket["last_refill_at"], n(&format!("{t}.125")));
    assert_eq!(bucket["cost_per_call"], n("2"));
    assert_eq!(bucket["limit_type"], s("tokens"));
    // A new bucket's version starts at its creation time in milliseconds times 1,000, so
    // that a bucket created again never repeats a version of the one before; one grant
    // since.
    assert_eq!(
        bucket["version"],
        n(&format!("{}", (t * 1_000 + 125) * 1_000 + 1))
    );

    // The grant's lease: the seed's lease row, on every path.
    let seed = Sluice::builder()
        .store(store.clone())
        .clock(clock.clone())
        .caller("interop-test")
        .protocol(Protocol::Seed)
        .build()
        .unwrap();
    let seed_lease = seed
        .acquire(Acquire::with_cost(&dim, "1.5".parse::<Tokens>().unwrap()))
        .await
        .unwrap();
    for lease in [&lease, &seed_lease] {
        let key = lease.id().keys()[0].as_str().to_owned();
        assert!(key.starts_with(&format!("lease#{dim}#")));
        let row = get_raw(&store, &key).await.unwrap();
        assert_eq!(row["dimension"], s(&dim));
        assert_eq!(row["cost"], n("1.5"));
        assert_eq!(row["created_at"], n(&format!("{t}.125")));
        // `ttl` is whole seconds (DynamoDB's TTL attribute), rounded up, an hour after the
        // expiry so that the sweeper never beats the reconciler; `expires_at` is exact.
        assert_eq!(row["ttl"], n(&(t + 61 + 3_600).to_string()));
        assert_eq!(row["expires_at"], n(&format!("{}.125", t + 60)));
        assert_eq!(row["caller"], s("interop-test"));
        assert_eq!(
            row.len(),
            7,
            "the seed's six attributes plus expires_at: {row:?}"
        );
    }
    for lease in [lease, seed_lease] {
        let key = lease.id().keys()[0].as_str().to_owned();
        lease.release().await.unwrap();
        assert!(get_raw(&store, &key).await.is_none());
    }
}

#[tokio::test]
async fn leases_written_by_other_sdks_are_listed_and_released() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let dim = format!("{}#concurrent", vendor());
    let t = dynamo::future_secs();
    let mut row = seed_row_at(&dim, t);
    row.insert("limit_type".to_owned(), s("concurrent"));
    row.insert("capacity".to_owned(), n("2"));
    row.insert("tokens".to_owned(), n("1"));
    row.insert("refill_rate".to_owned(), n("0"));
    put_raw(&store, row).await;
    let key = format!("lease#{dim}#a3f8c910");
    put_raw(
        &store,
        HashMap::from([
            ("vendor_dimension".to_owned(), s(&key)),
            ("dimension".to_owned(), s(&dim)),
            ("cost".to_owned(), n("1")),
            ("created_at".to_owned(), n(&(t + 100).to_string())),
            ("ttl".to_owned(), n(&(t + 160).to_string())),
            ("caller".to_owned(), s("audit-service")),
        ]),
    )
    .await;
    let clock = ManualClock::new(UnixMillis::from_secs(t + 110));
    let sluice = client_at(&store, &clock);
    let snapshot = sluice.snapshot(&dim).await.unwrap();
    assert_eq!(
        (snapshot.live_leases, snapshot.available),
        (1, Tokens::new(1))
    );
    let leases = sluice
        .leases(&LeaseFilter {
            dimension: Some(dim.parse().unwrap()),
            expired_before: None,
        })
        .await
        .unwrap();
    // A whole-second `ttl` from another SDK: its holder's deadline may lie up to a second
    // after it, so the lease counts as held until then.
    assert_eq!(leases[0].expires_at, UnixMillis::from_secs(t + 161));
    assert_eq!(leases[0].caller, "audit-service");
    assert!(sluice.release_id(&key.parse().unwrap()).await.unwrap());
    assert_eq!(
        sluice.snapshot(&dim).await.unwrap().available,
        Tokens::new(2)
    );
}

#[tokio::test]
async fn a_missing_table_is_a_typed_error_naming_the_table() {
    let Some(endpoint) = dynamo::endpoint() else {
        return;
    };
    let store = DynamoStore::new(dynamo::client(&endpoint), "sluice-no-such-table");
    let sluice = Sluice::builder().store(store).build().unwrap();
    match sluice.acquire("openai#rpm").await {
        Err(Error::Store(StoreError::TableNotFound { table })) => {
            assert_eq!(table, "sluice-no-such-table")
        }
        other => panic!("expected TableNotFound, got {other:?}"),
    }
    let e = sluice.buckets().await.unwrap_err();
    assert!(e.to_string().contains("sluice table create"), "{e}");
}

#[tokio::test]
async fn malformed_and_foreign_rows_give_typed_errors_and_never_panic() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let sluice = Sluice::builder().store(store.clone()).build().unwrap();
    let v = vendor();
    let mut cases: Vec<(String, HashMap<String, AttributeValue>, &str)> = Vec::new();
    let mut missing = seed_row(&format!("{v}#missing"));
    missing.remove("tokens");
    cases.push((
        format!("{v}#missing"),
        missing,
        "missing attribute `tokens`",
    ));
    let mut wrong_type = seed_row(&format!("{v}#wrongtype"));
    wrong_type.insert("capacity".to_owned(), s("100"));
    cases.push((
        format!("{v}#wrongtype"),
        wrong_type,
        "`capacity` must be a number (N)",
    ));
    let mut negative = seed_row(&format!("{v}#negative"));
    negative.insert("capacity".to_owned(), n("-10"));
    cases.push((
        format!("{v}#negative"),
        negative,
        "`capacity` must be positive",
    ));
    let mut unknown = seed_row(&format!("{v}#unknown"));
    unknown.insert("limit_type".to_owned(), s("bursty"));
    cases.push((
        format!("{v}#unknown"),
        unknown,
        "unknown limit type `bursty`",
    ));
    for (dim, row, expected) in cases {
        put_raw(&store, row).await;
        match sluice.acquire(dim.as_str()).await {
            Err(Error::Store(e @ StoreError::CorruptRow { .. })) => {
                let text = e.to_string();
                assert!(text.contains(&dim) && text.contains(expected), "{text}");
            }
            other => panic!("expected CorruptRow for {dim}, got {other:?}"),
        }
    }
    // A foreign row that is not a sluice bucket at all does not break listing.
    put_raw(
        &store,
        HashMap::from([
            ("vendor_dimension".to_owned(), s("config:global")),
            ("x".to_owned(), n("1")),
        ]),
    )
    .await;
    sluice
        .buckets()
        .await
        .expect("listing skips rows it cannot read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processes_creating_the_same_table_at_once_all_succeed() {
    let Some(endpoint) = dynamo::endpoint() else {
        return;
    };
    let table = format!("sluice-create-{:08x}", rand::random::<u32>());
    let creators: Vec<_> = (0..8)
        .map(|_| {
            let store = DynamoStore::new(dynamo::client(&endpoint), table.clone());
            tokio::spawn(async move { store.create_table().await })
        })
        .collect();
    let mut created = 0;
    for creator in creators {
        if creator.await.unwrap().expect("every creator succeeds") {
            created += 1;
        }
    }
    assert_eq!(created, 1, "exactly one creator made the table");
    let store = DynamoStore::new(dynamo::client(&endpoint), table.clone());
    let ttl = store
        .client()
        .describe_time_to_live()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    assert_eq!(
        ttl.time_to_live_description().unwrap().attribute_name(),
        Some("ttl")
    );
    store
        .client()
        .delete_table()
        .table_name(&table)
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn create_table_is_idempotent_and_enables_ttl_on_the_ttl_attribute() {
    let Some(endpoint) = dynamo::endpoint() else {
        return;
    };
    let table = format!("sluice-create-{:08x}", rand::random::<u32>());
    let store = DynamoStore::new(dynamo::client(&endpoint), table.clone());
    assert!(store.create_table().await.unwrap());
    assert!(!store.create_table().await.unwrap());
    let ttl = store
        .client()
        .describe_time_to_live()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    let description = ttl.time_to_live_description().unwrap();
    assert_eq!(description.attribute_name(), Some("ttl"));
    let table_description = store
        .client()
        .describe_table()
        .table_name(&table)
        .send()
        .await
        .unwrap();
    let key = &table_description.table().unwrap().key_schema()[0];
    assert_eq!(key.attribute_name(), "vendor_dimension");
    store
        .client()
        .delete_table()
        .table_name(&table)
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn connect_uses_the_configured_table_and_endpoint() {
    let Some(endpoint) = dynamo::endpoint() else {
        return;
    };
    // Make sure the table exists.
    dynamo::store().await.unwrap();
    let config = Config {
        table_name: Some(dynamo::table_name().to_owned()),
        endpoint_url: Some(endpoint),
        ..Config::default()
    };
    let sluice = sluice::SluiceBuilder::from_config(config.clone())
        .connect()
        .await
        .unwrap();
    let dim = format!("{}#rpm", vendor());
    sluice
        .put_bucket(&dim, Bucket::requests(RefillRate::per_second(1)))
        .await
        .unwrap();
    sluice
        .acquire(dim.as_str())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // The same table, seen through a raw client.
    let raw = DynamoStore::new(
        dynamo::client(config.endpoint_url.as_deref().unwrap()),
        dynamo::table_name(),
    );
    assert!(get_raw(&raw, &dim).await.is_some());
    assert!(matches!(
        sluice::SluiceBuilder::from_config(config).build(),
        Err(Error::Config(_))
    ));
}

#[tokio::test]
async fn calls_and_write_units_per_grant_in_each_protocol_and_mode() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let clock = ManualClock::new(UnixMillis::from_secs(dynamo::future_secs()));
    let client = |protocol: Protocol| {
        sluice::SluiceBuilder::from_config(Config {
            protocol,
            ..Config::default()
        })
        .store(store.clone())
        .clock(clock.clone())
        .build()
        .unwrap()
    };
    let calls = || store.stats().calls;
    let vendor = vendor();
    let rpm = format!("{vendor}#rpm");
    let lean = format!("{vendor}#lean");
    let seed = client(Protocol::Seed);
    seed.put_bucket(&rpm, Bucket::requests(RefillRate::per_second(10)))
        .await
        .unwrap();
    seed.put_bucket(
        &lean,
        Bucket::requests(RefillRate::per_second(1))
            .with_capacity(3)
            .lean(),
    )
    .await
    .unwrap();

    // The seed protocol: a read and a two-item transaction, then the lease's delete.
    let before = calls();
    let lease = seed.acquire(rpm.as_str()).await.unwrap();
    assert_eq!(calls() - before, 2);
    lease.release().await.unwrap();
    assert_eq!(calls() - before, 3);

    // The fast path: a new client reads once; after that, one write per grant.
    let fast = client(Protocol::Fast);
    let before = calls();
    fast.acquire(rpm.as_str())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(
        calls() - before,
        2,
        "first acquire: read, write; released before its row was due, it never had one"
    );
    // A lease released before its row is due (held under a second): one write in all.
    for _ in 0..3 {
        let before = store.stats();
        fast.acquire(rpm.as_str())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let after = store.stats();
        assert_eq!(after.calls - before.calls, 1, "one write per grant in all");
        assert!(after.write_milliunits - before.write_milliunits <= 1_000);
    }
    for _ in 0..5 {
        let before = store.stats();
        let lease = fast.acquire(rpm.as_str()).await.unwrap();
        // The grant is one write of the bucket row; its lease row follows.
        lease.recorded().await;
        assert_eq!(
            store.stats().calls - before.calls,
            2,
            "one write to the bucket, one for the lease row"
        );
        lease.release().await.unwrap();
        let after = store.stats();
        assert_eq!(after.calls - before.calls, 3, "and the lease's removal");
        // Single-item writes of small rows: one write unit each, no transaction.
        assert_eq!(
            after.transaction_write_milliunits,
            before.transaction_write_milliunits
        );
        assert!(
            after.write_milliunits - before.write_milliunits <= 3_000,
            "{} write milliunits",
            after.write_milliunits - before.write_milliunits
        );
    }

    // Several dimensions at once: one single-item write per bucket and one per lease row
    // to acquire, one per lease row to release; a denial the known rows show costs
    // nothing.
    let tpm = format!("{vendor}#tpm");
    seed.put_bucket(
        &tpm,
        Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000),
    )
    .await
    .unwrap();
    let both = || Acquire::new(rpm.as_str()).and_cost(tpm.as_str(), 300);
    fast.acquire(both()).await.unwrap().release().await.unwrap();
    for _ in 0..2 {
        let before = store.stats();
        let lease = fast.acquire(both()).await.unwrap();
        lease.recorded().await;
        assert_eq!(
            store.stats().calls - before.calls,
            4,
            "two calls per bucket to acquire"
        );
        lease.release().await.unwrap();
        let after = store.stats();
        assert_eq!(
            after.calls - before.calls,
            5,
            "one call to delete both lease rows"
        );
        assert_eq!(
            after.transaction_write_milliunits, before.transaction_write_milliunits,
            "no transaction"
        );
    }
    // 100 tokens left of tpm: 300 more is 2 s away. The first denial comes from the store
    // (one read of tpm, which this client's memory showed short, so it was asked first and
    // rpm never taken); inside its window, the next ones cost nothing.
    let before = calls();
    let wait = fast.acquire(both()).await.unwrap_err().retry_in().unwrap();
    assert_eq!(wait, Duration::from_secs(2));
    assert_eq!(calls() - before, 1, "a first denial confirmed by one read");
    clock.advance(Duration::from_secs(1));
    let wait = fast.acquire(both()).await.unwrap_err().retry_in().unwrap();
    assert_eq!(wait, Duration::from_secs(1));
    assert_eq!(
        calls() - before,
        1,
        "a denial inside the window costs no call"
    );
    clock.advance(wait);
    fast.acquire(both()).await.unwrap().release().await.unwrap();
    assert_eq!(
        calls() - before,
        3,
        "then a write per bucket, and no lease rows"
    );

    // Adjusting a lease's cost: the bucket's write and the lease row's, no read.
    let mut lease = fast.acquire(rpm.as_str()).await.unwrap();
    lease.recorded().await;
    let before = calls();
    lease.adjust(rpm.as_str(), 3).await.unwrap();
    assert_eq!(calls() - before, 2, "two calls per adjust");
    lease.release().await.unwrap();

    // A `concurrent` slot: one write to take it and one for its lease row, one to end the
    // row and one to give it back; no read either way.
    let slots = format!("{vendor}#concurrent");
    seed.put_bucket(&slots, Bucket::concurrent(2))
        .await
        .unwrap();
    fast.acquire(slots.as_str())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for _ in 0..3 {
        let before = calls();
        let lease = fast.acquire(slots.as_str()).await.unwrap();
        assert_eq!(calls() - before, 2, "two calls per acquire");
        lease.release().await.unwrap();
        assert_eq!(calls() - before, 4, "two calls per release, without a read");
    }
    assert_eq!(
        fast.bucket(&slots).await.unwrap().unwrap().tokens,
        Tokens::new(2),
        "every slot given back"
    );

    // Lean mode: one conditional write per grant, one write unit, nothing on release.
    let lean_client = client(Protocol::Fast);
    lean_client
        .acquire(lean.as_str())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for _ in 0..2 {
        let before = store.stats();
        let lease = lean_client.acquire(lean.as_str()).await.unwrap();
        lease.release().await.unwrap();
        let after = store.stats();
        assert_eq!(after.calls - before.calls, 1);
        assert!(
            after.write_milliunits - before.write_milliunits <= 1_000,
            "{} write milliunits",
            after.write_milliunits - before.write_milliunits
        );
    }
    assert_eq!(
        store
            .list_leases(&LeaseFilter {
                dimension: Some(lean.parse().unwrap()),
                expired_before: None,
            })
            .await
            .unwrap()
            .len(),
        0,
        "lean grants write no lease rows"
    );

    // Prefetch: each write takes four more, granted without a call.
    let hot = format!("{vendor}#hot");
    seed.put_bucket(
        &hot,
        Bucket::requests(RefillRate::per_second(1))
            .with_capacity(100)
            .lean(),
    )
    .await
    .unwrap();
    let prefetching = Sluice::builder()
        .store(store.clone())
        .clock(clock.clone())
        .prefetch(
            hot.parse().unwrap(),
            sluice::Prefetch::new(4, Duration::from_secs(1)),
        )
        .build()
        .unwrap();
    let lease = prefetching.acquire(hot.as_str()).await.unwrap();
    lease.release().await.unwrap();
    let before = store.stats();
    for _ in 0..10 {
        let lease = prefetching.acquire(hot.as_str()).await.unwrap();
        lease.release().await.unwrap();
    }
    let after = store.stats();
    assert_eq!(after.calls - before.calls, 2, "10 grants, 2 writes");
    assert!(after.write_milliunits - before.write_milliunits <= 2_000);

    // Refusals once this client's own grant emptied the bucket: the row it wrote is the
    // store's, so no call until the retry time.
    let before = calls();
    let mut waits = Vec::new();
    for _ in 0..10 {
        waits.push(
            lean_client
                .acquire(lean.as_str())
                .await
                .unwrap_err()
                .retry_in()
                .unwrap(),
        );
    }
    assert_eq!(calls() - before, 0, "denials answered locally");
    assert_eq!(waits[0], Duration::from_secs(1));
    clock.advance(waits[0]);
    let granted = lean_client.acquire(lean.as_str()).await.unwrap();
    assert_eq!(calls() - before, 1);
    granted.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_share_writes_for_acquires_and_releases() {
    let Some(store) = dynamo::store().await else {
        return;
    };
    let sluice = Sluice::builder().store(store.clone()).build().unwrap();
    let vendor = vendor();
    let rpm = format!("{vendor}#rpm");
    let slots = format!("{vendor}#concurrent");
    sluice
        .put_bucket(&rpm, Bucket::requests(RefillRate::per_second(1_000_000)))
        .await
        .unwrap();
    sluice
        .put_bucket(&slots, Bucket::concurrent(16))
        .await
        .unwrap();
    for dimension in [rpm.clone(), slots.clone()] {
        // Warm the lane so the count below is the steady state.
        sluice
            .acquire(dimension.as_str())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let before = store.stats().calls;
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let sluice = sluice.clone();
                let dimension = dimension.clone();
                tokio::spawn(async move {
                    let mut granted = 0u64;
                    while granted < 25 {
                        match sluice.acquire(dimension.as_str()).await {
                            Ok(lease) => {
                                lease.release().await.unwrap();
                                granted += 1;
                            }
                            Err(e) => {
                                let wait = e.retry_in().expect("only RetryIn");
                                tokio::time::sleep(wait.min(Duration::from_millis(5))).await;
                            }
                        }
                    }
                    granted
                })
            })
            .collect();
        let mut grants = 0;
        for t in tasks {
            grants += t.await.unwrap();
        }
        let calls = store.stats().calls - before;
        // Alone, a grant costs three calls (the bucket's write, its lease row, the row's
        // delete), a slot four (and its give-back); shared writes and batched rows bring
        // that under one call a grant, under two a slot (whose row's conditional delete
        // is its own).
        let bound = if dimension == rpm { grants } else { 2 * grants };
        assert!(
            calls < bound,
            "{dimension}: {calls} calls for {grants} grants"
        );
        assert!(
            store
                .list_leases(&LeaseFilter {
                    dimension: Some(dimension.parse().unwrap()),
                    expired_before: None,
                })
                .await
                .unwrap()
                .is_empty(),
            "{dimension}: every lease row deleted"
        );
    }
    assert_eq!(
        sluice.bucket(&slots).await.unwrap().unwrap().tokens,
        Tokens::new(16),
        "every slot given back"
    );
}

#[tokio::test]
async fn unconditional_lease_deletes_cover_many_batches_and_skip_missing_rows() {
    use sluice::store::{Commit, LeaseKey, LeaseRecord, LeaseWrite};
    let Some(store) = dynamo::store().await else {
        return;
    };
    let d: sluice::Dimension = format!("{}#rpm", vendor()).parse().unwrap();
    let now = UnixMillis::from_secs(dynamo::future_secs());
    let keys: Vec<LeaseKey> = (0..60)
        .map(|i| LeaseKey::new(&d, &format!("k{i}")))
        .collect();
    // Rows for two keys in three; the rest were never written.
    for key in keys.iter().filter(|k| !k.unique().ends_with('2')) {
        store
            .commit(Commit {
                buckets: vec![],
                leases: vec![LeaseWrite::Create(LeaseRecord {
                    slot: false,
                    key: key.clone(),
                    dimension: d.clone(),
                    cost: Tokens::new(1),
                    created_at: now,
                    expires_at: now.saturating_add(Duration::from_secs(60)),
                    caller: "test".into(),
                })],
            })
            .await
            .unwrap();
    }
    let before = store.stats().calls;
    store.delete_leases(&keys).await.unwrap();
    assert_eq!(store.stats().calls - before, 3, "25 rows per call");
    assert!(
        store
            .read_leases(&keys)
            .await
            .unwrap()
            .iter()
            .all(Option::is_none)
    );
}

#[tokio::test]
async fn healing_never_raises_a_concurrent_bucket_with_an_unreadable_lease_row() {
    // A table of its own: the unreadable row below would hold back every test's healing.
    let Some(store) = dynamo::fresh_store().await else {
        return;
    };
    let sluice = Sluice::builder()
        .store(store.clone())
        .heal_settle(Duration::from_millis(300))
        .build()
        .unwrap();
    let dim = format!("{}#concurrent", vendor());
    sluice
        .put_bucket(&dim, Bucket::concurrent(3))
        .await
        .unwrap();
    let held = sluice.acquire(dim.as_str()).await.unwrap();
    // A foreign writer's lease row on the same bucket, holding an unknown number of slots
    // (its cost is not a number), and one slot taken by it from the bucket.
    let broken = format!("lease#{dim}#foreign");
    put_raw(
        &store,
        HashMap::from([
            ("vendor_dimension".to_owned(), s(&broken)),
            ("dimension".to_owned(), s(&dim)),
            ("cost".to_owned(), s("one")),
        ]),
    )
    .await;
    let before = sluice.bucket(&dim).await.unwrap().unwrap();
    let mut row = before.clone();
    row.tokens = Tokens::new(1);
    row.version = before.version + 1;
    assert!(store.put_bucket(&row, Some(&before)).await.unwrap());
    let scan = store.scan_leases(&LeaseFilter::default()).await.unwrap();
    assert_eq!(scan.leases.len(), 1);
    assert_eq!(scan.unreadable, vec![broken.clone()]);

    // The readable leases account for one slot, so the bucket "should" hold two; the
    // unreadable row may hold the missing one, so it is left alone.
    let report = sluice.reconcile().await.unwrap();
    assert_eq!(report.buckets_not_raised, 1, "{report}");
    assert_eq!(report.buckets_healed, 0, "{report}");
    assert_eq!(
        sluice.bucket(&dim).await.unwrap().unwrap().tokens,
        Tokens::new(1)
    );

    // Once the row is gone, healing proceeds.
    store
        .client()
        .delete_item()
        .table_name(store.table())
        .key("vendor_dimension", s(&broken))
        .send()
        .await
        .unwrap();
    let report = sluice.reconcile().await.unwrap();
    assert_eq!(report.buckets_healed, 1, "{report}");
    assert_eq!(
        sluice.bucket(&dim).await.unwrap().unwrap().tokens,
        Tokens::new(2)
    );
    held.release().await.unwrap();
}

#[tokio::test]
async fn a_lost_race_hands_back_the_current_row() {
    use sluice::store::{
        BucketWrite, Commit, CommitError, ConditionFailure, LeaseKey, LeaseRecord, LeaseWrite,
    };
    let Some(store) = dynamo::store().await else {
        return;
    };
    let sluice = Sluice::builder().store(store.clone()).build().unwrap();
    let dim = format!("{}#rpm", vendor());
    let row = sluice
        .put_bucket(&dim, Bucket::requests(RefillRate::per_second(1)))
        .await
        .unwrap();
    sluice
        .acquire(dim.as_str())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let d: sluice::Dimension = dim.parse().unwrap();
    let stale = BucketWrite::new(
        row.clone(),
        Level {
            tokens: Tokens::new(1),
            ..row.level()
        },
    );
    // Alone (a single conditional UpdateItem) and inside a transaction with a lease put.
    let lease = LeaseRecord {
        slot: false,
        key: LeaseKey::new(&d, "stale"),
        dimension: d.clone(),
        cost: Tokens::new(1),
        created_at: row.last_refill_at,
        expires_at: row.last_refill_at.saturating_add(Duration::from_secs(60)),
        caller: "test".into(),
    };
    for commit in [
        Commit {
            buckets: vec![stale.clone()],
            leases: vec![],
        },
        Commit {
            buckets: vec![stale.clone()],
            leases: vec![LeaseWrite::Create(lease)],
        },
    ] {
        match store.commit(commit).await {
            Err(CommitError::Condition(ConditionFailure::BucketChanged {
                current: Some(current),
                ..
            })) => {
                assert_eq!(current.version, row.version + 1);
            }
            other => panic!("expected BucketChanged with the current row, got {other:?}"),
        }
    }
}

/// A loopback proxy to DynamoDB that swallows the answer to the first `TransactWriteItems`
/// it forwards (the request reaches the server; the client sees the connection drop).
/// Returns the proxy's endpoint and a count of the transactions it forwarded.
async fn answer_losing_proxy(upstream: String) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    answer_losing_proxy_for(upstream, "TransactWriteItems").await
}

/// [`answer_losing_proxy`] for the first call of `operation` (`UpdateItem`, `PutItem`, …).
async fn answer_losing_proxy_for(
    upstream: String,
    operation: &'static str,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let upstream = upstream.trim_start_matches("http://").to_owned();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let transactions = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let counted = transactions.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let swallow = Arc::new(AtomicBool::new(false));
            let (to_server, from_server) = (swallow.clone(), swallow);
            let (counted, dropped) = (counted.clone(), dropped.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = client_read.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let chunk = &buf[..n];
                    if String::from_utf8_lossy(chunk)
                        .contains(&format!("DynamoDB_20120810.{operation}\r"))
                    {
                        counted.fetch_add(1, Ordering::SeqCst);
                        if !dropped.swap(true, Ordering::SeqCst) {
                            to_server.store(true, Ordering::SeqCst);
                        }
                    }
                    if server_write.write_all(chunk).await.is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = server_read.read(&mut buf).await {
                    if n == 0 || from_server.load(Ordering::SeqCst) {
                        // Lose the answer: close the client's side without a byte.
                        break;
                    }
                    if client_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (endpoint, transactions)
}

#[tokio::test]
async fn a_transaction_resent_after_a_lost_answer_is_not_applied_twice() {
    use sluice::store::{BucketWrite, Commit, LeaseKey, LeaseRecord, LeaseWrite};
    let Some(endpoint) = dynamo::endpoint() else {
        return;
    };
    let direct = dynamo::fresh_store().await.unwrap();
    let (proxied, transactions) = answer_losing_proxy(endpoint).await;
    let store = DynamoStore::new(dynamo::client(&proxied), direct.table());
    let sluice = Sluice::builder().store(direct.clone()).build().unwrap();
    let dim = format!("{}#rpm", vendor());
    let row = sluice
        .put_bucket(&dim, Bucket::requests(RefillRate::per_second(1)))
        .await
        .unwrap();
    let d: sluice::Dimension = dim.parse().unwrap();
    let commit = Commit {
        buckets: vec![BucketWrite::new(
            row.clone(),
            Level {
                tokens: row.tokens - Tokens::new(1),
                ..row.level()
            },
        )],
        leases: vec![LeaseWrite::Create(LeaseRecord {
            slot: false,
            key: LeaseKey::new(&d, "resent"),
            dimension: d.clone(),
            cost: Tokens::new(1),
            created_at: row.last_refill_at,
            expires_at: row.last_refill_at.saturating_add(Duration::from_secs(600)),
            caller: "test".into(),
        })],
    };
    // The first answer is lost; the SDK resends the same call with the same token and
    // DynamoDB acknowledges it without applying it again.
    store
        .commit(commit.clone())
        .await
        .expect("the resent transaction is acknowledged");
    assert_eq!(
        transactions.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the SDK resent the transaction"
    );
    let after = sluice.bucket(&dim).await.unwrap().unwrap();
    assert_eq!(
        (after.version, after.tokens),
        (row.version + 1, row.tokens - Tokens::new(1))
    );
    // The same content committed by another call is another transaction: its conditions
    // fail instead of it being mistaken for a resend.
    assert!(matches!(
        direct.commit(commit).await,
        Err(sluice::store::CommitError::Condition(_))
    ));
}

#[tokio::test]
async fn a_single_write_resent_after_a_lost_answer_is_not_applied_twice() {
    use sluice::store::{BucketWrite, Commit};
    let Some(endpoint) = dynamo::endpoint() else {
        return;
    };
    let direct = dynamo::fresh_store().await.unwrap();
    let sluice = Sluice::builder().store(direct.clone()).build().unwrap();
    let dim = format!("{}#rpm", vendor());
    let row = sluice
        .put_bucket(&dim, Bucket::requests(RefillRate::per_second(1)).lean())
        .await
        .unwrap();

    // A lean grant's write: one conditional `UpdateItem`. Its answer is lost and the SDK
    // resends it; the resend's condition fails on the row the first one wrote, which
    // carries this write's id: that is this write, applied once.
    let (proxied, updates) = answer_losing_proxy_for(endpoint.clone(), "UpdateItem").await;
    let store = DynamoStore::new(dynamo::client(&proxied), direct.table());
    let write = BucketWrite::new(
        row.clone(),
        Level {
            tokens: row.tokens - Tokens::new(1),
            ..row.level()
        },
    );
    store
        .commit(Commit {
            buckets: vec![write.clone()],
            leases: vec![],
        })
        .await
        .expect("the resent write is recognised as applied");
    assert_eq!(
        updates.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the SDK resent it"
    );
    let after = sluice.bucket(&dim).await.unwrap().unwrap();
    assert_eq!(
        (after.version, after.tokens, after.write_id()),
        (
            row.version + 1,
            row.tokens - Tokens::new(1),
            Some(write.write_id)
        )
    );
    // Another write computed from the same row is another write: its condition fails.
    assert!(matches!(
        direct
            .commit(Commit {
                buckets: vec![BucketWrite::new(
                    row.clone(),
                    Level {
                        tokens: row.tokens,
                        ..row.level()
                    }
                )],
                leases: vec![],
            })
            .await,
        Err(sluice::store::CommitError::Condition(_))
    ));

    // The same for a redefinition (an `UpdateItem` of the whole definition, which keeps
    // the leases the row keeps).
    let (proxied, puts) = answer_losing_proxy_for(endpoint, "UpdateItem").await;
    let store = DynamoStore::new(dynamo::client(&proxied), direct.table());
    let mut redefined = after.clone();
    redefined.version = after.version + 1;
    redefined.set_write_id(Some(7));
    redefined.set_recent_writes(sluice::store::RecentWrites {
        writes: [
            after.recent_writes().writes.as_slice(),
            &[(7, after.last_refill_at)],
        ]
        .concat(),
        forgotten: after.recent_writes().forgotten,
    });
    assert!(store.put_bucket(&redefined, Some(&after)).await.unwrap());
    assert_eq!(
        puts.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the SDK resent it"
    );
    assert_eq!(sluice.bucket(&dim).await.unwrap().unwrap(), redefined);
}
