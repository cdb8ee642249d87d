//! A host evaluation of a graph, node by node over whole tensors, for tests: in `f64`
//! ([`Rounding::None`]), or rounding every node to its element type with the interpreter's
//! scalar rules ([`Rounding::AsStored`], which a plan on the interpreter matches exactly).

use super::plan::PlanError;
use super::{flatten, unflatten, Graph, Node, Op, Reduction};
use dsl_runtime::ir::arith::{eval_binary, eval_cast, eval_cmp, eval_unary, ConstVal};
use dsl_runtime::ir::{BinOp, CmpOp, UnaryOp};
use dsl_runtime::DType;

/// How the reference rounds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Rounding {
    /// Exact `f64` arithmetic (math functions in `f64` too); inputs as given.
    None,
    /// Every node rounded to its element type, with the IR's scalar semantics
    /// (`dsl_runtime::ir::arith`).
    AsStored,
}

/// The gradient `a.which` of attention `o = softmax(s q k^T) v` in f64, from the values of
/// its operands (row-major `[.., H, T, D]` and `[.., KV, T, D]`): with `P` the
/// probabilities and `dP = dO v^T`, `dS = P (dP - rowsum(dO o))`; `dq = s dS k`,
/// `dk = s dS^T q`, `dv = P^T dO`, the key/value ones summed over each group; a mask or
/// bias from data added to the scaled scores (soft-capped, or through other operations).
fn attention_grad(a: &super::AttentionGrad, nodes: &[Node], vals: &[Vec<f64>]) -> Vec<f64> {
    let (sq, sk) = (&nodes[a.q.index()].shape, &nodes[a.k.index()].shape);
    let r = sq.len();
    let (t, d, h, kvh) = (sq[r - 2], sq[r - 1], sq[r - 3], sk[r - 3]);
    let batch: usize = sq[..r - 3].iter().product();
    let (q, k, v, dout) = (&vals[a.q.index()], &vals[a.k.index()], &vals[a.v.index()], &vals[a.dout.index()]);
    let scale = a.scale();
    // The soft-cap of a scaled score, or the other operations on it, and its derivative
    // (the identity and 1 without either).
    let ops = a.score_ops.map(|o| o.steps(nodes));
    let cap = |x: f64| match (a.softcap(), &ops) {
        (Some(c), _) => ((x / c).tanh() * c, 1.0 - (x / c).tanh().powi(2)),
        (None, Some(o)) => o.eval(x),
        (None, None) => (x, 1.0),
    };
    // A mask or bias from data at score (batch b, head hq, query i, key j): the value of
    // the node the scores' `where` or addition reads, broadcast against them.
    let bias = |b: usize, hq: usize, i: usize, j: usize| -> f64 {
        let Some(data) = a.data else { return 0.0 };
        let shape = &nodes[data.at.index()].shape;
        let mut at: Vec<usize> = unflatten(b, &sq[..r - 3]);
        // The scores' coordinates: with the query heads grouped (a rank-5 `dout`, `[B, KV,
        // G, T, D]`), head `hq` is group `hq / G`, member `hq % G`.
        match nodes[a.dout.index()].shape[..] {
            [_, _, g, _, _] => at.extend([hq / g, hq % g, i, j]),
            _ => at.extend([hq, i, j]),
        }
        let at: Vec<usize> = shape.iter().zip(&at[at.len() - shape.len()..]).map(|(&n, &c)| if n == 1 { 0 } else { c }).collect();
        let x = vals[data.at.index()][flatten(&at, shape)];
        match data.how {
            super::attention::DataOp::Add { factor_bits } => x * f64::from_bits(factor_bits),
            super::attention::DataOp::Mask { keep, .. } if (x != 0.0) == keep => 0.0,
            super::attention::DataOp::Mask { .. } => f64::NEG_INFINITY,
        }
    };
    let mut out = vec![0.0; if a.which == 0 { q.len() } else { k.len() }];
    for b in 0..batch {
        for hq in 0..h {
            let hk = hq / a.group as usize;
            let (qo, ko) = ((b * h + hq) * t * d, (b * kvh + hk) * t * d);
            // The scaled scores, the probabilities, and the output for the row sums.
            let raw: Vec<f64> = (0..t * t).map(|ij| scale * (0..d).map(|e| q[qo + ij / t * d + e] * k[ko + ij % t * d + e]).sum::<f64>()).collect();
            let mut p = vec![0.0; t * t];
            for i in 0..t {
                let hidden = |j: usize| (a.causal && j > i) || a.window.is_some_and(|w| i >= j + w as usize);
                let s: Vec<f64> = (0..t).map(|j| if hidden(j) { f64::NEG_INFINITY } else { cap(raw[i * t + j]).0 + bias(b, hq, i, j) }).collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for j in 0..t {
                    p[i * t + j] = (s[j] - m).exp() / l;
                }
            }
            for i in 0..t {
                let o: Vec<f64> = (0..d).map(|e| (0..t).map(|j| p[i * t + j] * v[ko + j * d + e]).sum()).collect();
                let delta: f64 = (0..d).map(|e| dout[qo + i * d + e] * o[e]).sum();
                for j in 0..t {
                    let dp: f64 = (0..d).map(|e| dout[qo + i * d + e] * v[ko + j * d + e]).sum();
                    // Through the soft-cap: its derivative at the scaled score.
                    let ds = p[i * t + j] * (dp - delta) * cap(raw[i * t + j]).1;
                    for e in 0..d {
                        match a.which {
                            0 => out[qo + i * d + e] += scale * ds * k[ko + j * d + e],
                            1 => out[ko + j * d + e] += scale * ds * q[qo + i * d + e],
                            _ => out[ko + j * d + e] += p[i * t + j] * dout[qo + i * d + e],
                        }
                    }
                }
            }
        }
    }
    out
}

