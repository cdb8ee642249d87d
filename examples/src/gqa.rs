//! The attention block of the mission's seed, forward (`examples/gqa_attention.rs` runs
//! it): `x[B, T, d]` → `q = x Wq` (H heads), `k = x Wk`, `v = x Wv` (KV heads),
//! grouped-query flash attention, `y = o Wo`, with the library's `matmul` and `attention`
//! in bf16 (f32 accumulation). The check: an f64 reference with the kernels' rounding
//! points (q, k, v, the probabilities and o rounded to bf16), every element within
//! 4 * 2^-8 of the size of the terms it adds up.

use dsl_runtime::prelude::*;
use half::bf16;
use kernels_lib::flash_attention::{attention_forward, Layout, Shape};
use kernels_lib::matmul;

/// `[rows, n] = [rows, k] @ [k, n]`, row-major, in f64.
fn mm(a: &[f64], b: &[f64], rows: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; rows * n];
    for i in 0..rows {
        for p in 0..k {
            let x = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += x * b[p * n + j];
            }
        }
    }
    c
}

fn round(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| bf16::from_f64(x).to_f64()).collect()
}

/// The seed's shape (B, T, d_model, H, KV, head dim), and a small one for the interpreter.
pub const SEED: (usize, usize, usize, usize, usize, usize) = (4, 1024, 512, 8, 4, 64);
pub const SMALL: (usize, usize, usize, usize, usize, usize) = (1, 80, 64, 4, 2, 16);

