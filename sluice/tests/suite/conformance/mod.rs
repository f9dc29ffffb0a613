//! The store conformance suite: the same behaviour, checked against every [`Store`].
//!
//! A test file instantiates it with a function that returns a fresh or shared store:
//! `conformance::suite!(make_store);`. Every test works on dimensions under its own random
//! vendor name, so a suite can share one table.

#![allow(dead_code, unreachable_pub)]

mod bursts;
mod clients;
mod gate;
mod keys;
mod leases;
mod peek;
mod reserves;
mod restock;
mod schedules;
mod shadow;
mod shards;
pub use bursts::*;
pub use clients::*;
pub use gate::Gate;
pub use keys::*;
pub use leases::*;
pub use peek::*;
pub use reserves::*;
pub use restock::*;
pub use schedules::*;
pub use shadow::*;
pub use shards::*;

use std::sync::Arc;
use std::time::Duration;

use sluice::store::{LeaseFilter, Store};
use sluice::{
    Acquire, Bucket, Config, Error, LimitType, RefillRate, Sluice, Tokens, admin::Tighten,
    clock::ManualClock, clock::UnixMillis, config::Protocol,
};

/// The clock skew every client of the suite allows for: an expired slot comes back this
/// long after its expiry.
pub const SKEW: Duration = Duration::from_millis(250);
/// How long every client's reconciler lets a `concurrent` bucket that does not match its
/// leases settle before correcting it: longer than any client of the suite takes between
/// its two writes.
pub const HEAL_SETTLE: Duration = Duration::from_millis(300);
/// The slot poll interval of every client (the default).
pub const SLOT_POLL: Duration = sluice::config::DEFAULT_SLOT_POLL;

/// One test's world: a store, a manual clock, and a client on both.
pub struct Env {
    pub store: Arc<dyn Store>,
    pub clock: ManualClock,
    pub sluice: Sluice,
    protocol: Protocol,
    vendor: String,
}

impl Env {
    pub fn new(store: Arc<dyn Store>, protocol: Protocol) -> Env {
        // One day ahead of the real clock, in whole seconds: a store with a real TTL sweeper
        // (DynamoDB) must not delete the lease rows of a test clock set in the past.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let clock = ManualClock::new(UnixMillis::from_secs(now + 86_400));
        let vendor = format!("v{:016x}", rand_u64());
        let sluice = Env::client_on(&store, &clock, "conformance", protocol);
        Env {
            store,
            clock,
            sluice,
            protocol,
            vendor,
        }
    }

    /// The protocol this suite's clients run.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Another client (another "process") on the same store and clock.
    pub fn client(&self, caller: &str) -> Sluice {
        Env::client_on(&self.store, &self.clock, caller, self.protocol)
    }

    /// Another client with its configuration changed by `edit`.
    pub fn client_with(&self, caller: &str, edit: impl FnOnce(Config) -> Config) -> Sluice {
        Env::client_edited(&self.store, &self.clock, caller, self.protocol, edit)
    }

    fn client_on(
        store: &Arc<dyn Store>,
        clock: &ManualClock,
        caller: &str,
        protocol: Protocol,
    ) -> Sluice {
        Env::client_edited(store, clock, caller, protocol, |c| c)
    }

    fn client_edited(
        store: &Arc<dyn Store>,
        clock: &ManualClock,
        caller: &str,
        protocol: Protocol,
        edit: impl FnOnce(Config) -> Config,
    ) -> Sluice {
        sluice::SluiceBuilder::from_config(edit(Config {
            caller: caller.to_owned(),
            lease_ttl: Duration::from_secs(60),
            max_retries: 50,
            protocol,
            clock_skew: SKEW,
            heal_settle: HEAL_SETTLE,
            ..Config::default()
        }))
        .store_arc(store.clone())
        .clock(clock.clone())
        .build()
        .expect("client builds")
    }

    /// Defines `bucket` for this test's `metric`; the dimension.
    pub async fn define(&self, metric: &str, bucket: Bucket) -> String {
        let d = self.dim(metric);
        self.sluice.put_bucket(&d, bucket).await.unwrap();
        d
    }

    /// A client on the fast protocol whatever the suite runs (the seed's protocol sees a
    /// spread bucket's shard 0 alone, as the seed's other SDKs do).
    pub fn fast_client(&self, caller: &str) -> Sluice {
        self.client_with(caller, |c| Config {
            protocol: Protocol::Fast,
            ..c
        })
    }

    /// This test's dimension with `metric`.
    pub fn dim(&self, metric: &str) -> String {
        format!("{}#{metric}", self.vendor)
    }

    pub fn advance_ms(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
    }

    pub async fn tokens(&self, metric: &str) -> Tokens {
        self.sluice
            .bucket(&self.dim(metric))
            .await
            .unwrap()
            .unwrap()
            .tokens
    }

    pub async fn available(&self, metric: &str) -> Tokens {
        let row = self
            .sluice
            .bucket(&self.dim(metric))
            .await
            .unwrap()
            .unwrap();
        row.available(self.clock.now())
    }

    pub async fn lease_count(&self, metric: &str) -> usize {
        let d = self.dim(metric).parse().unwrap();
        self.store
            .list_leases(&LeaseFilter {
                dimension: Some(d),
                expired_before: None,
            })
            .await
            .unwrap()
            .len()
    }
}

fn rand_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.finish()
}

fn retry_in(result: Result<sluice::Lease, Error>) -> Duration {
    match result {
        Err(Error::RetryIn(sluice::RetryIn { delay: d, .. })) => d,
        Err(e) => panic!("expected RetryIn, got error {e}"),
        Ok(lease) => panic!("expected RetryIn, got a lease {lease:?}"),
    }
}

