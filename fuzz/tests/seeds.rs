//! The committed seeds, replayed as ordinary tests, and the harness itself checked: a short
//! run of every target, a panic caught and written to a file, the budget from the
//! environment.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use sluice::__fuzz::{Item, read_bucket_row, read_lease_row, write_bucket_row, write_lease_row};
use sluice::store::{LeaseKey, LeaseRecord};
use sluice::{
    Bucket, RefillRate, Tokens, bucket::BucketState, clock::UnixMillis, store::RecentWrites,
};
use sluice_fuzz::input::Reader;
use sluice_fuzz::targets::row;
use sluice_fuzz::{Budget, TARGETS, Target, driver};

#[test]
fn every_committed_seed_runs_without_a_panic() {
    for target in &TARGETS {
        let seeds = sluice_fuzz::seeds(target).unwrap();
        assert!(seeds.len() >= 4, "{}: too few seeds", target.name);
        for (path, bytes) in seeds {
            if let Err(message) = driver::check(target, &bytes) {
                panic!("{}: {message}", path.display());
            }
        }
    }
}

#[test]
fn a_short_run_of_every_target_finds_no_panic() {
    let budget = Budget {
        iterations: 500,
        time: None,
        seed: 1,
    };
    let crashes = std::env::temp_dir().join("sluice-fuzz-test-crashes");
    for target in &TARGETS {
        let seeds: Vec<Vec<u8>> = sluice_fuzz::seeds(target)
            .unwrap()
            .into_iter()
            .map(|(_, b)| b)
            .collect();
        match driver::fuzz(target, &seeds, &budget, &crashes) {
            Ok(report) => assert_eq!(report.executions, 500 + seeds.len() as u64),
            Err(crash) => panic!("{crash}"),
        }
    }
}

fn explodes(input: &[u8]) -> u64 {
    assert!(
        !input.windows(4).any(|w| w == b"boom"),
        "the parser exploded"
    );
    input.len() as u64
}

#[test]
fn a_panic_is_caught_and_its_input_written_to_a_file() {
    let target = Target {
        name: "explodes",
        dictionary: &[b"boom"],
        check: explodes,
    };
    let dir = std::env::temp_dir().join(format!("sluice-fuzz-crash-{}", std::process::id()));
    let budget = Budget {
        iterations: 100_000,
        time: None,
        seed: 3,
    };
    let crash = driver::fuzz(&target, &[b"bo".to_vec()], &budget, &dir).unwrap_err();
    let input = std::fs::read(&crash.input).unwrap();
    assert!(input.windows(4).any(|w| w == b"boom"), "{input:?}");
    assert!(crash.message.contains("the parser exploded"), "{crash}");
    assert!(crash.to_string().contains("replay explodes"), "{crash}");
    assert_eq!(driver::check(&target, b"fine"), Ok(4));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_budget_comes_from_the_environment() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    let default = Budget::from_env(env(&[])).unwrap();
    assert_eq!(default.iterations, sluice_fuzz::DEFAULT_ITERATIONS);
    assert_eq!(
        (default.time, default.seed),
        (Some(sluice_fuzz::DEFAULT_TIME), 0)
    );
    let counted = Budget::from_env(env(&[("SLUICE_FUZZ_ITERATIONS", "5")])).unwrap();
    assert_eq!((counted.iterations, counted.time), (5, None));
    let timed = Budget::from_env(env(&[
        ("SLUICE_FUZZ_SECONDS", "60"),
        ("SLUICE_FUZZ_SEED", "9"),
    ]));
    assert_eq!(
        timed,
        Ok(Budget {
            iterations: u64::MAX,
            time: Some(Duration::from_secs(60)),
            seed: 9
        })
    );
    assert!(Budget::from_env(env(&[("SLUICE_FUZZ_ITERATIONS", "lots")])).is_err());
}

