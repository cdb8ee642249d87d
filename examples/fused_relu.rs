//! The graph fuser's seed, `y = relu(x) + relu(x) * 2`, written as a graph of tensor
//! operations: the fusion pass's groups, the generated kernel's block IR, and a run
//! checked against a plain CPU computation; then the same with fusion off.
//!
//! Runs on CUDA device 0 when there is one, on the CPU interpreter otherwise (or when
//! `RUTILE_INTERPRET=1`), and says which. On the GPU it also times both plans.
//!
//! ```text
//! cargo run --release -p examples --example fused_relu [-- N]
//! ```

use dsl_runtime::{DType, Runtime};
use kernels_lib::graph::{Graph, Options, TensorMut};
use rand::{Rng, SeedableRng};


fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let rt = examples::runtime();
    let default_n = if rt.is_gpu() { 1 << 26 } else { (1 << 20) + 3 };
    let n: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(default_n);

    // The graph, as the math is written. `x.relu()` twice is one node.
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[n]);
    g.output("y", x.relu() + x.relu() * 2.0)?;

    let mut fused = g.compile(&rt)?;
    let mut unfused = g.compile_with(&rt, &Options::unfused())?;
    println!("\nfused: {} kernel(s)\n{}", fused.kernel_count(), fused.partition());
    println!("the kernel's block IR:\n{}", fused.ir(0)?);
    println!("unfused: {} kernels\n{}", unfused.kernel_count(), unfused.partition());

    let seed = examples::seed()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let host: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let dx = rt.upload(&host)?;
    for (name, plan) in [("fused", &mut fused), ("unfused", &mut unfused)] {
        let mut y = rt.upload(&vec![f32::NAN; n])?; // poisoned: every element must be written
        plan.run(&rt, &[(&dx).into()], &mut [TensorMut::from(&mut y)])?;
        let got = y.to_vec()?;
        let bad = (0..n).filter(|&i| got[i] != host[i].max(0.0) + host[i].max(0.0) * 2.0).count();
        if bad > 0 {
            return Err(format!("{name}: {bad} of {n} elements differ from the CPU result (seed {seed})").into());
        }
        println!("{name:>7}: all {n} elements match the CPU result exactly");
        if let Runtime::Cuda(cuda) = &rt {
            let ms = examples::time_ms(cuda, || plan.run(&rt, &[(&dx).into()], &mut [TensorMut::from(&mut y)]))?;
            println!("{name:>7}: {ms:.3} ms median, {:.0} GB/s of the 2 arrays the math needs", (2 * n * 4) as f64 / (ms * 1e-3) / 1e9);
        }
    }
    Ok(())
}
