//! Integration tests, in one binary (each test binary links LLVM statically).
//!
//! - `ui`: compile-fail and compile-pass cases of `#[kernel]` (trybuild);
//! - `interp`: library kernels on the CPU interpreter against CPU references;
//! - `generic`: kernels written once for several element types (f32, f16, bf16), and
//!   each instantiation a kernel of its own;
//! - `helpers`: `#[kernel_fn]` helpers inlined into kernels, and where their errors point;
//! - `attention`: flash attention on the interpreter against an f64 reference, and its
//!   GPU code through ptxas;
//! - `dot`: `dot` and a tiled matmul on the interpreter (its specification), and its
//!   tensor-core lowering through ptxas;
//! - `graph`: tensor graphs compiled into fused kernels (`kernels_lib::graph`), fused
//!   against unfused against references, kernel counts, random graphs (proptest);
//! - `grad`: reverse-mode autodiff of graphs against finite differences, and backward
//!   graphs compiled and run;
//! - `codegen`: every kernel lowered to PTX and assembled by ptxas;
//! - `cache`: compile-cache keys, corruption, concurrency;
//! - `gpu`: the same kernels on a CUDA device (feature `gpu`; run on the GPU machine).

mod attention;
mod bench_smoke;
mod built;
mod cache;
mod codegen;
mod common;
mod dot;
mod generic;
mod grad;
mod graph;
mod gpu;
mod helpers;
mod interp;
mod rows;
mod tune;
mod ui;
