//! The kernel language, as accepted by `#[kernel]`. This module holds the types that
//! appear in kernel signatures; the functions below exist only inside kernel bodies,
//! where the macro translates them.
//!
//! ```text
//! #[kernel]
//! fn relu_mul_add<const BLOCK: usize>(a: Ptr<f32>, b: Ptr<f32>, c: Ptr<f32>, out: Ptr<f32>, n: i32) {
//!     let offs = program_id(0) * BLOCK + arange::<BLOCK>();
//!     let mask = offs.lt(n);
//!     let x = load(a + offs, mask, 0.0);
//!     store(out + offs, maximum(x, 0.0) * load(b + offs, mask, 0.0) + load(c + offs, mask, 0.0), mask);
//! }
//! ```
//!
//! | Triton | here |
//! |---|---|
//! | `tl.program_id(0)`, `tl.num_programs(0)` | `program_id(0)`, `num_programs(0)` |
//! | `tl.arange(0, BLOCK)` | `arange::<BLOCK>()`, or `arange(START, END)` with constants |
//! | `BLOCK: tl.constexpr` | `const BLOCK: usize` (also `u32`, `i32`, `i64`, `bool`) |
//! | `x_ptr + offs` | `x + offs` (and `x - offs`) |
//! | `tl.load(p, mask=m, other=0.0)` | `load(p, m, 0.0)`, `load(p, m)` (other = 0), `load(p)` |
//! | `tl.store(p, v, mask=m)` | `store(p, v, m)`, `store(p, v)` |
//! | `tl.where(c, a, b)` | `select(c, a, b)` (`where` is a Rust keyword) |
//! | `a < b`, `a & b`, `~m` | `a < b` or `a.lt(b)` (also `a.le(b)`, `a.gt(b)`, `a.ge(b)`, `a.eq(b)`, `a.ne(b)`), `a & b`, `!m` |
//! | `tl.maximum`, `tl.minimum` | `maximum(a, b)`, `minimum(a, b)` |
//! | `tl.fma(a, b, c)` | `fma(a, b, c)`: `a * b + c` rounded once (floats; `fma.rn.f32`). `a * b + c` written out is two roundings: the compiler does not contract it |
//! | `tl.exp`, `tl.exp2`, `tl.log`, `tl.log2`, `tl.sqrt`, `tl.rsqrt`, `tl.abs`, `tl.sin`, `tl.cos` | `exp(x)`, `exp2(x)`, `log(x)`, `log2(x)`, `sqrt(x)`, `rsqrt(x)`, `abs(x)`, `sin(x)`, `cos(x)`, as functions or methods (`x.exp()`) |
//! | `tl.sigmoid`, `libdevice.tanh` | `sigmoid(x)`, `tanh(x)` |
//! | `x.to(tl.bfloat16)` | `x as bf16`, `cast::<bf16>(x)` or `x.to::<bf16>()` (to `f32`, `f16`, `bf16`, `i32`, `i64`, `u8`, `bool`: kernels have no `usize` or `f64` values) |
//! | `if BLOCK > 256:` (constexpr) | `if BLOCK > 256 { .. } else { .. }` (a condition of constants is decided while the IR is built) |
//! | `if x > 0:` (runtime scalar) | `if x > 0 { .. } else { .. }`; variables assigned in a branch come back out |
//! | `for i in range(a, b, s):` | `for i in (a..b).step_by(s) { .. }` (values assigned in the body are carried; `s` may be a `usize` constant such as `BLOCK` on an `i32` range); a range of constants is unrolled; no `while` or `loop` |
//! | `return` | `return;` |
//! | `x[:, None]`, `x[None, :]` | `x.col()`, `x.row()`, or `expand_dims(x, axis)` |
//! | `tl.broadcast_to(x, (M, N))` | `broadcast_to(x, [M, N])` (operands of different shapes broadcast implicitly, NumPy's rules) |
//! | `tl.zeros((M, N), tl.float32)`, `tl.full(shape, v, dtype)` | `zeros::<f32>([M, N])`, `full::<f32>([M, N], v)` |
//! | `tl.reshape`, `tl.trans`, `tl.permute` | `reshape(x, [..])`, `trans(x)`, `permute(x, [..])` |
//! | `tl.sum(x, axis=1)`, `tl.max`, `tl.min`, `tl.argmax`, `tl.argmin` | `x.sum(1)`, `x.max(1)`, `x.min(1)`, `x.argmax(1)`, `x.argmin(1)`; no axis: the whole block |
//! | `tl.cumsum(x, axis=0)` | `x.cumsum(0)` |
//! | `tl.dot(a, b, acc, input_precision="ieee")` | `dot(a, b)`, `dot(a, b, acc)`, `dot(a, b, acc, "ieee")` (bf16/f16/f32 inputs, f32 result; f32 inputs at `"tf32"` by default, `"tf32x3"` or `"ieee"`; M, N, K powers of two ≥ 16; bf16/f16 on tensor cores (`mma.sync`), f32 on the CPU interpreter only for now) |
//! | `tl.atomic_add(p, v, mask=m)`, `atomic_max/min/xchg`, `tl.atomic_cas(p, cmp, v)` | `atomic_add(p, v, m)`, `atomic_max(p, v, m)`, `atomic_min(p, v, m)`, `atomic_xchg(p, v, m)`, `atomic_cas(p, cmp, v)` (acquire-release, GPU scope) |
//! | `tl.atomic_add(p, v, mask=m, sem="relaxed")` | `atomic_add(p, v, m, "relaxed")` (and `max`/`min`/`xchg`): no ordering; an `add` whose result is unread is a reduction (`red`; f32 in vectors on sm_90a with `wgmma` on); the mask is then required (`true` for none) |
//! | `tl.device_assert(c, "msg")`, `tl.device_print("x", x)` | `device_assert(c, "msg")`, `device_print("x = ", x)` (debug builds only) |
//! | `float("inf")` | `f32::INFINITY`, `f32::NEG_INFINITY`, `f32::NAN`, `f32::MAX`, `f32::MIN` |
//!
//! | `@triton.autotune(configs=[..], key=["n"])` | `#[kernel(tune(BLOCK = [..], warps = [..], key = [n], grid = ..))]`, then `name_tuned(&rt, args..)` (the `autotune` crate) |
//!
//! These are the only builtin functions; besides them a kernel calls helpers written in
//! the same language under `#[kernel_fn]` (below). A kernel body is compiled by
//! `#[kernel]`, not by rustc, so it cannot call Rust functions, methods or closures, nor
//! declare items (`fn`, `const`, ...) of its own; pass a value known before the launch as
//! a const generic or a scalar parameter. A call `f(x)` of a name that is not a builtin is
//! a helper call, which rustc resolves: a misspelt builtin called as a function is
//! reported as a function rustc cannot find (E0425); called as a method, `x.laod(m)`, the
//! macro suggests the builtin.
//!
//! Pointers: `p + offsets` keeps the parameter `p` points into. A pointer variable may
//! be advanced in a loop (`p = p + BLOCK`), but one assigned in a runtime `if` or carried
//! by a runtime loop cannot switch to another parameter, and `select` chooses between
//! values, not pointers (choose the offsets instead).
//!
//! Block dimensions may be any size up to 2^20 elements in all: they are padded to powers
//! of two and masked internally (`arange::<48>()`, `arange::<1000>()`).
//!
//! Parameters: `Ptr<T>` for `T` in `f32`, `f16`, `bf16`, `i32`, `i64`, `u8`; scalars
//! `i32`, `i64`, `f32`. Integer literals take the type of the other operand; arithmetic on
//! mixed types promotes (`i32` with `i64` gives `i64`, any float with an integer gives the
//! float, `bf16` with `f32` gives `f32`). A store's value must have the pointee type.
//!
//! # Kernels written once for several element types
//!
//! A kernel may be generic over element types, as a Triton kernel is over the dtypes of the
//! tensors it is given: a type parameter bounded by [`Float`] (f32, f16, bf16) or [`Int`]
//! (i32, i64, u8) stands for the element type in `Ptr<T>`, in conversions (`x as T`,
//! `cast::<T>(x)`, `x.to::<T>()`) and in `zeros::<T>`/`full::<T>`. Each element type is an
//! instantiation of its own, like each value of a `const` parameter: its own
//! [`KernelId`](crate::KernelId), its own IR (so its own compile-cache entry) and its own
//! tuning results. Arithmetic follows the rules above for the concrete type: a `bf16`
//! kernel computes `x * y` in bf16 (rounded after each operation), so a kernel that wants
//! f32 math converts explicitly, as the bf16 kernels always did.
//!
//! ```
//! use dsl_runtime::prelude::*;
//!
//! /// `out = x * s`, computed in f32 whatever the storage type.
//! #[kernel]
//! fn scale<T: Float, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, s: f32, n: i32) {
//!     let offs = program_id(0) * BLOCK + arange::<BLOCK>();
//!     let m = offs < n;
//!     let v = load(x + offs, m, 0.0).to::<f32>();
//!     store(out + offs, (v * s) as T, m);
//! }
//!
//! let rt = Runtime::interpreter();
//! let x = vec![bf16::from_f32(1.5); 5];
//! let mut out = vec![bf16::ZERO; 5];
//! // `T` is inferred from the buffers, as Triton infers dtypes from tensors.
//! scale::<_, 64>::launch(&rt, LaunchConfig::grid(1), &x, &mut out, 2.0, 5).unwrap();
//! assert_eq!(out[4].to_f32(), 3.0);
//! // Each element type is a kernel of its own.
//! assert_ne!(scale::<f32, 64>::new().id(), scale::<bf16, 64>::new().id());
//! ```
//!
//! A kernel with a type parameter is a struct holding a `PhantomData`, so its value is
//! `scale::<bf16, 64>::new()` (`scale::<bf16, 64>` names its type; every kernel has `new`).
//! Scalar parameters keep concrete types (`s: f32` above): a scalar of a generic type could
//! be a bf16, which kernels do not take by value.
//!
//! # Helper functions: `#[kernel_fn]`
//!
//! A function under [`#[kernel_fn]`](crate::kernel_fn) is written in the same language
//! and called from kernels (and from other helpers) like a builtin; its body is inlined
//! into the caller's IR at each call, so it costs nothing at run time, like Triton's
//! `@triton.jit` functions called from a kernel.
//!
//! ```
//! use dsl_runtime::prelude::*;
//!
//! /// GELU, tanh approximation, computed in the type of `x`.
//! #[kernel_fn]
//! fn gelu<T: Float>(x: T) -> T {
//!     0.5 * x * (1.0 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
//! }
//!
//! #[kernel]
//! fn gelu_kernel<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
//!     let offs = program_id(0) * BLOCK + arange::<BLOCK>();
//!     let m = offs < n;
//!     store(out + offs, gelu(load(x + offs, m)), m);
//! }
//!
//! let rt = Runtime::interpreter();
//! let mut out = vec![0.0f32; 3];
//! gelu_kernel::<64>::launch(&rt, LaunchConfig::grid(1), &vec![0.0f32, 1.0, -1.0], &mut out, 3).unwrap();
//! assert!((out[1] - 0.8412).abs() < 1e-3);
//! ```
//!
//! What a helper is:
//!
//! - Its parameters are pointers (`p: Ptr<T>`, a pointer or a block of pointers) or values
//!   of an element type (`x: f32`, `m: bool`, `x: T`), scalars or blocks of any shape; it
//!   returns one such value (`-> T`), or nothing. An argument must have the declared
//!   element type (a literal takes it); shapes are whatever the caller passes.
//! - Its type parameters (`T: Float`, `T: Int`) are inferred from the arguments at each
//!   call, never written; its `const` parameters are given at the call,
//!   `row_max::<BLOCK>(x)`.
//! - Its value is its tail expression: no `return`. It reads memory but does not write it
//!   (no `store` or atomics): which buffers a kernel writes decides its launch signature
//!   (`&mut` arguments), and the kernel's macro sees the kernel, not its helpers.
//! - It may call other helpers, but not itself, directly or through others: the macro
//!   rejects a call to itself, and a cycle through other helpers fails to compile (the
//!   helpers' [`KernelFnCall::DEPTH`] constants would depend on themselves, E0391).
//! - rustc checks each call: an unknown name, a wrong number of arguments, or a Rust
//!   function that is not a helper are errors at the call.
//! - Errors in its body point at its lines: at build time (the macro checks the helper
//!   where it is written) and at run time (inlined instructions keep the helper's source
//!   lines, so the interpreter's out-of-bounds errors name them; an IR build error adds the
//!   helper's name, file and the line of the call).
//!
//! # Helpers as type parameters
//!
//! A kernel may be generic over a helper: a type parameter bounded by [`KernelFn`] alone
//! (`F: KernelFn`) is called in the body as `F(x, ..)`, and each `#[kernel_fn]` given for
//! it (by name, `map::<square, 64>`) makes an instantiation of its own, with its own
//! [`KernelId`](crate::KernelId), IR and cache entries, as a value of a `const` parameter
//! does (FlexAttention's `score_mod` is such a function; `kernels_lib::flash_attention`
//! takes one). The helper is inlined like any other; its name is among the kernel's
//! constants (`F=square`). What it can be: a `#[kernel_fn]` without `const` parameters
//! (its constants would have no call to come from); its number of parameters must be the
//! number of arguments the kernel passes, checked when the kernel is compiled for it (an
//! error at the call `F(..)`). A `#[kernel_fn]` takes no helper type parameters itself.
//!
//! ```
//! use dsl_runtime::prelude::*;
//!
//! #[kernel]
//! fn map<F: KernelFn, const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
//!     let offs = program_id(0) * BLOCK + arange::<BLOCK>();
//!     store(out + offs, F(load(x + offs, offs < n)), offs < n);
//! }
//!
//! #[kernel_fn]
//! fn square(x: f32) -> f32 {
//!     x * x
//! }
//!
//! let rt = Runtime::interpreter();
//! let mut out = vec![0.0f32; 3];
//! map::<square, 64>::launch(&rt, LaunchConfig::grid(1), &vec![1.0f32, 2.0, 3.0], &mut out, 3).unwrap();
//! assert_eq!(out, [1.0, 4.0, 9.0]);
//! ```

