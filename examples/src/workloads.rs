//! The benchmark suite: each [`Workload`] owns its inputs and output on a [`Runtime`],
//! launches one library kernel, and checks its output against a float64 CPU reference.
//!
//! # Checks: how far a correct output can be from the reference
//!
//! Every check compares each output element with a float64 reference computed from the
//! same (already rounded) inputs, and passes only when **every** element is within a bound
//! derived from the arithmetic the computation does ([`Check::passed`]):
//!
//! ```text
//! max_i |out_i - ref_i| / scale_i  <=  bound        (elementwise; `Check::max_rel`)
//! sqrt(sum (out_i - ref_i)^2 / sum scale_i^2)  <=  bound   (relative L2; `Check::rel_l2`)
//! ```
//!
//! `scale_i` is the size of the terms element `i` adds up (`|a b| + |c|` for `a b + c`,
//! `|ref_i|` for a single term or a product, see [`rel_l2_scaled`]): rounding errors are
//! relative to the terms, so where terms cancel the result's own size would blame the
//! kernel for the cancellation. The L2 condition follows from the elementwise one (if
//! every `|e_i| <= B s_i` then `sum e_i^2 <= B^2 sum s_i^2`); it is kept because it is the
//! aggregate error the benchmark rows report. The elementwise condition is the one that
//! catches a wrong block: 64 zeroed elements, or 256 elements off by 8 bf16 ulps, in 2^20
//! elements pass a relative-L2 check at 1e-2 (the convenience value the bf16 rows used
//! before) and fail this one (see the tests at the end of this file).
//!
//! ## Deriving the bound
//!
//! Round to nearest in a format with `p` significand bits (the implicit one included)
//! gives `fl(x) = x (1 + d)` with `|d| <= u = 2^-p`, the unit roundoff:
//!
//! | format | p  | u                      |
//! |--------|----|------------------------|
//! | bf16   | 8  | 2^-8  = 3.9e-3 ([`U_BF16`]) |
//! | f16    | 11 | 2^-11 = 4.9e-4 ([`U_F16`])  |
//! | f32    | 24 | 2^-24 = 6.0e-8 ([`U_F32`])  |
//!
//! A value that passes through rounding steps with roundoffs `u_1 .. u_k` carries the
//! factor `prod (1 + d_i)`, so its relative error is at most `prod (1 + u_i) - 1`
//! ([`chain`], about `sum u_i`; Higham, *Accuracy and Stability of Numerical Algorithms*,
//! lemma 3.1). A sum of terms that each went through such a chain, itself rounded, is off
//! by at most that much times the sum of the terms' magnitudes: hence `scale`. A sum of
//! `N` positive terms combined along a tree of depth `D` is off by at most
//! `gamma_D = D u / (1 - D u)` ([`gamma`]) relative to the sum. Reductions here split a row
//! over at least one warp, each lane adding its elements in sequence and the lanes' partial
//! sums combined in a tree, so `D <= ceil(N / 32) + ceil(log2 N)` ([`reduction_depth`]);
//! this covers our kernels, Triton's and PyTorch's block reductions.
//!
//! The GPU's approximate instructions enter as one step with their documented relative
//! error: `ex2.approx.f32` and `rsqrt.approx.f32` at most 2^-21 ([`APPROX_F32`], as
//! `dsl-runtime/src/ir/arith.rs` states; the PTX ISA gives 2^-22 and 2^-22.9),
//! `div.full.f32` at most 2 ulp ([`DIV_FULL_F32`]: an ulp of `x` is at most `2u|x|`), and
//! `tanh.approx.f32` about 2^-11 (PTX ISA: 2^-10.987), for which we allow 2^-10
//! ([`TANH_APPROX_F32`]). `exp(x)` computed as `ex2(x * log2 e)` with `|x| <= X` has
//! relative error at most `X gamma_2 + 2^-21` ([`exp_error`]): the product and the rounding
//! of `log2 e` perturb the exponent by `|x log2 e| gamma_2`, which moves `2^y` by
//! `ln 2 |x log2 e| gamma_2 = |x| gamma_2` relative. The float64 reference's own rounding
//! adds [`REFERENCE`].
//!
//! Where the implementations compared round differently, a workload's bound covers the
//! one that rounds most (PyTorch eager rounds to bf16 after every operation), and the
//! anchors (`bench/anchors.py`) check Triton's and PyTorch's outputs against the same
//! bound (`bench spec` prints them). Each bound's derivation is next to it in
//! [`suite_bounds`], [`softmax_bound`] and [`rmsnorm_bound`]. Inputs are uniform in
//! [-4, 4), which the derivations use.
//!
//! The bounds are worst cases; measured errors sit far below them (the rows report both).

use dsl_runtime::prelude::*;
use dsl_runtime::Result;
use half::{bf16, f16};
use kernels_lib::*;
use rand::{Rng, SeedableRng};
use std::fmt;