/// The outputs of `graph` (in order, row-major) for `inputs` (in order, row-major, as
/// `f64`). Errors: a graph that does not compile, or inputs of the wrong number or length.
pub fn evaluate(graph: &Graph, inputs: &[Vec<f64>], rounding: Rounding) -> Result<Vec<Vec<f64>>, PlanError> {
    if let Some(e) = graph.first_error() {
        return Err(e.into());
    }
    let ins = graph.inputs();
    if ins.len() != inputs.len() {
        return Err(PlanError::Count { what: "input", expected: ins.len(), got: inputs.len() });
    }
    let nodes = graph.nodes();
    let mut vals: Vec<Vec<f64>> = Vec::with_capacity(nodes.len());
    for node in &nodes {
        let v = match node.op {
            Op::Input(i) => {
                let x = &inputs[i];
                if x.len() != node.numel() {
                    return Err(PlanError::Len { what: "input", name: ins[i].0.clone(), expected: node.numel(), got: x.len(), shape: node.shape.clone() });
                }
                x.iter().map(|&v| round(rounding, node.dtype, v)).collect()
            }
            Op::Const(bits) => vec![f64::from_bits(bits)],
            Op::Tril(k) => {
                let cols = node.shape[1];
                (0..node.numel()).map(|i| f64::from(((i % cols) as i64) <= (i / cols) as i64 + k)).collect()
            }
            Op::Reduce(r, x) => {
                // In f64 (the kernels sum in f32: results differ in the last bits), then
                // rounded to the node's type as stored.
                let (xs, row) = (&vals[x.index()], nodes[x.index()].shape.last().copied().unwrap_or(1));
                (0..node.numel())
                    .map(|i| {
                        let part = &xs[i * row..(i + 1) * row];
                        let v = match r {
                            Reduction::Sum => part.iter().sum(),
                            Reduction::Mean => part.iter().sum::<f64>() / row as f64,
                            Reduction::Max => part.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                            Reduction::Min => part.iter().copied().fold(f64::INFINITY, f64::min),
                            // The first best; NaN loses to any number.
                            Reduction::ArgMax | Reduction::ArgMin => {
                                let better = |a: f64, b: f64| !a.is_nan() && (b.is_nan() || if r == Reduction::ArgMax { a > b } else { a < b });
                                (0..row).fold(0, |best, j| if better(part[j], part[best]) { j } else { best }) as f64
                            }
                        };
                        round(rounding, node.dtype, v)
                    })
                    .collect()
            }
            // An element of the view is the operand's element it reads (the same type).
            Op::View(v, x) => {
                let (from, xs) = (&nodes[x.index()].shape, &vals[x.index()]);
                (0..node.numel())
                    .map(|flat| {
                        let src = v.source(from, &node.shape, &unflatten(flat, &node.shape));
                        xs[flatten(&src, from)]
                    })
                    .collect()
            }
            // In f64, rounded to the node's type as stored (the kernels sum in f32).
            Op::Matmul(x, y) => {
                let (sx, sy) = (&nodes[x.index()].shape, &nodes[y.index()].shape);
                let r = node.shape.len();
                let kdim = sx[sx.len() - 1];
                let flat_in = |c: &[usize], s: &[usize]| {
                    // `c`: coordinates in the result's batch dimensions, then the matrix's two.
                    let off = r - s.len();
                    s.iter().enumerate().fold(0, |acc, (j, &d)| acc * d + if d == 1 { 0 } else { c[j + off] })
                };
                (0..node.numel())
                    .map(|flat| {
                        let c = unflatten(flat, &node.shape);
                        let (i, j) = (c[r - 2], c[r - 1]);
                        let v: f64 = (0..kdim)
                            .map(|p| {
                                let (mut ca, mut cb) = (c.clone(), c.clone());
                                (ca[r - 2], ca[r - 1], cb[r - 2], cb[r - 1]) = (i, p, p, j);
                                vals[x.index()][flat_in(&ca, sx)] * vals[y.index()][flat_in(&cb, sy)]
                            })
                            .sum();
                        round(rounding, node.dtype, v)
                    })
                    .collect()
            }
            Op::AttentionGrad(a) => attention_grad(&a, &nodes, &vals).into_iter().map(|v| round(rounding, node.dtype, v)).collect(),
            Op::Concat(x, y, axis) => {
                let (a, sx, sy) = (axis as usize, &nodes[x.index()].shape, &nodes[y.index()].shape);
                (0..node.numel())
                    .map(|flat| {
                        let mut c = unflatten(flat, &node.shape);
                        if c[a] < sx[a] {
                            vals[x.index()][flatten(&c, sx)]
                        } else {
                            c[a] -= sx[a];
                            vals[y.index()][flatten(&c, sy)]
                        }
                    })
                    .collect()
            }
            _ => {
                let ops = node.op.operands();
                let args: Vec<(&Node, &Vec<f64>)> = ops.iter().map(|o| (&nodes[o.index()], &vals[o.index()])).collect();
                (0..node.numel())
                    .map(|flat| {
                        let a: Vec<f64> = args.iter().map(|(n, v)| v[broadcast_index(&node.shape, &n.shape, flat)]).collect();
                        let types: Vec<DType> = args.iter().map(|(n, _)| n.dtype).collect();
                        apply(node, &a, &types, rounding)
                    })
                    .collect()
            }
        };
        vals.push(v);
    }
    Ok(graph.outputs().iter().map(|(_, id)| vals[id.index()].clone()).collect())
}

