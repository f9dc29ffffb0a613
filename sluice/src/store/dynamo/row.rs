//! Bucket and lease rows in the seed's DynamoDB schema, read and written exactly.
//!
//! Bucket row: `vendor_dimension` S, `capacity` N, `tokens` N, `refill_rate` N,
//! `last_refill_at` N (unix seconds, millisecond fraction), `cost_per_call` N,
//! `limit_type` S, `version` N, sluice's extra `lean` BOOL (only when true) for a bucket in
//! lean mode, and sluice's extra `write_id` S (16 hex digits) stamped by every sluice
//! write.
//!
//! `refill_rate` is tokens per second, as the seed has it: exact when the rate is a decimal
//! of at most 38 significant digits (`10`, `1.667`, `0.000011574074074074`), else rounded
//! toward zero to 38 digits (`8.333333333333333333333333333333333333` for 500 a minute).
//! Then sluice also writes the exact rate as `refill_amount` N (tokens) per
//! `refill_period` N (seconds): `500` per `60`. It reads them back only while they agree
//! with `refill_rate` (another tool that changes the rate changes only `refill_rate`).
//! A rate that does not come to whole billionths of a token per millisecond can leave a
//! part of a billionth earned but not yet added to `tokens` ([`RefillCarry`](crate::RefillCarry)): sluice keeps
//! it in `refill_carry` S, `units/per@millis` (the carry is `units/per` of a billionth of a
//! token as of `last_refill_at` = `millis` since the epoch), and ignores one whose
//! `millis` is not the row's `last_refill_at` (another SDK refilled the row since).
//! Lease row: `vendor_dimension` S (`lease#{dimension}#{unique}`), `dimension` S, `cost` N,
//! `created_at` N, `ttl` N (whole unix seconds, for DynamoDB's TTL), `caller` S, and the
//! extra `expires_at` N (unix seconds, millisecond fraction) that keeps the exact expiry;
//! a lease holding slots of a `concurrent` bucket also carries `slot_dimension` S, the key
//! of the sparse index [`SLOTS_INDEX`] that finds a dimension's slot leases by expiry: its
//! dimension, or its dimension, a space and 1 to 3 ([`slot_key`]: one of [`SLOT_KEYS`]
//! index keys, picked by the lease's key, so that one index key's ceiling does not cap
//! the dimension's slots).
//! sluice sets `ttl` [`TTL_GRACE_SECS`] after `expires_at`: DynamoDB's TTL sweeper must not
//! delete an expired lease before the reconciler has given its cost back. Seed leases
//! without `expires_at` expire at their `ttl`.
//!
//! Rows from other SDKs may carry more decimal places than sluice keeps; they are rounded
//! in the direction that can never over-grant (fewer tokens, slower refill, a later refill
//! timestamp).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::bucket::{Bucket, BucketState, LimitType, RecentWrites};
use crate::clock::UnixMillis;
use crate::decimal::{self, Rounding};
use crate::dimension::Dimension;
use crate::rate::RefillRate;
use crate::store::{LeaseKey, LeaseRecord, StoreError};
use crate::tokens::Tokens;

pub(crate) type Item = HashMap<String, AttributeValue>;

