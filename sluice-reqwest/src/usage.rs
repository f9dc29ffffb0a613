//! What a vendor says a call actually used, read from the response body as the caller
//! reads it: a JSON document (`usage`), or a stream of server-sent events whose last
//! usage report counts.

use serde_json::Value;

use crate::headers::Signal;

/// The most of a JSON body kept to read its usage: a larger one keeps its estimate.
const MAX_JSON: usize = 8 << 20;
/// The longest server-sent event line read for usage.
const MAX_LINE: usize = 1 << 20;

/// Tokens a call used, as the vendor reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    input: Option<u64>,
    output: Option<u64>,
    total: Option<u64>,
}

impl Usage {
    /// The tokens counted against `signal`'s limit: the total (OpenAI's `total_tokens`,
    /// else input plus output, as Anthropic reports them), input or output.
    pub(crate) fn of(&self, signal: Signal) -> Option<u64> {
        match signal {
            Signal::Tokens => self
                .total
                .or_else(|| Some(self.input?.saturating_add(self.output?))),
            Signal::InputTokens => self.input,
            Signal::OutputTokens => self.output,
            Signal::Requests => None,
        }
    }

    /// Takes in what one JSON document (a body, or one event) reports; later reports win
    /// (streams report cumulative counts).
    fn merge(&mut self, json: &Value) {
        // OpenAI chat and Anthropic messages carry `usage` at the top; Anthropic's
        // `message_start` event under `message`; OpenAI's Responses events under `response`.
        let Some(usage) = json
            .get("usage")
            .filter(|u| u.is_object())
            .or_else(|| json.get("message")?.get("usage"))
            .or_else(|| json.get("response")?.get("usage"))
            .filter(|u| u.is_object())
        else {
            return;
        };
        let count = |keys: &[&str]| keys.iter().find_map(|k| usage.get(*k)?.as_u64());
        if let Some(n) = count(&["input_tokens", "prompt_tokens"]) {
            // Anthropic counts tokens written to its prompt cache against its input limit
            // too (reads from the cache it does not, for current models).
            let cached = count(&["cache_creation_input_tokens"]).unwrap_or(0);
            self.input = Some(n.saturating_add(cached));
        }
        if let Some(n) = count(&["output_tokens", "completion_tokens"]) {
            self.output = Some(n);
        }
        if let Some(n) = count(&["total_tokens"]) {
            self.total = Some(n);
        }
    }

    fn is_known(&self) -> bool {
        self.input.is_some() || self.output.is_some() || self.total.is_some()
    }
}

/// Reads usage from a body as it goes by.
#[derive(Debug)]
pub(crate) enum Scan {
    /// A JSON document: kept whole (up to [`MAX_JSON`]) and read at its end.
    Json(Vec<u8>),
    /// Server-sent events: each `data:` line read as it completes.
    Events { line: Vec<u8>, usage: Usage },
    /// Too large, or nothing to read.
    Off,
}

impl Scan {
    /// The scan for a body of this content type, if it is one that reports usage.
    pub(crate) fn for_content_type(content_type: Option<&str>) -> Scan {
        let mime = content_type
            .and_then(|c| c.split(';').next())
            .map(|m| m.trim().to_ascii_lowercase());
        match mime.as_deref() {
            Some("text/event-stream") => Scan::Events {
                line: Vec::new(),
                usage: Usage::default(),
            },
            Some(m) if m == "application/json" || m.ends_with("+json") => Scan::Json(Vec::new()),
            _ => Scan::Off,
        }
    }

    /// Takes in the next bytes of the body.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        match self {
            Scan::Json(kept) if kept.len() + bytes.len() <= MAX_JSON => {
                kept.extend_from_slice(bytes);
            }
            Scan::Json(_) => {
                tracing::debug!("response body too large to read its usage; the estimate stays");
                *self = Scan::Off;
            }
            Scan::Events { line, usage } => {
                for part in bytes.split_inclusive(|b| *b == b'\n') {
                    if line.len() + part.len() <= MAX_LINE {
                        line.extend_from_slice(part);
                    }
                    if part.ends_with(b"\n") {
                        event_line(line, usage);
                        line.clear();
                    }
                }
            }
            Scan::Off => {}
        }
    }

    /// The usage the whole body reported, once it has ended.
    pub(crate) fn finish(self) -> Option<Usage> {
        let usage = match self {
            Scan::Json(kept) => {
                let mut usage = Usage::default();
                usage.merge(&serde_json::from_slice::<Value>(&kept).ok()?);
                usage
            }
            Scan::Events { line, mut usage } => {
                event_line(&line, &mut usage);
                usage
            }
            Scan::Off => return None,
        };
        usage.is_known().then_some(usage)
    }
}

/// One line of a server-sent event stream: a `data:` line holding JSON may report usage.
fn event_line(line: &[u8], usage: &mut Usage) {
    let text = String::from_utf8_lossy(line);
    let Some(data) = text.trim_end().strip_prefix("data:") else {
        return;
    };
    if let Ok(json) = serde_json::from_str::<Value>(data.trim()) {
        usage.merge(&json);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(content_type: &str, chunks: &[&str]) -> Option<Usage> {
        let mut scan = Scan::for_content_type(Some(content_type));
        for chunk in chunks {
            scan.feed(chunk.as_bytes());
        }
        scan.finish()
    }

    #[test]
    fn openai_and_anthropic_bodies_report_their_usage() {
        let openai = scan(
            "application/json; charset=utf-8",
            &[
                r#"{"id":"x","usage":{"prompt_tokens":12,"#,
                r#""completion_tokens":30,"total_tokens":42}}"#,
            ],
        )
        .unwrap();
        assert_eq!(openai.of(Signal::Tokens), Some(42));
        assert_eq!(openai.of(Signal::OutputTokens), Some(30));
        let anthropic = scan(
            "application/json",
            &[r#"{"type":"message","usage":{"input_tokens":10,"cache_creation_input_tokens":4,"cache_read_input_tokens":100,"output_tokens":5}}"#],
        )
        .unwrap();
        // Tokens written to the prompt cache count as input; tokens read from it do not.
        assert_eq!(anthropic.of(Signal::Tokens), Some(19));
        assert_eq!(anthropic.of(Signal::InputTokens), Some(14));
        assert_eq!(scan("application/json", &[r#"{"id":"x"}"#]), None);
        assert_eq!(
            scan("text/plain", &[r#"{"usage":{"total_tokens":1}}"#]),
            None
        );
    }

    #[test]
    fn streams_report_their_last_usage_across_chunk_boundaries() {
        // OpenAI with `stream_options.include_usage`: the last chunk carries it.
        let openai = scan(
            "text/event-stream",
            &[
                "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"us",
                "age\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\n\n",
                "data: [DONE]\n\n",
            ],
        )
        .unwrap();
        assert_eq!(openai.of(Signal::Tokens), Some(10));
        // Anthropic: input in `message_start`, the cumulative output in `message_delta`.
        let anthropic = scan(
            "text/event-stream",
            &[
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\n",
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}",
            ],
        )
        .unwrap();
        assert_eq!(anthropic.of(Signal::Tokens), Some(35));
        // A stream that never reports usage keeps the estimate.
        assert_eq!(scan("text/event-stream", &["data: {\"x\":1}\n\n"]), None);
    }
}
