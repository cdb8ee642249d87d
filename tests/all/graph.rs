//! Graphs of tensor operations (`kernels_lib::graph`) compiled into fused kernels, on the
//! interpreter: fused against unfused against host references, kernel counts and what
//! each kernel loads and computes, errors of bad graphs, PTX that ptxas accepts, and
//! property tests over random elementwise/broadcast/view graphs and graphs with
//! reductions.

use crate::codegen::{assemble, ptx_for};
use crate::common::*;
use dsl_runtime::emit::Target;
use dsl_runtime::half::f16;
use dsl_runtime::launch::Safety;
use dsl_runtime::{Buffer, DType, Runtime};
use examples::workloads::{chain, gamma, DIV_FULL_F32, REFERENCE, U_BF16, U_F32};
use kernels_lib::graph::reference::{evaluate, Rounding};
use kernels_lib::graph::{Graph, GraphError, Options, Plan, PlanError, Tensor, TensorMut, TensorRef};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

/// A buffer of any graph element type, owned by a test.
enum Buf {
    F32(Buffer<f32>),
    F16(Buffer<f16>),
    BF16(Buffer<bf16>),
    I32(Buffer<i32>),
}

impl Buf {
    fn upload(rt: &Runtime, d: DType, x: &[f64]) -> Buf {
        match d {
            DType::F16 => Buf::F16(rt.upload(&x.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>()).unwrap()),
            DType::BF16 => Buf::BF16(rt.upload(&x.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>()).unwrap()),
            // Indices: poisoned with -1 (NaN has no i32).
            DType::I32 => Buf::I32(rt.upload(&x.iter().map(|&v| if v.is_nan() { -1 } else { v as i32 }).collect::<Vec<_>>()).unwrap()),
            _ => Buf::F32(rt.upload(&x.iter().map(|&v| v as f32).collect::<Vec<_>>()).unwrap()),
        }
    }
    fn get(&self) -> Vec<f64> {
        match self {
            Buf::F32(b) => b.to_vec().unwrap().iter().map(|&v| v as f64).collect(),
            Buf::F16(b) => b.to_vec().unwrap().iter().map(|v| v.to_f64()).collect(),
            Buf::BF16(b) => b.to_vec().unwrap().iter().map(|v| v.to_f64()).collect(),
            Buf::I32(b) => b.to_vec().unwrap().iter().map(|&v| v as f64).collect(),
        }
    }
    fn as_ref(&self) -> TensorRef<'_> {
        match self {
            Buf::F32(b) => b.into(),
            Buf::F16(b) => b.into(),
            Buf::BF16(b) => b.into(),
            Buf::I32(b) => b.into(),
        }
    }
    fn as_mut(&mut self) -> TensorMut<'_> {
        match self {
            Buf::F32(b) => b.into(),
            Buf::F16(b) => b.into(),
            Buf::BF16(b) => b.into(),
            Buf::I32(b) => b.into(),
        }
    }
}

/// Random inputs for `g`, rounded to each input's element type.
pub(crate) fn inputs_for(g: &Graph, seed: u64) -> Vec<Vec<f64>> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    g.inputs()
        .iter()
        .map(|(_, id)| {
            let n = g.node(*id);
            (0..n.numel()).map(|_| n.dtype.round(r.random_range(-4.0..4.0))).collect()
        })
        .collect()
}

/// Run `plan` on the interpreter; outputs start as NaN, so every element must be written.
pub(crate) fn run(plan: &mut Plan, g: &Graph, rt: &Runtime, inputs: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let ins: Vec<Buf> = g.inputs().iter().zip(inputs).map(|((_, id), x)| Buf::upload(rt, g.node(*id).dtype, x)).collect();
    let mut outs: Vec<Buf> = g
        .outputs()
        .iter()
        .map(|(_, id)| {
            let n = g.node(*id);
            Buf::upload(rt, n.dtype, &vec![f64::NAN; n.numel()])
        })
        .collect();
    let refs: Vec<TensorRef> = ins.iter().map(Buf::as_ref).collect();
    let mut muts: Vec<TensorMut> = outs.iter_mut().map(Buf::as_mut).collect();
    plan.run(rt, &refs, &mut muts).unwrap();
    drop(muts);
    outs.iter().map(Buf::get).collect()
}

/// Equal element for element, NaN equal to NaN.
fn same(what: &str, got: &[Vec<f64>], want: &[Vec<f64>]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: output {k}");
        for i in 0..g.len() {
            assert!(g[i] == w[i] || (g[i].is_nan() && w[i].is_nan()), "{what}: output {k} element {i}: {} vs {}", g[i], w[i]);
        }
    }
}

/// `g` compiled fused and unfused and run on the same fresh inputs (returned with their
/// seed and the fused outputs); the two agree exactly and fusion never adds kernels.
struct Runs {
    fused: Plan,
    unfused: Plan,
    inputs: Vec<Vec<f64>>,
    out: Vec<Vec<f64>>,
    seed: u64,
}

fn fused_and_unfused(what: &str, g: &Graph) -> Runs {
    let rt = Runtime::interpreter();
    let seed = seed();
    let inputs = inputs_for(g, seed);
    let mut fused = g.compile(&rt).unwrap();
    let mut unfused = g.compile_with(&rt, &Options::unfused()).unwrap();
    let out = run(&mut fused, g, &rt, &inputs);
    same(&format!("{what}: fused vs unfused (seed {seed})"), &out, &run(&mut unfused, g, &rt, &inputs));
    assert!(fused.kernel_count() <= unfused.kernel_count(), "{what}");
    Runs { fused, unfused, inputs, out, seed }
}

/// Fused, unfused and both references for `g` on fresh inputs: fused == unfused == the
/// as-stored reference exactly, and within `bound` (relative to 1 + |x|) of the f64 one
/// when there is a bound.
fn check_graph(what: &str, g: &Graph, bound: Option<f64>) -> (Plan, Plan) {
    let Runs { fused, unfused, inputs, out: f, seed: s } = fused_and_unfused(what, g);
    same(&format!("{what}: fused vs as-stored reference (seed {s})"), &f, &evaluate(g, &inputs, Rounding::AsStored).unwrap());
    let exact = evaluate(g, &inputs, Rounding::None).unwrap();
    for (k, (o, r)) in f.iter().zip(&exact).enumerate().filter(|_| bound.is_some()) {
        let bound = bound.unwrap_or_default();
        for i in 0..o.len() {
            let err = (o[i] - r[i]).abs() / (1.0 + r[i].abs());
            assert!(err <= bound || (o[i].is_nan() && r[i].is_nan()), "{what}: output {k} element {i}: {} vs f64 {} (seed {s})", o[i], r[i]);
        }
    }
    (fused, unfused)
}

/// Instructions of kernel `i` whose printed line contains `= <op> ` (or starts with
/// `store` for stores).
fn count(plan: &Plan, i: usize, op: &str) -> usize {
    let ir = plan.ir(i).unwrap();
    ir.lines().filter(|l| if op == "store" { l.trim_start().starts_with("store ") } else { l.contains(&format!("= {op} ")) }).count()
}

/// The seed: `relu(x) + relu(x) * 2`.
fn seed_graph(g: &Graph, n: usize) -> Tensor<'_> {
    let x = g.input("x", DType::F32, &[n]);
    x.relu() + x.relu() * 2.0
}

#[test]
fn the_seed_is_one_kernel_that_loads_x_once_and_computes_relu_once() {
    let g = Graph::new();
    g.output("y", seed_graph(&g, 5003)).unwrap();
    let (fused, unfused) = check_graph("seed", &g, Some(1e-7));
    assert_eq!(fused.kernel_count(), 1, "{}", fused.partition());
    let ir = fused.ir(0).unwrap();
    assert_eq!(count(&fused, 0, "load"), 1, "{ir}");
    assert_eq!(count(&fused, 0, "max"), 1, "relu computed once:\n{ir}");
    assert_eq!(count(&fused, 0, "store"), 1, "{ir}");
    // relu, mul, add: three kernels unfused.
    assert_eq!(unfused.kernel_count(), 3, "{}", unfused.partition());
}

#[test]
fn broadcasting_reads_through_index_maps_fused_and_unfused() {
    // A row vector over rows.
    let g = Graph::new();
    gallery(&g, 1);
    let (fused, _) = check_graph("[3, 1000] + [1000]", &g, Some(1e-6));
    assert_eq!(fused.kernel_count(), 1);
    // x contiguous, b at offs % 1000: one rem, no division.
    let ir = fused.ir(0).unwrap();
    assert_eq!((count(&fused, 0, "load"), count(&fused, 0, "rem"), count(&fused, 0, "div")), (2, 1, 0), "{ir}");
    // An outer product of two broadcasts, two outputs of its shape.
    let g = Graph::new();
    gallery(&g, 2);
    let (fused, _) = check_graph("[7, 1, 5] * [1, 4, 1]", &g, Some(1e-6));
    assert_eq!(fused.kernel_count(), 1, "{}", fused.partition());
}

#[test]
fn half_precision_nodes_round_as_if_stored_fused_or_not() {
    let g = Graph::new();
    gallery(&g, 3);
    let (fused, _) = check_graph("f16/bf16", &g, Some(2e-2));
    assert_eq!(fused.kernel_count(), 1);
}

#[test]
fn an_intermediate_that_is_also_an_output_is_stored_once() {
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[1000]);
    let r = x.relu();
    g.output("r", r).unwrap();
    g.output("y", r + r * 2.0).unwrap();
    let (fused, _) = check_graph("intermediate output", &g, Some(1e-7));
    assert_eq!(fused.kernel_count(), 1);
    let ir = fused.ir(0).unwrap();
    assert_eq!((count(&fused, 0, "load"), count(&fused, 0, "max"), count(&fused, 0, "store")), (1, 1, 2), "{ir}");
}

#[test]
fn kernel_counts_follow_output_shapes_and_fusion_can_be_turned_off() {
    // Outputs of two shapes: two kernels, the shared node recomputed in each.
    let g = Graph::new();
    let (x, b) = (g.input("x", DType::F32, &[5, 7]), g.input("b", DType::F32, &[7]));
    let e = b.exp();
    g.output("e", e).unwrap();
    g.output("y", x * e).unwrap();
    let (fused, unfused) = check_graph("two shapes", &g, Some(1e-6));
    assert_eq!((fused.kernel_count(), unfused.kernel_count()), (2, 2), "{}", fused.partition());
    // An output that is an input is a copy.
    let g = Graph::new();
    let x = g.input("x", DType::BF16, &[9]);
    g.output("x_again", x).unwrap();
    g.output("neg", -x).unwrap();
    let (fused, unfused) = check_graph("copy", &g, Some(0.0));
    assert_eq!((fused.kernel_count(), unfused.kernel_count()), (1, 2));
    // A chain of 7 nodes: 1 kernel fused, 7 unfused, through 6 intermediates allocated
    // once and reused by every run.
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[257]);
    g.output("y", ((x.exp() + 1.0).sqrt() * x - 2.0).tanh().abs()).unwrap();
    let (fused, mut unfused) = check_graph("chain", &g, Some(1e-6));
    assert_eq!((fused.kernel_count(), unfused.kernel_count()), (1, 7), "{}", unfused.partition());
    assert_eq!(unfused.partition().intermediates.len(), 6);
    let rt = Runtime::interpreter();
    let inputs = inputs_for(&g, seed());
    assert_eq!(run(&mut unfused, &g, &rt, &inputs), run(&mut unfused, &g, &rt, &inputs));
}

#[test]
fn a_kernel_is_identified_by_its_ir_so_contiguous_graphs_share_one_across_lengths() {
    let rt = Runtime::interpreter();
    let seed_plan = |n| {
        let g = Graph::new();
        g.output("y", seed_graph(&g, n)).unwrap();
        g.compile(&rt).unwrap()
    };
    let id = |p: &Plan| p.kernels().next().unwrap().id();
    assert_eq!(id(&seed_plan(5000)), id(&seed_plan(70001)), "the length is an argument");
    // Index maps divide by the dimensions, so broadcast shapes are part of the code.
    let broadcast_plan = |rows, cols| {
        let g = Graph::new();
        let (x, b) = (g.input("x", DType::F32, &[rows, cols]), g.input("b", DType::F32, &[cols]));
        g.output("y", x + b).unwrap();
        g.compile(&rt).unwrap()
    };
    assert_eq!(id(&broadcast_plan(3, 1000)), id(&broadcast_plan(30, 1000)));
    assert_ne!(id(&broadcast_plan(3, 1000)), id(&broadcast_plan(3, 999)));
}

#[test]
fn scalars_single_elements_and_empty_tensors() {
    // A 0-d input and a [1, 1] one: one element each, read by scalar loads.
    let g = Graph::new();
    let (s, one, v) = (g.input("s", DType::F32, &[]), g.input("one", DType::BF16, &[1, 1]), g.input("v", DType::F32, &[5]));
    g.output("y", (v * s + one.cast(DType::F32)).maximum(s)).unwrap();
    g.output("s2", s * s).unwrap();
    let (fused, _) = check_graph("scalars", &g, Some(1e-6));
    assert_eq!(fused.kernel_count(), 2);
    assert!(fused.ir(0).unwrap().lines().any(|l| l.contains("= load %0 :")), "{}", fused.ir(0).unwrap());
    // No elements: nothing to launch, nothing to check but that it runs.
    let g = Graph::new();
    let (x, b) = (g.input("x", DType::F32, &[0, 3]), g.input("b", DType::F32, &[3]));
    g.output("y", x + b).unwrap();
    let rt = Runtime::interpreter();
    let inputs = inputs_for(&g, 1);
    assert_eq!(run(&mut g.compile(&rt).unwrap(), &g, &rt, &inputs), vec![Vec::<f64>::new()]);
    // An attention over no query heads (Hugging Face's `repeat_kv` with a group of 0) runs
    // as written, not as a flash attention (whose launch divides by the group); its
    // gradient with respect to k, a sum over the empty group, is zeros.
    let g = Graph::new();
    let q = g.input("q", DType::F32, &[1, 0, 8, 16]);
    fn rep(x: Tensor<'_>) -> Tensor<'_> {
        x.reshape(&[1, 2, 1, 8, 16]).expand(&[1, 2, 0, 8, 16]).reshape(&[1, 0, 8, 16])
    }
    let (k, v) = (g.input("k", DType::F32, &[1, 2, 8, 16]), g.input("v", DType::F32, &[1, 2, 8, 16]));
    let o = (q.matmul(rep(k).transpose(-1, -2)) * 0.25).softmax(-1).matmul(rep(v));
    g.output("o", o).unwrap();
    let mut plan = g.compile(&rt).unwrap();
    assert!(plan.partition().groups.iter().all(|gr| gr.attention.is_none()), "{}", plan.partition());
    assert_eq!(run(&mut plan, &g, &rt, &inputs_for(&g, 1)), vec![Vec::<f64>::new()]);
    let [dk] = g.grad(o, None, &[k]).unwrap()[..] else { unreachable!("one gradient") };
    g.output("dk", dk).unwrap();
    let dk = &run(&mut g.compile(&rt).unwrap(), &g, &rt, &inputs_for(&g, 1))[1];
    assert!(dk.len() == 2 * 8 * 16 && dk.iter().all(|&x| x == 0.0), "{dk:?}");
    // So is a bias's gradient through a broadcast over no rows.
    let g = Graph::new();
    let (x, b) = (g.input("x", DType::F32, &[0, 3]), g.input("b", DType::F32, &[3]));
    let [db] = g.grad(x + b, None, &[b]).unwrap()[..] else { unreachable!("one gradient") };
    g.output("db", db).unwrap();
    assert_eq!(run(&mut g.compile(&rt).unwrap(), &g, &rt, &inputs_for(&g, 1)), vec![vec![0.0; 3]]);
}

#[test]
fn bad_graphs_and_bad_buffers_are_clear_errors() {
    let rt = Runtime::interpreter();
    let g = Graph::new();
    let (x, y) = (g.input("x", DType::F32, &[3, 4]), g.input("y", DType::F32, &[4, 3]));
    let e = g.output("z", (x * y).relu()).unwrap_err().to_string();
    assert!(e.contains("`mul`") && e.contains("[3, 4] and [4, 3]"), "{e}");
    // The error is the plan's too, and no kernel is made.
    let e = g.compile(&rt).err().unwrap().to_string();
    assert!(e.contains("[3, 4] and [4, 3]"), "{e}");
    assert!(matches!(Graph::new().compile(&rt), Err(PlanError::Graph(GraphError::NoOutputs))));

    let g = Graph::new();
    let x = g.input("x", DType::F16, &[2, 3]);
    g.output("y", x * 2.0).unwrap();
    let mut plan = g.compile(&rt).unwrap();
    let good = rt.upload(&[f16::ONE; 6]).unwrap();
    let wrong_type = rt.upload(&[1.0f32; 6]).unwrap();
    let short = rt.upload(&[f16::ONE; 5]).unwrap();
    let mut out = rt.zeros::<f16>(6).unwrap();
    let e = plan.run(&rt, &[], &mut [TensorMut::from(&mut out)]).unwrap_err().to_string();
    assert_eq!(e, "the graph has 1 inputs, got 0 buffers");
    let e = plan.run(&rt, &[(&wrong_type).into()], &mut [TensorMut::from(&mut out)]).unwrap_err().to_string();
    assert_eq!(e, "input `x` is f16 of shape [2, 3], got a buffer of f32");
    let e = plan.run(&rt, &[(&short).into()], &mut [TensorMut::from(&mut out)]).unwrap_err().to_string();
    assert_eq!(e, "input `x` has shape [2, 3] (6 elements), got a buffer of 5 elements");
    let mut out32 = rt.zeros::<f32>(6).unwrap();
    let e = plan.run(&rt, &[(&good).into()], &mut [TensorMut::from(&mut out32)]).unwrap_err().to_string();
    assert_eq!(e, "output `y` is f16 of shape [2, 3], got a buffer of f32");
    plan.run(&rt, &[(&good).into()], &mut [TensorMut::from(&mut out)]).unwrap();
    assert_eq!(out.to_vec().unwrap(), [f16::from_f32(2.0); 6]);
    assert!(matches!(plan.ir(1), Err(PlanError::NoKernel { index: 1, count: 1 })));
}

#[test]
fn graph_kernels_compile_to_ptx_that_ptxas_accepts() {
    let rt = Runtime::interpreter();
    let g = Graph::new();
    g.output("y", seed_graph(&g, 1 << 20)).unwrap();
    let plan = g.compile(&rt).unwrap();
    let k = plan.kernels().next().unwrap();
    let ptx = ptx_for(k, Target::SM90, Safety::Guarded, 4);
    // 1024 elements over 128 threads: two 128-bit loads of x per thread and two stores,
    // so x is read once.
    assert_eq!((ptx.matches("ld.global.v4.b32").count(), ptx.matches("st.global.v4.b32").count()), (2, 2), "{ptx}");
    let report = assemble(&ptx, "sm_90a", "graph_seed");
    assert!(report.contains("0 bytes spill stores"), "{report}");

    let g = Graph::new();
    let (p, q) = (g.input("p", DType::BF16, &[7, 1, 5]), g.input("q", DType::F32, &[1, 4, 1]));
    g.output("y", (p * q).gt(0.0).where_(p.cast(DType::F32).exp(), q)).unwrap();
    let plan = g.compile(&rt).unwrap();
    for (i, k) in plan.kernels().enumerate() {
        assemble(&ptx_for(k, Target::SM90, Safety::Guarded, 4), "sm_90a", &format!("graph_broadcast_{i}"));
    }

    // A reshape of a contiguous input is read at the flat index itself: still 16-byte
    // vectors (the index map of a reshape is the identity on flat indices).
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[1 << 20]);
    g.output("y", x.reshape(&[1024, 1024]).relu() + x.reshape(&[256, 4096]).reshape(&[1024, 1024])).unwrap();
    let plan = g.compile(&rt).unwrap();
    let ptx = ptx_for(plan.kernels().next().unwrap(), Target::SM90, Safety::Guarded, 4);
    assert_eq!(ptx.matches("ld.global.v4.b32").count(), 2, "x read once, in 16-byte vectors:\n{}", plan.ir(0).unwrap());

    // A rows kernel: softmax over rows of 4096 in 16-byte vectors, reduced across warps
    // through shared memory, without spills.
    let g = Graph::new();
    g.output("y", g.input("x", DType::F32, &[64, 4096]).softmax(-1)).unwrap();
    let plan = g.compile(&rt).unwrap();
    let ptx = ptx_for(plan.kernels().next().unwrap(), Target::SM90, Safety::Guarded, 8);
    assert!(ptx.contains("ld.global.v4") && ptx.contains("st.global.v4") && ptx.contains("bar.sync"), "{ptx}");
    let report = assemble(&ptx, "sm_90a", "graph_softmax");
    assert!(report.contains("0 bytes spill stores"), "{report}");
    // Short rows (128) share a program, 8 of them, still in 16-byte vectors.
    let g = Graph::new();
    g.output("y", g.input("x", DType::F32, &[32768, 128]).softmax(-1)).unwrap();
    let plan = g.compile(&rt).unwrap();
    let ir = plan.ir(0).unwrap();
    assert!(ir.contains("f32[8, 128]"), "{ir}");
    let ptx = ptx_for(plan.kernels().next().unwrap(), Target::SM90, Safety::Guarded, 2);
    assert!(ptx.contains("ld.global.v4") && ptx.contains("st.global.v4"), "{ptx}");
    assert!(assemble(&ptx, "sm_90a", "graph_softmax_short").contains("0 bytes spill stores"));
}