/// Unit roundoff of bf16 (8 significand bits): 2^-8.
pub const U_BF16: f64 = 1.0 / 256.0;
/// Unit roundoff of f16 (11 significand bits): 2^-11.
pub const U_F16: f64 = 1.0 / 2048.0;
/// Unit roundoff of f32 (24 significand bits): 2^-24.
pub const U_F32: f64 = 1.0 / 16_777_216.0;
/// Relative error of `ex2.approx.f32` and `rsqrt.approx.f32`: at most 2^-21.
pub const APPROX_F32: f64 = 1.0 / 2_097_152.0;
/// Relative error of `div.full.f32`: 2 ulp, an ulp being at most `2u` relative.
pub const DIV_FULL_F32: f64 = 4.0 * U_F32;
/// Relative error allowed for `tanh.approx.f32`: 2^-10, twice the documented 2^-10.987.
pub const TANH_APPROX_F32: f64 = 1.0 / 1024.0;
/// The float64 reference's own error, relative to the scale: a few roundings at 2^-53.
pub const REFERENCE: f64 = 1.0 / 281_474_976_710_656.0; // 2^-48

/// Largest input magnitude of every workload: uniform in [-4, 4), rounded to the storage
/// type (which can round up to 4).
pub const X_MAX: f64 = 4.0;

/// Relative error after rounding steps with roundoffs `steps`: `prod (1 + u_i) - 1`.
pub fn chain(steps: &[f64]) -> f64 {
    steps.iter().fold(1.0, |p, u| p * (1.0 + u)) - 1.0
}

/// `gamma_k = k u / (1 - k u)`: the relative error of `k` chained roundings, or of a sum of
/// positive terms along a tree of depth `k`.
pub fn gamma(k: f64, u: f64) -> f64 {
    assert!(k * u < 1.0, "gamma_{k} is unbounded at u = {u:e}");
    k * u / (1.0 - k * u)
}

/// Depth of a reduction over `n` terms split over at least one warp: each lane adds its
/// share (`ceil(n / 32)`) in sequence, then the partial sums meet in a tree.
pub fn reduction_depth(n: usize) -> f64 {
    (n.div_ceil(32) + n.max(1).next_power_of_two().trailing_zeros() as usize) as f64
}

/// Relative error of `exp(x)`, `|x| <= x_max`, computed as `ex2(x * log2 e)` in f32.
pub fn exp_error(x_max: f64) -> f64 {
    x_max * gamma(2.0, U_F32) + APPROX_F32
}

/// A matmul of bf16 or f16 inputs accumulated in f32 over `k` products, relative to
/// `sum |a_ip b_pj|`: the products are exact in f32, and each add rounds. Tensor cores are
/// reported to align and add with truncation rather than rounding to nearest inside an
/// instruction (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021), which at
/// most doubles an add's error: `gamma_k` with twice the unit roundoff. An f32 output
/// adds no rounding.
pub fn matmul_bound(k: usize) -> f64 {
    gamma(k as f64, 2.0 * U_F32)
}

/// A matmul of f32 inputs on tensor cores at tf32: each input truncated to 10 mantissa
/// bits (relative error below 2^-10 each, so 2^-9 + 2^-20 per product; rounding, as
/// cuBLAS does, halves that), then the sum of [`matmul_bound`] (its relative error grows
/// by the products' at most).
pub fn matmul_bound_tf32(k: usize) -> f64 {
    let product = 2f64.powi(-9) + 2f64.powi(-20);
    product + matmul_bound(k) * (1.0 + product)
}

/// The bound of every suite workload by (name, dtype), as [`suite`] checks it and
/// `bench spec` prints it for the anchors.
pub fn suite_bounds() -> Vec<(&'static str, &'static str, f64)> {
    // relu(a) b + c, a x + y in f32: the product rounds and the sum rounds (an FMA rounds
    // once).
    let two_f32 = chain(&[U_F32, U_F32]) + REFERENCE;
    vec![
        ("relu_mul_add", "f32", two_f32),
        ("relu_mul_add_unchecked", "f32", two_f32),
        // relu(x) + relu(x) * 2: the product by 2 is exact, the sum rounds.
        ("seed_relu", "f32", chain(&[U_F32]) + REFERENCE),
        // A product of two bf16 values is exact in f32 and rounds to bf16; the sum rounds in
        // f32 and then to bf16 (ours and PyTorch eager round after every operation;
        // Triton and torch.compile may keep f32 in between, which rounds less).
        ("relu_mul_add", "bf16", chain(&[U_BF16, U_F32, U_BF16]) + REFERENCE),
        // 0.75 x rounds, + y rounds.
        ("axpy", "f32", two_f32),
        // x * 0.5 is exact (an f16 value in f32), - 1.25 rounds in f32, the store to f16.
        ("scale_shift", "f16", chain(&[U_F32, U_F16]) + REFERENCE),
        ("gelu_tanh", "f32", gelu_bound()),
        ("silu_mul", "bf16", silu_bound()),
        // Conversions and the integer clamp are exact.
        ("f32_to_bf16", "f32->bf16", 0.0),
        ("bf16_to_f32", "bf16->f32", 0.0),
        ("clamp_i32", "i32", 0.0),
    ]
}

/// GELU, tanh form, in f32. `inner = 0.7978845608 (v + 0.044715 v^3)` takes five roundings
/// and two constants rounded to f32: off by `gamma_7` relative. Since `|z sech^2 z| <= 0.45`,
/// that moves `t = tanh(inner)` by less than `0.5 gamma_7` absolute; `tanh.approx` adds
/// [`TANH_APPROX_F32`] relative to `|t|`; `1 + t` and `0.5 v * (1 + t)` round once each
/// (`0.5 v` is exact). Against the scale `0.5 |v| (1 + |t|)` the error is at most the
/// chain of those.
pub fn gelu_bound() -> f64 {
    chain(&[TANH_APPROX_F32, 0.5 * gamma(7.0, U_F32), U_F32, U_F32]) + REFERENCE
}

