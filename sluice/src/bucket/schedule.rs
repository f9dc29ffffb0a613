//! Scheduled limits: a bucket whose capacity, refill rate and reserves change by time of
//! day (UTC), applied by the reconciler and by `sluice apply`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::{Bucket, BucketError};
use crate::clock::UnixMillis;
use crate::priority::{Priority, Reserve};
use crate::rate::RefillRate;
use crate::tokens::Tokens;

const MINUTES_PER_DAY: u16 = 24 * 60;
const MILLIS_PER_DAY: i64 = 86_400_000;

/// A time of day in UTC, to the minute: `00:00` to `24:00` (the end of the day).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimeOfDay(u16);

impl TimeOfDay {
    /// `hour`:`minute`, UTC; `None` beyond `24:00`.
    pub fn new(hour: u8, minute: u8) -> Option<TimeOfDay> {
        let minutes = u16::from(hour) * 60 + u16::from(minute);
        (minute < 60 && minutes <= MINUTES_PER_DAY).then_some(TimeOfDay(minutes))
    }

    /// Minutes since midnight.
    pub fn minutes(self) -> u16 {
        self.0
    }
}

impl fmt::Display for TimeOfDay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02}:{:02}", self.0 / 60, self.0 % 60)
    }
}

/// Text that is not a schedule, a window or a time of day.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a schedule: {reason}")]
pub struct ScheduleError {
    /// The text read.
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

fn schedule_error(text: &str, reason: impl Into<String>) -> ScheduleError {
    ScheduleError {
        text: text.to_owned(),
        reason: reason.into(),
    }
}

impl FromStr for TimeOfDay {
    type Err = ScheduleError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parsed = s
            .trim()
            .split_once(':')
            .filter(|(h, m)| h.len() == 2 && m.len() == 2)
            .and_then(|(h, m)| Some((h.parse().ok()?, m.parse().ok()?)))
            .and_then(|(h, m)| TimeOfDay::new(h, m));
        parsed
            .ok_or_else(|| schedule_error(s, "expected a UTC time of day `HH:MM`, 00:00 to 24:00"))
    }
}

/// What a schedule sets: capacity, refill rate and reserves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The capacity.
    pub capacity: Tokens,
    /// The refill rate.
    pub refill: RefillRate,
    /// The reserves, highest priority first.
    pub reserves: Vec<Reserve>,
}

/// A daily window, `from` until `to` (UTC; past midnight when `to` is earlier), with the
/// limits that hold in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// When it begins, each day.
    pub from: TimeOfDay,
    /// When it ends (excluded).
    pub to: TimeOfDay,
    /// The limits inside it.
    pub limits: Limits,
}

impl Window {
    /// Whether it holds at `minute` of the day.
    fn contains(&self, minute: u16) -> bool {
        let (from, to) = (self.from.0, self.to.0);
        if from < to {
            (from..to).contains(&minute)
        } else {
            minute >= from || minute < to
        }
    }
}

/// A bucket's limits by time of day: its own outside every window, a window's inside it
/// (the first listed, where they overlap). See [`Bucket::with_schedule`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    base: Limits,
    windows: Vec<Window>,
}

impl Schedule {
    /// The limits outside every window.
    pub fn base(&self) -> &Limits {
        &self.base
    }

    /// The windows, in the order they were given.
    pub fn windows(&self) -> &[Window] {
        &self.windows
    }

    /// The limits that hold at `now`.
    pub fn limits_at(&self, now: UnixMillis) -> &Limits {
        let minute = (now.as_millis().rem_euclid(MILLIS_PER_DAY) / 60_000) as u16;
        self.windows
            .iter()
            .find(|w| w.contains(minute))
            .map_or(&self.base, |w| &w.limits)
    }

    /// The next instant after `now` when the limits change, and the limits from then;
    /// `None` when they never do.
    pub fn next_change(&self, now: UnixMillis) -> Option<(UnixMillis, &Limits)> {
        let today = now.as_millis().div_euclid(MILLIS_PER_DAY) * MILLIS_PER_DAY;
        let current = self.limits_at(now);
        let mut boundaries: Vec<UnixMillis> = (0..=2i64)
            .flat_map(|day| {
                self.windows.iter().flat_map(move |w| {
                    [w.from, w.to].map(|t| {
                        UnixMillis::new(today + day * MILLIS_PER_DAY + i64::from(t.0) * 60_000)
                    })
                })
            })
            .filter(|t| *t > now)
            .collect();
        boundaries.sort();
        boundaries
            .into_iter()
            .map(|t| (t, self.limits_at(t)))
            .find(|(_, limits)| *limits != current)
    }
}

impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "capacity={} refill={}", self.capacity, self.refill)?;
        for (i, r) in self.reserves.iter().enumerate() {
            let sep = if i == 0 { " reserves=" } else { "," };
            write!(f, "{sep}{}:{}", r.priority, r.tokens)?;
        }
        Ok(())
    }
}

/// The text form, as a bucket row keeps it: `base capacity=… refill=…[ reserves=p:n,…]`,
/// then `; HH:MM-HH:MM capacity=… refill=…` per window.
impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "base {}", self.base)?;
        for w in &self.windows {
            write!(f, "; {}-{} {}", w.from, w.to, w.limits)?;
        }
        Ok(())
    }
}