/// Run the block forward on `rt` at `shape` (head dim 16, 32, 64 or 128), check it (sampled rows at
/// the seed's size, every row otherwise), print what was checked, and on a GPU time it.
/// Returns the largest error found, relative to the size of the terms.
pub fn run(rt: &Runtime, shape: (usize, usize, usize, usize, usize, usize)) -> Result<f64, Box<dyn std::error::Error>> {
    let gpu = rt.is_gpu();
    let (b, t, dm, h, kv, hd) = shape;
    println!("x [{b}, {t}, {dm}], {h} query heads, {kv} key/value heads, head dim {hd}, bf16");
    let rows = b * t;
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    let mut r = seed | 1;
    let mut rand = |n: usize, s: f32| -> Vec<bf16> {
        (0..n)
            .map(|_| {
                r ^= r << 13;
                r ^= r >> 7;
                r ^= r << 17;
                bf16::from_f32(((r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * s)
            })
            .collect()
    };
    let w = 1.0 / (dm as f32).sqrt();
    let (x, wq, wk, wv, wo) = (rand(rows * dm, 1.0), rand(dm * h * hd, w), rand(dm * kv * hd, w), rand(dm * kv * hd, w), rand(h * hd * dm, w));
    let up = |v: &Vec<bf16>| rt.upload(v);
    let (dx, dwq, dwk, dwv, dwo) = (up(&x)?, up(&wq)?, up(&wk)?, up(&wv)?, up(&wo)?);
    let (mut q, mut k, mut v) = (rt.zeros::<bf16>(rows * h * hd)?, rt.zeros::<bf16>(rows * kv * hd)?, rt.zeros::<bf16>(rows * kv * hd)?);
    let mut o = rt.zeros::<bf16>(rows * h * hd)?;
    let mut lse = rt.zeros::<f32>(b * h * t)?;
    let mut y = rt.upload(&vec![f32::NAN; rows * dm])?;
    let scale = 1.0 / (hd as f32).sqrt();
    let (ri, di) = (rows as i32, dm as i32);
    let forward = |q: &mut Buffer<bf16>, k: &mut Buffer<bf16>, v: &mut Buffer<bf16>, o: &mut Buffer<bf16>, lse: &mut Buffer<f32>, y: &mut Buffer<f32>| -> dsl_runtime::Result<()> {
        let proj = |n: usize| LaunchConfig::grid((rows.div_ceil(64) * n.div_ceil(64)) as u32).warps(4).stages(if gpu { 3 } else { 1 });
        let (nq, nk) = ((h * hd) as i32, (kv * hd) as i32);
        matmul::<bf16, bf16, 64, 64, 32, 8>::launch(rt, proj(h * hd), &dx, &dwq, &mut *q, ri, nq, di, di, 1, nq, 1, nq, 1)?;
        matmul::<bf16, bf16, 64, 64, 32, 8>::launch(rt, proj(kv * hd), &dx, &dwk, &mut *k, ri, nk, di, di, 1, nk, 1, nk, 1)?;
        matmul::<bf16, bf16, 64, 64, 32, 8>::launch(rt, proj(kv * hd), &dx, &dwv, &mut *v, ri, nk, di, di, 1, nk, 1, nk, 1)?;
        // q, k, v as the projections leave them: [B, T, heads, D].
        let shape = Shape { batch: b, seq: t, heads: h, kv_heads: kv, head_dim: hd, causal: false, layout: Layout::Bthd };
        attention_forward(rt, &shape, &*q, &*k, &*v, &mut *o, &mut *lse, scale)?;
        let hq = (h * hd) as i32;
        matmul::<bf16, f32, 64, 64, 32, 8>::launch(rt, proj(dm), &*o, &dwo, y, ri, di, hq, hq, 1, di, 1, di, 1)
    };
    forward(&mut q, &mut k, &mut v, &mut o, &mut lse, &mut y)?;

    // The reference, with the kernels' rounding points.
    let f = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let (x64, wo64) = (f(&x), f(&wo));
    let (rk, rv) = (round(&mm(&x64, &f(&wk), rows, dm, kv * hd)), round(&mm(&x64, &f(&wv), rows, dm, kv * hd)));
    let got = y.to_vec()?;
    let picks: Vec<usize> = if rows > 256 { (0..64).map(|i| (i * 7919 + 13) % rows).chain([rows - 1]).collect() } else { (0..rows).collect() };
    let (mut worst, mut checked) = (0.0f64, 0);
    for &row in &picks {
        let bi = row / t;
        let qrow = round(&mm(&x64[row * dm..(row + 1) * dm], &f(&wq), 1, dm, h * hd));
        let (mut orow, mut oscale) = (vec![0.0; h * hd], vec![0.0; h * hd]);
        for hh in 0..h {
            let hk = hh / (h / kv);
            let s: Vec<f64> = (0..t)
                .map(|j| {
                    let kr = (bi * t + j) * kv * hd + hk * hd;
                    (0..hd).map(|d| qrow[hh * hd + d] * rk[kr + d]).sum::<f64>() * scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for (j, sj) in s.iter().enumerate() {
                let p = (sj - m).exp() / l;
                let vr = (bi * t + j) * kv * hd + hk * hd;
                for d in 0..hd {
                    orow[hh * hd + d] += p * rv[vr + d];
                    oscale[hh * hd + d] += p * rv[vr + d].abs();
                }
            }
        }
        let orow = round(&orow);
        for c in 0..dm {
            let (mut want, mut terms) = (0.0, 0.0);
            for j in 0..h * hd {
                want += orow[j] * wo64[j * dm + c];
                terms += (oscale[j] + orow[j].abs()) * wo64[j * dm + c].abs();
            }
            let e = (got[row * dm + c] as f64 - want).abs() / terms.max(f64::MIN_POSITIVE);
            worst = worst.max(e);
            checked += 1;
        }
    }
    let bound = 4.0 / 256.0;
    println!("checked {checked} outputs of {} rows against the f64 reference: largest error {worst:.2e} of the terms' size (bound {bound:.2e})", picks.len());
    if worst.is_nan() || worst > bound {
        return Err(format!("the block's output is off by {worst:e} of its terms' size (seed {seed})").into());
    }
    if let Runtime::Cuda(cuda) = rt {
        let ms = crate::time_ms(cuda, || forward(&mut q, &mut k, &mut v, &mut o, &mut lse, &mut y))?;
        let flops = 2.0 * rows as f64 * dm as f64 * (h + 2 * kv) as f64 * hd as f64 + 4.0 * (b * h) as f64 * (t * t) as f64 * hd as f64 + 2.0 * rows as f64 * (h * hd) as f64 * dm as f64;
        println!("forward: {ms:.3} ms (median of 50, CUDA events), {:.1} TFLOP/s", flops / ms / 1e9);
    }
    Ok(worst)
}