/// Rows as the store writes them, and as other SDKs following the seed schema leave them.
fn realistic_rows() -> Vec<(&'static str, Item)> {
    let at = UnixMillis::new(1_709_550_002_125);
    let rpm = BucketState::full(
        "openai#rpm".parse().unwrap(),
        Bucket::requests(RefillRate::per_minute(500)),
        at,
    );
    let mut stamped = rpm.clone();
    stamped.set_write_id(Some(0x00ab_cdef_0123_4567));
    stamped.version = 42;
    stamped.tokens = "46.5".parse().unwrap();
    stamped.set_recent_writes(RecentWrites {
        writes: vec![(1, at), (u64::MAX, UnixMillis::new(at.as_millis() + 10))],
        forgotten: UnixMillis::new(at.as_millis() - 500),
    });
    let lean = BucketState::full(
        "openai#tpm".parse().unwrap(),
        Bucket::tokens(RefillRate::per_minute(2_000_000)).lean(),
        at,
    );
    let slots = BucketState::full(
        "elevenlabs#concurrent".parse().unwrap(),
        Bucket::concurrent(10),
        at,
    );
    // One a day, refilled a millisecond after it was drained: it carries a part of a
    // billionth.
    let mut daily = BucketState::full(
        "mail#daily".parse().unwrap(),
        Bucket::requests(RefillRate::per_day(1)).with_capacity(10),
        at,
    );
    daily.tokens = Tokens::ZERO;
    daily.set_level(daily.refilled(UnixMillis::new(at.as_millis() + 1)));
    let reserved = BucketState::full(
        "openai#tpm".parse().unwrap(),
        Bucket::tokens(RefillRate::per_minute(2_000_000))
            .with_reserve("interactive".parse().unwrap(), 400_000)
            .with_reserve(
                "standard".parse().unwrap(),
                "0.5".parse::<Tokens>().unwrap(),
            ),
        at,
    );
    let dimension = "elevenlabs#concurrent".parse().unwrap();
    let lease = LeaseRecord {
        slot: true,
        key: LeaseKey::new(&dimension, "a1b2c3d4"),
        dimension,
        cost: Tokens::new(1),
        created_at: at,
        expires_at: UnixMillis::new(at.as_millis() + 30_000),
        caller: "worker-1".to_owned(),
    };
    let n = |v: &str| AttributeValue::N(v.to_owned());
    let s = |v: &str| AttributeValue::S(v.to_owned());
    let other_sdk = HashMap::from([
        ("vendor_dimension".to_owned(), s("openai#rpm")),
        ("capacity".to_owned(), n("100")),
        ("tokens".to_owned(), n("46.666666666666664")),
        ("refill_rate".to_owned(), n("1.6666666666666667")),
        ("last_refill_at".to_owned(), n("1709550002.1234567")),
        ("cost_per_call".to_owned(), n("1")),
        ("limit_type".to_owned(), s("requests")),
        ("version".to_owned(), n("42")),
    ]);
    let seed_lease = HashMap::from([
        ("vendor_dimension".to_owned(), s("lease#openai#rpm#x9")),
        ("dimension".to_owned(), s("openai#rpm")),
        ("cost".to_owned(), n("1")),
        ("created_at".to_owned(), n("1709550002")),
        ("ttl".to_owned(), n("1709550062")),
        ("caller".to_owned(), s("legacy-worker")),
    ]);
    vec![
        ("bucket-full", write_bucket_row(&rpm)),
        ("bucket-written", write_bucket_row(&stamped)),
        ("bucket-lean", write_bucket_row(&lean)),
        ("bucket-concurrent", write_bucket_row(&slots)),
        ("bucket-reserves", write_bucket_row(&reserved)),
        ("bucket-carry", write_bucket_row(&daily)),
        ("bucket-other-sdk", other_sdk),
        ("lease-slot", write_lease_row(&lease)),
        ("lease-other-sdk", seed_lease),
    ]
}

/// The row seeds are the encodings of [`realistic_rows`]; `SLUICE_FUZZ_BLESS=1` rewrites
/// them after a change of the rows or of the encoding.
#[test]
fn row_seeds_are_rows_as_the_store_reads_them() {
    let dir = sluice_fuzz::seed_dir(&row::TARGET);
    let bless = std::env::var_os("SLUICE_FUZZ_BLESS").is_some();
    for (name, item) in realistic_rows() {
        let read = if name.starts_with("bucket") {
            read_bucket_row(&item).err()
        } else {
            read_lease_row(&item).err()
        };
        assert!(read.is_none(), "{name}: {read:?}");
        let bytes = row::encode(&item);
        assert_eq!(row::item(&mut Reader::new(&bytes)), item, "{name}");
        let path = dir.join(name);
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        assert_eq!(
            std::fs::read(&path).ok().as_ref(),
            Some(&bytes),
            "{}: out of date; rerun with SLUICE_FUZZ_BLESS=1",
            path.display()
        );
    }
}