pub(crate) const KEY: &str = "vendor_dimension";
pub(crate) const CAPACITY: &str = "capacity";
pub(crate) const TOKENS: &str = "tokens";
pub(crate) const REFILL_RATE: &str = "refill_rate";
/// sluice's extra bucket attributes: the exact rate, `refill_amount` tokens every
/// `refill_period` seconds, when `refill_rate` cannot hold it.
pub(crate) const REFILL_AMOUNT: &str = "refill_amount";
pub(crate) const REFILL_PERIOD: &str = "refill_period";
/// sluice's extra bucket attribute: the refill carried beside `tokens` (see the module
/// documentation).
pub(crate) const REFILL_CARRY: &str = "refill_carry";
pub(crate) const LAST_REFILL_AT: &str = "last_refill_at";
/// sluice's extra bucket attribute: the refill timestamp a fleet's first writes to a full
/// row share (see [`BucketState::herd_at`]).
pub(crate) const HERD_AT: &str = "herd_at";
pub(crate) const COST_PER_CALL: &str = "cost_per_call";
pub(crate) const LIMIT_TYPE: &str = "limit_type";
pub(crate) const VERSION: &str = "version";
pub(crate) const DIMENSION: &str = "dimension";
pub(crate) const COST: &str = "cost";
pub(crate) const CREATED_AT: &str = "created_at";
pub(crate) const TTL: &str = "ttl";
pub(crate) const CALLER: &str = "caller";
pub(crate) const EXPIRES_AT: &str = "expires_at";
/// sluice's extra bucket attribute: `true` for a bucket in lean mode (no lease rows).
pub(crate) const LEAN: &str = "lean";
/// sluice's extra bucket attribute: the id of the sluice write that produced the row.
pub(crate) const WRITE_ID: &str = "write_id";
/// sluice's extra attribute on bucket rows: the ids of the last writes
/// ([`BucketState::recent_writes`]), 8 bytes each, big-endian, in one binary value.
pub(crate) const RECENT_WRITES: &str = "recent_writes";
/// sluice's extra bucket attribute: the most the bucket holds as learned from the vendor
/// ([`BucketState::burst`]); absent: its capacity.
pub(crate) const BURST: &str = "burst";
/// sluice's extra bucket attribute: how many rows the bucket is spread over
/// ([`BucketState::shards`]), on every one of them; absent: one.
pub(crate) const SHARDS: &str = "shards";
/// sluice's extra bucket attribute: the bucket's own bound on the rows it is spread over
/// ([`ShardLimit`](crate::ShardLimit)), `=N` or `<=N`, on every one of them; absent: none.
pub(crate) const SHARD_LIMIT: &str = "shard_limit";
/// sluice's extra bucket attribute: the writes a second one of the bucket's rows takes at
/// most, as learned from the store's throttles ([`BucketState::write_ceiling`]), on every
/// row; absent: not learned.
pub(crate) const WRITE_CEILING: &str = "write_ceiling";
/// sluice's extra lease attribute on slot leases: the partition key of [`SLOTS_INDEX`].
pub(crate) const SLOT_DIMENSION: &str = "slot_dimension";
/// The sparse global secondary index over slot leases: partition key `slot_dimension`,
/// sort key `expires_at`.
pub const SLOTS_INDEX: &str = "sluice-slots";
/// How many index keys a dimension's slot leases are spread over. Each slot costs its
/// index key a put and a delete: one key takes 500 slots a second (a partition's 1,000
/// write units), what one bucket row takes; four keep the index well clear of the row.
pub(crate) const SLOT_KEYS: u64 = 4;

/// The index key of the `k`-th of a dimension's [`SLOT_KEYS`]: the dimension itself for
/// the first (as every slot lease had it before they were spread), else the dimension, a
/// space (which no dimension holds) and `k`.
pub(crate) fn slot_index_key(dimension: &str, k: u64) -> String {
    if k == 0 {
        dimension.to_owned()
    } else {
        format!("{dimension} {k}")
    }
}

/// The index key of a slot lease: one of its dimension's [`SLOT_KEYS`], by a hash of the
/// lease row's key (the same for every write of the row).
pub(crate) fn slot_key(lease: &LeaseRecord) -> String {
    let hash = lease
        .key
        .as_str()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    slot_index_key(lease.dimension.as_str(), hash % SLOT_KEYS)
}

/// How long after a lease expires its `ttl` lets DynamoDB delete it: well beyond the
/// reconciler's 5-minute schedule, so an expired lease is reconciled, not swept.
pub const TTL_GRACE_SECS: i64 = 3_600;

pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(crate) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub(crate) fn key(k: &str) -> Item {
    HashMap::from([(KEY.to_owned(), s(k))])
}

