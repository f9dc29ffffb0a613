//! DynamoDB rows as the store reads them: bucket rows (with their kept leases and the
//! binary `recent_writes`) and lease rows.
//!
//! The fuzz bytes are decoded into an item by a small structured decoder (see [`item`]):
//! attribute names come mostly from the real ones, values are of every `AttributeValue`
//! kind, numbers mostly from odd decimal strings. Each item is read both as a bucket row
//! and as a lease row; what reads must be refused by neither, and must write back to a row
//! that reads the same.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use sluice::__fuzz::{Item, read_bucket_row, read_lease_row, write_bucket_row, write_lease_row};

use crate::Target;
use crate::input::{Reader, Writer};

/// The row target.
pub const TARGET: Target = Target {
    name: "row",
    dictionary: &[
        b"\x00",
        b"\x01",
        b"\x02",
        b"\xff",
        b"\xf0",
        b"\xf2\x08",
        b"lease#",
        b"#",
    ],
    check,
};

/// The attribute names a name byte below [`CUSTOM_NAME`] picks from.
pub const NAMES: [&str; 27] = [
    "vendor_dimension",
    "capacity",
    "tokens",
    "refill_rate",
    "last_refill_at",
    "cost_per_call",
    "limit_type",
    "version",
    "lean",
    "write_id",
    "recent_writes",
    "dimension",
    "cost",
    "created_at",
    "ttl",
    "caller",
    "expires_at",
    "slot_dimension",
    "lease#a1",
    "lease#a2",
    "lease#",
    "lease#0123456789abcdef",
    "lease",
    "other",
    "refill_amount",
    "refill_period",
    "refill_carry",
];

/// A name byte at or above this is followed by the name itself.
pub const CUSTOM_NAME: u8 = 0xE0;

/// Strings and numbers a selector byte below [`CUSTOM_VALUE`] picks from.
pub const STRINGS: [&str; 16] = [
    "openai#rpm",
    "lease#openai#rpm#a1",
    "requests",
    "tokens",
    "concurrent",
    "0011223344556677",
    "",
    "#",
    "lease#",
    "lease##",
    "a#b#c",
    "openai#tpm",
    "lease#openai#tpm#",
    "elevenlabs#concurrent",
    "worker-1",
    "ffffffffffffffff",
];

/// Odd decimal strings, as numbers (`N`) another SDK or a hand edit may leave.
pub const NUMBERS: [&str; 24] = [
    "0",
    "1",
    "-1",
    "47.0",
    "1.667",
    "1709550002.125",
    "1E+2",
    "1e-400",
    "1e400",
    "-0",
    "0.0000000001",
    "46.666666666666664",
    "170141183460469231731687303715884105727",
    "-170141183460469231731687303715884105728",
    "9223372036854775807",
    "18446744073709551616",
    "1000000000000000000",
    "1000000000000000000.000000001",
    "253402300800",
    "-62135596800",
    "4.2e1",
    ".5",
    "5.",
    "0x10",
];

/// A selector byte at or above this is followed by the value's own text.
pub const CUSTOM_VALUE: u8 = 0x80;

/// How deep lists and maps nest.
const MAX_DEPTH: u32 = 3;

fn check(data: &[u8]) -> u64 {
    let item = item(&mut Reader::new(data));
    let bucket = match read_bucket_row(&item) {
        Ok(state) => {
            let written = write_bucket_row(&state);
            match read_bucket_row(&written) {
                Ok(again) => assert_eq!(again, state, "{item:?} written as {written:?}"),
                Err(e) => panic!("{item:?} written as {written:?} is refused: {e}"),
            }
            1
        }
        Err(e) => super::words(&e.to_string()),
    };
    let lease = match read_lease_row(&item) {
        Ok(lease) => {
            let written = write_lease_row(&lease);
            match read_lease_row(&written) {
                Ok(again) => assert_eq!(again, lease, "{item:?} written as {written:?}"),
                Err(e) => panic!("{item:?} written as {written:?} is refused: {e}"),
            }
            1
        }
        Err(e) => super::words(&e.to_string()),
    };
    bucket.rotate_left(32) ^ lease
}

