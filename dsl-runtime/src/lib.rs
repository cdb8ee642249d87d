//! The runtime of the kernel DSL: everything between a `#[kernel]` function and its
//! execution on a GPU or on the CPU.
//!
//! ```text
//! #[kernel] fn ...          dsl-macros: parse → validate → expand (a Kernel impl + typed launch)
//!   or built::IrKernel      built:      a Kernel made at run time (name, params, Builder closure)
//!   → compile::build_ir     ir:         block IR for one specialization (Builder)
//!   → passes::optimize      passes:     bounds guard, simplify            (verified after each)
//!   → passes::plan          passes:     dot operands staged in shared memory → loops
//!                                       pipelined (num_stages; TMA tiles on sm_90a, a
//!                                       producer warpgroup if warp-specialized) →
//!                                       axis info → layouts, vector widths → explicit
//!                                       convert_layout ops → shared-memory offsets,
//!                                       tensor maps
//!   → lower::lower          lower:      LLVM IR (inkwell)
//!   → emit::emit_ptx        emit:       PTX (NVPTX backend, default<O3>)
//!   → driver                driver:     cubin (JIT link), module, launch (tensor maps
//!                                       encoded from the arguments)   cache: disk, memory
//!   or interp               interp:     the same IR on host buffers, bounds-checked
//! ```
//!
//! Kernel authors use the [`prelude`]: `#[kernel]`, `#[kernel_fn]` (helper functions), the
//! launch types, and the element-type bounds `Float` and `Int` for kernels written once for
//! several element types. The language is documented in [`dsl`] and the repository README.

pub mod built;
pub mod cache;
pub mod compile;
pub mod diag;
pub mod driver;
pub mod dsl;
pub mod dtype;
pub mod emit;
pub mod error;
pub mod interp;
pub mod ir;
pub mod launch;
pub mod layout;
pub(crate) mod lower;
mod once_map;
pub(crate) mod passes;
pub mod runtime;

pub use dsl_macros::{kernel, kernel_fn};
pub use cudarc;
pub use half;
pub use dtype::{DType, Element};
pub use error::{BuildError, Error, Result};
pub use built::{IrKernel, LaunchArgs};
pub use launch::{Kernel, KernelId, LaunchConfig, Launcher};
pub use runtime::{Buffer, Runtime};

/// What the `#[kernel]` and `#[kernel_fn]` expansions refer to, so that the macro does not
/// depend on where things live in the public API. Not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::{dsl, half, ir, launch};
    pub use crate::{BuildError, Buffer, DType, Element, Kernel, LaunchConfig, Launcher, Result, Runtime};
}

/// What kernel code and launching code need (with [`Kernel`], the trait every `#[kernel]`
/// implements, for kernels chosen at run time: `Box<dyn Kernel>` in an autotuner's dispatch).
pub mod prelude {
    pub use crate::dsl::*;
    pub use crate::{kernel, kernel_fn};
    pub use crate::launch::{InPtr, Kernel, LaunchConfig, Launcher, OutPtr};
    pub use crate::{Buffer, DType, Element, Runtime};
    pub use half::{bf16, f16};
}
