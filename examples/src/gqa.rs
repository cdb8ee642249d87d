//! The attention block of the mission's seed, forward and backward
//! (`examples/gqa_attention.rs` runs it): `x[B, T, d]` → `q = x Wq` (H heads), `k = x Wk`,
//! `v = x Wv` (KV heads), grouped-query flash attention, `y = o Wo`; then the gradients of
//! the loss `y.sum()`: `dWo = o^T dy`, `dO = dy Wo^T`, the attention backward (`dq`, `dk`,
//! `dv`, the key/value gradients summed over each group), `dWq = x^T dq` (likewise `dWk`,
//! `dWv`) and `dx = dq Wq^T + dk Wk^T + dv Wv^T`. Transposes are strides, never copies.
//!
//! In bf16 (f32 accumulation; the projections' outputs `q`, `k`, `v`, `o`, `dO` and the
//! attention gradients in bf16, `y`, the weight gradients and `dx` in f32) and in f32 (every
//! product on tensor cores at tf32 precision: inputs truncated to 10 mantissa bits, f32
//! accumulation; declared by the library's `dot` default for f32).
//!
//! The forward is also written as a graph, the seed's PyTorch spelling, and compiled by the
//! fuser (`kernels_lib::graph`): its attention is recognised and becomes one flash-attention
//! launch; the example prints the fuser's kernels and checks its output against the
//! library path's. The forward and its gradients (`Graph::grad`) as one graph through the
//! fuser are checked against the library path's gradients too, and timed on a GPU.
//!
//! Every launch's output is checked against an f64 reference computed from that launch's
//! own inputs (so each bound is the error one kernel can make, not a sum over the chain),
//! every element, relative to the size of the terms it adds up (the bounds are documented on the private `Checker`).

use crate::reference;
use crate::workloads::{matmul_bound, matmul_bound_tf32, Check};
use dsl_runtime::prelude::*;
use half::bf16;
use kernels_lib::flash_attention::{attention_backward, attention_forward, Grads, Layout, Shape};
use kernels_lib::graph::{Graph, Plan, Tensor, TensorMut, TensorRef};
use kernels_lib::{axpy, grid_for, matmul};

/// The seed's shape (B, T, d_model, H, KV, head dim), and a small one for the checks.
pub const SEED: (usize, usize, usize, usize, usize, usize) = (4, 1024, 512, 8, 4, 64);
pub const SMALL: (usize, usize, usize, usize, usize, usize) = (1, 80, 64, 4, 2, 16);

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The block's buffers: inputs, weights, activations and gradients, allocated once.
struct Block<T: Float> {
    dims: (usize, usize, usize, usize, usize, usize),
    x: Buffer<T>,
    wq: Buffer<T>,
    wk: Buffer<T>,
    wv: Buffer<T>,
    wo: Buffer<T>,
    q: Buffer<T>,
    k: Buffer<T>,
    v: Buffer<T>,
    o: Buffer<T>,
    lse: Buffer<f32>,
    y: Buffer<f32>,
    dy: Buffer<T>,
    dwo: Buffer<f32>,
    dout: Buffer<T>,
    dq: Buffer<T>,
    dk: Buffer<T>,
    dv: Buffer<T>,
    delta: Buffer<f32>,
    dwq: Buffer<f32>,
    dwk: Buffer<f32>,
    dwv: Buffer<f32>,
    dx: Buffer<f32>,
    dxk: Buffer<f32>,
    dxv: Buffer<f32>,
}

/// `c[m, n] = a[m, k] b[k, n]` with element strides `(row, column)` for each.
#[allow(clippy::too_many_arguments)]
fn mm<T: Float, O: Float>(rt: &Runtime, a: &Buffer<T>, sa: (usize, usize), b: &Buffer<T>, sb: (usize, usize), c: &mut Buffer<O>, (m, n, k): (usize, usize, usize)) -> dsl_runtime::Result<()> {
    // 16-bit operands are loaded three tiles ahead; f32 ones measured faster unpipelined.
    let stages = if rt.is_gpu() && T::DTYPE.size() == 2 { 3 } else { 1 };
    let cfg = LaunchConfig::grid((m.div_ceil(64) * n.div_ceil(64)) as u32).warps(4).stages(stages);
    let i = |x: usize| x as i32;
    matmul::<T, O, 64, 64, 32, 8>::launch(rt, cfg, a, b, c, i(m), i(n), i(k), i(sa.0), i(sa.1), i(sb.0), i(sb.1), i(n), 1)
}

