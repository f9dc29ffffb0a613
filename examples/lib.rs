//! Runnable examples of sluice, one per way of using it (see `examples/*.rs`).
//!
//! The library itself holds no code: it exists so that the workspace README's examples are
//! compiled and run as doctests, with every crate of the workspace in reach.

#![forbid(unsafe_code)]

/// The workspace README's examples.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
