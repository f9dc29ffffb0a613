//! A bucket's reserves as stored: sluice's extra attribute `reserves`, a list (highest
//! priority first) of maps `{priority: S, tokens: N}`. Other SDKs ignore it, and so take
//! from a bucket as its highest priority would.

use aws_sdk_dynamodb::types::AttributeValue;

use super::{Item, Reader, kind, n, s};
use crate::decimal::Rounding;
use crate::priority::{Priority, Reserve};
use crate::store::StoreError;
use crate::tokens::Tokens;

/// sluice's extra bucket attribute: the reserves kept for higher priorities.
pub(crate) const RESERVES: &str = "reserves";
const PRIORITY: &str = "priority";
const TOKENS: &str = "tokens";

/// Reserves as stored.
pub(crate) fn reserves_value(reserves: &[Reserve]) -> AttributeValue {
    AttributeValue::L(
        reserves
            .iter()
            .map(|r| {
                AttributeValue::M(Item::from([
                    (PRIORITY.to_owned(), s(r.priority.as_str())),
                    (TOKENS.to_owned(), n(r.tokens)),
                ]))
            })
            .collect(),
    )
}

/// Reads the reserves a row carries (none when it has no `reserves`).
pub(super) fn read_reserves(r: &Reader<'_>, item: &Item) -> Result<Vec<Reserve>, StoreError> {
    let list = match item.get(RESERVES) {
        None => return Ok(Vec::new()),
        Some(AttributeValue::L(list)) => list,
        Some(other) => {
            return Err(r.corrupt(format!(
                "`{RESERVES}` must be a list (L), found {}",
                kind(other)
            )));
        }
    };
    list.iter().map(|entry| reserve(r, entry)).collect()
}

fn reserve(r: &Reader<'_>, entry: &AttributeValue) -> Result<Reserve, StoreError> {
    let bad = |what: String| r.corrupt(format!("`{RESERVES}`: {what}"));
    let AttributeValue::M(map) = entry else {
        return Err(bad(format!(
            "each entry must be a map (M), found {}",
            kind(entry)
        )));
    };
    // Exactly the two attributes, the tokens exact to a billionth: a write's condition
    // compares the list whole, so a row must read back to what it holds.
    if let Some(other) = map.keys().find(|k| *k != PRIORITY && *k != TOKENS) {
        return Err(bad(format!(
            "an entry holds `{other}`; only `{PRIORITY}` and `{TOKENS}` are allowed"
        )));
    }
    let priority = match map.get(PRIORITY) {
        Some(AttributeValue::S(p)) => Priority::new(p).map_err(|e| bad(e.to_string()))?,
        _ => return Err(bad(format!("each entry needs `{PRIORITY}`, a string (S)"))),
    };
    let tokens = match map.get(TOKENS) {
        Some(AttributeValue::N(t)) => Tokens::parse_rounded(t, Rounding::Exact)
            .map_err(|e| bad(format!("`{TOKENS}`: {e}")))?,
        _ => return Err(bad(format!("each entry needs `{TOKENS}`, a number (N)"))),
    };
    Ok(Reserve { priority, tokens })
}
