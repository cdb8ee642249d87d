//! Kernels written in the DSL.
//!
//! Elementwise kernels over 1-D buffers, each launched with one program per `BLOCK`
//! elements (see [`grid_for`]):
//!
//! - [`relu_mul_add`]: `out = max(a, 0) * b + c`, the fused showcase, for any float
//!   element type (`relu_mul_add::<f32, 1024>`, `relu_mul_add::<bf16, 2048>`);
//! - [`axpy`]: `y = alpha * x + y`, in place;
//! - [`scale_shift`]: `out = x * s + t`;
//! - [`gelu_tanh`]: GELU with the tanh approximation;
//! - [`silu_mul`]: `silu(gate) * up`, the SwiGLU activation (bf16 in, bf16 out, f32 math);
//! - [`convert`]: between float element types (`convert::<f32, bf16, 1024>`);
//! - [`clamp_i32`]: integer clamp, to exercise integer paths.
//!
//! Row kernels over row-major matrices, one program per row (see [`rows_grid`]) or per
//! `ROWS` rows:
//!
//! - [`softmax`] (any float element type, f32 math, `ROWS` rows per program, any row
//!   length, autotuned by `softmax_tuned`);
//! - [`rmsnorm_bf16`] (`ROWS` rows per program, any row length, autotuned by
//!   `rmsnorm_bf16_tuned`) and [`layernorm`] (looping, any row length);
//! - [`row_sum_mean`]: `ROWS` rows per program as a 2-D block;
//! - [`transpose`]: tiled, coalesced on both sides through shared memory.
//!
//! Attention: [`attention`] (flash-attention forward, grouped-query heads, causal or
//! full) and its backward (`attention_backward`); module [`flash_attention`].
//!
//! Matrix product: [`matmul`] (bf16/f16 in, f32 or 16-bit out, strided operands, masked
//! edges, grouped program order, autotuned by `matmul_tuned` over tiles, warps and
//! pipeline stages; tensor cores through `dot`, measured on the H100 in BENCHMARKS.md),
//! [`matmul_epilogue`] (the same with `act(.. * scale + bias) + residual` applied before
//! the store: a linear layer in one kernel), [`matmul_batched`] (up to two batch
//! dimensions on grid axes 1 and 2, batch strides, 0 to share a matrix), and
//! [`matmul_persistent`] (a loop over tiles in each program, for a grid of the GPU's size).
//!
//! Kernels generic over their element type are one kernel per type, as each value of a
//! `const` parameter is: `T` is given (`relu_mul_add::<f32, 1024>`) or inferred from the
//! buffers (`relu_mul_add::<_, 1024>`).
//!
//! ```
//! use dsl_runtime::prelude::*;
//! use kernels_lib::{relu_mul_add, grid_for};
//! let rt = Runtime::interpreter();
//! let (a, b, c) = (vec![-1.0f32, 2.0, 3.0], vec![2.0f32; 3], vec![1.0f32; 3]);
//! let mut out = vec![0.0f32; 3];
//! relu_mul_add::<f32, 1024>::launch(&rt, grid_for(3, 1024), &a, &b, &c, &mut out, 3).unwrap();
//! assert_eq!(out, vec![1.0, 5.0, 7.0]);
//! ```
//!
//! Graphs of tensor operations compiled into fused kernels built at run time: [`graph`]
//! (`relu(x) + relu(x) * 2` as one kernel that loads `x` once and computes `relu(x)` once).
//!
//! Helpers (`#[kernel_fn]`) the kernels share, inlined where they are called: [`gelu()`],
//! [`silu()`], [`rsqrt_mean()`] (RMSNorm and LayerNorm), [`row_softmax()`] and [`exp_minus()`]
//! (softmax).

use dsl_runtime::prelude::*;

/// One program per `block` elements, 4 warps.
pub fn grid_for(n: usize, block: usize) -> LaunchConfig {
    LaunchConfig::grid(n.div_ceil(block) as u32).warps(4)
}

/// `out = max(a, 0) * b + c`, computed in the element type (f16 and bf16 round after each
/// operation, as Triton does). `relu_mul_add_tuned` autotunes block and warps per length
/// and element type.
#[kernel(tune(BLOCK = [256, 512, 1024, 2048, 4096], warps = [2, 4, 8], key = [n], grid = (n as usize).div_ceil(BLOCK), prune = tuned::enough_work))]
pub fn relu_mul_add<T: Float, const BLOCK: usize>(a: Ptr<T>, b: Ptr<T>, c: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs.lt(n);
    let x = load(a + offs, mask, 0.0);
    store(out + offs, maximum(x, 0.0) * load(b + offs, mask, 0.0) + load(c + offs, mask, 0.0), mask);
}

/// `y = alpha * x + y`, in place. `axpy_tuned` autotunes the block and warps per length
/// (blocks with at least one element per thread).
#[kernel(tune(BLOCK = [256, 512, 1024, 2048], warps = [2, 4, 8], key = [n], grid = (n as usize).div_ceil(BLOCK), prune = tuned::enough_work))]
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

/// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, in the
/// element type of `x`.
#[kernel_fn]
pub fn gelu<T: Float>(x: T) -> T {
    let inner = 0.7978845608 * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + tanh(inner))
}

/// SiLU (swish): `x * sigmoid(x)`, in the element type of `x`.
#[kernel_fn]
pub fn silu<T: Float>(x: T) -> T {
    x * sigmoid(x)
}

/// GELU ([`gelu()`]) over a buffer: `out = gelu(x)`, f32.
#[kernel(tune(BLOCK = [256, 512, 1024, 2048], warps = [2, 4, 8], key = [n], grid = (n as usize).div_ceil(BLOCK)))]
pub fn gelu_tanh<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs < n;
    store(out + offs, gelu(load(x + offs, mask, 0.0)), mask);
}

/// SwiGLU: `silu(gate) * up` ([`silu()`]), bf16 storage, f32 arithmetic.
#[kernel]
pub fn silu_mul<const BLOCK: usize>(gate: Ptr<bf16>, up: Ptr<bf16>, out: Ptr<bf16>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs < n;
    let g = load(gate + offs, mask, 0.0) as f32;
    let u = load(up + offs, mask, 0.0) as f32;
    store(out + offs, (silu(g) * u) as bf16, mask);
}

/// Conversion between float element types: `convert::<f32, bf16, B>` rounds to nearest
/// even, `convert::<bf16, f32, B>` is exact.
#[kernel]
pub fn convert<S: Float, D: Float, const BLOCK: usize>(x: Ptr<S>, out: Ptr<D>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mask = offs < n;
    store(out + offs, load(x + offs, mask).to::<D>(), mask);
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

// ---------------------------------------------------------------------------------------
// Row-wise kernels: one program per row of a row-major matrix (`stride` elements apart),
// `BLOCK` columns at a time. When `BLOCK` covers the row (`BLOCK >= n_cols`, any size,
// padded internally) the row stays in registers; otherwise the kernels loop over it.

/// The softmax of each row of a 2-D block `v` (rows along axis 0): `exp(v - max) / sum`
/// per row.
#[kernel_fn]
pub fn row_softmax(v: f32) -> f32 {
    let e = exp(v - v.max(1).col());
    e / e.sum(1).col()
}

/// `exp(x - shift)` of the elements `p` points to where `mask` holds, in f32 (where it
/// does not: `exp(-shift)`).
#[kernel_fn]
pub fn exp_minus<T: Float>(p: Ptr<T>, mask: bool, shift: f32) -> f32 {
    exp(load(p, mask, 0.0).to::<f32>() - shift)
}

/// Row softmax, numerically stable: `out[r, c] = exp(x[r, c] - max_r) / sum_r`, for any
/// float element type, computed in f32; `ROWS` rows per program (grid: `n_rows / ROWS`
/// rounded up; several rows per program keep short rows from leaving most threads idle).
/// Rows longer than `BLOCK` take three passes over memory (max, sum, write).
///
/// `softmax_tuned` picks `ROWS` and `num_warps` per (rows, columns) bucket and element type;
/// `BLOCK` is the row length's next power of two (from 64 up to 8192, which loops beyond).
#[kernel(tune(ROWS = [1, 2, 4, 8], BLOCK = [64, 128, 256, 512, 1024, 2048, 4096, 8192], warps = [1, 2, 4, 8, 16], key = [n_rows, n_cols], grid = (n_rows as usize).div_ceil(ROWS), prune = tuned::row_block))]
pub fn softmax<T: Float, const ROWS: usize, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n_rows: i32, n_cols: i32, stride: i32) {
    let rows = program_id(0) * ROWS + arange::<ROWS>();
    let cols = arange::<BLOCK>();
    let base = rows.col() * stride;
    // Columns to touch per row: none past the last row (one comparison per element).
    let limit = select(rows < n_rows, n_cols, 0).col();
    if BLOCK as i32 >= n_cols {
        let m = cols.row() < limit;
        let v = load(x + base + cols.row(), m, -f32::INFINITY as T).to::<f32>();
        store(out + base + cols.row(), row_softmax(v).to::<T>(), m);
    } else {
        let mut mx = full::<f32>([ROWS], f32::MIN);
        for c0 in (0..n_cols).step_by(BLOCK as i32) {
            let c = (c0 + cols).row();
            mx = maximum(mx, load(x + base + c, c < limit, f32::MIN).to::<f32>().max(1));
        }
        let mx = mx.col();
        let mut s = zeros::<f32>([ROWS]);
        for c0 in (0..n_cols).step_by(BLOCK as i32) {
            let c = (c0 + cols).row();
            let m = c < limit;
            s = s + select(m, exp_minus(x + base + c, m, mx), 0.0).sum(1);
        }
        let s = s.col();
        for c0 in (0..n_cols).step_by(BLOCK as i32) {
            let c = (c0 + cols).row();
            let m = c < limit;
            store(out + base + c, (exp_minus(x + base + c, m, mx) / s).to::<T>(), m);
        }
    }
}