/// The hand-written graphs of this file, with a bound on the GPU's difference from the
/// interpreter (relative to 1 + |x|: the GPU's math functions are approximations; `0.0`:
/// exactly equal).
fn gallery(g: &Graph, which: usize) -> f64 {
    match which {
        0 => {
            g.output("y", seed_graph(g, (1 << 20) + 3)).unwrap();
            0.0
        }
        1 => {
            let (x, b) = (g.input("x", DType::F32, &[3, 1000]), g.input("b", DType::F32, &[1000]));
            g.output("y", (x + b).relu() * b.sigmoid() - (x * 0.5).tanh()).unwrap();
            1e-3
        }
        2 => {
            let (p, q) = (g.input("p", DType::F32, &[7, 1, 5]), g.input("q", DType::F32, &[1, 4, 1]));
            let m = p * q;
            g.output("y", m.gt(0.0).where_(m.exp(), -m)).unwrap();
            g.output("z", (p - q).abs().sqrt().minimum(q)).unwrap();
            1e-5
        }
        3 => {
            let (h, b) = (g.input("h", DType::F16, &[33, 17]), g.input("b", DType::BF16, &[17]));
            g.output("s", (h * 3.0 + h.exp()).cast(DType::BF16) * b).unwrap(); // bf16 all along
            g.output("t", (h + b).sigmoid()).unwrap(); // f16 + bf16: f32
            g.output("u", h.lt(b.cast(DType::F16)).cast(DType::F16) + h).unwrap();
            2e-2
        }
        4 => {
            // Views: grouped-query heads repeated inside a row reduction, a transpose, a
            // strided slice and a reshape.
            let q = g.input("q", DType::F32, &[2, 8, 33, 64]);
            let k = g.input("k", DType::BF16, &[2, 2, 33, 64]);
            g.output("s", (q * k.repeat_interleave(4, 1).cast(DType::F32)).sum(-1)).unwrap();
            let x = g.input("x", DType::F32, &[40, 24]);
            g.output("t", x.transpose(0, 1).slice_step(1, 1, 40, 3).exp() + x.reshape(&[960]).slice(0, 0, 24).reshape(&[24, 1])).unwrap();
            // A softmax along the first axis (a reduction under a transpose view).
            g.output("c", x.softmax(0)).unwrap();
            // f32 sums of 64 products of size up to 16, in different orders: gamma_64 of
            // terms up to 1024 is 4e-3 at worst.
            1e-3
        }
        5 => {
            // Matrix products: transposed and broadcast operands through strides, two and
            // three batch dimensions, bf16 and f32 (tf32), a product fed by a computed operand.
            let q = g.input("q", DType::BF16, &[2, 33, 4, 16]);
            let k = g.input("k", DType::BF16, &[2, 33, 4, 16]);
            g.output("s", q.transpose(1, 2).matmul(k.transpose(1, 2).transpose(-1, -2))).unwrap();
            let (a, b) = (g.input("a", DType::F32, &[3, 50, 70]), g.input("b", DType::F32, &[70, 30]));
            g.output("c", (a * 0.5).matmul(b).softmax(-1)).unwrap();
            // A product with a fused epilogue (bias and activation; the product is stored
            // too): bf16 roundings of different f32 sums differ by an ulp of the product.
            let (x, w, bias) = (g.input("x", DType::BF16, &[2, 40, 24]), g.input("w", DType::BF16, &[24, 48]), g.input("bias", DType::BF16, &[48]));
            let p = x.matmul(w);
            g.output("l", p.relu() * bias.sigmoid()).unwrap();
            g.output("p", p).unwrap();
            // Three batch dimensions that do not merge (`b` broadcast along the middle):
            // grid axis 2 holds two (a generated kernel).
            let (a3, b3) = (g.input("a3", DType::BF16, &[2, 3, 4, 8, 16]), g.input("b3", DType::BF16, &[2, 1, 4, 16, 8]));
            g.output("t", a3.matmul(b3)).unwrap();
            1e-2
        }
        6 => {
            // The seed's attention block in bf16: projections, one flash attention read
            // through strides, the output projection; and an f16 multi-query attention
            // whose key/value head is expanded (a zero head stride).
            seed_block(g, DType::BF16, (2, 40, 32, 4, 2, 16));
            let q = g.input("q", DType::F16, &[2, 4, 33, 32]) * 0.0625;
            let (k, v) = (g.input("k", DType::F16, &[2, 1, 33, 32]).expand(&[2, 4, 33, 32]), g.input("v", DType::F16, &[2, 1, 33, 32]).expand(&[2, 4, 33, 32]));
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v)).unwrap();
            // A causal GQA attention in bf16, head dim 64, masked the masked_fill way.
            let q = g.input("cq", DType::BF16, &[2, 4, 40, 64]) * 0.0625;
            let (ck, cv) = (g.input("ck", DType::BF16, &[2, 2, 40, 64]), g.input("cv", DType::BF16, &[2, 2, 40, 64]));
            let (k, v) = (ck.repeat_interleave(2, 1), cv.repeat_interleave(2, 1));
            let s = q.matmul(k.transpose(-1, -2)) * 0.125;
            g.output("c", g.tril(40, 40, 0).where_(s, f64::NEG_INFINITY).softmax(-1).matmul(v)).unwrap();
            // The same under a sliding window of 16 keys (the band of two trils).
            let band = g.tril(40, 40, 0).cast(DType::BF16) - g.tril(40, 40, -16).cast(DType::BF16);
            g.output("w", band.eq_(0.0).where_(f64::NEG_INFINITY, s).softmax(-1).matmul(v)).unwrap();
            // Masks and biases from data (the kernels' `ScoreBias`, packed by the plan): a
            // computed boolean key mask [B, 1, 1, T] (stored as bytes), and a bf16 bias
            // [B, 1, T, T] added before the scale.
            let (ka, kb) = (g.input("ka", DType::F32, &[2, 1, 1, 40]), g.input("kb", DType::F32, &[2, 1, 1, 40]));
            let keep = ka.gt(kb);
            g.output("m", keep.where_(s, f64::NEG_INFINITY).softmax(-1).matmul(v)).unwrap();
            // The sliding window over a key mask: both in one hook, the window's width in the
            // packed mask's header. A query whose 16 keys are all masked is NaN as written
            // (softmax of nothing) and zeros in the kernel, so the mask keeps 7 keys in 8
            // (`kb < 3`, exact in both; with `keep`'s one in two, a run of 16 masked keys
            // failed one run in about 4000, seed 10221), and key 0 (the first query sees
            // only it).
            let keep0 = kb.lt(3.0).cast(DType::F32).maximum(g.tril(1, 40, 0).cast(DType::F32)).gt(0.5);
            g.output("wm", keep0.where_(band.eq_(0.0).where_(f64::NEG_INFINITY, s), f64::NEG_INFINITY).softmax(-1).matmul(v)).unwrap();
            let bias = g.input("bias", DType::BF16, &[2, 1, 40, 40]);
            g.output("b", ((q.matmul(k.transpose(-1, -2)) + bias) * 0.125).softmax(-1).matmul(v)).unwrap();
            // A bf16 bias per head [B, H, T, T], added before the scale (as the bias above:
            // scaled, its bf16 scores' roundings in the unfused plan stay within the bound).
            let head_bias = g.input("head_bias", DType::BF16, &[2, 4, 40, 40]);
            g.output("hb", ((q.matmul(k.transpose(-1, -2)) + head_bias) * 0.125).softmax(-1).matmul(v)).unwrap();
            // The causal GQA again with the query heads grouped ([B, KV, G, T, D] against
            // k and v [B, KV, 1, T, D]), reshaped back to [B, H, T, D].
            let (q5, k5, v5) = (q.reshape(&[2, 2, 2, 40, 64]), ck.reshape(&[2, 2, 1, 40, 64]), cv.reshape(&[2, 2, 1, 40, 64]));
            let s5 = g.tril(40, 40, 0).where_(q5.matmul(k5.transpose(-1, -2)) * 0.125, f64::NEG_INFINITY);
            g.output("g", s5.softmax(-1).matmul(v5).reshape(&[2, 4, 40, 64])).unwrap();
            2e-2
        }
        7 => {
            // Rows kernels: softmax over 1000 (a warp per 256), a norm over 4096 in bf16.
            let (x, w) = (g.input("x", DType::F32, &[300, 1000]), g.input("w", DType::F32, &[1000]));
            g.output("p", (x * w).softmax(-1)).unwrap();
            let h = g.input("h", DType::BF16, &[64, 4096]);
            g.output("n", h.layer_norm(None, None, 1e-5)).unwrap();
            2e-2
        }
        _ => {
            // Rows longer than a program holds (looped): a softmax and an RMSNorm over
            // 20000 columns, and the rows' sums (of positive terms, `x + 5` in [1, 9): the
            // bound is relative to the result, which a sum that cancels to near zero
            // would not meet in f32 whatever its order; the GPU's order and the
            // interpreter's differ).
            let x = g.input("x", DType::F32, &[6, 20000]);
            g.output("p", x.softmax(-1)).unwrap();
            g.output("n", x.rms_norm(None, 1e-5)).unwrap();
            g.output("s", (x + 5.0).sum(-1)).unwrap();
            1e-4
        }
    }
}

#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn graphs_on_a_gpu_match_the_interpreter() {
    let gpu = Runtime::cuda(0).expect("a CUDA device");
    let cpu = Runtime::interpreter();
    for which in 0..9 {
        let g = Graph::new();
        let bound = gallery(&g, which);
        let s = seed();
        let inputs = inputs_for(&g, s);
        let want = run(&mut g.compile(&cpu).unwrap(), &g, &cpu, &inputs);
        for options in [Options::default(), Options::unfused(), Options { tune: true, ..Options::default() }] {
            let got = run(&mut g.compile_with(&gpu, &options).unwrap(), &g, &gpu, &inputs);
            for (k, (o, w)) in got.iter().zip(&want).enumerate() {
                for i in 0..o.len() {
                    let err = (o[i] - w[i]).abs() / (1.0 + w[i].abs());
                    assert!(err <= bound, "graph {which} {:?}: output {k} element {i}: {} on the GPU, {} on the interpreter (seed {s})", options.fusion, o[i], w[i]);
                }
            }
        }
    }
}

/// `y = softmax(x * 2 + b) - x` unfused (one kernel per node, five) and `f32` buffers for
/// it on `rt`: `x` [33, 70], `b` [70], `y` poisoned.
fn replay_case(rt: &Runtime, s: u64) -> (Plan, Plan, Buffer<f32>, Buffer<f32>, Buffer<f32>) {
    let g = Graph::new();
    let (x, b) = (g.input("x", DType::F32, &[33, 70]), g.input("b", DType::F32, &[70]));
    g.output("y", (x * 2.0 + b).softmax(-1) - x).unwrap();
    let (graph, eager) = (g.compile_with(rt, &Options::unfused()).unwrap(), g.compile_with(rt, &Options::unfused()).unwrap());
    assert!(graph.kernel_count() >= 3, "{}", graph.partition());
    let (dx, db) = (rt.upload(&random_f32(33 * 70, s)).unwrap(), rt.upload(&random_f32(70, s + 1)).unwrap());
    (graph, eager, dx, db, rt.upload(&vec![f32::NAN; 33 * 70]).unwrap())
}

/// What `eager.run` writes for `x`, `b`.
fn eager_run(rt: &Runtime, eager: &mut Plan, x: &Buffer<f32>, b: &Buffer<f32>) -> Vec<f32> {
    let mut y = rt.upload(&vec![f32::NAN; x.len()]).unwrap();
    eager.run(rt, &[x.into(), b.into()], &mut [(&mut y).into()]).unwrap();
    y.to_vec().unwrap()
}

/// `run_graph` on a GPU records the plan's launches once and replays them: the same bits
/// as `run`; new contents written into the same input buffer are what a replay reads;
/// another output buffer is recorded anew (the old graph would write the old one).
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn plans_replay_as_cuda_graphs_on_a_gpu() {
    let rt = Runtime::cuda(0).expect("a CUDA device");
    let s = seed();
    let (mut plan, mut eager, mut x, b, mut y) = replay_case(&rt, s);
    let poison = vec![f32::NAN; y.len()];
    for round in 0..3 {
        if round > 0 {
            x.copy_from(&random_f32(x.len(), s + 10 + round)).unwrap();
            y.copy_from(&poison).unwrap();
        }
        plan.run_graph(&rt, &[(&x).into(), (&b).into()], &mut [(&mut y).into()]).unwrap();
        let want = eager_run(&rt, &mut eager, &x, &b);
        assert_eq!(y.to_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "round {round} (seed {s})");
    }
    let mut other = rt.upload(&poison).unwrap();
    plan.run_graph(&rt, &[(&x).into(), (&b).into()], &mut [(&mut other).into()]).unwrap();
    assert_eq!(other.to_vec().unwrap(), eager_run(&rt, &mut eager, &x, &b), "a new output buffer (seed {s})");
    // A bad buffer is refused before anything is replayed.
    let short = rt.upload(&[0.0f32; 3]).unwrap();
    assert!(matches!(plan.run_graph(&rt, &[(&short).into(), (&b).into()], &mut [(&mut other).into()]), Err(PlanError::Len { .. })));
}

