//! A bucket file's `schedule`: windows read as buckets of the file's with the window's
//! limits, and written back from a bucket's [`Schedule`](crate::Schedule).

use serde::{Deserialize, Serialize};

use super::{Definition, ReserveAmount, ReserveDefinition};
use crate::priority::Reserve;
use crate::text::{Amount, bucket};
use crate::{Limits, Priority, RefillRate, Schedule, Tokens, Window};

/// One scheduled window: `from`/`to` as `HH:MM` UTC, and the limits that differ in it (the
/// others are the bucket's own).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WindowDefinition {
    from: String,
    to: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    capacity: Option<Tokens>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refill: Option<RefillRate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reserves: Option<Vec<ReserveDefinition>>,
}

/// Reserves as a file writes them: tokens.
pub(super) fn reserve_definitions(reserves: &[Reserve]) -> Vec<ReserveDefinition> {
    reserves
        .iter()
        .map(|r| ReserveDefinition {
            priority: r.priority.clone(),
            reserve: ReserveAmount(Amount::Tokens(r.tokens)),
        })
        .collect()
}

/// Reserves as a file gives them, tokens or percentages.
pub(super) fn reserve_amounts(reserves: &[ReserveDefinition]) -> Vec<(Priority, Amount)> {
    reserves
        .iter()
        .map(|r| (r.priority.clone(), r.reserve.0))
        .collect()
}

/// The windows of `schedule`, as a file writes them (a `concurrent` bucket's with no
/// refill).
pub(super) fn window_definitions(schedule: &Schedule, limited: bool) -> Vec<WindowDefinition> {
    schedule
        .windows()
        .iter()
        .map(|w| WindowDefinition {
            from: w.from.to_string(),
            to: w.to.to_string(),
            capacity: Some(w.limits.capacity),
            refill: limited.then_some(w.limits.refill),
            reserves: Some(reserve_definitions(&w.limits.reserves)),
        })
        .collect()
}

/// The windows of `d`, each read as a bucket of `d`'s with the window's limits (`base`:
/// the bucket's own reserves, for a window that gives none).
pub(super) fn windows(d: &Definition, base: &[(Priority, Amount)]) -> Result<Vec<Window>, String> {
    let mut windows = Vec::with_capacity(d.schedule.len());
    for (i, w) in d.schedule.iter().enumerate() {
        let at = |e: String| format!("schedule window {i}: {e}");
        let reserves = w.reserves.as_deref().map(reserve_amounts);
        let limits = bucket(
            d.limit_type,
            w.capacity.or(d.capacity),
            w.refill.or(d.refill),
            d.cost_per_call,
            d.lean,
            reserves.as_deref().unwrap_or(base),
        )
        .map_err(at)?;
        let time = |t: &str| {
            t.parse()
                .map_err(|e: crate::ScheduleError| at(e.to_string()))
        };
        windows.push(Window {
            from: time(&w.from)?,
            to: time(&w.to)?,
            limits: Limits {
                capacity: limits.capacity(),
                refill: limits.refill_rate(),
                reserves: limits.reserves().to_vec(),
            },
        });
    }
    Ok(windows)
}

#[cfg(test)]
mod tests {
    use crate::{Bucket, RefillRate, Tokens, UnixMillis};

    const NIGHTLY: &str = r#"{"type": "tokens", "refill": "100/s", "capacity": 1000,
        "reserves": [{"priority": "interactive", "reserve": "10%"}],
        "schedule": [{"from": "22:00", "to": "06:00", "capacity": 5000, "refill": "500/s"},
                     {"from": "12:00", "to": "13:00", "refill": "50/s",
                      "reserves": [{"priority": "interactive", "reserve": "50%"}]}]}"#;

    #[test]
    fn a_file_s_schedule_is_read_as_windows_of_the_bucket_and_written_back() {
        let b: Bucket = serde_json::from_str(NIGHTLY).unwrap();
        let s = b.schedule().unwrap();
        assert_eq!(s.base().capacity, Tokens::new(1_000));
        let night = &s.windows()[0].limits;
        assert_eq!(night.capacity, Tokens::new(5_000));
        // A window's reserves are the bucket's as written (10%: of the window's capacity),
        // unless it gives its own.
        assert_eq!(night.reserves[0].tokens, Tokens::new(500));
        let noon = &s.windows()[1].limits;
        assert_eq!(
            (noon.capacity, noon.refill),
            (Tokens::new(1_000), RefillRate::per_second(50))
        );
        assert_eq!(noon.reserves[0].tokens, Tokens::new(500));
        // Written as its own limits and windows, whichever holds when it is written.
        let midnight = UnixMillis::new(1_800_057_600_000);
        let applied = b.at(midnight);
        assert_eq!(applied.capacity(), Tokens::new(5_000));
        let text = serde_json::to_string(&applied).unwrap();
        assert_eq!(serde_json::from_str::<Bucket>(&text).unwrap(), b);
    }

    #[test]
    fn a_bad_window_is_refused_with_its_place() {
        for (bad, says) in [
            (r#"{"from": "25:00", "to": "06:00"}"#, "schedule window 0"),
            (
                r#"{"from": "06:00", "to": "06:00"}"#,
                "schedule window 0 begins where it ends",
            ),
            (
                r#"{"from": "06:00", "to": "07:00", "capacity": 0}"#,
                "schedule window 0",
            ),
            (
                r#"{"from": "06:00", "to": "07:00", "colour": "red"}"#,
                "colour",
            ),
        ] {
            let file = format!(r#"{{"type": "requests", "refill": "1/s", "schedule": [{bad}]}}"#);
            let e = serde_json::from_str::<Bucket>(&file)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
