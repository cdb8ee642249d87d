//! `dot` on the CPU interpreter (its specification) and in the GPU code (ptxas, SASS): a
//! tiled matmul written once for bf16, f16 and f32, on shapes that are not multiples of
//! the tiles, against float64 references with bounds derived from the arithmetic; the
//! declared f32 precision honoured; errors for bad shapes; f32 on the GPU refused clearly;
//! every library configuration assembled to tensor-core instructions fed as intended.

use crate::common::*;
use dsl_runtime::cache::DiskCache;
use dsl_runtime::compile::{CodegenOptions, Compiler};
use dsl_runtime::emit::Target;
use dsl_runtime::launch::Safety;
use dsl_runtime::launch::Kernel;
use dsl_runtime::prelude::*;
use kernels_lib::matmul;

/// A matmul written the way Triton's tutorial writes it: pointers carried from one
/// iteration to the next and advanced by a tile of K (row-major operands).
#[kernel]
pub(crate) fn matmul_carried<const BM: usize, const BN: usize, const BK: usize>(a: Ptr<bf16>, b: Ptr<bf16>, c: Ptr<f32>, m: i32, n: i32, k: i32) {
    let rm = program_id(0) * BM + arange::<BM>();
    let rn = program_id(1) * BN + arange::<BN>();
    let rk = arange::<BK>();
    let mut pa = a + rm.col() * k + rk.row();
    let mut pb = b + rk.col() * n + rn.row();
    let mut acc = zeros::<f32>([BM, BN]);
    for k0 in (0..k).step_by(BK) {
        let ta = load(pa, (rm.col() < m) & ((k0 + rk).row() < k), 0.0);
        let tb = load(pb, ((k0 + rk).col() < k) & (rn.row() < n), 0.0);
        acc = dot(ta, tb, acc);
        pa = pa + BK as i32;
        pb = pb + BK as i32 * n;
    }
    store(c + rm.col() * n + rn.row(), acc, (rm.col() < m) & (rn.row() < n));
}

/// The library's `matmul` (row-major operands here) with f32 products (`"ieee"`): the
/// precision is a literal of the kernel, so this variant is a kernel of its own. One
/// `BM x BN` tile per program on a 2-D grid.
#[kernel]
pub(crate) fn matmul_ieee<const BM: usize, const BN: usize, const BK: usize>(a: Ptr<f32>, b: Ptr<f32>, c: Ptr<f32>, m: i32, n: i32, k: i32) {
    let rm = program_id(0) * BM + arange::<BM>();
    let rn = program_id(1) * BN + arange::<BN>();
    let rk = arange::<BK>();
    let mut acc = zeros::<f32>([BM, BN]);
    for k0 in (0..k).step_by(BK) {
        let ka = k0 + rk;
        let ta = load(a + rm.col() * k + ka.row(), (rm.col() < m) & (ka.row() < k), 0.0);
        let tb = load(b + ka.col() * n + rn.row(), (ka.col() < k) & (rn.row() < n), 0.0);
        acc = dot(ta, tb, acc, "ieee");
    }
    store(c + rm.col() * n + rn.row(), acc, (rm.col() < m) & (rn.row() < n));
}

/// One tile read by two products, directly and transposed (as attention's backward reads
/// its query and output-gradient tiles): `x y` and `z x^T`, `x` and `y` 64 x 64, `z`
/// `R` x 64, all row-major and contiguous.
#[kernel]
pub(crate) fn shared_tile_products<const R: usize>(x: Ptr<bf16>, y: Ptr<bf16>, z: Ptr<bf16>, xy: Ptr<f32>, zx: Ptr<f32>) {
    let r = arange::<64>();
    let rz = arange::<R>();
    let tx = load(x + r.col() * 64 + r.row(), r.col() < 64, 0.0);
    let ty = load(y + r.col() * 64 + r.row(), r.col() < 64, 0.0);
    let tz = load(z + rz.col() * 64 + r.row(), rz.col() < R as i32, 0.0);
    store(xy + r.col() * 64 + r.row(), dot(tx, ty), r.col() < 64);
    store(zx + rz.col() * 64 + r.row(), dot(tz, trans(tx)), rz.col() < R as i32);
}

/// Rows `program_id(0) * 64 ..` of `x` (`m x 64`, row-major) doubled into `y`: a
/// whole-tile store of a block in a plain (not an accumulator's) layout, which TMA stores
/// take too (`LaunchConfig::tma_store`), with a grid that does not depend on `m` (so
/// `m = 0` is a launch the kernel defines: its maps are empty).
#[kernel]
pub(crate) fn tile_copy(x: Ptr<f32>, y: Ptr<f32>, m: i32) {
    let r = program_id(0) * 64 + arange::<64>();
    let c = arange::<64>();
    let t = load(x + r.col() * 64 + c.row(), r.col() < m, 0.0);
    store(y + r.col() * 64 + c.row(), t * 2.0, r.col() < m);
}

const U_F32: f64 = 1.0 / (1u64 << 24) as f64;

/// `(a @ b)[i, j]` in f64 and `sum_k |a_ik b_kj|` (the scale of its rounding error).
pub(crate) fn reference(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut c, mut s) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for j in 0..n {
            for t in 0..k {
                c[i * n + j] += a[i * k + t] * b[t * n + j];
                s[i * n + j] += (a[i * k + t] * b[t * n + j]).abs();
            }
        }
    }
    (c, s)
}

/// The largest `|got - want| / scale` over all elements; infinite where an element is NaN
/// (`f64::max` would drop it: an element left unwritten in a NaN-poisoned output must fail).
pub(crate) fn worst(got: &[f32], want: &[f64], scale: &[f64]) -> f64 {
    assert_eq!((got.len(), want.len()), (scale.len(), scale.len()), "lengths");
    got.iter().zip(want).zip(scale).map(|((&g, &w), &s)| (g as f64 - w).abs() / s.max(f64::MIN_POSITIVE)).map(|e| if e.is_nan() { f64::INFINITY } else { e }).fold(0.0, f64::max)
}

/// `matmul_ieee`'s grid: tile rows by tile columns.
pub(crate) fn grid(m: usize, n: usize, bm: usize, bn: usize) -> LaunchConfig {
    LaunchConfig::grid3(m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, 1)
}

/// A product's operands and its [`reference`] (values, sums of magnitudes).
pub(crate) type Product<T> = ([Vec<T>; 2], (Vec<f64>, Vec<f64>));

/// Random `a` (`m x k`) and `b` (`k x n`, seeds `seed` and `seed + 1`) rounded to bf16, and
/// [`reference`] of their product (exact in f64: the values and sums of magnitudes).
pub(crate) fn bf16_product(m: usize, n: usize, k: usize, seed: u64) -> Product<bf16> {
    let round = |x: Vec<f32>| -> Vec<bf16> { x.into_iter().map(bf16::from_f32).collect() };
    let (a, b) = (round(random_f32(m * k, seed)), round(random_f32(k * n, seed + 1)));
    let wide = |x: &[bf16]| -> Vec<f64> { x.iter().map(|v| v.to_f64()).collect() };
    let r = reference(&wide(&a), &wide(&b), m, n, k);
    ([a, b], r)
}

/// The library `matmul`'s grid: one program per `bm x bn` tile.
pub(crate) fn tiles(m: usize, n: usize, bm: usize, bn: usize) -> LaunchConfig {
    LaunchConfig::grid((m.div_ceil(bm) * n.div_ceil(bn)) as u32)
}

/// `gamma_k = k u / (1 - k u)`: the relative bound of an f32 sum of `k` terms, in any order.
pub(crate) fn gamma(k: usize) -> f64 {
    k as f64 * U_F32 / (1.0 - k as f64 * U_F32)
}

