//! What vendors say about their limits in response headers.
//!
//! Parsing is tolerant: a malformed value is skipped with a `tracing` warning, never an
//! error, so a vendor changing its format can only make sluice learn less.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;

/// Which of a vendor's limits a header family (and a route's dimension) describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Signal {
    /// Requests (`x-ratelimit-*-requests`, `anthropic-ratelimit-requests-*`).
    Requests,
    /// Tokens (`x-ratelimit-*-tokens`, `anthropic-ratelimit-tokens-*`).
    Tokens,
    /// Input tokens (`anthropic-ratelimit-input-tokens-*`).
    InputTokens,
    /// Output tokens (`anthropic-ratelimit-output-tokens-*`).
    OutputTokens,
}

impl Signal {
    const ALL: [Signal; 4] = [
        Signal::Requests,
        Signal::Tokens,
        Signal::InputTokens,
        Signal::OutputTokens,
    ];

    /// OpenAI's suffix (`x-ratelimit-remaining-{suffix}`), where it has one.
    fn openai(self) -> Option<&'static str> {
        match self {
            Signal::Requests => Some("requests"),
            Signal::Tokens => Some("tokens"),
            Signal::InputTokens | Signal::OutputTokens => None,
        }
    }

    /// Anthropic's infix (`anthropic-ratelimit-{infix}-remaining`).
    fn anthropic(self) -> &'static str {
        match self {
            Signal::Requests => "requests",
            Signal::Tokens => "tokens",
            Signal::InputTokens => "input-tokens",
            Signal::OutputTokens => "output-tokens",
        }
    }
}

/// The rate-limit facts found in one response's headers.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderMap;
/// use sluice_reqwest::{Signal, VendorLimits};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-ratelimit-remaining-requests", "59".parse().unwrap());
/// headers.insert("x-ratelimit-reset-requests", "6m0s".parse().unwrap());
/// headers.insert("retry-after", "7".parse().unwrap());
/// let limits = VendorLimits::from_headers(&headers, SystemTime::now());
/// assert_eq!(limits.remaining(Signal::Requests), Some(59));
/// assert_eq!(limits.reset(Signal::Requests), Some(Duration::from_secs(360)));
/// assert_eq!(limits.pause(), Some(Duration::from_secs(7)));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VendorLimits {
    retry_after: Option<Duration>,
    remaining: Vec<(Signal, u64)>,
    reset: Vec<(Signal, Duration)>,
}

impl VendorLimits {
    /// Reads `retry-after-ms`, `retry-after` (seconds or an HTTP date), OpenAI's
    /// `x-ratelimit-{remaining,reset}-{requests,tokens}` and Anthropic's
    /// `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{remaining,reset}`.
    /// Absolute times are turned into delays from `now`.
    pub fn from_headers(headers: &HeaderMap, now: SystemTime) -> VendorLimits {
        let mut limits = VendorLimits {
            retry_after: header(headers, "retry-after-ms", parse_millis)
                .or_else(|| header(headers, "retry-after", |v| parse_retry_after(v, now))),
            ..VendorLimits::default()
        };
        for signal in Signal::ALL {
            let anthropic = signal.anthropic();
            let remaining = signal
                .openai()
                .and_then(|s| header(headers, &format!("x-ratelimit-remaining-{s}"), parse_count))
                .or_else(|| {
                    header(
                        headers,
                        &format!("anthropic-ratelimit-{anthropic}-remaining"),
                        parse_count,
                    )
                });
            if let Some(n) = remaining {
                limits.remaining.push((signal, n));
            }
            let reset = signal
                .openai()
                .and_then(|s| {
                    header(
                        headers,
                        &format!("x-ratelimit-reset-{s}"),
                        parse_go_duration,
                    )
                })
                .or_else(|| {
                    header(
                        headers,
                        &format!("anthropic-ratelimit-{anthropic}-reset"),
                        |v| parse_rfc3339(v).map(|at| delay_until(at, now)),
                    )
                });
            if let Some(d) = reset {
                limits.reset.push((signal, d));
            }
        }
        limits
    }

