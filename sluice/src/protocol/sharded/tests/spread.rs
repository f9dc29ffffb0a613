//! A spread a client decides on lands on the row it relieves: that row is full and
//! throttled, and every grant writes it.

use super::*;
use crate::bucket::{Commute, TokensOp};
use crate::store::StoreError;

/// [`ItemCeiling`] on `hot#rpm`, whose reshard transactions the store also throttles, the
/// first `throttled` of them; each is noted with the clock's instant and whether it moves
/// the first row by what it holds (an `ADD`), not by setting it. Each read of bucket rows
/// takes a millisecond of the clock (a row just granted is full again by the reshard's
/// read of it, as over the wire).
#[derive(Debug)]
struct ThrottledSpreads {
    ceiling: ItemCeiling,
    throttled: u32,
    sent: std::sync::Mutex<Vec<(UnixMillis, bool)>>,
}

impl crate::shared::test_store::Hooks for ThrottledSpreads {
    fn change(&self, change: &crate::store::BucketChange) -> Result<(), crate::store::ChangeError> {
        self.ceiling.change(change)
    }

    fn read_buckets(&self, _dimensions: &[crate::dimension::Dimension]) {
        self.ceiling.clock.advance(Duration::from_millis(1));
    }

    fn respread(&self, moves: &[Option<Commute>]) -> Result<bool, StoreError> {
        let adds = matches!(
            moves.first(),
            Some(Some(Commute {
                tokens: TokensOp::Add(_),
                ..
            }))
        );
        let mut sent = self.sent.lock().unwrap();
        sent.push((self.ceiling.clock.now(), adds));
        if sent.len() <= self.throttled as usize {
            return Err(StoreError::Throttled { source: None });
        }
        Ok(true)
    }
}

/// A client of a store that throttles `hot#rpm` past 20 writes a second and the first
/// `throttled` reshard transactions, on an ample bucket there.
async fn spreading(
    throttled: u32,
) -> (
    Arc<crate::shared::test_store::Hooked<ThrottledSpreads>>,
    crate::clock::ManualClock,
    crate::Sluice,
) {
    let clock = crate::clock::ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let store = Arc::new(crate::shared::test_store::Hooked::new(ThrottledSpreads {
        ceiling: ItemCeiling::new(&clock, 20),
        throttled,
        sent: std::sync::Mutex::default(),
    }));
    let sluice = client_of(store.clone(), &clock, None);
    let ample =
        crate::Bucket::requests(crate::RefillRate::per_second(1_000_000)).with_capacity(1_000_000);
    sluice.put_bucket("hot#rpm", ample.clone()).await.unwrap();
    sluice.put_bucket("other#rpm", ample).await.unwrap();
    (store, clock, sluice)
}

#[tokio::test(start_paused = true)]
async fn a_spread_the_store_throttles_is_sent_again_by_the_client_that_decided_it() {
    let (store, clock, sluice) = spreading(2).await;
    let throttled = hammer(&sluice, &clock, Duration::ZERO).await;
    assert!(throttled > 0, "the store throttled the row");
    let row = sluice.bucket("hot#rpm").await.unwrap().unwrap();
    assert!(row.shards > 1, "not spread: {row:?}");
    // Two throttled, the third landed, all in the acquire that decided it (the clock moves
    // 10 ms an acquire, and a millisecond a read): not left to another decision, later.
    let sent = store.hooks.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 3, "{sent:?}");
    let span = sent[2].0.saturating_since(sent[0].0);
    assert!(span < Duration::from_millis(10), "{sent:?}");
}

#[tokio::test(start_paused = true)]
async fn a_spread_the_client_decided_moves_its_full_row_by_what_it_holds_at_once() {
    let (store, clock, sluice) = spreading(0).await;
    hammer(&sluice, &clock, Duration::ZERO).await;
    // The row the throttles spread: full (every grant refills it to its capacity), and
    // moved by an `ADD` from the first attempt, whose exact move (`SET` on the refill
    // timestamp as read) the next grant's refill would fail.
    let decided = store.hooks.sent.lock().unwrap().clone();
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert!(decided[0].1, "the first attempt set the row: {decided:?}");
    // An operator's reshard of a full row not measured hot tries the exact move first.
    sluice.reshard("other#rpm", 4).await.unwrap();
    let sent = store.hooks.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(
        !sent[1].1,
        "the operator's reshard added to the row: {sent:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_operators_reshard_the_store_throttles_answers_the_throttle() {
    let (store, _clock, sluice) = spreading(1).await;
    match sluice.reshard("other#rpm", 4).await {
        Err(Error::Store(StoreError::Throttled { .. })) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(store.hooks.sent.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn only_a_lone_row_that_is_not_short_is_spread_for_its_throttles() {
    let (_store, clock, sluice) = spreading(0).await;
    let core = sluice.core();
    let base: crate::dimension::Dimension = "hot#rpm".parse().unwrap();
    let lane = core.lane(&base);
    // Not yet known, or known full: its throttles may spread it.
    assert!(super::super::may_spread(core, &lane, &base));
    let mut row = sluice.bucket("hot#rpm").await.unwrap().unwrap();
    core.lanes.learn(row.clone(), clock.now());
    assert!(super::super::may_spread(core, &lane, &base));
    // Short (its callers wait in its debt): its throttles are a burst's, not a ceiling's.
    row.tokens = crate::Tokens::new(-5);
    row.last_refill_at = clock.now();
    core.lanes.learn(row.clone(), clock.now());
    assert!(!super::super::may_spread(core, &lane, &base));
    // A shard row, or a bucket already spread, is not a lone row.
    let shard = base.shard(1);
    assert!(!super::super::may_spread(core, &core.lane(&shard), &shard));
}

#[tokio::test(start_paused = true)]
async fn a_spread_the_store_keeps_throttling_is_sent_again_soon_up_to_its_bound() {
    use crate::protocol::reshard::{SPREAD_THROTTLED, reshard_from};
    let base: crate::dimension::Dimension = "hot#rpm".parse().unwrap();
    // Throttled as many times as it is sent again: it lands on the last, within a second
    // of tokio's time (a pause of 20 to 40 ms before each).
    let (store, _clock, sluice) = spreading(SPREAD_THROTTLED).await;
    let started = tokio::time::Instant::now();
    let rows = reshard_from(sluice.core(), &base, Some(1), 8)
        .await
        .unwrap();
    assert_eq!(rows.len(), 8);
    assert_eq!(
        store.hooks.sent.lock().unwrap().len(),
        SPREAD_THROTTLED as usize + 1
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    // Once more and it is given up, the store's throttle answered.
    let (store, _clock, sluice) = spreading(SPREAD_THROTTLED + 1).await;
    match reshard_from(sluice.core(), &base, Some(1), 8).await {
        Err(Error::Store(StoreError::Throttled { .. })) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store.hooks.sent.lock().unwrap().len(),
        SPREAD_THROTTLED as usize + 1
    );
    assert_eq!(sluice.bucket("hot#rpm").await.unwrap().unwrap().shards, 1);
}
