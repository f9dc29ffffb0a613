//! Protocol invariants over random sequences of acquires, adjusts, releases and clock
//! steps, through the public client on the in-memory store.

use std::time::Duration;

use proptest::prelude::*;
use sluice::{
    Acquire, Bucket, Error, Lease, MemoryStore, Prefetch, RefillRate, Sluice, Tokens,
    clock::ManualClock, clock::UnixMillis,
};

#[derive(Debug, Clone)]
enum Op {
    Acquire(i64),
    Adjust { pick: usize, cost: i64 },
    Release(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1i64..=12).prop_map(Op::Acquire),
        1 => (any::<usize>(), 0i64..=20).prop_map(|(pick, cost)| Op::Adjust { pick, cost }),
        2 => any::<usize>().prop_map(Op::Release),
        3 => (0u64..1_500).prop_map(Op::Advance),
    ]
}

/// One event in the ledger: at `at`, `granted` tokens were handed out by an acquire, and
/// `refunded` came back through a downward adjustment.
#[derive(Debug, Clone, Copy)]
struct Event {
    at: i64,
    granted: Tokens,
    refunded: Tokens,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn grants_in_any_window_stay_within_capacity_plus_refill(
        capacity in 1u64..=30,
        per_second in 1u64..=20,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        runtime().block_on(async {
            let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
            let sluice = Sluice::builder().store(MemoryStore::new()).clock(clock.clone()).build().unwrap();
            let dim = "prop#tpm";
            let rate = RefillRate::per_second(per_second);
            let cap = Tokens::new(capacity as i64);
            sluice.put_bucket(dim, Bucket::tokens(rate).with_capacity(capacity)).await.unwrap();
            let mut leases: Vec<Lease> = Vec::new();
            let mut events: Vec<Event> = Vec::new();
            for op in ops {
                let now = clock.now().as_millis();
                match op {
                    Op::Acquire(cost) => match sluice.acquire(Acquire::with_cost(dim, cost)).await {
                        Ok(lease) => {
                            events.push(Event { at: now, granted: Tokens::new(cost), refunded: Tokens::ZERO });
                            leases.push(lease);
                        }
                        Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => prop_assert!(d >= Duration::from_millis(1)),
                        Err(Error::CostExceedsCapacity { .. }) => prop_assert!(cost > capacity as i64),
                        Err(e) => prop_assert!(false, "unexpected error {}", e),
                    },
                    Op::Adjust { pick, cost } if !leases.is_empty() => {
                        let i = pick % leases.len();
                        let before = leases[i].cost(dim).unwrap();
                        leases[i].adjust(dim, cost).await.unwrap();
                        let delta = Tokens::new(cost) - before;
                        if delta.is_negative() {
                            events.push(Event { at: now, granted: Tokens::ZERO, refunded: -delta });
                        }
                    }
                    Op::Release(pick) if !leases.is_empty() => {
                        let i = pick % leases.len();
                        leases.swap_remove(i).release().await.unwrap();
                    }
                    Op::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                    _ => {}
                }
                let row = sluice.bucket(dim).await.unwrap().unwrap();
                prop_assert!(row.tokens <= cap, "tokens {} above capacity {}", row.tokens, cap);
                prop_assert!(row.available(clock.now()) <= cap);
            }
            // Every window [a, b] of events: grants <= capacity + refill over (b - a) + refunds.
            for (i, first) in events.iter().enumerate() {
                let mut granted = Tokens::ZERO;
                let mut refunded = Tokens::ZERO;
                for e in &events[i..] {
                    granted += e.granted;
                    refunded += e.refunded;
                    let window_ms = i128::from(e.at - first.at);
                    let refill = rate.refill_over(Duration::from_millis(window_ms as u64));
                    prop_assert!(
                        granted <= cap + refill + refunded,
                        "{} granted in {} ms (cap {}, refill {}, refunds {})", granted, window_ms, cap, refill, refunded
                    );
                }
            }
            for lease in leases {
                lease.release().await.unwrap();
            }
            Ok(())
        })?;
    }

