//! The proxy against a real DynamoDB Local: what it bills, when it throttles, how it
//! treats transactions, what its counters and its binary do.

mod billing;
mod binary;
mod common;
mod indexes;
mod overhead;
mod partitions;
mod stats;
mod throttling;
mod transactions;
mod ttl;
