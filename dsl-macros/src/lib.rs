//! `#[kernel]`: turns a block-level Rust function into a GPU kernel.
//!
//! The attribute takes the function apart in three phases, one file each:
//!
//! - `parse.rs`: `syn` syntax → the kernel AST, rejecting syntax the DSL does not have;
//! - `validate.rs`: name resolution and type inference over that AST, reporting every
//!   mistake it can see at its span (a float used as a mask, a store of the wrong element
//!   type, a runtime value where a constant is needed, an unknown function, ...);
//! - `expand.rs`: a unit struct named like the function, implementing
//!   `dsl_runtime::Kernel` (metadata and an IR builder run once per specialization) with
//!   typed `launch` and `unsafe launch_unchecked` functions.
//!
//! Both `validate.rs` and `expand.rs` read `builtins.rs`, the one table of the DSL's
//! functions (name, arity, generics, argument kinds, typing rule, what each builds) and
//! operators.
//!
//! `#[kernel(tune(..))]` also generates `<name>_tuned`, a launch that autotunes over
//! candidates declared in the attribute (`tune.rs`).
//!
//! On errors the macro still emits the struct and its launch functions (when the
//! signature was understood), so one mistake in a body does not cascade into errors at
//! every call site; when a mistake hides which buffers the kernel writes (a `store`
//! through a pointer that could not be typed), those functions accept any buffer
//! arguments. Errors underline the whole expression they are about. The language itself
//! is documented in `dsl_runtime::dsl`.

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