#[test]
fn matmul_written_once_for_bf16_f16_and_f32() {
    let rt = Runtime::interpreter();
    let s = seed();
    let (m, n, k) = (50, 37, 40); // no dimension a multiple of the 16 x 32 x 16 tiles
    // Products of bf16 or f16 inputs are exact in f32; the f32 sum of k of them, in any
    // order, is off by at most gamma_k = k u / (1 - k u) times the sum of magnitudes.
    let (xa, xb) = (random_f32(m * k, s), random_f32(k * n, s + 1));
    {
        let (a, b): (Vec<bf16>, Vec<bf16>) = (xa.iter().map(|&v| bf16::from_f32(v)).collect(), xb.iter().map(|&v| bf16::from_f32(v)).collect());
        let (want, scale) = reference(&a.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), &b.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), m, n, k);
        let mut c = vec![f32::NAN; m * n];
        matmul::<bf16, f32, 16, 32, 16, 8>::launch(&rt, tiles(m, n, 16, 32), &a, &b, &mut c, m as i32, n as i32, k as i32, k as i32, 1, n as i32, 1, n as i32, 1).unwrap();
        let e = worst(&c, &want, &scale);
        assert!(e <= gamma(k), "bf16 seed {s}: {e:e} > {:e}", gamma(k));
        // Output in the input type: the f32 result rounded once more, by at most 2^-8 of
        // itself (so of the sum of magnitudes).
        let mut c16 = vec![bf16::NAN; m * n];
        matmul::<bf16, bf16, 16, 32, 16, 8>::launch(&rt, tiles(m, n, 16, 32), &a, &b, &mut c16, m as i32, n as i32, k as i32, k as i32, 1, n as i32, 1, n as i32, 1).unwrap();
        let c16: Vec<f32> = c16.iter().map(|v| v.to_f32()).collect();
        let e16 = worst(&c16, &want, &scale);
        assert!(e16 <= gamma(k) + 1.0 / 256.0 && e16 > e, "bf16 out, seed {s}: {e16:e} (f32 out {e:e})");
    }
    {
        let (a, b): (Vec<f16>, Vec<f16>) = (xa.iter().map(|&v| f16::from_f32(v)).collect(), xb.iter().map(|&v| f16::from_f32(v)).collect());
        let (want, scale) = reference(&a.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), &b.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), m, n, k);
        let mut c = vec![f32::NAN; m * n];
        matmul::<f16, f32, 16, 32, 16, 8>::launch(&rt, tiles(m, n, 16, 32), &a, &b, &mut c, m as i32, n as i32, k as i32, k as i32, 1, n as i32, 1, n as i32, 1).unwrap();
        let e = worst(&c, &want, &scale);
        assert!(e <= gamma(k), "f16 seed {s}: {e:e} > {:e}", gamma(k));
    }
    // f32: tf32 (the default) truncates each input to 10 mantissa bits (relative error
    // below 2^-10 each, so 2^-9 + 2^-20 per product) before the f32 sum; "ieee" multiplies
    // in f32 (one rounding, u, per product).
    let (a, b) = (xa.iter().map(|&v| v as f64).collect::<Vec<_>>(), xb.iter().map(|&v| v as f64).collect::<Vec<_>>());
    let (want, scale) = reference(&a, &b, m, n, k);
    let mut c = vec![f32::NAN; m * n];
    matmul::<f32, f32, 16, 32, 16, 8>::launch(&rt, tiles(m, n, 16, 32), &xa, &xb, &mut c, m as i32, n as i32, k as i32, k as i32, 1, n as i32, 1, n as i32, 1).unwrap();
    let tf32 = worst(&c, &want, &scale);
    assert!(tf32 <= 2f64.powi(-9) + 2f64.powi(-20) + gamma(k) * (1.0 + 2f64.powi(-8)), "tf32 seed {s}: {tf32:e}");
    let mut c = vec![f32::NAN; m * n];
    matmul_ieee::<16, 32, 16>::launch(&rt, grid(m, n, 16, 32), &xa, &xb, &mut c, m as i32, n as i32, k as i32).unwrap();
    let ieee = worst(&c, &want, &scale);
    assert!(ieee <= U_F32 + gamma(k) * (1.0 + U_F32), "ieee seed {s}: {ieee:e}");
    // The declared precision is honoured: tf32's input rounding shows, ieee's does not.
    assert!(tf32 > 16.0 * ieee, "tf32 {tf32:e} vs ieee {ieee:e}");
}

#[test]
fn dot_shapes_are_checked_where_the_ir_is_built() {
    let rt = Runtime::interpreter();
    let (a, b) = (vec![1.0f32; 64], vec![1.0f32; 64]);
    let mut c = vec![0.0f32; 64];
    // 8-wide tiles: below the smallest tensor-core tile.
    let err = matmul_ieee::<8, 8, 8>::launch(&rt, LaunchConfig::grid(1), &a, &b, &mut c, 8, 8, 8).unwrap_err().to_string();
    assert!(err.contains("at least 16") && err.contains("tests/all/dot.rs"), "{err}");
}

/// bf16 and f16 `dot` lower to tensor-core instructions (`mma.sync` m16n8k16) that ptxas
/// accepts for sm_80 and sm_90a without spills and turns into `HMMA` (the SASS), f32 at
/// "tf32" to `m16n8k8`; f32 at "ieee" is refused with its line. Numbers on a GPU: `gpu::matmul_on_gpu` (H100 runs only).
#[test]
fn dot_lowers_to_mma_sync_for_bf16_f16_and_tf32_and_refuses_ieee_clearly() {
    use crate::codegen::assemble;
    let nice = |k: &dyn Kernel| vec![dsl_runtime::ir::ParamSpec { div16: true, eq_one: false }; k.meta().params.len()];
    // (A 64 x 64 accumulator in one warp is 128 registers a thread before any operand:
    // that one spills, as it would in Triton; 4 and 8 warps do not.)
    for (name, k, warps) in [
        ("matmul_bf16", Box::new(matmul::<bf16, f32, 16, 32, 16, 8>::new()) as Box<dyn Kernel>, [1, 4]),
        ("matmul_f16", Box::new(matmul::<f16, f32, 64, 64, 32, 8>::new()), [4, 8]),
    ] {
        for warps in warps {
            for (target, arch) in [(Target::SM80, "sm_80"), (Target::SM90, "sm_90a")] {
                // (On sm_90a the 64 x 64 tiles would take wgmma: see `matmul_takes_wgmma_on_sm90`.)
                let ptx = dsl_runtime::compile::stages_specialized(k.as_ref(), &nice(k.as_ref()), target, &LaunchConfig::grid(1).warps(warps).wgmma(false)).unwrap().ptx;
                assert!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32"), "{name}: {ptx}");
                let report = assemble(&ptx, arch, name);
                // The tensor-core instruction survives into the machine code.
                let code = crate::codegen::sass(&ptx, arch, name);
                assert!(code.contains("HMMA.16816.F32"), "{name} {arch}: no HMMA in\n{code}");
                assert!(report.contains("0 bytes spill stores") && report.contains("0 bytes stack frame"), "{name} {arch}:\n{report}");
            }
        }
    }
    // f32 at "tf32" (the default): m16n8k8 on the f32 registers as they are (no
    // conversion instructions: the tensor cores truncate). (On sm_90a the 64 x 64 tiles
    // would take wgmma.)
    let k = matmul::<f32, f32, 64, 64, 32, 8>::new();
    for (target, arch) in [(Target::SM80, "sm_80"), (Target::SM90, "sm_90a")] {
        let ptx = dsl_runtime::compile::stages_specialized(&k, &nice(&k), target, &LaunchConfig::grid(1).warps(4).wgmma(false)).unwrap().ptx;
        assert!(ptx.contains("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32") && !ptx.contains("cvt.rna.tf32"), "{ptx}");
        let report = assemble(&ptx, arch, "matmul_tf32");
        assert!(report.contains("0 bytes spill stores") && report.contains("0 bytes stack frame"), "tf32 {arch}:\n{report}");
        assert!(crate::codegen::sass(&ptx, arch, "matmul_tf32").contains("HMMA.1688.F32.TF32"), "tf32 {arch}: no HMMA");
    }
    // f32 at "ieee": no tensor-core lowering, a clear error with the line.
    let opts = CodegenOptions::for_launch(&LaunchConfig::grid(1), Safety::Guarded, vec![Default::default(); 3], Target::SM90);
    let err = Compiler::new(DiskCache::new(None)).ptx(&matmul_ieee::<16, 32, 16>, &[Default::default(); 6], &opts).unwrap_err().to_string();
    assert!(err.contains("`dot` of f32 inputs at \"ieee\" precision") && err.contains("no GPU lowering yet") && err.contains("line"), "{err}");
}


/// The library's `matmul`: a row-major `a` and a column-major `b` (through strides), a
/// column-major `c`, ragged sizes, grouped program order (GROUP_M = 2 over 3 x 2 tiles),
/// against the f64 product within gamma_k.
#[test]
fn library_matmul_with_strides_and_grouped_order() {
    let rt = Runtime::interpreter();
    let s = seed();
    let (m, n, k) = (130, 70, 90);
    let a: Vec<bf16> = random_f32(m * k, s).into_iter().map(bf16::from_f32).collect(); // a[i, t] at i * k + t
    let bt: Vec<bf16> = random_f32(n * k, s + 1).into_iter().map(bf16::from_f32).collect(); // b[t, j] at j * k + t
    let mut b_rows = vec![0.0; k * n];
    for t in 0..k {
        for j in 0..n {
            b_rows[t * n + j] = bt[j * k + t].to_f64();
        }
    }
    let (want, scale) = reference(&a.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), &b_rows, m, n, k);
    let mut c = vec![f32::NAN; m * n]; // c[i, j] at j * m + i
    let grid = LaunchConfig::grid(m.div_ceil(64) as u32 * n.div_ceil(64) as u32);
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    matmul::<bf16, f32, 64, 64, 32, 2>::launch(&rt, grid, &a, &bt, &mut c, mi, ni, ki, ki, 1, 1, ki, 1, mi).unwrap();
    let c_rows: Vec<f32> = (0..m * n).map(|x| c[(x % n) * m + x / n]).collect();
    let e = worst(&c_rows, &want, &scale);
    assert!(e <= gamma(k), "seed {s}: {e:e}");
    // The tuned launch (the interpreter takes the first candidate the pruning keeps).
    let (da, db) = (rt.upload(&a).unwrap(), rt.upload(&bt).unwrap());
    let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
    kernels_lib::matmul_tuned(&rt, &da, &db, &mut dc, mi, ni, ki, ki, 1, 1, ki, 1, mi).unwrap();
    let c_rows: Vec<f32> = { let c = dc.to_vec().unwrap(); (0..m * n).map(|x| c[(x % n) * m + x / n]).collect() };
    assert!(worst(&c_rows, &want, &scale) <= gamma(k), "tuned, seed {s}");
}

