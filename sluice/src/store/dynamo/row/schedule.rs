//! Scheduled limits in a bucket row: sluice's extra `schedule` S, the schedule's text form
//! ([`Schedule`]'s `Display`), absent when the bucket has none. The row's `capacity`,
//! `refill_rate` and reserves are the limits applied last.

use super::{Item, Reader};
use crate::bucket::Schedule;
use crate::store::StoreError;

/// sluice's extra bucket attribute: the bucket's [`Schedule`], as text.
pub(crate) const SCHEDULE: &str = "schedule";

/// Reads the bucket's schedule, if it has one.
pub(super) fn read_schedule(r: &Reader<'_>, item: &Item) -> Result<Option<Schedule>, StoreError> {
    if !item.contains_key(SCHEDULE) {
        return Ok(None);
    }
    r.string(SCHEDULE)?
        .parse()
        .map(Some)
        .map_err(|e: crate::bucket::ScheduleError| r.corrupt(e.to_string()))
}
