//! Reverse-mode automatic differentiation of a graph: [`Graph::grad`] appends to the
//! graph the nodes that compute the gradients of an output with respect to any of its
//! nodes (inputs, typically), built from the same operations the forward uses, so that
//! the backward is fused and compiled like any graph (elementwise chains into one kernel,
//! reductions per row, products on the library's matmul with transposes read through
//! strides).
//!
//! Each node's vector-Jacobian product, for the gradient `g` of its result `y`:
//!
//! | node | gradient of each operand |
//! |---|---|
//! | `a + b`, `a - b` | `g`, `±g` |
//! | `a * b`, `a / b` | `g b`, `g a`; `g / b`, `-g y / b` |
//! | `maximum(a, b)`, `minimum` | `g` to the larger (smaller), split evenly on ties (PyTorch) |
//! | `relu(a)` | `g` where `a > 0` |
//! | `exp`, `log`, `sqrt`, `rsqrt` | `g y`, `g / a`, `g / (2 y)`, `-g y / (2 a)` |
//! | `tanh`, `sigmoid` | `g (1 - y^2)`, `g y (1 - y)` |
//! | `neg`, `abs`, `exp2`, `log2`, `sin`, `cos` | `-g`, `g sign(a)`, `g y ln 2`, `g / (a ln 2)`, `g cos a`, `-g sin a` |
//! | `where_(c, a, b)` | `g` where `c`, where not `c` |
//! | `cast(a)` | `g` cast back |
//! | `sum`, `mean` along the last axis | `g` expanded (divided by the length) |
//! | `amax`, `amin` | `g` to the elements equal to the result, split evenly among them |
//! | `reshape`, `permute` | `g` reshaped, permuted back |
//! | `expand`, broadcasting | `g` summed over the repeated dimensions |
//! | `slice` (any step), `cat` | `g` placed among zeros; `g` sliced |
//! | `repeat_interleave` | `g` summed over each run of repeats |
//! | `a @ b` | `g @ b^T`, `a^T @ g` (summed over broadcast batch dimensions) |
//!
//! Comparisons, `argmax`/`argmin` and constants have no gradient (they pass none on).
//! Composite operations (`softmax`, `rms_norm`, `layer_norm`) are differentiated through
//! what they are built of; the gradient of `softmax`'s max shift cancels (up to rounding).
//! Gradients take the element type of the node they belong to (as PyTorch's do).
//!
//! A recognised attention ([`attention`](super::attention), on `[B, H, T, D]` operands,
//! its scores and softmax used by nothing else) is differentiated as a whole: its q, k
//! and v get [`Op::AttentionGrad`] nodes, which the fusion pass turns into one launch of
//! the library's flash-attention backward (the scores never in memory). Any other
//! attention is differentiated through its products and softmax.

use super::{AttentionGrad, BinOp, Graph, GraphError, Node, NodeId, Op, Reduction, Tensor, UnaryOp, View};
use std::collections::HashMap;

