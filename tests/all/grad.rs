//! Reverse-mode autodiff of graphs (`Graph::grad`): every operation's gradient against
//! central finite differences of the f64 reference, and gradient graphs compiled and run
//! (fused) on the interpreter against their f64 evaluation.

use crate::common::seed;
use crate::graph::{inputs_for, run, seed_block, within};
use dsl_runtime::{DType, Runtime};
use kernels_lib::graph::reference::{evaluate, Rounding};
use kernels_lib::graph::{Graph, GraphError, Tensor, UnaryOp};

/// How far a central difference at step `h` may be from the derivative: truncation
/// (`h^2 f''' / 6`, far below `1e-5` here) and the f64 rounding of the two losses it
/// subtracts, each a sum whose terms add up to `mag` in size (a few units of `2^-53` of
/// `mag` each, divided by `2h`): `1e-5 (1 + |fd|) + 1e-15 mag / h`.
fn fd_tolerance(fd: f64, mag: f64, h: f64) -> f64 {
    1e-5 * (1.0 + fd.abs()) + 1e-15 * mag / h
}

/// Checks `got`, the derivative of `loss` in input `x`'s element `e`, against the central
/// difference at step `h` (within [`fd_tolerance`]). Where the element lies within `h` of a
/// kink (`relu` at 0, `|x|`, a tie in a max), the central difference straddles it (about one
/// run in 70000 of `every_gradient_matches_finite_differences`): there, and only there (the
/// two one-sided differences disagree by more than their tolerance, where a smooth
/// function's differ by `h f''`), a one-sided difference that does not straddle it must
/// match (its truncation `h f'' / 2` inside the bound's `1e-5`, its rounding twice the
/// central one's).
fn check_derivative(what: &str, got: f64, loss: &dyn Fn(&[Vec<f64>]) -> f64, inputs: &[Vec<f64>], (x, e): (usize, usize), mag: f64, h: f64) {
    let (mut plus, mut minus) = (inputs.to_vec(), inputs.to_vec());
    plus[x][e] += h;
    minus[x][e] -= h;
    let (lp, lm) = (loss(&plus), loss(&minus));
    let fd = (lp - lm) / (2.0 * h);
    if (got - fd).abs() <= fd_tolerance(fd, mag, h) {
        return;
    }
    let l0 = loss(inputs);
    let one_sided = [(lp - l0) / h, (l0 - lm) / h];
    let within = |d: f64| (got - d).abs() <= 2.0 * fd_tolerance(d, mag, h);
    let kink = (one_sided[0] - one_sided[1]).abs() > 2.0 * fd_tolerance(fd, mag, h);
    assert!(kink && one_sided.into_iter().any(within), "{what}: d/d input {x} element {e}: {got} vs finite difference {fd} (one-sided {one_sided:?})");
}

/// One case: a graph of f32 inputs whose first output is `y`, and the gradient of
/// `sum(y * dy)` (`dy` a random input of `y`'s shape, the last input) with respect to
/// every other input, as outputs 1.. . Checked against central differences of the f64
/// reference at step `h = 1e-6` (truncation `h^2 f''' / 6`, cancellation `1e-16 / h`,
/// both far below the bound) on every input element, or at a kink a one-sided one
/// ([`check_derivative`]).
fn check_grad(what: &str, build: impl for<'g> Fn(&'g Graph) -> (Tensor<'g>, Vec<Tensor<'g>>), s: u64) {
    let g = Graph::new();
    let (y, xs) = build(&g);
    let dy = g.input("dy", DType::F32, &y.shape().unwrap());
    g.output("y", y).unwrap();
    let grads = g.grad(y, Some(dy), &xs).unwrap_or_else(|e| panic!("{what}: {e}"));
    for (i, d) in grads.iter().enumerate() {
        g.output(&format!("d{i}"), *d).unwrap_or_else(|e| panic!("{what}: gradient {i}: {e}"));
    }
    let inputs = inputs_for(&g, s);
    let exact = evaluate(&g, &inputs, Rounding::None).unwrap();
    let loss = |ins: &[Vec<f64>]| -> f64 {
        let out = evaluate(&g, ins, Rounding::None).unwrap();
        out[0].iter().zip(ins.last().unwrap()).map(|(a, b)| a * b).sum()
    };
    let h = 1e-6;
    let mag: f64 = exact[0].iter().zip(inputs.last().unwrap()).map(|(a, b)| (a * b).abs()).sum();
    for (k, x) in xs.iter().enumerate() {
        // The input `x` is: its position among the graph's inputs.
        let id = x.check().unwrap();
        let at = g.inputs().iter().position(|(_, i)| *i == id).expect("gradients are taken of inputs here");
        for (e, &got) in exact[1 + k].iter().enumerate() {
            check_derivative(&format!("{what} (seed {s}), gradient {k}"), got, &loss, &inputs, (at, e), mag, h);
        }
    }
}

/// The check at a kink: `relu` at 3e-7, within `h = 1e-6` of 0, where the central
/// difference is 0.65 and the derivative 1: the forward difference (1) matches; a wrong
/// derivative (0.5) matches neither and fails.
#[test]
fn derivatives_at_a_kink_match_a_one_sided_difference() {
    let g = Graph::new();
    let x = g.input("x", DType::F32, &[1]);
    g.output("y", x.relu()).unwrap();
    let loss = |ins: &[Vec<f64>]| evaluate(&g, ins, Rounding::None).unwrap()[0][0];
    let inputs = vec![vec![3e-7]];
    check_derivative("relu near 0", 1.0, &loss, &inputs, (0, 0), 1.0, 1e-6);
    let wrong = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_derivative("relu near 0", 0.5, &loss, &inputs, (0, 0), 1.0, 1e-6)));
    assert!(wrong.is_err(), "a wrong derivative passed");
}