impl<T: Float> Block<T> {
    fn new(rt: &Runtime, dims: (usize, usize, usize, usize, usize, usize), seed: u64) -> Res<Block<T>> {
        let (b, t, dm, h, kv, hd) = dims;
        let (rows, nq, nk) = (b * t, h * hd, kv * hd);
        // Uniform in [-s, s), rounded to T.
        let mut r = seed | 1;
        let mut rand = |n: usize, s: f64| -> Res<Buffer<T>> {
            let v: Vec<T> = (0..n)
                .map(|_| {
                    r ^= r << 13;
                    r ^= r >> 7;
                    r ^= r << 17;
                    T::from_f64(T::DTYPE.round(((r >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * s))
                })
                .collect();
            Ok(rt.upload(&v)?)
        };
        let w = 1.0 / (dm as f64).sqrt();
        let (x, wq, wk, wv, wo) = (rand(rows * dm, 1.0)?, rand(dm * nq, w)?, rand(dm * nk, w)?, rand(dm * nk, w)?, rand(nq * dm, w)?);
        let ones = vec![T::from_f64(1.0); rows * dm];
        let nan = |n: usize| rt.upload(&vec![f32::NAN; n]);
        let tnan = |n: usize| rt.upload(&vec![T::from_f64(f64::NAN); n]);
        Ok(Block {
            dims,
            x,
            wq,
            wk,
            wv,
            wo,
            q: tnan(rows * nq)?,
            k: tnan(rows * nk)?,
            v: tnan(rows * nk)?,
            o: tnan(rows * nq)?,
            lse: nan(b * h * t)?,
            y: nan(rows * dm)?,
            dy: rt.upload(&ones)?,
            dwo: nan(nq * dm)?,
            dout: tnan(rows * nq)?,
            dq: tnan(rows * nq)?,
            dk: tnan(rows * nk)?,
            dv: tnan(rows * nk)?,
            delta: nan(b * h * t)?,
            dwq: nan(dm * nq)?,
            dwk: nan(dm * nk)?,
            dwv: nan(dm * nk)?,
            dx: nan(rows * dm)?,
            dxk: nan(rows * dm)?,
            dxv: nan(rows * dm)?,
        })
    }

    fn shape(&self) -> Shape {
        let (b, t, _, h, kv, hd) = self.dims;
        // q, k, v as the projections leave them: [B, T, heads, D].
        Shape { batch: b, seq: t, heads: h, kv_heads: kv, head_dim: hd, causal: false, layout: Layout::Bthd }
    }

    fn scale(&self) -> f32 {
        1.0 / (self.dims.5 as f32).sqrt()
    }

    /// Bytes of device memory the block holds (allocated once; nothing is allocated
    /// while it runs).
    fn bytes(&self) -> usize {
        let t = [&self.x, &self.wq, &self.wk, &self.wv, &self.wo, &self.q, &self.k, &self.v, &self.o, &self.dy, &self.dout, &self.dq, &self.dk, &self.dv];
        let f = [&self.lse, &self.y, &self.dwo, &self.delta, &self.dwq, &self.dwk, &self.dwv, &self.dx, &self.dxk, &self.dxv];
        t.iter().map(|b| b.len() * T::DTYPE.size()).sum::<usize>() + f.iter().map(|b| b.len() * 4).sum::<usize>()
    }

    fn forward(&mut self, rt: &Runtime) -> dsl_runtime::Result<()> {
        let (b, t, dm, h, kv, hd) = self.dims;
        let (rows, nq, nk) = (b * t, h * hd, kv * hd);
        mm(rt, &self.x, (dm, 1), &self.wq, (nq, 1), &mut self.q, (rows, nq, dm))?;
        mm(rt, &self.x, (dm, 1), &self.wk, (nk, 1), &mut self.k, (rows, nk, dm))?;
        mm(rt, &self.x, (dm, 1), &self.wv, (nk, 1), &mut self.v, (rows, nk, dm))?;
        let (shape, scale) = (self.shape(), self.scale());
        attention_forward(rt, &shape, &self.q, &self.k, &self.v, &mut self.o, &mut self.lse, scale)?;
        mm(rt, &self.o, (nq, 1), &self.wo, (dm, 1), &mut self.y, (rows, dm, nq))
    }

    /// The gradients of `y.sum()` (`dy` is ones), from what [`Block::forward`] left.
    fn backward(&mut self, rt: &Runtime) -> dsl_runtime::Result<()> {
        let (b, t, dm, h, kv, hd) = self.dims;
        let (rows, nq, nk) = (b * t, h * hd, kv * hd);
        mm(rt, &self.o, (1, nq), &self.dy, (dm, 1), &mut self.dwo, (nq, dm, rows))?;
        mm(rt, &self.dy, (dm, 1), &self.wo, (1, dm), &mut self.dout, (rows, nq, dm))?;
        let (shape, scale) = (self.shape(), self.scale());
        let g = Grads { q: &self.q, k: &self.k, v: &self.v, o: &self.o, lse: &self.lse, dout: &self.dout, dq: &mut self.dq, dk: &mut self.dk, dv: &mut self.dv };
        attention_backward(rt, &shape, g, &mut self.delta, scale)?;
        mm(rt, &self.x, (1, dm), &self.dq, (nq, 1), &mut self.dwq, (dm, nq, rows))?;
        mm(rt, &self.x, (1, dm), &self.dk, (nk, 1), &mut self.dwk, (dm, nk, rows))?;
        mm(rt, &self.x, (1, dm), &self.dv, (nk, 1), &mut self.dwv, (dm, nk, rows))?;
        mm(rt, &self.dq, (nq, 1), &self.wq, (1, nq), &mut self.dx, (rows, dm, nq))?;
        mm(rt, &self.dk, (nk, 1), &self.wk, (1, nk), &mut self.dxk, (rows, dm, nk))?;
        mm(rt, &self.dv, (nk, 1), &self.wv, (1, nk), &mut self.dxv, (rows, dm, nk))?;
        let n = rows * dm;
        axpy::<1024>::launch(rt, grid_for(n, 1024), 1.0, &self.dxk, &mut self.dx, n as i64)?;
        axpy::<1024>::launch(rt, grid_for(n, 1024), 1.0, &self.dxv, &mut self.dx, n as i64)
    }
}

/// Checks each launch's output against f64 from the launch's inputs, relative to the
/// size of each element's terms, and keeps the largest error as a fraction of its bound.
///
/// The bounds, with `u` the unit the products' inputs are rounded to (bf16 inputs are
/// exact in the tensor cores' products; f32 inputs are truncated to tf32, `2^-9` per
/// product, `workloads::matmul_bound_tf32`):
/// - a matrix product: the f32 sum (`workloads::matmul_bound`), plus `2^-8` when its
///   output is rounded to bf16;
/// - attention forward: bf16, `2.5 * 2^-8` (probabilities and output rounded to bf16);
///   f32, `2^-9 (1 + 2 s)` with `s` the largest score's size (tf32 moves each score by
///   `2^-9 s`, and each probability by twice that relatively);
/// - attention backward: bf16, `3.5 * 2^-8` (the interpreter test's: `P` and `dS`
///   rounded to bf16, `delta` from the bf16 output, the gradients rounded); f32,
///   `2^-9 (3 + 2 s)`;
/// - `dx`: the sum of three products over `H D + 2 KV D` terms, as one product.
struct Checker {
    f32_inputs: bool,
    worst: f64,
    lines: Vec<String>,
}

impl Checker {
    fn record(&mut self, what: &str, c: Check) -> Res<()> {
        self.lines.push(format!("{what:>22}: largest error {:.2e} of its terms' size (bound {:.2e})", c.max_rel, c.bound));
        self.worst = self.worst.max(c.max_rel / c.bound);
        if !c.passed() {
            return Err(format!("{what}: {c}").into());
        }
        Ok(())
    }

    fn product(&mut self, what: &str, got: Vec<f64>, (want, terms): (Vec<f64>, Vec<f64>), k: usize, rounded_to_bf16: bool) -> Res<()> {
        let bound = if self.f32_inputs { matmul_bound_tf32(k) } else { matmul_bound(k) } + if rounded_to_bf16 { 2f64.powi(-8) } else { 0.0 };
        self.record(what, crate::workloads::check(&got, &want, &terms, bound))
    }
}

fn host<T: Element>(b: &Buffer<T>) -> dsl_runtime::Result<Vec<f64>> {
    Ok(b.to_vec()?.into_iter().map(|x| x.to_f64()).collect())
}

/// Run the block forward and backward once at `dims` and check every launch; returns the
/// largest error found as a fraction of its bound (at most 1) and the lines to print.
fn check<T: Float>(rt: &Runtime, dims: (usize, usize, usize, usize, usize, usize), seed: u64) -> Res<(f64, Vec<String>)> {
    let mut blk = Block::<T>::new(rt, dims, seed)?;
    blk.forward(rt)?;
    blk.backward(rt)?;
    let (b, t, dm, h, kv, hd) = dims;
    let (rows, nq, nk) = (b * t, h * hd, kv * hd);
    let half = T::DTYPE.size() == 2;
    let mut c = Checker { f32_inputs: !half, worst: 0.0, lines: vec![] };
    let (x, wq, wk, wv, wo) = (host(&blk.x)?, host(&blk.wq)?, host(&blk.wk)?, host(&blk.wv)?, host(&blk.wo)?);
    let (q, k, v, o, dy, dout) = (host(&blk.q)?, host(&blk.k)?, host(&blk.v)?, host(&blk.o)?, host(&blk.dy)?, host(&blk.dout)?);
    let (dq, dk, dv) = (host(&blk.dq)?, host(&blk.dk)?, host(&blk.dv)?);
    let mmr = reference::matmul;
    c.product("q = x Wq", q.clone(), mmr(&x, (dm, 1), &wq, (nq, 1), (rows, nq, dm)), dm, half)?;
    c.product("k = x Wk", k.clone(), mmr(&x, (dm, 1), &wk, (nk, 1), (rows, nk, dm)), dm, half)?;
    c.product("v = x Wv", v.clone(), mmr(&x, (dm, 1), &wv, (nk, 1), (rows, nk, dm)), dm, half)?;
    let (shape, scale) = (blk.shape(), blk.scale() as f64);
    let fwd = reference::attention(&shape, &q, &k, &v, scale);
    let s = fwd.score_size.iter().cloned().fold(0.0, f64::max);
    let u = 2f64.powi(-9);
    let bound = if half { 2.5 / 256.0 } else { u * (1.0 + 2.0 * s) };
    c.record("o = attention(q, k, v)", crate::workloads::check(&o, &fwd.o, &fwd.o_terms, bound))?;
    c.product("y = o Wo", host(&blk.y)?, mmr(&o, (nq, 1), &wo, (dm, 1), (rows, dm, nq)), nq, false)?;
    c.product("dWo = o^T dy", host(&blk.dwo)?, mmr(&o, (1, nq), &dy, (dm, 1), (nq, dm, rows)), rows, false)?;
    c.product("dO = dy Wo^T", dout.clone(), mmr(&dy, (dm, 1), &wo, (1, dm), (rows, nq, dm)), dm, half)?;
    let bwd = reference::attention_backward(&shape, &q, &k, &v, &dout, scale);
    let bound = if half { 3.5 / 256.0 } else { u * (3.0 + 2.0 * s) };
    for (what, got, (want, terms)) in [("dq (attention)", &dq, &bwd[0]), ("dk (attention)", &dk, &bwd[1]), ("dv (attention)", &dv, &bwd[2])] {
        c.record(what, crate::workloads::check(got, want, terms, bound))?;
    }
    c.product("dWq = x^T dq", host(&blk.dwq)?, mmr(&x, (1, dm), &dq, (nq, 1), (dm, nq, rows)), rows, false)?;
    c.product("dWk = x^T dk", host(&blk.dwk)?, mmr(&x, (1, dm), &dk, (nk, 1), (dm, nk, rows)), rows, false)?;
    c.product("dWv = x^T dv", host(&blk.dwv)?, mmr(&x, (1, dm), &dv, (nk, 1), (dm, nk, rows)), rows, false)?;
    // dx = [dq dk dv] [Wq Wk Wv]^T: one product over all three.
    let (mut want, mut terms) = mmr(&dq, (nq, 1), &wq, (1, nq), (rows, dm, nq));
    for (g, w, n) in [(&dk, &wk, nk), (&dv, &wv, nk)] {
        let (a, ta) = mmr(g, (n, 1), w, (1, n), (rows, dm, n));
        want.iter_mut().zip(a).for_each(|(x, y)| *x += y);
        terms.iter_mut().zip(ta).for_each(|(x, y)| *x += y);
    }
    c.product("dx", host(&blk.dx)?, (want, terms), nq + 2 * nk, false)?;
    Ok((c.worst, c.lines))
}

/// The block's forward written as a graph the way the seed writes it in PyTorch
/// (`Linear`s as `@`, `view`, `transpose`, `repeat_interleave`, scores divided by
/// `sqrt(d)`, softmax, `@ v`, `transpose`, `reshape`, output projection), compiled by the
/// fuser: its attention becomes one flash-attention launch. Inputs in the order x, Wq, Wk,
/// Wv, Wo, all of `dt`; the output `y` in `dt`.
/// Returns `y` and the inputs.
fn block_graph(g: &Graph, (b, t, dm, h, kv, hd): (usize, usize, usize, usize, usize, usize), dt: DType) -> Res<(Tensor<'_>, [Tensor<'_>; 5])> {
    let x = g.input("x", dt, &[b, t, dm]);
    let (wq, wk, wv, wo) = (g.input("wq", dt, &[dm, h * hd]), g.input("wk", dt, &[dm, kv * hd]), g.input("wv", dt, &[dm, kv * hd]), g.input("wo", dt, &[h * hd, dm]));
    let q = x.matmul(wq).reshape(&[b, t, h, hd]).transpose(1, 2);
    let k = x.matmul(wk).reshape(&[b, t, kv, hd]).transpose(1, 2).repeat_interleave(h / kv, 1);
    let v = x.matmul(wv).reshape(&[b, t, kv, hd]).transpose(1, 2).repeat_interleave(h / kv, 1);
    let s = q.matmul(k.transpose(-1, -2)) / (hd as f64).sqrt();
    let o = s.softmax(-1).matmul(v).transpose(1, 2).reshape(&[b, t, h * hd]);
    let y = o.matmul(wo);
    g.output("y", y)?;
    Ok((y, [x, wq, wk, wv, wo]))
}

/// The block forward and backward as one graph: [`block_graph`] and, by
/// [`Graph::grad`], the gradients of `y.sum()` with respect to `x` and the four weights
/// (outputs `dx`, `dwq`, `dwk`, `dwv`, `dwo`, in bf16), compiled by the fuser and run on
/// `blk`'s inputs; each gradient checked against the library path's (run after it).
///
/// The bound: the graph rounds every node to bf16 (`y`, `dO`, `dq`, `dk`, `dv`, each
/// projection's gradient before the sum that makes `dx`) where the library keeps `y`, the
/// weight gradients and `dx` in f32, and its attention's gradient is the same
/// flash-attention backward from a recomputed forward; a handful of roundings of 2^-9
/// through sums of products: 2^-5 of the gradient's largest element (the interpreter
/// measured up to 8.0e-3, 2^-7, on `dx` at the small shape, 3.6e-3 on the weights; 9.2e-3
/// when the attention was differentiated through its products and softmax).
fn fuser_forward_backward<T: Float>(rt: &Runtime, blk: &mut Block<T>) -> Res<(Plan, Vec<Buffer<T>>)>
where
    for<'a> TensorRef<'a>: From<&'a Buffer<T>>,
    for<'a> TensorMut<'a>: From<&'a mut Buffer<T>>,
{
    let (plan, outs) = fuser_block_plan(rt, blk)?;
    blk.forward(rt)?;
    blk.backward(rt)?;
    for (i, (name, want)) in GRADS.iter().zip([&blk.dx, &blk.dwq, &blk.dwk, &blk.dwv, &blk.dwo]).enumerate() {
        let (got, want) = (host(&outs[i + 1])?, host(want)?);
        let largest = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs() / largest).fold(0.0f64, |m, e| if e.is_nan() { f64::INFINITY } else { m.max(e) });
        if worst > 2f64.powi(-5) {
            return Err(format!("the fuser's {name} differs from the library's by {worst:e} of its largest element").into());
        }
    }
    Ok((plan, outs))
}