/// `1 / sqrt(sum / n + eps)`: the reciprocal root mean of `n` terms that add up to `sum`
/// (squares for RMSNorm, squared deviations for LayerNorm).
#[kernel_fn]
pub fn rsqrt_mean(sum: f32, n: i32, eps: f32) -> f32 {
    rsqrt(sum / (n as f32) + eps)
}

/// RMSNorm: `out = x / sqrt(mean(x^2) + eps) * w`, bf16 storage, f32 math, `ROWS` rows
/// per program (grid: `n_rows / ROWS` rounded up). Rows longer than `BLOCK` take two
/// passes over memory (sum of squares, write).
///
/// `rmsnorm_bf16_tuned` picks `ROWS` and `num_warps` per (rows, columns) bucket; `BLOCK`
/// is the row length's next power of two (from 64 up to 8192, which loops beyond).
#[kernel(tune(ROWS = [1, 2, 4, 8], BLOCK = [64, 128, 256, 512, 1024, 2048, 4096, 8192], warps = [1, 2, 4, 8, 16], key = [n_rows, n_cols], grid = (n_rows as usize).div_ceil(ROWS), prune = tuned::row_block))]
pub fn rmsnorm_bf16<const ROWS: usize, const BLOCK: usize>(x: Ptr<bf16>, w: Ptr<bf16>, out: Ptr<bf16>, n_rows: i32, n_cols: i32, stride: i32, eps: f32) {
    let rows = program_id(0) * ROWS + arange::<ROWS>();
    let cols = arange::<BLOCK>();
    let base = rows.col() * stride;
    // Columns to touch per row: none past the last row (one comparison per element).
    let limit = select(rows < n_rows, n_cols, 0).col();
    if BLOCK as i32 >= n_cols {
        let g = load(w + cols, cols < n_cols, 0.0) as f32;
        let m = cols.row() < limit;
        let v = load(x + base + cols.row(), m, 0.0) as f32;
        let r = rsqrt_mean((v * v).sum(1), n_cols, eps);
        store(out + base + cols.row(), (v * r.col() * g.row()) as bf16, m);
    } else {
        let mut sq = zeros::<f32>([ROWS, BLOCK]);
        for c0 in (0..n_cols).step_by(BLOCK as i32) {
            let c = (c0 + cols).row();
            let v = load(x + base + c, c < limit, 0.0) as f32;
            sq = sq + v * v;
        }
        let r = rsqrt_mean(sq.sum(1), n_cols, eps).col();
        for c0 in (0..n_cols).step_by(BLOCK as i32) {
            let c = c0 + cols;
            let m = c.row() < limit;
            let g = load(w + c, c < n_cols, 0.0) as f32;
            let v = load(x + base + c.row(), m, 0.0) as f32;
            store(out + base + c.row(), (v * r * g.row()) as bf16, m);
        }
    }
}

/// LayerNorm: `out = (x - mean) / sqrt(var + eps) * w + b` (f32), looping over the row
/// in `BLOCK` chunks, so any row length works.
#[kernel]
pub fn layernorm<const BLOCK: usize>(x: Ptr<f32>, w: Ptr<f32>, b: Ptr<f32>, out: Ptr<f32>, n_cols: i32, stride: i32, eps: f32) {
    let base = program_id(0) * stride;
    let cols = arange::<BLOCK>();
    let mut acc = zeros::<f32>([BLOCK]);
    for c0 in (0..n_cols).step_by(BLOCK as i32) {
        acc = acc + load(x + base + c0 + cols, (c0 + cols) < n_cols, 0.0);
    }
    let mean = acc.sum() / (n_cols as f32);
    let mut sq = zeros::<f32>([BLOCK]);
    for c0 in (0..n_cols).step_by(BLOCK as i32) {
        let m = (c0 + cols) < n_cols;
        let d = select(m, load(x + base + c0 + cols, m, 0.0) - mean, 0.0);
        sq = sq + d * d;
    }
    let rstd = rsqrt_mean(sq.sum(), n_cols, eps);
    for c0 in (0..n_cols).step_by(BLOCK as i32) {
        let m = (c0 + cols) < n_cols;
        let y = (load(x + base + c0 + cols, m, 0.0) - mean) * rstd;
        store(out + base + c0 + cols, y * load(w + c0 + cols, m, 0.0) + load(b + c0 + cols, m, 0.0), m);
    }
}

/// Row sums and means of an f32 matrix (`sums[r]`, `means[r]`), `ROWS` rows per program
/// as a 2-D block.
#[kernel]
pub fn row_sum_mean<const ROWS: usize, const BLOCK: usize>(x: Ptr<f32>, sums: Ptr<f32>, means: Ptr<f32>, n_rows: i32, n_cols: i32, stride: i32) {
    let rows = program_id(0) * ROWS + arange::<ROWS>();
    let cols = arange::<BLOCK>();
    let mut acc = zeros::<f32>([ROWS]);
    for c0 in (0..n_cols).step_by(BLOCK as i32) {
        let c = c0 + cols;
        let m = rows.col().lt(n_rows) & c.row().lt(n_cols);
        acc = acc + load(x + rows.col() * stride + c.row(), m, 0.0).sum(1);
    }
    store(sums + rows, acc, rows < n_rows);
    store(means + rows, acc / (n_cols as f32), rows < n_rows);
}

