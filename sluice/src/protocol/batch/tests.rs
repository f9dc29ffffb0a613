//! A lane write's retries after a lost race.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::bucket::{Bucket, BucketState, Condition, TokensOp};
use crate::clock::{ManualClock, UnixMillis};
use crate::rate::RefillRate;
use crate::shared::test_store::{Hooked, Hooks, client};
use crate::store::{BucketChange, ChangeError};
use crate::tokens::Tokens;

const RPM: &str = "vendor#rpm";

/// Records every bucket change; the first one after [`Recorder::arm`] also moves `clock`
/// to `to` (the time a lost race takes).
#[derive(Debug, Default)]
struct Recorder {
    changes: Mutex<Vec<BucketChange>>,
    armed: Mutex<Option<(ManualClock, UnixMillis)>>,
}

impl Recorder {
    fn arm(&self, clock: &ManualClock, to: UnixMillis) {
        *self.armed.lock().unwrap() = Some((clock.clone(), to));
    }

    fn changes(&self) -> Vec<BucketChange> {
        self.changes.lock().unwrap().clone()
    }
}

impl Hooks for Recorder {
    fn change(&self, change: &BucketChange) -> Result<(), ChangeError> {
        self.changes.lock().unwrap().push(change.clone());
        if let Some((clock, to)) = self.armed.lock().unwrap().take() {
            clock.set(to);
        }
        Ok(())
    }
}

fn at(ms: i64) -> UnixMillis {
    UnixMillis::new(1_700_000_000_000 + ms)
}

/// 100 a second (one every 10 ms), holding 100: full again 10 ms after a take of one.
fn bucket() -> Bucket {
    Bucket::requests(RefillRate::per_second(100)).with_capacity(100)
}

/// `row` with its level set: `tokens` stored, refilled at `last`.
fn with_level(row: &BucketState, tokens: i64, last: UnixMillis) -> BucketState {
    let mut row = row.clone();
    row.tokens = Tokens::new(tokens);
    row.last_refill_at = last;
    row
}

#[tokio::test]
async fn a_race_lost_to_a_later_fill_is_retried_as_a_take_at_that_fill_not_as_another_fill() {
    let store = Arc::new(Hooked::new(Recorder::default()));
    let (mine, theirs) = (ManualClock::new(at(0)), ManualClock::new(at(0)));
    let sluice = client(store.clone(), &mine);
    let other = client(store.clone(), &theirs);
    sluice.put_bucket(RPM, bucket()).await.unwrap();
    // This client fills the full bucket at 0 and remembers that row.
    sluice.acquire(RPM).await.unwrap().release().await.unwrap();
    // Another process, its clock read later (110 ms), writes first: its first write, a
    // herd's lead, stamped back to 100 ms by the 10 ms the token it was short of full took
    // to refill.
    theirs.set(at(110));
    other.acquire(RPM).await.unwrap().release().await.unwrap();
    // This client's clock read 100 ms when it computed its fill; its write lands after the
    // other's, and the answer comes back at 130 ms, when the bucket is full again.
    mine.set(at(100));
    store.hooks.arm(&mine, at(130));
    let before = store.hooks.changes().len();
    sluice.acquire(RPM).await.unwrap().release().await.unwrap();

    let changes = store.hooks.changes();
    assert_eq!(
        changes.len() - before,
        2,
        "one lost race, then one write that applies"
    );
    let retry = &changes[before + 1].commute;
    assert_eq!(retry.tokens, TokensOp::Add(Tokens::new(-1)));
    assert_eq!(retry.refill, None, "a take moves no refill timestamp");
    assert!(retry.when.contains(&Condition::RefilledSince(at(100))));
    // The row keeps the other process's refill timestamp, with both of its takes.
    let row = sluice.bucket(RPM).await.unwrap().unwrap();
    assert_eq!(row.last_refill_at, at(100));
    assert_eq!(row.refilled(at(110)).tokens, Tokens::new(98));
    // The take commutes: a later fill landing first would not make it fail, where a fill
    // computed at 130 ms would have.
    let later = with_level(&row, 99, at(125));
    assert!(changes[before + 1].holds(&later));
}