/// The block's forward through the fuser on `blk`'s inputs: the plan, and its output
/// checked against `blk`'s (the library path, run first: the same kernels but for the
/// output projection's rounding to bf16, so within 2^-8 of each element plus the f32
/// sums). Returns the plan and its output buffer, for timing.
fn fuser_forward<T: Float>(rt: &Runtime, blk: &mut Block<T>) -> Res<(Plan, Buffer<T>)>
where
    for<'a> TensorRef<'a>: From<&'a Buffer<T>>,
    for<'a> TensorMut<'a>: From<&'a mut Buffer<T>>,
{
    let g = Graph::new();
    block_graph(&g, blk.dims, T::DTYPE)?;
    let mut plan = g.compile(rt)?;
    let mut y = rt.upload(&vec![T::from_f64(f64::NAN); blk.y.len()])?;
    let ins: [TensorRef; 5] = [(&blk.x).into(), (&blk.wq).into(), (&blk.wk).into(), (&blk.wv).into(), (&blk.wo).into()];
    plan.run(rt, &ins, &mut [TensorMut::from(&mut y)])?;
    blk.forward(rt)?;
    let (got, want) = (host(&y)?, host(&blk.y)?);
    let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs() / (w.abs() + 1e-3)).fold(0.0f64, |m, e| if e.is_nan() { f64::INFINITY } else { m.max(e) });
    if worst > 2f64.powi(-7) {
        return Err(format!("the fuser's block differs from the library's by {worst:e} of an element").into());
    }
    Ok((plan, y))
}

