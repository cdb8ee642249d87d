//! Row kernels (softmax, RMSNorm, LayerNorm, row sum/mean, transpose) and the 2-D,
//! reduction, loop, branch, atomic and debug features of the language, on the CPU
//! interpreter against CPU references in f64, on fresh random inputs. Shapes include
//! rows that are not multiples of the block, blocks that are not powers of two, and rows
//! longer than one block (the looping paths).

use crate::common::*;
use dsl_runtime::prelude::*;
use kernels_lib::*;

/// The f64 softmax of each row (`examples::workloads::softmax_rows`) of f32 input.
fn softmax_ref(x: &[f32], cols: usize) -> Vec<f64> {
    examples::workloads::softmax_rows(&x.iter().map(|&v| v as f64).collect::<Vec<_>>(), cols)
}

fn as_f64<T: Copy + Into<f64>>(v: &[T]) -> Vec<f64> {
    v.iter().map(|&x| x.into()).collect()
}

#[test]
fn softmax_one_block_and_looping() {
    let rt = Runtime::interpreter();
    let s = seed();
    for (rows, cols) in [(3, 1000), (2, 48), (4, 1), (3, 300)] {
        let x = random_f32(rows * cols, s);
        let reference = softmax_ref(&x, cols);
        let (nr, nc) = (rows as i32, cols as i32);
        // BLOCK covers the row (1000 → padded 1024 internally; 48 is not a power of two).
        let mut out = vec![f32::NAN; rows * cols];
        softmax::<f32, 1, 1000>::launch(&rt, rows_grid(rows, 4), &x, &mut out, nr, nc, nc).unwrap();
        assert!(rel_l2(&as_f64(&out), &reference) < 1e-6, "seed {s} {rows}x{cols}");
        assert_close(&format!("softmax seed {s} {rows}x{cols}"), &as_f64(&out), &reference, None, examples::workloads::softmax_bound(cols, false));
        // Rows longer than the block: three loops over the row; two rows per program
        // (rows not a multiple of two).
        let mut out = vec![f32::NAN; rows * cols];
        softmax::<f32, 2, 64>::launch(&rt, rows_grid(rows.div_ceil(2), 4), &x, &mut out, nr, nc, nc).unwrap();
        assert!(rel_l2(&as_f64(&out), &reference) < 1e-6, "seed {s} {rows}x{cols} looping");
        assert_close(&format!("softmax seed {s} {rows}x{cols} looping"), &as_f64(&out), &reference, None, examples::workloads::softmax_bound(cols, false));
        // The tuned launch (the interpreter takes the first candidate the pruning keeps).
        let dx = rt.upload(&x).unwrap();
        let mut dout = rt.upload(&vec![f32::NAN; rows * cols]).unwrap();
        softmax_tuned(&rt, &dx, &mut dout, nr, nc, nc).unwrap();
        assert!(rel_l2(&as_f64(&dout.to_vec().unwrap()), &reference) < 1e-6, "seed {s} {rows}x{cols} tuned");
    }
    let (rows, cols) = (3, 777);
    let x = random_bf16(rows * cols, s);
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let mut out = vec![bf16::NAN; rows * cols];
    softmax::<bf16, 1, 777>::launch(&rt, rows_grid(rows, 4), &x, &mut out, rows as i32, cols as i32, cols as i32).unwrap();
    let o: Vec<f64> = out.iter().map(|v| v.to_f64()).collect();
    assert_close(&format!("softmax_bf16 seed {s}"), &o, &softmax_ref(&xf, cols), None, examples::workloads::softmax_bound(cols, true));
}

