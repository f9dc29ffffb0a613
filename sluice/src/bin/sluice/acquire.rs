//! `sluice acquire`: takes a lease by hand, holds it, then releases (or keeps) it; and
//! `sluice peek`: what an acquire would get, taking nothing.

use std::io::Write as _;
use std::time::Duration;

use serde_json::json;
use sluice::{Acquire, Error, Priority, Sluice, Tokens, admin::Peek};

use crate::{Failure, exit, show};

/// How the acquire runs and speaks.
pub(crate) struct How {
    pub(crate) wait: Duration,
    pub(crate) hold: Duration,
    pub(crate) keep: bool,
    pub(crate) json: bool,
}

/// Prints one event: a line of text, or its JSON object.
fn say(how: &How, text: String, event: serde_json::Value) {
    if how.json {
        println!("{event}");
    } else {
        println!("{text}");
    }
    let _ = std::io::stdout().flush();
}

/// The acquire of `cost` (default: the bucket's cost per call) on `dimension`, at
/// `priority` (default: the client's).
pub(crate) fn request(
    dimension: &str,
    cost: Option<Tokens>,
    priority: Option<Priority>,
) -> Acquire {
    match cost {
        Some(cost) => Acquire::with_cost(dimension, cost),
        None => Acquire::new(dimension),
    }
    .or_priority(priority)
}

pub(crate) async fn run(
    sluice: &Sluice,
    dimension: &str,
    request: Acquire,
    how: How,
) -> Result<(), Failure> {
    let lease = match sluice.acquire_within(request, how.wait).await {
        Ok(lease) => lease,
        Err(Error::RetryIn(refusal)) => {
            let delay = refusal.delay;
            return Err(short(&how, dimension, delay, ("", "retry_in", "retry in")));
        }
        Err(e) => return Err(e.into()),
    };
    let id = lease.id().to_string();
    let cost = lease.cost(dimension).unwrap_or_default();
    let expires_in = show::millis(lease.remaining());
    let text = format!(
        "granted {id} (cost {cost}, expires in {})",
        humantime::format_duration(expires_in)
    );
    let event = json!({
        "event": "granted",
        "lease": id,
        "dimension": dimension,
        "cost": show::tokens(cost),
        "expires_in_ms": expires_in.as_millis() as u64,
    });
    say(&how, text, event);
    if how.keep {
        std::mem::forget(lease);
        let text = "kept: the lease expires unreleased".to_owned();
        say(&how, text, json!({"event": "kept", "lease": id}));
        return Ok(());
    }
    if !how.hold.is_zero() {
        tokio::select! {
            () = tokio::time::sleep(how.hold) => {}
            _ = tokio::signal::ctrl_c() => {
                say(&how, "interrupted".to_owned(), json!({"event": "interrupted", "lease": id}));
            }
        }
    }
    lease.release().await?;
    say(
        &how,
        "released".to_owned(),
        json!({"event": "released", "lease": id}),
    );
    Ok(())
}

/// `sluice peek`: prints whether `request` would be granted now, or its RetryIn (then
/// exits with the RetryIn code).
pub(crate) async fn peek(
    sluice: &Sluice,
    dimension: &str,
    request: Acquire,
    json: bool,
) -> Result<(), Failure> {
    let how = How {
        wait: Duration::ZERO,
        hold: Duration::ZERO,
        keep: false,
        json,
    };
    match sluice.peek(request).await? {
        Peek::RetryIn(delay) => Err(short(
            &how,
            dimension,
            delay,
            (
                "would ",
                "would_retry_in",
                "an acquire would be told to retry in",
            ),
        )),
        _ => {
            let event = json!({"event": "would_grant", "dimension": dimension});
            say(&how, "would be granted now".to_owned(), event);
            Ok(())
        }
    }
}

/// Says that `dimension` is short for `delay` (`words`: the line's prefix, the JSON
/// event's name, what the error message says of the delay), and the failure that exits
/// with the RetryIn code.
fn short(
    how: &How,
    dimension: &str,
    delay: Duration,
    (prefix, event, said): (&str, &str, &str),
) -> Failure {
    let wait = humantime::format_duration(delay);
    let text = format!("{prefix}retry in {wait} ({} ms)", delay.as_millis());
    let event = json!({
        "event": event,
        "dimension": dimension,
        "retry_in_ms": delay.as_millis() as u64,
    });
    say(how, text, event);
    Failure {
        code: exit::RETRY,
        message: format!("{dimension} is short; {said} {wait}"),
        pending: false,
    }
}
