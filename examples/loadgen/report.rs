//! What a worker measured, and how the tables show it.

use std::time::Duration;

/// What one worker process measured.
#[derive(Debug, Default, Clone)]
pub(crate) struct Report {
    pub(crate) grants: u64,
    /// Tokens granted on the dimension that counts (`tpm` in the two-dimension modes), by
    /// acquires that ended before the deadline.
    pub(crate) tokens: u64,
    /// The same, by acquires in flight at the deadline that ended after it.
    pub(crate) late_tokens: u64,
    /// Write units of transactions, as DynamoDB Local reports them (one per item).
    pub(crate) transaction_milliunits: u64,
    pub(crate) denials: u64,
    pub(crate) errors: u64,
    pub(crate) calls: u64,
    pub(crate) read_milliunits: u64,
    pub(crate) write_milliunits: u64,
    pub(crate) cpu_ns: u64,
    pub(crate) latencies_us: Vec<u64>,
}

impl Report {
    pub(crate) fn line(&self) -> String {
        let lat: Vec<String> = self.latencies_us.iter().map(u64::to_string).collect();
        format!(
            "report {} {} {} {} {} {} {} {} {} {} {}",
            self.grants,
            self.tokens,
            self.late_tokens,
            self.transaction_milliunits,
            self.denials,
            self.errors,
            self.calls,
            self.read_milliunits,
            self.write_milliunits,
            self.cpu_ns,
            lat.join(",")
        )
    }

    pub(crate) fn parse(line: &str) -> Option<Report> {
        let mut f = line.strip_prefix("report ")?.split(' ');
        let mut num = || f.next()?.parse::<u64>().ok();
        let mut r = Report {
            grants: num()?,
            tokens: num()?,
            late_tokens: num()?,
            transaction_milliunits: num()?,
            denials: num()?,
            errors: num()?,
            calls: num()?,
            read_milliunits: num()?,
            write_milliunits: num()?,
            cpu_ns: num()?,
            latencies_us: Vec::new(),
        };
        r.latencies_us = f
            .next()
            .unwrap_or("")
            .split(',')
            .filter_map(|v| v.parse().ok())
            .collect();
        Some(r)
    }

    pub(crate) fn merge(&mut self, other: Report) {
        self.grants += other.grants;
        self.tokens += other.tokens;
        self.late_tokens += other.late_tokens;
        self.transaction_milliunits += other.transaction_milliunits;
        self.denials += other.denials;
        self.errors += other.errors;
        self.calls += other.calls;
        self.read_milliunits += other.read_milliunits;
        self.write_milliunits += other.write_milliunits;
        self.cpu_ns += other.cpu_ns;
        self.latencies_us.extend(other.latencies_us);
    }

    /// Write units as real DynamoDB bills them: two per transactional item.
    pub(crate) fn billed_write_milliunits(&self) -> u64 {
        self.write_milliunits + self.transaction_milliunits
    }

    pub(crate) fn percentile(&self, p: usize) -> Duration {
        let mut l = self.latencies_us.clone();
        l.sort_unstable();
        l.get((l.len().saturating_sub(1)) * p / 100)
            .map_or(Duration::ZERO, |us| Duration::from_micros(*us))
    }
}

/// This process's CPU time so far: the sum over its threads of the nanoseconds each has
/// run (`/proc/self/task/*/schedstat`), finer than the 10 ms ticks of `/proc/self/stat`.
pub(crate) fn cpu_time() -> Duration {
    let tasks = std::fs::read_dir("/proc/self/task").expect("read /proc/self/task");
    let nanos: u64 = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

/// A latency for the table: microseconds below a millisecond (a grant from prefetched
/// tokens makes no call), milliseconds above.
pub(crate) fn latency(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{} µs", d.as_micros())
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

pub(crate) fn per_grant(value: u64, grants: u64) -> String {
    if grants == 0 {
        return "-".to_owned();
    }
    format!("{:.2}", value as f64 / grants as f64)
}

pub(crate) fn shape(text: &str) -> (usize, usize) {
    text.split_once('x')
        .and_then(|(p, t)| Some((p.parse::<usize>().ok()?, t.parse::<usize>().ok()?)))
        .expect("shape PROCESSESxTASKS")
}