#[test]
fn rmsnorm_and_layernorm() {
    let rt = Runtime::interpreter();
    let s = seed();
    // One pass (a row of 300 in a padded block, rows not a multiple of ROWS), and two
    // passes (rows of 1000 in 300- and 256-wide chunks); one and several rows per program.
    for (rows, cols) in [(5usize, 300usize), (3, 1000)] {
        let x = random_bf16(rows * cols, s);
        let w = random_bf16(cols, s + 1);
        let reference = examples::workloads::rmsnorm_rows(&as_f64(&x), &as_f64(&w), 1e-6);
        let (nr, nc) = (rows as i32, cols as i32);
        let mut outs = vec![vec![bf16::NAN; rows * cols]; 3];
        rmsnorm_bf16::<1, 300>::launch(&rt, rows_grid(rows, 4), &x, &w, &mut outs[0], nr, nc, nc, 1e-6).unwrap();
        rmsnorm_bf16::<2, 1024>::launch(&rt, rows_grid(rows.div_ceil(2), 4), &x, &w, &mut outs[1], nr, nc, nc, 1e-6).unwrap();
        rmsnorm_bf16::<4, 256>::launch(&rt, rows_grid(rows.div_ceil(4), 2), &x, &w, &mut outs[2], nr, nc, nc, 1e-6).unwrap();
        // The tuned launch (the interpreter takes the first candidate the pruning keeps).
        let (dx, dw) = (rt.upload(&x).unwrap(), rt.upload(&w).unwrap());
        let mut dout = rt.upload(&vec![bf16::NAN; rows * cols]).unwrap();
        let cfg = rmsnorm_bf16_tuned(&rt, &dx, &dw, &mut dout, nr, nc, nc, 1e-6).unwrap();
        assert_eq!(cfg.get("BLOCK"), (cols.next_power_of_two().max(64)) as i64, "{cfg}");
        outs.push(dout.to_vec().unwrap());
        for (i, out) in outs.iter().enumerate() {
            assert_close(&format!("rmsnorm seed {s} {rows}x{cols} launch {i}"), &as_f64(out), &reference, None, examples::workloads::rmsnorm_bound(cols));
        }
    }

    let (rows, cols) = (4, 1000);
    let x = random_f32(rows * cols, s + 2);
    let (w, b) = (random_f32(cols, s + 3), random_f32(cols, s + 4));
    let mut out = vec![f32::NAN; rows * cols];
    layernorm::<256>::launch(&rt, rows_grid(rows, 4), &x, &w, &b, &mut out, cols as i32, cols as i32, 1e-5).unwrap();
    let mut reference = vec![0.0; rows * cols];
    for r in 0..rows {
        let row: Vec<f64> = (0..cols).map(|c| x[r * cols + c] as f64).collect();
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
        for c in 0..cols {
            reference[r * cols + c] = (row[c] - mean) / (var + 1e-5).sqrt() * w[c] as f64 + b[c] as f64;
        }
    }
    assert!(rel_l2(&as_f64(&out), &reference) < 1e-5, "seed {s}");
}

#[test]
fn row_sums_and_transpose_2d() {
    let rt = Runtime::interpreter();
    let s = seed();
    let (rows, cols) = (37, 130);
    let x = random_f32(rows * cols, s);
    let (mut sums, mut means) = (vec![f32::NAN; rows], vec![f32::NAN; rows]);
    row_sum_mean::<16, 32>::launch(&rt, LaunchConfig::grid(rows.div_ceil(16) as u32), &x, &mut sums, &mut means, rows as i32, cols as i32, cols as i32).unwrap();
    for r in 0..rows {
        let want: f64 = x[r * cols..(r + 1) * cols].iter().map(|&v| v as f64).sum();
        assert!((sums[r] as f64 - want).abs() < 1e-3, "row {r}: {} vs {want} (seed {s})", sums[r]);
        assert!((means[r] as f64 - want / cols as f64).abs() < 1e-5);
    }
    let (rows, cols) = (70, 45);
    let x = random_f32(rows * cols, s + 1);
    let mut out = vec![f32::NAN; rows * cols];
    let grid = LaunchConfig::grid3(cols.div_ceil(32) as u32, rows.div_ceil(32) as u32, 1);
    transpose::<32>::launch(&rt, grid, &x, &mut out, rows as i32, cols as i32).unwrap();
    for r in 0..rows {
        for c in 0..cols {
            assert_eq!(out[c * rows + r], x[r * cols + c]);
        }
    }
}