/// The library's `matmul_persistent`: the same tiles in the same order as `matmul`, each
/// program taking every `num_programs(0)`-th tile, so on any grid (one program, fewer
/// programs than tiles, one a tile, more) the result is `matmul`'s bit for bit (each
/// tile's sums in the same order), a column-major `b` and a ragged shape included.
#[test]
fn persistent_matmul_equals_matmul_on_any_grid() {
    use kernels_lib::matmul_persistent;
    let rt = Runtime::interpreter();
    let s = seed();
    let (m, n, k) = (50, 37, 40); // 4 x 2 tiles of 16 x 32, none whole at the edges
    let a: Vec<bf16> = random_f32(m * k, s).into_iter().map(bf16::from_f32).collect();
    let bt: Vec<bf16> = random_f32(n * k, s + 1).into_iter().map(bf16::from_f32).collect(); // b[t, j] at j * k + t
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    let mut want = vec![f32::NAN; m * n];
    matmul::<bf16, f32, 16, 32, 16, 2>::launch(&rt, tiles(m, n, 16, 32), &a, &bt, &mut want, mi, ni, ki, ki, 1, 1, ki, ni, 1).unwrap();
    assert!(want.iter().all(|x| x.is_finite()), "seed {s}");
    for programs in [1, 3, 8, 11] {
        let mut c = vec![f32::NAN; m * n];
        matmul_persistent::<bf16, f32, 16, 32, 16, 2>::launch(&rt, LaunchConfig::grid(programs), &a, &bt, &mut c, mi, ni, ki, ki, 1, 1, ki, ni, 1).unwrap();
        let same = c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{programs} programs, seed {s}: differs from matmul");
    }
}

/// `matmul_epilogue`: `act(a @ b * scale + bias) + residual` for every activation, on a
/// ragged shape with a column-major residual, against the f64 product with each step
/// applied in f64: within the product's f32-accumulation bound (times the activation's
/// slope, at most 1.13) plus a few roundings of the value. With both flags off, the bias
/// and the residual are not read (NaN-poisoned buffers stand in for them).
#[test]
fn matmul_epilogue_applies_scale_bias_activation_and_residual() {
    use kernels_lib::{activation, matmul_epilogue};
    let rt = Runtime::interpreter();
    let s = seed();
    let (m, n, k) = (70, 45, 40);
    let a = random_bf16(m * k, s);
    let b = random_bf16(k * n, s + 1);
    let bias = random_bf16(n, s + 2);
    let res = random_f32(m * n, s + 3); // res[i, j] at j * m + i
    let f = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    let (prod, scale) = reference(&f(&a), &f(&b), m, n, k);
    let gelu = |x: f64| 0.5 * x * (1.0 + (0.7978845608 * (x + 0.044715 * x * x * x)).tanh());
    let silu = |x: f64| x / (1.0 + (-x).exp());
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    let grid = tiles(m, n, 64, 64);
    let sc = 0.75f32;
    for (act, name) in [(activation::NONE, "none"), (activation::RELU, "relu"), (activation::GELU, "gelu"), (activation::SILU, "silu")] {
        let mut c = vec![f32::NAN; m * n];
        matmul_epilogue::<bf16, f32, 64, 64, 32, 8>::launch(&rt, grid, &a, &b, &mut c, &bias, &res, mi, ni, ki, ki, 1, ni, 1, ni, 1, 1, mi, sc, act, 1, 1).unwrap();
        for i in 0..m {
            for j in 0..n {
                let x = prod[i * n + j] * sc as f64 + bias[j].to_f64();
                let y = match act {
                    activation::RELU => x.max(0.0),
                    activation::GELU => gelu(x),
                    activation::SILU => silu(x),
                    _ => x,
                };
                let want = y + res[j * m + i] as f64;
                let tol = 1.13 * gamma(k) * sc as f64 * scale[i * n + j] + 16.0 * U_F32 * (1.0 + x.abs() + y.abs() + want.abs());
                let got = c[i * n + j] as f64;
                assert!((got - want).abs() <= tol, "{name} [{i}, {j}]: {got} vs {want} (tolerance {tol:e}, seed {s})");
            }
        }
    }
    // Flags off: the bias and residual buffers (NaN) are not read; the product is scaled.
    let (nan_bias, nan_res) = (vec![bf16::NAN; n], vec![f32::NAN; m * n]);
    let mut c = vec![f32::NAN; m * n];
    matmul_epilogue::<bf16, f32, 64, 64, 32, 8>::launch(&rt, grid, &a, &b, &mut c, &nan_bias, &nan_res, mi, ni, ki, ki, 1, ni, 1, ni, 1, 1, mi, sc, activation::NONE, 0, 0).unwrap();
    for x in 0..m * n {
        let want = prod[x] * sc as f64;
        assert!((c[x] as f64 - want).abs() <= gamma(k) * sc as f64 * scale[x] + 2.0 * U_F32 * want.abs(), "flags off, element {x}: {} vs {want} (seed {s})", c[x]);
    }
    // On sm_90a the widest tile keeps its pipelined wgmma main loop, with nothing spilled
    // in it. (Its epilogue spills about 200 bytes: the activation's branches over the 128
    // accumulators a thread holds; the tuner weighs that against smaller tiles.)
    use dsl_runtime::ir::ParamSpec;
    let (al, one, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: false, eq_one: true }, ParamSpec::default());
    let specs = [al, al, al, al, al, al, al, al, al, one, al, one, al, one, al, one, no, no, no, no];
    let wide = matmul_epilogue::<bf16, f32, 128, 256, 64, 8>::new();
    let art = dsl_runtime::compile::stages_specialized(&wide, &specs, Target::SM90, &LaunchConfig::grid(1).warps(8).stages(3)).unwrap();
    let (report, sass) = crate::codegen::assemble_to_sass(&art.ptx, "sm_90a", "matmul_epilogue_wide");
    let main = crate::codegen::loop_bodies(&sass).into_iter().find(|l| l.contains("HGMMA")).unwrap_or_else(|| panic!("no wgmma loop:\n{report}"));
    assert!(main.contains("HGMMA.64x256x16.F32.BF16") && main.contains("UTMALDG.2D"), "no pipelined wgmma loop:\n{main}");
    assert!(!main.contains("LDL") && !main.contains("STL"), "local memory in the main loop:\n{main}");
}