use crate::error::BuildError;
use crate::ir::{Builder, Loc, Operand};
use crate::Element;
use std::marker::PhantomData;

/// A pointer parameter to device memory holding `T`s: the kernel sees it as a scalar
/// pointer, `p + offsets` gives a block of pointers.
pub struct Ptr<T>(PhantomData<T>);

/// Float element types, the bound of a kernel's or helper's element type parameter
/// (`T: Float`): `f32`, [`f16`](half::f16), [`bf16`](half::bf16).
///
/// Sealed: its supertrait [`Element`] is.
#[diagnostic::on_unimplemented(message = "`{Self}` is not a float element type", label = "`T: Float` takes f32, f16 or bf16")]
pub trait Float: Element {}
impl Float for f32 {}
impl Float for half::f16 {}
impl Float for half::bf16 {}

/// Integer element types, the bound of a kernel's or helper's element type parameter
/// (`T: Int`): `i32`, `i64`, `u8`.
#[diagnostic::on_unimplemented(message = "`{Self}` is not an integer element type", label = "`T: Int` takes i32, i64 or u8")]
pub trait Int: Element {}
impl Int for i32 {}
impl Int for i64 {}
impl Int for u8 {}

/// The call of a `#[kernel_fn]` helper with its arguments, not yet inlined: what the
/// function `#[kernel_fn]` generates returns. [`inline`](inlining::inline) emits its body.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the call of a `#[kernel_fn]`",
    label = "a kernel calls the DSL's functions and `#[kernel_fn]` helpers, not Rust functions",
    note = "mark the helper `#[kernel_fn]` and write its body in the kernel language (see `dsl_runtime::dsl`)"
)]
pub trait KernelFnCall {
    /// 1 + the largest `DEPTH` of the helpers this one calls. It exists so that a helper
    /// calling itself through others does not compile: the constant would depend on
    /// itself (rustc reports the cycle, E0391).
    const DEPTH: usize;
    /// The helper's compile-time constants as values, `[i64; N]` in their declared order
    /// (`bool`s as 0 or 1): given at each call (`helper::<BM, BN>(..)`), so that one
    /// expansion serves every value.
    type Consts;
    /// Emit the helper's body into `b` for a call at `at` with constants `consts`; its value.
    fn inline(self, consts: Self::Consts, b: &mut Builder, at: Loc) -> Result<Operand, BuildError>;
}