/// `silu(g) * up`, f32 math, bf16 storage. `sigmoid(g) = 1 / (1 + exp(-g))`, `|g| <= 4`:
/// the exponential is off by [`exp_error`]`(4)`, `1 + e` by `u` more, the quotient by at most
/// [`DIV_FULL_F32`]; `g * sigmoid` and `* up` round once each; then the store rounds to
/// bf16. PyTorch eager rounds `silu(g)` to bf16 before the product too: two bf16 roundings
/// (ours rounds once).
pub fn silu_bound() -> f64 {
    chain(&[U_BF16, U_BF16, exp_error(X_MAX) + U_F32 + DIV_FULL_F32, U_F32, U_F32]) + REFERENCE
}

/// Row softmax over `n_cols` columns, f32 math, inputs in [-4, 4); `bf16` when stored as
/// bf16. `d = x - max` rounds (absolute error at most `8u`, which moves `exp(d)` by `8u`
/// relative) and `exp(d)` is off by [`exp_error`]`(8)`: each numerator by `e`; the sum by
/// `e` and the reduction's `gamma_D`; the quotient by at most [`DIV_FULL_F32`]; `out =
/// num (1 + e) / (sum (1 + s))`, and `1 / (1 - s) - 1 = s / (1 - s)`. A bf16 store rounds
/// once more.
pub fn softmax_bound(n_cols: usize, bf16: bool) -> f64 {
    let e = exp_error(2.0 * X_MAX) + 2.0 * X_MAX * U_F32;
    let s = chain(&[e, gamma(reduction_depth(n_cols), U_F32)]);
    let f32_math = chain(&[e, s / (1.0 - s), DIV_FULL_F32]);
    if bf16 { chain(&[f32_math, U_BF16]) + REFERENCE } else { f32_math + REFERENCE }
}

/// RMSNorm of bf16 rows over `n_cols` columns, f32 math. Squares of bf16 values are exact
/// in f32; their sum is off by `gamma_D`, `/ n_cols` by [`DIV_FULL_F32`], `+ eps` by `u`:
/// the mean square by `m`. `rsqrt` halves a relative error (`(1 - m)^(-1/2) - 1 <= m / (2 (1 -
/// m))`) and `rsqrt.approx` adds [`APPROX_F32`]; `x * r` and `* w` round once each; the store
/// rounds to bf16, and PyTorch eager may round `x * r` to bf16 before the product by `w`:
/// two bf16 roundings (ours and Triton's round once).
pub fn rmsnorm_bound(n_cols: usize) -> f64 {
    let m = chain(&[gamma(reduction_depth(n_cols), U_F32), DIV_FULL_F32, U_F32]);
    let r = chain(&[m / (2.0 * (1.0 - m)), APPROX_F32]);
    chain(&[r, U_F32, U_F32, U_BF16, U_BF16]) + REFERENCE
}

/// A sum of `n` f32 values by `sum_f32` (each program reduces `block` elements with `warps`
/// warps, each lane adding its `block / (32 warps)` in sequence and the lanes meeting in a
/// tree, then adds its partial sum atomically, in any order): the worst case is the chain of
/// `block / (32 warps) + log2(32 warps) + n / block` roundings, relative to the sum of the
/// magnitudes. It is loose (2^-4 at n = 2^28, BLOCK = 256); rounding errors that do not
/// conspire grow like its square root.
pub fn sum_bound(n: usize, block: usize, warps: usize) -> f64 {
    let lanes = 32 * warps.max(1);
    let depth = block.div_ceil(lanes) + lanes.next_power_of_two().trailing_zeros() as usize + n.div_ceil(block.max(1));
    gamma(depth as f64, U_F32) + REFERENCE
}

/// The configurations the row benchmarks time for a row kernel declared with
/// `#[kernel(tune(ROWS = [1, 2, 4, 8], BLOCK = [64 .. 8192], warps = [1, 2, 4, 8, 16], ..,
/// prune = tuned::row_block))]` (`softmax`, `rmsnorm_bf16` in kernels-lib): those lists,
/// pruned as the autotuner prunes them for this shape. The lists are repeated here from the
/// attribute; keep them in step. `bench spec` prints them, and the anchors sweep the same
/// configurations where their kernel has the same parameters (RMSNorm).
pub fn row_sweep(n_rows: usize, n_cols: usize) -> Vec<autotune::Config> {
    use autotune::{Bucket, Key, Space};
    let space = Space::product().values("ROWS", &ROW_SWEEP_ROWS).values("BLOCK", &[64, 128, 256, 512, 1024, 2048, 4096, 8192]).warps(&ROW_SWEEP_WARPS).stages(&[1]);
    let key = Key::new().with("n_rows", n_rows as i64, Bucket::NextPow2).with("n_cols", n_cols as i64, Bucket::NextPow2);
    space.configs().into_iter().filter(|c| kernels_lib::tuned::row_block(c, &key)).collect()
}

/// `ROWS` candidates of the row kernels' `tune(..)` attribute.
pub const ROW_SWEEP_ROWS: [i64; 4] = [1, 2, 4, 8];
/// `warps` candidates of the row kernels' `tune(..)` attribute.
pub const ROW_SWEEP_WARPS: [u32; 5] = [1, 2, 4, 8, 16];

