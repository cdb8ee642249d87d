//! Kernels written in the DSL.
//!
//! Elementwise kernels over 1-D buffers, each launched with one program per `BLOCK`
//! elements (see [`grid_for`]):
//!
//! - [`relu_mul_add`] (f32) and [`relu_mul_add_bf16`]: `out = max(a, 0) * b + c`, the
//!   fused showcase;
//! - [`axpy`]: `y = alpha * x + y`, in place;
//! - [`scale_shift`]: `out = x * s + t`;
//! - [`gelu_tanh`]: GELU with the tanh approximation;
//! - [`silu_mul`]: `silu(gate) * up`, the SwiGLU activation (bf16 in, bf16 out, f32 math);
//! - [`f32_to_bf16`], [`bf16_to_f32`]: conversions;
//! - [`clamp_i32`]: integer clamp, to exercise integer paths.
//!
//! ```
//! use dsl_runtime::prelude::*;
//! use kernels_lib::{relu_mul_add, grid_for};
//! let rt = Runtime::interpreter();
//! let (a, b, c) = (vec![-1.0f32, 2.0, 3.0], vec![2.0f32; 3], vec![1.0f32; 3]);
//! let mut out = vec![0.0f32; 3];
//! relu_mul_add::<1024>::launch(&rt, grid_for(3, 1024), &a, &b, &c, &mut out, 3).unwrap();
//! assert_eq!(out, vec![1.0, 5.0, 7.0]);
//! ```

use dsl_runtime::prelude::*;

/// One program per `block` elements, 4 warps.
pub fn grid_for(n: usize, block: usize) -> LaunchConfig {
    LaunchConfig::grid(n.div_ceil(block) as u32).warps(4)
}

/// `out = max(a, 0) * b + c` on f32.
#[kernel]
pub fn relu_mul_add<const BLOCK: usize>(a: Ptr<f32>, b: Ptr<f32>, c: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs.lt(n);
    let x = load(a + offs, mask, 0.0);
    store(out + offs, maximum(x, 0.0) * load(b + offs, mask, 0.0) + load(c + offs, mask, 0.0), mask);
}

/// `out = max(a, 0) * b + c` on bf16 (each operation rounds to bf16, as Triton does).
#[kernel]
pub fn relu_mul_add_bf16<const BLOCK: usize>(a: Ptr<bf16>, b: Ptr<bf16>, c: Ptr<bf16>, out: Ptr<bf16>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs < n;
    let x = load(a + offs, mask, 0.0);
    store(out + offs, maximum(x, 0.0) * load(b + offs, mask, 0.0) + load(c + offs, mask, 0.0), mask);
}

/// `y = alpha * x + y`, in place.
#[kernel]
pub fn axpy<const BLOCK: usize>(alpha: f32, x: Ptr<f32>, y: Ptr<f32>, n: i64) {
    let offs = (program_id(0) as i64) * BLOCK + arange::<BLOCK>();
    let mask = offs < n;
    let yv = load(y + offs, mask);
    store(y + offs, alpha * load(x + offs, mask) + yv, mask);
}

/// `out = x * s + t` with f16 storage.
#[kernel]
pub fn scale_shift<const BLOCK: usize>(x: Ptr<f16>, out: Ptr<f16>, s: f32, t: f32, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0) as f32;
    store(out + offs, (v * s + t) as f16, mask);
}

/// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
#[kernel]
pub fn gelu_tanh<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0);
    let inner = 0.7978845608 * (v + 0.044715 * v * v * v);
    store(out + offs, 0.5 * v * (1.0 + tanh(inner)), mask);
}

/// SwiGLU: `silu(gate) * up`, bf16 storage, f32 arithmetic.
#[kernel]
pub fn silu_mul<const BLOCK: usize>(gate: Ptr<bf16>, up: Ptr<bf16>, out: Ptr<bf16>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs < n;
    let g = load(gate + offs, mask, 0.0) as f32;
    let u = load(up + offs, mask, 0.0) as f32;
    store(out + offs, (g * sigmoid(g) * u) as bf16, mask);
}

/// f32 → bf16 (round to nearest even).
#[kernel]
pub fn f32_to_bf16<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<bf16>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs < n;
    store(out + offs, load(x + offs, mask) as bf16, mask);
}

/// bf16 → f32 (exact).
#[kernel]
pub fn bf16_to_f32<const BLOCK: usize>(x: Ptr<bf16>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs < n;
    store(out + offs, load(x + offs, mask).to::<f32>(), mask);
}

/// `out = min(max(x, lo), hi)` on i32, and `flags = (x != clamped) as u8`.
#[kernel]
pub fn clamp_i32<const BLOCK: usize>(x: Ptr<i32>, out: Ptr<i32>, flags: Ptr<u8>, lo: i32, hi: i32, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs < n;
    let v = load(x + offs, mask);
    let c = minimum(maximum(v, lo), hi);
    store(out + offs, c, mask);
    store(flags + offs, (v != c) as u8, mask);
}