/// Generates one `#[tokio::test]` per conformance check, each on a store from `$make`
/// (`None`: the store is not available and the test skips).
macro_rules! suite {
    ($make:ident) => {
        $crate::conformance::suite!(@all $make, ::sluice::config::Protocol::Fast);
        /// The same suite on the seed design's protocol (read, then write).
        mod seed_protocol {
            $crate::conformance::suite!(@all super::$make, ::sluice::config::Protocol::Seed);
        }
    };
    (@all $make:path, $protocol:expr) => {
        $crate::conformance::suite!(@tests $make, $protocol;
            a_grant_takes_cost_per_call_and_bumps_the_version,
            an_exhausted_bucket_answers_an_exact_retry_in_and_grants_at_that_instant,
            retry_in_rounds_up_to_the_millisecond,
            multi_dimension_acquire_is_all_or_nothing,
            multi_dimension_retry_in_is_the_longest_wait,
            concurrent_slots_are_given_back_on_release_exactly_once,
            concurrent_retry_in_is_the_poll_interval_or_the_earliest_give_back_if_sooner,
            expired_concurrent_leases_are_reclaimed_when_the_bucket_is_short,
            cost_above_capacity_is_a_distinct_error,
            unknown_and_invalid_dimensions_are_typed_errors,
            adjust_into_debt_is_repaid_by_refill,
            adjust_down_refunds_and_release_restores_the_adjusted_cost,
            lease_rows_carry_dimension_cost_caller_and_expiry,
            release_by_id_from_another_client,
            snapshot_reports_what_an_operator_needs,
            redefining_a_bucket_keeps_its_tokens,
            buckets_are_listed_and_deleted,
            racing_clients_never_over_grant,
            slot_releases_on_ok_err_timeout_and_panic,
            slot_dropped_midway_releases_in_the_background,
            a_vendor_pause_empties_a_refilling_bucket_for_every_client,
            a_vendor_remaining_count_lowers_a_bucket_but_never_raises_it,
            a_vendor_pause_holds_every_concurrent_slot_until_it_ends,
            reconcile_restores_each_expired_lease_once_and_leaves_live_ones,
            reconcile_refunds_a_crashed_requests_lease_capped_at_capacity,
            reconcile_heals_a_concurrent_bucket_whose_lease_vanished,
            release_and_two_reconcilers_racing_restore_exactly_once,
            snapshots_cover_every_bucket,
            lean_buckets_grant_without_lease_rows,
            racing_clients_and_tasks_never_over_grant_a_lean_bucket,
            many_tasks_on_one_client_never_over_grant,
            a_slot_freed_by_another_client_is_seen_within_the_poll_interval,
            a_short_concurrent_bucket_with_no_live_lease_answers_the_poll_interval,
            a_raised_capacity_is_seen_by_a_warm_client,
            a_first_denial_reflects_what_other_clients_took,
            a_retry_after_its_delay_sees_tokens_another_client_gave_back,
            a_write_computed_from_a_recreated_bucket_never_succeeds,
            a_write_computed_from_a_reseeded_bucket_never_succeeds,
            a_multi_dimension_acquire_follows_rows_whose_version_went_down,
            cost_above_a_remembered_capacity_is_confirmed_by_the_store,
            redefining_a_concurrent_bucket_moves_its_free_slots_with_its_capacity,
            a_multi_dimension_acquire_on_a_bucket_deleted_elsewhere_is_unknown,
            a_grant_writes_its_lease_row_beside_the_bucket_row,
            other_clients_grants_do_not_make_a_grant_fail,
            a_fleet_s_first_grants_on_a_full_row_each_take_one_write,
            a_process_that_read_the_row_after_a_herd_s_lead_joins_it,
            fills_within_one_millisecond_count_refill_to_the_microsecond,
            slots_are_given_back_exactly_once_by_their_holders,
            a_slot_renewal_and_a_reclaim_of_its_row_never_both_win,
            counting_waiting_clients_changes_nothing_else_in_the_row,
            a_redefinition_keeps_the_live_leases,
            an_expired_slot_is_reclaimed_once_by_a_short_bucket_or_the_reconciler,
            a_pair_refused_on_one_dimension_holds_nothing_on_the_other,
            a_pair_dropped_half_way_gives_back_what_it_took,
            reserves_are_kept_for_higher_priorities_with_exact_waits,
            a_concurrent_bucket_keeps_reserved_slots_free,
            reserves_are_stored_and_a_warm_client_follows_their_change,
            a_cost_beyond_a_priority_s_share_is_confirmed_and_distinct,
            a_burst_learned_by_one_client_bounds_every_client_after_a_silence,
            a_sharded_bucket_grants_its_whole_capacity_and_answers_the_bucket_s_retry_in,
            clients_on_a_bucket_resharded_between_their_grants_never_over_grant,
            a_sharded_bucket_is_redefined_and_deleted_as_a_whole,
            a_hot_bucket_spreads_itself_and_gathers_back_when_it_cools,
            corrections_follow_a_grant_over_shards_and_shards_gathered_away,
            several_dimensions_and_priorities_on_sharded_buckets,
            a_reshard_lands_on_rows_other_clients_take_from_meanwhile,
            a_reshard_lands_on_a_row_another_sdk_wrote_while_others_take_from_it,
            a_store_that_ignores_moves_still_reshards_exactly,
            a_bucket_pinned_or_capped_by_its_definition_keeps_within_it,
            a_client_throttled_on_a_row_since_spread_learns_the_spread_at_once,
            a_reshard_by_a_client_whose_clock_is_behind_counts_no_refill_early,
            peek_answers_what_an_acquire_would_get_and_takes_nothing,
            peek_respects_priorities_and_their_reserves,
            a_peek_sees_what_another_client_took_since,
            a_peek_on_a_spread_bucket_answers_for_the_whole,
            reset_and_top_up_refuse_a_bucket_changed_since_it_was_read,
            a_reset_keeps_a_concurrent_bucket_consistent_with_its_leases,
            a_reset_and_a_top_up_cover_every_row_of_a_spread_bucket,
            a_shadow_bucket_never_refuses_and_counts_what_enforcing_refuses,
            a_shadow_client_and_an_enforcing_client_conserve_tokens,
            switching_a_shadow_bucket_to_enforce_is_one_definition,
            a_new_client_s_first_acquire_on_a_shadow_bucket_keeps_the_count_exact,
            scheduled_limits_apply_at_the_boundary_exactly_once_with_two_reconcilers,
            a_scheduled_bucket_is_defined_with_the_limits_due_now,
            a_schedule_change_lost_to_another_reconciler_is_not_made_again,
            a_spread_bucket_s_schedule_is_applied_to_the_whole,
            a_key_s_first_acquire_creates_its_row_from_the_template_in_one_write,
            each_key_is_a_bucket_of_its_own_with_exact_waits,
            first_uses_of_one_key_racing_from_two_clients_never_over_grant,
            an_idle_key_s_row_removed_reads_as_full_and_comes_back,
            a_key_and_a_shared_dimension_are_taken_all_or_nothing,
            a_key_s_override_keeps_its_own_definition,
            the_reconciler_removes_idle_keys_rows_and_nothing_is_lost,
            an_unwritten_key_is_seen_as_its_template_s_bucket_full,
            a_correction_after_a_key_s_row_was_removed_is_charged_to_it,
        );
    };
    (@tests $make:path, $protocol:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let store: Option<::std::sync::Arc<dyn ::sluice::store::Store>> = $make().await;
                if let Some(store) = store {
                    $crate::conformance::$name($crate::conformance::Env::new(store, $protocol))
                        .await;
                }
            }
        )*
    };
}
pub(crate) use suite;