#[kernel]
pub(crate) fn features(x: Ptr<f32>, idx: Ptr<i32>, scan: Ptr<f32>, counts: Ptr<i32>, hist_max: Ptr<f32>, n: i32) {
    let offs = arange::<48>();
    let m = offs < n;
    let v = load(x + offs, m, 0.0);
    // argmax/argmin over a padded block, and a scalar store.
    store(idx, select(m, v, f32::NEG_INFINITY).argmax(0));
    store(idx + 1, select(m, v, f32::INFINITY).argmin(0));
    store(scan + offs, v.cumsum(0), m);
    // A 2-D reduction along each axis, broadcasting back.
    let grid = v.col() + zeros::<f32>([48, 4]);
    let back = grid.sum(1) / 4.0;
    store(scan + 48 + offs, back, m);
    // Atomics: count elements above zero, and a running maximum.
    atomic_add(counts, 1, m & (v > 0.0));
    atomic_max(hist_max + (offs % 4), v, m);
    // A runtime branch that gives a value and a loop that carries two values.
    let mut total = 0.0;
    let mut steps = 0;
    for i in (0..n).step_by(7) {
        total = total + load(x + i);
        steps = steps + 1;
    }
    let sign = if total > 0.0 { 1 } else { -1 };
    store(counts + 1, steps * sign);
    if n > 1000 {
        return;
    }
    store(counts + 2, 42);
}

/// Relaxed atomic sums (`atomic_add(.., "relaxed")`, results unread): every program adds
/// its `[16, 64]` tile of `x` into `out` (f32: vector reductions on sm_90) and one into
/// `counts` per row (i32), rows from `rows` on masked off.
#[kernel]
pub(crate) fn relaxed_sums(x: Ptr<f32>, out: Ptr<f32>, counts: Ptr<i32>, rows: i32) {
    let r = arange::<16>();
    let at = r.col() * 64 + arange::<64>().row();
    let v = load(x + program_id(0) * 1024 + at);
    atomic_add(out + at, v, r.col() < rows, "relaxed");
    atomic_add(counts + r, 1, r < rows, "relaxed");
}

