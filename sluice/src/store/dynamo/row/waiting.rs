//! The clients waiting for a slot in a bucket row: sluice's extra `waiting_{epoch}` N, one
//! per epoch counted (see [`Waiting`]); absent while nobody waits.

use aws_sdk_dynamodb::types::AttributeValue;

use super::{Item, Reader, n};
use crate::bucket::Waiting;
use crate::store::StoreError;

/// The prefix of sluice's extra bucket attributes counting waiting callers, one per epoch.
const PREFIX: &str = "waiting_";

/// The attribute counting the clients waiting in `epoch`.
pub(crate) fn waiting_attribute(epoch: u64) -> String {
    format!("{PREFIX}{epoch}")
}

/// The counts' attributes (none when nobody waited).
pub(crate) fn waiting_attributes(waiting: &Waiting) -> Vec<(String, AttributeValue)> {
    waiting
        .counts()
        .map(|(epoch, clients)| (waiting_attribute(epoch), n(clients)))
        .collect()
}

/// Reads the row's counts of waiting callers.
pub(super) fn read_waiting(r: &Reader<'_>, item: &Item) -> Result<Waiting, StoreError> {
    let mut counts = Vec::new();
    for name in item.keys() {
        let Some(epoch) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Ok(epoch) = epoch.parse::<u64>() else {
            continue;
        };
        let text = r.required_number(name)?;
        counts.push((epoch, r.count(name, text)?));
    }
    Ok(Waiting::from_counts(counts))
}

#[cfg(test)]
mod tests {
    use super::super::{bucket_item, bucket_state};
    use super::*;
    use crate::bucket::{Bucket, BucketState};
    use crate::clock::UnixMillis;

    #[test]
    fn counts_of_waiting_clients_survive_a_round_trip() {
        let mut row = BucketState::full(
            "v#slots".parse().unwrap(),
            Bucket::concurrent(4),
            UnixMillis::new(0),
        );
        row.waiting = Waiting::from_counts([(88_000_000, 12), (88_000_001, 640)]);
        let item = bucket_item(&row);
        assert_eq!(item.get("waiting_88000001"), Some(&n(640)));
        assert_eq!(bucket_state(&item).unwrap(), row);
    }

    #[test]
    fn a_count_that_is_not_a_number_is_refused() {
        let row = BucketState::full(
            "v#slots".parse().unwrap(),
            Bucket::concurrent(4),
            UnixMillis::new(0),
        );
        let mut item = bucket_item(&row);
        item.insert("waiting_3".to_owned(), AttributeValue::S("many".to_owned()));
        assert!(matches!(
            bucket_state(&item),
            Err(StoreError::CorruptRow { .. })
        ));
        // An attribute of another tool's that only starts alike is not sluice's.
        let mut item = bucket_item(&row);
        item.insert("waiting_room".to_owned(), AttributeValue::S("b".to_owned()));
        assert_eq!(bucket_state(&item).unwrap(), row);
    }
}
