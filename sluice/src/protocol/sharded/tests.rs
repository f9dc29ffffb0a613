//! The sharded path: which row serves, and when a bucket spreads itself.

use super::*;

mod gathered_grants;
mod gathers;
mod lost_races;
mod spread;

#[test]
fn the_whole_bucket_sends_an_acquire_to_another_row_than_the_one_tried() {
    let free = |t: &[i64]| t.iter().map(|t| Tokens::new(*t)).collect::<Vec<_>>();
    let rows = free(&[5, 5, 0, 5]);
    let mut seen = [0; 4];
    for _ in 0..400 {
        seen[serving(&rows, Tokens::new(2), 0).unwrap()] += 1;
    }
    // Never the row tried, nor one short; each of the others about as often.
    assert_eq!((seen[0], seen[2]), (0, 0), "{seen:?}");
    assert!(seen[1] > 100 && seen[3] > 100, "{seen:?}");
    // The row tried when no other can serve; none when no row can.
    assert_eq!(serving(&free(&[5, 1, 0]), Tokens::new(2), 0), Some(0));
    assert_eq!(serving(&free(&[1, 1]), Tokens::new(2), 0), None);
}

/// Throttles every write of the row `hot#rpm` past `per_second` in one second of `clock`,
/// as a store with that per-item ceiling would, and tells nobody the ceiling.
#[derive(Debug)]
struct ItemCeiling {
    clock: crate::clock::ManualClock,
    per_second: u32,
    /// The second, and the writes that landed in it.
    landed: std::sync::Mutex<(i64, u32)>,
}

impl ItemCeiling {
    /// Throttling `hot#rpm` past `per_second` writes in each second of `clock`.
    fn new(clock: &crate::clock::ManualClock, per_second: u32) -> ItemCeiling {
        ItemCeiling {
            clock: clock.clone(),
            per_second,
            landed: std::sync::Mutex::new((0, 0)),
        }
    }
}

/// A client of `store` reading `clock`, told a per-item write ceiling of `told` writes a
/// second when given (as DynamoDB's store tells its 1,000).
fn client_of(
    store: Arc<dyn crate::store::Store>,
    clock: &crate::clock::ManualClock,
    told: Option<u32>,
) -> crate::Sluice {
    let config = crate::Config {
        sharding: crate::Sharding {
            item_write_ceiling: told,
            ..crate::Sharding::default()
        },
        ..crate::Config::default()
    };
    crate::SluiceBuilder::from_config(config)
        .store_arc(store)
        .clock(clock.clone())
        .build()
        .unwrap()
}

impl crate::shared::test_store::Hooks for ItemCeiling {
    fn change(&self, change: &crate::store::BucketChange) -> Result<(), crate::store::ChangeError> {
        if change.dimension.as_str() != "hot#rpm" {
            return Ok(());
        }
        let second = self.clock.now().as_millis().div_euclid(1_000);
        let mut landed = self.landed.lock().unwrap();
        if landed.0 != second {
            *landed = (second, 0);
        }
        if landed.1 >= self.per_second {
            return Err(crate::store::StoreError::Throttled { source: None }.into());
        }
        landed.1 += 1;
        Ok(())
    }
}