async fn requests(env: &Env, metric: &str, capacity: u64, per_second: u64) {
    env.sluice
        .put_bucket(
            &env.dim(metric),
            Bucket::requests(RefillRate::per_second(per_second)).with_capacity(capacity),
        )
        .await
        .unwrap();
}

pub async fn a_grant_takes_cost_per_call_and_bumps_the_version(env: Env) {
    env.sluice
        .put_bucket(
            &env.dim("rpm"),
            Bucket::requests(RefillRate::per_minute(600)).with_cost_per_call(2),
        )
        .await
        .unwrap();
    let before = env.sluice.bucket(&env.dim("rpm")).await.unwrap().unwrap();
    let lease = env.sluice.acquire(env.dim("rpm")).await.unwrap();
    assert_eq!(lease.cost(&env.dim("rpm")), Some(Tokens::new(2)));
    let after = env.sluice.bucket(&env.dim("rpm")).await.unwrap().unwrap();
    assert_eq!(after.tokens, before.tokens - Tokens::new(2));
    assert_eq!(after.version, before.version + 1);
    lease.recorded().await;
    assert_eq!(env.lease_count("rpm").await, 1);
    lease.release().await.unwrap();
    assert_eq!(env.lease_count("rpm").await, 0);
    // Requests stay consumed on release.
    assert_eq!(env.tokens("rpm").await, before.tokens - Tokens::new(2));
}

pub async fn an_exhausted_bucket_answers_an_exact_retry_in_and_grants_at_that_instant(env: Env) {
    // 4 per second, capacity 3: after 3 grants the next token is 250 ms away.
    requests(&env, "rpm", 3, 4).await;
    for _ in 0..3 {
        env.sluice
            .acquire(env.dim("rpm"))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    env.advance_ms(100);
    let d = retry_in(env.sluice.acquire(env.dim("rpm")).await);
    assert_eq!(d, Duration::from_millis(150));
    env.advance_ms(149);
    assert_eq!(
        retry_in(env.sluice.acquire(env.dim("rpm")).await),
        Duration::from_millis(1)
    );
    env.advance_ms(1);
    let lease = env
        .sluice
        .acquire(env.dim("rpm"))
        .await
        .expect("granted at exactly the promised instant");
    lease.release().await.unwrap();
}

pub async fn retry_in_rounds_up_to_the_millisecond(env: Env) {
    // 3 per second: a token every 333.33 ms.
    requests(&env, "rpm", 1, 3).await;
    env.sluice
        .acquire(env.dim("rpm"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let d = retry_in(env.sluice.acquire(env.dim("rpm")).await);
    assert_eq!(d, Duration::from_millis(334));
    env.advance_ms(333);
    assert!(env.sluice.acquire(env.dim("rpm")).await.is_err());
    env.advance_ms(1);
    assert!(env.sluice.acquire(env.dim("rpm")).await.is_ok());
}

pub async fn multi_dimension_acquire_is_all_or_nothing(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    env.sluice
        .put_bucket(
            &env.dim("tpm"),
            Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000),
        )
        .await
        .unwrap();
    let rpm_before = env.sluice.bucket(&env.dim("rpm")).await.unwrap().unwrap();
    let tpm_before = env.sluice.bucket(&env.dim("tpm")).await.unwrap().unwrap();
    // tpm is short (1,500 > 1,000 is impossible; 999 + 999 is short on the second call).
    let first = env
        .sluice
        .acquire(Acquire::new(env.dim("rpm")).and_cost(env.dim("tpm"), 999))
        .await
        .unwrap();
    let rpm_mid = env.sluice.bucket(&env.dim("rpm")).await.unwrap().unwrap();
    let tpm_mid = env.sluice.bucket(&env.dim("tpm")).await.unwrap().unwrap();
    assert_eq!(rpm_mid.tokens, rpm_before.tokens - Tokens::new(1));
    assert_eq!(tpm_mid.tokens, tpm_before.tokens - Tokens::new(999));
    let d = retry_in(
        env.sluice
            .acquire(Acquire::new(env.dim("rpm")).and_cost(env.dim("tpm"), 999))
            .await,
    );
    assert_eq!(d, Duration::from_millis(9_980));
    let rpm_after = env.sluice.bucket(&env.dim("rpm")).await.unwrap().unwrap();
    let tpm_after = env.sluice.bucket(&env.dim("tpm")).await.unwrap().unwrap();
    assert_eq!(rpm_after, rpm_mid, "no bucket changes when one is short");
    assert_eq!(tpm_after, tpm_mid);
    first.recorded().await;
    assert_eq!(
        env.lease_count("rpm").await,
        1,
        "no lease written for the refused acquire"
    );
    assert_eq!(env.lease_count("tpm").await, 1);
    // The granted lease covers both dimensions and releases both rows.
    assert_eq!(first.id().keys().len(), 2);
    first.release().await.unwrap();
    assert_eq!(
        env.lease_count("rpm").await + env.lease_count("tpm").await,
        0
    );
}

pub async fn multi_dimension_retry_in_is_the_longest_wait(env: Env) {
    requests(&env, "a", 1, 10).await; // 100 ms per token
    requests(&env, "b", 1, 2).await; // 500 ms per token
    env.sluice
        .acquire(Acquire::new(env.dim("a")).and(env.dim("b")))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let d = retry_in(
        env.sluice
            .acquire(Acquire::new(env.dim("a")).and(env.dim("b")))
            .await,
    );
    assert_eq!(d, Duration::from_millis(500));
}

pub async fn concurrent_slots_are_given_back_on_release_exactly_once(env: Env) {
    let n = 3;
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(n))
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(env.sluice.acquire(env.dim("concurrent")).await.unwrap());
    }
    // Time alone never frees a slot (the leases live 60 s).
    env.advance_ms(30_000);
    assert!(
        env.sluice
            .acquire(env.dim("concurrent"))
            .await
            .unwrap_err()
            .retry_in()
            .is_some()
    );
    assert_eq!(env.available("concurrent").await, Tokens::ZERO);
    // Release one: exactly one slot comes back.
    let one = held.pop().unwrap();
    let id = one.id().clone();
    one.release().await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(1));
    // Releasing the same lease again (from another client, by id) restores nothing.
    assert!(!env.client("other").release_id(&id).await.unwrap());
    assert_eq!(env.available("concurrent").await, Tokens::new(1));
    let again = env.sluice.acquire(env.dim("concurrent")).await.unwrap();
    assert!(env.sluice.acquire(env.dim("concurrent")).await.is_err());
    again.release().await.unwrap();
    for lease in held {
        lease.release().await.unwrap();
    }
    assert_eq!(env.available("concurrent").await, Tokens::new(n as i64));
    assert_eq!(env.lease_count("concurrent").await, 0);
}