/// The flat index in a tensor of shape `s` of the element that flat index `flat` of shape
/// `space` reads (NumPy broadcasting, aligned on the right).
fn broadcast_index(space: &[usize], s: &[usize], flat: usize) -> usize {
    let mut rem = flat;
    let mut idx = 0;
    let mut stride = 1;
    for j in (0..space.len()).rev() {
        let c = rem % space[j];
        rem /= space[j];
        let k = j as isize - (space.len() - s.len()) as isize;
        if k >= 0 {
            let d = s[k as usize];
            if d > 1 {
                idx += c * stride;
            }
            stride *= d;
        }
    }
    idx
}

fn round(rounding: Rounding, d: DType, x: f64) -> f64 {
    match rounding {
        Rounding::None => x,
        Rounding::AsStored => d.round(x),
    }
}

/// One element of `node` from its operands' elements `a` (of types `types`).
fn apply(node: &Node, a: &[f64], types: &[DType], rounding: Rounding) -> f64 {
    let d = node.dtype;
    if rounding == Rounding::AsStored {
        let c = |x: f64, t: DType| if t == DType::Bool { ConstVal::Bool(x != 0.0) } else { ConstVal::Float(x) };
        // Operands promote to the node's type first (as the builder converts them).
        let p = |i: usize| c(d.round(a[i]), d);
        let r = match node.op {
            Op::Relu(_) => eval_binary(BinOp::Max, d, p(0), ConstVal::Float(0.0)),
            Op::Unary(op, _) => eval_unary(op, d, p(0)),
            Op::Binary(op, ..) => eval_binary(op, d, p(0), p(1)),
            Op::Cmp(op, ..) => {
                let t = DType::promote(types[0], types[1]).unwrap_or(DType::F32);
                Ok(ConstVal::Bool(eval_cmp(op, t, c(t.round(a[0]), t), c(t.round(a[1]), t))))
            }
            Op::Where(..) => Ok(if a[0] != 0.0 { p(1) } else { p(2) }),
            Op::Cast(_) => Ok(eval_cast(types[0], d, c(a[0], types[0]))),
            Op::Input(_) | Op::Const(_) | Op::Tril(_) | Op::Reduce(..) | Op::View(..) | Op::Concat(..) | Op::Matmul(..) | Op::AttentionGrad(..) => Ok(ConstVal::Float(a[0])),
        };
        return r.map(ConstVal::as_f64).unwrap_or(f64::NAN);
    }
    match node.op {
        Op::Relu(_) => a[0].max(0.0),
        Op::Unary(op, _) => match op {
            UnaryOp::Neg => -a[0],
            UnaryOp::Abs => a[0].abs(),
            UnaryOp::Exp => a[0].exp(),
            UnaryOp::Exp2 => a[0].exp2(),
            UnaryOp::Log => a[0].ln(),
            UnaryOp::Log2 => a[0].log2(),
            UnaryOp::Sqrt => a[0].sqrt(),
            UnaryOp::Rsqrt => 1.0 / a[0].sqrt(),
            UnaryOp::Sin => a[0].sin(),
            UnaryOp::Cos => a[0].cos(),
            UnaryOp::Tanh => a[0].tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-a[0]).exp()),
            UnaryOp::Not => f64::NAN,
        },
        Op::Binary(op, ..) => match op {
            BinOp::Add => a[0] + a[1],
            BinOp::Sub => a[0] - a[1],
            BinOp::Mul => a[0] * a[1],
            BinOp::Div => a[0] / a[1],
            BinOp::Max => a[0].max(a[1]),
            BinOp::Min => a[0].min(a[1]),
            _ => f64::NAN,
        },
        Op::Cmp(op, ..) => {
            let (x, y) = (a[0], a[1]);
            (match op {
                CmpOp::Lt | CmpOp::ULt => x < y,
                CmpOp::Le => x <= y,
                CmpOp::Gt => x > y,
                CmpOp::Ge => x >= y,
                CmpOp::Eq => x == y,
                CmpOp::Ne => x != y,
            }) as u8 as f64
        }
        Op::Where(..) => {
            if a[0] != 0.0 {
                a[1]
            } else {
                a[2]
            }
        }
        Op::Cast(_) => a[0],
        Op::Input(_) | Op::Const(_) | Op::Tril(_) | Op::Reduce(..) | Op::View(..) | Op::Concat(..) | Op::Matmul(..) | Op::AttentionGrad(..) => a[0],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_index_follows_numpy() {
        // [7, 1, 5] in [7, 4, 5]: element (i, j, k) reads (i, 0, k).
        assert_eq!(broadcast_index(&[7, 4, 5], &[7, 1, 5], 2 * 20 + 3 * 5 + 4), 2 * 5 + 4);
        assert_eq!(broadcast_index(&[3, 1000], &[1000], 1999), 999);
        assert_eq!(broadcast_index(&[3, 1000], &[], 1999), 0);
    }
}