/// On the interpreter `run_graph` is `run`: it runs, every time (no graph to replay).
#[test]
fn run_graph_on_the_interpreter_runs() {
    let rt = Runtime::interpreter();
    let s = seed();
    let (mut plan, mut eager, mut x, b, mut y) = replay_case(&rt, s);
    for round in 0..2 {
        x.copy_from(&random_f32(x.len(), s + 10 + round)).unwrap();
        plan.run_graph(&rt, &[(&x).into(), (&b).into()], &mut [(&mut y).into()]).unwrap();
        assert_eq!(y.to_vec().unwrap(), eager_run(&rt, &mut eager, &x, &b), "round {round} (seed {s})");
    }
}

/// `Options::tune`: every generated kernel (an elementwise one, a rows one) is a tuning
/// session over its candidates (block and warps; rows a program and warps), every
/// candidate runs and agrees with the others, and the plan computes what the untuned one
/// does (the interpreter keeps the first candidate, the untuned configuration).
#[test]
fn tuned_plans_try_every_candidate() {
    let rt = Runtime::interpreter();
    let s = seed();
    let g = Graph::new();
    // Three kernels: an elementwise one over `w`, a rows one over `x` and a product with
    // an epilogue (tuned over the library matmul's tiles).
    let (x, w) = (g.input("x", DType::F32, &[40, 300]), g.input("w", DType::F32, &[5000]));
    let (a, b) = (g.input("a", DType::F32, &[40, 24]), g.input("b", DType::F32, &[24, 32]));
    g.output("e", (w * 2.0 + 1.0).relu()).unwrap();
    g.output("y", (x * 0.5).softmax(-1)).unwrap();
    g.output("p", a.matmul(b).relu()).unwrap();
    let mut tuned = g.compile_with(&rt, &Options { tune: true, ..Options::default() }).unwrap();
    let mut plain = g.compile(&rt).unwrap();
    assert_eq!(tuned.kernel_count(), 3, "{}", tuned.partition());
    let (dx, dw) = (rt.upload(&random_f32(40 * 300, s)).unwrap(), rt.upload(&random_f32(5000, s + 1)).unwrap());
    let (da, db) = (rt.upload(&random_f32(40 * 24, s + 2)).unwrap(), rt.upload(&random_f32(24 * 32, s + 3)).unwrap());
    let outs = |plan: &mut Plan| {
        let (mut e, mut y, mut p) = (rt.upload(&vec![f32::NAN; 5000]).unwrap(), rt.upload(&vec![f32::NAN; 40 * 300]).unwrap(), rt.upload(&vec![f32::NAN; 40 * 32]).unwrap());
        plan.run(&rt, &[(&dx).into(), (&dw).into(), (&da).into(), (&db).into()], &mut [(&mut e).into(), (&mut y).into(), (&mut p).into()]).unwrap();
        (e.to_vec().unwrap(), y.to_vec().unwrap(), p.to_vec().unwrap())
    };
    assert_eq!(outs(&mut tuned), outs(&mut plain), "seed {s}");
    let sessions = tuned.tune_sessions();
    assert_eq!(sessions.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 1, 2], "one session per kernel");
    // The product's tiles: one 64 x 64 tile covers it, BK 32 (f32 rows of at most 128
    // bytes), 4 or 8 warps, 1, 3 or 4 stages.
    let product = &sessions[2].1;
    assert_eq!(product.candidates.len(), 6, "{:?}", product.candidates);
    assert!(product.candidates.iter().all(|(c, _, _)| (c.get("BM"), c.get("BN"), c.get("BK")) == (64, 64, 32)), "{:?}", product.candidates);
    for (i, session) in &sessions {
        assert!(session.candidates.len() >= 4, "kernel {i}: {} candidates", session.candidates.len());
        for (cfg, outcome, _) in &session.candidates {
            // (Stages change nothing on the interpreter: the same code as another's.)
            assert!(matches!(outcome, autotune::tuner::Outcome::Untimed | autotune::tuner::Outcome::SameCodeAs(_)), "kernel {i} {cfg}: {outcome:?}");
        }
    }
    // The spaces: elementwise over the block and warps, rows over the rows a program.
    let rows = kernels_lib::graph::tune_space(40 * 300, Some(300), (512, 2, 2));
    assert!(rows.iter().all(|c| c.get("BLOCK") == 512) && rows.iter().any(|c| c.get("ROWS") == 16), "{rows:?}");
    let flat = kernels_lib::graph::tune_space(5000, None, (1024, 1, 4));
    assert_eq!(flat[0].get("BLOCK"), 1024);
    assert!(flat.iter().any(|c| c.get("BLOCK") == 4096) && flat.iter().all(|c| c.get("ROWS") == 1), "{flat:?}");
}

/// The graph of `symbolic_dimensions_specialize_per_binding`, for `b` rows of `t` x 48.
fn rows_graph(g: &Graph, b: usize, t: usize) -> Result<(), GraphError> {
    let (x, w) = (g.input("x", DType::F32, &[b, t, 48]), g.input("w", DType::F32, &[48]));
    g.output("y", (x * 2.0 + w).relu().softmax(-1))
}

/// `Symbolic`: dimensions bound at run time, one plan per binding (the same bits as a
/// graph written with those sizes), reused for a binding seen before; a binding that
/// misses, repeats or invents a dimension, and buffers that do not fit the binding, are
/// clear errors.
#[test]
fn symbolic_dimensions_specialize_per_binding() {
    let rt = Runtime::interpreter();
    let s = seed();
    let mut f = kernels_lib::graph::Symbolic::new(&["B", "T"], |g, d| rows_graph(g, d["B"], d["T"]));
    for (k, (b, t)) in [(2usize, 7usize), (3, 33), (2, 7)].into_iter().enumerate() {
        let (x, w) = (rt.upload(&random_f32(b * t * 48, s + k as u64)).unwrap(), rt.upload(&random_f32(48, s + 9)).unwrap());
        let mut y = rt.upload(&vec![f32::NAN; b * t * 48]).unwrap();
        f.run(&rt, &[("T", t), ("B", b)], &[(&x).into(), (&w).into()], &mut [(&mut y).into()]).unwrap();
        let g = Graph::new();
        rows_graph(&g, b, t).unwrap();
        let mut want = rt.upload(&vec![f32::NAN; b * t * 48]).unwrap();
        g.compile(&rt).unwrap().run(&rt, &[(&x).into(), (&w).into()], &mut [(&mut want).into()]).unwrap();
        assert_eq!(y.to_vec().unwrap(), want.to_vec().unwrap(), "B {b}, T {t} (seed {s})");
    }
    assert_eq!(f.specializations(), 2);
    let (x, w) = (rt.upload(&[0.0f32; 2 * 7 * 48]).unwrap(), rt.upload(&[0.0f32; 48]).unwrap());
    let mut y = rt.zeros::<f32>(2 * 7 * 48).unwrap();
    let mut run = |binding: &[(&str, usize)]| f.run(&rt, binding, &[(&x).into(), (&w).into()], &mut [(&mut y).into()]);
    for (binding, says) in [(&[("B", 2)][..], "`T` is not bound"), (&[("B", 2), ("T", 7), ("H", 1)], "`H` is not a dimension"), (&[("B", 2), ("T", 7), ("T", 7)], "`T` is bound twice")] {
        let e = run(binding).unwrap_err();
        assert!(matches!(e, PlanError::Dim(_)) && e.to_string().contains(says), "{binding:?}: {e}");
    }
    assert!(matches!(run(&[("B", 3), ("T", 7)]), Err(PlanError::Len { .. })), "buffers of B = 2 for B = 3");
}

/// Unfused, a chain of 12 operations passes 11 intermediates from kernel to kernel; by
/// liveness they share two buffers (each is dead once the next kernel has read it), and
/// the results are those of the fused plan.
#[test]
fn intermediates_share_buffers_by_liveness() {
    let rt = Runtime::interpreter();
    let s = seed();
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[1000]);
    let mut t = x;
    for i in 0..6 {
        t = (t * x + i as f32).tanh();
    }
    g.output("y", t).unwrap();
    let mut unfused = g.compile_with(&rt, &Options::unfused()).unwrap();
    assert_eq!(unfused.kernel_count(), 18, "{}", unfused.partition());
    assert_eq!(unfused.partition().intermediates.len(), 17);
    assert_eq!(unfused.intermediate_memory(), (2, 2 * 4000), "{}", unfused.partition());
    assert_eq!(unfused.memory(), 2 * 4000, "no scratch buffers here");
    let mut fused = g.compile(&rt).unwrap();
    assert_eq!(fused.intermediate_memory(), (0, 0));
    let dx = rt.upload(&random_f32(1000, s)).unwrap();
    let out = |plan: &mut Plan| {
        let mut y = rt.upload(&vec![f32::NAN; 1000]).unwrap();
        plan.run(&rt, &[(&dx).into()], &mut [(&mut y).into()]).unwrap();
        y.to_vec().unwrap()
    };
    assert_eq!(out(&mut unfused), out(&mut fused), "seed {s}");
}

/// `p = exp(a b + c d + e f)` read by two groups of different spaces (a softmax over its
/// rows, a sum over its columns through a transpose): recomputed in both, each reads the
/// six inputs; stored once, the inputs are read once and `p` written once and read twice
/// (and a launch): at 768 x 1024 (3 MiB an array) the cost model stores it (it saves 1
/// MiB: 36 MiB of loads against 27 MiB moved and an 8 MiB launch), and the plan computes
/// the f64 reference; at 16 x 1024 the launch costs more than the bytes saved, and it is
/// recomputed.
#[test]
fn the_cost_model_stores_a_value_two_groups_would_recompute() {
    let build = |rows: usize| {
        let g = Graph::new();
        let x: Vec<Tensor> = (0..6).map(|i| g.input(&format!("x{i}"), DType::F32, &[rows, 1024])).collect();
        let p = (x[0] * x[1] + x[2] * x[3] + x[4] * x[5]).exp();
        g.output("soft", p.softmax(-1)).unwrap();
        g.output("cols", p.transpose(0, 1).sum(-1)).unwrap();
        g
    };
    let (rows, array) = (768, 768 * 1024 * 4);
    let big = build(rows);
    let part = kernels_lib::graph::fuse::partition(&big, kernels_lib::graph::fuse::Fusion::On).unwrap();
    assert_eq!(part.stored_by_cost.len(), 1, "{part}");
    let p = part.stored_by_cost[0].0;
    assert!(big.node(p).to_string().starts_with("exp("), "{part}");
    assert_eq!(part.stored_by_cost[0].1, 2 * 6 * array - (6 * array + 3 * array + kernels_lib::graph::fuse::LAUNCH_BYTES), "{part}");
    assert_eq!(part.intermediates, [p], "{part}");
    assert_eq!(part.groups.len(), 3, "{part}");
    let small = build(16);
    let part = kernels_lib::graph::fuse::partition(&small, kernels_lib::graph::fuse::Fusion::On).unwrap();
    assert!(part.stored_by_cost.is_empty() && part.groups.len() == 2, "{part}");
    // Without the cost model (for comparisons), the big one is recomputed too.
    let part = kernels_lib::graph::fuse::partition(&big, kernels_lib::graph::fuse::Fusion::Recompute).unwrap();
    assert!(part.stored_by_cost.is_empty() && part.groups.len() == 2, "{part}");
    // The stored value computes what the graph says.
    let rt = Runtime::interpreter();
    let s = seed();
    let host: Vec<Vec<f32>> = (0..6).map(|i| random_f32(rows * 1024, s + i).iter().map(|v| v / 8.0).collect()).collect();
    let inputs: Vec<Buffer<f32>> = host.iter().map(|h| rt.upload(h).unwrap()).collect();
    let mut outs = [rt.zeros::<f32>(rows * 1024).unwrap(), rt.zeros::<f32>(1024).unwrap()];
    let refs: Vec<TensorRef> = inputs.iter().map(|b| b.into()).collect();
    let mut plan = big.compile(&rt).unwrap();
    plan.run(&rt, &refs, &mut outs.iter_mut().map(TensorMut::from).collect::<Vec<_>>()).unwrap();
    let exact = evaluate(&big, &host.iter().map(|h| h.iter().map(|&v| v as f64).collect()).collect::<Vec<_>>(), Rounding::None).unwrap();
    let got: Vec<Vec<f64>> = outs.iter().map(|o| o.to_vec().unwrap().into_iter().map(f64::from).collect()).collect();
    within(&format!("seed {s}"), &got, &exact, 1e-5, &plan);
}

/// Graphs with reductions: fused == unfused exactly (the same reduction of the same
/// values), both within `bound` (relative to 1 + |x|) of the f64 reference; returns the
/// fused plan.
fn check_reduction(what: &str, g: &Graph, bound: f64) -> Plan {
    let Runs { fused, inputs, out: f, seed: s, .. } = fused_and_unfused(what, g);
    within(&format!("{what} (seed {s})"), &f, &evaluate(g, &inputs, Rounding::None).unwrap(), bound, &fused);
    fused
}

/// Every element of `out` within `bound` of the f64 reference `exact`, relative to
/// `1 + |x|`; the plan's partition printed on failure.
pub(crate) fn within(what: &str, out: &[Vec<f64>], exact: &[Vec<f64>], bound: f64, plan: &Plan) {
    for (k, (o, r)) in out.iter().zip(exact).enumerate() {
        within_scale(&format!("{what}: output {k}"), o, r, None, bound, plan);
    }
}

/// Every element of one output `out` within `bound` of the f64 reference `exact`, relative
/// to `scale` (the size of the terms each element adds up, as `examples::workloads`
/// measures errors; `None`: `1 + |x|`); the plan's partition printed on failure.
fn within_scale(what: &str, out: &[f64], exact: &[f64], scale: Option<&[f64]>, bound: f64, plan: &Plan) {
    for i in 0..out.len() {
        let s = scale.map_or(1.0 + exact[i].abs(), |s| s[i]);
        let err = (out[i] - exact[i]).abs() / s;
        assert!(err <= bound, "{what} element {i}: {} vs f64 {} (error {err:.3e} x the scale {s}, bound {bound:.3e})\n{}", out[i], exact[i], plan.partition());
    }
}

/// Softmax, log-softmax, RMSNorm and LayerNorm (rows of 37, not a power of two; 16-bit
/// inputs computed in f32) are one kernel each that loads its row once and stores it
/// once, and agree with f64.
#[test]
fn softmax_and_norms_are_one_kernel_each() {
    for d in [DType::F32, DType::F16] {
        let bound = if d == DType::F32 { 1e-5 } else { 2e-3 };
        for which in 0..4 {
            let g = Graph::new();
            let x = g.input("x", d, &[5, 37]);
            let (w, b) = (g.input("w", DType::F32, &[37]), g.input("b", DType::F32, &[37]));
            let (y, reductions, loads) = match which {
                0 => (x.softmax(-1), 2, 1),
                1 => (x.log_softmax(-1), 2, 1),
                2 => (x.rms_norm(Some(w), 1e-6), 1, 2),
                _ => (x.layer_norm(Some(w), Some(b), 1e-5), 2, 3),
            };
            g.output("y", y).unwrap();
            let plan = check_reduction(&format!("{d} #{which}"), &g, bound);
            assert_eq!(plan.kernel_count(), 1, "{}", plan.partition());
            let ir = plan.ir(0).unwrap();
            assert_eq!((count(&plan, 0, "load"), count(&plan, 0, "reduce"), count(&plan, 0, "store")), (loads, reductions, 1), "{d} #{which}:\n{ir}");
        }
    }
}

/// Every reduction (sum, mean, amax, amin) over rows of rank-3 shapes, with broadcast
/// inputs before and after, and a reduction that is itself an output beside its row.
#[test]
fn reductions_fuse_with_their_prologue_and_epilogue() {
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[2, 3, 19]);
    let (w, c) = (g.input("w", DType::F32, &[19]), g.input("c", DType::F32, &[3, 1]));
    let t = (x * w).tanh();
    let (s, m, hi, lo) = (t.sum(-1), t.mean(-1), t.amax(-1), t.amin(-1));
    assert_eq!(s.shape(), Ok(vec![2, 3, 1]));
    g.output("range", (hi - lo) * c).unwrap();
    g.output("centered", t - m).unwrap();
    g.output("sum", s).unwrap();
    let plan = check_reduction("rank 3", &g, 1e-5);
    assert_eq!(plan.kernel_count(), 1, "{}", plan.partition());
    assert_eq!(count(&plan, 0, "reduce"), 4, "{}", plan.ir(0).unwrap());
    // A reduction of a 1-element row, and of a rank-1 tensor.
    let g = Graph::new();
    let (a, v) = (g.input("a", DType::F32, &[4, 1]), g.input("v", DType::F32, &[33]));
    g.output("a", a.sum(-1) * 2.0).unwrap();
    g.output("v", v - v.mean(-1)).unwrap();
    check_reduction("short rows", &g, 1e-5);
}