/// A `#[kernel_fn]` as a type: what a kernel generic over a helper (`S: KernelFn`) calls,
/// as `S(x, ..)`, so that one kernel serves several helpers, each instantiation its own
/// kernel (its own `KernelId`, IR and cache entries). The `#[kernel_fn]` expansion
/// implements it for every helper without compile-time constants; the type is the
/// helper's name (`map::<square, 64>`). See "Helpers as type parameters" in the
/// [module docs](self).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a `#[kernel_fn]` that a kernel can take as a type parameter",
    label = "a `KernelFn` type parameter takes the name of a `#[kernel_fn]`",
    note = "a helper with `const` parameters cannot be passed as a type: its constants are given at each call"
)]
pub trait KernelFn: KernelFnCall<Consts = [i64; 0]> + Sized + 'static {
    /// The helper's name (in the kernel's constants: `S=softcap`).
    const NAME: &'static str;
    /// How many parameters it takes.
    const ARITY: usize;
    /// The call with `args`; `None` when there are not [`ARITY`](KernelFn::ARITY) of them.
    fn call(args: &[Operand]) -> Option<Self>;
}

/// A compile-time constant as a type: what `<name>_tuned` of a `#[kernel(tune(..))]`
/// keys its tuners by when the caller gives some of the kernel's constants (one tuner per
/// value, as per element type).
pub struct ConstUsize<const N: usize>;
/// See [`ConstUsize`].
pub struct ConstU32<const N: u32>;
/// See [`ConstUsize`].
pub struct ConstI32<const N: i32>;
/// See [`ConstUsize`].
pub struct ConstI64<const N: i64>;
/// See [`ConstUsize`].
pub struct ConstBool<const B: bool>;