/// The gradients the block's graph outputs after `y`, in the order of its inputs.
const GRADS: [&str; 5] = ["dx", "dwq", "dwk", "dwv", "dwo"];

/// The block forward and backward as one graph ([`block_graph`] and the gradients of
/// `y.sum()` for `x` and the weights, outputs `y`, `dx`, `dwq`, `dwk`, `dwv`, `dwo`),
/// compiled and run once on `blk`'s inputs into NaN-poisoned bf16 buffers.
fn fuser_block_plan<T: Float>(rt: &Runtime, blk: &Block<T>) -> Res<(Plan, Vec<Buffer<T>>)>
where
    for<'a> TensorRef<'a>: From<&'a Buffer<T>>,
    for<'a> TensorMut<'a>: From<&'a mut Buffer<T>>,
{
    let g = Graph::new();
    let (y, ins) = block_graph(&g, blk.dims, T::DTYPE)?;
    for (name, d) in GRADS.iter().zip(g.grad(y, None, &ins)?) {
        g.output(name, d)?;
    }
    let mut plan = g.compile(rt)?;
    let lens = [blk.y.len(), blk.dx.len(), blk.dwq.len(), blk.dwk.len(), blk.dwv.len(), blk.dwo.len()];
    let mut outs = lens.iter().map(|&n| rt.upload(&vec![T::from_f64(f64::NAN); n])).collect::<Result<Vec<_>, _>>()?;
    let ins: [TensorRef; 5] = [(&blk.x).into(), (&blk.wq).into(), (&blk.wk).into(), (&blk.wv).into(), (&blk.wo).into()];
    plan.run(rt, &ins, &mut outs.iter_mut().map(TensorMut::from).collect::<Vec<_>>())?;
    Ok((plan, outs))
}

