//! Runnable examples of sluice, one per way of using it (see `examples/*.rs`).
//!
//! The library itself holds no code: it exists so that the workspace README's examples (and
//! the published crates' READMEs) are compiled and run as doctests, with every crate of the
//! workspace in reach.

#![forbid(unsafe_code)]

/// The workspace README's examples.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The published crates' READMEs (their pages on crates.io).
#[cfg(doctest)]
#[doc = include_str!("../sluice/README.md")]
struct CoreReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../sluice-tower/README.md")]
struct TowerReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../sluice-reqwest/README.md")]
struct ReqwestReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../sluice-macros/README.md")]
struct MacrosReadmeDoctests;

/// The guide's pages (`docs/`), every Rust example in them compiled (and run, unless marked
/// `no_run`) with every crate of the workspace in reach.
#[cfg(doctest)]
#[doc = include_str!("../docs/concepts.md")]
struct GuideConcepts;

#[cfg(doctest)]
#[doc = include_str!("../docs/layers.md")]
struct GuideLayers;

#[cfg(doctest)]
#[doc = include_str!("../docs/adoption.md")]
struct GuideAdoption;

#[cfg(doctest)]
#[doc = include_str!("../docs/operating.md")]
struct GuideOperating;

#[cfg(doctest)]
#[doc = include_str!("../docs/dynamodb.md")]
struct GuideDynamodb;

#[cfg(doctest)]
#[doc = include_str!("../docs/failures.md")]
struct GuideFailures;

#[cfg(doctest)]
#[doc = include_str!("../docs/performance.md")]
struct GuidePerformance;

#[cfg(doctest)]
#[doc = include_str!("../docs/testing.md")]
struct GuideTesting;