impl Graph {
    /// The gradients of `y` with respect to each of `wrt`: `d(sum(y * dy)) / d(x)` for each
    /// `x` of `wrt`, where `dy` is the gradient of `y` (of `y`'s shape; `None`: ones, so
    /// the gradients of `y.sum()`). Each gradient has its node's shape and element type;
    /// one `y` does not depend on is zeros. The gradients are tensors of this graph:
    /// name them as outputs to compute them.
    ///
    /// ```
    /// use dsl_runtime::{DType, Runtime};
    /// use kernels_lib::graph::{reference::{evaluate, Rounding}, Graph};
    ///
    /// let g = Graph::new();
    /// let x = g.input("x", DType::F32, &[3]);
    /// let y = (x * x).sum(-1); // sum of squares
    /// let [dx] = g.grad(y, None, &[x]).unwrap()[..] else { unreachable!() };
    /// g.output("dx", dx).unwrap();
    /// let out = evaluate(&g, &[vec![1.0, -2.0, 0.5]], Rounding::None).unwrap();
    /// assert_eq!(out[0], [2.0, -4.0, 1.0]);
    /// ```
    pub fn grad<'g>(&'g self, y: Tensor<'g>, dy: Option<Tensor<'g>>, wrt: &[Tensor<'g>]) -> Result<Vec<Tensor<'g>>, GraphError> {
        let foreign = |t: &Tensor<'g>| !std::ptr::eq(t.graph, self);
        if foreign(&y) || dy.as_ref().is_some_and(foreign) || wrt.iter().any(foreign) {
            return Err(GraphError::ForeignTensor { op: "grad" });
        }
        let yid = y.check()?;
        let ynode = self.node(yid);
        if !ynode.dtype.is_float() {
            return Err(GraphError::NoGradient { op: "grad".into(), detail: format!("the output is {}, not a float tensor", ynode.dtype) });
        }
        let seed = match dy {
            Some(d) => {
                let shape = d.shape()?;
                if shape != ynode.shape {
                    return Err(GraphError::NoGradient { op: "grad".into(), detail: format!("dy has shape {shape:?}, the output {:?}", ynode.shape) });
                }
                d.cast_to(ynode.dtype)
            }
            None => zeros(y, ynode.dtype, &ynode.shape).binary(BinOp::Add, 1.0),
        };
        let mut wants = Vec::with_capacity(wrt.len());
        for t in wrt {
            wants.push(t.check()?);
        }
        // The nodes `y` depends on, and the gradients flowing into each, from `y` down
        // (ids are a topological order).
        let nodes = self.nodes();
        let mut needed = vec![false; yid.index() + 1];
        needed[yid.index()] = true;
        for i in (0..=yid.index()).rev() {
            if needed[i] {
                for o in nodes[i].op.operands() {
                    needed[o.index()] = true;
                }
            }
        }
        let attentions = attentions(&nodes, &needed, &wants);
        let mut grads: HashMap<NodeId, Tensor<'g>> = HashMap::from([(yid, seed)]);
        for i in (0..=yid.index()).rev() {
            let id = NodeId(i as u32);
            let Some(g) = grads.get(&id).copied() else { continue };
            let contributions = match attentions.get(&id) {
                Some(a) => self.attention_vjp(a, g)?,
                None => self.vjp(id, &nodes[i], g)?,
            };
            for (operand, contribution) in contributions {
                if !needed[operand.index()] {
                    continue;
                }
                // In the operand's element type (a mixed-type operation's result is wider),
                // so that every gradient has its node's type.
                let contribution = contribution.cast_to(nodes[operand.index()].dtype);
                let sum = match grads.get(&operand) {
                    Some(&acc) => acc + contribution,
                    None => contribution,
                };
                sum.check()?;
                grads.insert(operand, sum);
            }
        }
        Ok(wants
            .into_iter()
            .map(|w| grads.get(&w).copied().unwrap_or_else(|| {
                let n = self.node(w);
                zeros(self.tensor(w), n.dtype, &n.shape)
            }))
            .collect())
    }

    /// The gradients of a recognised attention's q, k and v (before their heads are
    /// repeated) as three [`Op::AttentionGrad`] nodes: the library's flash-attention
    /// backward, one launch for the three (see [`fuse`](super::fuse)).
    fn attention_vjp<'g>(&'g self, a: &super::attention::Attention, g: Tensor<'g>) -> Result<Vec<(NodeId, Tensor<'g>)>, GraphError> {
        let dout = g.check()?;
        let p = AttentionGrad { q: a.q.0, k: a.k.0, v: a.v.0, dout, which: 0, group: a.group as u32, scale_bits: a.scale_bits, causal: a.causal, softcap_bits: a.softcap_bits, window: a.window, data: a.data, score_ops: a.score_ops };
        Ok([a.q.0, a.k.0, a.v.0]
            .into_iter()
            .enumerate()
            .map(|(w, x)| {
                let n = self.node(x);
                (x, self.add(Node { op: Op::AttentionGrad(AttentionGrad { which: w as u8, ..p }), dtype: n.dtype, shape: n.shape }))
            })
            .collect())
    }

