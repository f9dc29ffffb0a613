//! Dimensions: the `{vendor}#{metric}` names of shared limits.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The prefix that marks lease rows; no dimension may start with it.
pub(crate) use sluice_dimension::LEASE_PREFIX;

/// A validated `{vendor}#{metric}` name, such as `openai#rpm` or `elevenlabs#concurrent`,
/// or a key's under a keyed bucket: `{vendor}#{metric}#@{key}`, such as
/// `ingest#rpm#@tenant-42` (see [`Dimension::with_key`]).
///
/// A dimension has a non-empty vendor and metric separated by exactly one `#`, contains no
/// whitespace or control characters, and does not start with `lease#` (the prefix of lease
/// rows in the shared table); a key is not empty and has no `#`. The whole is at most 1024
/// bytes. Cloning is cheap.
///
/// ```
/// use sluice::Dimension;
///
/// let d: Dimension = "openai#rpm".parse()?;
/// assert_eq!(d.vendor(), "openai");
/// assert_eq!(d.metric(), "rpm");
/// assert_eq!(d.key(), None);
/// assert!("openai".parse::<Dimension>().is_err());
///
/// // One bucket per tenant, from the keyed bucket `ingest#rpm`.
/// let tenant = "ingest#rpm".parse::<Dimension>()?.with_key("tenant-42")?;
/// assert_eq!(tenant.as_str(), "ingest#rpm#@tenant-42");
/// assert_eq!(tenant.key(), Some("tenant-42"));
/// assert_eq!(tenant.template().as_str(), "ingest#rpm");
/// assert_eq!(tenant, "ingest#rpm#@tenant-42".parse()?);
/// # Ok::<(), sluice::error::DimensionError>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dimension(Arc<str>);

/// Why a string is not a valid [`Dimension`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DimensionError {
    /// The string is empty.
    #[error("dimension is empty; expected `{{vendor}}#{{metric}}`, e.g. `openai#rpm`")]
    Empty,
    /// There is no `#` or more than one.
    #[error(
        "dimension `{0}` must have exactly one `#` between vendor and metric, e.g. `openai#rpm`"
    )]
    Separator(String),
    /// The vendor part is empty.
    #[error("dimension `{0}` has an empty vendor; expected `{{vendor}}#{{metric}}`")]
    EmptyVendor(String),
    /// The metric part is empty.
    #[error("dimension `{0}` has an empty metric; expected `{{vendor}}#{{metric}}`")]
    EmptyMetric(String),
    /// The string contains whitespace or a control character.
    #[error("dimension `{0}` contains whitespace or a control character")]
    Whitespace(String),
    /// The string starts with the lease prefix.
    #[error("dimension `{0}` must not start with `lease#`, the prefix reserved for lease rows")]
    Reserved(String),
    /// The string is longer than a DynamoDB key allows for a lease row.
    #[error("dimension `{0}` is longer than 1024 bytes")]
    TooLong(String),
    /// A key's mark (`#@`) with no key after it.
    #[error(
        "dimension `{0}` names no key after `#@`; expected `{{vendor}}#{{metric}}#@{{key}}`, e.g. `ingest#rpm#@tenant-42`"
    )]
    EmptyKey(String),
}

impl Dimension {
    /// Validates `s` as a dimension.
    pub fn new(s: &str) -> Result<Self, DimensionError> {
        use sluice_dimension::Broken;
        let owned = || s.to_owned();
        sluice_dimension::check(s).map_err(|broken| match broken {
            Broken::Empty => DimensionError::Empty,
            Broken::TooLong => DimensionError::TooLong(owned()),
            Broken::Whitespace => DimensionError::Whitespace(owned()),
            Broken::Reserved => DimensionError::Reserved(owned()),
            Broken::EmptyVendor => DimensionError::EmptyVendor(owned()),
            Broken::EmptyMetric => DimensionError::EmptyMetric(owned()),
            Broken::EmptyKey => DimensionError::EmptyKey(owned()),
            // `Separator`, and any rule added later.
            _ => DimensionError::Separator(owned()),
        })?;
        Ok(Dimension(Arc::from(s)))
    }

    /// The whole name, e.g. `openai#rpm` or `ingest#rpm#@tenant-42`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part before `#`, e.g. `openai`.
    pub fn vendor(&self) -> &str {
        self.0.split_once('#').map_or("", |(v, _)| v)
    }

    /// The part after the vendor's `#`, without a key: `rpm` for `openai#rpm` and for
    /// `ingest#rpm#@tenant-42` alike.
    pub fn metric(&self) -> &str {
        let template = self.template_str();
        template.split_once('#').map_or("", |(_, m)| m)
    }

    /// The key this dimension names under a keyed bucket (`tenant-42` for
    /// `ingest#rpm#@tenant-42`), or `None` for a dimension of its own.
    pub fn key(&self) -> Option<&str> {
        sluice_dimension::split_key(self.base_str()).1
    }

