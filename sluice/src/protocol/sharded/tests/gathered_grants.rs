//! A grant no single row of a spread bucket can serve, gathered from several: a part per
//! row, each the row's own lane write, all or nothing (a refused gather gives back what it
//! took).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};

use super::*;

/// Throttles every change of the row `g#tpm#2` while `on`, counting them.
#[derive(Debug, Default)]
struct ThrottledRow {
    on: AtomicBool,
    throttled: AtomicU32,
}

impl crate::shared::test_store::Hooks for ThrottledRow {
    fn change(&self, change: &crate::store::BucketChange) -> Result<(), crate::store::ChangeError> {
        if self.on.load(SeqCst) && change.dimension.as_str() == "g#tpm#2" {
            self.throttled.fetch_add(1, SeqCst);
            return Err(crate::store::StoreError::Throttled { source: None }.into());
        }
        Ok(())
    }
}

/// The tokens every row of `g#tpm` holds, as stored.
async fn stored(store: &crate::store::MemoryStore) -> Vec<Tokens> {
    use crate::store::Store as _;
    let rows: Vec<Dimension> = (0..4)
        .map(|k| "g#tpm".parse::<Dimension>().unwrap().shard(k))
        .collect();
    let read = store.read_buckets(&rows).await.unwrap();
    read.into_iter().map(|r| r.unwrap().tokens).collect()
}

/// A client of a store holding `g#tpm`, 1,000 tokens refilling 100 a second, spread over
/// four rows of 250.
async fn spread() -> (
    Arc<crate::shared::test_store::Hooked<ThrottledRow>>,
    crate::Sluice,
) {
    let store = Arc::new(crate::shared::test_store::Hooked::new(
        ThrottledRow::default(),
    ));
    let clock = crate::clock::ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let sluice = client_of(store.clone(), &clock, None);
    let bucket = crate::Bucket::tokens(crate::RefillRate::per_second(100)).with_capacity(1_000);
    sluice.put_bucket("g#tpm", bucket).await.unwrap();
    sluice.reshard("g#tpm", 4).await.unwrap();
    (store, sluice)
}

#[tokio::test]
async fn a_grant_gathered_from_rows_takes_each_rows_part_and_gives_it_back_whole() {
    let (store, sluice) = spread().await;
    // 600 is more than a row holds (250): three rows give a part each.
    let lease = sluice
        .acquire(crate::Acquire::with_cost("g#tpm", 600))
        .await
        .unwrap();
    assert_eq!(lease.cost("g#tpm"), Some(Tokens::new(600)));
    let left = stored(&store.inner).await;
    assert_eq!(
        left.iter().copied().sum::<Tokens>(),
        Tokens::new(400),
        "{left:?}"
    );
    assert!(left.iter().all(|t| *t >= Tokens::ZERO), "{left:?}");
    // Released, it stays taken (a `tokens` bucket's grant is spent), on the rows it came
    // from.
    lease.release().await.unwrap();
    assert_eq!(stored(&store.inner).await, left);
}

#[tokio::test]
async fn a_gather_a_row_pushes_back_is_back_pressure_at_once_and_holds_nothing() {
    let (store, sluice) = spread().await;
    store.hooks.on.store(true, SeqCst);
    // Every row holds 250: a gather of 1,000 needs all four, and the third pushes back.
    match sluice
        .acquire(crate::Acquire::with_cost("g#tpm", 1_000))
        .await
    {
        Err(Error::RetryIn(refusal)) => assert!(refusal.short.is_empty(), "{refusal:?}"),
        other => panic!("{other:?}"),
    }
    // Answered at its first push-back (the first row tried may have met one too): the
    // other rows' parts were not held through waits and asked again, nor every row read
    // again.
    assert!(
        store.hooks.throttled.load(SeqCst) <= 2,
        "{:?}",
        store.hooks.throttled
    );
    // Nothing is held: every part taken was given back.
    assert_eq!(stored(&store.inner).await, vec![Tokens::new(250); 4]);
}
