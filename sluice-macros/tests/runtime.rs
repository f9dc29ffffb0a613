//! What `#[rate_limited]` does at run time, on the in-memory store with tokio's paused
//! clock driving both sleeps and bucket refill.

use std::time::Duration;

use sluice::{
    Bucket, RefillRate, Sluice, Tokens, clock::TokioClock, clock::UnixMillis, rate_limited,
};

#[derive(Debug)]
enum AppError {
    RateLimited(Duration),
    Sluice(sluice::Error),
    Vendor,
}

impl From<sluice::Error> for AppError {
    fn from(e: sluice::Error) -> Self {
        match e.retry_in() {
            Some(d) => AppError::RateLimited(d),
            None => AppError::Sluice(e),
        }
    }
}

async fn client() -> Sluice {
    let sluice = Sluice::builder()
        .store(sluice::MemoryStore::new())
        .clock(TokioClock::starting_at(UnixMillis::from_secs(
            1_700_000_000,
        )))
        .build()
        .unwrap();
    sluice
        .put_bucket(
            "test#rpm",
            Bucket::requests(RefillRate::per_second(2)).with_capacity(3),
        )
        .await
        .unwrap();
    sluice
        .put_bucket(
            "test#tpm",
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000),
        )
        .await
        .unwrap();
    sluice
        .put_bucket("test#concurrent", Bucket::concurrent(1))
        .await
        .unwrap();
    sluice
}

async fn available(sluice: &Sluice, dimension: &str) -> Tokens {
    sluice.snapshot(dimension).await.unwrap().available
}

#[rate_limited("test#rpm", client = sluice, timeout = 5)]
async fn one_request(sluice: &Sluice, n: u32) -> Result<u32, AppError> {
    Ok(n * 2)
}

#[tokio::test(start_paused = true)]
async fn each_call_takes_a_token_and_returns_the_body_s_value() {
    let sluice = client().await;
    assert_eq!(one_request(&sluice, 21).await.unwrap(), 42);
    assert_eq!(available(&sluice, "test#rpm").await, Tokens::new(2));
    one_request(&sluice, 1).await.unwrap();
    assert_eq!(available(&sluice, "test#rpm").await, Tokens::new(1));
    assert!(
        sluice.leases(&Default::default()).await.unwrap().is_empty(),
        "released"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_in_reaches_the_caller_s_error_with_the_exact_delay() {
    let sluice = client().await;
    for _ in 0..3 {
        one_request(&sluice, 1).await.unwrap();
    }
    tokio::time::advance(Duration::from_millis(100)).await;
    match one_request(&sluice, 1).await {
        Err(AppError::RateLimited(d)) => assert_eq!(d, Duration::from_millis(400)),
        other => panic!("expected RateLimited, got {other:?}"),
    }
}

#[rate_limited("test#rpm", client = sluice, wait = Duration::from_millis(600))]
async fn waits_up_to_600ms(sluice: &Sluice) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn wait_retries_inline_and_gives_up_at_its_bound() {
    let sluice = client().await;
    for _ in 0..3 {
        one_request(&sluice, 1).await.unwrap();
    }
    // Empty: the next token is 500 ms away, within the 600 ms bound.
    let started = tokio::time::Instant::now();
    waits_up_to_600ms(&sluice).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(500));
    // Empty again, the next token 500 ms away: the call takes its turn for it at once (a
    // reservation, in the write that would have refused it). At 250 ms another caller
    // corrects its lease upward by one token: the bucket goes a token further into debt,
    // but a turn already taken stands, and the call returns at 500 ms; the debt delays
    // whoever asks next.
    let mut held = sluice.acquire("test#rpm").await;
    assert!(held.is_err(), "the bucket is empty");
    tokio::time::advance(Duration::from_millis(500)).await;
    held = sluice.acquire("test#rpm").await;
    let mut held = held.unwrap();
    let rival = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(250)).await;
        held.adjust("test#rpm", 2).await.unwrap();
        held.release().await.unwrap();
    });
    let started = tokio::time::Instant::now();
    waits_up_to_600ms(&sluice).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(500));
    rival.await.unwrap();
    // The rival's extra token is owed: the next is 1,000 ms away, and a 600 ms bound
    // gives up at once with that RetryIn.
    let started = tokio::time::Instant::now();
    match waits_up_to_600ms(&sluice).await {
        Err(AppError::RateLimited(d)) => assert_eq!(d, Duration::from_millis(1_000)),
        other => panic!("expected RateLimited at once, got {other:?}"),
    }
    assert_eq!(started.elapsed(), Duration::ZERO);
    // So does a 400 ms one.
    assert!(matches!(
        waits_up_to_400ms(&sluice).await,
        Err(AppError::RateLimited(_))
    ));
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[rate_limited("test#rpm", client = sluice, wait = Duration::from_millis(400))]
async fn waits_up_to_400ms(sluice: &Sluice) -> Result<(), AppError> {
    Ok(())
}

