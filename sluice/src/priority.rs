//! Priorities, and the reserves a bucket keeps for them.
//!
//! A bucket may keep part of its capacity for its higher priorities: a [`Reserve`] names a
//! priority and the tokens only that priority and those above it may take. A bucket lists
//! its reserves highest priority first. An acquire at priority `p` is granted only while the
//! bucket keeps, after the grant, the reserves of every priority listed above `p` (its
//! *floor*); the first listed priority, and an acquire with no priority at all, may take
//! everything. A priority the bucket does not list ranks below all listed ones and leaves
//! every reserve.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::tokens::Tokens;

/// The name of a priority, such as `interactive` or `batch`: 1 to 64 ASCII letters,
/// digits, `-`, `_` or `.`. Cloning is cheap.
///
/// ```
/// use sluice::Priority;
///
/// let p: Priority = "interactive".parse()?;
/// assert_eq!(p.as_str(), "interactive");
/// assert!("batch jobs".parse::<Priority>().is_err());
/// # Ok::<(), sluice::error::PriorityError>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority(Arc<str>);

/// Why a string is not a valid [`Priority`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PriorityError {
    /// The name is empty.
    #[error("priority is empty; expected a name such as `interactive` or `batch`")]
    Empty,
    /// The name is longer than 64 bytes.
    #[error("priority `{0}` is longer than 64 bytes")]
    TooLong(String),
    /// The name holds another character than ASCII letters, digits, `-`, `_`, `.`.
    #[error("priority `{name}` contains `{character}`; use ASCII letters, digits, `-`, `_`, `.`")]
    Character {
        /// The name given.
        name: String,
        /// The first character refused.
        character: char,
    },
}

impl Priority {
    /// Validates `name` as a priority.
    pub fn new(name: &str) -> Result<Self, PriorityError> {
        use sluice_dimension::priority::{Broken, check};
        match check(name) {
            Ok(()) => Ok(Priority(Arc::from(name))),
            Err(Broken::Empty) => Err(PriorityError::Empty),
            Err(Broken::TooLong) => Err(PriorityError::TooLong(name.to_owned())),
            Err(Broken::Character(character)) => Err(PriorityError::Character {
                name: name.to_owned(),
                character,
            }),
            Err(_) => Err(PriorityError::Empty),
        }
    }

    /// A name already checked against the rules (by `#[rate_limited]`, at compile time).
    pub(crate) fn checked(name: &'static str) -> Self {
        Priority(Arc::from(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for Priority {
    type Err = PriorityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Priority::new(s)
    }
}

impl TryFrom<&str> for Priority {
    type Error = PriorityError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Priority::new(s)
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// Tokens a bucket keeps for one priority and those listed above it (see
/// [`Bucket::with_reserve`](crate::Bucket::with_reserve)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    /// The priority the tokens are kept for.
    pub priority: Priority,
    /// The tokens kept.
    pub tokens: Tokens,
}

/// The most reserves one bucket lists: each is checked on every grant, and kept in the row.
pub const MAX_RESERVES: usize = 8;

/// The tokens an acquire at `priority` must leave in a bucket listing `reserves` (highest
/// first): the reserves of every priority listed above it. Nothing for no priority or the
/// first listed; all of them for a priority not listed.
pub(crate) fn floor(reserves: &[Reserve], priority: Option<&Priority>) -> Tokens {
    let Some(priority) = priority else {
        return Tokens::ZERO;
    };
    reserves
        .iter()
        .take_while(|r| r.priority != *priority)
        .fold(Tokens::ZERO, |sum, r| sum.saturating_add(r.tokens))
}

/// What one acquire that must leave `floor` may take of `available`: never below zero.
pub(crate) fn above(available: Tokens, floor: Tokens) -> Tokens {
    available.saturating_sub(floor).max(Tokens::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reserves(list: &[(&str, i64)]) -> Vec<Reserve> {
        list.iter()
            .map(|(p, t)| Reserve {
                priority: p.parse().unwrap(),
                tokens: Tokens::new(*t),
            })
            .collect()
    }

    #[test]
    fn a_priority_leaves_the_reserves_listed_above_it() {
        let r = reserves(&[("interactive", 20), ("standard", 10)]);
        let p = |s: &str| Priority::new(s).unwrap();
        assert_eq!(floor(&r, None), Tokens::ZERO);
        assert_eq!(floor(&r, Some(&p("interactive"))), Tokens::ZERO);
        assert_eq!(floor(&r, Some(&p("standard"))), Tokens::new(20));
        assert_eq!(floor(&r, Some(&p("batch"))), Tokens::new(30));
        assert_eq!(floor(&[], Some(&p("batch"))), Tokens::ZERO);
    }

    #[test]
    fn bad_names_are_typed_errors() {
        assert_eq!(Priority::new(""), Err(PriorityError::Empty));
        assert!(matches!(
            Priority::new("a b"),
            Err(PriorityError::Character { character: ' ', .. })
        ));
        assert!(matches!(
            Priority::new(&"x".repeat(65)),
            Err(PriorityError::TooLong(_))
        ));
    }
}
