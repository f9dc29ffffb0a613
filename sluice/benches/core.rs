//! Benchmarks of the core: the pure bucket arithmetic and an acquire on the in-memory store.
//!
//! ```text
//! cargo bench -p sluice-limiter --bench core
//! ```
#![allow(missing_docs)]

use std::time::Duration;

use divan::{Bencher, black_box};
use sluice::{
    Acquire, Bucket, Dimension, MemoryStore, RefillRate, Sluice, Tokens, bucket::BucketState,
    clock::ManualClock, clock::UnixMillis, store::refill,
};

fn main() {
    divan::main();
}

fn state() -> BucketState {
    let mut state = BucketState::full(
        Dimension::new("openai#rpm").unwrap(),
        Bucket::requests(RefillRate::per_minute(500)),
        UnixMillis::from_secs(1_700_000_000),
    );
    state.tokens = Tokens::new(250);
    state.version = 7;
    state.set_write_id(Some(42));
    state
}

#[divan::bench]
fn bucket_refill(bencher: Bencher<'_, '_>) {
    let s = state();
    let now = s
        .last_refill_at
        .saturating_add(Duration::from_millis(1_234));
    bencher.bench(|| {
        refill(
            black_box(s.level()),
            s.bucket.capacity(),
            s.bucket.refill_rate(),
            black_box(now),
        )
    });
}

#[divan::bench]
fn bucket_take_granted(bencher: Bencher<'_, '_>) {
    let s = state();
    let now = s
        .last_refill_at
        .saturating_add(Duration::from_millis(1_234));
    bencher.bench(|| black_box(&s).take(black_box(Tokens::new(1)), black_box(now)));
}

#[divan::bench]
fn bucket_take_retry_in(bencher: Bencher<'_, '_>) {
    let mut s = state();
    s.tokens = Tokens::new(-3);
    let now = s.last_refill_at.saturating_add(Duration::from_millis(10));
    bencher.bench(|| black_box(&s).take(black_box(Tokens::new(1)), black_box(now)));
}

#[divan::bench]
fn decimal_parse_and_format(bencher: Bencher<'_, '_>) {
    bencher.bench(|| {
        let t: Tokens = black_box("1709550002.125").parse().unwrap();
        black_box(t.to_string())
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

fn client(rt: &tokio::runtime::Runtime) -> (Sluice, ManualClock) {
    let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
    let sluice = Sluice::builder()
        .store(MemoryStore::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    rt.block_on(async {
        sluice
            .put_bucket(
                "openai#rpm",
                Bucket::requests(RefillRate::per_second(1_000_000_000)),
            )
            .await
            .unwrap();
        sluice
            .put_bucket(
                "openai#tpm",
                Bucket::tokens(RefillRate::per_second(1_000_000_000)),
            )
            .await
            .unwrap();
        sluice
            .put_bucket("elevenlabs#concurrent", Bucket::concurrent(10))
            .await
            .unwrap();
    });
    (sluice, clock)
}

#[divan::bench]
fn memory_acquire_release(bencher: Bencher<'_, '_>) {
    let rt = runtime();
    let (sluice, clock) = client(&rt);
    bencher.bench_local(|| {
        clock.advance(Duration::from_millis(1));
        rt.block_on(async {
            sluice
                .acquire("openai#rpm")
                .await
                .unwrap()
                .release()
                .await
                .unwrap()
        })
    });
}

#[divan::bench]
fn memory_acquire_two_dimensions_release(bencher: Bencher<'_, '_>) {
    let rt = runtime();
    let (sluice, clock) = client(&rt);
    bencher.bench_local(|| {
        clock.advance(Duration::from_millis(1));
        rt.block_on(async {
            sluice
                .acquire(Acquire::new("openai#rpm").and_cost("openai#tpm", 1_500))
                .await
                .unwrap()
                .release()
                .await
                .unwrap()
        })
    });
}

#[divan::bench]
fn memory_slot_concurrent(bencher: Bencher<'_, '_>) {
    let rt = runtime();
    let (sluice, _clock) = client(&rt);
    bencher.bench_local(|| {
        rt.block_on(async {
            sluice
                .slot("elevenlabs#concurrent", Duration::from_secs(30), async {
                    1
                })
                .await
                .unwrap()
        })
    });
}

#[divan::bench]
fn memory_retry_in(bencher: Bencher<'_, '_>) {
    let rt = runtime();
    let (sluice, _clock) = client(&rt);
    rt.block_on(async {
        sluice
            .put_bucket(
                "slow#rpm",
                Bucket::requests(RefillRate::per_minute(1)).with_capacity(1),
            )
            .await
            .unwrap();
        std::mem::forget(sluice.acquire("slow#rpm").await.unwrap());
    });
    bencher.bench_local(|| rt.block_on(async { sluice.acquire("slow#rpm").await.unwrap_err() }));
}