#[rate_limited("test#concurrent", client = sluice, timeout = 2)]
async fn body(sluice: &Sluice, behaviour: &str) -> Result<&'static str, AppError> {
    match behaviour {
        "ok" => Ok("done"),
        "err" => Err(AppError::Vendor),
        "panic" => panic!("vendor client panicked"),
        _ => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok("too late")
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_slot_is_released_on_ok_err_panic_and_timeout() {
    let sluice = client().await;
    assert_eq!(body(&sluice, "ok").await.unwrap(), "done");
    assert_eq!(available(&sluice, "test#concurrent").await, Tokens::new(1));

    assert!(matches!(body(&sluice, "err").await, Err(AppError::Vendor)));
    assert_eq!(available(&sluice, "test#concurrent").await, Tokens::new(1));

    let s = sluice.clone();
    let panicked = tokio::spawn(async move { body(&s, "panic").await }).await;
    assert!(panicked.unwrap_err().is_panic());
    assert_eq!(available(&sluice, "test#concurrent").await, Tokens::new(1));

    let started = tokio::time::Instant::now();
    match body(&sluice, "hang").await {
        Err(AppError::Sluice(sluice::Error::Timeout(d))) => assert_eq!(d, Duration::from_secs(2)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(available(&sluice, "test#concurrent").await, Tokens::new(1));
    assert!(sluice.leases(&Default::default()).await.unwrap().is_empty());
}

#[rate_limited("test#rpm", "test#tpm" = prompt.len() / 4 + max_tokens, client = sluice)]
async fn chat(sluice: &Sluice, prompt: &str, max_tokens: usize) -> Result<usize, AppError> {
    Ok(prompt.len())
}

#[tokio::test(start_paused = true)]
async fn per_dimension_costs_computed_from_arguments_are_charged() {
    let sluice = client().await;
    chat(&sluice, &"x".repeat(400), 150).await.unwrap();
    assert_eq!(available(&sluice, "test#rpm").await, Tokens::new(2));
    assert_eq!(
        available(&sluice, "test#tpm").await,
        Tokens::new(1_000 - 100 - 150)
    );
    // All or nothing: too many tokens leaves the request count untouched too.
    match chat(&sluice, &"x".repeat(4_004), 0).await {
        Err(AppError::Sluice(sluice::Error::CostExceedsCapacity { .. })) => {}
        other => panic!("expected CostExceedsCapacity, got {other:?}"),
    }
    assert_eq!(available(&sluice, "test#rpm").await, Tokens::new(2));
}

/// An error that keeps the whole `sluice::Error`, refusal included.
#[derive(Debug)]
struct Refused(sluice::Error);

impl From<sluice::Error> for Refused {
    fn from(e: sluice::Error) -> Self {
        Refused(e)
    }
}

#[rate_limited("test#rpm", "test#tpm" = max_tokens, client = sluice)]
async fn budgeted(sluice: &Sluice, max_tokens: usize) -> Result<(), Refused> {
    Ok(())
}

/// The caller's error says which dimension was short and when each serves, so a job short
/// of tokens is requeued by tokens and one short of requests by requests.
#[tokio::test(start_paused = true)]
async fn a_refusal_names_the_dimension_that_was_short_and_its_wait() {
    let sluice = client().await;
    budgeted(&sluice, 900).await.unwrap();
    // 100 tokens left, refilling 100 a second: 300 more wait 2 s; requests are there.
    let before = sluice.now();
    let Err(Refused(e)) = budgeted(&sluice, 300).await else {
        panic!("expected a refusal");
    };
    let after = sluice.now();
    let refusal = e.refusal().expect("a RetryIn");
    let short: Vec<&str> = refusal.short.iter().map(|s| s.dimension.as_str()).collect();
    assert_eq!(short, ["test#tpm"]);
    assert_eq!(refusal.delay, Duration::from_secs(2));
    assert_eq!(refusal.delay_of("test#tpm"), Some(Duration::from_secs(2)));
    assert_eq!(refusal.delay_of("test#rpm"), None);
    let wait = Duration::from_secs(2);
    assert!(
        before.saturating_add(wait) <= refusal.at && refusal.at <= after.saturating_add(wait),
        "{refusal:?}"
    );
    assert_eq!(sluice::Error::find_refusal(&e), Some(refusal));
    // Now the requests: two of three were taken, the third goes; the fourth waits for
    // the refill of one (2 a second).
    budgeted(&sluice, 0).await.unwrap();
    budgeted(&sluice, 0).await.unwrap();
    let Err(Refused(e)) = budgeted(&sluice, 0).await else {
        panic!("expected a refusal");
    };
    let refusal = e.refusal().expect("a RetryIn");
    let short: Vec<&str> = refusal.short.iter().map(|s| s.dimension.as_str()).collect();
    assert_eq!(short, ["test#rpm"]);
    assert_eq!(refusal.delay, Duration::from_millis(500));
}

#[rate_limited("test#reserved", client = sluice, priority = "batch")]
async fn batch_call(sluice: &Sluice) -> Result<(), AppError> {
    Ok(())
}

#[rate_limited("test#reserved", client = sluice, priority = tier)]
async fn call_as(sluice: &Sluice, tier: Option<sluice::Priority>) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn the_priority_argument_keeps_the_reserves_above_it() {
    let sluice = client().await;
    let reserved = Bucket::requests(RefillRate::per_second(1))
        .with_capacity(3)
        .with_reserve("interactive".parse().unwrap(), 2);
    sluice.put_bucket("test#reserved", reserved).await.unwrap();
    batch_call(&sluice).await.unwrap();
    // Two left, both kept for `interactive`: `batch` waits a whole refill.
    match batch_call(&sluice).await {
        Err(AppError::RateLimited(d)) => assert_eq!(d, Duration::from_secs(1)),
        other => panic!("expected RetryIn, got {other:?}"),
    }
    let interactive = Some("interactive".parse().unwrap());
    call_as(&sluice, interactive.clone()).await.unwrap();
    call_as(&sluice, interactive).await.unwrap();
    assert_eq!(available(&sluice, "test#reserved").await, Tokens::ZERO);
    // No priority is the highest: nothing is kept from it (the bucket is empty now).
    assert!(matches!(
        call_as(&sluice, None).await,
        Err(AppError::RateLimited(_))
    ));
}

#[derive(Debug)]
struct Client {
    sluice: Sluice,
}

impl Client {
    #[rate_limited("test#rpm", client = self.sluice)]
    async fn call(&self) -> Result<(), AppError> {
        Ok(())
    }
}

#[async_trait::async_trait]
trait Speak {
    async fn speak(&self, text: &str) -> Result<usize, AppError>;
}

#[async_trait::async_trait]
impl Speak for Client {
    #[rate_limited("test#concurrent", client = self.sluice, timeout = 1)]
    async fn speak(&self, text: &str) -> Result<usize, AppError> {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok(text.len())
    }
}

#[tokio::test(start_paused = true)]
async fn methods_and_async_trait_methods_run_in_slots() {
    let c = Client {
        sluice: client().await,
    };
    c.call().await.unwrap();
    assert_eq!(available(&c.sluice, "test#rpm").await, Tokens::new(2));
    // The async-trait body is wrapped too: its timeout applies and the slot comes back.
    assert!(matches!(
        c.speak("hi").await,
        Err(AppError::Sluice(sluice::Error::Timeout(_)))
    ));
    assert_eq!(
        available(&c.sluice, "test#concurrent").await,
        Tokens::new(1)
    );
}

#[rate_limited("test#rpm")]
async fn on_the_global_client() -> Result<(), AppError> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn without_a_client_the_process_wide_default_is_used() {
    let sluice = client().await;
    Sluice::set_global(sluice.clone());
    on_the_global_client().await.unwrap();
    assert_eq!(available(&sluice, "test#rpm").await, Tokens::new(2));
}

#[rate_limited("test#concurrent", client = sluice, timeout = 5)]
async fn one_slot(sluice: &Sluice) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_requeues_on_retry_in_gets_the_slot_another_client_freed() {
    let store = std::sync::Arc::new(sluice::MemoryStore::new());
    let on_store = || {
        Sluice::builder()
            .store_arc(store.clone())
            .clock(TokioClock::starting_at(UnixMillis::from_secs(
                1_700_000_000,
            )))
            .build()
            .unwrap()
    };
    let holder = on_store();
    holder
        .put_bucket("test#concurrent", Bucket::concurrent(1))
        .await
        .unwrap();
    let caller = on_store();
    for released_after in [Duration::ZERO, sluice::config::DEFAULT_SLOT_POLL / 2] {
        let held = holder.acquire("test#concurrent").await.unwrap();
        let Err(AppError::RateLimited(wait)) = one_slot(&caller).await else {
            panic!("the slot is held elsewhere");
        };
        assert!(wait <= sluice::config::DEFAULT_SLOT_POLL, "{wait:?}");
        tokio::time::sleep(released_after).await;
        held.release().await.unwrap();
        // The caller requeues for the RetryIn, and the slot is there when it asks again.
        tokio::time::sleep(wait - released_after).await;
        one_slot(&caller).await.unwrap();
    }
}

#[rate_limited("test#shadow", client = sluice, wait = Duration::from_secs(10))]
async fn shadowed(sluice: &Sluice) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_bucket_in_shadow_mode_never_refuses_or_delays_an_attributed_call() {
    let sluice = client().await;
    let trial = Bucket::requests(RefillRate::per_second(2))
        .with_capacity(3)
        .with_mode(sluice::Mode::Shadow);
    sluice.put_bucket("test#shadow", trial).await.unwrap();
    let started = tokio::time::Instant::now();
    for _ in 0..10 {
        shadowed(&sluice).await.unwrap();
    }
    assert_eq!(started.elapsed(), Duration::ZERO, "no call waited");
    assert_eq!(available(&sluice, "test#shadow").await, Tokens::new(-7));
    assert_eq!(
        sluice.snapshot("test#shadow").await.unwrap().shadow_refused,
        7
    );
}

#[rate_limited("test#tenant#@", "test#tpm" = 10, client = sluice, key = tenant)]
async fn for_tenant(sluice: &Sluice, tenant: &str) -> Result<usize, AppError> {
    Ok(tenant.len())
}

#[tokio::test(start_paused = true)]
async fn a_key_from_an_argument_gives_each_tenant_its_own_bucket() {
    let sluice = client().await;
    let per_tenant = Bucket::requests(RefillRate::per_second(1)).with_capacity(2);
    sluice
        .put_bucket("test#tenant", per_tenant.keyed())
        .await
        .unwrap();
    for _ in 0..2 {
        assert_eq!(for_tenant(&sluice, "acme").await.unwrap(), 4);
    }
    match for_tenant(&sluice, "acme").await {
        Err(AppError::RateLimited(d)) => assert_eq!(d, Duration::from_secs(1)),
        other => panic!("expected RateLimited, got {other:?}"),
    }
    // Another tenant has its own; the shared dimension was taken by every grant.
    assert_eq!(for_tenant(&sluice, "globex").await.unwrap(), 6);
    assert_eq!(available(&sluice, "test#tenant#@acme").await, Tokens::ZERO);
    assert_eq!(
        available(&sluice, "test#tpm").await,
        Tokens::new(1_000 - 30)
    );
    // A key that cannot be part of a dimension is a typed error, and takes nothing.
    match for_tenant(&sluice, "no#such").await {
        Err(AppError::Sluice(sluice::Error::InvalidDimension { .. })) => {}
        other => panic!("expected InvalidDimension, got {other:?}"),
    }
    assert_eq!(
        available(&sluice, "test#tpm").await,
        Tokens::new(1_000 - 30)
    );
}