/// `argmax`/`argmin` give the `i32` index of the first best element along the axis, fused
/// with their prologue in one kernel: ties (the zeros of a relu) go to the first, a NaN
/// loses to any number (the negative elements' logs), a row of NaNs gives 0, rows of one
/// element give 0, another axis is transposed there; the index feeds arithmetic after it;
/// f32 and bf16 rows, against the reference exactly.
#[test]
fn argmax_and_argmin_give_the_first_best_index() {
    for dtype in [DType::F32, DType::BF16] {
        let g = Graph::new();
        let x = g.input("x", dtype, &[5, 37]);
        g.output("argmax", x.argmax(-1)).unwrap();
        g.output("first_zero", x.relu().argmin(-1)).unwrap();
        g.output("nan_loses", x.log().argmax(-1)).unwrap();
        g.output("all_nan", ((x * x + 1.0) * -1.0).log().argmin(-1)).unwrap();
        g.output("per_column", x.argmin(0).cast(DType::F32) * 2.0 + 1.0).unwrap();
        let (fused, _) = check_graph(&format!("argmax {dtype}"), &g, None);
        let rt = Runtime::interpreter();
        let inputs = inputs_for(&g, seed());
        let mut plan = g.compile(&rt).unwrap();
        let out = run(&mut plan, &g, &rt, &inputs);
        let x = &inputs[0];
        for r in 0..5 {
            let row = &x[r * 37..(r + 1) * 37];
            let first = |f: &dyn Fn(f64) -> bool| row.iter().position(|&v| f(v)).unwrap() as f64;
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert_eq!(out[0][r], first(&|v| v == max), "{dtype} row {r}");
            let zero = if row.iter().any(|&v| v <= 0.0) { first(&|v| v <= 0.0) } else { first(&|v| v == row.iter().copied().fold(f64::INFINITY, f64::min)) };
            assert_eq!(out[1][r], zero, "{dtype} row {r}: ties go to the first");
            // The logs are rounded to the element type (ties among the largest are
            // possible in bf16: the exact index is checked against the reference above);
            // here: a number wins over the NaNs, and it is one of the largest.
            let won = row[out[2][r] as usize];
            assert!(won > 0.0 && won >= 0.98 * max, "{dtype} row {r}: NaNs lose ({won} vs largest {max})");
            assert_eq!(out[3][r], 0.0, "{dtype} row {r}: a row of NaNs");
        }
        // The four row reductions in one kernel with their prologues; the column one
        // (a transposed read) and its epilogue (another space) in two more.
        assert_eq!((fused.kernel_count(), count(&fused, 0, "reduce")), (3, 4), "{}", fused.partition());
        // Rows of one element.
        let g = Graph::new();
        let a = g.input("a", dtype, &[4, 1]);
        g.output("i", a.argmax(-1)).unwrap();
        let (p, _) = check_graph("one-element rows", &g, None);
        let mut p = p;
        let out = run(&mut p, &g, &rt, &inputs_for(&g, seed()));
        assert_eq!(out[0], [0.0; 4]);
    }
}

/// A row value read in another space is a boundary: stored by its kernel and loaded by
/// the next, in stage order.
#[test]
fn reductions_read_in_another_space_go_through_memory() {
    let g = Graph::new();
    let (x, w) = (g.input("x", DType::F32, &[5, 37]), g.input("w", DType::F32, &[5, 7]));
    let r = x.exp().sum(-1); // rows of 37
    let y = r.log() * w; // [5, 7]: not the space of r
    g.output("s", y.amax(-1)).unwrap(); // rows of 7
    g.output("y", y).unwrap();
    let plan = check_reduction("boundary", &g, 1e-5);
    assert_eq!(plan.kernel_count(), 2, "{}", plan.partition());
    assert_eq!(plan.partition().intermediates.len(), 1, "{}", plan.partition());
    // A reduction of a reduction's result: rows of 37, then rows of 1.
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[5, 37]);
    g.output("z", x.sum(-1).sum(-1) + x.amax(-1)).unwrap();
    check_reduction("nested", &g, 1e-5);
}

/// Reductions along other axes than the last: transposed there by a view, reduced, and
/// transposed back (shape kept with size 1 at the axis), fused with what comes before and
/// after, against f64: a softmax over the rows of `[7, 33]` (axis 0), a sum over the
/// middle axis, a mean over the first of three.
#[test]
fn reductions_along_any_axis() {
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[7, 33]);
    g.output("p", x.softmax(0)).unwrap();
    let y = g.input("y", DType::BF16, &[5, 9, 4]);
    g.output("s", (y.cast(DType::F32) * 2.0).sum(1) + 1.0).unwrap();
    g.output("m", y.cast(DType::F32).mean(-3)).unwrap();
    let fused = check_reduction("other axes", &g, 1e-5);
    let shapes: Vec<Vec<usize>> = g.outputs().iter().map(|(_, id)| g.node(*id).shape).collect();
    assert_eq!(shapes, [vec![7, 33], vec![5, 1, 4], vec![1, 9, 4]]);
    // Today a reduced value transposed back is a view of a rows value, so it goes
    // through memory: the softmax over axis 0 takes 3 kernels, the others 2 each. (A rows
    // space over the transposed shape for the whole softmax would take 1: not yet.)
    assert_eq!(fused.kernel_count(), 7, "{}", fused.partition());
}

#[test]
fn bad_reductions_are_clear_errors() {
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[4, 6]);
    let e = g.output("y", x.sum(2)).unwrap_err();
    assert_eq!(e, GraphError::Axis { op: "sum", axis: 2, shape: vec![4, 6] });
    assert!(e.to_string().contains("out of range"), "{e}");
    assert!(matches!(x.amax(-3).check(), Err(GraphError::Axis { axis: -3, .. })));
    assert!(matches!(x.gt(0.0).sum(-1).check(), Err(GraphError::NotFloat { .. })));
}

/// Rows longer than a program holds loop over chunks, a pass per level of reductions:
/// softmax (max, then the sum of exponentials), RMSNorm and LayerNorm with weights, a
/// reduction of a reduction, per-row outputs beside the row, bf16, a transposed read, rows
/// not a multiple of the chunk; forced on small shapes (`Options::max_row`), against the
/// plans that hold each row in one program and the f64 reference; and a softmax over rows
/// of 20000 (past the default limit) with the default options.
#[test]
fn long_rows_loop_over_chunks() {
    let rt = Runtime::interpreter();
    let looping = Options { max_row: 64, ..Options::default() };
    for dtype in [DType::F32, DType::BF16] {
        let g = Graph::new();
        let x = g.input("x", dtype, &[3, 200]);
        let w = g.input("w", dtype, &[200]);
        g.output("softmax", (x * 0.5).softmax(-1)).unwrap();
        g.output("rms", x.rms_norm(Some(w), 1e-5)).unwrap();
        g.output("ln", x.layer_norm(Some(w), None, 1e-5)).unwrap();
        g.output("sum", x.exp().sum(-1)).unwrap();
        g.output("nested", x.sum(-1).sum(-1) + x.amax(-1) - x.amin(-1) * x.mean(-1)).unwrap();
        g.output("cols", x.transpose(0, 1).sum(-1)).unwrap(); // rows of 3: not looped
        // Index reductions: the first best across chunks and lanes; ties (relu's zeros),
        // NaNs (the negatives' logs), a row of NaNs.
        g.output("argmax", x.argmax(-1)).unwrap();
        g.output("first_zero", x.relu().argmin(-1)).unwrap();
        g.output("nan_loses", x.log().argmax(-1)).unwrap();
        g.output("all_nan", ((x * x + 1.0) * -1.0).log().argmin(-1)).unwrap();
        let s = seed();
        let inputs = inputs_for(&g, s);
        let mut plan = g.compile_with(&rt, &looping).unwrap();
        let got = run(&mut plan, &g, &rt, &inputs);
        let mut held_plan = g.compile(&rt).unwrap();
        let held = run(&mut held_plan, &g, &rt, &inputs);
        let exact = evaluate(&g, &inputs, Rounding::None).unwrap();
        let bound = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
        // `nested` (output 4) is `S + M - m S / n` over a row of n = 200 (S its sum, M its
        // max, m its min): it cancels (S near -4 where M - m S / n is near 4) while its
        // terms add up to about 400, so against `1 + |x|` a correct f32 sum fails (seed
        // 13252, row 2: looped 0.0123205, f64 0.0123314, off by 1.1e-5; the looped and held
        // sums differ by up to 2e-5 where `sum |x|` is 416). Its error is measured against
        // the size of its terms instead (`examples::workloads`): T = sum |x| + |M| + |m|
        // sum |x| / n. Any order of adding n terms in f32 is off by at most gamma_{n-1}
        // sum |x| (the held rows add in sequence, the looped ones each lane's chunks, then
        // the lanes); then the mean's terms go through the division by n, the reduction's
        // store to the element type, the product by m and the difference (the sum's terms
        // through the store, + M and the difference; M through two operations; the sum of
        // the one-element row `S.sum(-1)` is exact), an operation rounding in f32 and then
        // to the element type. Each term of T is off by at most that chain, so the element
        // by at most the chain times T: 1.22e-5 in f32, 1.18e-2 in bf16 (over 20000 seeds
        // the largest errors were 1.7e-7 T and 2.3e-3 T; leaving a chunk out of the loop
        // put f32 rows off by 2e-3 T to 4e-2 T).
        let store = if dtype == DType::F32 { 0.0 } else { U_BF16 };
        let op = chain(&[U_F32, store]);
        let nested_bound = chain(&[gamma(199.0, U_F32), DIV_FULL_F32, store, op, op]) + REFERENCE;
        let terms: Vec<f64> = inputs[0]
            .chunks(200)
            .map(|row| {
                let abs: f64 = row.iter().map(|v| v.abs()).sum();
                let (hi, lo) = row.iter().fold((f64::NEG_INFINITY, f64::INFINITY), |(h, l), &v| (h.max(v), l.min(v)));
                abs + hi.abs() + lo.abs() * abs / 200.0
            })
            .collect();
        // The values of both plans against f64 (so they agree within twice the bounds);
        // the indices (outputs 6 and up: ties among values rounded to bf16 are the element
        // type's, not f64's) exactly against the held rows.
        for (name, out, p) in [("looped", &got, &plan), ("held", &held, &held_plan)] {
            let what = format!("long rows {dtype}, {name} (seed {s})");
            for k in [0, 1, 2, 3, 5] {
                within_scale(&format!("{what}: output {k}"), &out[k], &exact[k], None, bound, p);
            }
            within_scale(&format!("{what}: output 4 (nested)"), &out[4], &exact[4], Some(&terms), nested_bound, p);
        }
        for k in 6..10 {
            assert_eq!(got[k], held[k], "{dtype}: index output {k}, looped vs held (seed {s})");
        }
        assert!(got[9].iter().all(|&i| i == 0.0), "a row of NaNs");
        let ir = plan.ir(0).unwrap();
        assert!(ir.matches(" for ").count() >= 2, "no loops:\n{ir}");
        // And for the GPU: ptxas takes every kernel of the plan, none spilling.
        for (i, k) in plan.kernels().enumerate() {
            let ptx = crate::codegen::ptx_for(k, Target::SM90, Safety::Guarded, 4);
            let report = crate::codegen::assemble(&ptx, "sm_90a", &format!("long_rows_{dtype}_{i}"));
            assert!(report.contains("0 bytes spill stores"), "{report}");
        }
    }
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[2, 20000]);
    g.output("y", x.softmax(-1)).unwrap();
    check_reduction("rows of 20000", &g, 1e-5);
}

// ---------------------------------------------------------------------------------------
// Views.

/// Reshape, permute/transpose, expand, slice (strided) and repeat_interleave, of inputs
/// and of computed values: index maps on the loads, never copies (each fused kernel
/// loads each input once and stores only its outputs), fused == unfused == the as-stored
/// reference.
#[test]
fn views_are_index_maps_fused_and_unfused() {
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[4, 6, 5]);
    let b = g.input("b", DType::F32, &[4]);
    // A transpose of a computed value, then broadcasting in the new order.
    g.output("t", (x * 2.0 + 1.0).transpose(0, 2) + b).unwrap();
    // Reshapes (one through a flat view) and a slice of rows.
    g.output("r", x.reshape(&[24, 5]).slice(0, 3, 20).relu() * x.reshape(&[120]).reshape(&[24, 5]).slice(0, 2, 19)).unwrap();
    // Every other column, each repeated: [4, 3, 5] -> [4, 6, 5].
    g.output("i", x.slice_step(1, 0, 6, 2).repeat_interleave(2, 1).exp() - x).unwrap();
    // An expanded row read by every row, and a permutation of three axes.
    let c = g.input("c", DType::F16, &[1, 6]);
    g.output("e", c.expand(&[5, 4, 6]).cast(DType::F32) * x.permute(&[2, 0, 1])).unwrap();
    // Concatenations (of an input and a computed value; of three, promoting f16 to f32).
    g.output("k", x.cat(x * 3.0, 1)).unwrap();
    let h = g.input("h", DType::F16, &[2, 6, 5]);
    g.output("m", g.concat(&[x.slice(0, 1, 3), h.relu(), x], 0)).unwrap();
    let (fused, unfused) = check_graph("views", &g, Some(1e-6));
    assert_eq!(fused.kernel_count(), 6, "{}", fused.partition()); // one per output shape
    for i in 0..4 {
        let loads = count(&fused, i, "load");
        assert!(loads <= 2, "kernel {i} loads {loads} times:\n{}", fused.ir(i).unwrap());
    }
    assert!(unfused.kernel_count() > fused.kernel_count());
}

/// Grouped-query heads the way a PyTorch user repeats them: `k.repeat_interleave(H / KV,
/// 1)` read inside a row reduction (`(q * k).sum(-1)` over the head dimension) and a
/// softmax over a transposed tensor: the views are read in the reducing kernel itself.
#[test]
fn views_inside_row_reductions() {
    let g = Graph::new();
    let q = g.input("q", DType::F32, &[2, 4, 7, 16]);
    let k = g.input("k", DType::BF16, &[2, 2, 7, 16]);
    let kk = k.repeat_interleave(2, 1).cast(DType::F32);
    g.output("s", (q * kk).sum(-1) * 0.25).unwrap();
    let x = g.input("x", DType::F32, &[33, 9]);
    g.output("p", x.transpose(0, 1).softmax(-1)).unwrap();
    let fused = check_reduction("views in rows", &g, 1e-4); // f32 sums of 16 products up to 16
    assert_eq!(fused.kernel_count(), 2, "{}", fused.partition());
    // The GPU gallery's graph of views.
    let g = Graph::new();
    gallery(&g, 4);
    check_reduction("gallery 4", &g, 1e-3);
}

/// A view of a reduction's result (a value of a rows kernel read at other elements) is
/// stored first and read back through the view's index map.
#[test]
fn a_view_of_a_reduction_goes_through_memory() {
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[12, 8]);
    let m = x.amax(-1).reshape(&[3, 4]).transpose(0, 1); // [4, 3]
    g.output("y", m * 2.0).unwrap();
    let fused = check_reduction("view of a reduction", &g, 1e-6);
    assert_eq!(fused.kernel_count(), 2, "{}", fused.partition());
}

#[test]
fn bad_views_are_clear_errors() {
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[4, 6]);
    let err = |t: Tensor| t.check().expect_err("an error").to_string();
    let e = err(x.reshape(&[5, 5]));
    assert!(e.contains("`reshape`") && e.contains("[4, 6]") && e.contains("24 elements"), "{e}");
    assert!(err(x.reshape(&[usize::MAX, 5])).contains("cannot infer"));
    assert!(err(x.permute(&[0, 0])).contains("not a permutation"));
    assert!(err(x.expand(&[3, 4, 5])).contains("does not expand to [3, 4, 5]"));
    assert!(err(x.slice(1, 4, 9)).contains("within axis 1 of length 6"));
    assert!(err(x.transpose(0, 2)).contains("axis 2 is out of range for rank 2"));
    assert!(err(x.repeat_interleave(0, 0)).contains("0 repeats"));
    let e = err(x.cat(g.input("z", DType::F32, &[4, 5]), 0));
    assert!(e.contains("`cat`") && e.contains("[4, 6]") && e.contains("[4, 5]") && e.contains("axis 0"), "{e}");
    assert!(err(g.concat(&[], 0)).contains("no tensors"));
    // An error carries on through later operations, and the graph reports it.
    let y = x.reshape(&[7]) + 1.0;
    assert!(matches!(y.check(), Err(GraphError::View { op: "reshape", .. })));
    assert!(g.output("y", y).is_err());
}

// ---------------------------------------------------------------------------------------
// Matrix products.

