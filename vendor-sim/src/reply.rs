//! One answer: admission against the key's limits, then the completion, whole or streamed.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

use crate::{State, VendorSim};

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What a request asks for, as the vendor counts it.
struct Ask {
    key: String,
    model: String,
    prompt: u64,
    max_tokens: u64,
    stream: bool,
    include_usage: bool,
}

impl Ask {
    fn read(key: String, body: &[u8]) -> Ask {
        let json: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let chars = json.get("messages").map_or(0, text_chars);
        Ask {
            key,
            model: json
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or("sim-1")
                .to_owned(),
            prompt: chars.div_ceil(4),
            max_tokens: ["max_tokens", "max_completion_tokens"]
                .iter()
                .find_map(|k| json.get(*k)?.as_u64())
                .unwrap_or(16),
            stream: json.get("stream").and_then(Value::as_bool) == Some(true),
            include_usage: json
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                == Some(true),
        }
    }

    /// What admission charges: the prompt and all it may generate.
    fn charge(&self) -> u64 {
        self.prompt + self.max_tokens
    }
}

fn text_chars(value: &Value) -> u64 {
    match value {
        Value::String(s) => s.chars().count() as u64,
        Value::Array(items) => items.iter().map(text_chars).sum(),
        Value::Object(fields) => fields.values().map(text_chars).sum(),
        _ => 0,
    }
}

/// The key's limits as its headers report them, right after admission (or refusal).
struct Headers(Vec<(&'static str, String)>);

/// Ends a call: fewer calls in flight, and the token charge corrected to the usage.
struct Finish {
    state: Arc<Mutex<State>>,
    key: String,
    refund: u64,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let key = state.key(&self.key, now);
        key.in_flight = key.in_flight.saturating_sub(1);
        key.tokens.give_back(self.refund, now);
        state.stats.tokens = state.stats.tokens.saturating_sub(self.refund);
    }
}

impl VendorSim {
    pub(crate) async fn answer(&self, req: Request<Incoming>) -> Response<Body> {
        let key = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim_start_matches("Bearer ").to_owned())
            .unwrap_or_default();
        let body = match req.into_body().collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => Bytes::new(),
        };
        let ask = Ask::read(key, &body);
        let (admitted, headers, served, config) = self.admit(&ask);
        let Some(completion) = admitted else {
            return respond(
                StatusCode::TOO_MANY_REQUESTS,
                headers,
                "application/json",
                full(
                    json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}),
                ),
            );
        };
        let jitter_ms = config.jitter.as_millis() as u64;
        let jitter = if jitter_ms == 0 {
            0
        } else {
            served.wrapping_mul(7_919) % (jitter_ms + 1)
        };
        tokio::time::sleep(config.latency + Duration::from_millis(jitter)).await;
        let finish = Finish {
            state: self.state.clone(),
            key: ask.key.clone(),
            refund: ask.max_tokens - completion,
        };
        let usage = json!({
            "prompt_tokens": ask.prompt,
            "completion_tokens": completion,
            "total_tokens": ask.prompt + completion,
        });
        if !ask.stream {
            drop(finish);
            let body = json!({
                "id": format!("chatcmpl-sim-{served}"),
                "object": "chat.completion",
                "created": created(),
                "model": ask.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": usage,
            });
            return respond(StatusCode::OK, headers, "application/json", full(body));
        }
        let events = events(
            &ask,
            served,
            usage,
            config.stream_chunks,
            config.chunk_delay,
            finish,
        );
        respond(StatusCode::OK, headers, "text/event-stream", events)
    }

    /// Admits `ask` or refuses it: the completion tokens it will use when admitted, the
    /// headers to send, the request's number and the vendor's configuration.
    fn admit(&self, ask: &Ask) -> (Option<u64>, Headers, u64, crate::VendorConfig) {
        let mut state = self.lock();
        let now = Instant::now();
        let at = now.saturating_duration_since(state.started);
        let config = state.config.clone();
        state.served += 1;
        let served = state.served;
        let key = state.key(&ask.key, now);
        let busy = config.concurrent.is_some_and(|cap| key.in_flight >= cap);
        let requests_wait = key.requests.wait_for(1, now);
        let tokens_wait = key.tokens.wait_for(ask.charge(), now);
        let wait = requests_wait.max(tokens_wait);
        let admitted = !busy && wait.is_none();
        let limit = match (busy, requests_wait) {
            (true, _) => "concurrency",
            (false, Some(_)) => "requests",
            (false, None) => "tokens",
        };
        if admitted {
            key.requests.take(1, now);
            key.tokens.take(ask.charge(), now);
            key.in_flight += 1;
        }
        let in_flight = key.in_flight;
        let mut headers = vec![
            ("x-ratelimit-limit-requests", config.rpm.to_string()),
            ("x-ratelimit-limit-tokens", config.tpm.to_string()),
            (
                "x-ratelimit-remaining-requests",
                key.requests.remaining(now).to_string(),
            ),
            (
                "x-ratelimit-remaining-tokens",
                key.tokens.remaining(now).to_string(),
            ),
            (
                "x-ratelimit-reset-requests",
                go_duration(key.requests.full_in(now)),
            ),
            (
                "x-ratelimit-reset-tokens",
                go_duration(key.tokens.full_in(now)),
            ),
        ];
        if !admitted {
            let wait = wait.unwrap_or(Duration::from_millis(100));
            headers.push(("retry-after-ms", wait.as_millis().max(1).to_string()));
        }
        let second = state.stats.second(at);
        if admitted {
            second.accepted += 1;
            state.stats.accepted += 1;
            state.stats.admitted_ms.push(at.as_millis() as u64);
            state.stats.tokens += ask.charge();
            state.stats.max_in_flight = state.stats.max_in_flight.max(in_flight);
        } else {
            second.rejected += 1;
            state.stats.rejected += 1;
            state.stats.refused.push((at.as_millis() as u64, limit));
        }
        let completion =
            (ask.max_tokens * config.completion_percent / 100).clamp(1, ask.max_tokens.max(1));
        (
            admitted.then_some(completion),
            Headers(headers),
            served,
            config,
        )
    }
}