    /// A handle to node `id`.
    fn tensor(&self, id: NodeId) -> Tensor<'_> {
        Tensor { graph: self, id: Ok(id) }
    }

    /// The gradient contributions of node `id` (`n`) to its operands, given its own `g`.
    fn vjp<'g>(&'g self, id: NodeId, n: &Node, g: Tensor<'g>) -> Result<Vec<(NodeId, Tensor<'g>)>, GraphError> {
        let t = |x: NodeId| self.tensor(x);
        let y = t(id);
        let none = |op: &str| GraphError::NoGradient { op: op.into(), detail: "no gradient rule for this operation".into() };
        Ok(match n.op {
            Op::Input(_) | Op::Const(_) | Op::Tril(_) | Op::Cmp(..) => vec![],
            Op::AttentionGrad(_) => return Err(GraphError::NoGradient { op: "attention_grad".into(), detail: "no second derivatives of attention".into() }),
            Op::Relu(a) => vec![(a, t(a).gt(0.0).where_(g, 0.0))],
            Op::Unary(op, a) => {
                let x = t(a);
                let d = match op {
                    UnaryOp::Neg => -g,
                    UnaryOp::Abs => x.gt(0.0).where_(g, x.lt(0.0).where_(-g, 0.0)),
                    UnaryOp::Exp => g * y,
                    UnaryOp::Exp2 => g * y * std::f64::consts::LN_2,
                    UnaryOp::Log => g / x,
                    UnaryOp::Log2 => g / (x * std::f64::consts::LN_2),
                    UnaryOp::Sqrt => g * 0.5 / y,
                    UnaryOp::Rsqrt => g * -0.5 * y / x,
                    UnaryOp::Sin => g * x.unary(UnaryOp::Cos),
                    UnaryOp::Cos => -(g * x.unary(UnaryOp::Sin)),
                    UnaryOp::Tanh => g * (1.0 - y * y),
                    UnaryOp::Sigmoid => g * y * (1.0 - y),
                    UnaryOp::Not => return Err(none(op.name())),
                };
                vec![(a, d)]
            }
            Op::Binary(op, a, b) => {
                let (xa, xb) = (t(a), t(b));
                let (da, db) = match op {
                    BinOp::Add => (g, g),
                    BinOp::Sub => (g, -g),
                    BinOp::Mul => (g * xb, g * xa),
                    BinOp::Div => (g / xb, -(g * y / xb)),
                    BinOp::Max | BinOp::Min => {
                        let wins = if op == BinOp::Max { xa.gt(xb) } else { xa.lt(xb) };
                        let loses = if op == BinOp::Max { xa.lt(xb) } else { xa.gt(xb) };
                        let half = g * 0.5;
                        (wins.where_(g, xa.eq_(xb).where_(half, 0.0)), loses.where_(g, xa.eq_(xb).where_(half, 0.0)))
                    }
                    _ => return Err(none(op.name())),
                };
                vec![(a, unbroadcast(da, &self.node(a))), (b, unbroadcast(db, &self.node(b)))]
            }
            Op::Where(c, a, b) => {
                let cond = t(c);
                vec![(a, unbroadcast(cond.where_(g, 0.0), &self.node(a))), (b, unbroadcast(cond.where_(0.0, g), &self.node(b)))]
            }
            Op::Cast(a) => vec![(a, g.cast_to(self.node(a).dtype))],
            Op::Reduce(r, a) => {
                let x = self.node(a);
                let (shape, len) = (x.shape.clone(), *x.shape.last().expect("a reduction has an axis") as f64);
                let d = match r {
                    Reduction::Sum => g.expand(&shape),
                    Reduction::Mean => (g / len).expand(&shape),
                    Reduction::Max | Reduction::Min => {
                        let at = t(a).eq_(y.expand(&shape));
                        let count = at.cast(g.graph_dtype().unwrap_or(n.dtype)).sum(-1);
                        at.where_((g / count).expand(&shape), 0.0)
                    }
                    Reduction::ArgMax | Reduction::ArgMin => return Ok(vec![]),
                };
                vec![(a, d)]
            }
            Op::View(v, a) => {
                let x = self.node(a);
                let d = match v {
                    View::Reshape => g.reshape(&x.shape),
                    View::Permute(p) => {
                        let mut inverse = vec![0; p.perm().len()];
                        for (i, &k) in p.perm().iter().enumerate() {
                            inverse[k as usize] = i;
                        }
                        g.permute(&inverse)
                    }
                    View::Expand => unbroadcast(g, &x),
                    View::Slice { axis, start, step } => scatter(g, &x, axis as usize, start as usize, step as usize),
                    View::RepeatInterleave { axis, repeats } => {
                        let axis = axis as usize;
                        let mut split = x.shape.clone();
                        split.insert(axis + 1, repeats as usize);
                        sum_along(g.reshape(&split), axis + 1).reshape(&x.shape)
                    }
                };
                vec![(a, d)]
            }
            Op::Concat(a, b, axis) => {
                let (la, lb) = (self.node(a).shape[axis as usize], self.node(b).shape[axis as usize]);
                let axis = axis as isize;
                vec![(a, g.slice(axis, 0, la)), (b, g.slice(axis, la, la + lb))]
            }
            Op::Matmul(a, b) => {
                let (xa, xb) = (t(a), t(b));
                let da = g.matmul(xb.transpose(-1, -2));
                let db = xa.transpose(-1, -2).matmul(g);
                vec![(a, unbroadcast(da, &self.node(a))), (b, unbroadcast(db, &self.node(b)))]
            }
        })
    }
}

