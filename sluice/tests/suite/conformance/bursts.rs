//! A vendor's burst shape, learned from its reports and shared through the store, the same
//! on every store.

use std::time::Duration;

use sluice::{Bucket, RefillRate, Tokens, admin::Tighten, bucket::Report};

use super::{Env, acquire_n, retry_in};

fn report(env: &Env, remaining: i64, full_in_ms: u64) -> Tighten {
    Tighten::Reported(Report {
        remaining: Tokens::new(remaining),
        full_in: Duration::from_millis(full_in_ms),
        counted_after: env.sluice.now(),
    })
}

pub async fn a_burst_learned_by_one_client_bounds_every_client_after_a_silence(env: Env) {
    // 600 a minute, as the vendor's documentation says; the vendor takes 10 at once.
    let dim = env.dim("rpm");
    env.sluice
        .put_bucket(&dim, Bucket::requests(RefillRate::per_minute(600)))
        .await
        .unwrap();
    assert!(
        env.sluice
            .tighten(&dim, report(&env, 9, 100))
            .await
            .unwrap()
    );
    // The same report again changes nothing.
    assert!(
        !env.sluice
            .tighten(&dim, report(&env, 9, 100))
            .await
            .unwrap()
    );
    // A minute of silence: another client, which never saw a vendor answer, gets the
    // vendor's 10, not the bucket's 600, and then the exact wait for the next one.
    env.advance_ms(60_000);
    let other = env.client("other");
    let burst = acquire_n(&other, &dim, 10).await;
    assert_eq!(
        retry_in(other.acquire(dim.as_str()).await),
        Duration::from_millis(100)
    );
    for lease in burst {
        lease.release().await.unwrap();
    }
    let snapshot = other.snapshot(&dim).await.unwrap();
    assert_eq!(snapshot.burst, Some(Tokens::new(10)));
    // Putting the same limit again keeps what the vendor showed.
    env.sluice
        .put_bucket(&dim, Bucket::requests(RefillRate::per_minute(600)))
        .await
        .unwrap();
    assert_eq!(
        env.sluice.bucket(&dim).await.unwrap().unwrap().burst,
        Some(Tokens::new(10))
    );
    // A vendor that shows its whole minute again lifts the bound back to the capacity,
    // without adding a token.
    env.advance_ms(60_000);
    assert!(
        env.sluice
            .tighten(&dim, report(&env, 600, 0))
            .await
            .unwrap()
    );
    let row = env.sluice.bucket(&dim).await.unwrap().unwrap();
    assert_eq!(row.burst, None);
    assert_eq!(env.available("rpm").await, Tokens::new(10));
    env.advance_ms(60_000);
    assert_eq!(env.available("rpm").await, Tokens::new(600));
    // A new limit (a tier upgrade) is learned afresh: the burst goes with the old one.
    assert!(
        env.sluice
            .tighten(&dim, report(&env, 9, 100))
            .await
            .unwrap()
    );
    env.sluice
        .put_bucket(&dim, Bucket::requests(RefillRate::per_minute(1_200)))
        .await
        .unwrap();
    assert_eq!(env.sluice.bucket(&dim).await.unwrap().unwrap().burst, None);
}