/// [`fuser_block_plan`] from nothing to its first results (graph, gradients, compile, one
/// run, synchronize): the wall time in ms and the plan's steps.
fn first_call(rt: &Runtime, cuda: &dsl_runtime::driver::CudaRuntime, blk: &Block<bf16>) -> Res<(f64, usize)> {
    let start = std::time::Instant::now();
    let (plan, _) = fuser_block_plan(rt, blk)?;
    cuda.synchronize()?;
    Ok((start.elapsed().as_secs_f64() * 1e3, plan.kernel_count()))
}

/// Mean, standard deviation and 99th percentile of `iters` runs of `f` after `warmup`,/// Mean, standard deviation and 99th percentile of `iters` runs of `f` after `warmup`,
/// each timed with CUDA events on the runtime's stream, in ms.
fn time<E: std::error::Error + 'static>(cuda: &dsl_runtime::driver::CudaRuntime, warmup: usize, iters: usize, mut f: impl FnMut() -> Result<(), E>) -> Res<(f64, f64, f64)> {
    const TIMING: dsl_runtime::cudarc::driver::sys::CUevent_flags = dsl_runtime::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    for _ in 0..warmup {
        f()?;
    }
    let stream = cuda.stream();
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = stream.record_event(Some(TIMING))?;
        f()?;
        let end = stream.record_event(Some(TIMING))?;
        end.synchronize()?;
        times.push(start.elapsed_ms(&end)? as f64);
    }
    let mean = times.iter().sum::<f64>() / iters as f64;
    let std = (times.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / iters as f64).sqrt();
    times.sort_by(|a, b| a.total_cmp(b));
    let p99 = times[((iters as f64 * 0.99).ceil() as usize).clamp(1, iters) - 1];
    Ok((mean, std, p99))
}

