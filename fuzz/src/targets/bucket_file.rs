//! The bucket file of `sluice apply` (TOML), as the CLI reads it.
//!
//! Input: the file's text (bytes that are not UTF-8 become U+FFFD). What reads must be
//! valid buckets, and must read the same once written back as a file.

use std::fmt::Write as _;

use sluice::{Bucket, Dimension, LimitType};

use crate::Target;

/// The bucket-file target.
pub const TARGET: Target = Target {
    name: "bucket_file",
    dictionary: &[
        b"[\"",
        b"\"]",
        b"\n",
        b" = ",
        b"type",
        b"\"requests\"",
        b"\"tokens\"",
        b"\"concurrent\"",
        b"refill",
        b"capacity",
        b"cost_per_call",
        b"lean",
        b"true",
        b"false",
        b"/min",
        b"/s",
        b"/h",
        b"/day",
        b"#",
        b"1e18",
        b"0.000000001",
        b"-1",
        b"nan",
        b"inf",
        b"9223372036854775807",
        b"'",
        b"\"\"\"",
        b"[[",
        b"{ }",
        b"1979-05-27T07:32:00Z",
        b"reserves = [",
        b"{ priority = \"",
        b"reserve = ",
        b"%",
    ],
    check,
};

fn check(data: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(data);
    match sluice::__cli::parse(&text) {
        Ok(buckets) => {
            for (dimension, bucket) in &buckets {
                assert!(bucket.validate().is_ok(), "{dimension}: {bucket:?}");
            }
            let written = write(&buckets);
            assert_eq!(
                sluice::__cli::parse(&written).as_ref(),
                Ok(&buckets),
                "{text:?} written back as {written:?}"
            );
            buckets.len() as u64
        }
        Err(e) => super::words(&e),
    }
}

/// A bucket file that defines `buckets`, every field written out.
fn write(buckets: &[(Dimension, Bucket)]) -> String {
    let mut file = String::new();
    for (dimension, b) in buckets {
        let _ = writeln!(file, "[{}]", quoted(dimension.as_str()));
        let _ = writeln!(file, "type = \"{}\"", b.limit_type());
        let _ = writeln!(file, "capacity = \"{}\"", b.capacity());
        if b.limit_type() != LimitType::Concurrent {
            let _ = writeln!(file, "refill = \"{}\"", b.refill_rate());
        }
        let _ = writeln!(file, "cost_per_call = \"{}\"", b.cost_per_call());
        let reserves: Vec<String> = b
            .reserves()
            .iter()
            .map(|r| {
                format!(
                    "{{ priority = \"{}\", reserve = \"{}\" }}",
                    r.priority, r.tokens
                )
            })
            .collect();
        let _ = writeln!(file, "reserves = [{}]", reserves.join(", "));
        let _ = writeln!(file, "lean = {}\n", !b.keeps_leases());
    }
    file
}

/// A TOML basic string.
fn quoted(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
