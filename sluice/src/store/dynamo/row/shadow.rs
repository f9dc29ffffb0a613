//! Shadow mode in a bucket row: sluice's extra `mode` S (`shadow`; absent: enforce) in the
//! definition, and what shadow acquires left, `shadow_owed` N and `shadow_refused` N
//! (both absent while empty; see [`ShadowLedger`]).

use aws_sdk_dynamodb::types::AttributeValue;

use super::{Item, Reader, n, s};
use crate::bucket::{Mode, ShadowLedger};
use crate::decimal::Rounding;
use crate::store::StoreError;
use crate::tokens::Tokens;

/// sluice's extra bucket attribute: the bucket's [`Mode`], `shadow` (absent: enforce).
pub(crate) const MODE: &str = "mode";
/// sluice's extra bucket attribute: [`ShadowLedger::owed`].
pub(crate) const SHADOW_OWED: &str = "shadow_owed";
/// sluice's extra bucket attribute: [`ShadowLedger::refused`].
pub(crate) const SHADOW_REFUSED: &str = "shadow_refused";

/// The mode's attribute, when it is not the default.
pub(crate) fn mode_value(mode: Mode) -> Option<AttributeValue> {
    (mode != Mode::Enforce).then(|| s(mode.as_str()))
}

/// The ledger's attributes (none for an empty one).
pub(crate) fn ledger_attributes(ledger: &ShadowLedger) -> Vec<(String, AttributeValue)> {
    if ledger.is_empty() {
        return Vec::new();
    }
    vec![
        (SHADOW_OWED.to_owned(), n(ledger.owed)),
        (SHADOW_REFUSED.to_owned(), n(ledger.refused)),
    ]
}

/// Reads the bucket's mode.
pub(super) fn read_mode(r: &Reader<'_>, item: &Item) -> Result<Mode, StoreError> {
    if !item.contains_key(MODE) {
        return Ok(Mode::Enforce);
    }
    r.string(MODE)?
        .parse()
        .map_err(|e: crate::bucket::UnknownMode| r.corrupt(e.to_string()))
}

/// Reads the row's shadow ledger (empty when it has none).
pub(super) fn read_ledger(r: &Reader<'_>) -> Result<ShadowLedger, StoreError> {
    // Rounded up: an enforcing level read as more than stored would refuse less.
    let owed = match r.number(SHADOW_OWED)? {
        Some(text) => r.tokens_text(SHADOW_OWED, text, Rounding::Ceil)?,
        None => Tokens::ZERO,
    };
    if owed.is_negative() {
        return Err(r.corrupt(format!(
            "`{SHADOW_OWED}` must not be negative, found {owed}"
        )));
    }
    let refused = match r.number(SHADOW_REFUSED)? {
        Some(text) => r.count(SHADOW_REFUSED, text)?,
        None => 0,
    };
    Ok(ShadowLedger { owed, refused })
}

#[cfg(test)]
mod tests {
    use super::super::{bucket_item, bucket_state};
    use super::*;
    use crate::bucket::{Bucket, BucketState};
    use crate::clock::UnixMillis;
    use crate::rate::RefillRate;

    fn shadow_row() -> BucketState {
        let bucket = Bucket::requests(RefillRate::per_second(1)).with_mode(Mode::Shadow);
        let mut row = BucketState::full("v#rpm".parse().unwrap(), bucket, UnixMillis::new(0));
        row.shadow = ShadowLedger {
            owed: Tokens::from_nanos(2_500_000_001),
            refused: 7,
        };
        row
    }

    #[test]
    fn the_mode_and_the_ledger_round_trip_and_are_absent_when_default() {
        let row = shadow_row();
        let item = bucket_item(&row);
        assert_eq!(item[MODE], s("shadow"));
        assert_eq!(item[SHADOW_REFUSED], n(7));
        assert_eq!(bucket_state(&item).unwrap(), row);
        let plain = BucketState::full(
            "v#rpm".parse().unwrap(),
            Bucket::requests(RefillRate::per_second(1)),
            UnixMillis::new(0),
        );
        let item = bucket_item(&plain);
        assert!(
            ![MODE, SHADOW_OWED, SHADOW_REFUSED]
                .iter()
                .any(|a| item.contains_key(*a))
        );
        assert_eq!(bucket_state(&item).unwrap(), plain);
    }

    #[test]
    fn a_bad_mode_or_ledger_is_a_corrupt_row() {
        for (name, value) in [
            (MODE, s("lenient")),
            (MODE, n(1)),
            (SHADOW_OWED, n("-1")),
            (SHADOW_REFUSED, n("1.5")),
            (SHADOW_REFUSED, s("7")),
        ] {
            let mut item = bucket_item(&shadow_row());
            item.insert(name.to_owned(), value);
            let e = bucket_state(&item).unwrap_err();
            assert!(e.to_string().contains(name), "{name}: {e}");
        }
    }
}