/// Check the block forward and backward at [`SMALL`] in bf16 and in f32 (every launch,
/// every element), print what was checked, and on a GPU time it at `timed` with the seed's
/// protocol (10 warm-up steps, then 100 timed with CUDA events: mean ± std and p99) and
/// print the device memory it holds. Returns the largest error found, as a fraction of its
/// bound.
pub fn run(rt: &Runtime, timed: (usize, usize, usize, usize, usize, usize)) -> Res<f64> {
    let seed = crate::seed()?;
    let mut worst = 0.0f64;
    if let Runtime::Cuda(cuda) = rt {
        // First, before anything else compiles: the fuser's first call at the timed shape.
        let (b, t, dm, h, kv, hd) = timed;
        let blk = Block::<bf16>::new(rt, timed, seed)?;
        let (cold, steps) = first_call(rt, cuda, &blk)?;
        let (warm, _) = first_call(rt, cuda, &blk)?;
        println!("first call of the fuser's forward + backward at x [{b}, {t}, {dm}], {h}/{kv} heads, head dim {hd} (bf16; build the graph and its gradients, compile, run once, synchronize): {cold:.0} ms with this process's caches empty (and the disk cache, in a fresh directory), {warm:.1} ms for a second plan of the same graph ({steps} steps)");
    }
    let (b, t, dm, h, kv, hd) = SMALL;
    for (name, f) in [("bf16", check::<bf16> as fn(&Runtime, _, u64) -> Res<(f64, Vec<String>)>), ("f32 (tf32 products)", check::<f32>)] {
        println!("{name}: x [{b}, {t}, {dm}], {h} query heads, {kv} key/value heads, head dim {hd}: forward and backward, each launch against f64 (seed {seed})");
        let (w, lines) = f(rt, SMALL, seed).map_err(|e| format!("{name}: {e} (seed {seed})"))?;
        lines.iter().for_each(|l| println!("{l}"));
        worst = worst.max(w);
    }
    println!("every check passed: largest error {:.2} of its bound", worst);
    {
        let mut blk = Block::<bf16>::new(rt, SMALL, seed)?;
        let (plan, _) = fuser_forward(rt, &mut blk)?;
        println!("the forward written as a graph (the seed's PyTorch spelling) through the fuser: {} kernels, output within 2^-7 of the library path's:", plan.kernel_count());
        print!("{}", plan.partition());
        let (plan, _) = fuser_forward_backward(rt, &mut blk)?;
        let backward = plan.partition().groups.iter().filter(|g| g.attention_grad.is_some()).count();
        println!(
            "forward and backward as one graph (Graph::grad of y.sum() for x and the weights) through the fuser: {} steps, the attention's gradient {} flash-attention backward; every gradient within 2^-5 of its largest element of the library path's",
            plan.kernel_count(),
            if backward == 1 { "one" } else { "not one" }
        );
        let mut blk = Block::<f32>::new(rt, SMALL, seed)?;
        fuser_forward_backward(rt, &mut blk)?;
        println!("the same in f32 (tf32 products): every gradient within 2^-5 of its largest element of the library path's");
    }
    if let Runtime::Cuda(cuda) = rt {
        let (b, t, dm, h, kv, hd) = timed;
        let (rows, nq, nk) = ((b * t) as f64, (h * hd) as f64, (kv * hd) as f64);
        let proj = 2.0 * rows * dm as f64 * (nq + 2.0 * nk) + 2.0 * rows * nq * dm as f64;
        let attn = 4.0 * (b * h) as f64 * (t * t) as f64 * hd as f64;
        // Backward: two products per forward product, and the attention backward's 2.5x.
        let (fwd_flops, bwd_flops) = (proj + attn, 2.0 * proj + 2.5 * attn);
        println!("timed at x [{b}, {t}, {dm}], {h} query heads, {kv} key/value heads, head dim {hd} (10 warm-up steps, 100 timed, CUDA events):");
        for name in ["bf16", "f32"] {
            let report = |what: &str, (mean, std, p99): (f64, f64, f64), flops: f64| {
                println!("  {name:>4} {what:>18}: {mean:.3} ± {std:.3} ms (p99 {p99:.3}), {:.1} TFLOP/s", flops / mean / 1e9);
            };
            macro_rules! measure {
                ($t:ty) => {{
                    let mut blk = Block::<$t>::new(rt, timed, seed)?;
                    report("forward", time(cuda, 10, 100, || blk.forward(rt))?, fwd_flops);
                    report("backward", time(cuda, 10, 100, || blk.backward(rt))?, bwd_flops);
                    report("forward + backward", time(cuda, 10, 100, || blk.forward(rt).and_then(|_| blk.backward(rt)))?, fwd_flops + bwd_flops);
                    println!("  {name:>4} device memory held by the block: {:.1} MiB (allocated once, nothing while it runs)", blk.bytes() as f64 / (1 << 20) as f64);
                    blk
                }};
            }
            // Through the fuser (the seed's PyTorch spelling as a graph), eager and as one
            // CUDA graph; then the library calls as one CUDA graph.
            macro_rules! fuser {
                ($blk:ident, $t:ty) => {{
                    let mut blk = $blk;
                    let (mut plan, mut y) = fuser_forward(rt, &mut blk)?;
                    let ins: [TensorRef; 5] = [(&blk.x).into(), (&blk.wq).into(), (&blk.wk).into(), (&blk.wv).into(), (&blk.wo).into()];
                    let t = time(cuda, 10, 100, || plan.run(rt, &ins, &mut [TensorMut::from(&mut y)]))?;
                    report("forward (fuser)", t, fwd_flops);
                    let t = time(cuda, 10, 100, || plan.run_graph(rt, &ins, &mut [TensorMut::from(&mut y)]))?;
                    report("fwd (fuser, graph)", t, fwd_flops);
                    let (mut plan, mut outs) = fuser_forward_backward(rt, &mut blk)?;
                    let io: usize = outs.iter().map(|o| o.len()).sum::<usize>() + [&blk.x, &blk.wq, &blk.wk, &blk.wv, &blk.wo].iter().map(|b| b.len()).sum::<usize>();
                    println!("  {name:>4} device memory of the fuser's forward + backward: {:.1} MiB (the plan's intermediates and scratch {:.1} MiB, allocated once; inputs and outputs {:.1} MiB)", (plan.memory() + io * std::mem::size_of::<$t>()) as f64 / (1 << 20) as f64, plan.memory() as f64 / (1 << 20) as f64, (io * std::mem::size_of::<$t>()) as f64 / (1 << 20) as f64);
                    let ins: [TensorRef; 5] = [(&blk.x).into(), (&blk.wq).into(), (&blk.wk).into(), (&blk.wv).into(), (&blk.wo).into()];
                    let t = time(cuda, 10, 100, || plan.run(rt, &ins, &mut outs.iter_mut().map(TensorMut::from).collect::<Vec<_>>()))?;
                    report("fwd + bwd (fuser)", t, fwd_flops + bwd_flops);
                    // The same plan replayed as one CUDA graph: the same results, bit for bit.
                    let eager = outs.iter().map(host).collect::<Result<Vec<_>, _>>()?;
                    let t = time(cuda, 10, 100, || plan.run_graph(rt, &ins, &mut outs.iter_mut().map(TensorMut::from).collect::<Vec<_>>()))?;
                    report("fwd + bwd (f., graph)", t, fwd_flops + bwd_flops);
                    if outs.iter().map(host).collect::<Result<Vec<_>, _>>()? != eager {
                        return Err("the fuser's plan replayed as a CUDA graph differs from its eager run".into());
                    }
                    // The library path's forward + backward recorded as one CUDA graph.
                    let (want_y, want_dx) = (host(&blk.y)?, host(&blk.dx)?);
                    blk.forward(rt)?;
                    blk.backward(rt)?;
                    let graph = cuda.capture(|| blk.forward(rt).and_then(|_| blk.backward(rt)))?;
                    // SAFETY: the block's buffers, the only ones its launches use, live
                    // through the timing and the check below.
                    report("fwd + bwd (graph)", time(cuda, 10, 100, || unsafe { graph.replay() })?, fwd_flops + bwd_flops);
                    if host(&blk.y)? != want_y || host(&blk.dx)? != want_dx {
                        return Err("the block replayed as a CUDA graph differs from its eager run".into());
                    }
                }};
            }
            if name == "bf16" {
                let blk = measure!(bf16);
                fuser!(blk, bf16);
            } else {
                let blk = measure!(f32);
                fuser!(blk, f32);
            }
        }
    }
    Ok(worst)
}
