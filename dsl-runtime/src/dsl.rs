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
//! | `tl.atomic_add(p, v, mask=m)`, `atomic_max/min/xchg`, `tl.atomic_cas(p, cmp, v)` | `atomic_add(p, v, m)`, `atomic_max(p, v, m)`, `atomic_min(p, v, m)`, `atomic_xchg(p, v, m)`, `atomic_cas(p, cmp, v)` (acquire-release, GPU scope) |
//! | `tl.device_assert(c, "msg")`, `tl.device_print("x", x)` | `device_assert(c, "msg")`, `device_print("x = ", x)` (debug builds only) |
//! | `float("inf")` | `f32::INFINITY`, `f32::NEG_INFINITY`, `f32::NAN`, `f32::MAX`, `f32::MIN` |
//!
//! | `@triton.autotune(configs=[..], key=["n"])` | `#[kernel(tune(BLOCK = [..], warps = [..], key = [n], grid = ..))]`, then `name_tuned(&rt, args..)` (the `autotune` crate) |
//!
//! These are the only functions a kernel can call: a kernel body is compiled by
//! `#[kernel]`, not by rustc, so it cannot call Rust functions, methods or closures, nor
//! declare items (`fn`, `const`, ...) of its own. Write a helper's body inline; pass a
//! value known before the launch as a const generic or a scalar parameter.
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

use std::marker::PhantomData;

/// A pointer parameter to device memory holding `T`s: the kernel sees it as a scalar
/// pointer, `p + offsets` gives a block of pointers.
pub struct Ptr<T>(PhantomData<T>);
