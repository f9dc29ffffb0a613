//! Client behaviour beyond the store conformance suite: the process-wide default client
//! and bounded waits.

use std::time::Duration;

use sluice::{Bucket, Error, MemoryStore, RefillRate, Sluice, clock::UnixMillis};

#[tokio::test]
async fn the_global_client_is_the_one_set_in_code() {
    let mine = Sluice::in_memory();
    mine.put_bucket("global#rpm", Bucket::requests(RefillRate::per_second(1)))
        .await
        .unwrap();
    Sluice::set_global(mine.clone());
    let global = Sluice::global().await.unwrap();
    assert!(
        global.bucket("global#rpm").await.unwrap().is_some(),
        "same store as the one set"
    );
    let replaced = Sluice::set_global(Sluice::in_memory()).expect("a previous client");
    assert!(replaced.bucket("global#rpm").await.unwrap().is_some());
    assert!(
        Sluice::global()
            .await
            .unwrap()
            .bucket("global#rpm")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_table_name_asks_for_connect_when_built_without_io() {
    let config = sluice::Config::from_lookup(|name| {
        (name == "SLUICE_TABLE_NAME").then(|| "vendor-buckets-pre".to_owned())
    })
    .unwrap();
    match sluice::SluiceBuilder::from_config(config).build() {
        Err(Error::Config(e)) => assert!(e.to_string().contains("vendor-buckets-pre"), "{e}"),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

fn paused_client() -> Sluice {
    Sluice::builder()
        .store(MemoryStore::new())
        .clock(sluice::clock::TokioClock::starting_at(
            UnixMillis::from_secs(1_700_000_000),
        ))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn acquire_within_waits_exactly_the_retry_in_and_stops_at_its_bound() {
    let sluice = paused_client();
    sluice
        .put_bucket(
            "wait#rpm",
            Bucket::requests(RefillRate::per_second(2)).with_capacity(1),
        )
        .await
        .unwrap();
    sluice
        .acquire("wait#rpm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let lease = sluice
        .acquire_within("wait#rpm", Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(500),
        "slept exactly the RetryIn"
    );
    lease.release().await.unwrap();
    // The next token is 500 ms away: a 499 ms bound gives up at once with that RetryIn.
    let started = tokio::time::Instant::now();
    let e = sluice
        .acquire_within("wait#rpm", Duration::from_millis(499))
        .await
        .unwrap_err();
    assert_eq!(e.retry_in(), Some(Duration::from_millis(500)));
    assert_eq!(started.elapsed(), Duration::ZERO);
}

mod prefetch {
    use super::*;
    use sluice::{Acquire, Prefetch, Tokens, clock::ManualClock};

    fn client(clock: &ManualClock, store: &std::sync::Arc<MemoryStore>, dim: &str) -> Sluice {
        Sluice::builder()
            .store_arc(store.clone())
            .clock(clock.clone())
            .prefetch(
                dim.parse().unwrap(),
                Prefetch::new(5, Duration::from_secs(1)),
            )
            .build()
            .unwrap()
    }

    /// What the bucket holds now, and its version.
    async fn tokens(sluice: &Sluice, dim: &str) -> (Tokens, u64) {
        let row = sluice.bucket(dim).await.unwrap().unwrap();
        (row.available(sluice.now()), row.version)
    }

    #[tokio::test]
    async fn grants_come_from_the_prefetch_until_it_runs_out_or_its_hold_ends() {
        let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
        let store = std::sync::Arc::new(MemoryStore::new());
        let dim = "hot#rpm";
        let sluice = client(&clock, &store, dim);
        sluice
            .put_bucket(
                dim,
                Bucket::requests(RefillRate::per_second(1))
                    .with_capacity(100)
                    .lean(),
            )
            .await
            .unwrap();
        let (_, v0) = tokens(&sluice, dim).await;
        // The first grant's write takes five more.
        let lease = sluice.acquire(dim).await.unwrap();
        assert_eq!(lease.attempts(), 1);
        assert_eq!(tokens(&sluice, dim).await, (Tokens::new(94), v0 + 1));
        // The next five are granted locally: no write.
        for _ in 0..5 {
            assert_eq!(sluice.acquire(dim).await.unwrap().attempts(), 0);
        }
        assert_eq!(tokens(&sluice, dim).await, (Tokens::new(94), v0 + 1));
        // Spent: the next grant writes and prefetches again.
        assert_eq!(sluice.acquire(dim).await.unwrap().attempts(), 1);
        assert_eq!(tokens(&sluice, dim).await, (Tokens::new(88), v0 + 2));
        // A request bigger than what is left goes to the bucket, and replaces the rest.
        assert_eq!(
            sluice
                .acquire(Acquire::with_cost(dim, 2))
                .await
                .unwrap()
                .attempts(),
            0
        );
        assert_eq!(
            sluice
                .acquire(Acquire::with_cost(dim, 4))
                .await
                .unwrap()
                .attempts(),
            1
        );
        assert_eq!(tokens(&sluice, dim).await, (Tokens::new(79), v0 + 3));
        // Past the hold, the prefetched tokens are dropped, not granted.
        assert_eq!(sluice.acquire(dim).await.unwrap().attempts(), 0);
        clock.advance(Duration::from_secs(1));
        assert_eq!(sluice.acquire(dim).await.unwrap().attempts(), 1);
        // 79 + 1 refilled - 1 granted - 5 prefetched; the 4 left of the old prefetch
        // are gone for good.
        assert_eq!(tokens(&sluice, dim).await, (Tokens::new(74), v0 + 4));
    }

    #[tokio::test]
    async fn every_row_of_a_spread_bucket_prefetches() {
        let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
        let store = std::sync::Arc::new(MemoryStore::new());
        let dim = "spread#rpm";
        let sluice = client(&clock, &store, dim);
        let rpm = Bucket::requests(RefillRate::per_second(1))
            .with_capacity(400)
            .lean();
        sluice.put_bucket(dim, rpm).await.unwrap();
        sluice.reshard(dim, 4).await.unwrap();
        // Each write takes five more for this client, whichever row it lands on: of 60
        // grants, about five in six are local (one row alone would give a fifth of that).
        let mut local = 0;
        for _ in 0..60 {
            if sluice.acquire(dim).await.unwrap().attempts() == 0 {
                local += 1;
            }
        }
        assert!(local >= 36, "{local} of 60 granted from a prefetch");
        // Every token a prefetch took is gone from the rows, and no more.
        let rows: Vec<_> = sluice.buckets().await.unwrap();
        let left = rows
            .iter()
            .fold(Tokens::ZERO, |sum, r| sum + r.available(clock.now()));
        let writes = 60 - local;
        assert_eq!(left, Tokens::new(400 - writes * 6));
    }

    #[tokio::test]
    async fn prefetch_takes_only_from_plenty_and_only_from_lean_buckets() {
        let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
        let store = std::sync::Arc::new(MemoryStore::new());
        let lean = "near#rpm";
        let leased = "leased#rpm";
        let sluice = Sluice::builder()
            .store_arc(store.clone())
            .clock(clock.clone())
            .prefetch(
                lean.parse().unwrap(),
                Prefetch::new(5, Duration::from_secs(1)),
            )
            .prefetch(
                leased.parse().unwrap(),
                Prefetch::new(5, Duration::from_secs(1)),
            )
            .build()
            .unwrap();
        // 10 tokens: after one grant, taking 5 would leave fewer than 5.
        sluice
            .put_bucket(
                lean,
                Bucket::requests(RefillRate::per_second(1))
                    .with_capacity(10)
                    .lean(),
            )
            .await
            .unwrap();
        sluice
            .put_bucket(
                leased,
                Bucket::requests(RefillRate::per_second(1)).with_capacity(100),
            )
            .await
            .unwrap();
        for dim in [lean, leased] {
            for _ in 0..3 {
                let lease = sluice.acquire(dim).await.unwrap();
                assert_eq!(lease.attempts(), 1, "{dim}: every grant written");
                lease.release().await.unwrap();
            }
        }
        assert_eq!(tokens(&sluice, lean).await.0, Tokens::new(7));
        assert_eq!(tokens(&sluice, leased).await.0, Tokens::new(97));
    }

    #[tokio::test]
    async fn a_vendor_pause_drops_the_tokens_this_client_prefetched() {
        let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
        let store = std::sync::Arc::new(MemoryStore::new());
        let dim = "hot#rpm";
        let sluice = client(&clock, &store, dim);
        sluice
            .put_bucket(
                dim,
                Bucket::requests(RefillRate::per_second(1))
                    .with_capacity(100)
                    .lean(),
            )
            .await
            .unwrap();
        // One grant written, five more taken ahead.
        assert_eq!(sluice.acquire(dim).await.unwrap().attempts(), 1);
        // The vendor answers 429 with a 7 s pause: nothing more is granted before it ends,
        // not even from what this client took ahead.
        assert!(
            sluice
                .tighten(
                    dim,
                    sluice::admin::Tighten::PauseFor(Duration::from_secs(7))
                )
                .await
                .unwrap()
        );
        let e = sluice.acquire(dim).await.unwrap_err();
        assert_eq!(e.retry_in(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn a_prefetch_needs_tokens_and_a_hold() {
        for p in [
            Prefetch::new(0, Duration::from_secs(1)),
            Prefetch::new(5, Duration::ZERO),
        ] {
            match Sluice::builder()
                .store(sluice::MemoryStore::new())
                .prefetch("hot#rpm".parse().unwrap(), p)
                .build()
            {
                Err(Error::Config(e)) => assert!(e.to_string().contains("hot#rpm"), "{e}"),
                other => panic!("expected a configuration error, got {other:?}"),
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiting_caller_gets_a_slot_freed_by_another_client_within_the_poll_interval() {
    let store = std::sync::Arc::new(MemoryStore::new());
    let clock = sluice::clock::TokioClock::starting_at(UnixMillis::from_secs(1_700_000_000));
    let client = |poll: Duration| {
        Sluice::builder()
            .store_arc(store.clone())
            .clock(clock)
            .slot_poll(poll)
            .build()
            .unwrap()
    };
    let poll = Duration::from_millis(200);
    let holder = client(poll);
    let waiter = client(poll);
    let dim = "wait#concurrent";
    holder.put_bucket(dim, Bucket::concurrent(1)).await.unwrap();
    for hold in [
        Duration::from_millis(50),
        Duration::from_millis(1_234),
        Duration::from_secs(20),
    ] {
        let held = holder.acquire(dim).await.unwrap();
        let release_at = tokio::time::Instant::now() + hold;
        let release = tokio::spawn(async move {
            tokio::time::sleep_until(release_at).await;
            held.release().await.unwrap();
        });
        // The holder's lease lives 60 s, but its holder may release it any moment: the
        // waiter looks again every 100 to 200 ms and takes the slot within one poll
        // interval of its release.
        let lease = waiter
            .acquire_within(dim, Duration::from_secs(30))
            .await
            .expect("the freed slot reached the waiter");
        let late = tokio::time::Instant::now() - release_at;
        assert!(late <= poll, "{late:?} after the release (hold {hold:?})");
        release.await.unwrap();
        lease.release().await.unwrap();
    }
    // Within a budget shorter than the poll interval, a waiter gives up with the RetryIn.
    let held = holder.acquire(dim).await.unwrap();
    let started = tokio::time::Instant::now();
    let e = waiter
        .acquire_within(dim, Duration::from_millis(50))
        .await
        .unwrap_err();
    // The holder's lease lives 60 s, but its holder may release it any moment: the RetryIn
    // is a good time to ask again, the poll interval.
    assert_eq!(e.retry_in(), Some(poll));
    assert!(started.elapsed() <= Duration::from_millis(50));
    held.release().await.unwrap();
}

#[tokio::test]
async fn a_ttl_or_slot_timeout_under_a_millisecond_is_a_typed_error() {
    let sluice = Sluice::in_memory();
    sluice
        .put_bucket("ttl#rpm", Bucket::requests(RefillRate::per_second(1)))
        .await
        .unwrap();
    let e = sluice
        .acquire(sluice::Acquire::new("ttl#rpm").ttl(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidTtl(_)), "{e}");
    let e = sluice
        .slot("ttl#rpm", Duration::from_micros(999), async {})
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidTtl(_)), "{e}");
    assert_eq!(
        sluice.bucket("ttl#rpm").await.unwrap().unwrap().tokens,
        sluice::Tokens::new(60),
        "nothing taken"
    );
}

/// A slot is held as long as its holder lives, not as long as its TTL: a lease of 60 s
/// held ten minutes (paused time) is renewed every 20 s, never handed to another caller
/// nor reclaimed, and comes back once, when released.
#[tokio::test(start_paused = true)]
async fn a_slot_held_ten_minutes_is_renewed_and_never_reclaimed_meanwhile() {
    let sluice = paused_client();
    let other = Sluice::builder()
        .store_arc(sluice.store().clone())
        .clock(sluice::clock::TokioClock::starting_at(
            UnixMillis::from_secs(1_700_000_000),
        ))
        .build()
        .unwrap();
    sluice
        .put_bucket("tts#concurrent", Bucket::concurrent(1))
        .await
        .unwrap();
    let lease = sluice.acquire("tts#concurrent").await.unwrap();
    let granted_until = lease.expires_at();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(matches!(
            other.acquire("tts#concurrent").await,
            Err(Error::RetryIn(_))
        ));
        assert_eq!(other.reconcile().await.unwrap().leases_restored, 0);
        assert!(!lease.remaining().is_zero());
    }
    assert!(lease.expires_at() >= granted_until.saturating_add(Duration::from_secs(540)));
    let lost = lease.lost();
    tokio::pin!(lost);
    assert!(futures::poll!(lost.as_mut()).is_pending());
    lease.release().await.unwrap();
    let row = other.bucket("tts#concurrent").await.unwrap().unwrap();
    assert_eq!(row.tokens, sluice::Tokens::new(1));
}
