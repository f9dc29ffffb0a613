//! Wall-clock time as sluice sees it, and the injectable clock that provides it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::decimal::{self, DecimalError, Rounding};

/// A point in time: whole milliseconds since the Unix epoch.
///
/// Buckets and leases are shared across processes, so their times are wall-clock times.
/// In rows they are written as decimal seconds with a millisecond fraction
/// (`"1709550002.125"`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct UnixMillis(i64);

impl UnixMillis {
    /// The Unix epoch.
    pub const EPOCH: UnixMillis = UnixMillis(0);

    /// The instant `millis` milliseconds after the epoch.
    pub const fn new(millis: i64) -> Self {
        UnixMillis(millis)
    }

    /// The instant `secs` whole seconds after the epoch.
    pub const fn from_secs(secs: i64) -> Self {
        UnixMillis(secs.saturating_mul(1_000))
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// Whole seconds since the epoch, rounded up (DynamoDB's TTL attribute).
    pub const fn as_secs_ceil(self) -> i64 {
        self.0.div_euclid(1_000) + (self.0.rem_euclid(1_000) != 0) as i64
    }

    /// Reads decimal seconds (`"1709550002"`, `"1709550002.125"`), rounding anything finer
    /// than a millisecond as asked.
    pub fn parse_secs(text: &str, rounding: Rounding) -> Result<Self, DecimalError> {
        let millis = decimal::parse(text, 3, rounding)?;
        i64::try_from(millis)
            .map(UnixMillis)
            .map_err(|_| DecimalError::OutOfRange(text.to_owned()))
    }

    /// Decimal seconds with a millisecond fraction, as written in rows.
    pub fn to_secs_string(self) -> String {
        decimal::format(i128::from(self.0), 3)
    }

    /// This instant moved later by `d` (saturating).
    pub fn saturating_add(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        UnixMillis(self.0.saturating_add(ms))
    }

    /// This instant moved earlier by `d` (saturating).
    pub fn saturating_sub(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        UnixMillis(self.0.saturating_sub(ms))
    }

    /// The time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: UnixMillis) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0).max(0).unsigned_abs())
    }
}

impl fmt::Debug for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnixMillis({})", self.to_secs_string())
    }
}

impl fmt::Display for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_secs_string())
    }
}

/// The source of "now" for a [`Sluice`](crate::Sluice) client.
///
/// Bucket arithmetic, lease expiry and every RetryIn read this clock, so tests can set the
/// time by hand with [`ManualClock`]. Waits, backoff and the timers that renew, record and
/// release leases sleep on tokio's time: a test that drives both uses [`TokioClock`] under
/// tokio's paused time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> UnixMillis;

    /// The current time in whole microseconds since the Unix epoch. Only fills of a full
    /// bucket read it: refill timestamps are whole milliseconds, and a fill counts the
    /// refill from the start of its millisecond to this microsecond, so that two fills
    /// within one millisecond both apply when the refill between them covers the first
    /// one's take (see `Commute::or_when`). By default, the
    /// start of [`now`](Self::now)'s millisecond.
    ///
    /// ```
    /// use sluice::{clock::Clock, clock::ManualClock, clock::UnixMillis};
    ///
    /// let clock = ManualClock::new(UnixMillis::new(1_700_000_000_250));
    /// assert_eq!(clock.now_micros(), 1_700_000_000_250_000);
    /// ```
    fn now_micros(&self) -> i64 {
        self.now().as_millis().saturating_mul(1_000)
    }
}

/// The microsecond `micros` (a clock's [`Clock::now_micros`]) within the millisecond `at`:
/// itself when it falls in it, else the nearest end of it (the clock was read twice, or
/// moved between the readings).
pub(crate) fn micros_within(at: UnixMillis, micros: i64) -> i64 {
    let start = at.as_millis().saturating_mul(1_000);
    micros.clamp(start, start.saturating_add(999))
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> UnixMillis {
        UnixMillis(self.now_micros().div_euclid(1_000))
    }

    fn now_micros(&self) -> i64 {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
    }
}

/// A clock that moves only when told to. Clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use sluice::{clock::Clock, clock::ManualClock, clock::UnixMillis};
///
/// let clock = ManualClock::new(UnixMillis::from_secs(1_700_000_000));
/// clock.advance(Duration::from_millis(1_500));
/// assert_eq!(clock.now(), UnixMillis::new(1_700_000_001_500));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock showing `start`.
    pub fn new(start: UnixMillis) -> Self {
        ManualClock(Arc::new(AtomicI64::new(start.0)))
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// The time the clock shows.
    pub fn now(&self) -> UnixMillis {
        UnixMillis(self.0.load(Ordering::SeqCst))
    }

    /// Sets the clock to `t`, which may be earlier than now (to test clock skew).
    pub fn set(&self, t: UnixMillis) {
        self.0.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> UnixMillis {
        ManualClock::now(self)
    }
}

/// A wall clock that advances with tokio's clock: with `tokio::time::pause` it moves only
/// as tokio's paused time does, so sleeps, timeouts and bucket refill stay in step.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: UnixMillis,
    started: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that reads `origin` now and moves with tokio's time from here on.
    pub fn starting_at(origin: UnixMillis) -> Self {
        TokioClock {
            origin,
            started: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> UnixMillis {
        self.origin.saturating_add(self.started.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_trip_with_millisecond_fractions() {
        let t = UnixMillis::parse_secs("1709550002.125", Rounding::Exact).unwrap();
        assert_eq!(t, UnixMillis::new(1_709_550_002_125));
        assert_eq!(t.to_secs_string(), "1709550002.125");
        assert_eq!(
            UnixMillis::from_secs(1_709_550_002).to_secs_string(),
            "1709550002"
        );
        assert_eq!(
            UnixMillis::parse_secs("1709550002.1234", Rounding::Ceil).unwrap(),
            UnixMillis::new(1_709_550_002_124)
        );
        assert_eq!(t.as_secs_ceil(), 1_709_550_003);
        assert_eq!(UnixMillis::from_secs(5).as_secs_ceil(), 5);
    }

    #[test]
    fn microseconds_stay_within_their_millisecond() {
        let at = UnixMillis::new(1_000);
        assert_eq!(micros_within(at, 1_000_250), 1_000_250);
        assert_eq!(micros_within(at, 1_001_250), 1_000_999);
        assert_eq!(micros_within(at, 999_999), 1_000_000);
        let clock = SystemClock;
        let (micros, now) = (clock.now_micros(), clock.now());
        assert!(now.as_millis() >= micros / 1_000);
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let clock = TokioClock::starting_at(UnixMillis::from_secs(10));
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(clock.now(), UnixMillis::new(10_250));
    }
}