/// The tiles a graph's products take on a GPU (`graph::plan::matmul_tile`: what the tuner
/// picked for such shapes) follow the shape, and each assembles for sm_90a: 16-bit ones to
/// a pipelined wgmma loop, f32 ones to tf32 mma.sync, none spilling in its main loop.
#[test]
fn graph_product_tiles_follow_the_shape_and_assemble() {
    use dsl_runtime::ir::ParamSpec;
    use kernels_lib::graph::plan::{matmul_tile, MatmulTile};
    let t = |bm, bn, bk, warps, stages| MatmulTile { bm, bn, bk, warps, stages };
    assert_eq!(matmul_tile(4096, 4096, 4096, 2, true, true), t(128, 256, 64, 8, 3));
    assert_eq!(matmul_tile(2048, 2048, 512, 2, true, true), t(128, 256, 64, 8, 3));
    assert_eq!(matmul_tile(1024, 1024, 1024, 2, true, true), t(64, 128, 64, 4, 4));
    assert_eq!(matmul_tile(16, 4096, 4096, 2, true, true), t(64, 64, 64, 4, 4));
    assert_eq!(matmul_tile(300, 200, 40, 2, true, true), t(64, 64, 32, 4, 4));
    assert_eq!(matmul_tile(4096, 4096, 4096, 4, true, true), t(128, 128, 32, 4, 3));
    assert_eq!(matmul_tile(4096, 4096, 4096, 4, false, true), t(128, 64, 32, 4, 3), "f32 with a transposed a: mma.sync");
    assert_eq!(matmul_tile(4096, 4096, 4096, 2, true, false), t(64, 64, 32, 4, 1), "the interpreter");
    let (al, one) = (ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: false, eq_one: true });
    // a, b, c; m, n, k; sam, sak, sbk, sbn, scm, scn; batch strides.
    let specs = [al, al, al, al, al, al, al, one, al, one, al, one, al, al, al, al, al, al];
    for (elem, tile) in [(2, t(128, 256, 64, 8, 3)), (2, t(64, 128, 64, 4, 4)), (2, t(64, 64, 64, 4, 4)), (4, t(128, 128, 32, 4, 3)), (4, t(64, 64, 32, 4, 3))] {
        let consts = [tile.bm as i64, tile.bn as i64, tile.bk as i64, 8];
        let k: Box<dyn Kernel> = if elem == 2 {
            Box::new(kernels_lib::__matmul_batched_consts::<bf16, bf16>::new(consts))
        } else {
            Box::new(kernels_lib::__matmul_batched_consts::<f32, f32>::new(consts))
        };
        let cfg = LaunchConfig::grid(1).warps(tile.warps).stages(tile.stages);
        let art = dsl_runtime::compile::stages_specialized(k.as_ref(), &specs, Target::SM90, &cfg).unwrap();
        let name = format!("graph_product_{}x{}x{}", tile.bm, tile.bn, tile.bk);
        let (report, sass) = crate::codegen::assemble_to_sass(&art.ptx, "sm_90a", &name);
        let main = crate::codegen::loop_bodies(&sass).into_iter().find(|l| l.contains("MMA")).unwrap_or_else(|| panic!("{name}: no tensor-core loop\n{report}"));
        assert!(!main.contains("LDL") && !main.contains("STL"), "{name}: local memory in the main loop");
        if elem == 2 {
            // Batched (the graph's products): batch dimensions of the tensor maps.
            assert!(main.contains("HGMMA") && main.contains("UTMALDG.4D"), "{name}: no pipelined wgmma loop loading by TMA:\n{main}");
        } else {
            // `cᵀ = bᵀ aᵀ` on wgmma, bᵀ read into registers.
            assert!(main.contains("HGMMA.64x") && main.contains(".F32.TF32") && main.contains("LDS R"), "{name}: no tf32 wgmma loop:\n{main}");
        }
    }
    // A product with an epilogue (a linear layer's `relu(x w + b) + r`, generated by the
    // graph fuser) keeps the library's pipelined wgmma main loop, at the widest tile and
    // at the fuser's own (`fused_matmul_tile`), and spills nothing anywhere (no activation
    // branches over the accumulators).
    use kernels_lib::graph::{codegen, fuse, Graph};
    let g = Graph::new();
    let (x, w) = (g.input("x", DType::BF16, &[4, 1024, 512]), g.input("w", DType::BF16, &[512, 1024]));
    let (b, r) = (g.input("b", DType::BF16, &[1024]), g.input("r", DType::BF16, &[4, 1024, 1024]));
    g.output("y", (x.matmul(w) + b).relu() + r).unwrap();
    let part = fuse::partition(&g, fuse::Fusion::On).unwrap();
    let [group] = part.groups.as_slice() else { panic!("one kernel:\n{part}") };
    let own = kernels_lib::graph::plan::fused_matmul_tile(4096, 1024, 512, 2, true, true, false);
    assert_eq!(own, t(64, 128, 32, 4, 4));
    for tile in [t(128, 256, 64, 8, 3), own] {
        let k = codegen::matmul_kernel("graph_linear", &g.nodes(), group, group.matmul.unwrap(), (tile.bm, tile.bn, tile.bk, 8), false).unwrap();
        // x, w, b, r; y; m, n, k; sam, sak, sbk, sbn, scm, scn; batch strides; a third
        // batch dimension unused (nw 1, its strides 0).
        let specs = [al, al, al, al, al, al, al, al, al, one, al, one, al, one, al, al, al, al, al, al, one, al, al, al];
        let art = dsl_runtime::compile::stages_specialized(&k, &specs, Target::SM90, &LaunchConfig::grid(1).warps(tile.warps).stages(tile.stages)).unwrap();
        let (report, sass) = crate::codegen::assemble_to_sass(&art.ptx, "sm_90a", "graph_linear_epilogue");
        let main = crate::codegen::loop_bodies(&sass).into_iter().find(|l| l.contains("HGMMA")).unwrap_or_else(|| panic!("no wgmma loop:\n{report}"));
        // Warpgroups split the rows in 64s first, then the columns.
        let wgmma_n = tile.bn / (tile.warps as usize / 4 / (tile.bm / 64)).max(1);
        assert!(main.contains(&format!("HGMMA.64x{wgmma_n}x16.F32.BF16")) && main.contains("UTMALDG.4D"), "{tile:?}: no pipelined wgmma loop:\n{main}");
        assert!(report.contains("0 bytes spill stores") && !sass.contains("LDL"), "{tile:?}: {report}");
    }
    // A computed operand (an f32 input cast to bf16 as it is loaded: a prologue) still
    // multiplies on wgmma, the other operand still copied asynchronously (by TMA).
    let g = Graph::new();
    let (x, w) = (g.input("x", DType::F32, &[512, 1024]), g.input("w", DType::BF16, &[1024, 4096]));
    g.output("y", x.cast(DType::BF16).matmul(w)).unwrap();
    let part = fuse::partition(&g, fuse::Fusion::On).unwrap();
    let [group] = part.groups.as_slice() else { panic!("one kernel:\n{part}") };
    assert_eq!(group.prologue, [true, false], "{part}");
    let tile = kernels_lib::graph::plan::fused_matmul_tile(512, 4096, 1024, 2, true, true, true);
    assert_eq!(tile, t(64, 128, 64, 8, 3));
    let k = codegen::matmul_kernel("graph_cast_operand", &g.nodes(), group, group.matmul.unwrap(), (tile.bm, tile.bn, tile.bk, 8), false).unwrap();
    let specs = [al, al, al, al, al, al, one, al, one, al, one, al, al, al, al, al, al, al, one, al, al, al];
    let art = dsl_runtime::compile::stages_specialized(&k, &specs, Target::SM90, &LaunchConfig::grid(1).warps(8).stages(3)).unwrap();
    let (report, sass) = crate::codegen::assemble_to_sass(&art.ptx, "sm_90a", "graph_cast_operand");
    let main = crate::codegen::loop_bodies(&sass).into_iter().find(|l| l.contains("MMA")).unwrap_or_else(|| panic!("no tensor-core loop:\n{report}"));
    assert!(main.contains("HGMMA.64x64x16.F32.BF16") && main.contains("UTMALDG"), "no pipelined wgmma loop:\n{main}");
    assert!(report.contains("0 bytes spill stores") && !sass.contains("LDL"), "{report}");
}

/// `matmul_batched` on `rt`: a [3, 2] batch of products with ragged sizes, `a` per batch
/// and column-major (each batch's `a^T` stored), `b` one matrix per `y` shared along `z`
/// (batch stride 0 there, as a weight is), `c` per batch; bf16 inputs, f32 out, every element of every batch
/// within the f32-accumulation bound (doubled: tensor cores may truncate).
pub(crate) fn check_batched(rt: &Runtime, stages: u32) {
    let s = seed();
    // Batch [3, 2]: a per (y, z); b per y, shared along z (stride 0 there).
    let (ny, nz, m, n, k) = (3, 2, 72, 40, 88);
    let batch = ny * nz;
    let xa = random_f32(batch * m * k, s);
    let xb = random_f32(ny * k * n, s + 1);
    // a[z][i, p] at z * m * k + p * m + i (column-major per batch).
    let a: Vec<bf16> = (0..batch * m * k).map(|x| bf16::from_f32(xa[x])).collect();
    let b: Vec<bf16> = xb.iter().map(|&v| bf16::from_f32(v)).collect();
    let bref: Vec<f64> = b.iter().map(|v| v.to_f64()).collect();
    let (da, db) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap());
    let mut dc = rt.upload(&vec![f32::NAN; batch * m * n]).unwrap();
    let i = |x: usize| x as i32;
    let grid = LaunchConfig::grid3((m.div_ceil(64) * n.div_ceil(64)) as u32, ny as u32, nz as u32).warps(4).stages(stages);
    let (mk, kn, mn) = (i(m * k), i(k * n), i(m * n));
    kernels_lib::matmul_batched::<bf16, f32, 64, 64, 32, 8>::launch(rt, grid, &da, &db, &mut dc, i(m), i(n), i(k), 1, i(m), i(n), 1, i(n), 1, nz as i32 * mk, mk, kn, 0, nz as i32 * mn, mn).unwrap();
    let c = dc.to_vec().unwrap();
    for y in 0..ny {
        for z in 0..nz {
            let at = y * nz + z;
            let arows: Vec<f64> = (0..m * k).map(|x| a[at * m * k + (x % k) * m + x / k].to_f64()).collect();
            let (want, scale) = reference(&arows, &bref[y * k * n..(y + 1) * k * n], m, n, k);
            let e = worst(&c[at * m * n..(at + 1) * m * n], &want, &scale);
            assert!(e <= 2.0 * gamma(k), "batch ({y}, {z}) stages {stages} seed {s}: {e:e}");
        }
    }
}

