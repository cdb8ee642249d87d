//! The benchmark suite: each [`Workload`] owns its inputs and output on a [`Runtime`],
//! launches one library kernel, and checks its output against a float64 CPU reference.

use dsl_runtime::prelude::*;
use dsl_runtime::Result;
use half::{bf16, f16};
use kernels_lib::*;
use rand::{Rng, SeedableRng};

/// One benchmark row.
pub struct Workload {
    /// Kernel name, as the anchors name the same work.
    pub name: &'static str,
    pub dtype: &'static str,
    /// Elements per array.
    pub elements: usize,
    /// Bytes one launch must move at least (each input read once, each output written once).
    pub bytes: usize,
    /// The largest acceptable [`check`](Workload::check) error.
    pub tolerance: f64,
    ops: Box<dyn Ops>,
}

/// What differs between workloads: the launch and the check.
trait Ops {
    fn launch(&mut self, rt: &Runtime) -> Result<()>;
    /// Output after one launch on freshly written inputs, its float64 reference, and the
    /// magnitude of the terms each reference element adds up (see [`rel_l2_scaled`]).
    fn run_once(&mut self, rt: &Runtime) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)>;
}

impl Workload {
    pub fn launch(&mut self, rt: &Runtime) -> Result<()> {
        self.ops.launch(rt)
    }
    /// Relative L2 error of the output against the float64 reference after one launch on
    /// a NaN-poisoned output (call before timing), relative to the size of the terms
    /// ([`rel_l2_scaled`]). NaN anywhere gives infinity.
    pub fn check(&mut self, rt: &Runtime) -> Result<f64> {
        let (out, reference, scale) = self.ops.run_once(rt)?;
        Ok(rel_l2_scaled(&out, &reference, &scale))
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
fn single_terms(out: Vec<f64>, reference: Vec<f64>) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let scale = reference.iter().map(|v| v.abs()).collect();
    Ok((out, reference, scale))
}

fn randoms(n: usize, seed: u64) -> Vec<f32> {
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
            fn run_once(&mut self, $rt: &Runtime) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
                let $s = self;
                $check
            }
        }
    };
}

ops!(ReluMulAdd { h: [Vec<f32>; 3], a: Buffer<f32>, b: Buffer<f32>, c: Buffer<f32>, out: Buffer<f32> }, |s, rt| launch {
    let n = s.out.len();
    relu_mul_add::<1024>::launch(rt, grid_for(n, 1024), &s.a, &s.b, &s.c, &mut s.out, n as i32)
}, check {
    poison(&mut s.out)?;
    s.launch(rt)?;
    let [a, b, c] = &s.h;
    let terms: Vec<(f64, f64)> = (0..a.len()).map(|i| ((a[i] as f64).max(0.0) * b[i] as f64, c[i] as f64)).collect();
    Ok((f64s(&s.out)?, terms.iter().map(|(p, c)| p + c).collect(), terms.iter().map(|(p, c)| p.abs() + c.abs()).collect()))
});

ops!(ReluMulAddBf16 { h: [Vec<bf16>; 3], a: Buffer<bf16>, b: Buffer<bf16>, c: Buffer<bf16>, out: Buffer<bf16> }, |s, rt| launch {
    let n = s.out.len();
    relu_mul_add_bf16::<2048>::launch(rt, grid_for(n, 2048), &s.a, &s.b, &s.c, &mut s.out, n as i32)
}, check {
    poison(&mut s.out)?;
    s.launch(rt)?;
    let [a, b, c] = &s.h;
    let terms: Vec<(f64, f64)> = (0..a.len()).map(|i| (a[i].to_f64().max(0.0) * b[i].to_f64(), c[i].to_f64())).collect();
    Ok((f64s(&s.out)?, terms.iter().map(|(p, c)| p + c).collect(), terms.iter().map(|(p, c)| p.abs() + c.abs()).collect()))
});

ops!(Axpy { x_h: Vec<f32>, y_h: Vec<f32>, x: Buffer<f32>, y: Buffer<f32> }, |s, rt| launch {
    let n = s.y.len();
    axpy::<1024>::launch(rt, grid_for(n, 1024), 0.75, &s.x, &mut s.y, n as i64)
}, check {
    s.y.copy_from(&s.y_h)?;
    s.launch(rt)?;
    let r = s.x_h.iter().zip(&s.y_h).map(|(&x, &y)| 0.75 * x as f64 + y as f64).collect();
    let scale = s.x_h.iter().zip(&s.y_h).map(|(&x, &y)| (0.75 * x as f64).abs() + (y as f64).abs()).collect();
    Ok((f64s(&s.y)?, r, scale))
});