/// The outcome of checking one output against its reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Check {
    /// `sqrt(sum (out - ref)^2 / sum scale^2)`; infinite on NaN.
    pub rel_l2: f64,
    /// `max |out_i - ref_i| / scale_i`; infinite on NaN or where a zero scale meets an error.
    pub max_rel: f64,
    /// The element where `max_rel` was reached (the first NaN, if any).
    pub worst: usize,
    /// What both measures must not exceed.
    pub bound: f64,
    /// Elements checked.
    pub n: usize,
}

impl Check {
    /// Every element within the bound (which implies the L2 measure is too), no NaN.
    pub fn passed(&self) -> bool {
        self.max_rel <= self.bound && self.rel_l2 <= self.bound
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "largest error {:.3e} x scale at element {} of {} (bound {:.3e}), relative L2 {:.3e}",
            self.max_rel, self.worst, self.n, self.bound, self.rel_l2
        )
    }
}

/// Both error measures of a check, accumulated one element at a time (for outputs too
/// large to copy into `f64` vectors).
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrorStats {
    sq_err: f64,
    sq_scale: f64,
    max_rel: f64,
    worst: usize,
    n: usize,
    nan: bool,
}

impl ErrorStats {
    pub fn push(&mut self, out: f64, reference: f64, scale: f64) {
        let i = self.n;
        self.n += 1;
        let e = if out == reference { 0.0 } else { (out - reference).abs() };
        if e.is_nan() || scale.is_nan() {
            if !self.nan {
                self.nan = true;
                self.worst = i;
            }
            self.max_rel = f64::INFINITY;
            return;
        }
        self.sq_err += e * e;
        self.sq_scale += scale * scale;
        let r = if e == 0.0 { 0.0 } else if scale > 0.0 { e / scale } else { f64::INFINITY };
        if r > self.max_rel && !self.nan {
            self.max_rel = r;
            self.worst = i;
        }
    }
    pub fn rel_l2(&self) -> f64 {
        if self.nan {
            return f64::INFINITY;
        }
        (self.sq_err / self.sq_scale.max(f64::MIN_POSITIVE)).sqrt()
    }
    pub fn judge(&self, bound: f64) -> Check {
        Check { rel_l2: self.rel_l2(), max_rel: self.max_rel, worst: self.worst, bound, n: self.n }
    }
}

/// Check `out` against `reference` elementwise and in L2, relative to `scale` (see the
/// module documentation).
pub fn check(out: &[f64], reference: &[f64], scale: &[f64], bound: f64) -> Check {
    assert_eq!(out.len(), reference.len(), "output and reference differ in length");
    assert_eq!(scale.len(), reference.len(), "scale and reference differ in length");
    let mut s = ErrorStats::default();
    for ((&o, &r), &c) in out.iter().zip(reference).zip(scale) {
        s.push(o, r, c);
    }
    s.judge(bound)
}

/// [`check`] where each reference element is a single term or a product: its scale is its
/// magnitude.
pub fn check_relative(out: &[f64], reference: &[f64], bound: f64) -> Check {
    let scale: Vec<f64> = reference.iter().map(|v| v.abs()).collect();
    check(out, reference, &scale, bound)
}

/// One launch's output (as `f64`), its float64 reference, and the size of the terms each
/// reference element adds up.
pub struct Outputs {
    pub out: Vec<f64>,
    pub reference: Vec<f64>,
    pub scale: Vec<f64>,
}

impl Outputs {
    pub fn check(&self, bound: f64) -> Check {
        check(&self.out, &self.reference, &self.scale, bound)
    }
}

/// One benchmark row.
pub struct Workload {
    /// Kernel name, as the anchors name the same work.
    pub name: &'static str,
    pub dtype: &'static str,
    /// Elements per array.
    pub elements: usize,
    /// Bytes one launch must move at least (each input read once, each output written once).
    pub bytes: usize,
    /// The largest error [`check`](Workload::check) accepts, elementwise and in L2, in units
    /// of the scale ([`suite_bounds`]).
    pub bound: f64,
    ops: Box<dyn Ops>,
}

/// What differs between workloads: the launch and the check.
trait Ops {
    fn launch(&mut self, rt: &Runtime) -> Result<()>;
    /// Output after one launch on freshly written inputs and a NaN-poisoned output, its
    /// float64 reference, and the magnitude of the terms each reference element adds up.
    fn run_once(&mut self, rt: &Runtime) -> Result<Outputs>;
}

impl Workload {
    pub fn launch(&mut self, rt: &Runtime) -> Result<()> {
        self.ops.launch(rt)
    }
    /// One launch on a NaN-poisoned output (call before timing), its output next to the
    /// float64 reference.
    pub fn outputs(&mut self, rt: &Runtime) -> Result<Outputs> {
        self.ops.run_once(rt)
    }
    /// One launch on a NaN-poisoned output, checked against the float64 reference with
    /// this workload's [`bound`](Workload::bound), every element.
    pub fn check(&mut self, rt: &Runtime) -> Result<Check> {
        let bound = self.bound;
        Ok(self.outputs(rt)?.check(bound))
    }
}

/// Numerically stable softmax of each row of a row-major matrix with `cols` columns, in
/// f64 (the reference of the softmax benchmarks and tests).
pub fn softmax_rows(x: &[f64], cols: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - m).exp()).sum();
        out.extend(row.iter().map(|v| (v - m).exp() / sum));
    }
    out
}

