//! Reset and top-up by hand: conditional, refused on a bucket changed since it was read,
//! consistent with the leases.

use sluice::{Acquire, Bucket, Error, RefillRate, Tokens, admin::Audit, admin::Restock};

use super::Env;

fn audit(if_version: Option<u64>) -> Audit {
    Audit {
        who: "oncall".to_owned(),
        why: "conformance".to_owned(),
        if_version,
    }
}

/// A top-up decided from one version of the bucket is refused once another client has
/// changed it, and writes nothing; decided from the stored version, or from none, it
/// applies; a reset fills the bucket.
pub async fn reset_and_top_up_refuse_a_bucket_changed_since_it_was_read(env: Env) {
    let d = env
        .define(
            "tpm",
            Bucket::tokens(RefillRate::per_day(1)).with_capacity(1_000),
        )
        .await;
    let other = env.client("other");
    drop(other.acquire(Acquire::with_cost(&d, 600)).await.unwrap());
    let read = env.sluice.bucket(&d).await.unwrap().unwrap().version;
    // Meanwhile another client takes more.
    drop(other.acquire(Acquire::with_cost(&d, 100)).await.unwrap());
    let stored = env.sluice.bucket(&d).await.unwrap().unwrap().version;
    let e = env
        .sluice
        .restock(&d, Restock::TopUp(Tokens::new(300)), &audit(Some(read)))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::BucketChanged { read: r, stored: s, .. } if r == read && s == stored),
        "{e}"
    );
    assert_eq!(
        env.available("tpm").await,
        Tokens::new(300),
        "nothing written"
    );
    let done = env
        .sluice
        .restock(&d, Restock::TopUp(Tokens::new(300)), &audit(Some(stored)))
        .await
        .unwrap();
    assert_eq!(
        (done.before, done.after),
        (Tokens::new(300), Tokens::new(600))
    );
    assert_eq!(env.available("tpm").await, Tokens::new(600));
    // The version it wrote is the stored one; a top-up past the capacity stops there.
    assert_eq!(
        env.sluice.bucket(&d).await.unwrap().unwrap().version,
        done.version
    );
    let capped = env
        .sluice
        .restock(&d, Restock::TopUp(Tokens::new(5_000)), &audit(None))
        .await
        .unwrap();
    assert_eq!(capped.after, Tokens::new(1_000));
    drop(other.acquire(Acquire::with_cost(&d, 999)).await.unwrap());
    let reset = env
        .sluice
        .restock(&d, Restock::Reset, &audit(None))
        .await
        .unwrap();
    assert_eq!(
        (reset.before, reset.after),
        (Tokens::new(1), Tokens::new(1_000))
    );
    // Every client sees it: the whole capacity is granted at once.
    drop(other.acquire(Acquire::with_cost(&d, 1_000)).await.unwrap());
}

/// A reset of a `concurrent` bucket sets it from its lease rows: a slot lost with its
/// lease row comes back, a held one is not given twice (its release lands on a bucket that
/// still counts it), and the reconciler then finds nothing to heal.
pub async fn a_reset_keeps_a_concurrent_bucket_consistent_with_its_leases(env: Env) {
    let d = env.define("concurrent", Bucket::concurrent(5)).await;
    // A slot lost: taken, and its lease row deleted by hand.
    let lost = env.sluice.acquire(d.as_str()).await.unwrap();
    assert_eq!(super::sweep(&env, "concurrent").await, 1);
    std::mem::forget(lost);
    let held: Vec<_> = {
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(env.sluice.acquire(d.as_str()).await.unwrap());
        }
        held
    };
    assert_eq!(env.available("concurrent").await, Tokens::new(2));
    let done = env
        .sluice
        .restock(&d, Restock::Reset, &audit(None))
        .await
        .unwrap();
    assert_eq!((done.before, done.after), (Tokens::new(2), Tokens::new(3)));
    // A top-up cannot give what the held slots hold.
    let up = env
        .sluice
        .restock(&d, Restock::TopUp(Tokens::new(4)), &audit(None))
        .await
        .unwrap();
    assert_eq!(up.after, Tokens::new(3));
    for lease in held {
        lease.release().await.unwrap();
    }
    assert_eq!(env.available("concurrent").await, Tokens::new(5));
    assert!(env.sluice.reconcile().await.unwrap().is_noop());
}

/// On a bucket spread over several rows, a top-up and a reset cover the whole bucket.
pub async fn a_reset_and_a_top_up_cover_every_row_of_a_spread_bucket(env: Env) {
    let d = env
        .define(
            "rpm",
            Bucket::requests(RefillRate::per_day(4)).with_capacity(1_000),
        )
        .await;
    env.sluice.reshard(&d, 4).await.unwrap();
    let fast = env.fast_client("fast");
    drop(fast.acquire(Acquire::with_cost(&d, 1_000)).await.unwrap());
    let up = env
        .sluice
        .restock(&d, Restock::TopUp(Tokens::new(500)), &audit(None))
        .await
        .unwrap();
    assert_eq!((up.before, up.after), (Tokens::ZERO, Tokens::new(500)));
    assert_eq!(fast.snapshot(&d).await.unwrap().available, Tokens::new(500));
    // Shard 0's version is the bucket's: a decision from before the top-up is refused.
    let stale = env
        .sluice
        .restock(&d, Restock::Reset, &audit(Some(up.version - 1)))
        .await;
    assert!(
        matches!(stale, Err(Error::BucketChanged { .. })),
        "{stale:?}"
    );
    env.sluice
        .restock(&d, Restock::Reset, &audit(Some(up.version)))
        .await
        .unwrap();
    drop(fast.acquire(Acquire::with_cost(&d, 1_000)).await.unwrap());
}
