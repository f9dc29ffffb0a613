use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::*;
use crate::bucket::{Bucket, Report};
use crate::clock::ManualClock;
use crate::rate::RefillRate;
use crate::shared::test_store::{Hooked, Hooks, client};
use crate::store::{Commit, CommitError, ConditionFailure};

/// Hooks under which every commit loses its race to another writer; they count the
/// commits.
#[derive(Debug, Default)]
struct Beaten {
    commits: AtomicU32,
}

impl Hooks for Beaten {
    fn commit(&self, commit: &Commit) -> Result<(), CommitError> {
        self.commits.fetch_add(1, Ordering::Relaxed);
        let dimension = commit.buckets[0].after().dimension.clone();
        Err(CommitError::Condition(ConditionFailure::BucketChanged {
            dimension,
            current: None,
        }))
    }
}

/// A client on a store where every commit loses, with a full `openai#rpm` of 10 a second.
async fn beaten() -> (Arc<Hooked<Beaten>>, crate::Sluice, ManualClock) {
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let store = Arc::new(Hooked::new(Beaten::default()));
    let sluice = client(store.clone(), &clock);
    sluice
        .put_bucket(
            "openai#rpm",
            Bucket::requests(RefillRate::per_second(10)).with_capacity(10),
        )
        .await
        .unwrap();
    (store, sluice, clock)
}

#[tokio::test(start_paused = true)]
async fn a_report_that_loses_its_race_is_not_sent_again() {
    let (store, sluice, clock) = beaten().await;
    // The vendor holds 3 where the bucket holds 10: the report lowers it, and loses.
    let report = Report {
        remaining: Tokens::new(3),
        full_in: Duration::from_millis(700),
        counted_after: sluice.now(),
    };
    clock.advance(Duration::from_millis(1));
    let changed = sluice
        .tighten("openai#rpm", Tighten::Reported(report))
        .await
        .unwrap();
    assert!(!changed, "a report lost to another writer changes nothing");
    let commits = store.hooks.commits.load(Ordering::Relaxed);
    assert_eq!(commits, 1, "one write, not sent again");
}

#[tokio::test(start_paused = true)]
async fn a_vendors_pause_that_loses_its_race_is_sent_again() {
    let (store, sluice, _clock) = beaten().await;
    let answer = sluice
        .tighten("openai#rpm", Tighten::PauseFor(Duration::from_secs(7)))
        .await
        .unwrap_err();
    assert!(
        matches!(answer, Error::Contention { .. }),
        "a 429's pause is asked again until the retries run out: {answer:?}"
    );
    let commits = store.hooks.commits.load(Ordering::Relaxed);
    assert!(commits > 1, "sent again after losing: {commits} commits");
}