/// A streamed completion: `chunks` content events, `delay` apart, then the usage event if
/// asked for, then `[DONE]`; the call is in flight until the stream ends or is dropped.
fn events(
    ask: &Ask,
    served: u64,
    usage: Value,
    chunks: u32,
    delay: Duration,
    finish: Finish,
) -> Body {
    let id = format!("chatcmpl-sim-{served}");
    let usage = ask
        .include_usage
        .then(|| json!({"id": id, "choices": [], "usage": usage}));
    let content = json!({"id": id, "choices": [{"index": 0, "delta": {"content": "ok "}}]});
    let stream = futures::stream::unfold((0u32, Some(finish)), move |(i, finish)| {
        let (usage, content) = (usage.clone(), content.clone());
        async move {
            let finish = finish?;
            let event = if i < chunks {
                tokio::time::sleep(delay).await;
                Some(content)
            } else if i == chunks {
                usage
            } else {
                return Some((Bytes::from_static(b"data: [DONE]\n\n"), (i, None)));
            };
            let text = event.map_or_else(String::new, |e| format!("data: {e}\n\n"));
            Some((Bytes::from(text), (i + 1, Some(finish))))
        }
    });
    StreamBody::new(stream.map(|b| Ok::<_, Infallible>(Frame::data(b)))).boxed_unsync()
}

fn full(json: Value) -> Body {
    Full::new(Bytes::from(json.to_string())).boxed_unsync()
}

fn respond(status: StatusCode, headers: Headers, content_type: &str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let map = response.headers_mut();
    map.insert(
        hyper::header::CONTENT_TYPE,
        content_type.parse().expect("a valid content type"),
    );
    for (name, value) in headers.0 {
        if let Ok(value) = value.parse() {
            map.insert(name, value);
        }
    }
    response
}

/// A duration as OpenAI writes its resets (Go's format): `250ms`, `1.5s`, `6m0s`.
fn go_duration(d: Duration) -> String {
    let millis = d.as_micros().div_ceil(1_000);
    if millis < 1_000 {
        return format!("{millis}ms");
    }
    let (minutes, millis) = (millis / 60_000, millis % 60_000);
    let seconds = format!("{}.{:03}s", millis / 1_000, millis % 1_000);
    if minutes == 0 {
        seconds
    } else {
        format!("{minutes}m{seconds}")
    }
}

/// Now in whole seconds since the epoch, as a completion's `created`.
fn created() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::go_duration;
    use std::time::Duration;

    #[test]
    fn resets_are_written_as_go_durations() {
        assert_eq!(go_duration(Duration::from_micros(249_001)), "250ms");
        assert_eq!(go_duration(Duration::from_millis(1_500)), "1.500s");
        assert_eq!(go_duration(Duration::from_secs(360)), "6m0.000s");
    }
}