impl FromStr for Limits {
    type Err = ScheduleError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (mut capacity, mut refill, mut reserves) = (None, None, Vec::new());
        for field in s.split_whitespace() {
            let bad = |what: &str| schedule_error(s, format!("bad {what} in `{field}`"));
            match field.split_once('=') {
                Some(("capacity", v)) => capacity = Some(v.parse().map_err(|_| bad("capacity"))?),
                Some(("refill", v)) => refill = Some(v.parse().map_err(|_| bad("refill"))?),
                Some(("reserves", v)) => {
                    for r in v.split(',') {
                        let (p, t) = r.split_once(':').ok_or_else(|| bad("reserve"))?;
                        reserves.push(Reserve {
                            priority: Priority::new(p).map_err(|_| bad("priority"))?,
                            tokens: t.parse().map_err(|_| bad("reserve"))?,
                        });
                    }
                }
                _ => return Err(bad("field")),
            }
        }
        Ok(Limits {
            capacity: capacity.ok_or_else(|| schedule_error(s, "no capacity"))?,
            refill: refill.ok_or_else(|| schedule_error(s, "no refill"))?,
            reserves,
        })
    }
}

impl FromStr for Schedule {
    type Err = ScheduleError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split(';').map(str::trim);
        let base = parts
            .next()
            .and_then(|b| b.strip_prefix("base "))
            .ok_or_else(|| schedule_error(s, "expected `base …` first"))?
            .parse()?;
        let mut windows = Vec::new();
        for part in parts {
            let (times, limits) = part
                .split_once(' ')
                .ok_or_else(|| schedule_error(part, "expected `HH:MM-HH:MM` and limits"))?;
            let (from, to) = times
                .split_once('-')
                .ok_or_else(|| schedule_error(times, "expected `HH:MM-HH:MM`"))?;
            windows.push(Window {
                from: from.parse()?,
                to: to.parse()?,
                limits: limits.parse()?,
            });
        }
        Ok(Schedule { base, windows })
    }
}

impl Bucket {
    /// Gives the bucket other limits in daily windows (UTC): outside every window it has
    /// the capacity, refill rate and reserves it has now (call this last), inside one the
    /// window's. Kept in the bucket's row; the reconciler (`sluice reconcile`, the Lambda)
    /// and `sluice apply` make each change when it falls due, once however many run. A
    /// window from 22:00 to 06:00 runs past midnight.
    ///
    /// ```
    /// use sluice::{Bucket, bucket::Limits, RefillRate, bucket::TimeOfDay, clock::UnixMillis, bucket::Window};
    ///
    /// // Five times the allowance at night, for batch jobs.
    /// let night = Window {
    ///     from: "22:00".parse()?,
    ///     to: "06:00".parse()?,
    ///     limits: Limits { capacity: 5_000.into(), refill: RefillRate::per_second(500), reserves: vec![] },
    /// };
    /// let bucket = Bucket::tokens(RefillRate::per_second(100)).with_capacity(1_000).with_schedule(vec![night]);
    /// let midnight = UnixMillis::from_secs(1_800_057_600); // 00:00 UTC
    /// assert_eq!(bucket.at(midnight).capacity(), 5_000.into());
    /// let noon = UnixMillis::from_secs(1_800_057_600 + 12 * 3_600);
    /// assert_eq!(bucket.at(noon).capacity(), 1_000.into());
    /// let (next, _) = bucket.schedule().unwrap().next_change(noon).unwrap();
    /// assert_eq!(next, UnixMillis::from_secs(1_800_057_600 + 22 * 3_600));
    /// # Ok::<(), sluice::error::ScheduleError>(())
    /// ```
    pub fn with_schedule(mut self, windows: Vec<Window>) -> Self {
        let base = self.limits();
        self.schedule = (!windows.is_empty()).then(|| Arc::new(Schedule { base, windows }));
        self
    }

    /// The bucket with its schedule as stored (its limits as they are: see [`at`](Self::at)).
    #[cfg_attr(not(feature = "dynamodb"), allow(dead_code))]
    pub(crate) fn with_stored_schedule(mut self, schedule: Option<Schedule>) -> Self {
        self.schedule = schedule.map(Arc::new);
        self
    }

    /// The bucket's schedule, if it has one.
    pub fn schedule(&self) -> Option<&Schedule> {
        self.schedule.as_deref()
    }

    /// The bucket as its schedule has it at `now` (itself when it has none).
    pub fn at(&self, now: UnixMillis) -> Bucket {
        match &self.schedule {
            Some(schedule) => self.with_limits(schedule.limits_at(now)),
            None => self.clone(),
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            capacity: self.capacity,
            refill: self.refill_rate,
            reserves: self.reserves.clone(),
        }
    }

    /// The bucket with `limits` (its schedule kept).
    #[cfg(feature = "serde")]
    pub(crate) fn with_limits_of(self, limits: &Limits) -> Bucket {
        self.with_limits(limits)
    }

    fn with_limits(&self, limits: &Limits) -> Bucket {
        Bucket {
            capacity: limits.capacity,
            refill_rate: limits.refill,
            reserves: limits.reserves.clone(),
            ..self.clone()
        }
    }

    /// Checks each window's limits as the bucket's own, and that no window is empty.
    pub(super) fn validate_schedule(&self) -> Result<(), BucketError> {
        let Some(schedule) = &self.schedule else {
            return Ok(());
        };
        for (i, w) in schedule.windows.iter().enumerate() {
            if w.from == w.to || w.from.0 >= MINUTES_PER_DAY {
                return Err(BucketError::EmptyWindow(i));
            }
            let mut bucket = self.with_limits(&w.limits);
            bucket.schedule = None;
            bucket.validate().map_err(|e| BucketError::Window {
                window: i,
                source: Box::new(e),
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