ops!(ScaleShift { h: Vec<f16>, x: Buffer<f16>, out: Buffer<f16> }, |s, rt| launch {
    let n = s.out.len();
    scale_shift::<2048>::launch(rt, grid_for(n, 2048), &s.x, &mut s.out, 0.5, -1.25, n as i32)
}, check {
    poison(&mut s.out)?;
    s.launch(rt)?;
    let r = s.h.iter().map(|v| v.to_f64() * 0.5 - 1.25).collect();
    let scale = s.h.iter().map(|v| (v.to_f64() * 0.5).abs() + 1.25).collect();
    Ok((f64s(&s.out)?, r, scale))
});

ops!(Gelu { h: Vec<f32>, x: Buffer<f32>, out: Buffer<f32> }, |s, rt| launch {
    let n = s.out.len();
    gelu_tanh::<1024>::launch(rt, grid_for(n, 1024), &s.x, &mut s.out, n as i32)
}, check {
    poison(&mut s.out)?;
    s.launch(rt)?;
    // 0.5 v + 0.5 v tanh(..): the terms cancel for negative v.
    let terms: Vec<(f64, f64)> = s.h.iter().map(|&v| {
        let v = v as f64;
        (0.5 * v, 0.5 * v * (0.7978845608 * (v + 0.044715 * v * v * v)).tanh())
    }).collect();
    Ok((f64s(&s.out)?, terms.iter().map(|(a, b)| a + b).collect(), terms.iter().map(|(a, b)| a.abs() + b.abs()).collect()))
});

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
    f32_to_bf16::<2048>::launch(rt, grid_for(n, 2048), &s.x, &mut s.out, n as i32)
}, check {
    poison(&mut s.out)?;
    s.launch(rt)?;
    let r = s.h.iter().map(|&v| bf16::from_f32(v).to_f64()).collect();
    single_terms(f64s(&s.out)?, r)
});

ops!(ToF32 { h: Vec<bf16>, x: Buffer<bf16>, out: Buffer<f32> }, |s, rt| launch {
    let n = s.out.len();
    bf16_to_f32::<2048>::launch(rt, grid_for(n, 2048), &s.x, &mut s.out, n as i32)
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

/// Every workload at `n` elements per array, with fresh random inputs from `seed`.
pub fn suite(rt: &Runtime, n: usize, seed: u64) -> Result<Vec<Workload>> {
    let f = |k: u64| randoms(n, seed + k);
    let (a, b, c) = (f(0), f(1), f(2));
    let (ha, hb, hc): (Vec<bf16>, Vec<bf16>, Vec<bf16>) = (to(&a), to(&b), to(&c));
    let w = |name, dtype, bytes_per_elem: usize, tolerance, ops: Box<dyn Ops>| Workload { name, dtype, elements: n, bytes: bytes_per_elem * n, tolerance, ops };
    let hh: Vec<f16> = to(&a);
    let xi: Vec<i32> = a.iter().map(|v| (v * 100.0) as i32).collect();
    Ok(vec![
        w("relu_mul_add", "f32", 16, 1e-6, Box::new(ReluMulAdd { a: rt.upload(&a)?, b: rt.upload(&b)?, c: rt.upload(&c)?, out: rt.zeros(n)?, h: [a.clone(), b.clone(), c.clone()] })),
        w("relu_mul_add", "bf16", 8, 1e-2, Box::new(ReluMulAddBf16 { a: rt.upload(&ha)?, b: rt.upload(&hb)?, c: rt.upload(&hc)?, out: rt.zeros(n)?, h: [ha.clone(), hb.clone(), hc] })),
        w("axpy", "f32", 12, 1e-6, Box::new(Axpy { x: rt.upload(&a)?, y: rt.upload(&b)?, x_h: a.clone(), y_h: b })),
        w("scale_shift", "f16", 4, 1e-3, Box::new(ScaleShift { x: rt.upload(&hh)?, out: rt.zeros(n)?, h: hh })),
        // tanh.approx.f32 on the GPU: about 2^-11 relative error.
        w("gelu_tanh", "f32", 8, 2e-3, Box::new(Gelu { x: rt.upload(&c)?, out: rt.zeros(n)?, h: c })),
        w("silu_mul", "bf16", 6, 1e-2, Box::new(SiluMul { g: rt.upload(&ha)?, u: rt.upload(&hb)?, out: rt.zeros(n)?, h: [ha.clone(), hb] })),
        w("f32_to_bf16", "f32->bf16", 6, 0.0, Box::new(ToBf16 { x: rt.upload(&a)?, out: rt.zeros(n)?, h: a })),
        w("bf16_to_f32", "bf16->f32", 6, 0.0, Box::new(ToF32 { x: rt.upload(&ha)?, out: rt.zeros(n)?, h: ha })),
        w("clamp_i32", "i32", 9, 0.0, Box::new(Clamp { x: rt.upload(&xi)?, out: rt.zeros(n)?, flags: rt.zeros(n)?, h: xi })),
    ])
}