/// The attentions among the nodes `needed` marks whose gradient can be the
/// flash-attention backward, by their result node: matched by
/// [`attention::match_at`](super::attention::match_at), on `[B, H, T, D]` operands of one
/// element type with the result's, and with nothing between the result and its q, k
/// and v (the scores, the softmax, the repeated heads) used by anything else the output
/// depends on (whose gradient would need those values) or asked for in `wrt`; and, under
/// a mask or bias from data, no gradient asked for through it (the flash-attention
/// backward gives the bias none).
fn attentions(nodes: &[Node], needed: &[bool], wrt: &[NodeId]) -> HashMap<NodeId, super::attention::Attention> {
    let mut users: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for (i, n) in nodes.iter().enumerate().take(needed.len()) {
        if needed[i] {
            for o in n.op.operands() {
                users.entry(o).or_default().push(NodeId(i as u32));
            }
        }
    }
    let mut out = HashMap::new();
    for (i, n) in nodes.iter().enumerate().take(needed.len()) {
        if !needed[i] || !matches!(n.op, Op::Matmul(..)) {
            continue;
        }
        let Ok(a) = super::attention::match_at(nodes, NodeId(i as u32)) else { continue };
        let (q, k, v) = (&nodes[a.q.0.index()], &nodes[a.k.0.index()], &nodes[a.v.0.index()]);
        if q.shape.len() != 4 || [q.dtype, k.dtype, v.dtype].iter().any(|&d| d != n.dtype) {
            continue;
        }
        // A mask or bias from data gets no gradient: none may be asked for through it.
        if a.data.is_some_and(|d| super::fuse::ancestors([d.at], |x| nodes[x.index()].op.operands()).iter().any(|x| wrt.contains(x))) {
            continue;
        }
        // The interior: from the result down to (not into) q, k and v, and the mask or
        // bias from data.
        let ends: Vec<NodeId> = [a.q.0, a.k.0, a.v.0].into_iter().chain(a.data.map(|d| d.at)).collect();
        let (mut inside, mut stack) = (std::collections::HashSet::new(), vec![a.out]);
        while let Some(x) = stack.pop() {
            if ends.contains(&x) || !inside.insert(x) {
                continue;
            }
            stack.extend(nodes[x.index()].op.operands().into_iter().filter(|o| !matches!(nodes[o.index()].op, Op::Const(_) | Op::Tril(_) | Op::Input(_)) || ends.contains(o)));
        }
        let private = inside.iter().all(|x| *x == a.out || (!wrt.contains(x) && users.get(x).is_none_or(|us| us.iter().all(|u| inside.contains(u)))));
        if private {
            out.insert(a.out, a);
        }
    }
    out
}