/// RMSNorm of each row of a row-major matrix with `cols` columns, in f64:
/// `x / sqrt(mean(x^2) + eps) * w` (the reference of the RMSNorm benchmark and tests).
pub fn rmsnorm_rows(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(w.len()) {
        let rms = (row.iter().map(|v| v * v).sum::<f64>() / w.len() as f64 + eps).sqrt();
        out.extend(row.iter().zip(w).map(|(v, g)| v / rms * g));
    }
    out
}

/// Relative L2 error `|out - reference| / |reference|`; infinite when either holds a NaN
/// (a poisoned output left unwritten) or when a zero reference meets a nonzero output.
/// On its own it misses a wrong block in a large output; checks use [`check`].
pub fn rel_l2(out: &[f64], reference: &[f64]) -> f64 {
    rel_l2_scaled(out, reference, reference)
}

/// `|out - reference| / |scale|` in L2 (infinite on NaN, as [`rel_l2`]). `scale` holds,
/// per element, the magnitude of the terms the reference adds up (`|a b| + |c|` for
/// `a b + c`): rounding errors are relative to the terms, so where they cancel (a single
/// element `a b ≈ -c`) the plain relative error would blame the kernel for the
/// cancellation.
pub fn rel_l2_scaled(out: &[f64], reference: &[f64], scale: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len(), "output and reference differ in length");
    assert_eq!(scale.len(), reference.len(), "scale and reference differ in length");
    if out.iter().chain(reference).any(|x| x.is_nan()) {
        return f64::INFINITY;
    }
    let num: f64 = out.iter().zip(reference).map(|(o, r)| (o - r) * (o - r)).sum();
    let den: f64 = scale.iter().map(|s| s * s).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// A check whose reference elements are single terms: their scale is their size.
fn single_terms(out: Vec<f64>, reference: Vec<f64>) -> Result<Outputs> {
    let scale = reference.iter().map(|v| v.abs()).collect();
    Ok(Outputs { out, reference, scale })
}

/// Uniform values in [-4, 4) from `seed`.
pub fn randoms(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.random_range(-4.0f32..4.0)).collect()
}

fn to<T: Element>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f64(T::DTYPE.round(x as f64))).collect()
}

fn f64s<T: Element>(b: &Buffer<T>) -> Result<Vec<f64>> {
    Ok(b.to_vec()?.into_iter().map(|x| if T::DTYPE.is_float() { x.to_f64() } else { x.to_i64() as f64 }).collect())
}

fn poison<T: Element>(b: &mut Buffer<T>) -> Result<()> {
    let v = if T::DTYPE.is_float() { T::from_f64(f64::NAN) } else { T::from_i64(0x5a) };
    b.copy_from(&vec![v; b.len()])
}

macro_rules! ops {
    ($name:ident { $($field:ident : $ty:ty),* $(,)? }, |$s:ident, $rt:ident| launch $launch:block, check $check:block) => {
        struct $name { $($field: $ty),* }
        impl Ops for $name {
            fn launch(&mut self, $rt: &Runtime) -> Result<()> {
                let $s = self;
                $launch
            }
            fn run_once(&mut self, $rt: &Runtime) -> Result<Outputs> {
                let $s = self;
                $check
            }
        }
    };
}

ops!(ReluMulAdd { h: [Vec<f32>; 3], a: Buffer<f32>, b: Buffer<f32>, c: Buffer<f32>, out: Buffer<f32>, guarded: bool }, |s, rt| launch {
    let n = s.out.len();
    if s.guarded {
        relu_mul_add::<f32, 1024>::launch(rt, grid_for(n, 1024), &s.a, &s.b, &s.c, &mut s.out, n as i32)
    } else {
        // SAFETY: the kernel masks `offs < n` and every buffer holds `n` elements.
        unsafe { relu_mul_add::<f32, 1024>::launch_unchecked(rt, grid_for(n, 1024), &s.a, &s.b, &s.c, &mut s.out, n as i32) }
    }
}, check {
    poison(&mut s.out)?;
    s.launch(rt)?;
    let [a, b, c] = &s.h;
    let terms: Vec<(f64, f64)> = (0..a.len()).map(|i| ((a[i] as f64).max(0.0) * b[i] as f64, c[i] as f64)).collect();
    Ok(Outputs { out: f64s(&s.out)?, reference: terms.iter().map(|(p, c)| p + c).collect(), scale: terms.iter().map(|(p, c)| p.abs() + c.abs()).collect() })
});

/// The fuser's seed, `relu(x) + relu(x) * 2`, written as a graph and compiled by the fuser
/// (one kernel that loads `x` once), run as a plan.
struct SeedRelu {
    h: Vec<f32>,
    x: Buffer<f32>,
    out: Buffer<f32>,
    plan: kernels_lib::graph::Plan,
}

impl SeedRelu {
    fn new(rt: &Runtime, h: &[f32]) -> Result<SeedRelu> {
        let g = kernels_lib::graph::Graph::new();
        let x = g.input("x", dsl_runtime::DType::F32, &[h.len()]);
        g.output("y", x.relu() + x.relu() * 2.0).map_err(plan_error)?;
        let plan = g.compile(rt).map_err(plan_error)?;
        Ok(SeedRelu { h: h.to_vec(), x: rt.upload(h)?, out: rt.zeros(h.len())?, plan })
    }
}