/// `out = x^T` for a row-major `rows x cols` f32 matrix, in `TILE x TILE` tiles (grid:
/// `(cols / TILE, rows / TILE)` rounded up). Both the load and the store are coalesced;
/// the tile is transposed through shared memory.
#[kernel]
pub fn transpose<const TILE: usize>(x: Ptr<f32>, out: Ptr<f32>, rows: i32, cols: i32) {
    let r = program_id(1) * TILE + arange::<TILE>();
    let c = program_id(0) * TILE + arange::<TILE>();
    let m = r.col().lt(rows) & c.row().lt(cols);
    let tile = load(x + r.col() * cols + c.row(), m);
    store(out + c.col() * rows + r.row(), trans(tile), trans(m));
}

/// The first row of tile `pid` (a program's `program_id(0)`) of the `BM x BN` tiles of an
/// `m x n` product, in Triton's grouped order: tiles go down `GROUP_M` tile rows before the
/// next tile column, so that neighbouring programs share tiles of `b` in L2. With
/// [`tile_col()`] (the same arithmetic, computed once in the kernel: the IR's common
/// subexpressions are merged).
#[kernel_fn]
pub fn tile_row<const BM: usize, const BN: usize, const GROUP_M: usize>(pid: i32, m: i32, n: i32) -> i32 {
    let tiles_m = (m + (BM as i32 - 1)) / BM as i32;
    let per_group = GROUP_M as i32 * ((n + (BN as i32 - 1)) / BN as i32);
    let first_m = pid / per_group * GROUP_M as i32;
    let group_m = minimum(tiles_m - first_m, GROUP_M as i32);
    (first_m + pid % per_group % group_m) * BM
}

/// The first column of tile `pid`, in the order of [`tile_row()`].
#[kernel_fn]
pub fn tile_col<const BM: usize, const BN: usize, const GROUP_M: usize>(pid: i32, m: i32, n: i32) -> i32 {
    let tiles_m = (m + (BM as i32 - 1)) / BM as i32;
    let per_group = GROUP_M as i32 * ((n + (BN as i32 - 1)) / BN as i32);
    let first_m = pid / per_group * GROUP_M as i32;
    let group_m = minimum(tiles_m - first_m, GROUP_M as i32);
    pid % per_group / group_m * BN
}

/// The main loop of [`matmul`] and [`matmul_batched`]: the f32 product of rows `rm` of `a`
/// and columns `rn` of `b` (`[BM, BN]`), `BK` of K at a time, masked at the edges.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub fn matmul_acc<T: Float, const BM: usize, const BN: usize, const BK: usize>(
    a: Ptr<T>, b: Ptr<T>, rm: i32, rn: i32, m: i32, n: i32, k: i32, sam: i32, sak: i32, sbk: i32, sbn: i32,
) -> f32 {
    let rk = arange::<BK>();
    let mut acc = zeros::<f32>([BM, BN]);
    for k0 in (0..k).step_by(BK) {
        let ka = k0 + rk;
        // One offset per operand (not `a + x + y`): the bounds guard of a safe launch then
        // costs one 32-bit compare per access.
        let ta = load(a + (rm.col() * sam + ka.row() * sak), (rm.col() < m) & (ka.row() < k), 0.0);
        let tb = load(b + (ka.col() * sbk + rn.row() * sbn), (ka.col() < k) & (rn.row() < n), 0.0);
        acc = dot(ta, tb, acc);
    }
    acc
}

