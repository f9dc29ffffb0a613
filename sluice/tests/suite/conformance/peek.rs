//! Peek: what an acquire would get now, taking nothing.

use std::time::Duration;

use sluice::{Acquire, Bucket, Error, Priority, RefillRate, Tokens, admin::Peek};

use super::{Env, retry_in};

/// What the dimension's bucket holds now, as an operator reads it.
async fn available(env: &Env, dimension: &str) -> Tokens {
    env.sluice.snapshot(dimension).await.unwrap().available
}

/// A peek answers what the acquire would get: granted, or the exact RetryIn the acquire
/// then hears; and it takes nothing, however often it is asked.
pub async fn peek_answers_what_an_acquire_would_get_and_takes_nothing(env: Env) {
    let d = env
        .define(
            "tpm",
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000),
        )
        .await;
    for _ in 0..5 {
        assert_eq!(
            env.sluice
                .peek(Acquire::with_cost(&d, 1_000))
                .await
                .unwrap(),
            Peek::Granted
        );
    }
    assert_eq!(
        available(&env, &d).await,
        Tokens::new(1_000),
        "nothing taken"
    );
    let _held = env
        .sluice
        .acquire(Acquire::with_cost(&d, 950))
        .await
        .unwrap();
    // 250 need 200 more tokens: two seconds of refill, to the millisecond.
    let peeked = env.sluice.peek(Acquire::with_cost(&d, 250)).await.unwrap();
    assert_eq!(peeked, Peek::RetryIn(Duration::from_secs(2)));
    let refused = retry_in(env.sluice.acquire(Acquire::with_cost(&d, 250)).await);
    assert_eq!(peeked.retry_in(), Some(refused));
    assert_eq!(available(&env, &d).await, Tokens::new(50));
    // At the RetryIn it would be granted, and the acquire is.
    env.advance_ms(2_000);
    assert!(
        env.sluice
            .peek(Acquire::with_cost(&d, 250))
            .await
            .unwrap()
            .is_granted()
    );
    drop(
        env.sluice
            .acquire(Acquire::with_cost(&d, 250))
            .await
            .unwrap(),
    );
    // A cost no acquire could ever take is the acquire's own error.
    let e = env
        .sluice
        .peek(Acquire::with_cost(&d, 1_001))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::CostExceedsCapacity { .. }), "{e}");
    let missing = env.dim("nothing");
    let e = env.sluice.peek(missing.as_str()).await.unwrap_err();
    assert!(matches!(e, Error::UnknownDimension { .. }), "{e}");
}

/// A peek at a priority leaves the reserves above it, as the acquire would: the same
/// tokens are granted to a high priority and refused to a low one, with each one's wait.
pub async fn peek_respects_priorities_and_their_reserves(env: Env) {
    let d = env.dim("rpm");
    let high = Priority::new("interactive").unwrap();
    let low = Priority::new("batch").unwrap();
    env.sluice
        .put_bucket(
            &d,
            Bucket::requests(RefillRate::per_second(10))
                .with_capacity(100)
                .with_reserve(high.clone(), 40),
        )
        .await
        .unwrap();
    let _held = env
        .sluice
        .acquire(Acquire::with_cost(&d, 70).priority(high.clone()))
        .await
        .unwrap();
    // 30 left: all of them the high priority's to take; the low one must leave 40.
    let asked = |p: &Priority| Acquire::with_cost(&d, 10).priority(p.clone());
    assert_eq!(env.sluice.peek(asked(&high)).await.unwrap(), Peek::Granted);
    let low_peek = env.sluice.peek(asked(&low)).await.unwrap();
    // 10 above a floor of 40 need 50: 20 more tokens, two seconds.
    assert_eq!(low_peek, Peek::RetryIn(Duration::from_secs(2)));
    assert_eq!(
        low_peek.retry_in(),
        Some(retry_in(env.sluice.acquire(asked(&low)).await))
    );
    // Beyond the low priority's share (100 - 40) ever: its own error.
    let e = env
        .sluice
        .peek(Acquire::with_cost(&d, 61).priority(low))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::CostExceedsShare { .. }), "{e}");
}

/// Two clients: a peek never answers "granted" from what its client remembers (another
/// client may have taken it since), and its refusal follows the denial window the store
/// confirmed; once the window ends, it looks again.
pub async fn a_peek_sees_what_another_client_took_since(env: Env) {
    let d = env
        .define(
            "rpm",
            Bucket::requests(RefillRate::per_second(1)).with_capacity(10),
        )
        .await;
    let watcher = env.client("watcher");
    let taker = env.client("taker");
    assert!(watcher.peek(d.as_str()).await.unwrap().is_granted());
    // The watcher remembers a full bucket; the taker empties it.
    let _taken = taker.acquire(Acquire::with_cost(&d, 10)).await.unwrap();
    assert_eq!(
        watcher.peek(d.as_str()).await.unwrap(),
        Peek::RetryIn(Duration::from_secs(1)),
        "a remembered full bucket is not the bucket"
    );
    // The watcher's own refusal opens a denial window: peeks inside it agree with it,
    // counted down, with no read.
    let refused = retry_in(watcher.acquire(d.as_str()).await);
    env.advance_ms(400);
    assert_eq!(
        watcher.peek(d.as_str()).await.unwrap(),
        Peek::RetryIn(refused - Duration::from_millis(400))
    );
    // Past the window the bucket refilled one: granted, from a read.
    env.advance_ms(600);
    assert!(watcher.peek(d.as_str()).await.unwrap().is_granted());
}

/// A peek on a bucket spread over several rows answers for the whole bucket: a cost
/// beyond one row's share is granted when the rows together hold it, and the whole's
/// RetryIn is the acquire's.
pub async fn a_peek_on_a_spread_bucket_answers_for_the_whole(env: Env) {
    let d = env
        .define(
            "tpm",
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000),
        )
        .await;
    env.sluice.reshard(&d, 4).await.unwrap();
    if env.protocol() == sluice::config::Protocol::Seed {
        // The seed's protocol sees the dimension's own row, a bucket of its share (250):
        // its peek answers as its acquire does.
        for client in [&env.sluice, &env.client("seed")] {
            let e = client.peek(Acquire::with_cost(&d, 300)).await.unwrap_err();
            assert!(matches!(e, Error::CostExceedsCapacity { .. }), "{e}");
            let e = client
                .acquire(Acquire::with_cost(&d, 300))
                .await
                .unwrap_err();
            assert!(matches!(e, Error::CostExceedsCapacity { .. }), "{e}");
        }
    }
    let fast = env.fast_client("fast");
    assert!(
        fast.peek(Acquire::with_cost(&d, 900))
            .await
            .unwrap()
            .is_granted()
    );
    let _held = fast.acquire(Acquire::with_cost(&d, 900)).await.unwrap();
    let peeked = fast.peek(Acquire::with_cost(&d, 300)).await.unwrap();
    assert_eq!(peeked, Peek::RetryIn(Duration::from_secs(2)));
    assert_eq!(
        peeked.retry_in(),
        Some(retry_in(fast.acquire(Acquire::with_cost(&d, 300)).await))
    );
}