pub async fn concurrent_retry_in_is_the_poll_interval_or_the_earliest_give_back_if_sooner(
    env: Env,
) {
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(2))
        .await
        .unwrap();
    let a = env
        .sluice
        .acquire(Acquire::new(env.dim("concurrent")).ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    env.advance_ms(1_000);
    let b = env
        .sluice
        .acquire(Acquire::new(env.dim("concurrent")).ttl(Duration::from_secs(10)))
        .await
        .unwrap();
    env.advance_ms(2_500);
    // a expires in 26.5 s, b in 7.5 s (its slot may be given back SKEW after that), but
    // their holders may release them any moment: ask again after the poll interval.
    let d = retry_in(env.sluice.acquire(env.dim("concurrent")).await);
    assert_eq!(d, SLOT_POLL);
    // When b's slot may be given back sooner than that, its time is the RetryIn.
    let soon = 7_500 + SKEW.as_millis() as u64 - SLOT_POLL.as_millis() as u64 / 3;
    env.advance_ms(soon);
    let d = retry_in(env.sluice.acquire(env.dim("concurrent")).await);
    assert_eq!(d, SLOT_POLL / 3);
    a.release().await.unwrap();
    b.release().await.unwrap();
}

pub async fn expired_concurrent_leases_are_reclaimed_when_the_bucket_is_short(env: Env) {
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(1))
        .await
        .unwrap();
    let crashed = env
        .sluice
        .acquire(Acquire::new(env.dim("concurrent")).ttl(Duration::from_secs(5)))
        .await
        .unwrap();
    // The holder "crashes": its lease is forgotten without release.
    std::mem::forget(crashed);
    assert!(env.sluice.acquire(env.dim("concurrent")).await.is_err());
    // Expired, but its holder's clock may still show it live: not yet.
    env.advance_ms(5_001);
    assert_eq!(
        retry_in(env.sluice.acquire(env.dim("concurrent")).await),
        SKEW - Duration::from_millis(1)
    );
    env.advance_ms(SKEW.as_millis() as u64 - 1);
    let lease = env
        .sluice
        .acquire(env.dim("concurrent"))
        .await
        .expect("the expired slot came back");
    assert_eq!(env.lease_count("concurrent").await, 1);
    lease.release().await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(1));
}

pub async fn cost_above_capacity_is_a_distinct_error(env: Env) {
    env.sluice
        .put_bucket(
            &env.dim("tpm"),
            Bucket::tokens(RefillRate::per_second(10)).with_capacity(100),
        )
        .await
        .unwrap();
    let e = env
        .sluice
        .acquire(Acquire::with_cost(env.dim("tpm"), 101))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::CostExceedsCapacity { .. }), "{e}");
    assert_eq!(e.retry_in(), None);
    // Even an empty bucket answers the same, never RetryIn.
    env.sluice
        .acquire(Acquire::with_cost(env.dim("tpm"), 100))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let e = env
        .sluice
        .acquire(Acquire::with_cost(env.dim("tpm"), 101))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::CostExceedsCapacity { .. }));
}

pub async fn unknown_and_invalid_dimensions_are_typed_errors(env: Env) {
    let e = env.sluice.acquire(env.dim("missing")).await.unwrap_err();
    assert!(matches!(e, Error::UnknownDimension { .. }), "{e}");
    let e = env.sluice.acquire("not a dimension").await.unwrap_err();
    assert!(matches!(e, Error::InvalidDimension(_)), "{e}");
    let e = env.sluice.snapshot(&env.dim("missing")).await.unwrap_err();
    assert!(matches!(e, Error::UnknownDimension { .. }), "{e}");
}

pub async fn adjust_into_debt_is_repaid_by_refill(env: Env) {
    env.sluice
        .put_bucket(
            &env.dim("tpm"),
            Bucket::tokens(RefillRate::per_second(1_000)).with_capacity(1_000),
        )
        .await
        .unwrap();
    let mut lease = env
        .sluice
        .acquire(Acquire::with_cost(env.dim("tpm"), 500))
        .await
        .unwrap();
    lease.adjust(&env.dim("tpm"), 2_000).await.unwrap();
    assert_eq!(env.available("tpm").await, Tokens::new(-1_000));
    assert_eq!(lease.cost(&env.dim("tpm")), Some(Tokens::new(2_000)));
    // 1,000 debt + 1 token needed at 1,000/s: 1.001 s.
    assert_eq!(
        retry_in(
            env.sluice
                .acquire(Acquire::with_cost(env.dim("tpm"), 1))
                .await
        ),
        Duration::from_millis(1_001)
    );
    env.advance_ms(1_500);
    assert_eq!(env.available("tpm").await, Tokens::new(500));
    lease.release().await.unwrap();
    assert_eq!(
        env.available("tpm").await,
        Tokens::new(500),
        "tokens stay consumed on release"
    );
}

pub async fn adjust_down_refunds_and_release_restores_the_adjusted_cost(env: Env) {
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(10))
        .await
        .unwrap();
    let mut lease = env
        .sluice
        .acquire(Acquire::with_cost(env.dim("concurrent"), 6))
        .await
        .unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(4));
    lease.adjust(&env.dim("concurrent"), 2).await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(8));
    lease.release().await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(10));
}

