//! The rules of a sluice dimension name (and of a [`priority`] name), in one place: the
//! `sluice` crate checks names with them at run time (`sluice::Dimension::new`,
//! `sluice::Priority::new`) and the `#[rate_limited]` attribute at compile time, each in its
//! own words.
//!
//! A dimension is `{vendor}#{metric}`: a non-empty vendor and metric separated by exactly
//! one `#`, at most [`MAX_LEN`] bytes, no whitespace or control characters, and not
//! starting with [`LEASE_PREFIX`] (the prefix of lease rows in the shared table). A key's
//! dimension under a keyed bucket (a template) is `{vendor}#{metric}#@{key}`: the template's
//! name, [`KEY_MARK`], and a non-empty key with no `#`.
//!
//! ```
//! use sluice_dimension::{Broken, check};
//!
//! assert_eq!(check("openai#rpm"), Ok(()));
//! assert_eq!(check("ingest#rpm#@tenant-42"), Ok(()));
//! assert_eq!(check("openai"), Err(Broken::Separator));
//! assert_eq!(check("ingest#rpm#@"), Err(Broken::EmptyKey));
//! assert_eq!(check("lease#x"), Err(Broken::Reserved));
//! ```

#![forbid(unsafe_code)]

/// The prefix that marks lease rows; no dimension may start with it.
pub const LEASE_PREFIX: &str = "lease#";

/// What separates a template's name from a key in a key's dimension
/// (`ingest#rpm#@tenant-42`): no other name has a third `#`-part starting with `@`.
pub const KEY_MARK: &str = "#@";

/// The longest dimension, in bytes: its lease rows' keys must stay within DynamoDB's
/// 2048-byte partition key.
pub const MAX_LEN: usize = 1024;

/// The first rule a name breaks, in the order they are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Broken {
    /// The name is empty.
    Empty,
    /// The name is longer than [`MAX_LEN`] bytes.
    TooLong,
    /// The name contains whitespace or a control character.
    Whitespace,
    /// The name starts with [`LEASE_PREFIX`].
    Reserved,
    /// There is no `#`, or more than one outside a key's mark (`#@`).
    Separator,
    /// The vendor part is empty.
    EmptyVendor,
    /// The metric part is empty.
    EmptyMetric,
    /// A key's mark (`#@`) with no key after it.
    EmptyKey,
}

/// Checks `name` against the rules; the first one it breaks.
pub fn check(name: &str) -> Result<(), Broken> {
    if name.is_empty() {
        return Err(Broken::Empty);
    }
    if name.len() > MAX_LEN {
        return Err(Broken::TooLong);
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Broken::Whitespace);
    }
    if name.starts_with(LEASE_PREFIX) {
        return Err(Broken::Reserved);
    }
    let mut parts = name.split('#');
    let (vendor, metric, key) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(v), Some(m), None, None) => (v, m, None),
        (Some(v), Some(m), Some(k), None) => match k.strip_prefix('@') {
            Some(key) => (v, m, Some(key)),
            None => return Err(Broken::Separator),
        },
        _ => return Err(Broken::Separator),
    };
    if vendor.is_empty() {
        return Err(Broken::EmptyVendor);
    }
    if metric.is_empty() {
        return Err(Broken::EmptyMetric);
    }
    if key.is_some_and(str::is_empty) {
        return Err(Broken::EmptyKey);
    }
    Ok(())
}

/// Splits a dimension that [`check`] accepts into its template's name and its key, if it
/// has one: `ingest#rpm#@tenant-42` into `ingest#rpm` and `tenant-42`.
///
/// ```
/// assert_eq!(sluice_dimension::split_key("ingest#rpm#@t1"), ("ingest#rpm", Some("t1")));
/// assert_eq!(sluice_dimension::split_key("openai#rpm"), ("openai#rpm", None));
/// assert_eq!(sluice_dimension::split_key("v#@m"), ("v#@m", None));
/// assert_eq!(sluice_dimension::split_key("v#@m#@k"), ("v#@m", Some("k")));
/// ```
pub fn split_key(name: &str) -> (&str, Option<&str>) {
    // The third part, not the first `#@`: a metric may start with `@` (`v#@m`).
    match name.rsplit_once('#') {
        Some((template, key)) if template.contains('#') => {
            (template, Some(key.strip_prefix('@').unwrap_or(key)))
        }
        _ => (name, None),
    }
}

pub mod priority {
    //! The rules of a priority name (`interactive`, `batch`): 1 to [`MAX_LEN`] bytes of
    //! ASCII letters, digits, `-`, `_` and `.`.
    //!
    //! ```
    //! use sluice_dimension::priority::{Broken, check};
    //!
    //! assert_eq!(check("interactive"), Ok(()));
    //! assert_eq!(check("batch jobs"), Err(Broken::Character(' ')));
    //! ```

    /// The longest priority name, in bytes.
    pub const MAX_LEN: usize = 64;

    /// The first rule a priority name breaks.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[non_exhaustive]
    pub enum Broken {
        /// The name is empty.
        Empty,
        /// The name is longer than [`MAX_LEN`] bytes.
        TooLong,
        /// The name holds a character other than ASCII letters, digits, `-`, `_`, `.`.
        Character(char),
    }

    /// Checks `name` against the rules; the first one it breaks.
    pub fn check(name: &str) -> Result<(), Broken> {
        if name.is_empty() {
            return Err(Broken::Empty);
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(Broken::Character(c));
        }
        if name.len() > MAX_LEN {
            return Err(Broken::TooLong);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_is_checked_in_order() {
        assert_eq!(check(""), Err(Broken::Empty));
        assert_eq!(check(&"a#".repeat(600)), Err(Broken::TooLong));
        assert_eq!(check("open ai#rpm"), Err(Broken::Whitespace));
        assert_eq!(check("a#b\u{7}"), Err(Broken::Whitespace));
        assert_eq!(check("lease#rpm"), Err(Broken::Reserved));
        assert_eq!(check("a#b#c"), Err(Broken::Separator));
        assert_eq!(check("a#b#@k#1"), Err(Broken::Separator));
        assert_eq!(check("a#b#@k@#"), Err(Broken::Separator));
        assert_eq!(check("a#b#@"), Err(Broken::EmptyKey));
        assert_eq!(check("a##@k"), Err(Broken::EmptyMetric));
        assert_eq!(check("a#b#@k"), Ok(()));
        assert_eq!(check("a#b#@@k"), Ok(()));
        assert_eq!(check("openai"), Err(Broken::Separator));
        assert_eq!(check("#rpm"), Err(Broken::EmptyVendor));
        assert_eq!(check("openai#"), Err(Broken::EmptyMetric));
        assert_eq!(check(&format!("v#{}", "m".repeat(MAX_LEN - 2))), Ok(()));
        assert_eq!(
            check(&format!("v#{}", "m".repeat(MAX_LEN - 1))),
            Err(Broken::TooLong)
        );
    }

    #[test]
    fn priority_names_are_short_and_plain() {
        use super::priority::{Broken, MAX_LEN, check};
        assert_eq!(check(""), Err(Broken::Empty));
        assert_eq!(check("batch#1"), Err(Broken::Character('#')));
        assert_eq!(check("é"), Err(Broken::Character('é')));
        assert_eq!(check(&"p".repeat(MAX_LEN)), Ok(()));
        assert_eq!(check(&"p".repeat(MAX_LEN + 1)), Err(Broken::TooLong));
        assert_eq!(check("tier-1_a.b"), Ok(()));
    }
}