/// `c = a @ b` for bf16 or f16 `a` (`m x k`) and `b` (`k x n`), accumulated in f32, `c`
/// (`m x n`) in `O` (f32, or the input type: rounded once at the store), any
/// sizes (masked edges), any strides (row- or column-major operands: pass the element
/// strides of each dimension). One `BM x BN` tile of `c` per program, `BK` of K at a time
/// through tensor cores (`dot`: `mma.sync` on sm_80+, `wgmma` on sm_90); programs are ordered in groups of
/// `GROUP_M` tile rows so that neighbouring programs share tiles of `b` in L2 (Triton's
/// grouped ordering). Grid: `m.div_ceil(BM) * n.div_ceil(BN)` programs.
///
/// `matmul_tuned` picks the tile, warps and stages per (m, n, k) bucket and element type.
/// Candidates accumulate the same products in different orders (BK changes how the f32
/// sums are grouped), so they are compared at a relative L2 difference of 1e-4: random
/// signs give about `sqrt(k) * 2^-24` (4e-6 at k = 2^12, 2e-5 at k = 2^16).
/// On the GPU (sm_80 and later) the operand tiles go through swizzled shared memory, read
/// with `ldmatrix`, and with `stages > 1` are loaded that many iterations ahead with
/// `cp.async`; on sm_90 the products are `wgmma`s reading those buffers directly, the
/// tiles loaded by TMA (where the strides are multiples of 16 bytes) and issued while they
/// run; on the widest 16-bit tile the tuner also offers a producer warpgroup for the
/// copies (warp specialization). Measured on the H100 in BENCHMARKS.md, "Matmul after the
/// conversion change": bf16 4096³ 1.08x Triton's wgmma kernel and level with cuBLAS with
/// f32 output, 8192³ 1.07x cuBLAS (noisy); "Matmul with TMA loads": 1.6x Triton on ragged
/// shapes. f32 inputs (tf32 products) take `wgmma` too where `a` is K-contiguous (a
/// row-major `b` is read into registers and the product computed as `cᵀ = bᵀ aᵀ`):
/// "tf32 on wgmma", 0.92 of cuBLAS (TF32) and 3.3x Triton at 4096³.
#[kernel(tune(BM = [64, 128], BN = [64, 128, 256], BK = [32, 64], GROUP_M = [8], warps = [4, 8], stages = [1, 3, 4], specialize = [false, true], key = [m, n, k, elem = ::std::mem::size_of::<T>()], grid = (m as usize).div_ceil(BM) * (n as usize).div_ceil(BN), prune = tuned::matmul_tile, tolerance = tuned::matmul_tolerance(O::DTYPE)))]
pub fn matmul<T: Float, O: Float, const BM: usize, const BN: usize, const BK: usize, const GROUP_M: usize>(
    a: Ptr<T>, b: Ptr<T>, c: Ptr<O>, m: i32, n: i32, k: i32, sam: i32, sak: i32, sbk: i32, sbn: i32, scm: i32, scn: i32,
) {
    let rm = tile_row::<BM, BN, GROUP_M>(program_id(0), m, n) + arange::<BM>();
    let rn = tile_col::<BM, BN, GROUP_M>(program_id(0), m, n) + arange::<BN>();
    let acc = matmul_acc::<BM, BN, BK>(a, b, rm, rn, m, n, k, sam, sak, sbk, sbn);
    store(c + rm.col() * scm + rn.row() * scn, acc.to::<O>(), (rm.col() < m) & (rn.row() < n));
}

/// [`matmul`] on a persistent grid: `tiles = m.div_ceil(BM) * n.div_ceil(BN)`, and each
/// of the launch's programs computes tiles `program_id(0)`, `program_id(0) +
/// num_programs(0)`, .. in [`matmul`]'s grouped order, so that a launch of as many
/// programs as the GPU runs at once (its SMs times the programs an SM holds) has no
/// second wave, and a program's next tile starts without a launch. Any grid gives the
/// same result. The anchors' persistent kernels (Triton's persistent tutorial, CUTLASS's
/// and cuBLAS's Hopper kernels) overlap one tile's epilogue with the next tile's loads
/// through a producer warpgroup; this one restarts its pipeline at each tile (warp
/// specialization does not take a loop inside another yet). Measured against [`matmul`] on
/// the H100 at the 128 x 256 tile (BENCHMARKS.md, "A persistent matmul grid, not kept"):
/// level at 3 stages, 1.4-1.6% slower at 4, so `matmul_tuned` does not offer it.
#[kernel]
pub fn matmul_persistent<T: Float, O: Float, const BM: usize, const BN: usize, const BK: usize, const GROUP_M: usize>(
    a: Ptr<T>, b: Ptr<T>, c: Ptr<O>, m: i32, n: i32, k: i32, sam: i32, sak: i32, sbk: i32, sbn: i32, scm: i32, scn: i32,
) {
    let tiles = (m + (BM as i32 - 1)) / BM as i32 * ((n + (BN as i32 - 1)) / BN as i32);
    for tile in (program_id(0)..tiles).step_by(num_programs(0)) {
        let rm = tile_row::<BM, BN, GROUP_M>(tile, m, n) + arange::<BM>();
        let rn = tile_col::<BM, BN, GROUP_M>(tile, m, n) + arange::<BN>();
        let acc = matmul_acc::<BM, BN, BK>(a, b, rm, rn, m, n, k, sam, sak, sbk, sbn);
        store(c + rm.col() * scm + rn.row() * scn, acc.to::<O>(), (rm.col() < m) & (rn.row() < n));
    }
}

/// The activation codes of [`matmul_epilogue`]'s `act`.
pub mod activation {
    /// No activation.
    pub const NONE: i32 = 0;
    /// `max(x, 0)`.
    pub const RELU: i32 = 1;
    /// GELU, tanh approximation ([`gelu()`](crate::gelu())).
    pub const GELU: i32 = 2;
    /// SiLU ([`silu()`](crate::silu())).
    pub const SILU: i32 = 3;
}