pub async fn lease_rows_carry_dimension_cost_caller_and_expiry(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    let caller = env.client("audit-service");
    let lease = caller
        .acquire(Acquire::with_cost(env.dim("rpm"), 3).ttl(Duration::from_secs(45)))
        .await
        .unwrap();
    lease.recorded().await;
    let rows = env.store.read_leases(lease.id().keys()).await.unwrap();
    let row = rows[0].clone().expect("lease row written");
    assert_eq!(row.dimension.as_str(), env.dim("rpm"));
    assert_eq!(row.cost, Tokens::new(3));
    assert_eq!(row.caller, "audit-service");
    assert_eq!(row.created_at, env.clock.now());
    assert_eq!(
        row.expires_at,
        env.clock.now().saturating_add(Duration::from_secs(45))
    );
    assert_eq!(lease.expires_at(), row.expires_at);
    assert!(
        row.key
            .as_str()
            .starts_with(&format!("lease#{}#", env.dim("rpm")))
    );
    lease.release().await.unwrap();
    assert_eq!(
        env.store
            .read_leases(std::slice::from_ref(&row.key))
            .await
            .unwrap()[0],
        None
    );
}

pub async fn release_by_id_from_another_client(env: Env) {
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(1))
        .await
        .unwrap();
    let lease = env.sluice.acquire(env.dim("concurrent")).await.unwrap();
    let id: sluice::LeaseId = lease.id().to_string().parse().unwrap();
    std::mem::forget(lease);
    assert!(env.client("worker-2").release_id(&id).await.unwrap());
    assert_eq!(env.available("concurrent").await, Tokens::new(1));
    assert!(!env.client("worker-2").release_id(&id).await.unwrap());
    assert_eq!(env.available("concurrent").await, Tokens::new(1));
}

pub async fn snapshot_reports_what_an_operator_needs(env: Env) {
    requests(&env, "rpm", 10, 2).await;
    let a = env
        .sluice
        .acquire(Acquire::with_cost(env.dim("rpm"), 4))
        .await
        .unwrap();
    let b = env
        .sluice
        .acquire(Acquire::with_cost(env.dim("rpm"), 2).ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    a.recorded().await;
    b.recorded().await;
    env.advance_ms(1_500);
    let s = env.sluice.snapshot(&env.dim("rpm")).await.unwrap();
    assert_eq!(s.limit_type, LimitType::Requests);
    assert_eq!(s.capacity, Tokens::new(10));
    assert_eq!(s.available, Tokens::new(7));
    assert_eq!(s.refill_rate, RefillRate::per_second(2));
    assert_eq!(s.live_leases, 1);
    assert_eq!(s.leased, Tokens::new(4));
    assert_eq!(s.expired_leases, 1);
    assert_eq!(s.time_to_full, Some(Duration::from_millis(1_500)));
    a.release().await.unwrap();
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(2))
        .await
        .unwrap();
    let c = env.sluice.acquire(env.dim("concurrent")).await.unwrap();
    let s = env.sluice.snapshot(&env.dim("concurrent")).await.unwrap();
    assert_eq!((s.available, s.time_to_full), (Tokens::new(1), None));
    c.release().await.unwrap();
    let s = env.sluice.snapshot(&env.dim("concurrent")).await.unwrap();
    assert_eq!(
        (s.available, s.time_to_full),
        (Tokens::new(2), Some(Duration::ZERO))
    );
}

pub async fn redefining_a_bucket_keeps_its_tokens(env: Env) {
    requests(&env, "rpm", 100, 1).await;
    env.sluice
        .acquire(Acquire::with_cost(env.dim("rpm"), 70))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // A larger limit does not hand out a fresh burst...
    requests(&env, "rpm", 1_000, 10).await;
    assert_eq!(env.available("rpm").await, Tokens::new(30));
    // ...and a smaller one caps what is there.
    requests(&env, "rpm", 20, 10).await;
    assert_eq!(env.available("rpm").await, Tokens::new(20));
    let e = env
        .sluice
        .put_bucket(&env.dim("rpm"), Bucket::concurrent(0))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidBucket { .. }), "{e}");
}

pub async fn buckets_are_listed_and_deleted(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(3))
        .await
        .unwrap();
    let mine: Vec<String> = env
        .sluice
        .buckets()
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.dimension.to_string())
        .filter(|d| d.starts_with(&env.dim("")))
        .collect();
    assert_eq!(mine.len(), 2);
    assert!(mine.contains(&env.dim("rpm")) && mine.contains(&env.dim("concurrent")));
    assert!(env.sluice.delete_bucket(&env.dim("rpm")).await.unwrap());
    assert!(!env.sluice.delete_bucket(&env.dim("rpm")).await.unwrap());
    assert!(env.sluice.bucket(&env.dim("rpm")).await.unwrap().is_none());
}

pub async fn racing_clients_never_over_grant(env: Env) {
    // The clock stands still: exactly `capacity` grants exist, however the race goes.
    let capacity = 40;
    requests(&env, "rpm", capacity, 1).await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let client = env.client(&format!("racer-{i}"));
        let dim = env.dim("rpm");
        tasks.push(tokio::spawn(async move {
            let mut granted = Vec::new();
            loop {
                match client.acquire(dim.as_str()).await {
                    Ok(lease) => granted.push(lease),
                    Err(Error::RetryIn(_)) => break,
                    Err(Error::Contention { .. }) => continue,
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            granted
        }));
    }
    let mut leases = Vec::new();
    for t in tasks {
        leases.extend(t.await.unwrap());
    }
    assert_eq!(
        leases.len() as u64,
        capacity,
        "every token granted once, none twice"
    );
    assert_eq!(env.tokens("rpm").await, Tokens::ZERO);
    for l in &leases {
        l.recorded().await;
    }
    assert_eq!(env.lease_count("rpm").await as u64, capacity);
    for l in leases {
        l.release().await.unwrap();
    }
    assert_eq!(env.lease_count("rpm").await, 0);
}

pub async fn slot_releases_on_ok_err_timeout_and_panic(env: Env) {
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(1))
        .await
        .unwrap();
    let dim = env.dim("concurrent");
    let timeout = Duration::from_secs(5);

    let ok = env
        .sluice
        .slot(dim.as_str(), timeout, async { 7 })
        .await
        .unwrap();
    assert_eq!(ok, 7);
    assert_eq!(env.available("concurrent").await, Tokens::new(1));

    let err: Result<(), String> = env
        .sluice
        .slot(dim.as_str(), timeout, async {
            Err("vendor said no".to_owned())
        })
        .await
        .unwrap();
    assert!(err.is_err());
    assert_eq!(env.available("concurrent").await, Tokens::new(1));

    let e = env
        .sluice
        .slot(
            dim.as_str(),
            Duration::from_millis(50),
            tokio::time::sleep(Duration::from_secs(30)),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert_eq!(env.available("concurrent").await, Tokens::new(1));

    let sluice = env.sluice.clone();
    let d = dim.clone();
    let panicked = tokio::spawn(async move {
        sluice
            .slot(d.as_str(), timeout, async { panic!("body panicked") })
            .await
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert_eq!(env.available("concurrent").await, Tokens::new(1));
    assert_eq!(env.lease_count("concurrent").await, 0);
}

pub async fn slot_dropped_midway_releases_in_the_background(env: Env) {
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(1))
        .await
        .unwrap();
    let sluice = env.sluice.clone();
    let dim = env.dim("concurrent");
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        sluice
            .slot(dim.as_str(), Duration::from_secs(60), async move {
                let _ = entered_tx.send(());
                std::future::pending::<()>().await
            })
            .await
    });
    entered_rx.await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::ZERO);
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    for _ in 0..500 {
        if env.available("concurrent").await == Tokens::new(1)
            && env.lease_count("concurrent").await == 0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the dropped slot's lease was not released");
}

