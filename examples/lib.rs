//! Runnable examples of sluice, one per way of using it (see `examples/*.rs`).
//!
//! The library itself holds no code: it exists so that the workspace README's examples (and
//! the core crate's README) are compiled and run as doctests, with every crate of the
//! workspace in reach.

#![forbid(unsafe_code)]

/// The workspace README's examples.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The core crate's README (its page on crates.io).
#[cfg(doctest)]
#[doc = include_str!("../sluice/README.md")]
struct CoreReadmeDoctests;