/// Decodes an item: attributes, each a name then a value, until the bytes run out.
pub fn item(r: &mut Reader<'_>) -> Item {
    let mut item = HashMap::new();
    while !r.is_empty() {
        let name = name(r);
        let value = value(r, 0);
        item.insert(name, value);
    }
    item
}

fn name(r: &mut Reader<'_>) -> String {
    match r.byte() {
        b if b < CUSTOM_NAME => NAMES[usize::from(b) % NAMES.len()].to_owned(),
        _ => r.string(),
    }
}

fn string(r: &mut Reader<'_>) -> String {
    match r.byte() {
        b if b < CUSTOM_VALUE => STRINGS[usize::from(b) % STRINGS.len()].to_owned(),
        _ => r.string(),
    }
}

fn number(r: &mut Reader<'_>) -> String {
    match r.byte() {
        b if b < CUSTOM_VALUE => NUMBERS[usize::from(b) % NUMBERS.len()].to_owned(),
        _ => r.string(),
    }
}

fn blob(r: &mut Reader<'_>) -> Blob {
    Blob::new(r.bytes())
}

fn many<T>(r: &mut Reader<'_>, one: impl Fn(&mut Reader<'_>) -> T) -> Vec<T> {
    let count = r.byte() % 8;
    (0..count).map(|_| one(r)).collect()
}

/// A value: a kind byte (modulo 10), then the value of that kind.
fn value(r: &mut Reader<'_>, depth: u32) -> AttributeValue {
    let nested = depth < MAX_DEPTH;
    match r.byte() % 10 {
        0 => AttributeValue::S(string(r)),
        1 => AttributeValue::N(number(r)),
        2 => AttributeValue::B(blob(r)),
        3 => AttributeValue::Bool(r.byte() & 1 == 1),
        4 => AttributeValue::Null(r.byte() & 1 == 1),
        5 if nested => AttributeValue::L(many(r, |r| value(r, depth + 1))),
        6 if nested => AttributeValue::M(
            many(r, |r| (name(r), value(r, depth + 1)))
                .into_iter()
                .collect(),
        ),
        7 => AttributeValue::Ss(many(r, string)),
        8 => AttributeValue::Ns(many(r, number)),
        9 => AttributeValue::Bs(many(r, blob)),
        _ => AttributeValue::Null(true),
    }
}

/// The bytes that [`item`] decodes into `item` (attributes in name order), for seeds.
pub fn encode(item: &Item) -> Vec<u8> {
    let mut w = Writer::default();
    let mut names: Vec<&String> = item.keys().collect();
    names.sort();
    for name in names {
        encode_name(&mut w, name);
        encode_value(&mut w, &item[name]);
    }
    w.finish()
}

/// Writes an attribute name: its index among [`NAMES`], else the name itself.
fn encode_name(w: &mut Writer, name: &str) {
    match NAMES.iter().position(|n| *n == name) {
        Some(i) => w.byte(i as u8),
        None => {
            w.byte(0xFF);
            w.bytes(name.as_bytes());
        }
    }
}

/// Writes a value; strings and numbers always as their own text.
///
/// # Panics
/// On the kinds seeds do not use (sets), and on lists and maps of 8 or more.
fn encode_value(w: &mut Writer, value: &AttributeValue) {
    let text = |w: &mut Writer, kind: u8, text: &str| {
        w.byte(kind);
        w.byte(0xFF);
        w.bytes(text.as_bytes());
    };
    match value {
        AttributeValue::S(s) => text(w, 0, s),
        AttributeValue::N(n) => text(w, 1, n),
        AttributeValue::B(b) => {
            w.byte(2);
            w.bytes(b.as_ref());
        }
        AttributeValue::Bool(b) => {
            w.byte(3);
            w.byte(u8::from(*b));
        }
        AttributeValue::L(values) => {
            w.byte(5);
            assert!(values.len() < 8, "seed lists are short");
            w.byte(values.len() as u8);
            for v in values {
                encode_value(w, v);
            }
        }
        AttributeValue::M(entries) => {
            w.byte(6);
            assert!(entries.len() < 8, "seed maps are short");
            w.byte(entries.len() as u8);
            let mut names: Vec<&String> = entries.keys().collect();
            names.sort();
            for name in names {
                encode_name(w, name);
                encode_value(w, &entries[name]);
            }
        }
        other => panic!("seeds do not use {other:?}"),
    }
}