#[tokio::test]
async fn after_a_lost_race_a_request_the_later_fills_level_cannot_serve_is_decided_at_now() {
    let store = Arc::new(Hooked::new(Recorder::default()));
    let (mine, theirs) = (ManualClock::new(at(0)), ManualClock::new(at(0)));
    let sluice = client(store.clone(), &mine);
    let other = client(store.clone(), &theirs);
    // Two a second, holding two.
    let slow = Bucket::requests(RefillRate::per_second(2)).with_capacity(2);
    sluice.put_bucket(RPM, slow).await.unwrap();
    sluice.acquire(RPM).await.unwrap().release().await.unwrap();
    // The bucket is full again by 500 ms; another process takes both at 1,100 ms, its first
    // write a herd's lead, which stamps the row at 600 ms (back by the 500 ms the token it
    // was short of full took to refill).
    theirs.set(at(1_100));
    other.acquire(RPM).await.unwrap().release().await.unwrap();
    other.acquire(RPM).await.unwrap().release().await.unwrap();
    // This client computed a fill at 1,000 ms; its answer comes back at 1,700 ms, when one
    // token has come back: granted, which the empty bucket at 1,100 ms could not do.
    mine.set(at(1_000));
    store.hooks.arm(&mine, at(1_700));
    let before = store.hooks.changes().len();
    sluice.acquire(RPM).await.unwrap().release().await.unwrap();
    let retry = &store.hooks.changes()[before + 1..];
    assert_eq!(retry.len(), 1, "granted by the write after the lost race");
    // Counting the refill from that stamp to 1,700 ms.
    assert!(
        retry[0]
            .commute
            .when
            .contains(&Condition::RefilledAt(at(600)))
    );
    let row = sluice.bucket(RPM).await.unwrap().unwrap();
    assert_eq!(row.available(at(1_700)), Tokens::from_nanos(200_000_000));
    // Nothing is owed past what refilled: the next token is back at 2,100 ms.
    let refused = sluice.acquire(RPM).await.unwrap_err();
    assert_eq!(refused.retry_in(), Some(Duration::from_millis(400)));
}

/// Throttles the next bucket change when armed; counts every change and every read.
#[derive(Debug, Default)]
struct Throttler {
    changes: std::sync::atomic::AtomicU32,
    reads: std::sync::atomic::AtomicU32,
    throttle_next: std::sync::atomic::AtomicBool,
}