/// `matmul_split_k` on `rt`: K cut into 1, 2 and 4 slices of a ragged product (m = 5 and
/// n = 130 not multiples of the 64 x 64 tiles) with a column-major `a`, into f32 (row-major)
/// and into bf16 stored transposed (strides (1, m)), every element against the f64 product:
/// within the f32 sums' bound (doubled: tensor cores may truncate), plus the output's
/// rounding in bf16; and f32 operands (tf32) cut in 4. A workspace too small and slices of unequal length are errors.
pub(crate) fn check_split_k(rt: &Runtime) {
    use kernels_lib::matmul_split_k;
    let s = seed();
    let (m, n, k) = (5, 130, 768);
    let (xa, xb) = (random_f32(m * k, s), random_f32(k * n, s + 1));
    // a[i, p] at p * m + i (column-major).
    let a: Vec<bf16> = xa.iter().map(|&v| bf16::from_f32(v)).collect();
    let b: Vec<bf16> = xb.iter().map(|&v| bf16::from_f32(v)).collect();
    let arows: Vec<f64> = (0..m * k).map(|x| a[(x % k) * m + x / k].to_f64()).collect();
    let (want, scale) = reference(&arows, &b.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), m, n, k);
    let (da, db) = (rt.upload(&a).unwrap(), rt.upload(&b).unwrap());
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    let mut ws = rt.upload(&vec![f32::NAN; 4 * m * n]).unwrap();
    for splits in [1, 2, 4] {
        let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
        matmul_split_k(rt, &da, &db, &mut dc, &mut ws, mi, ni, ki, 1, mi, ni, 1, ni, 1, splits).unwrap();
        let e = worst(&dc.to_vec().unwrap(), &want, &scale);
        assert!(e <= 2.0 * gamma(k), "{splits} slices, f32 out, seed {s}: {e:e}");
        let mut dt = rt.upload(&vec![bf16::from_f32(f32::NAN); m * n]).unwrap();
        matmul_split_k(rt, &da, &db, &mut dt, &mut ws, mi, ni, ki, 1, mi, ni, 1, 1, mi, splits).unwrap();
        let t = dt.to_vec().unwrap();
        let rows: Vec<f32> = (0..m * n).map(|x| t[(x % n) * m + x / n].to_f32()).collect();
        let e = worst(&rows, &want, &scale);
        assert!(e <= 2.0 * gamma(k) + 1.0 / 256.0, "{splits} slices, bf16 out transposed, seed {s}: {e:e}");
    }
    // f32 operands (tf32 products, their own tile): within the tf32 test's bound.
    let (fa, fb): (Vec<f32>, Vec<f32>) = (xa.clone(), xb.clone());
    let farows: Vec<f64> = (0..m * k).map(|x| fa[(x % k) * m + x / k] as f64).collect();
    let (fwant, fscale) = reference(&farows, &fb.iter().map(|&v| v as f64).collect::<Vec<_>>(), m, n, k);
    let (dfa, dfb) = (rt.upload(&fa).unwrap(), rt.upload(&fb).unwrap());
    let mut dc = rt.upload(&vec![f32::NAN; m * n]).unwrap();
    matmul_split_k(rt, &dfa, &dfb, &mut dc, &mut ws, mi, ni, ki, 1, mi, ni, 1, ni, 1, 4).unwrap();
    let e = worst(&dc.to_vec().unwrap(), &fwant, &fscale);
    assert!(e <= 2f64.powi(-9) + 2f64.powi(-20) + 2.0 * gamma(k) * (1.0 + 2f64.powi(-8)), "4 slices, f32 (tf32), seed {s}: {e:e}");
    let mut small = rt.zeros::<f32>(4 * m * n - 1).unwrap();
    assert!(matmul_split_k(rt, &da, &db, &mut dc, &mut small, mi, ni, ki, 1, mi, ni, 1, ni, 1, 4).is_err());
    assert!(matmul_split_k(rt, &da, &db, &mut dc, &mut ws, mi, ni, ki, 1, mi, ni, 1, ni, 1, 5).is_err());
}

#[test]
fn matmul_split_k_matches_the_f64_product() {
    check_split_k(&Runtime::interpreter());
}

/// The slices of `matmul_split_k` as it launches them (`matmul_batched` at its tiles; row-major
/// operands, the slice a batch dimension of the operands' tensor maps) assemble for sm_90a
/// without spills: bf16 to `wgmma` fed by TMA (HGMMA, UTMALDG), f32 to tf32 `mma.sync`; the
/// sum of the slices to 128-bit loads.
#[test]
fn split_k_launches_assemble_to_tensor_cores_without_spills() {
    use crate::codegen::assemble_to_sass;
    use dsl_runtime::ir::ParamSpec;
    let (al, d16, one) = (ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: false, eq_one: true });
    // a, b, c; m, n, k; sam, sak (1), sbk, sbn (1), scm, scn (1); the batch strides.
    let specs = [al, al, al, d16, d16, d16, d16, one, d16, one, d16, one, d16, d16, d16, d16, d16, d16];
    let cases: [(&str, Box<dyn Kernel>, u32, &str); 2] = [
        ("split_k_bf16", Box::new(kernels_lib::matmul_batched::<bf16, f32, 64, 64, 64, 8>::new()), 4, "UTMALDG"),
        ("split_k_f32", Box::new(kernels_lib::matmul_batched::<f32, f32, 64, 64, 32, 8>::new()), 1, "HGMMA.64x64x8.F32.TF32"),
    ];
    for (name, k, stages, wanted) in cases {
        let art = dsl_runtime::compile::stages_specialized(k.as_ref(), &specs, Target::SM90, &LaunchConfig::grid(1).warps(4).stages(stages)).unwrap();
        let (report, sass) = assemble_to_sass(&art.ptx, "sm_90a", name);
        assert!(report.contains("0 bytes spill stores") && report.contains("0 bytes stack frame"), "{name}: {report}");
        assert!(sass.contains(wanted) && (stages == 1 || sass.contains("HGMMA")), "{name}: no {wanted}:\n{sass}");
    }
    let sum = kernels_lib::split_k_sum::<bf16, 1024>::new();
    let ptx = crate::codegen::ptx_for(&sum, Target::SM90, Safety::Guarded, 4);
    assert!(ptx.contains("ld.global.v4"), "{ptx}");
}

#[test]
fn library_matmul_batched_matches() {
    check_batched(&Runtime::interpreter(), 1);
}