/// Every operation a graph has, each differentiated alone (with broadcasting where it
/// applies) and in the compositions the library builds from them.
#[test]
fn every_gradient_matches_finite_differences() {
    const F: DType = DType::F32;
    let s = seed();
    type Case = (&'static str, Box<dyn for<'g> Fn(&'g Graph) -> (Tensor<'g>, Vec<Tensor<'g>>)>);
    // Positive operands for the functions defined there: |x| + 0.5.
    let cases: Vec<Case> = vec![
        ("relu", Box::new(|g| { let x = g.input("x", F, &[2, 3]); (x.relu(), vec![x]) })),
        ("neg abs", Box::new(|g| { let x = g.input("x", F, &[2, 3]); (-(x.abs()), vec![x]) })),
        ("exp exp2", Box::new(|g| { let x = g.input("x", F, &[2, 3]); ((x * 0.25).exp() + x.unary(UnaryOp::Exp2) * 0.1, vec![x]) })),
        ("log log2", Box::new(|g| { let x = g.input("x", F, &[2, 3]); let p = x.abs() + 0.5; (p.log() + p.unary(UnaryOp::Log2), vec![x]) })),
        ("sqrt rsqrt", Box::new(|g| { let x = g.input("x", F, &[2, 3]); let p = x.abs() + 0.5; (p.sqrt() + p.rsqrt(), vec![x]) })),
        ("sin cos", Box::new(|g| { let x = g.input("x", F, &[2, 3]); (x.unary(UnaryOp::Sin) * x.unary(UnaryOp::Cos), vec![x]) })),
        ("tanh sigmoid", Box::new(|g| { let x = g.input("x", F, &[2, 3]); (x.tanh() + x.sigmoid(), vec![x]) })),
        ("add sub, broadcast", Box::new(|g| {
            let (x, b, c) = (g.input("x", F, &[2, 3]), g.input("b", F, &[3]), g.input("c", F, &[2, 1]));
            (x + b - c, vec![x, b, c])
        })),
        ("mul div, broadcast", Box::new(|g| {
            let (x, b, c) = (g.input("x", F, &[2, 3]), g.input("b", F, &[3]), g.input("c", F, &[2, 1]));
            (x * b / (c.abs() + 0.5), vec![x, b, c])
        })),
        ("maximum minimum", Box::new(|g| {
            let (x, w) = (g.input("x", F, &[2, 3]), g.input("w", F, &[2, 3]));
            (x.maximum(w) + x.minimum(w * 0.5), vec![x, w])
        })),
        ("where", Box::new(|g| {
            let (x, w) = (g.input("x", F, &[2, 3]), g.input("w", F, &[3]));
            (x.gt(w).where_(x * 2.0, w), vec![x, w])
        })),
        ("sum mean along both axes", Box::new(|g| { let x = g.input("x", F, &[3, 4]); (x.sum(-1) * x.mean(0).sum(-1) + x.mean(-1), vec![x]) })),
        ("amax amin", Box::new(|g| { let x = g.input("x", F, &[3, 4]); (x.amax(-1) + x.amin(0).sum(-1) * x.sum(-1), vec![x]) })),
        ("reshape permute transpose", Box::new(|g| {
            let x = g.input("x", F, &[2, 3, 4]);
            let v = x.reshape(&[6, 4]).transpose(0, 1).reshape(&[2, 2, 6]).permute(&[2, 0, 1]);
            (v * v.exp(), vec![x])
        })),
        ("expand", Box::new(|g| { let x = g.input("x", F, &[3, 1]); (x.expand(&[2, 3, 4]) * x.expand(&[2, 3, 4]).unary(UnaryOp::Sin), vec![x]) })),
        ("slice, step 1 and 2", Box::new(|g| {
            let x = g.input("x", F, &[3, 7]);
            (x.slice(1, 2, 5).exp().sum(-1) + x.slice_step(1, 1, 7, 2).exp().sum(-1) + x.slice_step(0, 0, 3, 2).exp().sum(0).sum(-1), vec![x])
        })),
        ("repeat_interleave", Box::new(|g| { let x = g.input("x", F, &[2, 3]); (x.repeat_interleave(3, 1).exp(), vec![x]) })),
        ("cat", Box::new(|g| {
            let (x, w) = (g.input("x", F, &[2, 3]), g.input("w", F, &[2, 2]));
            ((x.cat(w * 3.0, 1) * 0.25).exp(), vec![x, w])
        })),
        ("matmul, batched and broadcast", Box::new(|g| {
            let (a, b) = (g.input("a", F, &[2, 3, 4]), g.input("b", F, &[4, 5]));
            (a.matmul(b) * 0.1 + a.transpose(1, 2).transpose(1, 2).matmul(b.exp() * 0.1), vec![a, b])
        })),
        ("softmax log_softmax", Box::new(|g| { let x = g.input("x", F, &[3, 5]); (x.softmax(-1) + x.log_softmax(0), vec![x]) })),
        ("rms_norm layer_norm", Box::new(|g| {
            let (x, w, b) = (g.input("x", F, &[3, 6]), g.input("w", F, &[6]), g.input("b", F, &[6]));
            (x.rms_norm(Some(w), 1e-5) + x.layer_norm(Some(w), Some(b), 1e-5), vec![x, w, b])
        })),
        ("attention", Box::new(|g| {
            let (q, k, v) = (g.input("q", F, &[2, 5, 4]), g.input("k", F, &[1, 5, 4]), g.input("v", F, &[1, 5, 4]));
            let (kk, vv) = (k.repeat_interleave(2, 0), v.repeat_interleave(2, 0));
            ((q.matmul(kk.transpose(-1, -2)) * 0.25).softmax(-1).matmul(vv), vec![q, k, v])
        })),
    ];
    for (i, (what, build)) in cases.iter().enumerate() {
        check_grad(what, build, s + i as u64);
    }
}

/// `grad` without `dy` is the gradient of `y.sum()`; a node `y` does not depend on gets
/// zeros; a mask output, or a `dy` of another shape, is a clear error.
#[test]
fn grad_defaults_and_errors() {
    let g = Graph::new();
    let (x, w) = (g.input("x", DType::F32, &[2, 3]), g.input("w", DType::F32, &[3]));
    let y = x * x;
    let [dx, dw] = g.grad(y, None, &[x, w]).unwrap()[..] else { unreachable!() };
    g.output("dx", dx).unwrap();
    g.output("dw", dw).unwrap();
    let out = evaluate(&g, &[vec![1.0, 2.0, -3.0, 0.5, 0.0, 4.0], vec![1.0; 3]], Rounding::None).unwrap();
    assert_eq!(out[0], [2.0, 4.0, -6.0, 1.0, 0.0, 8.0]);
    assert_eq!(out[1], [0.0; 3]);
    assert!(matches!(g.grad(x.gt(0.0), None, &[x]), Err(GraphError::NoGradient { .. })));
    let wrong = g.input("dy", DType::F32, &[3]);
    let err = g.grad(y, Some(wrong), &[x]).unwrap_err();
    assert!(err.to_string().contains("dy has shape [3]"), "{err}");
}

/// The seed's attention block (projections, `repeat_interleave` GQA, scores divided by
/// `sqrt(d)`, softmax, `@ v`, output projection), forward and the gradients of `y.sum()`
/// with respect to `x` and every weight, as one graph compiled (fused) and run on the
/// interpreter, against the f64 evaluation of the same graph; and the f64 gradients
/// against finite differences on a few elements of each. At head dim 8 the attention is
/// not recognised (differentiated through its products and softmax); at 16 it is, and its
/// backward reads q, k, v and the output's gradient from the projections' `[B, T, H, D]`
/// buffers and writes the gradients in that layout (no copy either way), reading the
/// forward's output and log-sum-exp instead of recomputing them.
#[test]
fn the_seed_block_backward_through_the_fuser() {
    for hd in [8, 16] {
        seed_block_backward(hd);
    }
}

fn seed_block_backward(hd: usize) {
    let s = seed();
    let g = Graph::new();
    let (y, ins) = seed_block(&g, DType::F32, (2, 12, 16, 4, 2, hd));
    let grads = g.grad(y, None, &ins).unwrap();
    for (name, d) in ["dx", "dwq", "dwk", "dwv", "dwo"].iter().zip(&grads) {
        g.output(name, *d).unwrap();
    }
    let inputs = inputs_for(&g, s);
    let exact = evaluate(&g, &inputs, Rounding::None).unwrap();
    let rt = Runtime::interpreter();
    let mut plan = g.compile(&rt).unwrap();
    let p = plan.partition();
    let backward: Vec<_> = p.groups.iter().filter(|gr| gr.attention_grad.is_some()).collect();
    assert_eq!(backward.len(), usize::from(hd == 16), "{p}");
    for gr in backward {
        let nodes = g.nodes();
        assert!(gr.stores.iter().all(|(id, _)| matches!(nodes[id.index()].op, kernels_lib::graph::Op::View(..))), "gradients stored as their transposes:\n{p}");
        assert!(gr.loads[..4].iter().all(|(id, _)| nodes[id.index()].shape.len() == 3), "operands read from the [B, T, H * D] projections:\n{p}");
        // The forward's output (as stored, [B, T, H, D]) read, not recomputed.
        assert!(gr.loads.len() == 5 && p.groups.iter().any(|f| f.attention.is_some() && f.stores[0].0 == gr.loads[4].0), "the forward reused:\n{p}");
    }
    let got = run(&mut plan, &g, &rt, &inputs);
    // tf32 products (2^-11 relative per operand) chained through up to four products and
    // a softmax: the same 1e-2 (of 1 + |x|) the forward's fused check uses; summed over
    // 24 rows of 16 to 64 terms of order one, the gradients are larger than the outputs.
    within_scaled(&format!("seed block backward, head dim {hd} (seed {s})"), &got, &exact, &plan);
    let loss = |ins: &[Vec<f64>]| -> f64 { evaluate(&g, ins, Rounding::None).unwrap()[0].iter().sum() };
    let h = 1e-6;
    let mag: f64 = exact[0].iter().map(|x| x.abs()).sum();
    for (k, input) in inputs.iter().enumerate() {
        for e in [0, input.len() / 3, input.len() - 1] {
            check_derivative(&format!("seed block, head dim {hd} (seed {s})"), exact[1 + k][e], &loss, &inputs, (k, e), mag, h);
        }
    }
}

/// A recognised attention (`[B, H, T, D]`, grouped heads by `repeat_interleave`, head dim
/// 16) is differentiated as a whole: its q, k and v gradients are `AttentionGrad` nodes
/// (checked against finite differences of the f64 forward on a sample of elements), which
/// the fuser runs as one flash-attention backward (no `[B, H, T, T]` value in memory);
/// run on the interpreter, the plan's gradients are within the attention tests' bound of
/// the f64 ones. With the scores also read by the differentiated output, the attention's
/// gradient goes through its products and softmax instead, and agrees.
#[test]
fn attention_gradients_are_one_flash_attention_backward() {
    use kernels_lib::graph::Op;
    let s = seed();
    // (the scores also read, under the causal mask, soft-capped ("cap") or through other
    // operations ("ops", the kernels' hook: `sigmoid(s / 10 + 2) * 6`), under a sliding window
    // of 8 keys: the band tril(0) - tril(-8) of 0/1 floats; with a bias from data [B, 1,
    // T, T] added before the scale, one per head [B, H, T, T] added after it, or a key
    // padding mask from data [B, 1, 1, T] (key 0 kept: under a window the first query sees
    // only it); a soft-cap under a window, under a bias per head, and other operations under
    // a key padding mask: both in the kernels' hook; a window over the key padding mask or
    // the bias per head, and a soft-cap under both: all in the hook)
    let variants = [
        (false, false, None, None, None),
        (true, false, None, None, None),
        (false, true, None, None, None),
        (false, true, Some("cap"), None, None),
        (false, true, Some("ops"), None, None),
        (false, true, None, Some(8u32), None),
        (false, true, None, None, Some("bias")),
        (false, false, None, None, Some("head bias")),
        (false, false, None, None, Some("mask")),
        (false, true, Some("cap"), Some(8), None),
        (false, false, Some("cap"), None, Some("head bias")),
        (false, false, Some("ops"), None, Some("mask")),
        (false, true, None, Some(8), Some("mask")),
        (false, true, None, Some(8), Some("head bias")),
        (false, true, Some("cap"), Some(8), Some("mask")),
    ];
    for (scores_too, causal, modify, window, data) in variants {
        let g = Graph::new();
        let (b, h, kv, t, d) = (1, 4, 2, 24, 16);
        let [q, k, v, dy] = attention_inputs(&g, (b, h, kv, t, d));
        let qk = q.matmul(k.repeat_interleave(h / kv, 1).transpose(-1, -2));
        let sc = match data {
            Some("bias") => (qk + g.input("bias", DType::F32, &[b, 1, t, t])) * 0.25,
            _ => qk * 0.25,
        };
        let capped = match modify {
            Some("cap") => (sc / 0.5).tanh() * 0.5,
            Some(_) => (sc * 0.1 + 2.0).sigmoid() * 6.0,
            None => sc,
        };
        // Data after the scale, and after a modification (with one, both in the hook).
        let capped = match data {
            Some("head bias") => capped + g.input("bias", DType::F32, &[b, h, t, t]),
            Some("mask") => g.input("keep", DType::F32, &[b, 1, 1, t]).gt(-3.5).cast(DType::F32).maximum(g.tril(1, t, 0).cast(DType::F32)).gt(0.5).where_(capped, f64::NEG_INFINITY),
            _ => capped,
        };
        let masked = match window {
            Some(w) => (g.tril(t, t, 0).cast(DType::F32) - g.tril(t, t, -(w as i64)).cast(DType::F32)).eq_(0.0).where_(f64::NEG_INFINITY, capped),
            None if causal => g.tril(t, t, 0).where_(capped, f64::NEG_INFINITY),
            None => capped,
        };
        let attn = masked.softmax(-1).matmul(v.repeat_interleave(h / kv, 1));
        // The scores also feeding the differentiated output: their gradient is needed.
        let y = if scores_too { attn + sc.sum(-1) * 0.01 } else { attn };
        g.output("y", y).unwrap();
        let grads = g.grad(y, Some(dy), &[q, k, v]).unwrap();
        for (name, t) in ["dq", "dk", "dv"].iter().zip(&grads) {
            g.output(name, *t).unwrap();
        }
        let fused = grads.iter().all(|t| matches!(g.node(t.check().unwrap()).op, Op::AttentionGrad(a) if a.causal == causal && a.softcap().is_some() == (modify == Some("cap")) && a.score_ops.is_some() == (modify == Some("ops")) && a.window == window && a.data.is_some() == data.is_some()));
        assert_eq!(fused, !scores_too, "the gradients' nodes: {:?}", grads);
        let inputs = inputs_for(&g, s);
        let exact = evaluate(&g, &inputs, Rounding::None).unwrap();
        check_attention_fd(&g, &inputs, &exact, s);
        let rt = Runtime::interpreter();
        let mut plan = g.compile(&rt).unwrap();
        let p = plan.partition().clone();
        assert_eq!(p.groups.iter().filter(|gr| gr.attention_grad.is_some()).count(), usize::from(!scores_too), "{p}");
        if !scores_too {
            let nodes = g.nodes();
            assert!(p.intermediates.iter().all(|id| nodes[id.index()].numel() < b * h * t * t), "a value of the scores' size in memory:\n{p}");
        }
        let got = run(&mut plan, &g, &rt, &inputs);
        // Inputs in [-4, 4) make scores up to 0.25 * 16 * 16 = 64: saturated softmax rows,
        // gradients of order 10; relative to each output's largest element, tf32 products
        // (2^-11 a truncated operand) through two products and the softmax: 1e-2.
        within_scaled(&format!("attention gradients, scores also stored: {scores_too}, causal: {causal}, modified {modify:?}, window {window:?}, data {data:?} (seed {s})"), &got, &exact, &plan);
        // Unfused too (one kernel a node; the flash-attention backward reads the mask's
        // tensor from its own buffer).
        if data.is_some() {
            let mut unfused = g.compile_with(&rt, &kernels_lib::graph::Options::unfused()).unwrap();
            let got = run(&mut unfused, &g, &rt, &inputs);
            within_scaled(&format!("unfused attention gradients, data {data:?} (seed {s})"), &got, &exact, &unfused);
        }
    }
}

/// Operations on the scores at their kinks: with one query row of zeros its scores are
/// exactly 0, where `relu`, `abs`, `max(s, 0)` and `min(s, 0)` have a kink. The attention
/// through the fuser (its operations in the kernels' hook, the backward their derivative)
/// must give the graph's own gradients there (`relu'(0) = abs'(0) = 0`, half to each side
/// of a tie), which the same graph with its softmax written `log_softmax(x).exp()` (not
/// recognised: differentiated through its products) gives: in f64 (the reference of the
/// fused backward) to f64 rounding, and the plan on the interpreter within the attention
/// tests' bound.
#[test]
fn operations_on_the_scores_take_the_graphs_gradients_at_their_kinks() {
    use kernels_lib::graph::Op;
    type Kink = for<'g> fn(Tensor<'g>) -> Tensor<'g>;
    let kinks: [(&str, Kink); 4] = [("relu", |s| s.relu()), ("abs", |s| s.unary(UnaryOp::Abs)), ("max(s, 0)", |s| s.maximum(0.0)), ("min(s, 0)", |s| s.minimum(0.0))];
    let s0 = seed();
    for (name, kink) in kinks {
        let (b, h, t, d) = (1, 2, 24, 16);
        // Fused (`softmax`), and as written (`log_softmax(x).exp()`, not matched).
        let build = |g: &Graph, fused: bool| {
            let [q, k, v, dy] = attention_inputs(g, (b, h, h, t, d));
            let x = kink(q.matmul(k.transpose(-1, -2)) * 0.0625);
            let p = if fused { x.softmax(-1) } else { x.log_softmax(-1).exp() };
            let y = p.matmul(v);
            g.output("y", y).unwrap();
            for (n, x) in ["dq", "dk", "dv"].iter().zip(g.grad(y, Some(dy), &[q, k, v]).unwrap()) {
                g.output(n, x).unwrap();
            }
        };
        let (fused, written) = (Graph::new(), Graph::new());
        build(&fused, true);
        build(&written, false);
        let hooked = fused.nodes().iter().filter(|n| matches!(n.op, Op::AttentionGrad(a) if a.score_ops.is_some())).count();
        assert_eq!(hooked, 3, "{name}: the fused graph's gradients are the hooked flash-attention backward");
        assert!(!written.nodes().iter().any(|n| matches!(n.op, Op::AttentionGrad(_))), "{name}: the written graph is not matched");
        // Halves: no score near a kink lands on its other side by rounding (with random
        // inputs one in about a thousand would, and its gradient step is not a bound's
        // worth of error).
        let mut inputs = halves(inputs_for(&fused, s0));
        // Query 3 of each head all zeros: its scores are exactly 0.
        for hh in 0..h {
            inputs[0][(hh * t + 3) * d..(hh * t + 4) * d].fill(0.0);
        }
        let exact = evaluate(&written, &inputs, Rounding::None).unwrap();
        let reference = evaluate(&fused, &inputs, Rounding::None).unwrap();
        for (o, (x, w)) in reference.iter().zip(&exact).enumerate() {
            let scale = w.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            for i in 0..x.len() {
                assert!((x[i] - w[i]).abs() <= 1e-9 * scale, "{name}: output {o} element {i}: the fused reference {} against the graph's {}", x[i], w[i]);
            }
        }
        let rt = Runtime::interpreter();
        let mut plan = fused.compile(&rt).unwrap();
        let got = run(&mut plan, &fused, &rt, &inputs);
        within_scaled(&format!("{name} at its kink (seed {s0})"), &got, &exact, &plan);
    }
}

/// A gradient of a recognised attention that is a graph output and also read by another
/// kernel (`dq`, with its squares summed per row as a second output), or two outputs (`dk`),
/// where the flash-attention backward writes each gradient once: stored once, to an
/// intermediate buffer, and copied from there to the outputs by a kernel of its own. The
/// plan (fused and unfused) runs on the interpreter within the attention tests' bound of the
/// f64 outputs (it was refused before).
#[test]
fn an_attention_gradient_stored_twice_is_copied() {
    let s = seed();
    let g = Graph::new();
    let (b, h, kv, t, d) = (1, 4, 2, 24, 16);
    let [q, k, v, dy] = attention_inputs(&g, (b, h, kv, t, d));
    let qk = q.matmul(k.repeat_interleave(h / kv, 1).transpose(-1, -2)) * 0.25;
    let y = g.tril(t, t, 0).where_(qk, f64::NEG_INFINITY).softmax(-1).matmul(v.repeat_interleave(h / kv, 1));
    g.output("y", y).unwrap();
    let [dq, dk, dv]: [Tensor<'_>; 3] = g.grad(y, Some(dy), &[q, k, v]).unwrap().try_into().unwrap();
    g.output("dq", dq).unwrap();
    g.output("dk", dk).unwrap();
    g.output("dv", dv).unwrap();
    g.output("dk again", dk).unwrap();
    g.output("dq squared", (dq * dq).sum(-1)).unwrap();
    let inputs = inputs_for(&g, s);
    let exact = evaluate(&g, &inputs, Rounding::None).unwrap();
    let rt = Runtime::interpreter();
    for options in [kernels_lib::graph::Options::default(), kernels_lib::graph::Options::unfused()] {
        let mut plan = g.compile_with(&rt, &options).unwrap();
        let p = plan.partition().clone();
        // Every value an attention backward's group stores, stored once.
        for gr in p.groups.iter().filter(|gr| gr.attention_grad.is_some()) {
            let mut ids: Vec<_> = gr.stores.iter().map(|s| s.0).collect();
            ids.sort();
            ids.dedup();
            assert_eq!(ids.len(), gr.stores.len(), "{p}");
        }
        let copies = p.groups.iter().filter(|gr| gr.nodes.is_empty() && gr.loads.len() == 1 && gr.stores.iter().all(|s| s.0 == gr.loads[0].0)).count();
        assert!(copies >= 2, "a copy of dq and of dk:\n{p}");
        let got = run(&mut plan, &g, &rt, &inputs);
        within_scaled(&format!("an attention gradient stored twice (seed {s})"), &got, &exact, &plan);
    }
}

/// A negative scale before operations on the scores (`sigmoid(q k^T * -0.25) * 6`): the
/// gradients are one hooked flash-attention backward whose hook starts with the sign (the
/// kernels scale by 0.25), against finite differences of the f64 forward and, on the
/// interpreter, within the attention tests' bound of the f64 gradients. Before, the
/// negative scale left it unmatched.
#[test]
fn a_negative_scale_before_operations_on_the_scores_goes_into_the_hook() {
    use kernels_lib::graph::Op;
    let s = seed();
    let g = Graph::new();
    let (b, h, kv, t, d) = (1, 4, 2, 24, 16);
    let [q, k, v, dy] = attention_inputs(&g, (b, h, kv, t, d));
    let sc = ((q.matmul(k.repeat_interleave(h / kv, 1).transpose(-1, -2)) * -0.25).sigmoid() * 6.0).softmax(-1);
    let y = sc.matmul(v.repeat_interleave(h / kv, 1));
    g.output("y", y).unwrap();
    let grads = g.grad(y, Some(dy), &[q, k, v]).unwrap();
    for (name, x) in ["dq", "dk", "dv"].iter().zip(&grads) {
        g.output(name, *x).unwrap();
    }
    assert!(grads.iter().all(|x| matches!(g.node(x.check().unwrap()).op, Op::AttentionGrad(a) if a.score_ops.is_some() && a.scale() == -0.25)), "the gradients' nodes: {grads:?}");
    let inputs = inputs_for(&g, s);
    let exact = evaluate(&g, &inputs, Rounding::None).unwrap();
    check_attention_fd(&g, &inputs, &exact, s);
    let rt = Runtime::interpreter();
    let mut plan = g.compile(&rt).unwrap();
    assert_eq!(plan.partition().groups.iter().filter(|gr| gr.attention.is_some() || gr.attention_grad.is_some()).count(), 2, "{}", plan.partition());
    let got = run(&mut plan, &g, &rt, &inputs);
    within_scaled(&format!("a negative scale before operations (seed {s})"), &got, &exact, &plan);
}

/// Constant factors of the operations on the scores move into the kernels' scale only while
/// it stays a normal f32: `tanh(s * 1e20 * 1e20)` keeps the second factor in the hook (the
/// scale would be past f32, and a query row of zeros would give `0 * inf`, NaN), and
/// `tanh(s * 1e-25 * 1e-25)` the second (a subnormal scale). The fused forward, with a query
/// row of zeros, agrees with f64.
#[test]
fn constant_factors_fold_into_the_scale_only_while_it_is_a_normal_f32() {
    for c in [1e20, 1e-25] {
        let g = Graph::new();
        let (b, h, t, d) = (1, 2, 24, 16);
        let q = g.input("q", DType::F32, &[b, h, t, d]);
        let k = g.input("k", DType::F32, &[b, h, t, d]);
        let v = g.input("v", DType::F32, &[b, h, t, d]);
        let x = (q.matmul(k.transpose(-1, -2)) * 0.25 * c * c).tanh();
        g.output("y", x.softmax(-1).matmul(v)).unwrap();
        // Halves (see `halves`): with a factor of 1e40 every nonzero score saturates the
        // tanh, so a random score within rounding of 0 could take the other sign fused
        // than in f64 (CI saw one, an error of 1.7 bounds).
        let mut inputs = halves(inputs_for(&g, seed()));
        inputs[0][3 * d..4 * d].fill(0.0);
        let exact = evaluate(&g, &inputs, Rounding::None).unwrap();
        let rt = Runtime::interpreter();
        let mut plan = g.compile(&rt).unwrap();
        assert!(plan.partition().groups.iter().any(|gr| gr.attention.is_some_and(|a| a.score_ops.is_some())), "{}", plan.partition());
        let got = run(&mut plan, &g, &rt, &inputs);
        assert!(got[0].iter().all(|x| x.is_finite()), "factor {c}: a non-finite output");
        within_scaled(&format!("factor {c} twice"), &got, &exact, &plan);
    }
}

/// GQA written with the query heads grouped (`q` viewed `[B, KV, G, T, D]` against `k`
/// and `v` unsqueezed to `[B, KV, 1, T, D]`), causal and under a key padding mask from
/// data, its result reshaped back to `[B, H, T, D]`: the gradients of `q`, `k` and `v` are one flash-attention backward with `G`
/// query heads a key/value head (the `AttentionGrad` nodes, checked against finite
/// differences of the f64 forward on a sample), and the plan's gradients on the
/// interpreter are within the attention tests' bound of the f64 ones.
#[test]
fn grouped_query_attention_gradients_are_one_flash_attention_backward() {
    use kernels_lib::graph::Op;
    let s = seed();
    let g = Graph::new();
    let (b, h, kv, t, d) = (2, 4, 2, 24, 16);
    let [q, k, v, dy] = attention_inputs(&g, (b, h, kv, t, d));
    let (q5, k5, v5) = (q.reshape(&[b, kv, h / kv, t, d]), k.reshape(&[b, kv, 1, t, d]), v.reshape(&[b, kv, 1, t, d]));
    // Under a key padding mask from data too, [B, 1, 1, 1, T] (key 0 kept: the first query
    // sees only it).
    let keep = g.input("keep", DType::F32, &[b, 1, 1, 1, t]).gt(-3.5).cast(DType::F32).maximum(g.tril(1, t, 0).cast(DType::F32)).gt(0.5);
    let sc = keep.where_(g.tril(t, t, 0).where_(q5.matmul(k5.transpose(-1, -2)) * 0.25, f64::NEG_INFINITY), f64::NEG_INFINITY);
    let y = sc.softmax(-1).matmul(v5).reshape(&[b, h, t, d]);
    g.output("y", y).unwrap();
    let grads = g.grad(y, Some(dy), &[q, k, v]).unwrap();
    for (name, x) in ["dq", "dk", "dv"].iter().zip(&grads) {
        g.output(name, *x).unwrap();
    }
    let attention_grads = grads.iter().filter(|x| matches!(g.node(x.check().unwrap()).op, Op::AttentionGrad(a) if a.causal && a.group == (h / kv) as u32 && a.data.is_some())).count();
    assert_eq!(attention_grads, 3, "the gradients' nodes: {grads:?}");
    let inputs = inputs_for(&g, s);
    let exact = evaluate(&g, &inputs, Rounding::None).unwrap();
    check_attention_fd(&g, &inputs, &exact, s);
    let rt = Runtime::interpreter();
    let mut plan = g.compile(&rt).unwrap();
    let p = plan.partition().clone();
    assert_eq!(p.groups.iter().filter(|gr| gr.attention.is_some()).count(), 1, "{p}");
    assert_eq!(p.groups.iter().filter(|gr| gr.attention_grad.is_some()).count(), 1, "{p}");
    let nodes = g.nodes();
    assert!(p.intermediates.iter().all(|id| nodes[id.index()].numel() < b * h * t * t), "a value of the scores' size in memory:\n{p}");
    let got = run(&mut plan, &g, &rt, &inputs);
    within_scaled(&format!("grouped-query attention gradients (seed {s})"), &got, &exact, &plan);
}

/// The f32 inputs of the attention gradient tests: `q` `[B, H, T, D]`, `k` and `v`
/// `[B, KV, T, D]`, and the output's gradient `dy` of `q`'s shape.
fn attention_inputs(g: &Graph, (b, h, kv, t, d): (usize, usize, usize, usize, usize)) -> [Tensor<'_>; 4] {
    let x = |name: &str, heads: usize| g.input(name, DType::F32, &[b, heads, t, d]);
    [x("q", h), x("k", kv), x("v", kv), x("dy", h)]
}

/// Inputs rounded to halves (in [-4, 4]): every score of a small head dimension is then exact
/// in the kernels (tf32 products of halves, f32 sums, a power-of-two scale), so a test whose
/// result turns on a score's sign does not depend on rounding.
fn halves(inputs: Vec<Vec<f64>>) -> Vec<Vec<f64>> {
    inputs.into_iter().map(|x| x.into_iter().map(|v| (v * 2.0).round() / 2.0).collect()).collect()
}

/// The attention gradient tests' check of the f64 gradients (outputs 1 to 3, of inputs 0 to
/// 2) against central differences of `sum(y * dy)` (output 0, `dy` input 3), on every 37th
/// element of each input.
fn check_attention_fd(g: &Graph, inputs: &[Vec<f64>], exact: &[Vec<f64>], s: u64) {
    let loss = |ins: &[Vec<f64>]| -> f64 { evaluate(g, ins, Rounding::None).unwrap()[0].iter().zip(&ins[3]).map(|(a, b)| a * b).sum() };
    let h_step = 1e-6;
    let mag: f64 = exact[0].iter().zip(&inputs[3]).map(|(a, b)| (a * b).abs()).sum();
    for x in 0..3 {
        for e in (0..inputs[x].len()).step_by(37) {
            check_derivative(&format!("attention (seed {s})"), exact[1 + x][e], &loss, inputs, (x, e), mag, h_step);
        }
    }
}

/// A plan's outputs against the f64 ones, each relative to the f64 output's largest
/// element (at least 1), within 1e-2 (the callers say why that bound).
fn within_scaled(what: &str, got: &[Vec<f64>], exact: &[Vec<f64>], plan: &kernels_lib::graph::Plan) {
    let scale: Vec<f64> = exact.iter().map(|o| o.iter().fold(1.0f64, |m, x| m.max(x.abs()))).collect();
    let scaled = |v: &[Vec<f64>]| -> Vec<Vec<f64>> { v.iter().zip(&scale).map(|(o, s)| o.iter().map(|x| x / s).collect()).collect() };
    within(what, &scaled(got), &scaled(exact), 1e-2, plan);
}

/// A node inside a matched attention asked for in `wrt` (its probabilities) keeps the
/// attention's composite gradient, which gives it (the flash backward has no such
/// output), and `dq` agrees with the flash path's; and a bf16 attention whose result is
/// added to an f32 residual gets a bf16 `dout` (every gradient in its node's type), so the
/// flash-attention backward step runs.
#[test]
fn gradients_inside_an_attention_and_of_mixed_types() {
    use kernels_lib::graph::Op;
    let s = seed();
    fn build(g: &Graph, dtype: DType) -> (Tensor<'_>, Tensor<'_>, Tensor<'_>) {
        let (q, k, v) = (g.input("q", dtype, &[1, 2, 16, 16]), g.input("k", dtype, &[1, 2, 16, 16]), g.input("v", dtype, &[1, 2, 16, 16]));
        let p = (q.matmul(k.transpose(-1, -2)) * 0.25).softmax(-1);
        (q, p, p.matmul(v))
    }
    let (flash, composite) = (Graph::new(), Graph::new());
    let (q1, _, y1) = build(&flash, DType::F32);
    let (q2, p2, y2) = build(&composite, DType::F32);
    let dq1 = flash.grad(y1, None, &[q1]).unwrap()[0];
    let [dq2, dp2] = composite.grad(y2, None, &[q2, p2]).unwrap()[..] else { unreachable!() };
    assert!(matches!(flash.node(dq1.check().unwrap()).op, Op::AttentionGrad(_)));
    assert!(!matches!(composite.node(dq2.check().unwrap()).op, Op::AttentionGrad(_)));
    flash.output("dq", dq1).unwrap();
    composite.output("dq", dq2).unwrap();
    composite.output("dp", dp2).unwrap();
    let inputs = inputs_for(&flash, s);
    let (a, b) = (evaluate(&flash, &inputs, Rounding::None).unwrap(), evaluate(&composite, &inputs, Rounding::None).unwrap());
    assert!(a[0].iter().zip(&b[0]).all(|(x, y)| (x - y).abs() <= 1e-9 * (1.0 + y.abs())), "dq differs between the paths (seed {s})");
    assert!(b[1].iter().any(|&x| x != 0.0), "the probabilities' gradient is zeros");
    // Mixed types: an f32 residual on a bf16 attention.
    let g = Graph::new();
    let (q, _, y) = build(&g, DType::BF16);
    let r = g.input("r", DType::F32, &[1, 2, 16, 16]);
    let out = r + y;
    let dq = g.grad(out, None, &[q]).unwrap()[0];
    assert_eq!(dq.dtype().unwrap(), DType::BF16);
    g.output("dq", dq).unwrap();
    let rt = Runtime::interpreter();
    let mut plan = g.compile(&rt).unwrap();
    assert_eq!(plan.partition().groups.iter().filter(|gr| gr.attention_grad.is_some()).count(), 1, "{}", plan.partition());
    let inputs = inputs_for(&g, s);
    let got = run(&mut plan, &g, &rt, &inputs);
    assert!(got[0].iter().all(|x| x.is_finite()), "the bf16 gradient ran");
}

/// The gradients of a causal GQA attention in bf16, plain, soft-capped, through other
/// operations on the scores, under a sliding window, under a key padding mask from data,
/// with a bias per head from data, and soft-capped under a window or through other
/// operations under a key padding mask (both in the hook), through the fuser on a GPU (one
/// flash-attention backward in causal mode, with a hook, the `SlidingWindow`, `KeyBias` or
/// `ScoreBias` score modification), against the same plan on the interpreter (itself
/// checked against f64 above).
#[test]
#[cfg_attr(not(feature = "gpu"), ignore = "needs a CUDA device (--features gpu)")]
fn causal_attention_gradients_on_a_gpu_match_the_interpreter() {
    let variants = [
        (None, None, None),
        (Some("cap"), None, None),
        (Some("ops"), None, None),
        (None, Some(24u32), None),
        (None, None, Some("keys")),
        (None, None, Some("head bias")),
        (Some("cap"), Some(24), None),
        (Some("ops"), None, Some("keys")),
    ];
    for (modify, window, data) in variants {
        let g = Graph::new();
        let (b, h, kv, t, d) = (2, 4, 2, 80, 64);
        let q = g.input("q", DType::BF16, &[b, h, t, d]) * 0.0625;
        let k = g.input("k", DType::BF16, &[b, kv, t, d]);
        let v = g.input("v", DType::BF16, &[b, kv, t, d]);
        let dy = g.input("dy", DType::BF16, &[b, h, t, d]);
        let s = q.matmul(k.repeat_interleave(h / kv, 1).transpose(-1, -2)) * 0.125;
        // Soft-capped, or through other operations (the kernels' hook).
        let s = match modify {
            Some("cap") => (s / 0.5).tanh() * 0.5,
            Some(_) => (s + 2.0).sigmoid() * 6.0,
            None => s,
        };
        // Causal, or a sliding window of 24 keys (the band of two trils, masked_fill's way).
        let s = match window {
            Some(w) => (g.tril(t, t, 0).cast(DType::BF16) - g.tril(t, t, -(w as i64)).cast(DType::BF16)).eq_(0.0).where_(f64::NEG_INFINITY, s),
            None => g.tril(t, t, 0).where_(s, f64::NEG_INFINITY),
        };
        // And a key padding mask from data (`KeyBias`, packed by the plan), or a bias per
        // head (`ScoreBias`).
        let s = match data {
            Some("keys") => g.input("keep", DType::BF16, &[b, 1, 1, t]).gt(-3.0).where_(s, f64::NEG_INFINITY),
            Some(_) => s + g.input("bias", DType::BF16, &[b, h, t, t]),
            None => s,
        };
        let y = s.softmax(-1).matmul(v.repeat_interleave(h / kv, 1));
        g.output("y", y).unwrap();
        for (name, x) in ["dq", "dk", "dv"].iter().zip(g.grad(y, Some(dy), &[q, k, v]).unwrap()) {
            g.output(name, x).unwrap();
        }
        let inputs = inputs_for(&g, seed());
        let (gpu, cpu) = (Runtime::cuda(0).expect("a CUDA device"), Runtime::interpreter());
        let mut plan = g.compile(&gpu).unwrap();
        assert!(plan.partition().groups.iter().any(|gr| gr.attention_grad.is_some_and(|a| a.causal && a.softcap().is_some() == (modify == Some("cap")) && a.score_ops.is_some() == (modify == Some("ops")) && a.window == window && a.data.is_some() == data.is_some())), "{}", plan.partition());
        let got = run(&mut plan, &g, &gpu, &inputs);
        let want = run(&mut g.compile(&cpu).unwrap(), &g, &cpu, &inputs);
        for (k, (o, w)) in got.iter().zip(&want).enumerate() {
            let scale = w.iter().fold(1e-3f64, |m, x| m.max(x.abs()));
            for i in 0..o.len() {
                assert!((o[i] - w[i]).abs() <= 2e-2 * scale, "modified {modify:?}, window {window:?}, data {data:?}: output {k} element {i}: {} on the GPU, {} on the interpreter", o[i], w[i]);
            }
        }
    }
}
