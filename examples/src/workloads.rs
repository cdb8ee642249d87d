//! The benchmark suite: each [`Workload`] owns its inputs and output on a [`Runtime`],
//! launches one library kernel, and checks its output against a float64 CPU reference.

use dsl_runtime::prelude::*;
use dsl_runtime::Result;
use half::bf16;
use kernels_lib::*;
use rand::{Rng, SeedableRng};

/// One benchmark row.
pub trait Workload {
    /// Kernel name, as the anchors name the same work.
    fn name(&self) -> &'static str;
    fn dtype(&self) -> &'static str;
    /// Elements per array.
    fn elements(&self) -> usize;
    /// Bytes one launch must move at least (each input read once, each output written once).
    fn bytes(&self) -> usize;
    fn launch(&mut self, rt: &Runtime) -> Result<()>;
    /// Relative L2 error of the output against a float64 reference, after one launch on
    /// freshly written inputs (call before timing).
    fn check(&mut self, rt: &Runtime) -> Result<f64>;
    /// The largest acceptable [`check`](Workload::check) error.
    fn tolerance(&self) -> f64;
}

fn randoms(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.random_range(-4.0f32..4.0)).collect()
}

fn bf(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

fn rel_l2(out: impl Iterator<Item = f64>, reference: impl Iterator<Item = f64>) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (o, r) in out.zip(reference) {
        num += (o - r) * (o - r);
        den += r * r;
        if o.is_nan() {
            return f64::INFINITY;
        }
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

struct ReluMulAdd {
    host: [Vec<f32>; 3],
    a: Buffer<f32>,
    b: Buffer<f32>,
    c: Buffer<f32>,
    out: Buffer<f32>,
}

impl Workload for ReluMulAdd {
    fn name(&self) -> &'static str {
        "relu_mul_add"
    }
    fn dtype(&self) -> &'static str {
        "f32"
    }
    fn elements(&self) -> usize {
        self.host[0].len()
    }
    fn bytes(&self) -> usize {
        16 * self.elements()
    }
    fn launch(&mut self, rt: &Runtime) -> Result<()> {
        let n = self.elements();
        relu_mul_add::<1024>::launch(rt, grid_for(n, 1024), &self.a, &self.b, &self.c, &mut self.out, n as i32)
    }
    fn check(&mut self, rt: &Runtime) -> Result<f64> {
        self.out.copy_from(&vec![f32::NAN; self.elements()])?;
        self.launch(rt)?;
        let [a, b, c] = &self.host;
        let r = (0..self.elements()).map(|i| (a[i] as f64).max(0.0) * b[i] as f64 + c[i] as f64);
        Ok(rel_l2(self.out.to_vec()?.into_iter().map(f64::from), r))
    }
    fn tolerance(&self) -> f64 {
        1e-6
    }
}

struct ReluMulAddBf16 {
    host: [Vec<bf16>; 3],
    a: Buffer<bf16>,
    b: Buffer<bf16>,
    c: Buffer<bf16>,
    out: Buffer<bf16>,
}

impl Workload for ReluMulAddBf16 {
    fn name(&self) -> &'static str {
        "relu_mul_add"
    }
    fn dtype(&self) -> &'static str {
        "bf16"
    }
    fn elements(&self) -> usize {
        self.host[0].len()
    }
    fn bytes(&self) -> usize {
        8 * self.elements()
    }
    fn launch(&mut self, rt: &Runtime) -> Result<()> {
        let n = self.elements();
        relu_mul_add_bf16::<2048>::launch(rt, grid_for(n, 2048), &self.a, &self.b, &self.c, &mut self.out, n as i32)
    }
    fn check(&mut self, rt: &Runtime) -> Result<f64> {
        self.out.copy_from(&vec![bf16::NAN; self.elements()])?;
        self.launch(rt)?;
        let [a, b, c] = &self.host;
        let r = (0..self.elements()).map(|i| a[i].to_f64().max(0.0) * b[i].to_f64() + c[i].to_f64());
        Ok(rel_l2(self.out.to_vec()?.into_iter().map(|v| v.to_f64()), r))
    }
    fn tolerance(&self) -> f64 {
        1e-2
    }
}

struct Axpy {
    x_host: Vec<f32>,
    y_host: Vec<f32>,
    x: Buffer<f32>,
    y: Buffer<f32>,
}

impl Workload for Axpy {
    fn name(&self) -> &'static str {
        "axpy"
    }
    fn dtype(&self) -> &'static str {
        "f32"
    }
    fn elements(&self) -> usize {
        self.x_host.len()
    }
    fn bytes(&self) -> usize {
        12 * self.elements()
    }
    fn launch(&mut self, rt: &Runtime) -> Result<()> {
        let n = self.elements();
        axpy::<1024>::launch(rt, grid_for(n, 1024), 0.75, &self.x, &mut self.y, n as i64)
    }
    fn check(&mut self, rt: &Runtime) -> Result<f64> {
        self.y.copy_from(&self.y_host)?;
        self.launch(rt)?;
        let r = self.x_host.iter().zip(&self.y_host).map(|(&x, &y)| 0.75 * x as f64 + y as f64);
        Ok(rel_l2(self.y.to_vec()?.into_iter().map(f64::from), r))
    }
    fn tolerance(&self) -> f64 {
        1e-6
    }
}