/// Every configuration `matmul_tuned` may pick for a large problem assembles without
/// spills, specialized as a launch on row-major 4096 x 4096 operands specializes it (unit
/// strides, sizes divisible by 16, so the global loads are 16-byte vectors), on both
/// tensor-core paths of sm_90a: bf16 to `wgmma` reading the operand buffers by descriptor
/// (HGMMA, no ldmatrix; warp-specialized where the tuner offers it, `setmaxnreg` in the SASS)
/// and, forced to `mma.sync` (3 stages), to HMMA fed by `ldmatrix` (LDSM); f32
/// (tf32, `mma.sync` only) to HMMA with `a` read by `ldmatrix` and `b` by 32-bit LDS.
#[test]
fn library_matmul_configurations_assemble_to_tensor_cores_without_spills() {
    use crate::codegen::assemble_to_sass;
    use autotune::dispatch;
    use dsl_runtime::ir::ParamSpec;
    let (mut checked, mut spills) = (0, vec![]);
    for elem in [2u64, 4] {
        let key = autotune::Key::new()
            .with("m", 4096, autotune::Bucket::NextPow2)
            .with("n", 4096, autotune::Bucket::NextPow2)
            .with("k", 4096, autotune::Bucket::NextPow2)
            .with("elem", elem as i64, autotune::Bucket::Exact);
        for cfg in kernels_lib::tuned::matmul_space() {
            if !kernels_lib::tuned::matmul_tile(&cfg, &key) {
                continue;
            }
            let (bm, bn, bk, warps, stages) = (cfg.get("BM"), cfg.get("BN"), cfg.get("BK"), cfg.num_warps, cfg.num_stages);
            let k: Box<dyn Kernel> = dispatch!(bm, [64, 128], |BM| dispatch!(bn, [64, 128, 256], |BN| dispatch!(bk, [32, 64], |BK| if elem == 2 {
                Box::new(matmul::<bf16, f32, BM, BN, BK, 8>::new()) as Box<dyn Kernel>
            } else {
                Box::new(matmul::<f32, f32, BM, BN, BK, 8>::new()) as Box<dyn Kernel>
            })))
            .flatten()
            .flatten()
            .expect("a configuration of the space");
            // a, b, c aligned; m, n, k, sam, sbk, scm divisible by 16; sak, sbn, scn = 1.
            let (al, d16, one) = (ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: false, eq_one: true });
            let specs = [al, al, al, d16, d16, d16, d16, one, d16, one, d16, one];
            // The mma.sync path at one depth (the others differ from it as the
            // wgmma ones do: the prologue and the ring): ptxas's time is most of this test.
            // Likewise the cp.async path of wgmma (TMA off).
            // A warp-specialized configuration only as launched (wgmma, TMA).
            let ws = cfg.warp_specialize;
            // (f32 on `mma.sync` only where its fragments fit beside the accumulators.)
            let mma_sync = elem == 2 || bm * bn / (32 * warps as i64) <= 64;
            for (wgmma, tma) in if stages == 3 && !ws { vec![(true, true), (true, false), (false, false)] } else { vec![(true, true)] } {
                if !wgmma && !mma_sync {
                    continue;
                }
                let name = format!("matmul_{}_{bm}x{bn}x{bk}_w{warps}_s{stages}{}{}{}", if elem == 2 { "bf16" } else { "f32" }, if wgmma { "" } else { "_mma_sync" }, if tma { "" } else { "_no_tma" }, if ws { "_ws" } else { "" });
                let cfg = LaunchConfig::grid(1).warps(warps).stages(stages).wgmma(wgmma).tma(tma).warp_specialize(ws);
                let art = dsl_runtime::compile::stages_specialized(k.as_ref(), &specs, Target::SM90, &cfg).unwrap();
                // The epilogue's conversion of the accumulator reuses the operand buffers' bytes,
                // dead after the loop, instead of adding to them.
                let ring = stages.max(1) as u64 * (bm + bn) as u64 * bk as u64 * elem;
                let scratch = bm as u64 * (bn as u64 + 1) * 4;
                assert!(art.meta.shared_bytes < ring + scratch, "{name}: {} bytes of shared memory", art.meta.shared_bytes);
                let (report, sass) = assemble_to_sass(&art.ptx, "sm_90a", &name);
                if !(report.contains("0 bytes spill stores") && report.contains("0 bytes stack frame")) {
                    spills.push(name);
                    continue;
                }
                let on_wgmma = art.opt_ir.lines().any(|l| l.starts_with("// %") && l.contains(": wgmma."));
                if elem == 4 && on_wgmma {
                    // `cᵀ = bᵀ aᵀ`: aᵀ by descriptor, bᵀ ([K, N], N contiguous) by 32-bit LDS.
                    assert!(sass.contains("HGMMA.64x") && sass.contains(".F32.TF32") && sass.contains("LDS R") && !sass.contains("HMMA"), "{name}: no tf32 HGMMA");
                } else if elem == 4 {
                    // a by ldmatrix (32-bit words), b ([K, N], N contiguous) by 32-bit LDS.
                    assert!(sass.contains("HMMA.1688.F32.TF32") && sass.contains("LDSM.16.M88.4") && sass.contains("LDS R"), "{name}: no HMMA fed from shared memory");
                } else if wgmma {
                    // a K-major, b ([K, N], N contiguous) MN-major: the transpose bit on b only.
                    assert!(sass.contains("HGMMA.64x") && sass.contains(".tnspB") && !sass.contains(".tnspA") && !sass.contains("LDSM"), "{name}: no HGMMA reading shared memory by descriptor");
                } else {
                    assert!(sass.contains("HMMA.16816.F32") && sass.contains("LDSM.16.M88.4") && sass.contains("LDSM.16.MT88.4"), "{name}: no HMMA fed by LDSM");
                }
                if stages == 1 {
                    assert!(sass.contains("LDG.E.128") && sass.contains("STS.128"), "{name}: operands not moved in 16-byte vectors");
                } else if on_wgmma && tma {
                    // Global to shared by the tensor memory accelerator, tile by tile.
                    assert!(sass.contains("UTMALDG.2D") && sass.contains("SYNCS.PHASECHK") && !sass.contains("LDGSTS") && !sass.contains("STS.128"), "{name}: operands not copied by TMA");
                    // Specialized: the producer warpgroup gives its registers to the consumers.
                    assert_eq!(ws, sass.contains("USETMAXREG"), "{name}: warp specialization");
                } else {
                    // Global to shared without registers, 16 bytes a copy, zero-filling masked vectors.
                    assert!(sass.contains("LDGSTS.E.BYPASS.128") && !sass.contains("STS.128"), "{name}: operands not copied asynchronously");
                }
                checked += 1;
            }
        }
    }
    assert!(spills.is_empty(), "configurations that spill registers: {spills:?}");
    assert!(checked >= 16, "only {checked} configurations kept");
}

/// Which tensor-core instruction a `dot` takes, as the plan dump shows it: `wgmma` on
/// sm_90a where the tile is whole warpgroups of 64 rows and both operands are read from
/// shared memory at the dot, with the instruction's N a warpgroup's share of the tile;
/// `mma.sync` on sm_80, when forced (`LaunchConfig::wgmma(false)`), on 2 warps, or for
/// 32-row tiles. The buffers `wgmma` reads start at 1024-byte swizzle atoms.
#[test]
fn matmul_takes_wgmma_on_sm90_where_the_tile_fits() {
    use dsl_runtime::ir::ParamSpec;
    // Every parameter 16-aligned (the matmul's 12; one entry a parameter, as
    // `stages_specialized` requires).
    let nice_for = |k: &dyn Kernel| vec![ParamSpec { div16: true, eq_one: false }; k.meta().params.len()];
    let plan = |k: &dyn Kernel, target: Target, cfg: LaunchConfig| {
        let art = dsl_runtime::compile::stages_specialized(k, &nice_for(k), target, &cfg).unwrap();
        art.opt_ir.lines().filter(|l| l.starts_with("// %")).map(|l| l.split(": ").nth(1).unwrap().to_string()).collect::<Vec<_>>()
    };
    let big = matmul::<bf16, f32, 128, 128, 64, 8>::new();
    let cfg = LaunchConfig::grid(1).warps(4).stages(3);
    assert_eq!(plan(&big, Target::SM90, cfg), ["wgmma.m64n128k16"]);
    assert_eq!(plan(&big, Target::SM90, cfg.warps(8)), ["wgmma.m64n128k16"], "8 warps: two warpgroups along M");
    assert_eq!(plan(&matmul::<f16, f32, 64, 128, 32, 8>::new(), Target::SM90, cfg.warps(8)), ["wgmma.m64n64k16"], "8 warps on 64 rows: two warpgroups along N");
    assert_eq!(plan(&big, Target::SM80, cfg), ["mma.sync.m16n8k16"]);
    assert_eq!(plan(&big, Target::SM90, cfg.wgmma(false)), ["mma.sync.m16n8k16"]);
    assert_eq!(plan(&big, Target::SM90, cfg.warps(2)), ["mma.sync.m16n8k16"], "not a warpgroup");
    assert_eq!(plan(&matmul::<bf16, f32, 32, 64, 32, 8>::new(), Target::SM90, cfg), ["mma.sync.m16n8k16"], "32 rows");
    // tf32: the tensor cores read f32 operands from shared memory only K-major. `b` [K, N]
    // N-contiguous (row-major, or strides unknown): `cᵀ = bᵀ aᵀ` with bᵀ from registers;
    // `b` K-contiguous: both by descriptor; `a` M-contiguous: `mma.sync`.
    let tf32 = matmul::<f32, f32, 128, 64, 32, 8>::new();
    assert_eq!(plan(&tf32, Target::SM90, cfg), ["wgmma.m64n128k8.tf32 (c^T = b^T a^T)"], "tf32");
    let with = |eq_one: usize, div16: usize| {
        let mut specs = nice_for(&tf32);
        (specs[eq_one], specs[div16]) = (ParamSpec { div16: false, eq_one: true }, ParamSpec { div16: true, eq_one: false });
        let art = dsl_runtime::compile::stages_specialized(&tf32, &specs, Target::SM90, &cfg).unwrap();
        art.opt_ir.lines().filter(|l| l.starts_with("// %")).map(|l| l.split(": ").nth(1).unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(with(8, 9), ["wgmma.m64n64k8.tf32"], "tf32, b column-major");
    assert_eq!(with(6, 7), ["mma.sync.m16n8k8.tf32"], "tf32, a column-major");
    assert_eq!(plan(&tf32, Target::SM90, cfg.wgmma(false)), ["mma.sync.m16n8k8.tf32"]);
    assert_eq!(plan(&tf32, Target::SM80, cfg), ["mma.sync.m16n8k8.tf32"]);
    // A buffer read by two products, directly and transposed: both `wgmma` where both fit
    // (the two reads laid out for descriptors alike); where one cannot (32 rows), the other
    // keeps `mma.sync` too, since `ldmatrix` and the tensor cores want different layouts.
    assert_eq!(plan(&shared_tile_products::<64>::new(), Target::SM90, cfg), ["wgmma.m64n64k16", "wgmma.m64n64k16"]);
    assert_eq!(plan(&shared_tile_products::<32>::new(), Target::SM90, cfg), ["mma.sync.m16n8k16", "mma.sync.m16n8k16"]);
    let ptx = dsl_runtime::compile::stages_specialized(&big, &nice_for(&big), Target::SM90, &cfg).unwrap().ptx;
    assert!(ptx.contains(".shared .align 1024") && ptx.contains("fence.proxy.async.shared::cta") && ptx.contains("wgmma.wait_group.sync.aligned 0"), "{ptx}");
    // The pipelined loop (unit strides: 16-byte copies) issues its wgmmas, then the copies
    // for later iterations while they run, then waits: in the machine code too.
    let (al, one) = (ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: false, eq_one: true });
    let unit_strides = [al, al, al, al, al, al, al, one, al, one, al, one];
    let ptx = dsl_runtime::compile::stages_specialized(&big, &unit_strides, Target::SM90, &cfg).unwrap().ptx;
    let code = crate::codegen::sass(&ptx, "sm_90a", "matmul_wgmma_order");
    let body = crate::codegen::loop_bodies(&code).into_iter().find(|l| l.contains("HGMMA")).expect("a loop of wgmmas");
    let at = |what: &str| body.find(what).unwrap_or_else(|| panic!("no {what} in\n{body}"));
    let (last_mma, wait) = (body.rfind("HGMMA").unwrap(), at("WARPGROUP.DEPBAR"));
    let last_copy = body.rfind("UTMALDG").unwrap_or_else(|| panic!("no copies in the loop:\n{body}"));
    assert!(last_mma < last_copy && last_copy < wait, "copies not issued while the wgmmas run:\n{body}");
    // The ring has a stage to spare (4 of 128 x 64 and 64 x 128 tiles for 3 stages): an
    // iteration leaves its wgmmas in flight (wait_group 1) and the loop's result is
    // waited for after it. Unpipelined, every iteration waits for its own.
    assert!(body.contains("WARPGROUP.DEPBAR.LE gsb0, 0x1") && code.contains("WARPGROUP.DEPBAR.LE gsb0, 0x0"), "no overlap across iterations:\n{body}");
    let art = dsl_runtime::compile::stages_specialized(&big, &unit_strides, Target::SM90, &cfg).unwrap();
    assert!(art.meta.shared_bytes >= 4 * 2 * 128 * 64 * 2, "{} bytes of shared memory: no spare stage", art.meta.shared_bytes);
    // 128 x 256 x 64 tiles at 4 stages take 192 KiB: a fifth would not fit, so that loop
    // waits for its own wgmmas.
    let wide = matmul::<bf16, f32, 128, 256, 64, 8>::new();
    let art = dsl_runtime::compile::stages_specialized(&wide, &unit_strides, Target::SM90, &cfg.warps(8).stages(4)).unwrap();
    assert!(art.meta.shared_bytes <= 232_448 && !art.ptx.contains("wgmma.wait_group.sync.aligned 1"), "{} bytes", art.meta.shared_bytes);
    let ptx1 = dsl_runtime::compile::stages_specialized(&big, &unit_strides, Target::SM90, &cfg.stages(1)).unwrap().ptx;
    let code1 = crate::codegen::sass(&ptx1, "sm_90a", "matmul_wgmma_1_stage");
    let body1 = crate::codegen::loop_bodies(&code1).into_iter().find(|l| l.contains("HGMMA")).expect("a loop of wgmmas");
    assert!(body1.contains("WARPGROUP.DEPBAR.LE gsb0, 0x0") && !code1.contains("gsb0, 0x1"), "unpipelined: no overlap:\n{body1}");
}

/// `fence.proxy.async` (the async proxy of `wgmma` sees what threads stored) exactly where
/// threads store the operands: unpipelined, every iteration stores its tiles (`STS`) and
/// fences them before the barrier; pipelined, the tiles arrive by `cp.async` and the loop
/// has no fence (nor the `MEMBAR` that comes with it).
#[test]
fn proxy_fences_follow_thread_stores_only() {
    use dsl_runtime::ir::ParamSpec;
    let (al, one) = (ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: false, eq_one: true });
    let unit_strides = [al, al, al, al, al, al, al, one, al, one, al, one];
    let big = matmul::<bf16, f32, 128, 128, 64, 8>::new();
    let wgmma_loop = |stages: u32| {
        let ptx = dsl_runtime::compile::stages_specialized(&big, &unit_strides, Target::SM90, &LaunchConfig::grid(1).warps(4).stages(stages)).unwrap().ptx;
        let code = crate::codegen::sass(&ptx, "sm_90a", &format!("matmul_fence_{stages}"));
        crate::codegen::loop_bodies(&code).into_iter().find(|l| l.contains("HGMMA")).expect("a loop of wgmmas")
    };
    let stored = wgmma_loop(1);
    assert!(stored.contains("STS") && stored.contains("FENCE.VIEW.ASYNC.S"), "stored operands, no fence:\n{stored}");
    let copied = wgmma_loop(3);
    assert!(copied.contains("UTMALDG") && !copied.contains("FENCE.VIEW.ASYNC") && !copied.contains("MEMBAR"), "a fence in the pipelined loop:\n{copied}");
}