/// [`relaxed_sums`] over 8 programs: the sums of the f64 reference, the counts exact.
#[test]
fn relaxed_atomic_sums_on_the_interpreter() {
    let rt = Runtime::interpreter();
    let x = random_f32(8 * 1024, seed());
    let (mut out, mut counts) = (vec![0.0f32; 1024], vec![0i32; 16]);
    relaxed_sums::launch(&rt, LaunchConfig::grid(8), &x, &mut out, &mut counts, 11).unwrap();
    for i in 0..1024 {
        let want: f64 = if i / 64 < 11 { (0..8).map(|p| x[p * 1024 + i] as f64).sum() } else { 0.0 };
        assert!((out[i] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "out[{i}] = {}, want {want}", out[i]);
    }
    assert_eq!(counts, (0..16).map(|r| if r < 11 { 8 } else { 0 }).collect::<Vec<_>>());
}

#[test]
fn language_features_on_the_interpreter() {
    let rt = Runtime::interpreter();
    let s = seed();
    let n = 45usize;
    let x = random_f32(n, s);
    let mut idx = vec![-1i32; 2];
    let mut scan = vec![f32::NAN; 96];
    let mut counts = vec![0i32; 3];
    let mut hmax = vec![f32::NEG_INFINITY; 4];
    features::launch(&rt, LaunchConfig::grid(1), &x, &mut idx, &mut scan, &mut counts, &mut hmax, n as i32).unwrap();
    let best = (0..n).max_by(|&a, &b| x[a].partial_cmp(&x[b]).unwrap().then(b.cmp(&a))).unwrap();
    let worst = (0..n).min_by(|&a, &b| x[a].partial_cmp(&x[b]).unwrap().then(a.cmp(&b))).unwrap();
    assert_eq!(idx, vec![best as i32, worst as i32], "seed {s}");
    let mut run = 0.0f64;
    for i in 0..n {
        run += x[i] as f64;
        assert!((scan[i] as f64 - run).abs() < 1e-4, "cumsum[{i}] seed {s}");
        assert!((scan[48 + i] - x[i]).abs() < 1e-5);
    }
    assert_eq!(counts[0], x.iter().filter(|&&v| v > 0.0).count() as i32);
    let total: f32 = (0..n).step_by(7).map(|i| x[i]).sum();
    let steps = n.div_ceil(7) as i32;
    assert_eq!(counts[1], if total > 0.0 { steps } else { -steps });
    assert_eq!(counts[2], 42);
    for (k, &got) in hmax.iter().enumerate() {
        let want = (k..n).step_by(4).map(|i| x[i]).fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(got, want);
    }
    // `return` ends the program after the stores before it and before the last one
    // (sentinels: a kernel that did nothing, or ignored the `return`, fails).
    let mut counts = vec![-1i32; 3];
    let big = random_f32(2000, s + 1);
    features::launch(&rt, LaunchConfig::grid(1), &big, &mut idx, &mut vec![0.0; 96], &mut counts, &mut hmax, 2000).unwrap();
    let total: f32 = (0..2000).step_by(7).map(|i| big[i]).sum();
    let steps = 2000usize.div_ceil(7) as i32;
    assert_eq!(counts[1], if total > 0.0 { steps } else { -steps }, "the store before `return` ran");
    assert_eq!(counts[2], -1, "the store after `return` did not");
}

#[kernel]
pub(crate) fn checked(x: Ptr<f32>, n: i32) {
    let offs = arange::<16>();
    let v = load(x + offs, offs < n, 1.0);
    device_assert(v > 0.0, "inputs must be positive");
    device_print("v = ", v);
}

#[test]
fn device_assert_is_reported_in_debug_builds_only() {
    let rt = Runtime::interpreter();
    let x = vec![1.0f32, 2.0, -3.0, 4.0];
    checked::launch(&rt, LaunchConfig::grid(1).debug(false), &x, 4).unwrap();
    let err = checked::launch(&rt, LaunchConfig::grid(1).debug(true), &x, 4).unwrap_err().to_string();
    assert!(err.contains("device assertion failed at element [2]: inputs must be positive"), "{err}");
    assert!(err.contains("tests/all/rows.rs"), "{err}");
}

#[kernel]
pub(crate) fn swaps(x: Ptr<i32>, f: Ptr<f32>) {
    let offs = arange::<8>();
    // Exchange 8 slots, keep the old values; compare-and-swap two slots, one matching.
    let old = atomic_xchg(x + offs, offs * 2);
    store(x + 8 + offs, old);
    let a = atomic_cas(x + 16, 5, 9);
    let b = atomic_cas(x + 17, 5, 9);
    store(x + 18, a * 100 + b);
    let g = atomic_xchg(f + offs, offs.to::<f32>() + 0.5);
    atomic_min(f + 8, g, g < 0.0);
}

#[test]
fn exchanges_and_compare_and_swap() {
    let rt = Runtime::interpreter();
    let mut x: Vec<i32> = (0..19).map(|i| 100 + i).collect();
    x[16] = 5;
    let mut f = vec![-3.0f32, 1.0, -7.5, 2.0, 0.0, -0.5, 4.0, 8.0, 0.0];
    swaps::launch(&rt, LaunchConfig::grid(1), &mut x, &mut f).unwrap();
    assert_eq!(&x[..8], &[0, 2, 4, 6, 8, 10, 12, 14]);
    assert_eq!(&x[8..16], &[100, 101, 102, 103, 104, 105, 106, 107]);
    assert_eq!((x[16], x[17]), (9, 117));
    assert_eq!(x[18], 5 * 100 + 117);
    assert_eq!(f[..8], [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5]);
    assert_eq!(f[8], -7.5);
}

/// Triton's idiom: advance a block of pointers inside the loop.
#[kernel]
pub(crate) fn strided_sum<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange::<BLOCK>();
    let mut p = x + offs;
    let mut acc = zeros::<f32>([BLOCK]);
    for i in (0..n).step_by(BLOCK as i32) {
        acc = acc + load(p, i + offs < n, 0.0);
        p = p + BLOCK;
    }
    store(out, acc.sum());
}

#[test]
fn loop_carried_pointers() {
    let rt = Runtime::interpreter();
    let n = 1000;
    let x = random_f32(n, seed());
    let mut out = vec![f32::NAN];
    strided_sum::<128>::launch(&rt, LaunchConfig::grid(1), &x, &mut out, n as i32).unwrap();
    let want: f64 = x.iter().map(|&v| v as f64).sum();
    assert!((out[0] as f64 - want).abs() < 1e-3, "{} vs {want}", out[0]);
    // A mask that lets the last iteration read past the end is caught.
    let err = strided_sum::<128>::launch(&rt, LaunchConfig::grid(1), &x[..900], &mut out, n as i32).unwrap_err().to_string();
    assert!(err.contains("x[900]"), "{err}");
}

