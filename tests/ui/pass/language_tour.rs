//! Compiles and runs on the interpreter: the surface syntax of the language.
use dsl_runtime::prelude::*;

#[kernel]
fn tour<const BLOCK: usize, const RELU: bool>(x: Ptr<f32>, y: Ptr<bf16>, out: Ptr<f32>, idx: Ptr<i64>, n: i32, scale: f32) {
    let pid = program_id(0);
    let offs = pid * BLOCK + arange(0, BLOCK as i64);
    let mask = offs.lt(n) & !(offs < 0);
    let mut v = load(x + offs, mask, 0.0);
    let w = load(y + offs, mask, 0.0).to::<f32>();
    v += w * scale;
    v = if RELU { maximum(v, 0.0) } else { v };
    if BLOCK >= 64 && !RELU {
        v = v - 0.0;
    }
    let e = v.exp() - exp2(v) + log(abs(v) + 1.0) + sqrt(abs(v)) * rsqrt(abs(v) + 1.0);
    let t = sin(v) + v.cos() + tanh(v) + sigmoid(v) - minimum(e, e);
    let picked = select(offs % 2 == 0, v, t - t + v);
    store(out + offs, picked, mask);
    store(idx + offs, (offs as i64) * num_programs(0), mask);
}

/// 2-D blocks, reductions, runtime loops and branches, atomics and debug checks.
#[kernel]
fn tour_2d<const M: usize, const N: usize>(x: Ptr<f32>, out: Ptr<f32>, hits: Ptr<i32>, rows: i32, cols: i32) {
    let r = program_id(0) * M + arange::<M>();
    let c = arange::<N>();
    let mut acc = zeros::<f32>([M]);
    for c0 in (0..cols).step_by(N as i32) {
        let m = r.col().lt(rows) & (c0 + c).row().lt(cols);
        let tile = load(x + r.col() * cols + c0 + c.row(), m, 0.0);
        acc = acc + tile.sum(1);
    }
    for k in 0..2 {
        acc = acc * 1.0 + (k as f32) * 0.0; // unrolled: compile-time range
    }
    let best = if rows > 0 { acc.max() } else { 0.0 };
    device_assert(acc <= best, "the maximum bounds every row");
    atomic_add(hits, 1, r < rows);
    store(out + r, acc - best + best, r < rows);
    if cols == 0 {
        return;
    }
    let t = trans(broadcast_to(acc.col(), [M, 2]));
    store(out + rows + arange::<2>().col() * M + arange::<M>().row(), t, arange::<M>().row() < rows);
}

fn main() {
    // tour_2d: rows of 1..=cols, 2-D tiles, a loop over the columns.
    let rt = Runtime::interpreter();
    let (rows, cols) = (5usize, 7usize);
    let x: Vec<f32> = (0..rows * cols).map(|i| (i % cols) as f32 + 1.0).collect();
    let mut out = vec![f32::NAN; rows + 2 * 8];
    let mut hits = vec![0i32];
    tour_2d::<8, 4>::launch(&rt, LaunchConfig::grid(1).debug(true), &x, &mut out, &mut hits, rows as i32, cols as i32).unwrap();
    assert_eq!(&out[..rows], &[28.0; 5]);
    assert_eq!(hits[0], 5);
    assert_eq!(out[rows + 8 + 2], 28.0);

    let rt = Runtime::interpreter();
    let n = 100usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 - 50.0).collect();
    let y = vec![bf16::from_f32(0.5); n];
    let mut out = vec![f32::NAN; n];
    let mut idx = vec![-1i64; n];
    tour::<64, true>::launch(&rt, LaunchConfig::grid(2), &x, &y, &mut out, &mut idx, n as i32, 2.0).unwrap();
    for i in 0..n {
        assert_eq!(out[i], (x[i] + 1.0).max(0.0), "i={i}");
        assert_eq!(idx[i], 2 * i as i64);
    }
}