/// The whole bucket row.
pub(crate) fn bucket_item(state: &BucketState) -> Item {
    let mut item = HashMap::from([
        (KEY.to_owned(), s(state.dimension.as_str())),
        (TOKENS.to_owned(), n(state.tokens)),
        (LAST_REFILL_AT.to_owned(), n(state.last_refill_at)),
        (VERSION.to_owned(), n(state.version)),
    ]);
    item.extend(definition_attributes(&state.bucket));
    if let Some(carry) = carry_value(state.refill_carry, state.last_refill_at) {
        item.insert(REFILL_CARRY.to_owned(), carry);
    }
    if let Some(herd_at) = state.herd_at {
        item.insert(HERD_AT.to_owned(), n(herd_at));
    }
    if let Some(id) = state.write_id {
        item.insert(WRITE_ID.to_owned(), write_id(id));
    }
    if state.shards > 1 {
        item.insert(SHARDS.to_owned(), n(state.shards));
    }
    if let Some(ceiling) = state.write_ceiling {
        item.insert(WRITE_CEILING.to_owned(), n(ceiling));
    }
    if let Some(burst) = state.burst {
        item.insert(BURST.to_owned(), n(burst));
    }
    item.extend(ledger_attributes(&state.shadow));
    item.extend(waiting_attributes(&state.waiting));
    // Also a list with no writes but a forgotten time: that time still settles lost
    // answers, so a row written back keeps it.
    if state.recent_writes != RecentWrites::default() {
        item.insert(
            RECENT_WRITES.to_owned(),
            recent_writes(&state.recent_writes),
        );
    }
    item
}

/// The whole lease row.
pub(crate) fn lease_item(lease: &LeaseRecord) -> Item {
    let mut item = HashMap::from([
        (KEY.to_owned(), s(lease.key.as_str())),
        (DIMENSION.to_owned(), s(lease.dimension.as_str())),
        (COST.to_owned(), n(lease.cost)),
        (CREATED_AT.to_owned(), n(lease.created_at)),
        (
            TTL.to_owned(),
            n(lease.expires_at.as_secs_ceil() + TTL_GRACE_SECS),
        ),
        (EXPIRES_AT.to_owned(), n(lease.expires_at)),
        (CALLER.to_owned(), s(lease.caller.as_str())),
    ]);
    if lease.slot {
        item.insert(SLOT_DIMENSION.to_owned(), s(slot_key(lease)));
    }
    item
}

/// Whether `value` is one of `dimension`'s slot index keys (read without building them:
/// every slot lease a look or a scan lists is checked).
fn is_slot_key(value: &str, dimension: &str) -> bool {
    const _: () = assert!(SLOT_KEYS <= 10, "one digit names a slot key");
    match value.strip_prefix(dimension).map(str::as_bytes) {
        Some([]) => true,
        Some([b' ', k]) => (b'1'..b'0' + SLOT_KEYS as u8).contains(k),
        _ => false,
    }
}

struct Reader<'a> {
    item: &'a Item,
    key: String,
}

impl<'a> Reader<'a> {
    fn new(item: &'a Item) -> Result<Self, StoreError> {
        match item.get(KEY) {
            Some(AttributeValue::S(k)) => Ok(Reader {
                item,
                key: k.clone(),
            }),
            _ => Err(StoreError::CorruptRow {
                key: "?".to_owned(),
                reason: format!("`{KEY}` is missing or not a string (S)"),
            }),
        }
    }

    fn corrupt(&self, reason: impl Into<String>) -> StoreError {
        StoreError::CorruptRow {
            key: self.key.clone(),
            reason: reason.into(),
        }
    }

    fn string(&self, name: &str) -> Result<&'a str, StoreError> {
        match self.item.get(name) {
            Some(AttributeValue::S(v)) => Ok(v),
            Some(other) => Err(self.corrupt(format!(
                "`{name}` must be a string (S), found {}",
                kind(other)
            ))),
            None => Err(self.corrupt(format!("missing attribute `{name}`"))),
        }
    }

    fn number(&self, name: &str) -> Result<Option<&'a str>, StoreError> {
        match self.item.get(name) {
            Some(AttributeValue::N(v)) => Ok(Some(v)),
            Some(other) => Err(self.corrupt(format!(
                "`{name}` must be a number (N), found {}",
                kind(other)
            ))),
            None => Ok(None),
        }
    }

    fn required_number(&self, name: &str) -> Result<&'a str, StoreError> {
        self.number(name)?
            .ok_or_else(|| self.corrupt(format!("missing attribute `{name}`")))
    }

    /// The whole number ≥ 0 `text`, the value of `name`.
    fn count(&self, name: &str, text: &str) -> Result<u64, StoreError> {
        decimal::parse(text, 0, Rounding::Exact)
            .ok()
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| {
                self.corrupt(format!("`{name}` must be a whole number ≥ 0, found {text}"))
            })
    }

    fn tokens(&self, name: &str, rounding: Rounding) -> Result<Tokens, StoreError> {
        self.tokens_text(name, self.required_number(name)?, rounding)
    }

    fn tokens_text(
        &self,
        name: &str,
        text: &str,
        rounding: Rounding,
    ) -> Result<Tokens, StoreError> {
        Tokens::parse_rounded(text, rounding).map_err(|e| self.corrupt(format!("`{name}`: {e}")))
    }

    fn time(&self, text: &str, name: &str, rounding: Rounding) -> Result<UnixMillis, StoreError> {
        UnixMillis::parse_secs(text, rounding).map_err(|e| self.corrupt(format!("`{name}`: {e}")))
    }
}