pub async fn a_vendor_pause_empties_a_refilling_bucket_for_every_client(env: Env) {
    requests(&env, "rpm", 10, 10).await;
    let dim = env.dim("rpm");
    let seven = Duration::from_secs(7);
    assert!(
        env.sluice
            .tighten(&dim, Tighten::PauseFor(seven))
            .await
            .unwrap()
    );
    // Another process sees the pause without any vendor call of its own.
    let other = env.client("other");
    assert_eq!(retry_in(other.acquire(dim.as_str()).await), seven);
    // A shorter pause is looser: nothing changes.
    assert!(
        !env.sluice
            .tighten(&dim, Tighten::PauseFor(Duration::from_secs(2)))
            .await
            .unwrap()
    );
    env.advance_ms(6_999);
    assert_eq!(
        retry_in(other.acquire(dim.as_str()).await),
        Duration::from_millis(1)
    );
    env.advance_ms(1);
    other
        .acquire(dim.as_str())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Then refill goes on at the bucket's own rate.
    assert_eq!(
        retry_in(other.acquire(dim.as_str()).await),
        Duration::from_millis(100)
    );
    assert!(matches!(
        env.sluice
            .tighten(&env.dim("undefined"), Tighten::PauseFor(seven))
            .await,
        Err(Error::UnknownDimension { .. })
    ));
}

pub async fn a_vendor_remaining_count_lowers_a_bucket_but_never_raises_it(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    let dim = env.dim("rpm");
    assert!(
        env.sluice
            .tighten(&dim, Tighten::AtMost(Tokens::new(2)))
            .await
            .unwrap()
    );
    assert_eq!(env.available("rpm").await, Tokens::new(2));
    assert!(
        !env.sluice
            .tighten(&dim, Tighten::AtMost(Tokens::new(5)))
            .await
            .unwrap()
    );
    assert_eq!(env.available("rpm").await, Tokens::new(2));
    let taken = acquire_n(&env.sluice, &dim, 2).await;
    assert_eq!(
        retry_in(env.sluice.acquire(dim.as_str()).await),
        Duration::from_secs(1)
    );
    for lease in taken {
        lease.release().await.unwrap();
    }
    // A concurrent bucket's slots are not a remaining count: untouched.
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(3))
        .await
        .unwrap();
    assert!(
        !env.sluice
            .tighten(&env.dim("concurrent"), Tighten::AtMost(Tokens::new(1)))
            .await
            .unwrap()
    );
    assert_eq!(env.available("concurrent").await, Tokens::new(3));
}

pub async fn a_vendor_pause_holds_every_concurrent_slot_until_it_ends(env: Env) {
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(3))
        .await
        .unwrap();
    let dim = env.dim("concurrent");
    let held = env.sluice.acquire(dim.as_str()).await.unwrap();
    assert!(
        env.sluice
            .tighten(&dim, Tighten::PauseFor(Duration::from_secs(5)))
            .await
            .unwrap()
    );
    let other = env.client("other");
    assert_eq!(
        retry_in(other.acquire(dim.as_str()).await),
        Duration::from_secs(5)
    );
    // A slot given back during the pause does not reopen the bucket.
    held.release().await.unwrap();
    assert_eq!(
        retry_in(other.acquire(dim.as_str()).await),
        Duration::from_secs(5)
    );
    // When the pause ends, all three slots are there again, exactly.
    env.advance_ms(5_000);
    let leases: Vec<_> = acquire_n(&other, &dim, 3).await;
    assert_eq!(leases.len(), 3);
    assert!(retry_in(other.acquire(dim.as_str()).await) > Duration::ZERO);
    for lease in leases {
        lease.release().await.unwrap();
    }
    assert_eq!(env.available("concurrent").await, Tokens::new(3));
    assert_eq!(env.lease_count("concurrent").await, 0);
}

async fn acquire_n(client: &Sluice, dim: &str, n: usize) -> Vec<sluice::Lease> {
    let mut leases = Vec::with_capacity(n);
    for _ in 0..n {
        leases.push(client.acquire(dim).await.unwrap());
    }
    leases
}

/// Takes a slot and "crashes": the lease is never released.
async fn crashed_slot(client: &Sluice, dim: &str, ttl: Duration) -> sluice::LeaseId {
    let lease = client.acquire(Acquire::new(dim).ttl(ttl)).await.unwrap();
    // Its holder dies once its lease row is there (before, there is nothing to refund).
    lease.recorded().await;
    let id = lease.id().clone();
    std::mem::forget(lease);
    id
}

/// Deletes lease rows the way DynamoDB's TTL sweeper does: nothing given back.
/// Deletes every lease row of `metric`, as DynamoDB's TTL sweeper (or another tool) may.
pub(crate) async fn sweep(env: &Env, metric: &str) -> usize {
    use sluice::store::{Commit, LeaseWrite};
    let leases = env
        .store
        .list_leases(&LeaseFilter {
            dimension: Some(env.dim(metric).parse().unwrap()),
            expired_before: None,
        })
        .await
        .unwrap();
    let n = leases.len();
    env.store
        .commit(Commit {
            buckets: vec![],
            leases: leases
                .into_iter()
                .map(|l| LeaseWrite::Delete(l.key))
                .collect(),
        })
        .await
        .unwrap();
    n
}