/// [`matmul`] with an epilogue applied to the f32 accumulator before the one rounding to
/// `O`, in this order: `* scale`, `+ bias[col]` (where `has_bias != 0`), the activation
/// `act` (an [`activation`] code), `+ residual[row, col]` (where `has_residual != 0`, at
/// element strides `srm`, `srn`): a linear layer's `act(x W^T * s + b) + r` in one
/// kernel, the product never stored. A buffer whose flag is 0 is not read (pass any
/// buffer of its type). Same main loop ([`matmul_acc()`]), tiles and tuning space as
/// [`matmul`].
#[kernel(tune(BM = [64, 128], BN = [64, 128, 256], BK = [32, 64], GROUP_M = [8], warps = [4, 8], stages = [1, 3, 4], key = [m, n, k, elem = ::std::mem::size_of::<T>()], grid = (m as usize).div_ceil(BM) * (n as usize).div_ceil(BN), prune = tuned::matmul_tile, tolerance = tuned::matmul_tolerance(O::DTYPE)))]
#[allow(clippy::too_many_arguments)]
pub fn matmul_epilogue<T: Float, O: Float, const BM: usize, const BN: usize, const BK: usize, const GROUP_M: usize>(
    a: Ptr<T>, b: Ptr<T>, c: Ptr<O>, bias: Ptr<T>, residual: Ptr<O>, m: i32, n: i32, k: i32, sam: i32, sak: i32, sbk: i32, sbn: i32, scm: i32,
    scn: i32, srm: i32, srn: i32, scale: f32, act: i32, has_bias: i32, has_residual: i32,
) {
    let rm = tile_row::<BM, BN, GROUP_M>(program_id(0), m, n) + arange::<BM>();
    let rn = tile_col::<BM, BN, GROUP_M>(program_id(0), m, n) + arange::<BN>();
    let acc = matmul_acc::<BM, BN, BK>(a, b, rm, rn, m, n, k, sam, sak, sbk, sbn);
    let mask = (rm.col() < m) & (rn.row() < n);
    let v = acc * scale + load(bias + rn, (rn < n) & (has_bias != 0), 0.0).to::<f32>().row();
    let v = if act == 1 { maximum(v, 0.0) } else if act == 2 { gelu(v) } else if act == 3 { silu(v) } else { v };
    let v = v + load(residual + (rm.col() * srm + rn.row() * srn), mask & (has_residual != 0), 0.0).to::<f32>();
    store(c + (rm.col() * scm + rn.row() * scn), v.to::<O>(), mask);
}

/// [`matmul`] over a batch of up to two dimensions: `c[y][z] = a[y][z] b[y][z]` for every
/// `y` of grid axis 1 and `z` of grid axis 2 (a strided, batched product: attention's
/// scores per batch and head, a graph's batched `@`), each operand at `y` and `z` times
/// its batch strides (`s?y`, `s?z`; 0 shares a matrix along that dimension, as a weight
/// is shared by a batch). The main loop is [`matmul`]'s ([`matmul_acc()`]); `check_batched`
/// in the tests checks it against the f64 product.
/// Grid: `(m.div_ceil(BM) * n.div_ceil(BN), batch_y, batch_z)`.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn matmul_batched<T: Float, O: Float, const BM: usize, const BN: usize, const BK: usize, const GROUP_M: usize>(
    a: Ptr<T>, b: Ptr<T>, c: Ptr<O>, m: i32, n: i32, k: i32, sam: i32, sak: i32, sbk: i32, sbn: i32, scm: i32, scn: i32,
    say: i32, saz: i32, sby: i32, sbz: i32, scy: i32, scz: i32,
) {
    let y = program_id(1);
    let z = program_id(2);
    let a = a + y * say + z * saz;
    let b = b + y * sby + z * sbz;
    let c = c + y * scy + z * scz;
    let rm = tile_row::<BM, BN, GROUP_M>(program_id(0), m, n) + arange::<BM>();
    let rn = tile_col::<BM, BN, GROUP_M>(program_id(0), m, n) + arange::<BN>();
    let acc = matmul_acc::<BM, BN, BK>(a, b, rm, rn, m, n, k, sam, sak, sbk, sbn);
    store(c + rm.col() * scm + rn.row() * scn, acc.to::<O>(), (rm.col() < m) & (rn.row() < n));
}

/// The second launch of [`matmul_split_k`]: `c[i, j]` is the sum of `partial[s][i, j]`
/// over the `splits` slices (`partial` is `[splits, m, n]`, contiguous), added in slice
/// order (deterministic), rounded once to `O` and stored at element strides `scm`, `scn`.
/// `BLOCK` elements of the `m x n` output per program. Grid: `(m * n).div_ceil(BLOCK)`.
#[kernel]
pub fn split_k_sum<O: Float, const BLOCK: usize>(partial: Ptr<f32>, c: Ptr<O>, m: i32, n: i32, splits: i32, scm: i32, scn: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    let mn = m * n;
    let mask = offs < mn;
    let mut acc = zeros::<f32>([BLOCK]);
    for s in 0..splits {
        acc = acc + load(partial + (s * mn + offs), mask, 0.0);
    }
    store(c + (offs / n * scm + offs % n * scn), acc.to::<O>(), mask);
}

/// The tile of [`matmul_split_k`]'s slices for 16-bit operands: `BM x BN x BK` on 4 warps
/// and 4 stages, what `matmul_tuned` picks at `m = 16` (BENCHMARKS.md, "Matmul with TMA
/// loads"); f32 operands take `BK = 32` at 1 stage (its pick there, and what
/// `tuned::matmul_tile` lets f32 take without spilling).
pub const SPLIT_K_TILE: (usize, usize, usize) = (64, 64, 64);

