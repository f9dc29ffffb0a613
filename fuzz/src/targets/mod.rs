//! One module per parser under test, each with its [`Target`](crate::Target).

pub mod bucket_file;
pub mod decimal;
pub mod headers;
pub mod row;

/// A fingerprint of an error message: its words without the values it quotes, numbers or
/// the lines that show the input, so the same check failing on other values counts as the
/// same behaviour.
pub(crate) fn words(message: &str) -> u64 {
    let message = message.split(" found ").next().unwrap_or_default();
    let message = without_span(&without_span(message, '`'), '"');
    let kept: Vec<u8> = message
        .lines()
        .filter(|line| !line.contains('|'))
        .flat_map(str::bytes)
        .filter(|b| b.is_ascii_alphabetic() || *b == b' ')
        .take(80)
        .collect();
    crate::driver::fnv(&kept)
}

/// `text` without what lies between the first and the last `quote`.
fn without_span(text: &str, quote: char) -> String {
    match (text.find(quote), text.rfind(quote)) {
        (Some(first), Some(last)) => format!("{}{}", &text[..first], &text[last..]),
        _ => text.to_owned(),
    }
}