fn plan_error(e: impl std::fmt::Display) -> dsl_runtime::Error {
    dsl_runtime::Error::Launch { kernel: "seed_relu".into(), message: e.to_string() }
}

impl Ops for SeedRelu {
    fn launch(&mut self, rt: &Runtime) -> Result<()> {
        self.plan.run(rt, &[(&self.x).into()], &mut [(&mut self.out).into()]).map_err(plan_error)
    }
    fn run_once(&mut self, rt: &Runtime) -> Result<Outputs> {
        poison(&mut self.out)?;
        self.launch(rt)?;
        single_terms(f64s(&self.out)?, self.h.iter().map(|&v| 3.0 * (v as f64).max(0.0)).collect())
    }
}

ops!(ReluMulAddBf16 { h: [Vec<bf16>; 3], a: Buffer<bf16>, b: Buffer<bf16>, c: Buffer<bf16>, out: Buffer<bf16> }, |s, rt| launch {
    let n = s.out.len();
    relu_mul_add::<bf16, 2048>::launch(rt, grid_for(n, 2048), &s.a, &s.b, &s.c, &mut s.out, n as i32)
}, check {
    poison(&mut s.out)?;
    s.launch(rt)?;
    let [a, b, c] = &s.h;
    let terms: Vec<(f64, f64)> = (0..a.len()).map(|i| (a[i].to_f64().max(0.0) * b[i].to_f64(), c[i].to_f64())).collect();
    Ok(Outputs { out: f64s(&s.out)?, reference: terms.iter().map(|(p, c)| p + c).collect(), scale: terms.iter().map(|(p, c)| p.abs() + c.abs()).collect() })
});

ops!(Axpy { x_h: Vec<f32>, y_h: Vec<f32>, x: Buffer<f32>, y: Buffer<f32> }, |s, rt| launch {
    let n = s.y.len();
    axpy::<1024>::launch(rt, grid_for(n, 1024), 0.75, &s.x, &mut s.y, n as i64)
}, check {
    s.y.copy_from(&s.y_h)?;
    s.launch(rt)?;
    let reference = s.x_h.iter().zip(&s.y_h).map(|(&x, &y)| 0.75 * x as f64 + y as f64).collect();
    let scale = s.x_h.iter().zip(&s.y_h).map(|(&x, &y)| (0.75 * x as f64).abs() + (y as f64).abs()).collect();
    Ok(Outputs { out: f64s(&s.y)?, reference, scale })
});

ops!(ScaleShift { h: Vec<f16>, x: Buffer<f16>, out: Buffer<f16> }, |s, rt| launch {
    let n = s.out.len();
    scale_shift::<2048>::launch(rt, grid_for(n, 2048), &s.x, &mut s.out, 0.5, -1.25, n as i32)
}, check {
    poison(&mut s.out)?;
    s.launch(rt)?;
    let reference = s.h.iter().map(|v| v.to_f64() * 0.5 - 1.25).collect();
    let scale = s.h.iter().map(|v| (v.to_f64() * 0.5).abs() + 1.25).collect();
    Ok(Outputs { out: f64s(&s.out)?, reference, scale })
});

ops!(Gelu { h: Vec<f32>, x: Buffer<f32>, out: Buffer<f32> }, |s, rt| launch {
    let n = s.out.len();
    gelu_tanh::<1024>::launch(rt, grid_for(n, 1024), &s.x, &mut s.out, n as i32)
}, check {
    poison(&mut s.out)?;
    s.launch(rt)?;
    let (reference, scale) = gelu_terms(&s.h);
    Ok(Outputs { out: f64s(&s.out)?, reference, scale })
});

/// GELU (tanh form) of `x` in float64, and the size of its terms: `0.5 v + 0.5 v tanh(..)`,
/// whose terms cancel for negative `v`, so errors are measured against `|0.5 v| + |0.5 v t|`.
/// Returns `(reference, scale)`.
pub fn gelu_terms(x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    x.iter()
        .map(|&v| {
            let v = v as f64;
            let (a, b) = (0.5 * v, 0.5 * v * (0.7978845608 * (v + 0.044715 * v * v * v)).tanh());
            (a + b, a.abs() + b.abs())
        })
        .unzip()
}

ops!(SiluMul { h: [Vec<bf16>; 2], g: Buffer<bf16>, u: Buffer<bf16>, out: Buffer<bf16> }, |s, rt| launch {
    let n = s.out.len();
    silu_mul::<2048>::launch(rt, grid_for(n, 2048), &s.g, &s.u, &mut s.out, n as i32)
}, check {
    poison(&mut s.out)?;
    s.launch(rt)?;
    let [g, u] = &s.h;
    let r = g.iter().zip(u).map(|(g, u)| g.to_f64() / (1.0 + (-g.to_f64()).exp()) * u.to_f64()).collect();
    single_terms(f64s(&s.out)?, r)
});

ops!(ToBf16 { h: Vec<f32>, x: Buffer<f32>, out: Buffer<bf16> }, |s, rt| launch {
    let n = s.out.len();
    convert::<f32, bf16, 2048>::launch(rt, grid_for(n, 2048), &s.x, &mut s.out, n as i32)
}, check {
    poison(&mut s.out)?;
    s.launch(rt)?;
    let r = s.h.iter().map(|&v| bf16::from_f32(v).to_f64()).collect();
    single_terms(f64s(&s.out)?, r)
});