#[tokio::test]
async fn a_bucket_whose_row_the_store_throttles_spreads_with_no_ceiling_told() {
    use crate::clock::ManualClock;
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let store = Arc::new(crate::shared::test_store::Hooked::new(ItemCeiling {
        clock: clock.clone(),
        per_second: 20,
        landed: std::sync::Mutex::new((0, 0)),
    }));
    assert_eq!(
        crate::store::Store::item_write_ceiling(store.as_ref()),
        None,
        "the store tells no ceiling"
    );
    let sluice = crate::Sluice::builder()
        .store_arc(store)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(sluice.config().sharding.item_write_ceiling, None);
    let ample =
        crate::Bucket::requests(crate::RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
    sluice.put_bucket("hot#rpm", ample).await.unwrap();
    // 100 acquires a second on a row that takes 20: the store throttles the rest.
    let (mut granted, mut throttled) = (0u32, 0u32);
    for _ in 0..400 {
        match sluice.acquire("hot#rpm").await {
            Ok(lease) => {
                granted += 1;
                drop(lease);
            }
            Err(Error::RetryIn(_)) => throttled += 1,
            Err(e) => panic!("{e}"),
        }
        settled(&sluice).await;
        clock.advance(Duration::from_millis(10));
    }
    let row = sluice.bucket("hot#rpm").await.unwrap().unwrap();
    assert!(row.shards >= 8, "spread over {} rows", row.shards);
    assert!(
        throttled > 0 && granted > 100,
        "{granted} granted, {throttled} throttled"
    );
    // Spread, the bucket serves the whole demand: every acquire of the next second.
    for _ in 0..100 {
        drop(sluice.acquire("hot#rpm").await.unwrap());
        settled(&sluice).await;
        clock.advance(Duration::from_millis(10));
    }
}

/// A client of a store that throttles `hot#rpm` past 20 writes in a second of the clock
/// returned with it, telling nobody that ceiling.
fn throttling_client() -> (crate::clock::ManualClock, crate::Sluice) {
    let clock = crate::clock::ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let store = Arc::new(crate::shared::test_store::Hooked::new(ItemCeiling {
        clock: clock.clone(),
        per_second: 20,
        landed: std::sync::Mutex::new((0, 0)),
    }));
    let sluice = crate::Sluice::builder()
        .store_arc(store)
        .clock(clock.clone())
        .build()
        .unwrap();
    (clock, sluice)
}

/// 400 acquires on `hot#rpm`, 10 ms apart, each waiting up to `queue` for its turn; how
/// many the store throttled.
async fn hammer(sluice: &crate::Sluice, clock: &crate::clock::ManualClock, queue: Duration) -> u32 {
    hammer_with(sluice, clock, &crate::Acquire::new("hot#rpm"), queue).await
}

/// Waits (a millisecond of tokio's time at a time, at most five seconds) until no reshard
/// `sluice` started in the background is still running: a reshard runs in a task of its
/// own, on the clock the test moves only between acquires.
async fn settled(sluice: &crate::Sluice) {
    for _ in 0..5_000 {
        if !sluice.core().heat.resharding() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("a reshard still running after five seconds");
}

/// 400 acquires of `request`, 10 ms apart, each waiting up to `queue` for its turn; how
/// many the store throttled.
async fn hammer_with(
    sluice: &crate::Sluice,
    clock: &crate::clock::ManualClock,
    request: &crate::Acquire,
    queue: Duration,
) -> u32 {
    let mut throttled = 0;
    for _ in 0..400 {
        match sluice.acquire_after(request, None, queue).await {
            Ok(lease) => drop(lease),
            Err(Error::RetryIn(_)) => throttled += 1,
            Err(e) => panic!("{e}"),
        }
        settled(sluice).await;
        clock.advance(Duration::from_millis(10));
    }
    throttled
}

#[tokio::test]
async fn a_bucket_its_refill_keeps_short_is_not_spread_by_the_stores_throttles() {
    let (clock, sluice) = throttling_client();
    // Ten a second, holding ten: the row takes twice what the refill brings.
    let short = crate::Bucket::requests(crate::RefillRate::per_second(10)).with_capacity(10);
    sluice.put_bucket("hot#rpm", short).await.unwrap();
    // Waiting callers, 100 a second, each taking its turn in the bucket's debt: bursts of
    // them are throttled, but spread over more rows the bucket would grant no more.
    let throttled = hammer(&sluice, &clock, Duration::from_secs(30)).await;
    assert!(throttled > 0, "the store throttled the row");
    let row = sluice.bucket("hot#rpm").await.unwrap().unwrap();
    assert_eq!(row.shards, 1, "one row");
}

#[tokio::test]
async fn a_learned_ceiling_does_not_spread_a_bucket_refilling_within_twice_its_rows_rate() {
    let (clock, sluice) = throttling_client();
    // Thirty a second, holding plenty (never short in the run): the row already takes
    // two thirds of what the refill brings, so more rows would add at most a third.
    let bucket = crate::Bucket::requests(crate::RefillRate::per_second(30)).with_capacity(10_000);
    sluice.put_bucket("hot#rpm", bucket).await.unwrap();
    let throttled = hammer(&sluice, &clock, Duration::ZERO).await;
    assert!(throttled > 0, "the store throttled the row");
    let row = sluice.bucket("hot#rpm").await.unwrap().unwrap();
    assert_eq!(row.shards, 1, "one row");
}

#[tokio::test]
async fn a_tokens_bucket_counts_its_calls_by_what_they_cost_not_by_its_cost_per_call() {
    let (clock, sluice) = throttling_client();
    // 3,000 tokens a second, of calls costing 100 (a model's tokens): thirty calls a
    // second, as above, never short in the run. Counted by its cost per call (one token),
    // it would refill 3,000 calls a second, and be spread.
    let bucket =
        crate::Bucket::tokens(crate::RefillRate::per_second(3_000)).with_capacity(1_000_000);
    sluice.put_bucket("hot#rpm", bucket).await.unwrap();
    let request = crate::Acquire::with_cost("hot#rpm", 100);
    let throttled = hammer_with(&sluice, &clock, &request, Duration::ZERO).await;
    assert!(throttled > 0, "the store throttled the row");
    let row = sluice.bucket("hot#rpm").await.unwrap().unwrap();
    assert_eq!(row.shards, 1, "one row");
}

#[test]
fn a_lanes_call_cost_is_the_mean_of_late() {
    let costs = crate::shared::lanes::CallCosts::default();
    assert_eq!(costs.mean(), None);
    for cost in [50, 150] {
        costs.note(Tokens::new(cost));
    }
    assert_eq!(costs.mean(), Some(Tokens::new(100)));
    // Older costs count for less: after a few thousand calls of 10, the mean is near 10.
    for _ in 0..4_000 {
        costs.note(Tokens::new(10));
    }
    let mean = costs.mean().unwrap();
    assert!(mean >= Tokens::new(10) && mean < Tokens::new(11), "{mean}");
    // A cost beyond what it counts is counted as the most it counts, not wrapped.
    costs.note(Tokens::MAX);
    assert!(costs.mean().unwrap() > Tokens::new(1_000_000));
}

#[test]
fn a_refill_is_within_twice_a_rows_rate_in_calls() {
    let t = Tokens::new;
    // 30 a second over 1,000 s, calls of 1: within twice 15 a second, not twice 14.9.
    assert!(within_twice(t(30_000), t(1), 15_000));
    assert!(!within_twice(t(30_000), t(1), 14_900));
    // Calls of 100 tokens: 20 calls a second is 2,000 tokens, twice is 4,000.
    assert!(within_twice(t(4_000_000), t(100), 20_000));
    assert!(!within_twice(t(4_000_001), t(100), 20_000));
    // An ample bucket is never within it.
    assert!(!within_twice(t(1_000_000_000), t(1), 200_000));
}

/// Throttles every write of the row `hot` (`hot#rpm#1` unless set); counts reads of bucket
/// rows.
#[derive(Debug, Default)]
struct HotShard {
    hot: std::sync::Mutex<Option<&'static str>>,
    reads: std::sync::atomic::AtomicU32,
    throttled: std::sync::atomic::AtomicU32,
}

impl crate::shared::test_store::Hooks for HotShard {
    fn change(&self, change: &crate::store::BucketChange) -> Result<(), crate::store::ChangeError> {
        let hot = self.hot.lock().unwrap().unwrap_or("hot#rpm#1");
        if change.dimension.as_str() == hot {
            self.throttled
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(crate::store::StoreError::Throttled { source: None }.into());
        }
        Ok(())
    }

    fn read_buckets(&self, _: &[Dimension]) {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tokio::test]
async fn a_row_the_store_pushes_back_sends_the_acquire_to_another_row_not_to_a_read_of_all() {
    let store = Arc::new(crate::shared::test_store::Hooked::new(HotShard::default()));
    let clock = crate::clock::ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let sluice = crate::shared::test_store::client(store.clone(), &clock);
    let ample =
        crate::Bucket::requests(crate::RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
    sluice.put_bucket("hot#rpm", ample).await.unwrap();
    sluice.reshard("hot#rpm", 2).await.unwrap();
    let reads_before = store.hooks.reads.load(std::sync::atomic::Ordering::Relaxed);
    // Acquires that try the throttled row first are each granted by the other (the row is
    // drawn around for a second after each throttle, and tried again after).
    for _ in 0..40 {
        drop(sluice.acquire("hot#rpm").await.unwrap());
        settled(&sluice).await;
        clock.advance(Duration::from_millis(100));
    }
    assert!(
        store
            .hooks
            .throttled
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2,
        "the throttled row was tried"
    );
    let reads = store.hooks.reads.load(std::sync::atomic::Ordering::Relaxed) - reads_before;
    let throttled = store
        .hooks
        .throttled
        .load(std::sync::atomic::Ordering::Relaxed);
    // Each row read once as this client first writes it, and the throttled row read again
    // before each write after a throttle (the row moved on meanwhile): never all the rows.
    assert!(
        reads <= throttled + 2,
        "{reads} reads, {throttled} throttles"
    );
}

#[tokio::test]
async fn a_spread_bucket_s_acquires_go_around_a_row_pushed_back_for_a_second() {
    let store = Arc::new(crate::shared::test_store::Hooked::new(HotShard::default()));
    let clock = crate::clock::ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let sluice = crate::shared::test_store::client(store.clone(), &clock);
    let ample =
        crate::Bucket::requests(crate::RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
    sluice.put_bucket("hot#rpm", ample).await.unwrap();
    sluice.reshard("hot#rpm", 2).await.unwrap();
    let tries = || {
        store
            .hooks
            .throttled
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    // Until the hot row first pushes back, half the acquires go to it.
    while tries() == 0 {
        drop(sluice.acquire("hot#rpm").await.unwrap());
        settled(&sluice).await;
    }
    // Within the second after: 100 acquires, each drawn three times at most before it goes
    // to the hot row (1 in 8), where picked evenly about 50 would.
    let before = tries();
    for _ in 0..100 {
        drop(sluice.acquire("hot#rpm").await.unwrap());
        settled(&sluice).await;
        clock.advance(Duration::from_millis(5));
    }
    let within = tries() - before;
    assert!(
        within < 30,
        "the pushed-back row was tried {within} times of 100"
    );
}

#[tokio::test]
async fn a_row_pushed_back_whose_other_rows_were_gathered_away_asks_the_bucket() {
    let store = Arc::new(crate::shared::test_store::Hooked::new(HotShard::default()));
    let clock = crate::clock::ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let sluice = crate::shared::test_store::client(store.clone(), &clock);
    let other = crate::shared::test_store::client(store.clone(), &clock);
    let ample =
        crate::Bucket::requests(crate::RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
    sluice.put_bucket("hot#rpm", ample).await.unwrap();
    sluice.reshard("hot#rpm", 2).await.unwrap();
    // Another client gathers the bucket back into its first row, which the store then
    // throttles: this client still believes in two rows.
    other.reshard("hot#rpm", 1).await.unwrap();
    *store.hooks.hot.lock().unwrap() = Some("hot#rpm");
    for _ in 0..20 {
        match sluice.acquire("hot#rpm").await {
            Ok(lease) => drop(lease),
            Err(Error::RetryIn(_)) => {}
            Err(e) => panic!("{e}"),
        }
        settled(&sluice).await;
        clock.advance(Duration::from_millis(10));
    }
}

#[tokio::test]
async fn a_client_that_never_met_the_throttles_measures_the_rows_against_the_ceiling_they_carry() {
    let clock = crate::clock::ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let store = Arc::new(crate::shared::test_store::Hooked::new(ItemCeiling::new(
        &clock, 20,
    )));
    let first = client_of(store.clone(), &clock, None);
    let ample =
        crate::Bucket::requests(crate::RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
    first.put_bucket("hot#rpm", ample).await.unwrap();
    // 100 acquires a second on a row that takes 20: it spreads, and says what it learned.
    for _ in 0..400 {
        drop(first.acquire("hot#rpm").await);
        settled(&first).await;
        clock.advance(Duration::from_millis(10));
    }
    let spread = first.bucket("hot#rpm").await.unwrap().unwrap();
    let ceiling = spread
        .write_ceiling
        .expect("the rows carry the ceiling learned");
    assert!(spread.shards >= 8, "spread over {} rows", spread.shards);
    assert!((15..=40).contains(&ceiling), "learned {ceiling}");
    let base: Dimension = "hot#rpm".parse().unwrap();
    let shards: Vec<Dimension> = (1..spread.shards).map(|k| base.shard(k)).collect();
    let rows = crate::store::Store::read_buckets(store.as_ref(), &shards)
        .await
        .unwrap();
    for row in rows {
        assert_eq!(row.unwrap().write_ceiling, Some(ceiling));
    }
    // A client started since, told an item takes 1,000 writes a second (as DynamoDB
    // says), writes 50 a second for a minute: each row takes under a tenth of 1,000, cool
    // by what that client was told, but not of what the rows say they take.
    let config = crate::Config {
        sharding: crate::Sharding {
            item_write_ceiling: Some(1_000),
            ..crate::Sharding::default()
        },
        ..crate::Config::default()
    };
    let later = crate::SluiceBuilder::from_config(config)
        .store_arc(store)
        .clock(clock.clone())
        .build()
        .unwrap();
    for i in 0..3_000 {
        drop(later.acquire("hot#rpm").await.unwrap());
        settled(&later).await;
        clock.advance(Duration::from_millis(20));
        let row = later.bucket("hot#rpm").await.unwrap().unwrap();
        assert_eq!(row.shards, spread.shards, "gathered after {i} acquires");
    }
}

#[test]
fn a_short_bucket_is_gathered_only_into_rows_enough_for_its_refills_writes() {
    use super::seen::gathers_short;
    let per_ks = |per_second: i64| Tokens::new(per_second * 1_000);
    // Eight rows refilling 1 a second each, of a 1,000-write ceiling: 16 writes a second
    // fit in four rows, and in one.
    assert!(gathers_short(8, per_ks(1), Tokens::new(1), 1_000));
    assert!(gathers_short(2, per_ks(4), Tokens::new(1), 1_000));
    // Eight rows refilling 5 calls a second each (250 tokens of calls costing 50), of a
    // 100-write ceiling: 80 writes a second need more than 4 rows at 40 writes each.
    assert!(!gathers_short(8, per_ks(250), Tokens::new(50), 10));
    assert!(gathers_short(8, per_ks(250), Tokens::new(50), 100));
    // A lone row has nothing to gather into.
    assert!(!gathers_short(1, per_ks(1), Tokens::new(1), 1_000));
}

#[tokio::test]
async fn a_spread_bucket_its_refill_keeps_short_is_gathered() {
    let clock = crate::clock::ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    // A ceiling of 12 writes a second: a row taking one or two is not cool (under 10%).
    let config = crate::Config {
        sharding: crate::Sharding {
            item_write_ceiling: Some(12),
            ..crate::Sharding::default()
        },
        ..crate::Config::default()
    };
    let sluice = crate::SluiceBuilder::from_config(config)
        .store(crate::MemoryStore::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    // Eight a second over eight rows, asked 100 times a second: always short.
    let short = crate::Bucket::requests(crate::RefillRate::per_second(8)).with_capacity(8);
    sluice.put_bucket("short#rpm", short).await.unwrap();
    sluice.reshard("short#rpm", 8).await.unwrap();
    let mut granted = 0;
    for _ in 0..6_000 {
        if let Ok(lease) = sluice.acquire("short#rpm").await {
            granted += 1;
            drop(lease);
        }
        settled(&sluice).await;
        clock.advance(Duration::from_millis(10));
    }
    // Its refill's 16 writes a second fit in four rows (under 40% of 12 each), not in two.
    let row = sluice.bucket("short#rpm").await.unwrap().unwrap();
    assert_eq!(row.shards, 4);
    // It granted what the refill brought, however many rows it had.
    assert!((400..=8 + 8 * 60).contains(&granted), "{granted} granted");
}