struct Gelu {
    host: Vec<f32>,
    x: Buffer<f32>,
    out: Buffer<f32>,
}

impl Workload for Gelu {
    fn name(&self) -> &'static str {
        "gelu_tanh"
    }
    fn dtype(&self) -> &'static str {
        "f32"
    }
    fn elements(&self) -> usize {
        self.host.len()
    }
    fn bytes(&self) -> usize {
        8 * self.elements()
    }
    fn launch(&mut self, rt: &Runtime) -> Result<()> {
        let n = self.elements();
        gelu_tanh::<1024>::launch(rt, grid_for(n, 1024), &self.x, &mut self.out, n as i32)
    }
    fn check(&mut self, rt: &Runtime) -> Result<f64> {
        self.out.copy_from(&vec![f32::NAN; self.elements()])?;
        self.launch(rt)?;
        let r = self.host.iter().map(|&v| {
            let v = v as f64;
            0.5 * v * (1.0 + (0.7978845608 * (v + 0.044715 * v * v * v)).tanh())
        });
        Ok(rel_l2(self.out.to_vec()?.into_iter().map(f64::from), r))
    }
    fn tolerance(&self) -> f64 {
        2e-3 // tanh.approx.f32 on the GPU
    }
}

struct SiluMul {
    host: [Vec<bf16>; 2],
    g: Buffer<bf16>,
    u: Buffer<bf16>,
    out: Buffer<bf16>,
}

impl Workload for SiluMul {
    fn name(&self) -> &'static str {
        "silu_mul"
    }
    fn dtype(&self) -> &'static str {
        "bf16"
    }
    fn elements(&self) -> usize {
        self.host[0].len()
    }
    fn bytes(&self) -> usize {
        6 * self.elements()
    }
    fn launch(&mut self, rt: &Runtime) -> Result<()> {
        let n = self.elements();
        silu_mul::<2048>::launch(rt, grid_for(n, 2048), &self.g, &self.u, &mut self.out, n as i32)
    }
    fn check(&mut self, rt: &Runtime) -> Result<f64> {
        self.out.copy_from(&vec![bf16::NAN; self.elements()])?;
        self.launch(rt)?;
        let [g, u] = &self.host;
        let r = g.iter().zip(u).map(|(g, u)| g.to_f64() / (1.0 + (-g.to_f64()).exp()) * u.to_f64());
        Ok(rel_l2(self.out.to_vec()?.into_iter().map(|v| v.to_f64()), r))
    }
    fn tolerance(&self) -> f64 {
        1e-2
    }
}

struct ToBf16 {
    host: Vec<f32>,
    x: Buffer<f32>,
    out: Buffer<bf16>,
}

impl Workload for ToBf16 {
    fn name(&self) -> &'static str {
        "f32_to_bf16"
    }
    fn dtype(&self) -> &'static str {
        "f32->bf16"
    }
    fn elements(&self) -> usize {
        self.host.len()
    }
    fn bytes(&self) -> usize {
        6 * self.elements()
    }
    fn launch(&mut self, rt: &Runtime) -> Result<()> {
        let n = self.elements();
        f32_to_bf16::<2048>::launch(rt, grid_for(n, 2048), &self.x, &mut self.out, n as i32)
    }
    fn check(&mut self, rt: &Runtime) -> Result<f64> {
        self.out.copy_from(&vec![bf16::NAN; self.elements()])?;
        self.launch(rt)?;
        let r = self.host.iter().map(|&v| bf16::from_f32(v).to_f64()); // exact rounding expected
        Ok(rel_l2(self.out.to_vec()?.into_iter().map(|v| v.to_f64()), r))
    }
    fn tolerance(&self) -> f64 {
        0.0
    }
}

/// Every workload at `n` elements per array, with fresh random inputs from `seed`.
pub fn suite(rt: &Runtime, n: usize, seed: u64) -> Result<Vec<Box<dyn Workload>>> {
    let f = |k: u64| randoms(n, seed + k);
    let (a, b, c) = (f(0), f(1), f(2));
    let (ha, hb, hc) = (bf(&a), bf(&b), bf(&c));
    Ok(vec![
        Box::new(ReluMulAdd { a: rt.upload(&a)?, b: rt.upload(&b)?, c: rt.upload(&c)?, out: rt.zeros(n)?, host: [a.clone(), b.clone(), c.clone()] }),
        Box::new(ReluMulAddBf16 { a: rt.upload(&ha)?, b: rt.upload(&hb)?, c: rt.upload(&hc)?, out: rt.zeros(n)?, host: [ha.clone(), hb.clone(), hc] }),
        Box::new(Axpy { x: rt.upload(&a)?, y: rt.upload(&b)?, x_host: a.clone(), y_host: b }),
        Box::new(Gelu { x: rt.upload(&c)?, out: rt.zeros(n)?, host: c }),
        Box::new(SiluMul { g: rt.upload(&ha)?, u: rt.upload(&hb)?, out: rt.zeros(n)?, host: [ha, hb] }),
        Box::new(ToBf16 { x: rt.upload(&a)?, out: rt.zeros(n)?, host: a }),
    ])
}