ops!(ToF32 { h: Vec<bf16>, x: Buffer<bf16>, out: Buffer<f32> }, |s, rt| launch {
    let n = s.out.len();
    convert::<bf16, f32, 2048>::launch(rt, grid_for(n, 2048), &s.x, &mut s.out, n as i32)
}, check {
    poison(&mut s.out)?;
    s.launch(rt)?;
    let r = s.h.iter().map(|v| v.to_f64()).collect();
    single_terms(f64s(&s.out)?, r)
});

ops!(Clamp { h: Vec<i32>, x: Buffer<i32>, out: Buffer<i32>, flags: Buffer<u8> }, |s, rt| launch {
    let n = s.out.len();
    clamp_i32::<1024>::launch(rt, grid_for(n, 1024), &s.x, &mut s.out, &mut s.flags, -150, 200, n as i32)
}, check {
    poison(&mut s.out)?;
    poison(&mut s.flags)?;
    s.launch(rt)?;
    let clamped = s.h.iter().map(|&v| v.clamp(-150, 200));
    let flags = s.h.iter().map(|&v| (v != v.clamp(-150, 200)) as i32 as f64);
    let mut out = f64s(&s.out)?;
    out.extend(f64s(&s.flags)?);
    let r = clamped.map(f64::from).chain(flags).collect();
    single_terms(out, r)
});

/// The bound [`suite_bounds`] gives `(name, dtype)`.
pub fn suite_bound(name: &str, dtype: &str) -> f64 {
    suite_bounds().into_iter().find(|b| b.0 == name && b.1 == dtype).unwrap_or_else(|| panic!("no bound for {name} {dtype}")).2
}