pub async fn reconcile_restores_each_expired_lease_once_and_leaves_live_ones(env: Env) {
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(5))
        .await
        .unwrap();
    let dim = env.dim("concurrent");
    let crashed = env.client("crashed");
    crashed_slot(&crashed, &dim, Duration::from_secs(10)).await;
    crashed_slot(&crashed, &dim, Duration::from_secs(10)).await;
    let live = env
        .sluice
        .acquire(Acquire::new(dim.as_str()).ttl(Duration::from_secs(120)))
        .await
        .unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(2));
    // Not expired yet: nothing to do.
    let early = env.sluice.reconcile().await.unwrap();
    assert_eq!(early.leases_seen, 0);
    assert_eq!(early.buckets_healed, 0);
    // Expired, but within the clock-skew margin: still nothing.
    env.advance_ms(10_001);
    assert_eq!(env.sluice.reconcile().await.unwrap().leases_seen, 0);
    env.advance_ms(SKEW.as_millis() as u64);
    let report = env.sluice.reconcile().await.unwrap();
    assert_eq!(report.leases_seen, 2);
    assert_eq!(report.leases_restored, 2);
    assert_eq!(report.tokens_restored, Tokens::new(2));
    assert_eq!(report.buckets_healed, 0, "{report}");
    assert!(report.errors.is_empty(), "{report}");
    assert_eq!(env.available("concurrent").await, Tokens::new(4));
    assert_eq!(env.lease_count("concurrent").await, 1);
    let again = env.sluice.reconcile().await.unwrap();
    assert!(again.is_noop(), "{again}");
    assert_eq!(again.leases_seen, 0);
    live.release().await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(5));
}

pub async fn reconcile_refunds_a_crashed_requests_lease_capped_at_capacity(env: Env) {
    requests(&env, "rpm", 3, 1).await;
    let dim = env.dim("rpm");
    crashed_slot(&env.sluice, &dim, Duration::from_secs(5)).await;
    crashed_slot(&env.sluice, &dim, Duration::from_secs(5)).await;
    assert_eq!(env.available("rpm").await, Tokens::new(1));
    // Expired: their holder may still be retrying a failed release, so they are left
    // for the release grace (a released lease is never refunded).
    env.advance_ms(5_000 + SKEW.as_millis() as u64);
    let waiting = env.sluice.reconcile().await.unwrap();
    assert_eq!(waiting.leases_in_grace, 2, "{waiting}");
    assert_eq!(waiting.leases_restored, 0, "{waiting}");
    env.advance_ms(sluice::config::RELEASE_GRACE.as_millis() as u64 - 1);
    assert_eq!(env.sluice.reconcile().await.unwrap().leases_in_grace, 2);
    // Then refunded, capped at capacity (refill has filled the bucket meanwhile).
    env.advance_ms(1);
    let report = env.sluice.reconcile().await.unwrap();
    assert_eq!(report.leases_restored, 2);
    assert_eq!(env.available("rpm").await, Tokens::new(3));
    assert_eq!(env.lease_count("rpm").await, 0);
}

pub async fn reconcile_heals_a_concurrent_bucket_whose_lease_vanished(env: Env) {
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(3))
        .await
        .unwrap();
    let dim = env.dim("concurrent");
    let rows = env.client("conformance");
    crashed_slot(&rows, &dim, Duration::from_secs(10)).await;
    let live = rows.acquire(dim.as_str()).await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(1));
    // The sweeper deletes both rows, the crashed one and the live one.
    assert_eq!(sweep(&env, "concurrent").await, 2);
    env.advance_ms(10_001);
    let report = env.sluice.reconcile().await.unwrap();
    assert_eq!(report.leases_seen, 0);
    assert_eq!(report.buckets_healed, 1, "{report}");
    assert_eq!(report.tokens_healed, Tokens::new(2));
    assert_eq!(env.available("concurrent").await, Tokens::new(3));
    assert!(env.sluice.reconcile().await.unwrap().is_noop());
    // The live caller's release finds its row gone and gives nothing back twice.
    live.release().await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(3));
    // A consistent bucket with live leases is left alone.
    let held = env.sluice.acquire(dim.as_str()).await.unwrap();
    let report = env.sluice.reconcile().await.unwrap();
    assert_eq!(report.buckets_checked, 1);
    assert!(report.is_noop(), "{report}");
    held.release().await.unwrap();
}

pub async fn release_and_two_reconcilers_racing_restore_exactly_once(env: Env) {
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(4))
        .await
        .unwrap();
    let dim = env.dim("concurrent");
    let releaser = env.client("releaser");
    let reconciler_a = env.client("reconciler-a");
    let reconciler_b = env.client("reconciler-b");
    // A slot held throughout, so that a double restore could not hide behind the
    // capacity cap.
    let anchor = env
        .sluice
        .acquire(Acquire::new(dim.as_str()).ttl(Duration::from_secs(86_400)))
        .await
        .unwrap();
    for round in 0..100 {
        let held = releaser
            .acquire(Acquire::new(dim.as_str()).ttl(Duration::from_secs(1)))
            .await
            .unwrap();
        crashed_slot(&releaser, &dim, Duration::from_secs(1)).await;
        assert_eq!(env.available("concurrent").await, Tokens::new(1));
        env.advance_ms(1_001 + SKEW.as_millis() as u64);
        let (released, a, b) = tokio::join!(
            tokio::spawn(async move { held.release().await }),
            tokio::spawn({
                let r = reconciler_a.clone();
                async move { r.reconcile().await }
            }),
            tokio::spawn({
                let r = reconciler_b.clone();
                async move { r.reconcile().await }
            }),
        );
        released.unwrap().unwrap();
        let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
        assert!(a.errors.is_empty() && b.errors.is_empty(), "{a} / {b}");
        // The crashed lease goes to exactly one reconciler; the released one to the
        // release or to one reconciler.
        let restored = a.leases_restored + b.leases_restored;
        assert!((1..=2).contains(&restored), "round {round}: {a} / {b}");
        assert_eq!(
            a.buckets_healed + b.buckets_healed,
            0,
            "round {round}: {a} / {b}"
        );
        assert_eq!(
            env.available("concurrent").await,
            Tokens::new(3),
            "round {round}: {a} / {b}"
        );
        assert_eq!(env.lease_count("concurrent").await, 1, "round {round}");
    }
    anchor.release().await.unwrap();
    assert_eq!(env.available("concurrent").await, Tokens::new(4));
}