    /// The vendor's `retry-after` (or `retry-after-ms`), if it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// How many units of `signal` the vendor says are left.
    pub fn remaining(&self, signal: Signal) -> Option<u64> {
        self.remaining
            .iter()
            .find(|(s, _)| *s == signal)
            .map(|(_, n)| *n)
    }

    /// How long until the vendor's `signal` limit resets.
    pub fn reset(&self, signal: Signal) -> Option<Duration> {
        self.reset
            .iter()
            .find(|(s, _)| *s == signal)
            .map(|(_, d)| *d)
    }

    /// How long the vendor asks callers to stay away: `retry-after` when sent, else the
    /// longest reset among limits it reports as exhausted (none left).
    pub fn pause(&self) -> Option<Duration> {
        self.retry_after.or_else(|| {
            self.reset
                .iter()
                .filter(|(s, _)| self.remaining(*s) == Some(0))
                .map(|(_, d)| *d)
                .max()
        })
    }

    /// Whether the headers said anything at all about limits.
    pub fn is_empty(&self) -> bool {
        self.retry_after.is_none() && self.remaining.is_empty() && self.reset.is_empty()
    }
}

/// Reads one header with `parse`; a value that is not text or does not parse is skipped
/// with a warning.
fn header<T>(headers: &HeaderMap, name: &str, parse: impl Fn(&str) -> Option<T>) -> Option<T> {
    let value = headers.get(name)?;
    let parsed = value.to_str().ok().map(str::trim).and_then(parse);
    if parsed.is_none() {
        tracing::warn!(header = name, value = ?value, "ignoring a malformed rate-limit header");
    }
    parsed
}

fn delay_until(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now).unwrap_or(Duration::ZERO)
}