fn kind(v: &AttributeValue) -> &'static str {
    match v {
        AttributeValue::S(_) => "a string (S)",
        AttributeValue::N(_) => "a number (N)",
        AttributeValue::B(_) => "binary (B)",
        AttributeValue::Bool(_) => "a boolean (BOOL)",
        AttributeValue::Null(_) => "NULL",
        AttributeValue::M(_) => "a map (M)",
        AttributeValue::L(_) => "a list (L)",
        AttributeValue::Ss(_) => "a string set (SS)",
        AttributeValue::Ns(_) => "a number set (NS)",
        AttributeValue::Bs(_) => "a binary set (BS)",
        _ => "an unknown type",
    }
}

/// Reads a bucket row, written by sluice or by another SDK following the seed schema.
pub(crate) fn bucket_state(item: &Item) -> Result<BucketState, StoreError> {
    let r = Reader::new(item)?;
    let dimension = Dimension::from_row_key(&r.key).map_err(|e| r.corrupt(e.to_string()))?;
    let bucket = definition(&r)?;
    let tokens = r.tokens(TOKENS, Rounding::Floor)?;
    let last_refill_at = r.time(
        r.required_number(LAST_REFILL_AT)?,
        LAST_REFILL_AT,
        Rounding::Ceil,
    )?;
    let version = r.count(VERSION, r.required_number(VERSION)?)?;
    let lean = match item.get(LEAN) {
        None => false,
        Some(AttributeValue::Bool(b)) => *b,
        Some(other) => {
            return Err(r.corrupt(format!(
                "`{LEAN}` must be a boolean (BOOL), found {}",
                kind(other)
            )));
        }
    };
    let write_id = read_write_id(&r, item)?;
    let recent_writes = read_recent_writes(&r, item)?;
    let refill_carry = read_carry(&r, last_refill_at)?;
    let shards = read_shards(&r, &dimension)?;
    let bucket = match read_shard_limit(&r, item)? {
        Some(limit) => bucket.with_shards(limit),
        None => bucket,
    }
    .with_mode(read_mode(&r, item)?)
    .with_stored_schedule(read_schedule(&r, item)?);
    let bucket = with_flags(bucket, item, |why| r.corrupt(why))?;
    let state = BucketState {
        dimension,
        bucket: if lean { bucket.lean() } else { bucket },
        tokens,
        last_refill_at,
        refill_carry,
        herd_at: r
            .number(HERD_AT)?
            .map(|text| r.time(text, HERD_AT, Rounding::Ceil))
            .transpose()?,
        version,
        write_id,
        recent_writes,
        // Rounded down: a burst read as more than stored would loosen the bucket.
        burst: r
            .number(BURST)?
            .map(|text| r.tokens_text(BURST, text, Rounding::Floor))
            .transpose()?,
        shards,
        write_ceiling: read_write_ceiling(&r)?,
        shadow: read_ledger(&r)?,
        waiting: read_waiting(&r, item)?,
    };
    // A row that cannot be a bucket (a `requests` row that never refills, a lean
    // `concurrent` one, values beyond every bound) is refused, never used.
    StoreError::check_row(&state)?;
    Ok(state)
}