/// The derivative of helper `F` with respect to its first argument, as a helper of the
/// same parameters: `Derivative<F>` inlines `F` and differentiates the instructions it
/// emitted, forward mode ([`Builder::derivative_since`](crate::ir::Builder::derivative_since)
/// has the rules). What a flash-attention score modification can give as its `Grad`
/// (FlexAttention differentiates its `score_mod` the same way). Elementwise code only: a
/// helper whose result depends on its first argument through a reduction, a `dot`, a runtime
/// `if` or loop fails to build, naming itself; give that derivative by hand.
///
/// ```
/// use dsl_runtime::prelude::*;
///
/// #[kernel_fn]
/// fn softplus(x: f32) -> f32 {
///     log(1.0 + exp(x))
/// }
///
/// #[kernel]
/// fn map<F: KernelFn, const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
///     let offs = program_id(0) * BLOCK + arange::<BLOCK>();
///     store(out + offs, F(load(x + offs, offs < n)), offs < n);
/// }
///
/// let rt = Runtime::interpreter();
/// let mut out = vec![0.0f32; 2];
/// map::<Derivative<softplus>, 64>::launch(&rt, LaunchConfig::grid(1), &vec![0.0f32, 2.0], &mut out, 2).unwrap();
/// // softplus' = sigmoid
/// assert!((out[0] - 0.5).abs() < 1e-6 && (out[1] - 0.880797).abs() < 1e-6);
/// ```
pub struct Derivative<F> {
    args: Vec<Operand>,
    helper: PhantomData<fn() -> F>,
}

