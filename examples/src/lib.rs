//! Benchmark workloads shared by the `bench` example (timed on the GPU) and the test
//! suite (smoke mode on the interpreter), so every benchmark is also a correctness check.
//!
//! A later capability adds a row by adding a [`Workload`](workloads::Workload) to [`suite`](workloads::suite) and, for its
//! anchors, a function to `bench/anchors.py`.

pub mod workloads;

/// The repository README: its Rust snippets compile and run as this crate's doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
