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

fn main() {
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