// Not suggested in errors about other types (it is a wrapper, not a helper one writes).
#[diagnostic::do_not_recommend]
impl<F: KernelFn> KernelFnCall for Derivative<F> {
    const DEPTH: usize = F::DEPTH + 1;
    type Consts = [i64; 0];
    fn inline(self, _: [i64; 0], b: &mut Builder, at: Loc) -> Result<Operand, BuildError> {
        let call = F::call(&self.args).ok_or_else(|| BuildError::new(at, format!("`{}` takes {} arguments", F::NAME, F::ARITY)))?;
        let from = b.values_built();
        let y = call.inline([], b, at)?;
        match self.args.first() {
            Some(&Operand::V(x)) => b.derivative_since(from, x, y, F::NAME, at),
            // A literal first argument: nothing to differentiate against.
            _ => Ok(Operand::Float(0.0)),
        }
    }
}

// Not suggested in errors about other types (it is a wrapper, not a helper one writes).
#[diagnostic::do_not_recommend]
impl<F: KernelFn> KernelFn for Derivative<F> {
    const NAME: &'static str = "Derivative";
    const ARITY: usize = F::ARITY;
    fn call(args: &[Operand]) -> Option<Self> {
        (args.len() == F::ARITY).then(|| Derivative { args: args.to_vec(), helper: PhantomData })
    }
}

/// A helper whose body is given at run time: a call `S(x, ..)` of a kernel generic over
/// `S: KernelFn`, with `S = Hook<N>` (`N` arguments), emits what the builder's hook
/// ([`Builder::set_hook`], a [`HookFn`](crate::ir::builder::HookFn): pure, and returning
/// a value of its first argument's type, which the call checks) emits for the call's
/// arguments. A kernel built this way is
/// launched as [`IrKernel::hooked`](crate::IrKernel::hooked) makes it: the hook's code is
/// in its IR, so its identity (and every cache entry) is that of the code the hook emits;
/// built without a hook, the call is an error naming the kernel. What a graph compiler
/// needs to compile code it found at run time into a library kernel's hook (the graph
/// fuser's elementwise operations on attention scores); `Derivative<Hook<N>>`
/// differentiates it as any helper.
///
/// ```
/// use dsl_runtime::prelude::*;
/// use dsl_runtime::ir::{BinOp, Operand};
/// use dsl_runtime::IrKernel;
/// use std::sync::Arc;
///
/// #[kernel]
/// fn map<F: KernelFn, const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
///     let offs = program_id(0) * BLOCK + arange::<BLOCK>();
///     store(out + offs, F(load(x + offs, offs < n)), offs < n);
/// }
///
/// // x * 3 + 1, decided at run time.
/// let body = Arc::new(|b: &mut dsl_runtime::ir::Builder, args: &[Operand], at| {
///     let y = b.binary(BinOp::Mul, args[0], Operand::Float(3.0), at)?;
///     Ok(Operand::V(b.binary(BinOp::Add, y, Operand::Float(1.0), at)?))
/// });
/// let k = IrKernel::hooked(map::<Hook<1>, 64>::new(), body).unwrap();
/// let rt = Runtime::interpreter();
/// let mut out = vec![0.0f32; 2];
/// map::<Hook<1>, 64>::launch_as(&k, &rt, LaunchConfig::grid(1), &vec![1.0f32, 2.0], &mut out, 2).unwrap();
/// assert_eq!(out, [4.0, 7.0]);
/// ```
pub struct Hook<const N: usize> {
    args: Vec<Operand>,
}