/// Every workload at `n` elements per array, with fresh random inputs from `seed`.
pub fn suite(rt: &Runtime, n: usize, seed: u64) -> Result<Vec<Workload>> {
    let f = |k: u64| randoms(n, seed + k);
    let (a, b, c) = (f(0), f(1), f(2));
    let (ha, hb, hc): (Vec<bf16>, Vec<bf16>, Vec<bf16>) = (to(&a), to(&b), to(&c));
    let w = |name, dtype, bytes_per_elem: usize, ops: Box<dyn Ops>| Workload { name, dtype, elements: n, bytes: bytes_per_elem * n, bound: suite_bound(name, dtype), ops };
    let hh: Vec<f16> = to(&a);
    let xi: Vec<i32> = a.iter().map(|v| (v * 100.0) as i32).collect();
    let rma = |guarded| -> Result<Box<dyn Ops>> {
        Ok(Box::new(ReluMulAdd { a: rt.upload(&a)?, b: rt.upload(&b)?, c: rt.upload(&c)?, out: rt.zeros(n)?, h: [a.clone(), b.clone(), c.clone()], guarded }))
    };
    Ok(vec![
        w("relu_mul_add", "f32", 16, rma(true)?),
        // The same launch without the bounds guard (`launch_unchecked`): the guard's cost.
        w("relu_mul_add_unchecked", "f32", 16, rma(false)?),
        w("seed_relu", "f32", 8, Box::new(SeedRelu::new(rt, &a)?)),
        w("relu_mul_add", "bf16", 8, Box::new(ReluMulAddBf16 { a: rt.upload(&ha)?, b: rt.upload(&hb)?, c: rt.upload(&hc)?, out: rt.zeros(n)?, h: [ha.clone(), hb.clone(), hc] })),
        w("axpy", "f32", 12, Box::new(Axpy { x: rt.upload(&a)?, y: rt.upload(&b)?, x_h: a.clone(), y_h: b })),
        w("scale_shift", "f16", 4, Box::new(ScaleShift { x: rt.upload(&hh)?, out: rt.zeros(n)?, h: hh })),
        w("gelu_tanh", "f32", 8, Box::new(Gelu { x: rt.upload(&c)?, out: rt.zeros(n)?, h: c })),
        w("silu_mul", "bf16", 6, Box::new(SiluMul { g: rt.upload(&ha)?, u: rt.upload(&hb)?, out: rt.zeros(n)?, h: [ha.clone(), hb] })),
        w("f32_to_bf16", "f32->bf16", 6, Box::new(ToBf16 { x: rt.upload(&a)?, out: rt.zeros(n)?, h: a })),
        w("bf16_to_f32", "bf16->f32", 6, Box::new(ToF32 { x: rt.upload(&ha)?, out: rt.zeros(n)?, h: ha })),
        w("clamp_i32", "i32", 9, Box::new(Clamp { x: rt.upload(&xi)?, out: rt.zeros(n)?, flags: rt.zeros(n)?, h: xi })),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// relu(a) b + c on bf16 computed as the kernel computes it (each operation rounds to
    /// bf16), next to its float64 reference and scale.
    fn relu_mul_add_bf16_on_the_host(n: usize, seed: u64) -> Outputs {
        let r = |k: u64| -> Vec<bf16> { to(&randoms(n, seed + k)) };
        let (a, b, c) = (r(0), r(1), r(2));
        let mut o = Outputs { out: Vec::with_capacity(n), reference: Vec::with_capacity(n), scale: Vec::with_capacity(n) };
        for i in 0..n {
            let p = bf16::from_f32(a[i].to_f32().max(0.0) * b[i].to_f32());
            o.out.push(bf16::from_f32(p.to_f32() + c[i].to_f32()).to_f64());
            let (p, c) = (a[i].to_f64().max(0.0) * b[i].to_f64(), c[i].to_f64());
            o.reference.push(p + c);
            o.scale.push(p.abs() + c.abs());
        }
        o
    }

    /// One bf16 ulp at `x`: `2^(floor(log2 |x|) - 7)`.
    fn bf16_ulp(x: f64) -> f64 {
        if x == 0.0 { 0.0 } else { (x.abs().log2().floor() - 7.0).exp2() }
    }

    /// The relative-L2 check at 1e-2 that the bf16 rows used before this check existed.
    fn old_check_passes(out: &[f64], o: &Outputs) -> bool {
        rel_l2_scaled(out, &o.reference, &o.scale) <= 1e-2
    }

    // In 2^20 elements of bf16 relu-mul-add, (a) 256 consecutive elements off by 8 bf16 ulps
    // (8-16 u relative; the bound is about 2u) and (b) 64 consecutive elements zeroed pass
    // the old relative-L2 check at 1e-2: (a) moves the L2 measure by about
    // 16 u sqrt(256 / 2^20) = 2^-10, (b) by about sqrt(64 / 2^20) = 2^-7 times the ratio of
    // |ref| to the scale (0.84 in RMS for these inputs). The elementwise check catches
    // both, at an element of the corrupted block.
    #[test]
    fn a_wrong_block_is_caught_where_relative_l2_at_1e_2_passes() {
        let o = relu_mul_add_bf16_on_the_host(1 << 20, 0x5eed);
        let bound = suite_bound("relu_mul_add", "bf16");
        let c = o.check(bound);
        assert!(c.passed(), "correct output rejected: {c}");
        assert!(old_check_passes(&o.out, &o), "the old check rejects the correct output");

        let block = 300_000..300_256;
        let mut off = o.out.clone();
        for i in block.clone() {
            off[i] += 8.0 * bf16_ulp(off[i]);
        }
        assert!(old_check_passes(&off, &o), "the old check was expected to miss this: {:e}", rel_l2_scaled(&off, &o.reference, &o.scale));
        let c = check(&off, &o.reference, &o.scale, bound);
        assert!(!c.passed() && block.contains(&c.worst), "8 ulps off in 256 elements not caught: {c}");

        let block = 700_000..700_064;
        let mut zeroed = o.out.clone();
        zeroed[block.clone()].fill(0.0);
        assert!(old_check_passes(&zeroed, &o), "the old check was expected to miss this: {:e}", rel_l2_scaled(&zeroed, &o.reference, &o.scale));
        let c = check(&zeroed, &o.reference, &o.scale, bound);
        assert!(!c.passed() && block.contains(&c.worst), "64 zeroed elements not caught: {c}");
    }

    #[test]
    fn nan_and_zero_scale_fail_and_exact_bounds_mean_exact() {
        let (r, s) = (vec![1.0, -2.0, 0.0], vec![1.0, 2.0, 0.0]);
        assert!(check(&r, &r, &s, 0.0).passed());
        let c = check(&[1.0, f64::NAN, 0.0], &r, &s, 1.0);
        assert!(!c.passed() && c.worst == 1 && c.rel_l2.is_infinite(), "{c}");
        assert!(!check(&[1.0, -2.0, 1e-300], &r, &s, 1.0).passed(), "an error where the scale is zero");
        assert!(!check(&[1.0, -2.0 * (1.0 + 1e-15), 0.0], &r, &s, 0.0).passed());
    }

    #[test]
    fn bounds_follow_the_rounding_steps() {
        // Two f32 roundings: about 2u.
        let b = suite_bound("relu_mul_add", "f32");
        assert!(b > 2.0 * U_F32 && b < 2.01 * U_F32, "{b:e}");
        // bf16 relu-mul-add: two bf16 roundings and one f32.
        let b = suite_bound("relu_mul_add", "bf16");
        assert!(b > 2.0 * U_BF16 && b < 2.02 * U_BF16, "{b:e}");
        // Softmax: f32 math over 4096 columns is a few hundred u; bf16 adds one bf16 rounding.
        assert!(softmax_bound(4096, false) < 300.0 * U_F32 && softmax_bound(4096, false) > 140.0 * U_F32);
        assert!(softmax_bound(4096, true) < 1.01 * U_BF16);
        assert!(softmax_bound(128, false) < softmax_bound(4096, false));
        // RMSNorm: two bf16 roundings (PyTorch eager's), the f32 part far below.
        assert!(rmsnorm_bound(4096) < 2.02 * U_BF16 && rmsnorm_bound(4096) > 2.0 * U_BF16);
        assert!(gelu_bound() < 1.01 * TANH_APPROX_F32);
        for (name, dtype, b) in suite_bounds() {
            assert!((0.0..0.01).contains(&b), "{name} {dtype}: {b:e}");
        }
    }

    #[test]
    fn row_sweeps_are_the_pruned_tuning_candidates() {
        let s = row_sweep(4096, 4096);
        let rows_warps: Vec<(i64, u32)> = s.iter().map(|c| (c.get("ROWS"), c.num_warps)).collect();
        assert_eq!(rows_warps, vec![(1, 4), (1, 8), (1, 16), (2, 8), (2, 16), (4, 16)]);
        assert!(s.iter().all(|c| c.get("BLOCK") == 4096));
        let s = row_sweep(32768, 128);
        assert_eq!(s.len(), 17);
        assert!(s.iter().all(|c| c.get("BLOCK") == 128));
    }
}