    #[test]
    fn prefetching_clients_stay_within_capacity_plus_refill_over_the_window_and_the_hold(
        capacity in 1u64..=40,
        per_second in 1u64..=10,
        prefetch in 1i64..=20,
        hold_ms in 1u64..=300,
        steps in proptest::collection::vec(
            (0usize..3, 1i64..=4, prop_oneof![3 => 0u64..400, 1 => 1_000u64..4_000]),
            1..150,
        ),
    ) {
        runtime().block_on(async {
            let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
            let store = std::sync::Arc::new(MemoryStore::new());
            let dim = "prop#rpm";
            let hold = Duration::from_millis(hold_ms);
            // Three clients (three processes) sharing one bucket, each prefetching.
            let clients: Vec<Sluice> = (0..3)
                .map(|_| {
                    Sluice::builder().store_arc(store.clone())
                        .clock(clock.clone())
                        .prefetch(dim.parse().unwrap(), Prefetch::new(prefetch, hold))
                        .build()
                        .unwrap()
                })
                .collect();
            let rate = RefillRate::per_second(per_second);
            let cap = Tokens::new(capacity as i64);
            clients[0]
                .put_bucket(dim, Bucket::requests(rate).with_capacity(capacity).lean())
                .await
                .unwrap();
            let mut grants: Vec<(i64, Tokens)> = Vec::new();
            for (who, cost, advance) in steps {
                let now = clock.now().as_millis();
                match clients[who].acquire(Acquire::with_cost(dim, cost)).await {
                    Ok(lease) => {
                        grants.push((now, Tokens::new(cost)));
                        lease.release().await.unwrap();
                    }
                    Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => prop_assert!(d >= Duration::from_millis(1)),
                    Err(Error::CostExceedsCapacity { .. }) => prop_assert!(cost > capacity as i64),
                    Err(e) => prop_assert!(false, "unexpected error {}", e),
                }
                clock.advance(Duration::from_millis(advance));
            }
            // Every token granted was taken from the bucket at most `hold` earlier, so any
            // window [a, b] grants at most capacity + refill over (b - a + hold).
            for (i, (first, _)) in grants.iter().enumerate() {
                let mut granted = Tokens::ZERO;
                for (at, cost) in &grants[i..] {
                    granted += *cost;
                    let window_ms = i128::from(at - first) + i128::from(hold_ms);
                    let refill = rate.refill_over(Duration::from_millis(window_ms as u64));
                    prop_assert!(
                        granted <= cap + refill,
                        "{} granted in {} ms plus a {} ms hold (cap {}, refill {})",
                        granted, at - first, hold_ms, cap, refill
                    );
                }
            }
            Ok(())
        })?;
    }

    #[test]
    fn concurrent_slots_held_never_exceed_capacity_and_all_come_back(
        capacity in 1u64..=8,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        runtime().block_on(async {
            let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
            let sluice = Sluice::builder()
                .store(MemoryStore::new())
                .clock(clock.clone())
                .lease_ttl(Duration::from_secs(3_600))
                .build()
                .unwrap();
            let dim = "prop#concurrent";
            sluice.put_bucket(dim, Bucket::concurrent(capacity)).await.unwrap();
            let mut leases: Vec<Lease> = Vec::new();
            for op in ops {
                match op {
                    Op::Acquire(cost) => {
                        let cost = (cost % 3).max(1);
                        match sluice.acquire(Acquire::with_cost(dim, cost)).await {
                            Ok(lease) => leases.push(lease),
                            Err(Error::RetryIn(_)) | Err(Error::CostExceedsCapacity { .. }) => {}
                            Err(e) => prop_assert!(false, "unexpected error {}", e),
                        }
                    }
                    Op::Release(pick) if !leases.is_empty() => {
                        let i = pick % leases.len();
                        leases.swap_remove(i).release().await.unwrap();
                    }
                    Op::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                    _ => {}
                }
                let held: Tokens = leases.iter().map(|l| l.cost(dim).unwrap()).sum();
                let row = sluice.bucket(dim).await.unwrap().unwrap();
                prop_assert!(held <= Tokens::new(capacity as i64));
                prop_assert_eq!(row.tokens + held, Tokens::new(capacity as i64), "a slot was lost or invented");
            }
            for lease in leases {
                lease.release().await.unwrap();
            }
            let row = sluice.bucket(dim).await.unwrap().unwrap();
            prop_assert_eq!(row.tokens, Tokens::new(capacity as i64));
            Ok(())
        })?;
    }
}