/// A graph of products of inputs (no other arithmetic): fused == unfused exactly (the same
/// kernel reads the same values, through strides or from a copy), and every element within
/// `bound` of the f64 product relative to the size of its terms (the graph evaluated on
/// the inputs' absolute values).
fn check_products(what: &str, g: &Graph, bound: f64) -> Plan {
    let Runs { fused, inputs, out, seed: s, .. } = fused_and_unfused(what, g);
    let exact = evaluate(g, &inputs, Rounding::None).unwrap();
    let abs: Vec<Vec<f64>> = inputs.iter().map(|x| x.iter().map(|v| v.abs()).collect()).collect();
    let terms = evaluate(g, &abs, Rounding::None).unwrap();
    for (k, ((o, r), t)) in out.iter().zip(&exact).zip(&terms).enumerate() {
        for i in 0..o.len() {
            assert!((o[i] - r[i]).abs() <= bound * t[i], "{what}: output {k} element {i}: {} vs f64 {} (terms {}, seed {s})\n{}", o[i], r[i], t[i], fused.partition());
        }
    }
    fused
}

/// `@` in graphs: batched, with a weight broadcast over the batch, a transposed operand
/// and two batch dimensions that do not merge (a `[B, T, H, D]` projection seen as
/// `[B, H, T, D]`), all read through strides by the library's batched matmul (one kernel
/// each, no copies); bf16 (f32 accumulation, rounded to bf16) and f32 (tf32).
#[test]
fn matmuls_read_transposes_and_broadcasts_through_strides() {
    let g = Graph::new();
    let x = g.input("x", DType::BF16, &[2, 3, 40, 24]);
    let w = g.input("w", DType::BF16, &[24, 16]);
    g.output("y", x.matmul(w)).unwrap();
    let q = g.input("q", DType::BF16, &[2, 33, 4, 16]); // [B, T, H, D]
    let k = g.input("k", DType::BF16, &[2, 33, 4, 16]);
    let (qh, kh) = (q.transpose(1, 2), k.transpose(1, 2)); // [B, H, T, D]
    g.output("s", qh.matmul(kh.transpose(-1, -2))).unwrap();
    let fused = check_products("bf16 products", &g, 2f64.powi(-8) + 1e-5);
    assert_eq!(fused.kernel_count(), 2, "{}", fused.partition());
    let g = Graph::new();
    let (a, b) = (g.input("a", DType::F32, &[3, 50, 70]), g.input("b", DType::F32, &[70, 30]));
    g.output("c", a.matmul(b.transpose(0, 1).transpose(0, 1))).unwrap();
    g.output("d", b.transpose(0, 1).matmul(a.transpose(1, 2))).unwrap(); // [30, 70] @ [3, 70, 50]
    let fused = check_products("tf32 products", &g, 2f64.powi(-9) + 2f64.powi(-20) + 1e-5);
    assert_eq!(fused.kernel_count(), 2, "{}", fused.partition());
}

/// Pointwise consumers of a product's shape are its epilogue, computed on the product's
/// tile in the product's kernel (the product stored only if something else reads it):
/// a linear layer's `relu(x w * 0.5 + b) + r` with the product and a sigmoid of it also
/// stored (bf16), and on a batched product of transposed operands a per-row scale, a
/// comparison and a SiLU plus a row input (f32, tf32). Fused == unfused exactly,
/// and within the error of the products' roundings of f64: bf16 rounds the product and
/// each epilogue node (its unit roundoff 2^-8 each, relative to the terms); tf32 truncates each input (2^-9
/// relative per term, against the terms' sum of up to K * 16), which an epilogue of slope
/// at most about 1 keeps. What cannot join stays apart: a reduction reads its operand
/// from memory (the product's kernel stores it), and a sum of two products of the same
/// stage runs after both.
#[test]
fn pointwise_consumers_of_a_product_are_its_epilogue() {
    let g = Graph::new();
    let (x, w) = (g.input("x", DType::BF16, &[2, 40, 24]), g.input("w", DType::BF16, &[24, 48]));
    let (bias, r) = (g.input("b", DType::BF16, &[48]), g.input("r", DType::BF16, &[2, 40, 48]));
    let p = x.matmul(w);
    g.output("y", (p * 0.5 + bias).relu() + r).unwrap();
    g.output("p", p).unwrap();
    g.output("s", p.sigmoid()).unwrap();
    let Runs { fused, inputs, out, seed: s, .. } = fused_and_unfused("linear epilogue", &g);
    assert_eq!(fused.kernel_count(), 1, "{}", fused.partition());
    assert!(fused.partition().to_string().contains("epilogue fused"), "{}", fused.partition());
    assert!(fused.partition().intermediates.is_empty(), "{}", fused.partition());
    // For comparisons, `Fusion::NoEpilogues`: the product (stored as the output `p` and
    // for the second kernel), then one kernel.
    let apart = kernels_lib::graph::fuse::partition(&g, kernels_lib::graph::fuse::Fusion::NoEpilogues).unwrap();
    assert_eq!((apart.groups.len(), apart.intermediates.len()), (2, 1), "{apart}");
    assert!(apart.groups[0].matmul.is_some() && apart.groups[0].nodes.len() == 1, "{apart}");
    let exact = evaluate(&g, &inputs, Rounding::None).unwrap();
    // y's terms: |x| |w| * 0.5 + |b| + |r| + 1 (each bf16 rounding of a value is within
    // 2^-8 of it, and the value within its terms).
    let t = Graph::new();
    let (tx, tw) = (t.input("x", DType::BF16, &[2, 40, 24]), t.input("w", DType::BF16, &[24, 48]));
    let (tb, tr) = (t.input("b", DType::BF16, &[48]), t.input("r", DType::BF16, &[2, 40, 48]));
    t.output("t", tx.matmul(tw) * 0.5 + tb + tr + 1.0).unwrap();
    let abs: Vec<Vec<f64>> = inputs.iter().map(|x| x.iter().map(|v| v.abs()).collect()).collect();
    let terms = evaluate(&t, &abs, Rounding::None).unwrap().remove(0);
    within_scale(&format!("linear epilogue: y (seed {s})"), &out[0], &exact[0], Some(&terms), 3.0 * U_BF16, &fused);
    within(&format!("linear epilogue (seed {s})"), &out[1..], &exact[1..], 2f64.powi(-7), &fused);

    let g = Graph::new();
    let (q, k) = (g.input("q", DType::F32, &[2, 33, 4, 16]), g.input("k", DType::F32, &[2, 33, 4, 16]));
    let c = g.input("c", DType::F32, &[2, 4, 33, 1]);
    let sc = q.transpose(1, 2).matmul(k.transpose(1, 2).transpose(-1, -2)); // [2, 4, 33, 33]
    g.output("e", (sc * c).gt(0.0).cast(DType::F32)).unwrap();
    g.output("f", sc * sc.sigmoid() + c).unwrap();
    let Runs { fused, inputs, out, seed: s, .. } = fused_and_unfused("batched epilogue", &g);
    assert_eq!(fused.kernel_count(), 1, "{}", fused.partition());
    let exact = evaluate(&g, &inputs, Rounding::None).unwrap();
    let terms = vec![1.0 + 16.0 * 16.0; exact[1].len()];
    within_scale(&format!("batched epilogue: f (seed {s})"), &out[1], &exact[1], Some(&terms), 1.2 * 2f64.powi(-9), &fused);
    // The mask: right wherever the product is not within its error of 0.
    let sc_exact: Vec<f64> = exact[1].iter().zip(&inputs[2].iter().flat_map(|&c| std::iter::repeat_n(c, 33)).collect::<Vec<_>>()).map(|(f, c)| f - c).collect();
    for (i, (&e, &f)) in out[0].iter().zip(&sc_exact).enumerate() {
        let p = f; // s * sigmoid(s): positive iff s is (away from 0)
        if p.abs() > 1.0 {
            assert_eq!(e, f64::from(u8::from(p * inputs[2][i / 33] > 0.0)), "mask element {i} (seed {s})");
        }
    }

    // A reduction reads the epilogue's result from memory (the product's kernel computes
    // `exp(p / 32 + 1)` and `relu(p)` and stores them); a sum of two products of one stage runs
    // after both (here with the reduction, over the same rows): 3 kernels.
    let g = Graph::new();
    let (a, b) = (g.input("a", DType::BF16, &[40, 24]), g.input("b", DType::BF16, &[24, 32]));
    let p = a.matmul(b);
    g.output("y", (p * 0.03125 + 1.0).exp().sum(-1)).unwrap();
    g.output("z", p.relu() + a.matmul(g.input("b2", DType::BF16, &[24, 32]))).unwrap();
    let Runs { fused, inputs, out, seed: s, .. } = fused_and_unfused("products apart", &g);
    assert_eq!(fused.kernel_count(), 3, "{}", fused.partition());
    assert_eq!(fused.partition().groups[0].nodes.len(), 7, "{}", fused.partition());
    let exact = evaluate(&g, &inputs, Rounding::None).unwrap();
    within(&format!("products apart (seed {s})"), &out[..1], &exact[..1], 2e-2, &fused);
    // z's terms: |a| |b| + |a| |b2| + 1; three bf16 roundings.
    let t = Graph::new();
    let ta = t.input("a", DType::BF16, &[40, 24]);
    t.output("t", ta.matmul(t.input("b", DType::BF16, &[24, 32])) + ta.matmul(t.input("b2", DType::BF16, &[24, 32])) + 1.0).unwrap();
    let abs: Vec<Vec<f64>> = inputs.iter().map(|x| x.iter().map(|v| v.abs()).collect()).collect();
    let terms = evaluate(&t, &abs, Rounding::None).unwrap().remove(0);
    within_scale(&format!("products apart: z (seed {s})"), &out[1], &exact[1], Some(&terms), 3.0 * U_BF16, &fused);
}

/// Computed operands are a product's prologue: evaluated on each tile as the product's
/// kernel loads it, from the buffers under them (a cast, a scale, `exp`, through
/// permutations: a batched, transposed operand), never stored. The K tail of a tile holds zeros
/// after the prologue (K = 40 is not a multiple of BK; `x / 4 + 1` and `exp(w / 4 + 1)`
/// of the masked loads' zeros are 1 and e, whose product would be added otherwise).
/// An operand from another space (a softmax's result) is read from memory as before, and
/// so is a computed operand behind a view that moves elements (a `repeat_interleave`: it
/// would divide per element in the main loop), or under a product above
/// `MAX_PROLOGUE_FLOPS` (compute-bound: stored first, its copy asynchronous).
/// Fused == unfused exactly, both within the products' error of f64.
#[test]
fn computed_operands_are_a_products_prologue() {
    let g = Graph::new();
    let (x, w) = (g.input("x", DType::F32, &[50, 40]), g.input("w", DType::BF16, &[40, 24]));
    // x / 4 + 1 cast to bf16 as it is loaded; exp(w / 4 + 1) on the other side (both
    // nonzero where their loads are masked).
    g.output("p", (x * 0.25 + 1.0).cast(DType::BF16).matmul(((w * 0.25) + 1.0).exp())).unwrap();
    // A batched, scaled query, and a repeated key head (stored first): [2, 4, 33, 16] @
    // [2, 4, 16, 33].
    let (q, k) = (g.input("q", DType::BF16, &[2, 4, 33, 16]), g.input("k", DType::BF16, &[2, 2, 33, 16]));
    g.output("s", (q * 0.5).matmul(k.repeat_interleave(2, 1).transpose(-1, -2))).unwrap();
    // Too large a product (2^33 flops): its scaled operand is stored first.
    let h = Graph::new();
    let (ha, hb) = (h.input("a", DType::BF16, &[4096, 1024]), h.input("b", DType::BF16, &[1024, 1024]));
    h.output("c", (ha * 0.5).matmul(hb)).unwrap();
    let big = kernels_lib::graph::fuse::partition(&h, kernels_lib::graph::fuse::Fusion::On).unwrap();
    assert_eq!(big.groups.len(), 2, "{big}");
    const { assert!(2 * 4096 * 1024 * 1024 > kernels_lib::graph::fuse::MAX_PROLOGUE_FLOPS) };
    // A softmax's result: stored by its kernel, read through strides.
    g.output("t", g.input("a", DType::BF16, &[50, 40]).softmax(-1).matmul(w)).unwrap();
    let Runs { fused, inputs, out, seed: s, .. } = fused_and_unfused("prologues", &g);
    let p = fused.partition();
    assert_eq!(fused.kernel_count(), 5, "{p}");
    let prologues: Vec<[bool; 2]> = p.groups.iter().filter(|gr| gr.matmul.is_some()).map(|gr| gr.prologue).collect();
    assert_eq!(prologues, [[true, true], [true, false], [false, false]], "{p}");
    assert_eq!(p.intermediates.len(), 2, "the repeated head and the softmax are stored: {p}");
    // A loose check of every output relative to 1 + |x| (bf16 roundings of terms of up to
    // 2 x e^2 and 2 x 4), then p's against its terms: bf16 rounding of each operand
    // element (2^-8; exp's own error is smaller), of the product, and f32 sums.
    within(&format!("prologues (seed {s})"), &out, &evaluate(&g, &inputs, Rounding::None).unwrap(), 0.5, &fused);
    let exact = evaluate(&g, &inputs, Rounding::None).unwrap();
    let t = Graph::new();
    let (tx, tw) = (t.input("x", DType::F32, &[50, 40]), t.input("w", DType::BF16, &[40, 24]));
    t.output("p", (tx * 0.25 + 1.0).matmul(((tw * 0.25) + 1.0).exp())).unwrap();
    let abs: Vec<Vec<f64>> = inputs[..2].iter().map(|x| x.iter().map(|v| v.abs()).collect()).collect();
    let terms = evaluate(&t, &abs, Rounding::None).unwrap().remove(0);
    // (|x / 4 + 1| <= |x| / 4 + 1: the terms graph on |x| bounds each term.)
    within_scale(&format!("prologues: p (seed {s})"), &out[0], &exact[0], Some(&terms), 4.0 * U_BF16, &fused);
}

/// Every intermediate a group loads is stored by a group launched before it.
fn loads_follow_stores(p: &kernels_lib::graph::fuse::Partition) {
    use kernels_lib::graph::fuse::{Dest, Source};
    for (i, gr) in p.groups.iter().enumerate() {
        for (id, src) in &gr.loads {
            if let Source::Intermediate(k) = src {
                let before = p.groups[..i].iter().any(|w| w.stores.iter().any(|s| s.1 == Dest::Intermediate(*k)));
                assert!(before, "kernel {i} loads {id} (intermediate {k}) before a kernel stores it:\n{p}");
            }
        }
    }
}

/// A value stored for a reader processed after the groups that already compute it (a
/// product reading it through a reshape, or a product too large for a prologue) is
/// recomputed by those groups, not loaded before it is written: each intermediate is
/// stored by an earlier kernel.
#[test]
fn values_stored_for_later_readers_are_not_read_before_they_are_written() {
    // `a` read by a flat kernel, then stored for a product that reads it reshaped.
    let g = Graph::new();
    let a = g.input("x", DType::F32, &[40, 24]) * 0.5;
    g.output("y", a.slice(0, 0, 8) + 1.0).unwrap();
    g.output("p", a.reshape(&[24, 40]).transpose(0, 1).matmul(g.input("w", DType::F32, &[24, 16]))).unwrap();
    let Runs { fused, .. } = fused_and_unfused("a value stored for a later reader", &g);
    loads_follow_stores(fused.partition());
    // `a` a small product's prologue, then stored for a product too large for one
    // (partitioned only: the large product is not run on the interpreter).
    let g = Graph::new();
    let a = g.input("x", DType::BF16, &[4096, 1024]) * 0.5;
    g.output("small", a.matmul(g.input("w3", DType::BF16, &[1024, 16]))).unwrap();
    g.output("large", a.matmul(g.input("w2", DType::BF16, &[1024, 1024]))).unwrap();
    let p = kernels_lib::graph::fuse::partition(&g, kernels_lib::graph::fuse::Fusion::On).unwrap();
    loads_follow_stores(&p);
    assert_eq!(p.groups.iter().filter_map(|gr| gr.matmul.map(|_| gr.prologue)).collect::<Vec<_>>(), [[true, false], [false, false]], "{p}");
}