/// Column-major operands (a transpose passed as strides, as `x^T dq` in an attention
/// backward) are loaded along their columns in 16-byte vectors (asynchronously when
/// pipelined), stored column-major in shared memory and read by `ldmatrix` (`.trans` for
/// an M-contiguous `a`, plain for a K-contiguous `b`): no
/// element-by-element global loads, for every mix of row- and column-major `a` and `b`.
#[test]
fn column_major_operands_are_loaded_in_vectors() {
    use crate::codegen::sass;
    use dsl_runtime::ir::ParamSpec;
    let (al, d16, one) = (ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: false, eq_one: true });
    for (a_cols, b_cols) in [(true, false), (false, true), (true, true)] {
        for stages in [1, 3] {
            // a, b, c; m, n, k; sam, sak, sbk, sbn, scm, scn.
            let (sam, sak) = if a_cols { (one, d16) } else { (d16, one) };
            let (sbk, sbn) = if b_cols { (one, d16) } else { (d16, one) };
            let specs = [al, al, al, d16, d16, d16, sam, sak, sbk, sbn, d16, one];
            let name = format!("matmul_a{}_b{}_s{stages}", if a_cols { "col" } else { "row" }, if b_cols { "col" } else { "row" });
            let cfg = LaunchConfig::grid(1).warps(4).stages(stages);
            let k = matmul::<bf16, f32, 64, 64, 32, 8>::new();
            let art = dsl_runtime::compile::stages_specialized(&k, &specs, Target::SM90, &cfg.wgmma(false)).unwrap();
            let code = sass(&art.ptx, "sm_90a", &name);
            // An M-contiguous `a` and an N-contiguous `b` are read transposed.
            let trans = a_cols || !b_cols;
            assert!(code.contains("HMMA.16816.F32.BF16") && code.contains("LDSM.16.M") && code.contains("LDSM.16.MT88.4") == trans, "{name}: no HMMA fed by ldmatrix");
            // wgmma reads them where they are: the transpose bit of an MN-major operand.
            let wg = sass(&dsl_runtime::compile::stages_specialized(&k, &specs, Target::SM90, &cfg).unwrap().ptx, "sm_90a", &format!("{name}_wgmma"));
            assert!(wg.contains("HGMMA.64x64x16.F32.BF16") && wg.contains(".tnspA") == a_cols && wg.contains(".tnspB") != b_cols, "{name}: wgmma transposes");
            assert!(!code.contains("LDG.E.U16"), "{name}: element-by-element global loads");
            if stages == 1 {
                assert!(code.contains("LDG.E.128"), "{name}: no 16-byte loads");
            } else {
                assert!(code.contains("LDGSTS.E.BYPASS.128"), "{name}: not copied asynchronously in 16-byte vectors");
            }
        }
    }
}

/// `num_stages` is a real choice for a matmul (its loop is pipelined; f32 at tf32 too) and
/// for a loop that loads (its loads prefetched), and none for an elementwise kernel, whose
/// tuning candidates that differ only in it run once.
#[test]
fn num_stages_changes_code_where_a_loop_multiplies_or_loads() {
    use dsl_runtime::compile::num_stages_changes_code;
    assert!(num_stages_changes_code(&matmul::<bf16, f32, 64, 64, 32, 8>::new()).unwrap());
    assert!(num_stages_changes_code(&matmul::<f32, f32, 64, 64, 32, 8>::new()).unwrap(), "tf32");
    assert!(!num_stages_changes_code(&kernels_lib::relu_mul_add::<f32, 1024>::new()).unwrap());
    // Loops over column blocks and slices of K, whose loads are prefetched.
    assert!(num_stages_changes_code(&kernels_lib::softmax::<f32, 1, 1024>::new()).unwrap(), "a loop that loads");
    assert!(num_stages_changes_code(&kernels_lib::split_k_sum::<f32, 256>::new()).unwrap(), "a loop that loads");
}