    /// The keyed bucket (the template) this key's dimension is served from: `ingest#rpm` for
    /// `ingest#rpm#@tenant-42`; a dimension with no key is its own.
    pub fn template(&self) -> Dimension {
        if self.key().is_none() {
            return self.clone();
        }
        Dimension(Arc::from(self.template_str()))
    }

    /// The dimension of `key` under this dimension's keyed bucket: `ingest#rpm#@tenant-42`
    /// for `ingest#rpm` and `tenant-42`. A key is not empty and holds no `#`, whitespace or
    /// control character (a tenant id, a user id; hash a secret such as an API key first:
    /// keys are stored in the table as they are given). The key replaces the dimension's
    /// own, if it has one.
    pub fn with_key(&self, key: &str) -> Result<Dimension, DimensionError> {
        Dimension::new(&format!(
            "{}{}{key}",
            self.template_str(),
            sluice_dimension::KEY_MARK
        ))
    }

    /// The template's name within this row's: up to the key's mark.
    fn template_str(&self) -> &str {
        sluice_dimension::split_key(self.base_str()).0
    }

    /// This row's dimension, without a shard's suffix.
    fn base_str(&self) -> &str {
        self.split_shard().0
    }
}

/// The most rows one bucket is spread over (see
/// [`Sluice::reshard`](crate::Sluice::reshard)): a reshard from half as many writes every
/// row of both counts in one transaction, well within DynamoDB's 100 items.
pub const MAX_SHARDS: u16 = 32;

impl Dimension {
    /// The row that holds shard `k` of this dimension's bucket: the dimension itself for
    /// shard 0 (so the seed's other SDKs find a bucket of its share under the name they
    /// know), `{vendor}#{metric}#{k}` for the others: a key with two `#` that no dimension
    /// can take. `self` is a dimension's own row (shard 0).
    pub(crate) fn shard(&self, k: u16) -> Dimension {
        if k == 0 {
            self.clone()
        } else {
            Dimension(Arc::from(format!("{}#{k}", self.0)))
        }
    }

    /// Which shard of its bucket this row holds: 0 for a dimension's own row.
    pub(crate) fn shard_index(&self) -> u16 {
        self.split_shard().1
    }

    /// The dimension whose bucket this row holds a shard of (itself, for shard 0).
    pub(crate) fn base(&self) -> Dimension {
        match self.split_shard() {
            (_, 0) => self.clone(),
            (base, _) => Dimension(Arc::from(base)),
        }
    }

    fn split_shard(&self) -> (&str, u16) {
        match self.0.rsplit_once('#') {
            Some((base, k)) if base.contains('#') && !k.starts_with('@') => {
                (base, k.parse().unwrap_or(0))
            }
            _ => (&self.0, 0),
        }
    }

    /// Reads the key of a bucket row: a dimension (a key's too), or a shard row of one
    /// (`{dimension}#{k}`, `k` from 1 to [`MAX_SHARDS`] - 1, without leading zeros).
    pub(crate) fn from_row_key(key: &str) -> Result<Dimension, DimensionError> {
        if let Some((base, k)) = key.rsplit_once('#')
            && base.contains('#')
            && !k.starts_with('@')
        {
            let shard = k
                .parse::<u16>()
                .ok()
                .filter(|n| (1..MAX_SHARDS).contains(n) && *k == n.to_string());
            return match shard {
                Some(n) => Ok(Dimension::new(base)?.shard(n)),
                None => Err(DimensionError::Separator(key.to_owned())),
            };
        }
        Dimension::new(key)
    }
}

/// `dimensions` (one, or several joined by `,`) with every key's dimension labelled by its
/// keyed bucket: `ingest#rpm#@tenant-42` as `ingest#rpm#@*`, so that a bucket per key adds
/// one label, not one per key.
pub(crate) fn by_template(dimensions: &str) -> std::borrow::Cow<'_, str> {
    if !dimensions.contains(sluice_dimension::KEY_MARK) {
        return std::borrow::Cow::Borrowed(dimensions);
    }
    let parts: Vec<String> = dimensions
        .split(',')
        .map(|d| {
            // The key's mark is the third part's start: a metric may begin with `@`.
            match d.match_indices('#').nth(1) {
                Some((i, _)) if d[i + 1..].starts_with('@') => format!("{}#@*", &d[..i]),
                _ => d.to_owned(),
            }
        })
        .collect();
    std::borrow::Cow::Owned(parts.join(","))
}

impl FromStr for Dimension {
    type Err = DimensionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Dimension::new(s)
    }
}

impl TryFrom<&str> for Dimension {
    type Error = DimensionError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Dimension::new(s)
    }
}

impl TryFrom<String> for Dimension {
    type Error = DimensionError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Dimension::new(&s)
    }
}

impl TryFrom<&String> for Dimension {
    type Error = DimensionError;
    fn try_from(s: &String) -> Result<Self, Self::Error> {
        Dimension::new(s)
    }
}