/// How many slices of K [`matmul_split_k`] should cut an `m x n x k` product into on a GPU
/// of `sms` multiprocessors: 1 (no split) where its [`SPLIT_K_TILE`]s already give every
/// multiprocessor a program (or there are none); else the fewest (a power of two, at most
/// 16) that do, or the most [`split_k_fits`] allows where none does: every slice a whole
/// number of 64-wide K steps (so that the slices' operand pointers stay 16-byte aligned for
/// TMA) and at least 4 of them (the pipeline's depth).
///
/// ```
/// // Decode-like: 16 rows, 64 output tiles of 4096 x 4096 on an H100's 132 SMs.
/// assert_eq!(kernels_lib::split_k_splits(16, 4096, 4096, 132), 4);
/// assert_eq!(kernels_lib::split_k_splits(4096, 4096, 4096, 132), 1);
/// // K too short to cut into 4-step slices.
/// assert_eq!(kernels_lib::split_k_splits(16, 4096, 256, 132), 1);
/// ```
pub fn split_k_splits(m: usize, n: usize, k: usize, sms: usize) -> usize {
    let (bm, bn, _) = SPLIT_K_TILE;
    let tiles = m.div_ceil(bm) * n.div_ceil(bn);
    let mut splits = 1;
    while tiles > 0 && tiles * splits < sms && splits < 16 && split_k_fits(k, 2 * splits) {
        splits *= 2;
    }
    splits
}

/// Whether [`split_k_splits`] would cut K into `splits` slices: each a whole number of
/// 64-wide K steps, at least 4 of them.
pub fn split_k_fits(k: usize, splits: usize) -> bool {
    let bk = SPLIT_K_TILE.2;
    splits.checked_mul(bk).is_some_and(|step| k.is_multiple_of(step)) && k / splits >= 4 * bk
}

/// `c = a @ b` as [`matmul`] computes it (`T` operands, f32 accumulation, `c` in `O` at
/// any strides), for products with too few output tiles to fill the GPU (decode-like
/// small `m`): K is cut into `splits` equal slices ([`split_k_splits`] says how many),
/// each slice's product of every [`SPLIT_K_TILE`] tile written in f32 to `workspace`
/// (`[splits, m, n]`: at least `splits * m * n` elements) by [`matmul_batched`] (the
/// slice is its batch dimension), then [`split_k_sum`] adds the slices in order and
/// rounds once. Deterministic (no atomics); the f32 sums are grouped by slice, so results
/// differ from [`matmul`]'s in the last bits (the same bound: `k` f32 additions).
///
/// ```
/// use dsl_runtime::prelude::*;
/// let rt = Runtime::interpreter();
/// let (m, n, k) = (3, 70, 512);
/// let a = rt.upload(&vec![bf16::from_f32(0.5); m * k]).unwrap();
/// let b = rt.upload(&vec![bf16::from_f32(0.25); k * n]).unwrap();
/// let mut c = rt.zeros::<f32>(m * n).unwrap();
/// let mut ws = rt.zeros::<f32>(2 * m * n).unwrap();
/// let (mi, ni, ki) = (m as i32, n as i32, k as i32);
/// kernels_lib::matmul_split_k(&rt, &a, &b, &mut c, &mut ws, mi, ni, ki, ki, 1, ni, 1, ni, 1, 2).unwrap();
/// assert!(c.to_vec().unwrap().iter().all(|&x| x == 64.0));
/// // K must cut into equal slices.
/// assert!(kernels_lib::matmul_split_k(&rt, &a, &b, &mut c, &mut ws, mi, ni, ki, ki, 1, ni, 1, ni, 1, 3).is_err());
/// ```
#[allow(clippy::too_many_arguments)]
pub fn matmul_split_k<T: Float, O: Float>(
    rt: &Runtime, a: &Buffer<T>, b: &Buffer<T>, c: &mut Buffer<O>, workspace: &mut Buffer<f32>, m: i32, n: i32, k: i32, sam: i32, sak: i32, sbk: i32, sbn: i32, scm: i32,
    scn: i32, splits: usize,
) -> dsl_runtime::Result<()> {
    let err = |message: String| dsl_runtime::Error::Launch { kernel: "matmul_split_k".into(), message };
    if m < 0 || n < 0 || k < 0 || splits == 0 || splits > i32::MAX as usize || !(k as usize).is_multiple_of(splits) {
        return Err(err(format!("{m} x {n} x {k}: K must cut into {splits} equal slices (and sizes be at least 0)")));
    }
    let (mu, nu) = (m as usize, n as usize);
    // Offsets within the workspace, and `split_k_sum`'s last block past `m * n`, in i32.
    let need = splits.checked_mul(mu * nu).filter(|&x| x + 1024 <= i32::MAX as usize).ok_or_else(|| err(format!("{splits} slices of {m} x {n} overflow 32-bit offsets")))?;
    if workspace.len() < need {
        return Err(err(format!("the workspace holds {} f32s; {splits} slices of {m} x {n} need {need}", workspace.len())));
    }
    let kps = k / splits as i32;
    let (saz, sbz) = (kps.checked_mul(sak), kps.checked_mul(sbk));
    let (Some(saz), Some(sbz)) = (saz, sbz) else { return Err(err(format!("a slice's offset ({kps} x the K stride) overflows 32 bits"))) };
    let (bm, bn, _) = SPLIT_K_TILE;
    let grid = LaunchConfig::grid3((mu.div_ceil(bm) * nu.div_ceil(bn)) as u32, 1, splits as u32).warps(4);
    let ws = &mut *workspace;
    if std::mem::size_of::<T>() == 2 {
        matmul_batched::<T, f32, 64, 64, 64, 8>::launch(rt, grid.stages(4), a, b, ws, m, n, kps, sam, sak, sbk, sbn, n, 1, 0, saz, 0, sbz, 0, m * n)?;
    } else {
        matmul_batched::<T, f32, 64, 64, 32, 8>::launch(rt, grid.stages(1), a, b, ws, m, n, kps, sam, sak, sbk, sbn, n, 1, 0, saz, 0, sbz, 0, m * n)?;
    }
    split_k_sum::<O, 1024>::launch(rt, grid_for(mu * nu, 1024), &*workspace, c, m, n, splits as i32, scm, scn)
}

