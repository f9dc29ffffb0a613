//! Token estimates for chat-style request bodies, to charge a `tokens` dimension before the
//! vendor has counted anything.

use reqwest::Request;
use serde_json::Value;
use sluice::Tokens;

/// Characters per token assumed for prompt text (the vendors' own rule of thumb).
const CHARS_PER_TOKEN: u64 = 4;

/// Estimates the tokens a chat or completion request will count against a tokens-per-minute
/// limit, the way vendors do before running it: the prompt's characters / 4 (rounded up)
/// plus the most it may generate (`max_tokens`, `max_completion_tokens` or
/// `max_output_tokens`, times `n` choices).
///
/// Prompt text is every string under `messages`, `prompt`, `input`, `system` and
/// `instructions`. Returns `None` when the body is not in memory or not a JSON object; the
/// limit then charges its bucket's `cost_per_call`. Adjust the lease afterwards if the
/// response reports actual usage.
///
/// ```
/// use sluice_reqwest::estimate::chat_tokens;
///
/// let request = reqwest::Client::new()
///     .post("https://api.openai.com/v1/chat/completions")
///     .body(r#"{"model":"gpt-4o","max_tokens":100,"messages":[{"role":"user","content":"Say hi to the team"}]}"#)
///     .build()
///     .unwrap();
/// // "user" and "Say hi to the team" are 22 characters: 6 tokens, plus 100 to generate.
/// assert_eq!(chat_tokens(&request), Some(106.into()));
/// ```
pub fn chat_tokens(request: &Request) -> Option<Tokens> {
    let body = request.body()?.as_bytes()?;
    chat_tokens_of(body)
}

/// [`chat_tokens`] for a body already in hand.
pub fn chat_tokens_of(body: &[u8]) -> Option<Tokens> {
    let json: Value = serde_json::from_slice(body).ok()?;
    let object = json.as_object()?;
    let chars: u64 = ["messages", "prompt", "input", "system", "instructions"]
        .iter()
        .filter_map(|key| object.get(*key))
        .map(text_chars)
        .sum();
    let prompt = chars.div_ceil(CHARS_PER_TOKEN);
    let max_output = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .find_map(|key| object.get(*key).and_then(Value::as_u64))
        .unwrap_or(0);
    let choices = object.get("n").and_then(Value::as_u64).unwrap_or(1).max(1);
    let total = prompt.saturating_add(max_output.saturating_mul(choices));
    Some(Tokens::new(i64::try_from(total).unwrap_or(i64::MAX)))
}

/// The JSON body's `model`, when the body is in memory and names one.
pub(crate) fn model_of(request: &Request) -> Option<String> {
    let body = request.body()?.as_bytes()?;
    let json: Value = serde_json::from_slice(body).ok()?;
    Some(json.get("model")?.as_str()?.to_owned())
}

/// Characters in every string inside `value`.
fn text_chars(value: &Value) -> u64 {
    match value {
        Value::String(s) => s.chars().count() as u64,
        Value::Array(items) => items.iter().map(text_chars).sum(),
        Value::Object(fields) => fields.values().map(text_chars).sum(),
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_bodies_are_estimated_from_prompt_text_and_output_bound() {
        let cases: &[(&str, Option<i64>)] = &[
            // 4 + 8 characters -> 3 tokens, plus 50.
            (
                r#"{"max_tokens":50,"messages":[{"role":"user","content":"12345678"}]}"#,
                Some(53),
            ),
            // Content parts, a system prompt and two choices.
            (
                r#"{"system":"abcd","max_completion_tokens":10,"n":2,"messages":[{"role":"user","content":[{"type":"text","text":"abcdefgh"}]}]}"#,
                // "abcd" + "user" + "text" + "abcdefgh" = 20 chars -> 5 tokens; 2 x 10.
                Some(25),
            ),
            (r#"{"prompt":"abcde"}"#, Some(2)),
            (r#"{"input":["ab","cd"],"max_output_tokens":7}"#, Some(8)),
            (r#"{"model":"x"}"#, Some(0)),
            ("not json", None),
            ("[1,2]", None),
        ];
        for (body, want) in cases {
            assert_eq!(
                chat_tokens_of(body.as_bytes()),
                want.map(Tokens::new),
                "{body}"
            );
        }
    }

    #[test]
    fn a_request_without_a_body_has_no_estimate() {
        let request = reqwest::Client::new()
            .post("http://api.openai.com/v1/chat/completions")
            .build()
            .unwrap();
        assert_eq!(chat_tokens(&request), None);
    }
}