impl TryFrom<&Dimension> for Dimension {
    type Error = DimensionError;
    fn try_from(d: &Dimension) -> Result<Self, Self::Error> {
        Ok(d.clone())
    }
}

impl AsRef<str> for Dimension {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Dimension({})", &self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_vendor_hash_metric() {
        for ok in [
            "openai#rpm",
            "openai#tpm",
            "elevenlabs#concurrent",
            "a#b",
            "x-1#gpt-4o.tpm",
        ] {
            assert_eq!(Dimension::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn shard_rows_have_keys_no_dimension_can_take() {
        let d = Dimension::new("openai#rpm").unwrap();
        assert_eq!(d.shard(0), d);
        let third = d.shard(3);
        assert_eq!(third.as_str(), "openai#rpm#3");
        assert!(Dimension::new(third.as_str()).is_err());
        assert_eq!((third.base(), third.shard_index()), (d.clone(), 3));
        assert_eq!((d.base(), d.shard_index()), (d.clone(), 0));
        assert_eq!(Dimension::from_row_key("openai#rpm#3"), Ok(third));
        assert_eq!(Dimension::from_row_key("openai#rpm"), Ok(d));
        for bad in [
            "openai#rpm#0",
            "openai#rpm#03",
            "openai#rpm#32",
            "openai#rpm#x",
            "a#b#c#1",
        ] {
            assert!(Dimension::from_row_key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rejects_malformed_names_with_the_reason() {
        assert_eq!(Dimension::new(""), Err(DimensionError::Empty));
        assert!(matches!(
            Dimension::new("openai"),
            Err(DimensionError::Separator(_))
        ));
        assert!(matches!(
            Dimension::new("a#b#c"),
            Err(DimensionError::Separator(_))
        ));
        assert!(matches!(
            Dimension::new("#rpm"),
            Err(DimensionError::EmptyVendor(_))
        ));
        assert!(matches!(
            Dimension::new("openai#"),
            Err(DimensionError::EmptyMetric(_))
        ));
        assert!(matches!(
            Dimension::new("open ai#rpm"),
            Err(DimensionError::Whitespace(_))
        ));
        assert!(matches!(
            Dimension::new("openai#rpm\n"),
            Err(DimensionError::Whitespace(_))
        ));
        assert!(matches!(
            Dimension::new("lease#rpm"),
            Err(DimensionError::Reserved(_))
        ));
        assert!(matches!(
            Dimension::new(&format!("a#{}", "b".repeat(1100))),
            Err(DimensionError::TooLong(_))
        ));
    }

    #[test]
    fn a_keys_dimension_is_its_templates_name_the_mark_and_the_key() {
        let template = Dimension::new("ingest#rpm").unwrap();
        let key = template.with_key("tenant-42").unwrap();
        assert_eq!(key.as_str(), "ingest#rpm#@tenant-42");
        assert_eq!(
            (key.vendor(), key.metric(), key.key()),
            ("ingest", "rpm", Some("tenant-42"))
        );
        assert_eq!(key.template(), template);
        assert_eq!(template.template(), template);
        assert_eq!(template.key(), None);
        // Another key replaces it; a key is never nested.
        assert_eq!(key.with_key("t7").unwrap().as_str(), "ingest#rpm#@t7");
        // A metric may start with `@`: only a third part is a key.
        let odd = Dimension::new("v#@m").unwrap();
        assert_eq!((odd.metric(), odd.key()), ("@m", None));
        let odd_key = odd.with_key("k").unwrap();
        assert_eq!((odd_key.metric(), odd_key.key()), ("@m", Some("k")));
        assert_eq!(odd_key.template(), odd);
        for bad in ["", "a#b", "a b", "a\n"] {
            assert!(template.with_key(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            Dimension::new("ingest#rpm#@"),
            Err(DimensionError::EmptyKey(_))
        ));
    }

    #[test]
    fn a_keys_rows_are_read_back_from_their_keys_whatever_the_key_looks_like() {
        for k in ["7", "03", "@", "x@y", "31"] {
            let key = Dimension::new("ingest#rpm").unwrap().with_key(k).unwrap();
            assert_eq!((key.base(), key.shard_index()), (key.clone(), 0), "{k}");
            assert_eq!(Dimension::from_row_key(key.as_str()), Ok(key.clone()));
            let third = key.shard(3);
            assert_eq!(third.as_str(), format!("ingest#rpm#@{k}#3"));
            assert_eq!((third.base(), third.shard_index()), (key.clone(), 3));
            assert_eq!(third.key(), Some(k));
            assert_eq!(third.template().as_str(), "ingest#rpm");
            assert_eq!(Dimension::from_row_key(third.as_str()), Ok(third));
        }
        assert!(Dimension::from_row_key("ingest#rpm#@k#0").is_err());
        assert!(Dimension::from_row_key("ingest#rpm#@k#x").is_err());
    }
}