fn parse_count(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A non-negative decimal number of `unit_nanos`, rounded up to the nanosecond.
fn parse_decimal(text: &str, unit_nanos: u128) -> Option<u128> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(fraction) || fraction.len() > 18 {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut nanos = whole.checked_mul(unit_nanos)?;
    if !fraction.is_empty() {
        let scale = 10u128.pow(fraction.len() as u32);
        let numerator = fraction.parse::<u128>().ok()?.checked_mul(unit_nanos)?;
        nanos = nanos.checked_add(numerator.div_ceil(scale))?;
    }
    Some(nanos)
}

fn nanos_to_duration(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// `retry-after-ms`: milliseconds, possibly fractional.
fn parse_millis(text: &str) -> Option<Duration> {
    nanos_to_duration(parse_decimal(text, 1_000_000)?)
}

/// `retry-after`: delay-seconds (a fraction is accepted), or an HTTP date.
pub(crate) fn parse_retry_after(text: &str, now: SystemTime) -> Option<Duration> {
    if let Some(nanos) = parse_decimal(text, 1_000_000_000) {
        return nanos_to_duration(nanos);
    }
    httpdate::parse_http_date(text)
        .ok()
        .map(|at| delay_until(at, now))
}

/// A Go-style duration as OpenAI sends it: `1s`, `6m0s`, `12ms`, `1h2m3.5s`, `250us`.
pub(crate) fn parse_go_duration(text: &str) -> Option<Duration> {
    const UNITS: [(&str, u128); 8] = [
        ("ns", 1),
        ("us", 1_000),
        ("µs", 1_000),
        ("μs", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
        ("m", 60_000_000_000),
        ("h", 3_600_000_000_000),
    ];
    let mut rest = text;
    let mut total: u128 = 0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() {
            return None;
        }
        // The longest unit that matches: `ms` before `m`.
        let (unit, nanos) = UNITS
            .iter()
            .filter(|(u, _)| tail.starts_with(u))
            .max_by_key(|(u, _)| u.len())?;
        total = total.checked_add(parse_decimal(number, *nanos)?)?;
        rest = &tail[unit.len()..];
    }
    nanos_to_duration(total)
}

/// An RFC 3339 timestamp (`2024-06-01T12:00:30Z`, `2024-06-01T12:00:30.5+02:00`).
pub(crate) fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let bytes = text.as_bytes();
    if bytes.len() < 20 || !text.is_ascii() {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(range)?;
        s.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if bytes[4] != b'-'
        || bytes[7] != b'-'
        || !matches!(bytes[10], b'T' | b't' | b' ')
        || bytes[13] != b':'
        || bytes[16] != b':'
    {
        return None;
    }
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut nanos: i64 = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let len = fraction
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(fraction.len());
        if len == 0 {
            return None;
        }
        let digits = &fraction[..len.min(9)];
        nanos = digits.parse::<i64>().ok()? * 10i64.pow(9 - digits.len() as u32);
        rest = &fraction[len..];
    }
    let offset_secs = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return None;
            }
            let h: i64 = rest[1..3].parse().ok()?;
            let m: i64 = rest[4..6].parse().ok()?;
            if h > 23 || m > 59 {
                return None;
            }
            sign * (h * 3_600 + m * 60)
        }
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_secs;
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos as u32))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn go_durations_as_openai_sends_them() {
        let ms = Duration::from_millis;
        let cases: &[(&str, Option<Duration>)] = &[
            ("1s", Some(ms(1_000))),
            ("6m0s", Some(ms(360_000))),
            ("12ms", Some(ms(12))),
            ("1h2m3.5s", Some(ms(3_723_500))),
            ("0.5s", Some(ms(500))),
            ("250us", Some(Duration::from_micros(250))),
            ("250µs", Some(Duration::from_micros(250))),
            ("7ns", Some(Duration::from_nanos(7))),
            ("0s", Some(Duration::ZERO)),
            ("1.0000000001s", Some(Duration::new(1, 1))),
            ("", None),
            ("s", None),
            ("12", None),
            ("1x", None),
            ("-1s", None),
            ("1s ", None),
            ("1..5s", None),
            ("99999999999999999999999h", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_go_duration(text), *want, "{text:?}");
        }
    }

    #[test]
    fn rfc3339_timestamps_as_anthropic_sends_them() {
        let cases: &[(&str, Option<SystemTime>)] = &[
            ("1970-01-01T00:00:00Z", Some(at(0))),
            ("2024-06-01T12:00:30Z", Some(at(1_717_243_230))),
            ("2024-06-01t12:00:30z", Some(at(1_717_243_230))),
            ("2024-06-01T14:00:30+02:00", Some(at(1_717_243_230))),
            ("2024-06-01T11:30:30-00:30", Some(at(1_717_243_230))),
            (
                "2024-06-01T12:00:30.25Z",
                Some(at(1_717_243_230) + Duration::from_millis(250)),
            ),
            ("2024-02-29T00:00:00Z", Some(at(1_709_164_800))),
            ("2023-02-29T00:00:00Z", None),
            ("2024-13-01T00:00:00Z", None),
            ("2024-06-01T24:00:00Z", None),
            ("2024-06-01T12:00:30", None),
            ("2024-06-01T12:00:30+0200", None),
            ("2024-06-01 12:00:30Z", Some(at(1_717_243_230))),
            ("2024-06-01T12:00:30.Z", None),
            ("1969-12-31T23:59:59Z", None),
            ("next tuesday", None),
            ("2024-06-01T12:0a:30Z", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_rfc3339(text), *want, "{text:?}");
        }
    }

    #[test]
    fn retry_after_in_seconds_or_as_an_http_date() {
        let now = at(1_717_243_200);
        let cases: &[(&str, Option<Duration>)] = &[
            ("7", Some(Duration::from_secs(7))),
            ("0", Some(Duration::ZERO)),
            ("1.5", Some(Duration::from_millis(1_500))),
            (
                "Sat, 01 Jun 2024 12:00:30 GMT",
                Some(Duration::from_secs(30)),
            ),
            // A date in the past means "now".
            ("Sat, 01 Jun 2024 11:00:00 GMT", Some(Duration::ZERO)),
            ("-3", None),
            ("soon", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_retry_after(text, now), *want, "{text:?}");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(value.as_bytes()).unwrap(),
            );
        }
        map
    }

    #[test]
    fn openai_headers() {
        let limits = VendorLimits::from_headers(
            &headers(&[
                ("x-ratelimit-limit-requests", "60"),
                ("x-ratelimit-remaining-requests", "59"),
                ("x-ratelimit-reset-requests", "1s"),
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "6m0s"),
            ]),
            at(0),
        );
        assert_eq!(limits.remaining(Signal::Requests), Some(59));
        assert_eq!(limits.remaining(Signal::Tokens), Some(0));
        assert_eq!(limits.reset(Signal::Requests), Some(Duration::from_secs(1)));
        assert_eq!(limits.reset(Signal::Tokens), Some(Duration::from_secs(360)));
        assert_eq!(limits.retry_after(), None);
        // Without retry-after, the pause is the reset of what ran out.
        assert_eq!(limits.pause(), Some(Duration::from_secs(360)));
    }

    #[test]
    fn anthropic_headers() {
        let now = at(1_717_243_200);
        let limits = VendorLimits::from_headers(
            &headers(&[
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", "2024-06-01T12:00:30Z"),
                ("anthropic-ratelimit-tokens-remaining", "12000"),
                ("anthropic-ratelimit-tokens-reset", "2024-06-01T12:01:00Z"),
                ("anthropic-ratelimit-input-tokens-remaining", "8000"),
                ("anthropic-ratelimit-output-tokens-remaining", "4000"),
                ("retry-after", "12"),
            ]),
            now,
        );
        assert_eq!(limits.remaining(Signal::Requests), Some(0));
        assert_eq!(
            limits.reset(Signal::Requests),
            Some(Duration::from_secs(30))
        );
        assert_eq!(limits.remaining(Signal::Tokens), Some(12_000));
        assert_eq!(limits.reset(Signal::Tokens), Some(Duration::from_secs(60)));
        assert_eq!(limits.remaining(Signal::InputTokens), Some(8_000));
        assert_eq!(limits.remaining(Signal::OutputTokens), Some(4_000));
        assert_eq!(limits.pause(), Some(Duration::from_secs(12)));
    }

    #[test]
    fn retry_after_ms_wins_over_retry_after() {
        let limits = VendorLimits::from_headers(
            &headers(&[("retry-after-ms", "1500"), ("retry-after", "2")]),
            at(0),
        );
        assert_eq!(limits.retry_after(), Some(Duration::from_millis(1_500)));
    }

    #[test]
    fn malformed_values_are_ignored_one_by_one() {
        let limits = VendorLimits::from_headers(
            &headers(&[
                ("x-ratelimit-remaining-requests", "lots"),
                ("x-ratelimit-reset-requests", "1 second"),
                ("x-ratelimit-remaining-tokens", "-5"),
                ("x-ratelimit-reset-tokens", "2s"),
                ("anthropic-ratelimit-requests-reset", "yesterday"),
                ("retry-after", "in 2s"),
                ("retry-after-ms", "fast"),
            ]),
            at(0),
        );
        assert_eq!(limits.remaining(Signal::Requests), None);
        assert_eq!(limits.reset(Signal::Requests), None);
        assert_eq!(limits.remaining(Signal::Tokens), None);
        assert_eq!(limits.reset(Signal::Tokens), Some(Duration::from_secs(2)));
        assert_eq!(limits.retry_after(), None);
        assert_eq!(limits.pause(), None);
        assert!(!limits.is_empty());
        assert!(VendorLimits::from_headers(&HeaderMap::new(), at(0)).is_empty());
    }

    #[test]
    fn a_header_that_is_not_text_is_ignored() {
        let mut map = HeaderMap::new();
        map.insert(
            "x-ratelimit-remaining-requests",
            http::HeaderValue::from_bytes(b"5\xff").unwrap(),
        );
        assert_eq!(
            VendorLimits::from_headers(&map, at(0)).remaining(Signal::Requests),
            None
        );
    }
}