/// Two reductions across warps per iteration of a loop over rows: the barriers between
/// iterations (`lower::smem`) keep one iteration's scratch writes from racing the last
/// one's reads (`gpu.rs` runs it with 4 and 8 warps).
#[kernel]
pub(crate) fn warp_sum_loop(x: Ptr<f32>, maxes: Ptr<f32>, sums: Ptr<f32>, rows: i32) {
    let offs = arange::<1024>();
    for r in 0..rows {
        let v = load(x + r * 1024 + offs);
        let m = v.max();
        store(maxes + r, m);
        store(sums + r, (v - m).sum());
    }
}

#[test]
fn reductions_in_a_loop() {
    let rt = Runtime::interpreter();
    let rows = 5;
    let x = random_f32(rows * 1024, seed());
    let (mut m, mut s) = (vec![f32::NAN; rows], vec![f32::NAN; rows]);
    warp_sum_loop::launch(&rt, LaunchConfig::grid(1), &x, &mut m, &mut s, rows as i32).unwrap();
    for r in 0..rows {
        let row = &x[r * 1024..][..1024];
        let want_m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let want_s: f64 = row.iter().map(|&v| (v - want_m) as f64).sum();
        assert_eq!(m[r], want_m);
        // 1024 f32 terms: bounded by 1024 ulps of the sum of magnitudes.
        let mag: f64 = row.iter().map(|&v| ((v - want_m) as f64).abs()).sum();
        assert!((s[r] as f64 - want_s).abs() <= 1024.0 * f32::EPSILON as f64 * mag, "row {r}: {} vs {want_s}", s[r]);
    }
}

/// Rank-3 blocks: a 4 x 8 x 16 row-major cube, summed along its middle axis, scanned
/// along its last, and written back permuted to 16 x 4 x 8.
#[kernel]
pub(crate) fn cube(x: Ptr<f32>, sums: Ptr<f32>, scans: Ptr<f32>, moved: Ptr<f32>) {
    let i = arange::<4>().expand_dims(1).expand_dims(2);
    let j = arange::<8>().expand_dims(0).expand_dims(2);
    let k = arange::<16>().expand_dims(0).expand_dims(1);
    let offs = i * 128 + j * 16 + k;
    let v = load(x + offs);
    store(sums + arange::<4>().col() * 16 + arange::<16>().row(), v.sum(1));
    store(scans + offs, v.cumsum(2));
    let kk = arange::<16>().expand_dims(1).expand_dims(2);
    let ii = arange::<4>().expand_dims(0).expand_dims(2);
    let jj = arange::<8>().expand_dims(0).expand_dims(1);
    store(moved + kk * 32 + ii * 8 + jj, v.permute([2, 0, 1]));
}

/// What `cube` computes, in f64: sums (4 x 16), scans (4 x 8 x 16), moved (16 x 4 x 8).
pub(crate) fn cube_ref(x: &[f32]) -> [Vec<f64>; 3] {
    let at = |i: usize, j: usize, k: usize| x[i * 128 + j * 16 + k] as f64;
    let sums = (0..64).map(|n| (0..8).map(|j| at(n / 16, j, n % 16)).sum()).collect();
    let scans = (0..512).map(|n| (0..=n % 16).map(|k| at(n / 128, n / 16 % 8, k)).sum()).collect();
    let moved = (0..512).map(|n| at(n / 8 % 4, n % 8, n / 32)).collect();
    [sums, scans, moved]
}

#[test]
fn rank_3_blocks() {
    let rt = Runtime::interpreter();
    let s = seed();
    let x = random_f32(512, s);
    let (mut sums, mut scans, mut moved) = (vec![f32::NAN; 64], vec![f32::NAN; 512], vec![f32::NAN; 512]);
    cube::launch(&rt, LaunchConfig::grid(1), &x, &mut sums, &mut scans, &mut moved).unwrap();
    let [rs, rc, rm] = cube_ref(&x);
    assert!(rel_l2(&as_f64(&sums), &rs) < 1e-6, "seed {s}");
    assert!(rel_l2(&as_f64(&scans), &rc) < 1e-6, "seed {s}");
    assert_eq!(as_f64(&moved), rm, "seed {s}");
}