/// Zeros of `shape` and element type `dtype` (f32 for a mask), in `like`'s graph: a
/// constant expanded, no memory.
fn zeros<'g>(like: Tensor<'g>, dtype: dsl_runtime::DType, shape: &[usize]) -> Tensor<'g> {
    let z = like.scalar(0.0).cast_to(if dtype.is_float() { dtype } else { dsl_runtime::DType::F32 });
    if shape.is_empty() {
        z
    } else {
        z.expand(shape)
    }
}

/// `g` (of a broadcast result's shape) summed down to `to`'s shape: over the leading
/// dimensions `to` lacks and the dimensions where `to` has 1.
fn unbroadcast<'g>(g: Tensor<'g>, to: &Node) -> Tensor<'g> {
    let Ok(shape) = g.shape() else { return g };
    if shape == to.shape {
        return g;
    }
    let lead = shape.len() - to.shape.len();
    let mut s = g;
    for (k, &d) in shape.iter().enumerate() {
        if d != 1 && (k < lead || to.shape[k - lead] == 1) {
            s = sum_along(s, k);
        }
    }
    s.reshape(&to.shape)
}

/// `g` summed along `axis` (kept, of length 1), or zeros where the axis is empty: the
/// gradient of a broadcast or a repetition to nothing adds nothing up (where a graph's
/// reduction of nothing is an error, `GraphError::EmptyAxis`).
fn sum_along<'g>(g: Tensor<'g>, axis: usize) -> Tensor<'g> {
    match (g.shape(), g.dtype()) {
        (Ok(mut shape), Ok(dtype)) if shape[axis] == 0 => {
            shape[axis] = 1;
            zeros(g, dtype, &shape)
        }
        _ => g.sum(axis as isize),
    }
}

/// The gradient of `x.slice_step(axis, start, .., step)` (`g` of the slice's shape): `g`
/// at the positions the slice read, zeros elsewhere, built as views and concatenations:
/// each element followed by `step - 1` zeros (a new axis after `axis`, flattened into it),
/// cut to the axis's remaining length, with `start` zeros before and the rest after.
fn scatter<'g>(g: Tensor<'g>, x: &Node, axis: usize, start: usize, step: usize) -> Tensor<'g> {
    let Ok(shape) = g.shape() else { return g };
    let zeros_along = |len: usize| {
        let mut s = shape.clone();
        s[axis] = len;
        zeros(g, x.dtype, &s)
    };
    let m = shape[axis];
    // The positions `start..start + len` the spread slice covers (all of `m * step` but
    // the last element's trailing zeros past the axis's end).
    let len = (x.shape[axis] - start).min(m * step);
    let mut spread = g;
    if step > 1 {
        let mut with_step = shape.clone();
        with_step.insert(axis + 1, 1);
        let mut gaps = shape.clone();
        gaps.insert(axis + 1, step - 1);
        let mut flat = shape.clone();
        flat[axis] = m * step;
        spread = g.reshape(&with_step).cat(zeros(g, x.dtype, &gaps), axis as isize + 1).reshape(&flat);
        if len < m * step {
            spread = spread.slice(axis as isize, 0, len);
        }
    }
    if start > 0 {
        spread = zeros_along(start).cat(spread, axis as isize);
    }
    let after = x.shape[axis] - start - len;
    if after > 0 {
        spread = spread.cat(zeros_along(after), axis as isize);
    }
    spread
}