// Not suggested in errors about other types (a helper is written with `#[kernel_fn]`).
#[diagnostic::do_not_recommend]
impl<const N: usize> KernelFnCall for Hook<N> {
    const DEPTH: usize = 1;
    type Consts = [i64; 0];
    fn inline(self, _: [i64; 0], b: &mut Builder, at: Loc) -> Result<Operand, BuildError> {
        let hook = b.hook().ok_or_else(|| BuildError::new(at, "a `Hook` call in a kernel built without a hook: launch the kernel `IrKernel::hooked` makes of it"))?;
        let y = hook(b, &self.args, at)?;
        // Its result of the first argument's type (element type and shape), as the call
        // site expects of a helper that maps it.
        if let (Some(&Operand::V(x)), y) = (self.args.first(), y) {
            let want = b.ty(x).clone();
            let got = match y {
                Operand::V(v) => Some(b.ty(v).clone()),
                _ => None,
            };
            if got.as_ref() != Some(&want) {
                let got = got.map_or_else(|| format!("{y:?}"), |t| t.to_string());
                return Err(BuildError::new(at, format!("the hook returned {got} where its first argument is {want}")));
            }
        }
        Ok(y)
    }
}

// Not suggested in errors about other types (a helper is written with `#[kernel_fn]`).
#[diagnostic::do_not_recommend]
impl<const N: usize> KernelFn for Hook<N> {
    const NAME: &'static str = "hook";
    const ARITY: usize = N;
    fn call(args: &[Operand]) -> Option<Self> {
        (args.len() == N).then(|| Hook { args: args.to_vec() })
    }
}

/// What the `#[kernel_fn]` expansion calls: [`inline`](inlining::inline) (also for kernels
/// built at run time), and the checks of a helper's arguments and result at each call.
pub mod inlining {
    use super::KernelFnCall;
    use crate::error::BuildError;
    use crate::ir::{Builder, Loc, Operand};
    use crate::DType;

    /// The bound of an element type parameter, as a helper checks it when it is inlined.
    #[doc(hidden)]
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Bound {
        Float,
        Int,
    }

