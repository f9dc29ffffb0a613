//! Vendor rate-limit headers (`sluice_reqwest::VendorLimits::from_headers`).
//!
//! Input: text, one header per line, `name: value`. A first line `@N` picks the `now` the
//! headers are read at from [`nows`] (extremes included). A name that is not one of the
//! real ones is mostly replaced by one of them (picked by its hash), so mutations keep
//! reaching the parsers of values; values are any bytes a header value may hold.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};
use sluice_reqwest::{Signal, VendorLimits};

use crate::Target;
use crate::driver::fnv;

/// The headers target.
pub const TARGET: Target = Target {
    name: "headers",
    dictionary: &[
        b"\n",
        b": ",
        b"@",
        b"ms",
        b"us",
        b"\xc2\xb5s",
        b"h",
        b"m",
        b"s",
        b"ns",
        b".",
        b"Z",
        b"+00:00",
        b"-23:59",
        b"T",
        b"2024-06-01T12:00:30Z",
        b"9999-12-31T23:59:60.999999999Z",
        b"0000-01-01T00:00:00Z",
        b"Sat, 01 Jun 2024 12:00:30 GMT",
        b"18446744073709551615",
        b"340282366920938463463374607431768211455",
        b"0.000000000000000001",
        b"x-ratelimit-reset-tokens: ",
        b"anthropic-ratelimit-tokens-reset: ",
        b"retry-after: ",
        b"retry-after-ms: ",
    ],
    check,
};

/// The header names `from_headers` reads.
pub const NAMES: [&str; 20] = [
    "retry-after",
    "retry-after-ms",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-limit-requests",
    "x-ratelimit-limit-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-tokens-limit",
    "date",
    "content-type",
];

/// The instants headers are read at: realistic, at the epoch, before it, and far after.
pub fn nows() -> [SystemTime; 6] {
    let far = Duration::from_secs(i64::MAX as u64 / 2);
    [
        UNIX_EPOCH + Duration::from_secs(1_717_243_200),
        UNIX_EPOCH,
        UNIX_EPOCH - Duration::from_nanos(1),
        UNIX_EPOCH.checked_sub(far).unwrap_or(UNIX_EPOCH),
        UNIX_EPOCH.checked_add(far).unwrap_or(UNIX_EPOCH),
        UNIX_EPOCH + Duration::from_secs(253_402_300_799),
    ]
}

fn check(data: &[u8]) -> u64 {
    let (now, headers) = decode(data);
    let limits = VendorLimits::from_headers(&headers, now);
    assert_eq!(limits, VendorLimits::from_headers(&headers, now));
    let signals = [
        Signal::Requests,
        Signal::Tokens,
        Signal::InputTokens,
        Signal::OutputTokens,
    ];
    let mut fingerprint = u64::from(limits.retry_after().is_some());
    for (i, signal) in signals.into_iter().enumerate() {
        fingerprint |= u64::from(limits.remaining(signal).is_some()) << (1 + 2 * i);
        fingerprint |= u64::from(limits.reset(signal).is_some()) << (2 + 2 * i);
    }
    match limits.retry_after() {
        Some(wait) => assert_eq!(limits.pause(), Some(wait)),
        None => {
            let exhausted = signals
                .into_iter()
                .filter(|s| limits.remaining(*s) == Some(0))
                .filter_map(|s| limits.reset(s))
                .max();
            assert_eq!(limits.pause(), exhausted);
        }
    }
    assert_eq!(limits.is_empty(), fingerprint == 0);
    fingerprint | (headers.len().min(15) as u64) << 12
}

/// The `now` and the headers an input describes.
pub fn decode(data: &[u8]) -> (SystemTime, HeaderMap) {
    let nows = nows();
    let mut now = nows[0];
    let mut headers = HeaderMap::new();
    for (i, line) in data.split(|b| *b == b'\n').enumerate() {
        if i == 0
            && let Some(pick) = line.strip_prefix(b"@")
        {
            let pick = std::str::from_utf8(pick)
                .ok()
                .and_then(|p| p.trim().parse::<usize>().ok())
                .unwrap_or_else(|| fnv(pick) as usize);
            now = nows[pick % nows.len()];
            continue;
        }
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (line[..colon].trim_ascii(), line[colon + 1..].trim_ascii());
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(header_name(name), value);
        }
    }
    (now, headers)
}

/// A real name as written, else mostly a real one picked by the name's hash.
fn header_name(name: &[u8]) -> HeaderName {
    let lower = name.to_ascii_lowercase();
    let hash = fnv(&lower) as usize;
    let real = || HeaderName::from_static(NAMES[hash % NAMES.len()]);
    if NAMES.iter().any(|n| n.as_bytes() == lower) || hash.is_multiple_of(8) {
        HeaderName::from_bytes(&lower).unwrap_or_else(|_| real())
    } else {
        real()
    }
}