/// Carried pointers (Triton's tutorial style) are pipelined too: correct on the
/// interpreter (which runs the kernel as written), and copied ahead with `cp.async` in the
/// GPU code.
#[test]
fn a_matmul_with_carried_pointers_is_pipelined() {
    let rt = Runtime::interpreter();
    let s = seed();
    let (m, n, k) = (50, 48, 80);
    let ([a, b], (want, scale)) = bf16_product(m, n, k, s);
    let mut c = vec![f32::NAN; m * n];
    let grid = LaunchConfig::grid3(m.div_ceil(32) as u32, n.div_ceil(32) as u32, 1).stages(3);
    matmul_carried::<32, 32, 16>::launch(&rt, grid, &a, &b, &mut c, m as i32, n as i32, k as i32).unwrap();
    assert!(worst(&c, &want, &scale) <= gamma(k), "seed {s}");
    use dsl_runtime::ir::ParamSpec;
    let al = ParamSpec { div16: true, eq_one: false };
    let art = dsl_runtime::compile::stages_specialized(&matmul_carried::<64, 64, 32>, &[al; 6], Target::SM90, &LaunchConfig::grid(1).warps(4).stages(3)).unwrap();
    assert!(art.opt_ir.contains("async_copy") && art.ptx.contains("cp.async.cg.shared.global"), "{}", art.opt_ir);
}

/// The persistent matmul's loop around the main loop keeps the main loop's code on sm_90a:
/// the 128 x 256 bf16 tile's TMA copies and `wgmma`s at 3 and 4 stages, nothing spilled.
/// (f32 at the tuner's tile, 128 x 128 on 4 warps, spills there: 250 registers a thread
/// without the outer loop, 255 and 408 bytes of spills with it.)
#[test]
fn persistent_matmul_assembles_to_tma_and_wgmma() {
    use dsl_runtime::ir::ParamSpec;
    use kernels_lib::matmul_persistent;
    let (al, one) = (ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: false, eq_one: true });
    let specs = [al, al, al, al, al, al, al, one, al, one, al, one];
    let bf: Box<dyn Kernel> = Box::new(matmul_persistent::<bf16, f32, 128, 256, 64, 8>::new());
    for (name, k, warps, stages) in [("bf16_s3", &bf, 8, 3), ("bf16_s4", &bf, 8, 4)] {
        let cfg = LaunchConfig::grid(1).warps(warps).stages(stages);
        let art = dsl_runtime::compile::stages_specialized(k.as_ref(), &specs, Target::SM90, &cfg).unwrap();
        let (report, sass) = crate::codegen::assemble_to_sass(&art.ptx, "sm_90a", &format!("matmul_persistent_{name}"));
        assert!(report.contains("0 bytes spill stores") && report.contains("0 bytes stack frame"), "{name}:\n{report}");
        assert!(sass.contains("HGMMA.64x") && sass.contains("UTMALDG.2D") && sass.contains("SYNCS.PHASECHK"), "{name}: no TMA-fed HGMMA");
    }
}

/// TMA stores on sm_90a (`LaunchConfig::tma_store`): the library matmul's output tile goes
/// to shared memory in the accumulator's layout and out by `cp.async.bulk.tensor` copies
/// (UTMASTG, no thread's global store), for f32 and bf16 outputs, row- and column-major
/// `c`, warp-specialized and not, nothing spilled, its buffer in the bytes of the dead
/// operand ring (no more shared memory than the plain store's). Off, and
/// where `c`'s strides are not known to be multiples of 16 bytes, the plain store stays.
#[test]
fn tma_stores_assemble_for_matmul_tiles() {
    use dsl_runtime::ir::ParamSpec;
    let (al, one, any) = (ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: false, eq_one: true }, ParamSpec::default());
    let rows = [al, al, al, al, al, al, al, one, al, one, al, one];
    let cols = [al, al, al, al, al, al, al, one, al, one, one, al];
    let odd = [al, al, al, al, al, al, al, one, al, one, any, one];
    let (wide_f32, wide_bf16, narrow) = (matmul::<bf16, f32, 128, 256, 64, 8>::new(), matmul::<bf16, bf16, 128, 256, 64, 8>::new(), matmul::<bf16, f32, 64, 64, 32, 8>::new());
    // (name, kernel, warps, warp-specialized, specializations, stored by TMA)
    type Case<'a> = (&'a str, &'a dyn Kernel, u32, bool, &'a [ParamSpec; 12], bool);
    let cases: [Case; 6] = [
        ("wide_f32", &wide_f32, 8, false, &rows, true),
        ("wide_f32_ws", &wide_f32, 8, true, &rows, true),
        ("wide_bf16", &wide_bf16, 8, false, &rows, true),
        ("narrow_cols", &narrow, 4, false, &cols, true),
        ("narrow_odd_stride", &narrow, 4, false, &odd, false),
        ("narrow_off", &narrow, 4, false, &rows, false),
    ];
    for (name, k, warps, ws, specs, by_tma) in cases {
        let cfg = LaunchConfig::grid(1).warps(warps).stages(3).warp_specialize(ws).tma_store(name != "narrow_off");
        let art = dsl_runtime::compile::stages_specialized(k, specs, Target::SM90, &cfg).unwrap();
        assert_eq!(art.opt_ir.contains("tma_store"), by_tma, "{name}:\n{}", art.opt_ir);
        assert_eq!(art.meta.tensor_maps.len(), 2 + usize::from(by_tma), "{name}: the tensor maps");
        let (report, sass) = crate::codegen::assemble_to_sass(&art.ptx, "sm_90a", &format!("matmul_tma_store_{name}"));
        assert!(report.contains("0 bytes spill stores") && report.contains("0 bytes stack frame"), "{name}:\n{report}");
        assert_eq!(sass.contains("UTMASTG.2D"), by_tma, "{name}: TMA stores");
        assert_eq!(sass.contains("STG.E"), !by_tma, "{name}: threads' global stores");
        let plain = dsl_runtime::compile::stages_specialized(k, specs, Target::SM90, &cfg.tma_store(false)).unwrap();
        assert_eq!(art.meta.shared_bytes, plain.meta.shared_bytes, "{name}: the tile's buffer takes bytes of the operand ring, dead after the loop");
    }
    // A block in a blocked layout (no product): its own buffer, stored by TMA.
    let art = dsl_runtime::compile::stages_specialized(&tile_copy::new(), &[al, al, any], Target::SM90, &LaunchConfig::grid(1).warps(4).tma_store(true)).unwrap();
    assert!(art.opt_ir.contains("tma_store"), "tile_copy:\n{}", art.opt_ir);
    let (report, sass) = crate::codegen::assemble_to_sass(&art.ptx, "sm_90a", "tile_copy_tma_store");
    assert!(report.contains("0 bytes spill stores") && sass.contains("UTMASTG.2D") && !sass.contains("STG.E"), "tile_copy:\n{report}");
}

/// Warp specialization on sm_90a (`LaunchConfig::warp_specialize`): the library matmul's
/// TMA loop split into a producer warpgroup (one thread issuing the copies after each
/// stage is given back) and the consumers (waiting, multiplying, giving stages back with
/// no barrier in the loop), registers moved by `setmaxnreg`, nothing spilled; the launch
/// runs the producer's 4 warps besides the 8.
#[test]
fn warp_specialized_matmul_assembles() {
    use dsl_runtime::ir::ParamSpec;
    let (al, one) = (ParamSpec { div16: true, eq_one: false }, ParamSpec { div16: false, eq_one: true });
    let specs = [al, al, al, al, al, al, al, one, al, one, al, one];
    let k = matmul::<bf16, f32, 128, 256, 64, 8>::new();
    for ws in [true, false] {
        let cfg = LaunchConfig::grid(1).warps(8).stages(3).warp_specialize(ws);
        let art = dsl_runtime::compile::stages_specialized(&k, &specs, Target::SM90, &cfg).unwrap();
        assert_eq!(art.meta.producer_warps, if ws { 4 } else { 0 });
        assert_eq!(art.opt_ir.contains("warp_specialize producer {"), ws, "{}", art.opt_ir);
        let (report, sass) = crate::codegen::assemble_to_sass(&art.ptx, "sm_90a", &format!("matmul_ws_{ws}"));
        assert!(report.contains("0 bytes spill stores"), "{report}");
        if !ws {
            assert!(!sass.contains("USETMAXREG"), "setmaxnreg without a producer");
            continue;
        }
        // Producer 24 registers, consumers 240 (`lower::tma::register_split`).
        assert!(sass.contains("USETMAXREG.DEALLOC.CTAPOOL 0x18") && sass.contains("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0"), "no register split");
        let loops = crate::codegen::loop_bodies(&sass);
        let consumer = loops.iter().find(|l| l.contains("HGMMA")).unwrap_or_else(|| panic!("no wgmma loop:\n{sass}"));
        assert!(consumer.contains("SYNCS.PHASECHK") && consumer.contains("SYNCS.ARRIVE") && !consumer.contains("UTMALDG") && !consumer.contains("BAR.SYNC"), "the consumers' loop:\n{consumer}");
        let producer = loops.iter().find(|l| l.contains("UTMALDG.2D") && l.contains("SYNCS.PHASECHK") && !l.contains("HGMMA")).unwrap_or_else(|| panic!("no producer loop:\n{sass}"));
        assert!(!producer.contains("BAR.SYNC"), "the producer's loop:\n{producer}");
    }
}