/// One program per row; a launch configuration for the row kernels.
pub fn rows_grid(rows: usize, num_warps: u32) -> LaunchConfig {
    LaunchConfig::grid(rows as u32).warps(num_warps)
}

/// `out[0] += sum(x)`: each program reduces `BLOCK` elements and adds its partial sum
/// atomically (so `out` accumulates: zero it first). The order of the additions varies
/// from run to run. `sum_f32_tuned` autotunes block and warps per length, restoring `out`
/// before every timed run; candidates add their partial sums in different orders, so they
/// are compared at 1e-4.
#[kernel(tune(BLOCK = [256, 512, 1024, 2048, 4096], warps = [2, 4, 8], key = [n], grid = (n as usize).div_ceil(BLOCK), prune = tuned::enough_work, reset_outputs = true, tolerance = 1e-4))]
pub fn sum_f32<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    atomic_add(out, load(x + offs, offs < n, 0.0).sum());
}

pub mod flash_attention;
pub mod graph;
pub mod tuned;

pub use flash_attention::attention;

/// Every library kernel at a representative specialization, by name: what the `stages`
/// example dumps and what the PTX tests assemble.
pub fn catalog() -> Vec<(&'static str, Box<dyn dsl_runtime::Kernel>)> {
    vec![
        ("relu_mul_add", Box::new(relu_mul_add::<f32, 1024>::new())),
        ("relu_mul_add_bf16", Box::new(relu_mul_add::<bf16, 2048>::new())),
        ("axpy", Box::new(axpy::<1024>)),
        ("scale_shift", Box::new(scale_shift::<1024>)),
        ("gelu_tanh", Box::new(gelu_tanh::<512>)),
        ("silu_mul", Box::new(silu_mul::<1024>)),
        ("f32_to_bf16", Box::new(convert::<f32, bf16, 1024>::new())),
        ("bf16_to_f32", Box::new(convert::<bf16, f32, 1024>::new())),
        ("clamp_i32", Box::new(clamp_i32::<256>)),
        ("softmax", Box::new(softmax::<f32, 1, 4096>::new())),
        ("softmax_rows", Box::new(softmax::<f32, 8, 128>::new())),
        ("softmax_looping", Box::new(softmax::<f32, 1, 1000>::new())),
        ("softmax_bf16", Box::new(softmax::<bf16, 1, 4096>::new())),
        ("softmax_f16_looping", Box::new(softmax::<f16, 2, 1000>::new())),
        ("rmsnorm_bf16", Box::new(rmsnorm_bf16::<1, 4096>)),
        ("rmsnorm_bf16_rows", Box::new(rmsnorm_bf16::<2, 4096>)),
        ("layernorm", Box::new(layernorm::<1024>)),
        ("row_sum_mean", Box::new(row_sum_mean::<16, 64>)),
        ("transpose", Box::new(transpose::<64>)),
        ("sum_f32", Box::new(sum_f32::<1024>)),
        ("matmul_bf16", Box::new(matmul::<bf16, f32, 64, 64, 32, 8>::new())),
        ("matmul_bf16_out", Box::new(matmul::<bf16, bf16, 64, 64, 32, 8>::new())),
        ("matmul_epilogue_bf16", Box::new(matmul_epilogue::<bf16, bf16, 64, 64, 32, 8>::new())),
        ("split_k_sum_bf16", Box::new(split_k_sum::<bf16, 1024>::new())),
        ("attention_d64", Box::new(attention::<bf16, flash_attention::no_score_mod, flash_attention::all_keys, false, 64, 64, 64>::new())),
        ("attention_bwd_dkdv_d64", Box::new(flash_attention::attention_bwd_dkdv::<bf16, flash_attention::no_score_mod, flash_attention::unit_score_grad, flash_attention::all_queries, false, false, 32, 64, 64>::new())),
        ("attention_bwd_dq_d64", Box::new(flash_attention::attention_bwd_dq::<bf16, flash_attention::no_score_mod, flash_attention::unit_score_grad, flash_attention::all_keys, false, 64, 32, 64>::new())),
    ]
}