/// Operands that are computed, or views that are not strides (`repeat_interleave`), are
/// stored by their own kernels first and read back; a product read by later operations is
/// stored too. The seed's attention math, written the PyTorch way (projections, `view`,
/// `transpose`, `repeat_interleave`, scores divided by `sqrt(d)`, softmax, `@ v`,
/// `transpose`, `reshape`, output projection), against the f64 reference.
#[test]
fn the_seed_attention_block_runs_unfused_through_matmuls() {
    let g = Graph::new();
    let (b, t, dm, h, kv, hd) = (2, 24, 32, 4, 2, 8);
    // Inputs are uniform in [-4, 4): scaled in the graph (computed operands, stored by
    // their kernels first) to unit-size activations and 1 / sqrt(fan-in) weights, so that
    // the scores stay of order one and the check measures the kernels, not tf32 on
    // saturated softmaxes.
    let w = 0.25 / (dm as f64).sqrt();
    let x = g.input("x", DType::F32, &[b, t, dm]) * 0.25;
    let wq = g.input("wq", DType::F32, &[dm, h * hd]) * w;
    let wk = g.input("wk", DType::F32, &[dm, kv * hd]) * w;
    let wv = g.input("wv", DType::F32, &[dm, kv * hd]) * w;
    let wo = g.input("wo", DType::F32, &[h * hd, dm]) * (0.25 / ((h * hd) as f64).sqrt());
    let q = x.matmul(wq).reshape(&[b, t, h, hd]).transpose(1, 2);
    let k = x.matmul(wk).reshape(&[b, t, kv, hd]).transpose(1, 2).repeat_interleave(h / kv, 1);
    let v = x.matmul(wv).reshape(&[b, t, kv, hd]).transpose(1, 2).repeat_interleave(h / kv, 1);
    let s = q.matmul(k.transpose(-1, -2)) / (hd as f64).sqrt();
    let o = s.softmax(-1).matmul(v).transpose(1, 2).reshape(&[b, t, h * hd]);
    g.output("y", o.matmul(wo)).unwrap();
    let fused = check_reduction("seed attention", &g, 1e-2);
    let matmuls = fused.partition().groups.iter().filter(|gr| gr.matmul.is_some()).count();
    assert_eq!(matmuls, 6, "{}", fused.partition());
    // The GPU gallery's graph of products.
    let g = Graph::new();
    gallery(&g, 5);
    check_reduction("gallery 5", &g, 1e-2);
}

/// The seed's attention block written the PyTorch way, at head dim `hd` in `dtype`.
/// Returns the output and the five inputs (`x`, `wq`, `wk`, `wv`, `wo`).
pub(crate) fn seed_block<'g>(g: &'g Graph, dtype: DType, (b, t, dm, h, kv, hd): (usize, usize, usize, usize, usize, usize)) -> (Tensor<'g>, [Tensor<'g>; 5]) {
    // Inputs uniform in [-4, 4), scaled to unit activations and 1 / sqrt(fan-in) weights.
    let w = 0.25 / (dm as f64).sqrt();
    let ins = [
        g.input("x", dtype, &[b, t, dm]),
        g.input("wq", dtype, &[dm, h * hd]),
        g.input("wk", dtype, &[dm, kv * hd]),
        g.input("wv", dtype, &[dm, kv * hd]),
        g.input("wo", dtype, &[h * hd, dm]),
    ];
    let x = ins[0] * 0.25;
    let (wq, wk, wv) = (ins[1] * w, ins[2] * w, ins[3] * w);
    let wo = ins[4] * (0.25 / ((h * hd) as f64).sqrt());
    let q = x.matmul(wq).reshape(&[b, t, h, hd]).transpose(1, 2);
    let k = x.matmul(wk).reshape(&[b, t, kv, hd]).transpose(1, 2).repeat_interleave(h / kv, 1);
    let v = x.matmul(wv).reshape(&[b, t, kv, hd]).transpose(1, 2).repeat_interleave(h / kv, 1);
    let s = q.matmul(k.transpose(-1, -2)) / (hd as f64).sqrt();
    let o = s.softmax(-1).matmul(v).transpose(1, 2).reshape(&[b, t, h * hd]);
    let y = o.matmul(wo);
    g.output("y", y).unwrap();
    (y, ins)
}

/// Fused and unfused, each against the f64 reference (relative to 1 + |x|): the fused
/// plan's attention computes the softmax in f32 from unrounded scores, the unfused one
/// from scores rounded to the element type, so they differ by rounding, not exactly.
fn check_both(what: &str, g: &Graph, bound: f64) -> Plan {
    let rt = Runtime::interpreter();
    let s = seed();
    let inputs = inputs_for(g, s);
    let exact = evaluate(g, &inputs, Rounding::None).unwrap();
    let mut fused = g.compile(&rt).unwrap();
    for (name, plan) in [("fused", &mut fused), ("unfused", &mut g.compile_with(&rt, &Options::unfused()).unwrap())] {
        let out = run(plan, g, &rt, &inputs);
        within(&format!("{what} {name} (seed {s})"), &out, &exact, bound, plan);
    }
    fused
}

/// The seed's block through the fuser: its attention (`repeat_interleave` GQA, scores
/// divided by `sqrt(d)`, softmax, `@ v`) is one flash-attention launch reading q, k and v
/// straight from the projections' outputs through strides (no copy of the repeated heads,
/// no score matrix in memory); the projections are four matmuls; nothing else.
#[test]
fn the_seed_attention_block_is_one_flash_attention_launch() {
    for dtype in [DType::F32, DType::BF16] {
        let g = Graph::new();
        let dims = (2, 40, 32, 4, 2, 16);
        seed_block(&g, dtype, dims);
        let bound = if dtype == DType::F32 { 1e-2 } else { 4e-2 };
        let fused = check_both(&format!("seed block {dtype}"), &g, bound);
        let p = fused.partition();
        let attn: Vec<_> = p.groups.iter().filter_map(|gr| gr.attention).collect();
        assert_eq!(attn.len(), 1, "{p}");
        assert_eq!((attn[0].group, attn[0].scale()), (2, 0.25), "{p}");
        assert_eq!(p.groups.iter().filter(|gr| gr.matmul.is_some()).count(), 4, "{p}");
        // Four products (each computing its scaled operands as it loads them: a prologue),
        // the attention, which writes its result as `.transpose(1, 2)` ([B, T, H, D]) so
        // that the reshape before the output projection reads it in place: nothing copied,
        // no intermediate of the scores' size.
        assert_eq!(fused.kernel_count(), 5, "{p}");
        assert_eq!(p.groups.iter().filter(|gr| gr.prologue == [true, true]).count(), 3, "{p}");
        let a = p.groups.iter().find(|gr| gr.attention.is_some()).expect("the attention");
        assert!(matches!(g.node(a.stores[0].0).op, kernels_lib::graph::Op::View(kernels_lib::graph::View::Permute(_), _)), "{p}");
        let nodes = g.nodes();
        assert!(p.intermediates.iter().all(|id| nodes[id.index()].numel() < 2 * 4 * 40 * 40), "{p}");
    }
    // The GPU gallery's graph: the block in bf16, an f16 multi-query attention and a causal
    // bf16 GQA attention, and the same under a sliding window, a mask and a bias from data,
    // the window over the mask, with a bias per head, and with the query heads grouped.
    let g = Graph::new();
    gallery(&g, 6);
    let fused = check_both("gallery 6", &g, 4e-2);
    let p = fused.partition();
    assert_eq!(p.groups.iter().filter(|gr| gr.attention.is_some()).count(), 9, "{p}");
    assert_eq!(p.groups.iter().filter(|gr| gr.attention.is_some_and(|a| a.causal)).count(), 4, "{p}");
    assert_eq!(p.groups.iter().filter(|gr| gr.attention.is_some_and(|a| a.data.is_some())).count(), 4, "{p}");
    assert_eq!(p.groups.iter().filter(|gr| gr.attention.is_some_and(|a| a.window == Some(16))).count(), 2, "{p}");
}

