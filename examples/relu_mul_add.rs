//! The fused relu-mul-add, `out = max(a, 0) * b + c`, end to end: the hand-written kernel
//! (`kernels_lib::relu_mul_add`), and the same math written as a graph and compiled by the
//! fuser (`a.relu() * b + c`: one generated kernel).
//!
//! Runs on CUDA device 0 when there is one, on the CPU interpreter otherwise (or when
//! `RUTILE_INTERPRET=1`), says which, checks every output element against a plain CPU
//! computation, and on the GPU reports time and bandwidth for f32 and bf16.
//!
//! ```text
//! cargo run --release -p examples --example relu_mul_add [-- N]
//! ```

use dsl_runtime::prelude::*;
use dsl_runtime::{DType, Runtime};
use kernels_lib::graph::{Graph, TensorMut};
use kernels_lib::{grid_for, relu_mul_add};
use rand::{Rng, SeedableRng};
use std::time::Instant;

const BLOCK: usize = 1024;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let rt = examples::runtime();
    let default_n = if rt.is_gpu() { 1 << 26 } else { 1 << 20 };
    let n: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(default_n);
    let seed = examples::seed()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let a: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let c: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();

    // f32
    let (da, db, dc) = (rt.upload(&a)?, rt.upload(&b)?, rt.upload(&c)?);
    let mut out = rt.upload(&vec![f32::NAN; n])?; // poisoned: every element must be written
    let t0 = Instant::now();
    relu_mul_add::<f32, BLOCK>::launch(&rt, grid_for(n, BLOCK), &da, &db, &dc, &mut out, n as i32)?;
    rt.synchronize()?;
    println!("f32 : n = {n}, first launch (compile + run) {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    let got = out.to_vec()?;
    let bad = (0..n).filter(|&i| got[i] != a[i].max(0.0) * b[i] + c[i]).count();
    if bad > 0 {
        return Err(format!("f32: {bad} of {n} elements differ from the CPU result (seed {seed})").into());
    }
    println!("f32 : all {n} elements match the CPU result exactly");
    if let Runtime::Cuda(cuda) = &rt {
        let ms = examples::time_ms(cuda, || relu_mul_add::<f32, BLOCK>::launch(&rt, grid_for(n, BLOCK), &da, &db, &dc, &mut out, n as i32))?;
        let gbs = (4 * n * 4) as f64 / (ms * 1e-3) / 1e9;
        println!("f32 : {ms:.3} ms median, {gbs:.0} GB/s (4 arrays of {n} f32)");
    }

    // The same, written as a graph: the fuser generates the kernel.
    let g = Graph::new();
    let (ga, gb, gc) = (g.input("a", DType::F32, &[n]), g.input("b", DType::F32, &[n]), g.input("c", DType::F32, &[n]));
    g.output("out", ga.relu() * gb + gc)?;
    let mut plan = g.compile(&rt)?;
    let mut gout = rt.upload(&vec![f32::NAN; n])?;
    plan.run(&rt, &[(&da).into(), (&db).into(), (&dc).into()], &mut [TensorMut::from(&mut gout)])?;
    let got = gout.to_vec()?;
    let bad = (0..n).filter(|&i| got[i] != a[i].max(0.0) * b[i] + c[i]).count();
    if bad > 0 {
        return Err(format!("f32 graph: {bad} of {n} elements differ from the CPU result (seed {seed})").into());
    }
    println!("f32 : as a graph (`a.relu() * b + c`), {} generated kernel: all {n} elements match the CPU result exactly", plan.kernel_count());
    if let Runtime::Cuda(cuda) = &rt {
        let ms = examples::time_ms(cuda, || plan.run(&rt, &[(&da).into(), (&db).into(), (&dc).into()], &mut [TensorMut::from(&mut gout)]))?;
        let gbs = (4 * n * 4) as f64 / (ms * 1e-3) / 1e9;
        println!("f32 : as a graph, {ms:.3} ms median, {gbs:.0} GB/s");
    }

    // bf16
    let h = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let (ha, hb, hc) = (h(&a), h(&b), h(&c));
    let (da, db, dc) = (rt.upload(&ha)?, rt.upload(&hb)?, rt.upload(&hc)?);
    let mut out = rt.upload(&vec![bf16::NAN; n])?;
    relu_mul_add::<bf16, 2048>::launch(&rt, grid_for(n, 2048), &da, &db, &dc, &mut out, n as i32)?;
    let got = out.to_vec()?;
    let r = |x: f32| bf16::from_f32(x).to_f32();
    let bad = (0..n).filter(|&i| got[i].to_f32() != r(r(ha[i].to_f32().max(0.0) * hb[i].to_f32()) + hc[i].to_f32())).count();
    if bad > 0 {
        return Err(format!("bf16: {bad} of {n} elements differ from the CPU result (seed {seed})").into());
    }
    println!("bf16: all {n} elements match the CPU result exactly");
    if let Runtime::Cuda(cuda) = &rt {
        let ms = examples::time_ms(cuda, || relu_mul_add::<bf16, 2048>::launch(&rt, grid_for(n, 2048), &da, &db, &dc, &mut out, n as i32))?;
        let gbs = (4 * n * 2) as f64 / (ms * 1e-3) / 1e9;
        println!("bf16: {ms:.3} ms median, {gbs:.0} GB/s (4 arrays of {n} bf16)");
    }
    Ok(())
}