    impl Bound {
        /// The element types that satisfy it.
        pub fn admits(self, d: DType) -> bool {
            match self {
                Bound::Float => d.is_float(),
                Bound::Int => d.is_int(),
            }
        }
        fn describe(self) -> &'static str {
            match self {
                Bound::Float => "`Float` takes f32, f16 or bf16",
                Bound::Int => "`Int` takes i32, i64 or u8",
            }
        }
    }

    /// Inline the helper call `call` at `at`: what a kernel's expansion emits for a call of a
    /// `#[kernel_fn]`, and what a kernel built at run time ([`IrKernel`](crate::IrKernel))
    /// can call too.
    ///
    /// ```
    /// use dsl_runtime::prelude::*;
    /// use dsl_runtime::ir::{Builder, Loc, Operand, ParamKind};
    /// use dsl_runtime::dsl::inlining::inline;
    ///
    /// #[kernel_fn]
    /// fn twice(x: f32) -> f32 {
    ///     x + x
    /// }
    ///
    /// let mut b = Builder::new("k", &[("x", ParamKind::Scalar(DType::F32)), ("n", ParamKind::Scalar(DType::I32))]);
    /// let x = Operand::V(b.param(0));
    /// let y = inline(twice(x), &mut b, Loc::new(1, 1)).unwrap();
    /// assert_eq!(b.dtype_of_operand(y), DType::F32);
    /// // Arguments must have the declared element type; the error is at the call.
    /// let err = inline(twice(Operand::V(b.param(1))), &mut b, Loc::new(2, 1)).unwrap_err();
    /// assert_eq!(err.loc, Loc::new(2, 1));
    /// assert!(err.message.contains("`twice` takes an f32 as `x`, found an i32 scalar"), "{err}");
    /// ```
    pub fn inline<C: KernelFnCall<Consts = [i64; 0]>>(call: C, b: &mut Builder, at: Loc) -> Result<Operand, BuildError> {
        call.inline([], b, at)
    }

    /// [`inline`] for a helper with compile-time constants: their values, in the order the
    /// helper declares them (what a kernel's expansion emits for every call).
    pub fn inline_with<C: KernelFnCall<Consts = K>, K>(call: C, consts: K, b: &mut Builder, at: Loc) -> Result<Operand, BuildError> {
        call.inline(consts, b, at)
    }

    /// Inline helper `F`, a kernel's type parameter (`S: KernelFn`), with `args`: what a
    /// kernel's expansion emits for a call `S(x, ..)`. The number of arguments is checked
    /// when the kernel is compiled for `F` (a constant that fails to evaluate, at the
    /// call), and again here.
    #[doc(hidden)]
    pub fn inline_fn<F: super::KernelFn, const N: usize>(args: [Operand; N], b: &mut Builder, at: Loc) -> Result<Operand, BuildError> {
        const {
            assert!(F::ARITY == N, "the `#[kernel_fn]` given for this type parameter takes a different number of arguments than this call passes");
        }
        match F::call(&args) {
            Some(call) => call.inline([], b, at),
            None => Err(BuildError::new(at, format!("`{}` takes {} arguments, this call passes {N}", F::NAME, F::ARITY))),
        }
    }

    /// The `DEPTH` of the helper a closure calls, without calling it (see
    /// [`KernelFnCall::DEPTH`]).
    #[doc(hidden)]
    pub const fn depth_of<C: KernelFnCall, F: FnOnce() -> C>(_: &F) -> usize {
        C::DEPTH
    }

    /// The largest of `depths` (0 for none).
    #[doc(hidden)]
    pub const fn max_depth(depths: &[usize]) -> usize {
        let mut m = 0;
        let mut i = 0;
        while i < depths.len() {
            if depths[i] > m {
                m = depths[i];
            }
            i += 1;
        }
        m
    }

    /// An element type in a helper's signature: a concrete one, or type parameter `i`.
    #[doc(hidden)]
    #[derive(Clone, Copy, Debug)]
    pub enum Elem {
        Is(DType),
        Param(usize),
    }

    /// A parameter or the result of a helper, as declared.
    #[doc(hidden)]
    #[derive(Clone, Copy, Debug)]
    pub enum Want {
        /// `p: Ptr<E>`: a pointer or a block of pointers to `E`.
        Ptr(Elem),
        /// `x: E`: a scalar or block of `E`.
        Value(Elem),
    }

    /// One inlining of a helper: its name and source, and the call's location. The
    /// `#[kernel_fn]` expansion checks the arguments and the result through it.
    #[doc(hidden)]
    pub struct HelperSite {
        pub name: &'static str,
        pub file: &'static str,
        pub line: u32,
        /// The call.
        pub at: Loc,
    }

    fn article(d: DType) -> &'static str {
        match d {
            DType::F32 | DType::F16 | DType::I32 | DType::I64 => "an",
            _ => "a",
        }
    }

    /// What an operand is, for messages: "a [4, 128] block of f32", "an f32 scalar",
    /// "a pointer to bf16", "the literal 2".
    fn describe(b: &Builder, o: Operand) -> String {
        match o {
            Operand::V(v) => {
                let t = b.ty(v);
                match (t.ptr, t.is_scalar()) {
                    (true, true) => format!("a pointer to {}", t.dtype),
                    (true, false) => format!("a {:?} block of pointers to {}", t.shape, t.dtype),
                    (false, true) => format!("{} {} scalar", article(t.dtype), t.dtype),
                    (false, false) => format!("a {:?} block of {}", t.shape, t.dtype),
                }
            }
            Operand::Int(i) => format!("the literal {i}"),
            Operand::Float(x) => format!("the literal {x:?}"),
            Operand::Bool(x) => format!("the literal {x}"),
        }
    }

    impl HelperSite {
        fn err<T>(&self, msg: String) -> Result<T, BuildError> {
            Err(BuildError::new(self.at, msg))
        }

        /// Check the arguments of the call against the declared parameters (`name`, the
        /// argument, what it must be), infer the type parameters (`name`, bound) from them, and
        /// give literals the declared type. Errors are at the call.
        pub fn bind<const N: usize, const M: usize>(
            &self,
            b: &mut Builder,
            args: [(&'static str, Operand, Want); N],
            types: [(&'static str, Bound); M],
        ) -> Result<([Operand; N], [DType; M]), BuildError> {
            let name = self.name;
            // Type parameters, from the arguments that are values (not literals), in order.
            let mut bound: [Option<(DType, &str)>; M] = [None; M];
            for &(param, a, want) in &args {
                let (is_ptr, elem) = match want {
                    Want::Ptr(e) => (true, e),
                    Want::Value(e) => (false, e),
                };
                let Operand::V(v) = a else {
                    if is_ptr {
                        return self.err(format!("`{name}` takes a pointer as `{param}`, found {}", describe(b, a)));
                    }
                    continue;
                };
                let t = b.ty(v).clone();
                if t.ptr != is_ptr {
                    let what = if is_ptr { "a pointer (`ptr + offsets`)" } else { "a value, not a pointer" };
                    return self.err(format!("`{name}` takes {what} as `{param}`, found {}", describe(b, a)));
                }
                match elem {
                    Elem::Is(d) if d != t.dtype => {
                        let want = if is_ptr { format!("a pointer to {d}") } else { format!("{} {d}", article(d)) };
                        return self.err(format!("`{name}` takes {want} as `{param}`, found {} (convert it with `as {d}`)", describe(b, a)));
                    }
                    Elem::Is(_) => {}
                    Elem::Param(i) => match bound[i] {
                        None => {
                            let (tname, bnd) = types[i];
                            if !bnd.admits(t.dtype) {
                                return self.err(format!("`{name}`'s `{tname}` would be {} (from `{param}`), but {}", t.dtype, bnd.describe()));
                            }
                            bound[i] = Some((t.dtype, param));
                        }
                        Some((d, from)) if d != t.dtype => {
                            let (tname, _) = types[i];
                            return self.err(format!(
                                "`{name}` takes `{from}` and `{param}` of one element type `{tname}`, found {d} and {} (convert one with `as`)",
                                t.dtype
                            ));
                        }
                        Some(_) => {}
                    },
                }
            }
            // A type parameter only literals give: the type they take alone, floats for `Float`.
            for &(param, a, want) in &args {
                let Want::Value(Elem::Param(i)) = want else { continue };
                if bound[i].is_some() {
                    continue;
                }
                let (tname, bnd) = types[i];
                let d = match (a, bnd) {
                    (Operand::Int(_) | Operand::Float(_), Bound::Float) => DType::F32,
                    _ => b.dtype_of_operand(a),
                };
                if !bnd.admits(d) {
                    return self.err(format!("`{name}`'s `{tname}` would be {d} (from `{param}`), but {}", bnd.describe()));
                }
                bound[i] = Some((d, param));
            }
            let mut dtypes = [DType::F32; M];
            for (i, (d, t)) in dtypes.iter_mut().zip(&bound).enumerate() {
                match t {
                    Some((x, _)) => *d = *x,
                    None => return self.err(format!("`{name}`: no argument gives its type parameter `{}`", types[i].0)),
                }
            }
            let mut out = [Operand::Bool(false); N];
            for (o, &(_, a, want)) in out.iter_mut().zip(&args) {
                *o = match (a, want) {
                    (Operand::V(_), _) => a,
                    (_, Want::Value(e)) => Operand::V(b.cast(a, resolve(e, &dtypes), self.at)?),
                    (_, Want::Ptr(_)) => unreachable!("literal pointers are rejected above"),
                };
            }
            Ok((out, dtypes))
        }

        /// Check the helper's value (at `loc`, its tail expression) against the declared
        /// result; a literal takes the declared type.
        pub fn result(&self, b: &mut Builder, v: Operand, want: Want, types: &[DType], loc: Loc) -> Result<Operand, BuildError> {
            let name = self.name;
            let (is_ptr, d) = match want {
                Want::Ptr(e) => (true, resolve(e, types)),
                Want::Value(e) => (false, resolve(e, types)),
            };
            let ok = match v {
                Operand::V(x) => {
                    let t = b.ty(x);
                    t.ptr == is_ptr && t.dtype == d && !t.unit
                }
                _ => !is_ptr,
            };
            if !ok {
                let want = if is_ptr { format!("a pointer to {d}") } else { format!("{} {d}", article(d)) };
                return Err(self.wrap(BuildError::new(loc, format!("`{name}` returns {want}, but its value is {}", describe(b, v)))));
            }
            match v {
                Operand::V(_) => Ok(v),
                lit => Ok(Operand::V(b.cast(lit, d, loc)?)),
            }
        }

        /// An error from the helper's body: it keeps its location (a line of the helper) and
        /// says which helper, where, and from which call.
        pub fn wrap(&self, e: BuildError) -> BuildError {
            let at = self.at;
            BuildError::new(e.loc, format!("{} (in `#[kernel_fn] {}` at {}:{}, inlined at line {}:{})", e.message, self.name, self.file, self.line, at.line, at.col))
        }
    }

    fn resolve(e: Elem, types: &[DType]) -> DType {
        match e {
            Elem::Is(d) => d,
            Elem::Param(i) => types[i],
        }
    }
}