impl Hooks for Throttler {
    fn read_buckets(&self, _dimensions: &[crate::dimension::Dimension]) {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn change(&self, _change: &BucketChange) -> Result<(), ChangeError> {
        use std::sync::atomic::Ordering::SeqCst;
        self.changes.fetch_add(1, SeqCst);
        if self.throttle_next.swap(false, SeqCst) {
            return Err(ChangeError::Store(crate::store::StoreError::Throttled {
                source: None,
            }));
        }
        Ok(())
    }
}

#[tokio::test]
async fn after_a_throttled_write_the_next_is_computed_from_the_row_read_again() {
    use std::sync::atomic::Ordering::SeqCst;
    let store = Arc::new(Hooked::new(Throttler::default()));
    let (mine, theirs) = (ManualClock::new(at(0)), ManualClock::new(at(0)));
    let sluice = client(store.clone(), &mine);
    let other = client(store.clone(), &theirs);
    // Ten a second, holding two: this client takes one at 0 ms (not short, as it saw it).
    let bucket = Bucket::requests(RefillRate::per_second(10)).with_capacity(2);
    sluice.put_bucket(RPM, bucket).await.unwrap();
    sluice.acquire(RPM).await.unwrap().release().await.unwrap();
    // A first throttle at 10 ms: the client reads the row once to learn whether the
    // bucket was spread since (at most once a second).
    mine.set(at(10));
    store.hooks.throttle_next.store(true, SeqCst);
    assert!(sluice.acquire(RPM).await.unwrap_err().retry_in().is_some());
    // Another process empties it at 100 ms; this client's write at 150 ms, from the row it
    // read at 10 ms, is throttled again: a refusal for now, the row kept for refusals.
    theirs.set(at(100));
    for _ in 0..2 {
        other.acquire(RPM).await.unwrap().release().await.unwrap();
    }
    mine.set(at(150));
    store.hooks.throttle_next.store(true, SeqCst);
    assert!(sluice.acquire(RPM).await.unwrap_err().retry_in().is_some());
    assert!(
        sluice
            .core()
            .lane(&RPM.parse().unwrap())
            .memory()
            .row()
            .is_some()
    );
    let (changes, reads) = (
        store.hooks.changes.load(SeqCst),
        store.hooks.reads.load(SeqCst),
    );
    // Asked again, the client reads the row first: half a token, refused exactly, with no
    // write (one computed from the row of 10 ms would fail its condition: a billed write
    // on a throttled row).
    let refused = sluice.acquire(RPM).await.unwrap_err();
    assert_eq!(refused.retry_in(), Some(Duration::from_millis(50)));
    assert_eq!(store.hooks.changes.load(SeqCst), changes, "no write");
    assert_eq!(store.hooks.reads.load(SeqCst) - reads, 1, "one read");
}

/// Refuses the first bucket change with `row` handed back (as DynamoDB refuses a herd's
/// lead on a row whose stored tokens carry digits past a billionth: the row it hands back
/// reads the same), then lets every change through; records them all.
#[derive(Debug, Default)]
struct RefuseFirst {
    row: Mutex<Option<BucketState>>,
    changes: Mutex<Vec<BucketChange>>,
}

impl Hooks for RefuseFirst {
    fn change(&self, change: &BucketChange) -> Result<(), ChangeError> {
        self.changes.lock().unwrap().push(change.clone());
        match self.row.lock().unwrap().take() {
            Some(row) => Err(ChangeError::Condition(Some(Box::new(row)))),
            None => Ok(()),
        }
    }
}

#[tokio::test]
async fn a_refused_herd_write_is_computed_again_as_a_fill() {
    let store = Arc::new(Hooked::new(RefuseFirst::default()));
    let clock = ManualClock::new(at(0));
    let admin = client(store.clone(), &clock);
    admin.put_bucket(RPM, bucket()).await.unwrap();
    *store.hooks.row.lock().unwrap() = admin.bucket(RPM).await.unwrap();
    // A new process's first grant on the full row: a herd write, refused, then a fill.
    clock.set(at(1_000));
    let fresh = client(store.clone(), &clock);
    fresh.acquire(RPM).await.unwrap().release().await.unwrap();
    let changes = store.hooks.changes.lock().unwrap().clone();
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(changes[0].commute.herd.is_some());
    assert_eq!(changes[1].commute.herd, None);
    assert!(changes[1].commute.refill.is_some(), "a fill");
    assert_eq!(
        fresh.bucket(RPM).await.unwrap().unwrap().tokens,
        Tokens::new(99)
    );
}

/// Refuses every bucket change with `row` handed back, as a row other writers keep
/// winning would; counts them.
#[derive(Debug, Default)]
struct AlwaysBeaten {
    row: Mutex<Option<BucketState>>,
    changes: std::sync::atomic::AtomicU32,
}

impl Hooks for AlwaysBeaten {
    fn change(&self, _: &BucketChange) -> Result<(), ChangeError> {
        self.changes.fetch_add(1, SeqCst);
        let row = self.row.lock().unwrap().clone();
        Err(ChangeError::Condition(row.map(Box::new)))
    }
}

/// A write that keeps losing races pauses between attempts after the first few (a
/// doubling, jittered pause of at most 16 ms): not hundreds of billed writes back to back.
/// It ends with `Contention` after its bounded attempts, within a few seconds.
#[tokio::test(start_paused = true)]
async fn a_write_that_keeps_losing_races_backs_off_and_ends() {
    let store = Arc::new(Hooked::new(AlwaysBeaten::default()));
    let clock = ManualClock::new(at(0));
    let admin = client(store.clone(), &clock);
    admin.put_bucket(RPM, bucket()).await.unwrap();
    *store.hooks.row.lock().unwrap() = admin.bucket(RPM).await.unwrap();
    let started = tokio::time::Instant::now();
    let acquire = tokio::spawn({
        let sluice = client(store.clone(), &clock);
        async move { sluice.acquire(RPM).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let early = store.hooks.changes.load(SeqCst);
    assert!(early <= 20, "{early} writes in the first 50 ms");
    let answer = acquire.await.unwrap();
    assert!(
        matches!(answer, Err(crate::Error::Contention { .. })),
        "{answer:?}"
    );
    let all = store.hooks.changes.load(SeqCst);
    assert_eq!(all, super::MAX_FRESH_RETRIES + 1);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took <= Duration::from_secs(5),
        "{took:?}"
    );
}
