//! The write ids sluice stamps on bucket rows: the last write's (`write_id`, 16 hex
//! digits) and the last few (`recent_writes`: one binary value, the forgotten time in 8
//! bytes, then each listed write's id and time in 8 bytes each, big-endian, times in
//! milliseconds since the epoch).

use aws_sdk_dynamodb::types::AttributeValue;

use super::{Item, RECENT_WRITES, Reader, WRITE_ID, kind, s};
use crate::bucket::RecentWrites;
use crate::clock::UnixMillis;
use crate::store::StoreError;

/// A write id as stored.
pub(crate) fn write_id(id: u64) -> AttributeValue {
    s(format!("{id:016x}"))
}

/// A row's recent writes as stored.
pub(crate) fn recent_writes(recent: &RecentWrites) -> AttributeValue {
    let mut bytes = Vec::with_capacity(8 + 16 * recent.writes.len());
    bytes.extend_from_slice(&recent.forgotten.as_millis().to_be_bytes());
    for (id, at) in &recent.writes {
        bytes.extend_from_slice(&id.to_be_bytes());
        bytes.extend_from_slice(&at.as_millis().to_be_bytes());
    }
    AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(bytes))
}

/// Reads the write id a row carries, if any.
pub(super) fn read_write_id(r: &Reader<'_>, item: &Item) -> Result<Option<u64>, StoreError> {
    Ok(match item.get(WRITE_ID) {
        None => None,
        Some(AttributeValue::S(id)) => Some(
            u64::from_str_radix(id, 16)
                .ok()
                .filter(|_| id.len() == 16)
                .ok_or_else(|| {
                    r.corrupt(format!("`{WRITE_ID}` must be 16 hex digits, found {id:?}"))
                })?,
        ),
        Some(other) => {
            return Err(r.corrupt(format!(
                "`{WRITE_ID}` must be a string (S), found {}",
                kind(other)
            )));
        }
    })
}

/// Reads the recent writes a row carries (none when it has no such attribute).
pub(super) fn read_recent_writes(r: &Reader<'_>, item: &Item) -> Result<RecentWrites, StoreError> {
    let bytes = match item.get(RECENT_WRITES) {
        None => return Ok(RecentWrites::default()),
        Some(AttributeValue::B(blob)) => blob.as_ref(),
        Some(other) => {
            return Err(r.corrupt(format!(
                "`{RECENT_WRITES}` must be binary (B), found {}",
                kind(other)
            )));
        }
    };
    let listed = bytes.len().saturating_sub(8) / 16;
    if bytes.len() < 8 || (bytes.len() - 8) % 16 != 0 || listed > crate::bucket::RECENT_WRITES {
        return Err(r.corrupt(format!(
            "`{RECENT_WRITES}` must be 8 bytes and at most {} writes of 16, found {} bytes",
            crate::bucket::RECENT_WRITES,
            bytes.len()
        )));
    }
    let word = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[i..i + 8]);
        b
    };
    let time = |i: usize| {
        let at = UnixMillis::new(i64::from_be_bytes(word(i)));
        if crate::bucket::timestamp_in_range(at) {
            Ok(at)
        } else {
            Err(r.corrupt(format!(
                "`{RECENT_WRITES}`: a timestamp out of range ({} ms)",
                at.as_millis()
            )))
        }
    };
    let forgotten = time(0)?;
    let writes = (0..listed)
        .map(|k| Ok((u64::from_be_bytes(word(8 + 16 * k)), time(16 + 16 * k)?)))
        .collect::<Result<_, StoreError>>()?;
    Ok(RecentWrites { writes, forgotten })
}

/// Reads how many rows a bucket is spread over (one when the row does not say): from 1 to
/// [`MAX_SHARDS`](crate::dimension::MAX_SHARDS), and more than the row's own shard.
pub(super) fn read_shards(
    r: &Reader<'_>,
    dimension: &crate::dimension::Dimension,
) -> Result<u16, StoreError> {
    let Some(text) = r.number(super::SHARDS)? else {
        return Ok(1);
    };
    text.parse::<u16>()
        .ok()
        .filter(|n| (1..=crate::dimension::MAX_SHARDS).contains(n))
        .filter(|n| dimension.shard_index() < *n)
        .ok_or_else(|| {
            r.corrupt(format!(
                "`{}` must be a whole number from 1 to {} above the row's shard, found {text}",
                super::SHARDS,
                crate::dimension::MAX_SHARDS
            ))
        })
}

/// Reads the writes a second a bucket's row takes at most, as learned (a whole number of
/// at least 1), if the row says.
pub(super) fn read_write_ceiling(r: &Reader<'_>) -> Result<Option<u32>, StoreError> {
    let Some(text) = r.number(super::WRITE_CEILING)? else {
        return Ok(None);
    };
    text.parse::<u32>()
        .ok()
        .filter(|n| *n >= 1)
        .map(Some)
        .ok_or_else(|| {
            r.corrupt(format!(
                "`{}` must be a whole number from 1 to {}, found {text}",
                super::WRITE_CEILING,
                u32::MAX
            ))
        })
}

/// Reads a bucket's bound on its rows (`shard_limit` S, `=N` or `<=N`), if it sets one.
pub(super) fn read_shard_limit(
    r: &Reader<'_>,
    item: &Item,
) -> Result<Option<crate::bucket::ShardLimit>, StoreError> {
    if !item.contains_key(super::SHARD_LIMIT) {
        return Ok(None);
    }
    let text = r.string(super::SHARD_LIMIT)?;
    text.parse()
        .map(Some)
        .map_err(|e: crate::bucket::ShardLimitError| r.corrupt(e.to_string()))
}