/// Surface variants of one attention (50: scales, GQA spellings (the query heads grouped
/// among them), layouts, types, causal masks written four ways, soft-capped scores, other
/// operations on the scores (compiled into the kernel's hook), sliding windows written
/// three ways, masks and biases from data written eleven ways, per head among them, a
/// soft-cap or other operations followed by a window or data, a window over data, with
/// and without a soft-cap, in the hook, a negative scale before operations or a soft-cap)
/// that must all become one flash-attention launch, and near misses (13) that must not
/// (the dump says why).
#[test]
fn attention_is_recognised_however_it_is_written() {
    // Inputs q, k, v of `dtype` and the shapes given (k and v alike); q is scaled (the
    // inputs are uniform in [-4, 4)) so that the scores stay of order one and the check
    // measures the kernels, not tf32 on saturated softmaxes.
    fn qkv<'g>(g: &'g Graph, dtype: DType, q: &[usize], kv: &[usize]) -> (Tensor<'g>, Tensor<'g>, Tensor<'g>) {
        (g.input("q", dtype, q) * 0.0625, g.input("k", dtype, kv), g.input("v", dtype, kv))
    }
    // Each variant builds its outputs from its inputs.
    type Build = fn(&Graph) -> ();
    let variants: Vec<(&str, Build, bool)> = vec![
        ("mul by 1/sqrt(d)", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("div by sqrt(d)", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            g.output("o", (q.matmul(k.transpose(-1, -2)) / 4.0).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("no scale", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            g.output("o", q.matmul(k.transpose(-1, -2)).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("GQA by repeat_interleave", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            g.output("o", (q.matmul(k.repeat_interleave(2, 1).transpose(-1, -2)) * 0.25).softmax(-1).matmul(v.repeat_interleave(2, 1))).unwrap();
        }, true),
        ("GQA by expand + reshape (Hugging Face's repeat_kv)", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            let (k, v) = [k, v].map(|x| x.reshape(&[2, 2, 1, 33, 16]).expand(&[2, 2, 2, 33, 16]).reshape(&[2, 4, 33, 16])).into();
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("multi-query (one key/value head)", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 1, 33, 16]);
            g.output("o", (q.matmul(k.repeat_interleave(4, 1).transpose(-1, -2)) * 0.25).softmax(-1).matmul(v.repeat_interleave(4, 1))).unwrap();
        }, true),
        ("heads from a [B, T, H, D] projection", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 33, 4, 16], &[2, 33, 2, 16]);
            let (q, k, v) = (q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(2, 1), v.transpose(1, 2).repeat_interleave(2, 1));
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v).transpose(1, 2).reshape(&[2, 33, 64])).unwrap();
        }, true),
        ("k^T by permute", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            g.output("o", (q.matmul(k.permute(&[0, 1, 3, 2])) * 0.25).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("bf16, softmax in f32", |g| {
            let (q, k, v) = qkv(g, DType::BF16, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("one head [B, T, D]", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 33, 16], &[2, 33, 16]);
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("computed q (scaled first)", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            g.output("o", ((q * 0.5).matmul(k.transpose(-1, -2)) * 0.5).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("f16", |g| {
            let (q, k, v) = qkv(g, DType::F16, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            g.output("o", (q.matmul(k.transpose(-1, -2)) / 4.0).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("GQA by grouping the query heads: q [B, H, T, D] viewed [B, KV, G, T, D], k and v unsqueezed [B, KV, 1, T, D]", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            let (q, k, v) = (q.reshape(&[2, 2, 2, 33, 16]), k.reshape(&[2, 2, 1, 33, 16]), v.reshape(&[2, 2, 1, 33, 16]));
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v).reshape(&[2, 4, 33, 16])).unwrap();
        }, true),
        ("GQA by grouping the query heads, k and v expanded to [B, KV, G, T, D], causal, bf16", |g| {
            let (q, k, v) = qkv(g, DType::BF16, &[2, 4, 33, 16], &[2, 1, 33, 16]);
            let (k, v) = (k.reshape(&[2, 1, 1, 33, 16]).expand(&[2, 1, 4, 33, 16]), v.reshape(&[2, 1, 1, 33, 16]).expand(&[2, 1, 4, 33, 16]));
            let s = g.tril(33, 33, 0).where_(q.reshape(&[2, 1, 4, 33, 16]).matmul(k.transpose(-1, -2)) / 4.0, f64::NEG_INFINITY);
            g.output("o", s.softmax(-1).matmul(v)).unwrap();
        }, true),
        ("GQA by grouping the query heads, with a key padding mask from data [B, 1, 1, 1, T], key 0 kept", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            let (q, k, v) = (q.reshape(&[2, 2, 2, 33, 16]), k.reshape(&[2, 2, 1, 33, 16]), v.reshape(&[2, 2, 1, 33, 16]));
            let keep = g.input("keep", DType::F32, &[2, 1, 1, 1, 33]).gt(-3.5).cast(DType::F32).maximum(g.tril(1, 33, 0).cast(DType::F32)).gt(0.5);
            g.output("o", keep.where_(q.matmul(k.transpose(-1, -2)) * 0.25, f64::NEG_INFINITY).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("GQA by grouping the query heads, a bias from data per head [B, KV, G, T, T]: near miss", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            let (q, k, v) = (q.reshape(&[2, 2, 2, 33, 16]), k.reshape(&[2, 2, 1, 33, 16]), v.reshape(&[2, 2, 1, 33, 16]));
            let bias = g.input("bias", DType::F32, &[2, 2, 2, 33, 33]);
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25 + bias).softmax(-1).matmul(v)).unwrap();
        }, false),
        // (Unfused, the products' batch dimensions [B, G, KV], k broadcast along G, are three
        // that do not merge: the batched matmul's grid takes them.)
        ("query heads grouped the other way round ([B, G, KV, T, D] against k [B, 1, KV, T, D]: head h reads k head h % KV): near miss", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            let (q, k, v) = (q.reshape(&[2, 2, 2, 33, 16]), k.reshape(&[2, 1, 2, 33, 16]), v.reshape(&[2, 1, 2, 33, 16]));
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v)).unwrap();
        }, false),
        ("multi-query by expand", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 1, 33, 16]);
            let (k, v) = (k.expand(&[2, 4, 33, 16]), v.expand(&[2, 4, 33, 16]));
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("causal: where(tril, s, -inf) after the scale", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = q.matmul(k.transpose(-1, -2)) * 0.25;
            g.output("o", g.tril(33, 33, 0).where_(s, f64::NEG_INFINITY).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("causal, masked_fill spelling: where(tril == 0, -inf, s), mask [1, 1, T, T], GQA", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            let s = q.matmul(k.repeat_interleave(2, 1).transpose(-1, -2)) / 4.0;
            let mask = g.tril(33, 33, 0).cast(DType::F32).reshape(&[1, 1, 33, 33]); // torch.tril(torch.ones(T, T))
            g.output("o", mask.eq_(0.0).where_(f64::NEG_INFINITY, s).softmax(-1).matmul(v.repeat_interleave(2, 1))).unwrap();
        }, true),
        ("causal by an additive bias where(tril, 0, -inf)", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let bias = g.tril(33, 33, 0).where_(0.0, f64::NEG_INFINITY);
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25 + bias).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("causal, masked before the scale, bf16", |g| {
            let (q, k, v) = qkv(g, DType::BF16, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = g.tril(33, 33, 0).where_(q.matmul(k.transpose(-1, -2)), f64::NEG_INFINITY);
            g.output("o", (s * 0.25).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("soft-capped scores (Gemma 2): tanh(s / cap) * cap", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = q.matmul(k.transpose(-1, -2)) * 0.25;
            g.output("o", ((s / 0.5).tanh() * 0.5).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("soft-capped, then causal, GQA, bf16: cap * tanh(s * (1 / cap))", |g| {
            let (q, k, v) = qkv(g, DType::BF16, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            let s = q.matmul(k.repeat_interleave(2, 1).transpose(-1, -2)) / 4.0;
            let capped = (s * 2.0).tanh() * 0.5;
            g.output("o", g.tril(33, 33, 0).where_(capped, f64::NEG_INFINITY).softmax(-1).matmul(v.repeat_interleave(2, 1))).unwrap();
        }, true),
        ("sliding window of 8: where(band == 0, -inf, s), band = tril(0) - tril(-8) of 0/1 floats, GQA", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            let s = q.matmul(k.repeat_interleave(2, 1).transpose(-1, -2)) * 0.25;
            let band = g.tril(33, 33, 0).cast(DType::F32) - g.tril(33, 33, -8).cast(DType::F32);
            g.output("o", band.eq_(0.0).where_(f64::NEG_INFINITY, s).softmax(-1).matmul(v.repeat_interleave(2, 1))).unwrap();
        }, true),
        ("sliding window of 8, where(band > 0, s, -inf) on a [1, 1, T, T] band, bf16", |g| {
            let (q, k, v) = qkv(g, DType::BF16, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = q.matmul(k.transpose(-1, -2)) / 4.0;
            let band = (g.tril(33, 33, 0).cast(DType::BF16) - g.tril(33, 33, -8).cast(DType::BF16)).reshape(&[1, 1, 33, 33]);
            g.output("o", band.gt(0.0).where_(s, f64::NEG_INFINITY).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("sliding window of 8 as an additive bias where(band != 0, 0, -inf), masked before the scale", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let band = g.tril(33, 33, 0).cast(DType::F32) - g.tril(33, 33, -8).cast(DType::F32);
            let bias = band.ne_(0.0).where_(0.0, f64::NEG_INFINITY);
            g.output("o", ((q.matmul(k.transpose(-1, -2)) + bias) * 0.25).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("tanh(s) * 2, no soft-cap (the cap is not the divisor): other operations on the scores, in the hook", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = q.matmul(k.transpose(-1, -2)) * 0.25;
            g.output("o", (s.tanh() * 2.0).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("other operations on the scores: a temperature and an offset, (s * 0.25 + 1) / 0.7, causal, GQA, in the hook", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            let s = (q.matmul(k.repeat_interleave(2, 1).transpose(-1, -2)) * 0.25 + 1.0) / 0.7;
            g.output("o", g.tril(33, 33, 0).where_(s, f64::NEG_INFINITY).softmax(-1).matmul(v.repeat_interleave(2, 1))).unwrap();
        }, true),
        ("other operations on the scores: 8 * sigmoid(s) - 4 and a clamp max(s, -1), bf16 scores cast to f32 and back, in the hook", |g| {
            let (q, k, v) = qkv(g, DType::BF16, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = (q.matmul(k.transpose(-1, -2)) / 4.0).cast(DType::F32);
            let s = (s.sigmoid() * 8.0 - 4.0).maximum(-1.0).cast(DType::BF16);
            g.output("o", s.softmax(-1).matmul(v)).unwrap();
        }, true),
        ("a bias from data [B, 1, T, T] after other operations on the scores, both in the hook", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let bias = g.input("bias", DType::F32, &[2, 1, 33, 33]);
            g.output("o", ((q.matmul(k.transpose(-1, -2)) * 0.25).tanh() * 2.0 + bias).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("a key padding mask from data [B, 1, 1, T] after other operations on the scores, causal, GQA, bf16, both in the hook", |g| {
            let (q, k, v) = qkv(g, DType::BF16, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            // (Key 0 kept: causal, the first query sees only it; a query with no key is NaN
            // in f64, as softmax of nothing, and failed one run in about eight.)
            let keep = g.input("keep", DType::BF16, &[2, 1, 1, 33]).gt(-3.5).cast(DType::F32).maximum(g.tril(1, 33, 0).cast(DType::F32)).gt(0.5);
            let s = (q.matmul(k.repeat_interleave(2, 1).transpose(-1, -2)) * 0.25).sigmoid() * 8.0;
            let s = g.tril(33, 33, 0).where_(keep.where_(s, f64::NEG_INFINITY), f64::NEG_INFINITY);
            g.output("o", s.softmax(-1).matmul(v.repeat_interleave(2, 1))).unwrap();
        }, true),
        ("sqrt(relu(s)) (a derivative unbounded at 0, where the graph's gradient selects 0): near miss", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = (q.matmul(k.transpose(-1, -2)) * 0.25).relu().unary(kernels_lib::graph::UnaryOp::Sqrt);
            g.output("o", s.softmax(-1).matmul(v)).unwrap();
        }, false),
        ("a bias from data computed from another product through operations, tanh(x @ x^T / 100)", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let x = g.input("x", DType::F32, &[2, 4, 33, 16]);
            let bias = (x.matmul(x.transpose(-1, -2)) * 0.01).tanh();
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25 + bias).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("masked before other operations on the scores (sigmoid(-inf) is 0, not -inf): near miss", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = g.tril(33, 33, 0).where_(q.matmul(k.transpose(-1, -2)) * 0.25, f64::NEG_INFINITY);
            g.output("o", (s.sigmoid() * 4.0).softmax(-1).matmul(v)).unwrap();
        }, false),
        ("sliding window of 8 after a soft-cap (Gemma 2's local layers), both in the hook", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = q.matmul(k.transpose(-1, -2)) * 0.25;
            let band = g.tril(33, 33, 0).cast(DType::F32) - g.tril(33, 33, -8).cast(DType::F32);
            g.output("o", band.eq_(0.0).where_(f64::NEG_INFINITY, (s / 0.5).tanh() * 0.5).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("sliding window of 8 after other operations on the scores (relu(s) - 1), both in the hook", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = (q.matmul(k.transpose(-1, -2)) * 0.25).relu() - 1.0;
            let band = g.tril(33, 33, 0).cast(DType::F32) - g.tril(33, 33, -8).cast(DType::F32);
            g.output("o", band.eq_(0.0).where_(f64::NEG_INFINITY, s).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("a band above the diagonal (tril(1) - tril(-8)), a mask from data", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = q.matmul(k.transpose(-1, -2)) * 0.25;
            let band = g.tril(33, 33, 1).cast(DType::F32) - g.tril(33, 33, -8).cast(DType::F32);
            g.output("o", band.eq_(0.0).where_(f64::NEG_INFINITY, s).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("masked before the scale, then soft-capped (tanh(-inf) is -1, not -inf): near miss", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = g.tril(33, 33, 0).where_(q.matmul(k.transpose(-1, -2)), f64::NEG_INFINITY) * 0.25;
            g.output("o", ((s / 0.5).tanh() * 0.5).softmax(-1).matmul(v)).unwrap();
        }, false),
        ("a tril reshaped across its axes (mask[b, h, i, j] = j <= b), a mask from data", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[33, 1, 33, 16], &[33, 1, 33, 16]);
            let s = q.matmul(k.transpose(-1, -2)) * 0.25;
            let mask = g.tril(33, 33, 0).reshape(&[33, 1, 1, 33]);
            g.output("o", mask.where_(s, f64::NEG_INFINITY).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("a mask with another diagonal (tril(1)), a mask from data", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = q.matmul(k.transpose(-1, -2)) * 0.25;
            g.output("o", g.tril(33, 33, 1).where_(s, f64::NEG_INFINITY).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("f32 scores of bf16 inputs, bf16 probabilities: near miss", |g| {
            let (q, k, v) = qkv(g, DType::BF16, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = q.cast(DType::F32).matmul(k.cast(DType::F32).transpose(-1, -2)) * 0.25;
            g.output("o", s.softmax(-1).cast(DType::BF16).matmul(v)).unwrap();
        }, false),
        ("head dim 8: near miss", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 8], &[2, 4, 33, 8]);
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v)).unwrap();
        }, false),
        ("scores masked by their values: near miss", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = q.matmul(k.transpose(-1, -2)) * 0.25;
            g.output("o", s.gt(0.0).where_(s, s * 0.5).softmax(-1).matmul(v)).unwrap(); // continuous at 0
        }, false),
        ("a negative scale before other operations on the scores (sigmoid(s * -0.25) * 4), its sign in the hook", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            g.output("o", ((q.matmul(k.transpose(-1, -2)) * -0.25).sigmoid() * 4.0).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("a negative scale before a soft-cap, its sign in the hook", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            g.output("o", ((q.matmul(k.transpose(-1, -2)) * -0.25 / 0.5).tanh() * 0.5).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("a negative scale: near miss", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            g.output("o", (q.matmul(k.transpose(-1, -2)) * -0.25).softmax(-1).matmul(v)).unwrap();
        }, false),
        ("a bias from data [B, 1, T, T] added to the scores", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let bias = g.input("bias", DType::F32, &[2, 1, 33, 33]);
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25 + bias).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("a key padding mask from data [B, 1, 1, T] (where(keep > 0.5, s, -inf)), GQA", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            let keep = g.input("keep", DType::F32, &[2, 1, 1, 33]).gt(-3.5);
            let s = q.matmul(k.repeat_interleave(2, 1).transpose(-1, -2)) * 0.25;
            g.output("o", keep.where_(s, f64::NEG_INFINITY).softmax(-1).matmul(v.repeat_interleave(2, 1))).unwrap();
        }, true),
        ("a bias from data [T, T] added before the scale, bf16 scores, f32 bias", |g| {
            let (q, k, v) = qkv(g, DType::BF16, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let bias = g.input("bias", DType::F32, &[33, 33]);
            g.output("o", ((q.matmul(k.transpose(-1, -2)) + bias) / 4.0).softmax(-1).cast(DType::BF16).matmul(v)).unwrap();
        }, true),
        ("causal, then a 0/1 padding mask from data [B, T] viewed [B, 1, 1, T] (masked_fill(pad == 0, -inf)), key 0 kept", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            // (Key 0 never padded, `maximum` with tril(1, T, 0): the first query, which sees
            // only it, keeps a key; a row with none is NaN as written, zeros in the kernel.)
            let pad = g.input("pad", DType::F32, &[2, 33]).lt(3.5).cast(DType::F32).maximum(g.tril(1, 33, 0).cast(DType::F32)).reshape(&[2, 1, 1, 33]);
            let s = g.tril(33, 33, 0).where_(q.matmul(k.transpose(-1, -2)) * 0.25, f64::NEG_INFINITY);
            g.output("o", pad.eq_(0.0).where_(f64::NEG_INFINITY, s).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("a bias from data per (batch, query) on one head [B, T, D], additive where(mask, 0, -inf) of data", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 33, 16], &[2, 33, 16]);
            let bias = g.input("m", DType::F32, &[2, 33, 33]).lt(3.0).where_(0.0, f64::NEG_INFINITY);
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25 + bias).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("a bias from data per head [B, H, T, T], GQA", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            let (k, v) = (k.repeat_interleave(2, 1), v.repeat_interleave(2, 1));
            let bias = g.input("bias", DType::F32, &[2, 4, 33, 33]);
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25 + bias).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("ALiBi from data: slopes [1, H, 1, 1] times distances [T, T] (a bias per head computed, shared by the batches)", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let slopes = g.input("slopes", DType::F32, &[1, 4, 1, 1]);
            let distance = g.input("distance", DType::F32, &[33, 33]);
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25 + slopes * distance).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("a padding mask from data per head [B, H, 1, T] (where(keep, s, -inf)), key 0 kept", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let keep = g.input("keep", DType::F32, &[2, 4, 1, 33]).gt(-3.5).cast(DType::F32).maximum(g.tril(1, 33, 0).cast(DType::F32)).gt(0.5);
            g.output("o", keep.where_(q.matmul(k.transpose(-1, -2)) * 0.25, f64::NEG_INFINITY).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("a bias from data [B, 1, T, T] after a soft-cap, both in the hook", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let bias = g.input("bias", DType::F32, &[2, 1, 33, 33]);
            let s = q.matmul(k.transpose(-1, -2)) * 0.25;
            g.output("o", ((s / 0.5).tanh() * 0.5 + bias).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("sliding window of 8 under a key padding mask from data (Mistral's padded batches), both in the hook", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            // (Key 0 never hidden: the first query sees only it, and a query with no key is
            // NaN in f64, softmax of nothing.)
            let keep = g.input("keep", DType::F32, &[2, 1, 1, 33]).gt(-3.5).cast(DType::F32).maximum(g.tril(1, 33, 0).cast(DType::F32)).gt(0.5);
            let s = q.matmul(k.transpose(-1, -2)) * 0.25;
            let band = g.tril(33, 33, 0).cast(DType::F32) - g.tril(33, 33, -8).cast(DType::F32);
            g.output("o", keep.where_(band.eq_(0.0).where_(f64::NEG_INFINITY, s), f64::NEG_INFINITY).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("sliding window of 8 over a bias from data per head [1, H, T, T], added before the scale, both in the hook", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 2, 33, 16]);
            let bias = g.input("bias", DType::F32, &[1, 4, 33, 33]);
            let s = q.matmul(k.repeat_interleave(2, 1).transpose(-1, -2)) + bias;
            let band = g.tril(33, 33, 0).cast(DType::F32) - g.tril(33, 33, -8).cast(DType::F32);
            g.output("o", (band.gt(0.0).where_(s, f64::NEG_INFINITY) * 0.25).softmax(-1).matmul(v.repeat_interleave(2, 1))).unwrap();
        }, true),
        ("sliding window of 8 after a soft-cap, under a key padding mask from data, all in the hook", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let keep = g.input("keep", DType::F32, &[2, 1, 1, 33]).gt(-3.5).cast(DType::F32).maximum(g.tril(1, 33, 0).cast(DType::F32)).gt(0.5);
            let s = (q.matmul(k.transpose(-1, -2)) * 0.25 / 0.5).tanh() * 0.5;
            let band = g.tril(33, 33, 0).cast(DType::F32) - g.tril(33, 33, -8).cast(DType::F32);
            g.output("o", band.eq_(0.0).where_(f64::NEG_INFINITY, keep.where_(s, f64::NEG_INFINITY)).softmax(-1).matmul(v)).unwrap();
        }, true),
        ("a mask from data computed from the scores (where(s > -1e6, s, -inf)): near miss", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let s = q.matmul(k.transpose(-1, -2)) * 0.25;
            // (A threshold far from every score: tf32 products and f64 agree on the mask.)
            g.output("o", s.gt(-1e6).where_(s, f64::NEG_INFINITY).softmax(-1).matmul(v)).unwrap();
        }, false),
        ("two biases from data added (one a kernel): near miss", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let (b1, b2) = (g.input("b1", DType::F32, &[2, 1, 33, 33]), g.input("b2", DType::F32, &[33, 33]));
            g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25 + b1 + b2).softmax(-1).matmul(v)).unwrap();
        }, false),
        ("masked with a finite fill (where(keep, s, -1e9) replaces, not adds): near miss", |g| {
            let (q, k, v) = qkv(g, DType::F32, &[2, 4, 33, 16], &[2, 4, 33, 16]);
            let keep = g.input("keep", DType::F32, &[2, 1, 1, 33]).gt(-3.5);
            g.output("o", keep.where_(q.matmul(k.transpose(-1, -2)) * 0.25, -1e9).softmax(-1).matmul(v)).unwrap();
        }, false),
        ("k given transposed (no transpose in the graph): near miss", |g| {
            let (q, kt, v) = ((g.input("q", DType::F32, &[2, 4, 33, 16]) * 0.0625), g.input("kt", DType::F32, &[2, 4, 16, 33]), g.input("v", DType::F32, &[2, 4, 33, 16]));
            g.output("o", (q.matmul(kt) * 0.25).softmax(-1).matmul(v)).unwrap();
        }, false),
    ];
    for (what, build, matches) in variants {
        let g = Graph::new();
        build(&g);
        let fused = check_both(what, &g, if what.contains("f16") { 4e-2 } else { 1e-2 });
        let p = fused.partition();
        let n = p.groups.iter().filter(|gr| gr.attention.is_some()).count();
        assert_eq!(n, usize::from(matches), "{what}:\n{p}");
        if matches {
            let a = p.groups.iter().find_map(|gr| gr.attention).expect("matched");
            assert_eq!(a.window, what.starts_with("sliding window of 8").then_some(8), "{what}:\n{p}");
        }
        if matches {
            // q's scaling and the attention; the repeated key/value heads are index maps
            // of the attention's loads, never a stored copy (the [B, T, H, D] variant also
            // copies its output for the final reshape). A mask or bias from data is read
            // through strides where it is an input, or stored first where computed (and
            // packed by the attention's step, not a kernel of its own).
            let a = p.groups.iter().find_map(|gr| gr.attention).expect("matched");
            assert_eq!(a.data.is_some(), what.contains("from data"), "{what}:\n{p}");
            let nodes = g.nodes();
            let computed = a.data.is_some_and(|d| !matches!(nodes[d.read.1.index()].op, kernels_lib::graph::Op::Input(_)));
            assert_eq!(fused.kernel_count(), 2 + usize::from(what.contains("[B, T, H, D]")) + usize::from(computed), "{what}:\n{p}");
            // Data that does not change along the queries (the key padding masks) is read a
            // row of keys a tile (`KeyBias`), other data a tile (`ScoreBias`).
            let modification = fused.kernels().flat_map(|k| k.constants()).find(|(c, _)| *c == "S").map(|(_, s)| s);
            let keys_only = what.contains("padding mask") || what.contains("j <= b");
            let want = if what.contains("hook") { "hook" } else if keys_only { "key_bias" } else if a.data.is_some() { "score_bias" } else { "" };
            assert_eq!(a.score_ops.is_some(), what.contains("other operations"), "{what}:\n{p}");
            if !want.is_empty() {
                assert_eq!(modification.as_deref(), Some(want), "{what}");
            }
        }
        if !matches {
            assert_eq!(p.near_misses.len(), 1, "{what}: the dump says why\n{p}");
            assert!(p.to_string().contains("not attention"), "{what}:\n{p}");
            assert_eq!(p.to_string().contains("from data"), what.contains("from data"), "{what}: the reason\n{p}");
        }
    }
}

/// An attention whose result is a graph output and read by another kernel too would be
/// stored to two buffers, which its one launch cannot write: it stores one, and a copy
/// (computing the views between them) writes the other, fused and unfused within the bound
/// of f64, no score in memory. Five ways to get there: an output twice, an output read by
/// a pointwise node, and with the query heads grouped, the reshaped result an output read
/// by a product, the `[B, T, H, D]` transpose of the reshape too (a copy through both
/// views), and both the result and its reshape outputs. The same attention read once is
/// one launch with no copy.
#[test]
fn an_attention_result_stored_twice_is_copied() {
    type Build = fn(&Graph) -> ();
    // (what, the graph, the groups that only copy (and view) the attention's result)
    let cases: [(&str, Build, usize); 6] = [
        ("[B, H, T, D], an output twice (a new intermediate, one copy to the two outputs)", |g| {
            let (q, k, v) = (g.input("q", DType::F32, &[1, 2, 20, 16]) * 0.0625, g.input("k", DType::F32, &[1, 2, 20, 16]), g.input("v", DType::F32, &[1, 2, 20, 16]));
            let o = (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v);
            g.output("o", o).unwrap();
            g.output("o2", o).unwrap();
        }, 1),
        ("grouped, reshaped and transposed to [B, T, H, D], an output also read by a product (a copy through two views)", |g| {
            let q = g.input("q", DType::F32, &[1, 4, 20, 16]) * 0.0625;
            let (k, v) = (g.input("k", DType::F32, &[1, 2, 20, 16]).reshape(&[1, 2, 1, 20, 16]), g.input("v", DType::F32, &[1, 2, 20, 16]).reshape(&[1, 2, 1, 20, 16]));
            let o = (q.reshape(&[1, 2, 2, 20, 16]).matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v);
            let t = o.reshape(&[1, 4, 20, 16]).transpose(1, 2);
            g.output("t", t).unwrap();
            g.output("p", t.matmul(g.input("wo", DType::F32, &[1, 20, 16, 8]))).unwrap();
            g.output("o", o).unwrap();
        }, 2),
        ("[B, H, T, D], an output also read by a pointwise node", |g| {
            let (q, k, v) = (g.input("q", DType::F32, &[1, 2, 20, 16]) * 0.0625, g.input("k", DType::F32, &[1, 2, 20, 16]), g.input("v", DType::F32, &[1, 2, 20, 16]));
            let o = (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v);
            g.output("o", o).unwrap();
            g.output("p", o + 1.0).unwrap();
        }, 1),
        ("grouped, its reshape an output also read by a product", |g| {
            let q = g.input("q", DType::F32, &[1, 4, 20, 16]) * 0.0625;
            let (k, v) = (g.input("k", DType::F32, &[1, 2, 20, 16]).reshape(&[1, 2, 1, 20, 16]), g.input("v", DType::F32, &[1, 2, 20, 16]).reshape(&[1, 2, 1, 20, 16]));
            let w = (q.reshape(&[1, 2, 2, 20, 16]).matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v).reshape(&[1, 4, 20, 16]);
            g.output("w", w).unwrap();
            g.output("p", w.matmul(g.input("wo", DType::F32, &[16, 8]))).unwrap();
        }, 1),
        ("grouped, the result and its reshape both outputs", |g| {
            let q = g.input("q", DType::F32, &[1, 4, 20, 16]) * 0.0625;
            let (k, v) = (g.input("k", DType::F32, &[1, 2, 20, 16]).reshape(&[1, 2, 1, 20, 16]), g.input("v", DType::F32, &[1, 2, 20, 16]).reshape(&[1, 2, 1, 20, 16]));
            let o = (q.reshape(&[1, 2, 2, 20, 16]).matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v);
            g.output("o", o).unwrap();
            g.output("w", o.reshape(&[1, 4, 20, 16])).unwrap();
        }, 2),
        ("grouped, read once (by a product, through the reshape): one launch", |g| {
            let q = g.input("q", DType::F32, &[1, 4, 20, 16]) * 0.0625;
            let (k, v) = (g.input("k", DType::F32, &[1, 2, 20, 16]).reshape(&[1, 2, 1, 20, 16]), g.input("v", DType::F32, &[1, 2, 20, 16]).reshape(&[1, 2, 1, 20, 16]));
            let w = (q.reshape(&[1, 2, 2, 20, 16]).matmul(k.transpose(-1, -2)) * 0.25).softmax(-1).matmul(v).reshape(&[1, 4, 20, 16]);
            g.output("p", w.matmul(g.input("wo", DType::F32, &[16, 8]))).unwrap();
        }, 0),
    ];
    for (what, build, want) in cases {
        let g = Graph::new();
        build(&g);
        let fused = check_both(what, &g, 1e-2);
        let p = fused.partition();
        assert_eq!(p.groups.iter().filter(|gr| gr.attention.is_some()).count(), 1, "{what}:\n{p}");
        let a = p.groups.iter().find(|gr| gr.attention.is_some()).expect("the attention");
        assert_eq!(a.stores.len(), 1, "{what}: one store\n{p}");
        // The copies: groups that read the attention's result and only view it.
        let nodes = g.nodes();
        let copies = p.groups.iter().filter(|gr| gr.loads.len() == 1 && gr.loads[0].0 == a.stores[0].0 && gr.nodes.iter().all(|n| matches!(nodes[n.index()].op, kernels_lib::graph::Op::View(..)))).count();
        // (Where the result goes to an intermediate that a reshape of it is read from, the
        // reshape's own group counts too.)
        assert_eq!(copies, want, "{what}: the copies\n{p}");
        assert!(p.near_misses.is_empty(), "{what}:\n{p}");
        assert!(p.intermediates.iter().all(|id| nodes[id.index()].numel() < 4 * 20 * 20), "{what}: the scores in memory\n{p}");
    }
}

/// A batched product whose batch dimensions do not merge into two (`[2, 3, 4]` with `b`
/// broadcast along the middle one: its strides nest with neither neighbour's), fused (with
/// an epilogue, and a prologue too) and unfused, each on the fuser's generated kernel (the
/// library's `matmul_batched` takes two), the
/// third dimension along grid axis 2 with the second; and with a fourth that does not
/// merge, a clear error.
#[test]
fn batched_products_take_three_batch_dimensions_that_do_not_merge() {
    let g = Graph::new();
    // (bf16: products exact in f32, the results rounded once; tf32 products of inputs up to
    // 4 come near the bound where a sum cancels.)
    let (a, b) = (g.input("a", DType::BF16, &[2, 3, 4, 8, 16]), g.input("b", DType::BF16, &[2, 1, 4, 16, 8]));
    let p = a.matmul(b);
    g.output("p", p).unwrap();
    g.output("e", a.matmul(b).relu()).unwrap();
    g.output("r", (a * 0.5).matmul(b) - 1.0).unwrap();
    let plan = check_both("three batch dimensions", &g, 1e-2);
    assert!(plan.partition().groups.iter().any(|gr| gr.matmul.is_some()), "{}", plan.partition());
    let g = Graph::new();
    let (a, b) = (g.input("a", DType::F32, &[2, 3, 2, 3, 8, 16]), g.input("b", DType::F32, &[2, 1, 2, 1, 16, 8]));
    g.output("p", a.matmul(b)).unwrap();
    let e = g.compile(&Runtime::interpreter()).err().expect("four batch dimensions").to_string();
    assert!(e.contains("4 batch dimensions that do not merge; at most 3"), "{e}");
}

/// A bias built of shared nodes (`b = b * 0.5 + b * 0.5`, 64 times: 2^64 paths, 130 nodes)
/// is matched in time linear in its nodes: the matcher decides each node once.
#[test]
fn a_bias_of_shared_nodes_is_matched_in_linear_time() {
    let g = Graph::new();
    let (q, k, v) = (g.input("q", DType::F32, &[1, 2, 16, 16]), g.input("k", DType::F32, &[1, 2, 16, 16]), g.input("v", DType::F32, &[1, 2, 16, 16]));
    let mut bias = g.input("bias", DType::F32, &[1, 1, 16, 16]);
    for _ in 0..64 {
        bias = bias * 0.5 + bias * 0.5;
    }
    g.output("o", (q.matmul(k.transpose(-1, -2)) * 0.25 + bias).softmax(-1).matmul(v)).unwrap();
    let plan = g.compile(&Runtime::interpreter()).unwrap();
    let p = plan.partition();
    assert!(p.groups.iter().any(|gr| gr.attention.is_some_and(|a| a.data.is_some())), "{p}");
}

#[test]
fn bad_matmuls_are_clear_errors() {
    let g = Graph::new();
    let (a, b) = (g.input("a", DType::F32, &[4, 6]), g.input("b", DType::F32, &[5, 3]));
    let e = a.matmul(b).check().expect_err("inner dimensions").to_string();
    assert!(e.contains("[4, 6]") && e.contains("[5, 3]") && e.contains("inner dimensions 6 and 5"), "{e}");
    assert!(a.matmul(g.input("v", DType::F32, &[6])).check().expect_err("rank").to_string().contains("two dimensions"));
    let (c, d) = (g.input("c", DType::F32, &[2, 4, 6]), g.input("d", DType::F32, &[3, 6, 5]));
    assert!(c.matmul(d).check().expect_err("batch").to_string().contains("batch dimensions do not broadcast"));
    // Three batch dimensions whose strides do not merge: a clear error at compile time.
    let g = Graph::new();
    let p = g.input("p", DType::F32, &[2, 1, 3, 1, 4, 5]);
    let q = g.input("q", DType::F32, &[1, 2, 1, 3, 5, 4]);
    g.output("r", p.matmul(q)).unwrap();
    let e = g.compile(&Runtime::interpreter()).err().expect("unsupported").to_string();
    assert!(e.contains("batch dimensions that do not merge"), "{e}");
}

// ---------------------------------------------------------------------------------------
// Random graphs.

/// A random graph: its iteration shape, its inputs (which dimensions each keeps, and its
/// element type), the operations (a kind and operand picks) and which nodes are outputs.
#[derive(Clone, Debug)]
struct Recipe {
    shape: Vec<usize>,
    inputs: Vec<(Vec<bool>, u8, bool)>,
    ops: Vec<(u8, usize, usize, usize)>,
    outputs: Vec<usize>,
}

fn recipe() -> impl Strategy<Value = Recipe> {
    recipe_of(false)
}

/// [`recipe`], or with `rows` one for the reductions: the last dimension 33 in two of three
/// (one in three otherwise), and two operations in seven reductions (kind 15; one in 21
/// otherwise).
fn recipe_of(rows: bool) -> impl Strategy<Value = Recipe> {
    let dim = prop_oneof![Just(1usize), 2usize..9, Just(33usize)];
    let last = if rows { prop_oneof![dim.clone(), Just(33usize)].boxed() } else { dim.clone().boxed() };
    let shape = (prop::collection::vec(dim, 0..3), last).prop_map(|(mut s, l)| {
        s.push(l);
        s
    });
    let kind = if rows { prop_oneof![3 => 0u8..21, 1 => Just(15u8)].boxed() } else { (0u8..21).boxed() };
    shape.prop_flat_map(move |shape| {
        let r = shape.len();
        let input = (prop::collection::vec(any::<bool>(), r), 0u8..3, any::<bool>());
        (
            Just(shape),
            prop::collection::vec(input, 1..4),
            prop::collection::vec((kind.clone(), any::<usize>(), any::<usize>(), any::<usize>()), 1..10),
            prop::collection::vec(any::<usize>(), 1..4),
        )
            .prop_map(|(shape, inputs, ops, outputs)| Recipe { shape, inputs, ops, outputs })
    })
}

/// Build the graph of a recipe: every operation takes earlier nodes, all of which
/// broadcast to the recipe's shape.
fn build(g: &Graph, r: &Recipe) {
    build_with(g, r, false)
}

/// [`build`], and with `reductions` also sums, means, maxima and minima along the last
/// axis (kept as size 1, so they broadcast back into later operations).
fn build_with(g: &Graph, r: &Recipe, reductions: bool) {
    let dtypes = [DType::F32, DType::F16, DType::BF16];
    let mut pool: Vec<Tensor> = vec![];
    for (i, (keep, d, drop_leading)) in r.inputs.iter().enumerate() {
        let mut s: Vec<usize> = r.shape.iter().zip(keep).map(|(&n, &k)| if k { n } else { 1 }).collect();
        if *drop_leading && s.len() > 1 && s[0] == 1 {
            s.remove(0);
        }
        pool.push(g.input(&format!("in{i}"), dtypes[*d as usize], &s));
    }
    for &(kind, a, b, c) in &r.ops {
        let pick = |i: usize| pool[i % pool.len()];
        let (x, y, z) = (pick(a), pick(b), pick(c));
        let t = match kind {
            0 => x.relu(),
            1 => -x,
            2 => x.abs(),
            3 => x.tanh(),
            4 => x.sigmoid(),
            5 => x.tanh().exp(),
            6 => x + y,
            7 => x - y,
            8 => x * y,
            9 => x / (y.abs() + 1.0),
            10 => x.maximum(y),
            11 => x.minimum(y),
            12 => x * 0.75 + 1.5,
            13 => x.gt(y).where_(x, z),
            14 => x.cast(dtypes[c % 3]),
            15 if reductions => match c % 4 {
                0 => x.sum(-1) * 0.25 + y,
                1 => y - x.mean(-1),
                2 => (x - x.amax(-1)).exp(),
                _ => x.amin(-1),
            },
            // Views that keep the recipe's shape, so later operations still broadcast:
            // through a flat reshape and back, a transpose of two equal dimensions, a
            // slice expanded back, and a strided slice repeated back (`repeat_interleave`).
            16 => x.expand(&r.shape).reshape(&[usize::MAX]).reshape(&r.shape) * y,
            17 => match (0..r.shape.len()).flat_map(|i| (i + 1..r.shape.len()).map(move |j| (i, j))).find(|&(i, j)| r.shape[i] == r.shape[j]) {
                Some((i, j)) => x.expand(&r.shape).transpose(i as isize, j as isize) - y,
                None => x.expand(&r.shape).permute(&(0..r.shape.len()).collect::<Vec<_>>()) - y,
            },
            18 => {
                let axis = c % r.shape.len();
                x.expand(&r.shape).slice(axis as isize, 0, 1).expand(&r.shape) + y
            }
            19 => {
                let axis = c % r.shape.len();
                let n = r.shape[axis];
                let k = (2..=n).find(|&k| n.is_multiple_of(k)).unwrap_or(1);
                x.expand(&r.shape).slice_step(axis as isize, 0, n, k).repeat_interleave(k, axis as isize).maximum(y)
            }
            20 => {
                // Split along an axis of at least 2 and joined back, halves of two operands.
                match (0..r.shape.len()).find(|&k| r.shape[(k + c) % r.shape.len()] >= 2).map(|k| (k + c) % r.shape.len()) {
                    Some(axis) => {
                        let (n, at) = (r.shape[axis], 1 + c % (r.shape[axis] - 1));
                        let a = axis as isize;
                        x.expand(&r.shape).slice(a, 0, at).cat(y.expand(&r.shape).slice(a, at, n), a)
                    }
                    None => x + y,
                }
            }
            _ => x.abs().sqrt(),
        };
        pool.push(t);
    }
    for (k, &o) in r.outputs.iter().enumerate() {
        g.output(&format!("out{k}"), pool[o % pool.len()]).unwrap();
    }
}

/// Per node: whether its value depends on a sum or a mean rounded to a 16-bit type (there or
/// later), where two summation orders may round apart.
fn rounded_after_a_sum(g: &Graph) -> Vec<bool> {
    use kernels_lib::graph::{Op, Reduction};
    let nodes = g.nodes();
    let (mut summed, mut rounded) = (vec![false; nodes.len()], vec![false; nodes.len()]);
    for (i, n) in nodes.iter().enumerate() {
        let ops = n.op.operands();
        summed[i] = matches!(n.op, Op::Reduce(Reduction::Sum | Reduction::Mean, _)) || ops.iter().any(|o| summed[o.index()]);
        rounded[i] = ops.iter().any(|o| rounded[o.index()]) || (summed[i] && matches!(n.dtype, DType::F16 | DType::BF16));
    }
    rounded
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Fused == unfused == the as-stored reference, exactly; kernels: one per output
    /// shape fused, never more than unfused.
    #[test]
    fn random_elementwise_graphs_fuse_without_changing_results(r in recipe()) {
        let g = Graph::new();
        build(&g, &r);
        let (fused, _) = check_graph(&format!("{r:?}"), &g, None);
        let mut shapes: Vec<Vec<usize>> = g.outputs().iter().map(|(_, id)| g.node(*id).shape).collect();
        shapes.sort();
        shapes.dedup();
        prop_assert_eq!(fused.kernel_count(), shapes.len());
    }
}

proptest! {
    // 256 cases: about one in eight loops a sum or a mean over rows of 33.
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// With reductions: fused == unfused exactly (each reduction reduces the same values
    /// the same way), never more kernels than unfused.
    #[test]
    fn random_graphs_with_reductions_fuse_without_changing_results(r in recipe_of(true)) {
        let g = Graph::new();
        build_with(&g, &r, true);
        let rt = Runtime::interpreter();
        let inputs = inputs_for(&g, 7);
        let mut fused = g.compile(&rt).unwrap();
        let mut unfused = g.compile_with(&rt, &Options::unfused()).unwrap();
        let out = run(&mut fused, &g, &rt, &inputs);
        same(&format!("{r:?}\n{}", fused.partition()), &out, &run(&mut unfused, &g, &rt, &inputs));
        prop_assert!(fused.kernel_count() <= unfused.kernel_count());
        // Rows of 33 looped in chunks of 32 (`max_row` 4): the same values, summed in
        // another order. An output that depends on a sum or a mean rounded to 16 bits is
        // left out: there an ulp of f32 may cross a rounding boundary (a 2^-8 jump, and any
        // size through a comparison after it), one run in about 10^4; bf16 loops are
        // checked against f64 by `long_rows_loop_over_chunks`.
        let mut looped = g.compile_with(&rt, &Options { max_row: 4, ..Options::default() }).unwrap();
        let got = run(&mut looped, &g, &rt, &inputs);
        let rounded = rounded_after_a_sum(&g);
        for (k, ((o, w), _)) in got.iter().zip(&out).zip(g.outputs()).enumerate().filter(|(_, (_, (_, id)))| !rounded[id.index()]) {
            for i in 0..o.len() {
                let err = (o[i] - w[i]).abs() / (1.0 + w[i].abs());
                prop_assert!(err <= 1e-3 || (o[i].is_nan() && w[i].is_nan()) || o[i] == w[i], "{:?}: output {} element {}: looped {} vs held {}", r, k, i, o[i], w[i]);
            }
        }
    }
}
