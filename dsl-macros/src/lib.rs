//! `#[kernel]`: turns a block-level Rust function into a GPU kernel; `#[kernel_fn]`: a
//! helper function in the same language, inlined where kernels call it.
//!
//! The attribute takes the function apart in three phases, one file each:
//!
//! - `parse.rs`: `syn` syntax → the kernel AST, rejecting syntax the DSL does not have;
//! - `validate.rs`: name resolution and type inference over that AST, reporting every
//!   mistake it can see at its span (a float used as a mask, a store of the wrong element
//!   type, a runtime value where a constant is needed, an unknown function, ...);
//! - `expand.rs`: a struct named like the function (a unit struct unless it is generic
//!   over element types), implementing `dsl_runtime::Kernel` (metadata and an IR builder
//!   run once per specialization) with typed `launch` and `unsafe launch_unchecked`
//!   functions; for `#[kernel_fn]`, a function and a struct that inline the helper.
//!
//! Both `validate.rs` and `expand.rs` read `builtins.rs`, the one table of the DSL's
//! functions (name, arity, generics, argument kinds, typing rule, what each builds) and
//! operators.
//!
//! `#[kernel(tune(..))]` also generates `<name>_tuned`, a launch that autotunes over
//! candidates declared in the attribute (`tune.rs`); compile-time parameters given no
//! candidates are the caller's (const generics of `<name>_tuned`).
//!
//! On errors the macro still emits the struct and its launch functions (when the
//! signature was understood), so one mistake in a body does not cascade into errors at
//! every call site; when a mistake hides which buffers the kernel writes (a `store`
//! through a pointer that could not be typed), those functions accept any buffer
//! arguments. Errors underline the whole expression they are about. The language itself
//! is documented in `dsl_runtime::dsl`.
//!
//! # Kernels written once for several element types
//!
//! A type parameter bounded by `Float` (f32, f16, bf16) or `Int` (i32, i64, u8) stands for
//! an element type: in `Ptr<T>`, in conversions (`x as T`, `cast::<T>(x)`, `x.to::<T>()`)
//! and in `zeros::<T>`/`full::<T>`. The generated struct is generic over it, so each element
//! type is an instantiation of its own, as each value of a `const` parameter is: its own
//! `KernelId` (the struct's type), its own IR (the parameters' element types, and `T = bf16`
//! among its constants, which error messages show), so its own compile-cache entries, and,
//! with `tune(..)`, its own tuner and results file (`softmax[T=bf16]`). The struct holds a
//! `PhantomData`, so its value is `k::<bf16, 1024>::new()` (every kernel has `new`).
//!
//! ```
//! use dsl_runtime::prelude::*;
//!
//! /// `y = a x + y` in the element type of the buffers.
//! #[kernel]
//! fn axpy<T: Float, const BLOCK: usize>(a: f32, x: Ptr<T>, y: Ptr<T>, n: i32) {
//!     let offs = program_id(0) * BLOCK + arange::<BLOCK>();
//!     let m = offs < n;
//!     // Computed in f32, rounded once to `T`: a store never converts by itself.
//!     let v = a * load(x + offs, m).to::<f32>() + load(y + offs, m).to::<f32>();
//!     store(y + offs, v as T, m);
//! }
//!
//! let rt = Runtime::interpreter();
//! let (x, mut y) = (vec![f16::from_f32(2.0); 10], vec![f16::from_f32(1.0); 10]);
//! axpy::<f16, 64>::launch(&rt, LaunchConfig::grid(1), 0.5, &x, &mut y, 10).unwrap();
//! assert_eq!(y[9].to_f32(), 2.0);
//! let mut y32 = vec![1.0f32; 10];
//! axpy::<_, 64>::launch(&rt, LaunchConfig::grid(1), 0.5, &vec![2.0f32; 10], &mut y32, 10).unwrap(); // `T` inferred
//! assert_eq!(y32[9], 2.0);
//! assert_ne!(axpy::<f16, 64>::new().id(), axpy::<f32, 64>::new().id());
//! ```
//!
//! Validation types a value of `T` as an element type named `T`: `T` with `T` gives `T`;
//! what does not depend on the instantiation is known (`T: Float` with `f32` gives `f32`,
//! the `sum` of a `T: Float` block is `f32`), the rest is left to the IR builder of each
//! instantiation. Mistakes it reports: a type parameter without a bound or with another
//! bound, a scalar parameter of type `T` (it could be a bf16), a store of a value that
//! may not be a `T` (`store(out, v * 2.0)` with `v` in f32), an atomic through a `Ptr<T>`,
//! `tune(T = [..])` (element types are the caller's, not tuned). Launching with an element
//! type outside the bound is rustc's error at the launch (`i32` is not a float element
//! type).
//!
//! # Helper functions: `#[kernel_fn]`
//!
//! `#[kernel_fn]` checks a function written in the kernel language (parse and validate as
//! for a kernel, against its declared parameter and result types) and generates:
//!
//! - a function of the same name taking one `dsl_runtime::ir::Operand` per parameter, so
//!   that rustc checks every call: an unknown name, a wrong number of arguments (E0061,
//!   at the call, with a note at the helper's signature), a Rust function that is not a
//!   helper;
//! - a struct of the same name, what that function returns (the call, not yet inlined),
//!   implementing `dsl_runtime::dsl::KernelFnCall`: its `inline` checks the arguments
//!   against the declared types, infers the helper's type parameters from them (they are
//!   `DType` variables, not Rust generics) and emits the body, whose instructions carry the
//!   helper's own source lines; its `DEPTH` is one more than that of the helpers it calls,
//!   so that a cycle of helpers fails to compile (a direct call of itself is this macro's
//!   error).
//!
//! In a kernel or helper body, a call of a name that is not a builtin (or of a path,
//! `helpers::gelu(x)`) is a helper call: `inline(name(args..), builder, location)`. The
//! kernel's macro does not see the helper, so the call's value is typed as unknown; the IR
//! builder checks it when the kernel is built. A helper does not write memory (no `store`
//! or atomics), because which buffers a kernel writes decides its launch signature.
//!
//! ```
//! use dsl_runtime::prelude::*;
//!
//! /// The lanes of the `N` elements from `start` that are below `n`.
//! #[kernel_fn]
//! fn lanes<const N: usize>(start: i32, n: i32) -> bool {
//!     start + arange::<N>() < n
//! }
//!
//! /// `x * sigmoid(x)` in the element type of `x`.
//! #[kernel_fn]
//! fn silu<T: Float>(x: T) -> T {
//!     x * sigmoid(x)
//! }
//!
//! #[kernel]
//! fn silu_kernel<T: Float, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32) {
//!     let start = program_id(0) * BLOCK;
//!     let m = lanes::<BLOCK>(start, n);
//!     let offs = start + arange::<BLOCK>();
//!     store(out + offs, silu(load(x + offs, m, 0.0).to::<f32>()) as T, m);
//! }
//!
//! let rt = Runtime::interpreter();
//! let mut out = vec![bf16::ZERO; 3];
//! silu_kernel::<bf16, 64>::launch(&rt, LaunchConfig::grid(1), &vec![bf16::from_f32(1.0); 3], &mut out, 3).unwrap();
//! assert_eq!(out[0], bf16::from_f32(0.7310586));
//! ```

use proc_macro::TokenStream;

mod builtins;
mod expand;
mod parse;
mod tune;
mod validate;

/// Compile a block-level Rust function into a kernel. See `dsl_runtime::dsl`.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::kernel(attr.into(), item.into()).into()
}

/// A helper function in the kernel language, inlined where kernels (and other helpers)
/// call it. See `dsl_runtime::dsl`.
#[proc_macro_attribute]
pub fn kernel_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::kernel_fn(attr.into(), item.into()).into()
}