pub async fn snapshots_cover_every_bucket(env: Env) {
    requests(&env, "rpm", 10, 1).await;
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(2))
        .await
        .unwrap();
    let held = env.sluice.acquire(env.dim("concurrent")).await.unwrap();
    let snapshots = env.sluice.snapshots().await.unwrap();
    let mine: Vec<_> = snapshots
        .iter()
        .filter(|s| s.dimension.vendor() == env.dim("x").split('#').next().unwrap())
        .collect();
    assert_eq!(mine.len(), 2);
    let concurrent = mine
        .iter()
        .find(|s| s.limit_type == LimitType::Concurrent)
        .unwrap();
    assert_eq!(concurrent.available, Tokens::new(1));
    assert_eq!(concurrent.live_leases, 1);
    let rpm = mine
        .iter()
        .find(|s| s.limit_type == LimitType::Requests)
        .unwrap();
    assert_eq!(rpm.available, Tokens::new(10));
    assert_eq!(rpm.live_leases, 0);
    assert!(
        snapshots
            .windows(2)
            .all(|w| w[0].dimension.as_str() <= w[1].dimension.as_str()),
        "sorted by dimension"
    );
    held.release().await.unwrap();
}

pub async fn lean_buckets_grant_without_lease_rows(env: Env) {
    let dim = env.dim("rpm");
    env.sluice
        .put_bucket(
            &dim,
            Bucket::requests(RefillRate::per_second(4))
                .with_capacity(3)
                .lean(),
        )
        .await
        .unwrap();
    assert!(
        !env.sluice
            .bucket(&dim)
            .await
            .unwrap()
            .unwrap()
            .bucket
            .keeps_leases()
    );
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(env.sluice.acquire(dim.as_str()).await.unwrap());
    }
    assert_eq!(env.lease_count("rpm").await, 0, "no lease rows");
    assert_eq!(env.tokens("rpm").await, Tokens::ZERO);
    // Exact RetryIn, from this client and from another one.
    assert_eq!(
        retry_in(env.sluice.acquire(dim.as_str()).await),
        Duration::from_millis(250)
    );
    assert_eq!(
        retry_in(env.client("other").acquire(dim.as_str()).await),
        Duration::from_millis(250)
    );
    // Adjusting charges the bucket (into debt); releasing costs nothing and gives nothing.
    let mut first = held.remove(0);
    first.adjust(&dim, 3).await.unwrap();
    assert_eq!(env.tokens("rpm").await, Tokens::new(-2));
    first.release().await.unwrap();
    for lease in held {
        lease.release().await.unwrap();
    }
    assert_eq!(env.tokens("rpm").await, Tokens::new(-2));
    // A crashed lean grant leaves nothing for the reconciler.
    assert!(env.sluice.reconcile().await.unwrap().is_noop());
    env.advance_ms(750);
    let again = env.sluice.acquire(dim.as_str()).await.unwrap();
    again.release().await.unwrap();
    // `concurrent` buckets cannot be lean.
    assert!(matches!(
        env.sluice
            .put_bucket(&env.dim("concurrent"), Bucket::concurrent(2).lean())
            .await,
        Err(Error::InvalidBucket { .. })
    ));
}

pub async fn racing_clients_and_tasks_never_over_grant_a_lean_bucket(env: Env) {
    let capacity = 60;
    let dim = env.dim("rpm");
    env.sluice
        .put_bucket(
            &dim,
            Bucket::requests(RefillRate::per_second(1))
                .with_capacity(capacity)
                .lean(),
        )
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..4 {
        let client = env.client(&format!("racer-{i}"));
        for _ in 0..4 {
            let client = client.clone();
            let dim = dim.clone();
            tasks.push(tokio::spawn(async move {
                let mut granted = 0u64;
                loop {
                    match client.acquire(dim.as_str()).await {
                        Ok(_) => granted += 1,
                        Err(Error::RetryIn(_)) => break,
                        Err(Error::Contention { .. }) => continue,
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
                granted
            }));
        }
    }
    let mut granted = 0;
    for t in tasks {
        granted += t.await.unwrap();
    }
    assert_eq!(granted, capacity, "every token granted once, none twice");
    assert_eq!(env.tokens("rpm").await, Tokens::ZERO);
    assert_eq!(env.lease_count("rpm").await, 0);
}

pub async fn many_tasks_on_one_client_never_over_grant(env: Env) {
    // Acquires of one client on one dimension share writes on the fast path: still exactly
    // `capacity` grants, each with its own lease row.
    let capacity = 50;
    requests(&env, "rpm", capacity, 1).await;
    env.sluice
        .put_bucket(&env.dim("concurrent"), Bucket::concurrent(5))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let client = env.sluice.clone();
        let rpm = env.dim("rpm");
        let concurrent = env.dim("concurrent");
        tasks.push(tokio::spawn(async move {
            let mut leases = Vec::new();
            loop {
                match client.acquire(rpm.as_str()).await {
                    Ok(lease) => leases.push(lease),
                    Err(Error::RetryIn(_)) => break,
                    Err(Error::Contention { .. }) => continue,
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            // Slots: taken and given back, many times over.
            for _ in 0..5 {
                match client.acquire(concurrent.as_str()).await {
                    Ok(slot) => slot.release().await.unwrap(),
                    Err(Error::RetryIn(_) | Error::Contention { .. }) => {
                        tokio::task::yield_now().await
                    }
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            leases
        }));
    }
    let mut leases = Vec::new();
    for t in tasks {
        leases.extend(t.await.unwrap());
    }
    assert_eq!(leases.len() as u64, capacity);
    assert_eq!(env.tokens("rpm").await, Tokens::ZERO);
    for l in &leases {
        l.recorded().await;
    }
    assert_eq!(env.lease_count("rpm").await as u64, capacity);
    let ids: std::collections::HashSet<String> =
        leases.iter().map(|l| l.id().to_string()).collect();
    assert_eq!(ids.len() as u64, capacity, "every grant its own lease");
    for l in leases {
        l.release().await.unwrap();
    }
    assert_eq!(env.lease_count("rpm").await, 0);
    assert_eq!(env.available("concurrent").await, Tokens::new(5));
    assert_eq!(env.lease_count("concurrent").await, 0);
}