/// Reads a bucket row's definition: limit type, capacity, refill rate, cost per call.
fn definition(r: &Reader<'_>) -> Result<Bucket, StoreError> {
    let limit_type: LimitType = r
        .string(LIMIT_TYPE)?
        .parse()
        .map_err(|e: crate::bucket::UnknownLimitType| r.corrupt(e.to_string()))?;
    let capacity = r.tokens(CAPACITY, Rounding::Floor)?;
    if capacity <= Tokens::ZERO {
        return Err(r.corrupt(format!("`{CAPACITY}` must be positive, found {capacity}")));
    }
    let refill_rate = read_rate(r)?;
    if refill_rate < RefillRate::ZERO {
        return Err(r.corrupt(format!(
            "`{REFILL_RATE}` must not be negative, found {refill_rate}"
        )));
    }
    let cost_per_call = r.tokens(COST_PER_CALL, Rounding::Ceil)?;
    if cost_per_call.is_negative() {
        return Err(r.corrupt(format!(
            "`{COST_PER_CALL}` must not be negative, found {cost_per_call}"
        )));
    }
    Ok(Bucket::new(limit_type, capacity, refill_rate)
        .with_cost_per_call(cost_per_call)
        .with_reserves(read_reserves(r, r.item)?))
}

/// Reads a lease row.
pub(crate) fn lease_record(item: &Item) -> Result<LeaseRecord, StoreError> {
    let r = Reader::new(item)?;
    let key = LeaseKey::parse(&r.key)
        .ok_or_else(|| r.corrupt("not a lease key (`lease#{vendor}#{metric}#{unique}`)"))?;
    let dimension =
        Dimension::from_row_key(r.string(DIMENSION)?).map_err(|e| r.corrupt(e.to_string()))?;
    let cost = r.tokens(COST, Rounding::Floor)?;
    if cost.is_negative() || cost > Tokens::MAX {
        return Err(r.corrupt(format!(
            "`{COST}` must be between 0 and 10^18, found {cost}"
        )));
    }
    let created_at = match r.number(CREATED_AT)? {
        Some(t) => r.time(t, CREATED_AT, Rounding::Floor)?,
        None => UnixMillis::EPOCH,
    };
    let expires_at = match r.number(EXPIRES_AT)? {
        Some(t) => r.time(t, EXPIRES_AT, Rounding::Ceil)?,
        // Another SDK's lease has only its `ttl`, in whole seconds: its holder's own
        // deadline may lie up to a second after it, which the clock-skew margin must not
        // have to absorb.
        None => r
            .time(r.required_number(TTL)?, TTL, Rounding::Ceil)?
            .saturating_add(std::time::Duration::from_secs(1)),
    };
    let caller = match item.get(CALLER) {
        Some(AttributeValue::S(c)) => c.clone(),
        _ => String::new(),
    };
    let slot = match item.get(SLOT_DIMENSION) {
        None => false,
        Some(AttributeValue::S(d)) if is_slot_key(d, dimension.as_str()) => true,
        Some(other) => {
            return Err(r.corrupt(format!(
                "`{SLOT_DIMENSION}` must be `{dimension}` or `{dimension}` followed by a space \
                 and 1 to {}, found {other:?}",
                SLOT_KEYS - 1
            )));
        }
    };
    Ok(LeaseRecord {
        slot,
        key,
        dimension,
        cost,
        created_at,
        expires_at,
        caller,
    })
}

mod definition;
mod rate;
mod reserves;
mod same;
mod schedule;
mod shadow;
mod waiting;
mod writes;

use definition::with_flags;
pub(crate) use definition::{KEYED, OVERRIDE, definition_attributes};
pub(crate) use rate::{carry_value, rate_attributes};
use rate::{read_carry, read_rate};

use reserves::read_reserves;
pub(crate) use reserves::{RESERVES, reserves_value};
pub(crate) use same::{Expr, same_definition, same_row};
pub(crate) use schedule::SCHEDULE;
use schedule::read_schedule;
pub(crate) use shadow::{MODE, SHADOW_OWED, SHADOW_REFUSED, ledger_attributes, mode_value};
use shadow::{read_ledger, read_mode};
use waiting::read_waiting;
pub(crate) use waiting::{waiting_attribute, waiting_attributes};
use writes::{
    read_recent_writes, read_shard_limit, read_shards, read_write_ceiling, read_write_id,
};
pub(crate) use writes::{recent_writes, write_id};

#[cfg(test)]
mod tests;
