//! Recognising attention: `softmax(q @ k^T * scale) @ v` in a graph, however the seed
//! writes it, becomes one flash-attention launch (`flash_attention::attention`, GQA by
//! index mapping, no copy of the repeated key/value heads, the scores never in memory).
//!
//! The pattern, on `[B, H, T, D]` operands (rank 3 is `[B, T, D]`, one head):
//!
//! ```text
//! out    = matmul(p, v')               v' = v, or v.repeat_interleave(H / KV, 1) (or its
//!                                      expand + reshape spelling, Hugging Face's repeat_kv)
//! p      = softmax(x, -1)              as Tensor::softmax builds it (casts around it
//!                                      for 16-bit scores)
//! x      = m(f(s * c)) | m(f(s / c))   c a constant: the scale (c or 1 / c), positive
//!                                      (negative only before f: its sign in the hook); the masks m
//!        | m(f(s))                     applied before or after the scale, or none; f the
//!                                      soft-cap `cap * tanh(y / cap)` (Gemma 2, as
//!                                      `tanh(y / cap) * cap` or with `* (1 / cap)`); or
//!                                      other elementwise operations on the scaled scores
//!                                      with constants ([`ScoreOps`]: `tanh`, `exp`,
//!                                      `relu`, `+ - * / max min` a scalar, ..., casts
//!                                      between float types): either compiled into the
//!                                      kernels' score hook (`flash_attention::ScoreHook`,
//!                                      leading constant factors moved into the kernels'
//!                                      scale: `tanh(s) * cap` on `s / cap`); or none
//! s      = matmul(q, k'^T)             k'^T = k'.transpose(-1, -2), k' like v'
//! m(y)   = where(tril, y, -inf)        tril = Graph::tril(T, T, 0), possibly reshaped
//!        | where(tril == 0, -inf, y)   or expanded to [.., T, T]: the causal mask,
//!        | y + where(tril, 0, -inf)     the kernel's causal flag (masked_fill, an additive
//!                                      bias); or the band tril(T, T, 0) - tril(T, T, -w)
//!                                      of 0/1 floats (compared with 0: `== 0`, `> 0`,
//!                                      `!= 0`): a sliding window of w keys, the causal
//!                                      flag and the kernel's `SlidingWindow` (after a
//!                                      soft-cap or other operations: both in the
//!                                      kernels' score hook, the window's tiles skipped)
//!        | where(c, y, -inf)           and (or instead) one mask or bias from data: c a
//!        | where(c, -inf, y)           boolean tensor or one compared with a constant
//!        | y + bias                    (`keep > 0.5`, `mask == 0`), bias a float tensor
//!                                      (times the scale when added before it), either
//!                                      broadcast against the scores, shared by the
//!                                      heads ([B, 1, T, T], [B, 1, 1, T], [T, T]) or
//!                                      not ([B, H, T, T], [1, H, T, T], [B, H, 1, T]):
//!                                      the kernel's `ScoreBias`, packed from the tensor
//!                                      by the plan before the launch ([`ScoreData`]);
//!                                      after a soft-cap or other operations, or under a
//!                                      sliding window, all in the kernels' score hook
//!                                      (the window's tiles skipped). A tril the causal
//!                                      flag does not cover (another diagonal or shape)
//!                                      is such a mask too.
//! ```
//!
//! GQA may also be written with the query heads grouped (rank 5, `grouped_queries`): `q`
//! `[B, H, T, D]` reshaped to `[B, KV, G, T, D]`, `k` and `v` `[B, KV, T, D]` reshaped to
//! `[B, KV, 1, T, D]` (broadcast by the products) or expanded to `[B, KV, G, T, D]`, the
//! result `[B, KV, G, T, D]`: the same kernel (query head `h = kv G + g` reads key/value
//! head `h / G`), its result written as the `[B, H, T, D]` it reshapes to. A mask or bias
//! from data there must be shared by the heads.
//!
//! One difference from the graph as written: a query whose every key is masked gets a zero
//! output from the kernel, where `softmax` of a row of `-inf` gives NaN.
//!
//! with `q`, `k`, `v` read through strides (permutations and expansions of a graph input
//! or of a stored value, [`fuse::strided_root`](super::fuse::strided_root)), the head
//! dimension contiguous and one of 16, 32, 64, 128, and the sequence lengths of `q` and
//! `k` equal. What does not match runs as written (products, a softmax); [`near_misses`]
//! says why a softmax between two products did not match.

use super::fuse::strided_root;
use super::{BinOp, CmpOp, Node, NodeId, Op, Reduction, UnaryOp, View};

/// One matched attention: the result node and where its operands come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attention {
    pub out: NodeId,
    /// The operand nodes (after the key/value heads' repetition is undone) and the nodes
    /// their buffers hold.
    pub q: (NodeId, NodeId),
    pub k: (NodeId, NodeId),
    pub v: (NodeId, NodeId),
    /// Query heads per key/value head (`repeat_interleave`'s count, 1 without it).
    pub group: usize,
    /// The scale's bits (an `f64`), so that a match compares exactly.
    pub scale_bits: u64,
    /// Under the causal mask (a query sees the keys at and before its position).
    pub causal: bool,
    /// The soft-cap's bits (an `f64`), when the scaled scores are soft-capped.
    pub softcap_bits: Option<u64>,
    /// Under a sliding window (with `causal`): a query sees its `w` latest keys (itself
    /// included), the kernel's `SlidingWindow` score modification.
    pub window: Option<u32>,
    /// Masked or biased by data: the kernel's `ScoreBias` score modification.
    pub data: Option<ScoreData>,
    /// Other elementwise operations on the scaled scores, compiled into the kernels' hook.
    pub score_ops: Option<ScoreOps>,
}

impl Attention {
    pub fn scale(&self) -> f64 {
        f64::from_bits(self.scale_bits)
    }
    pub fn softcap(&self) -> Option<f64> {
        self.softcap_bits.map(f64::from_bits)
    }
}

/// `cap * tanh(y / cap)` in any of its spellings (`tanh(y / cap) * cap`, `cap * tanh(y *
/// (1 / cap))`): `(y, cap)` for a positive finite `cap`.
fn soft_capped(nodes: &[Node], x: NodeId) -> Option<(NodeId, f64)> {
    let Op::Binary(BinOp::Mul, a, b) = nodes[x.index()].op else { return None };
    let (t, cap) = [(a, b), (b, a)].into_iter().find_map(|(t, c)| konst(nodes, c).map(|c| (t, c)))?;
    let Op::Unary(UnaryOp::Tanh, inner) = nodes[uncast(nodes, t).index()].op else { return None };
    let (y, by) = scaled(nodes, inner);
    // tanh(y * by) with by = 1 / cap, to the rounding of the constant.
    (cap > 0.0 && cap.is_finite() && ((by * cap) - 1.0).abs() <= 1e-6).then_some((y, cap))
}

/// Elementwise operations on the scores with constants, `to = f(from)`: `from` the scaled
/// product (`scale * q k^T`, the score the kernels' hook is given; the product itself, scale
/// 1, where no constant multiplies it first), `to` what the softmax reads under its masks.
/// Each a unary operation (not `not`, and none whose derivative is unbounded at a finite
/// score: `log`, `log2`, `sqrt`, `rsqrt`), a `relu`, or a binary one of the scores and a
/// scalar constant (`+`, `-`, `*`, `/` by the constant, `max`, `min`); casts between float
/// types are read as none (the kernels compute the scores in f32: they neither round to a
/// 16-bit type between the operations nor overflow there, as the graph as written does).
/// Compiled into the kernels' score hook ([`ScoreSteps::hook`]), whose derivative is the
/// backward's, with the graph's own conventions at kinks (`relu'(0) = abs'(0) = 0`, half to
/// each side of a `max` or `min` tie: [`Graph::grad`](super::Graph::grad)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScoreOps {
    from: NodeId,
    to: NodeId,
}

/// One of [`ScoreOps`]' operations on a score `y`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScoreStep {
    Unary(UnaryOp),
    Relu,
    /// `y op c` (`score_first`) or `c op y`.
    Binary { op: BinOp, c: f64, score_first: bool },
}

/// [`ScoreOps`]' operations in the order they apply (the first on the kernel's score): what
/// [`ScoreOps::steps`] reads, or [`ScoreSteps::soft_cap`]; none (the default) where a hook
/// only carries a window over data.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScoreSteps(Vec<ScoreStep>);

impl ScoreOps {
    /// The node the operations start from (the kernel's score).
    pub fn from(self) -> NodeId {
        self.from
    }
    /// The node they end at.
    pub fn to(self) -> NodeId {
        self.to
    }
    /// Its operations, read from `nodes` (those the matcher found).
    pub fn steps(self, nodes: &[Node]) -> ScoreSteps {
        let mut steps = Vec::new();
        let mut x = self.to;
        while x != self.from {
            let Some(Ok((step, y))) = score_step(nodes, x) else { unreachable!("matched by score_ops") };
            steps.extend(step);
            x = y;
        }
        steps.reverse();
        ScoreSteps(steps)
    }
}

/// `x` as one operation of [`ScoreOps`] on the value `y` it reads: `(the operation, y)`,
/// no operation for a cast between float types. `Err` for an operation whose derivative is
/// unbounded at a finite score (its chain rule would multiply a zero by an infinity, where
/// the graph's gradient selects 0).
fn score_step(nodes: &[Node], x: NodeId) -> Option<Result<(Option<ScoreStep>, NodeId), &'static str>> {
    let float = |id: NodeId| nodes[id.index()].dtype.is_float();
    let step = match nodes[x.index()].op {
        Op::Cast(y) if float(x) && float(y) => (None, y),
        Op::Unary(UnaryOp::Log | UnaryOp::Log2 | UnaryOp::Sqrt | UnaryOp::Rsqrt, y) if float(y) => return Some(Err(SINGULAR)),
        Op::Unary(op, y) if op != UnaryOp::Not => (Some(ScoreStep::Unary(op)), y),
        Op::Relu(y) => (Some(ScoreStep::Relu), y),
        Op::Binary(op @ (BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Max | BinOp::Min), a, b) => match (konst(nodes, a), konst(nodes, b)) {
            (None, Some(c)) => (Some(ScoreStep::Binary { op, c, score_first: true }), a),
            (Some(_), None) if op == BinOp::Div => return float(b).then_some(Err(SINGULAR)),
            (Some(c), None) => (Some(ScoreStep::Binary { op, c, score_first: false }), b),
            _ => return None,
        },
        _ => return None,
    };
    float(step.1).then_some(Ok(step))
}

/// Why a chain of operations on the scores with a singular derivative is not matched.
const SINGULAR: &str = "an operation on the scores whose derivative is unbounded at a finite score (log, log2, sqrt, rsqrt, a constant divided by the scores): the kernels' gradient would be NaN where the graph's is 0";

/// [`ScoreOps`] ending at `x`, when at least one operation leads from the scaled product
/// (what [`scaled`] takes apart) to `x`; `Err` when such a chain holds an operation the
/// kernels do not take ([`score_step`]).
fn score_ops(nodes: &[Node], x: NodeId) -> Result<Option<ScoreOps>, &'static str> {
    let (mut y, mut ops) = (x, 0);
    loop {
        if matches!(nodes[scaled(nodes, y).0.index()].op, Op::Matmul(..)) {
            return Ok((ops > 0).then_some(ScoreOps { from: y, to: x }));
        }
        let Some(step) = score_step(nodes, y) else { return Ok(None) };
        let (step, next) = step?;
        ops += step.is_some() as usize;
        y = next;
    }
}

impl ScoreSteps {
    /// The value and the derivative of the operations at score `s`, in f64 (at kinks, the
    /// graph's conventions: see [`ScoreOps`]).
    pub fn eval(&self, s: f64) -> (f64, f64) {
        self.0.iter().fold((s, 1.0), |(y, d), step| match *step {
            ScoreStep::Relu => (y.max(0.0), if y > 0.0 { d } else { 0.0 }),
            ScoreStep::Unary(op) => {
                let (v, dv) = match op {
                    UnaryOp::Neg => (-y, -1.0),
                    UnaryOp::Abs => (y.abs(), y.signum() * f64::from(y != 0.0)),
                    UnaryOp::Exp => (y.exp(), y.exp()),
                    UnaryOp::Exp2 => (y.exp2(), y.exp2() * std::f64::consts::LN_2),
                    UnaryOp::Log => (y.ln(), 1.0 / y),
                    UnaryOp::Log2 => (y.log2(), 1.0 / (y * std::f64::consts::LN_2)),
                    UnaryOp::Sqrt => (y.sqrt(), 0.5 / y.sqrt()),
                    UnaryOp::Rsqrt => (1.0 / y.sqrt(), -0.5 / (y * y.sqrt())),
                    UnaryOp::Sin => (y.sin(), y.cos()),
                    UnaryOp::Cos => (y.cos(), -y.sin()),
                    UnaryOp::Tanh => (y.tanh(), 1.0 - y.tanh().powi(2)),
                    UnaryOp::Sigmoid => {
                        let g = 1.0 / (1.0 + (-y).exp());
                        (g, g * (1.0 - g))
                    }
                    UnaryOp::Not => unreachable!("not a score operation"),
                };
                (v, dv * d)
            }
            ScoreStep::Binary { op, c, score_first } => {
                let (a, b) = if score_first { (y, c) } else { (c, y) };
                // The derivative with respect to the score's side.
                let (v, dv) = match op {
                    BinOp::Add => (a + b, 1.0),
                    BinOp::Sub => (a - b, if score_first { 1.0 } else { -1.0 }),
                    BinOp::Mul => (a * b, c),
                    BinOp::Div if score_first => (a / b, 1.0 / c),
                    BinOp::Div => (a / b, -c / (y * y)),
                    BinOp::Max => (a.max(b), if y == c { 0.5 } else if y > c { 1.0 } else { 0.0 }),
                    BinOp::Min => (a.min(b), if y == c { 0.5 } else if y < c { 1.0 } else { 0.0 }),
                    _ => unreachable!("not a score operation"),
                };
                (v, dv * d)
            }
        })
    }

    /// The kernels' scale for scores scaled by `scale`, with the operations' leading
    /// multiplications and divisions by positive constants moved into it (one
    /// multiplication a score fewer), and the operations after them. A factor is moved only
    /// while the scale stays a normal, finite f32 (what the kernels take).
    pub fn split_scale(&self, scale: f64) -> (f32, ScoreSteps) {
        let mut scale = scale;
        let mut rest = self.0.as_slice();
        while let Some((&ScoreStep::Binary { op, c, score_first }, tail)) = rest.split_first() {
            let by = match op {
                BinOp::Mul => c,
                BinOp::Div if score_first => 1.0 / c,
                _ => break,
            };
            let folded = scale * by;
            if !(by > 0.0 && (folded as f32).is_normal()) {
                break;
            }
            scale = folded;
            rest = tail;
        }
        (scale as f32, ScoreSteps(rest.to_vec()))
    }

    /// The operations after a negation: the kernels scale by `|scale|` and the hook, whose
    /// result their softmax takes its maxima of, starts with `s * -1` (the unmodified
    /// kernels take each row's maximum before scaling, so their scale must be positive).
    pub fn negated(self) -> ScoreSteps {
        ScoreSteps([ScoreStep::Binary { op: BinOp::Mul, c: -1.0, score_first: true }].into_iter().chain(self.0).collect())
    }

    /// The soft-cap `tanh(s / cap) * cap` as operations.
    pub fn soft_cap(cap: f64) -> ScoreSteps {
        ScoreSteps(vec![ScoreStep::Binary { op: BinOp::Div, c: cap, score_first: true }, ScoreStep::Unary(UnaryOp::Tanh), ScoreStep::Binary { op: BinOp::Mul, c: cap, score_first: true }])
    }

    /// The kernels' score hook: the operations on the score (its first argument), in f32,
    /// then `then` (a score modification of the library, inlined: a window, a bias from
    /// data) on their result and the hook's other arguments.
    pub fn hook(&self, then: Option<std::sync::Arc<dsl_runtime::ir::builder::HookFn>>) -> crate::flash_attention::ScoreHook {
        let steps = self.0.clone();
        crate::flash_attention::ScoreHook::new(move |b, args, at| {
            let y = steps.iter().try_fold(args[0], |y, step| Ok::<_, dsl_runtime::BuildError>(dsl_runtime::ir::Operand::V(emit_step(b, *step, y, at)?)))?;
            match &then {
                None => Ok(y),
                Some(then) => {
                    let mut rest = args.to_vec();
                    rest[0] = y;
                    then(b, &rest, at)
                }
            }
        })
    }
}

/// One operation on `y` in the IR. The kinks are selects, so that the IR's derivative
/// takes the graph's conventions ([`ScoreOps`]): `relu` and `abs` 0 at 0, and `max` and
/// `min` at a tie the mean of the two sides, `(y + c) / 2` (the same value), so half.
fn emit_step(b: &mut dsl_runtime::ir::Builder, step: ScoreStep, y: dsl_runtime::ir::Operand, at: dsl_runtime::ir::Loc) -> Result<dsl_runtime::ir::Value, dsl_runtime::BuildError> {
    use dsl_runtime::ir::Operand::Float;
    // `select(y > c, above, select(y < c, below, tie))`.
    let kinked = |b: &mut dsl_runtime::ir::Builder, c: f64, above: dsl_runtime::ir::Operand, below: dsl_runtime::ir::Operand, tie: dsl_runtime::ir::Operand| {
        let (gt, lt) = (b.cmp(CmpOp::Gt, y, Float(c), at)?, b.cmp(CmpOp::Lt, y, Float(c), at)?);
        let low = b.select(lt, below, tie, at)?;
        b.select(gt, above, low, at)
    };
    match step {
        ScoreStep::Relu => kinked(b, 0.0, y, Float(0.0), Float(0.0)),
        ScoreStep::Unary(UnaryOp::Abs) => {
            let neg = b.unary(UnaryOp::Neg, y, at)?;
            kinked(b, 0.0, y, neg.into(), Float(0.0))
        }
        ScoreStep::Binary { op: op @ (BinOp::Max | BinOp::Min), c, .. } => {
            let sum = b.binary(BinOp::Add, y, Float(c), at)?;
            let mean = b.binary(BinOp::Mul, sum, Float(0.5), at)?;
            let (above, below) = if op == BinOp::Max { (y, Float(c)) } else { (Float(c), y) };
            kinked(b, c, above, below, mean.into())
        }
        ScoreStep::Unary(op) => b.unary(op, y, at),
        ScoreStep::Binary { op, c, score_first: true } => b.binary(op, y, Float(c), at),
        ScoreStep::Binary { op, c, score_first: false } => b.binary(op, Float(c), y, at),
    }
}

/// The operations as an expression of the score `s`: `tanh(s) * 2`.
impl std::fmt::Display for ScoreSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The expression so far, and whether it is a binary one (parenthesized as an operand).
        let (text, _) = self.0.iter().fold((String::from("s"), false), |(y, binary), step| {
            let operand = if binary { format!("({y})") } else { y.clone() };
            match *step {
                ScoreStep::Relu => (format!("relu({y})"), false),
                ScoreStep::Unary(UnaryOp::Neg) => (format!("-{operand}"), false),
                ScoreStep::Unary(op) => (format!("{}({y})", op.name()), false),
                ScoreStep::Binary { op: op @ (BinOp::Max | BinOp::Min), c, .. } => (format!("{}({y}, {c})", op.name()), false),
                ScoreStep::Binary { op, c, score_first } => {
                    let sym = match op {
                        BinOp::Add => "+",
                        BinOp::Sub => "-",
                        BinOp::Mul => "*",
                        _ => "/",
                    };
                    (if score_first { format!("{operand} {sym} {c}") } else { format!("{c} {sym} {operand}") }, true)
                }
            }
        });
        f.write_str(&text)
    }
}

/// The head dimensions the flash-attention kernel is built for.
const HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];

fn konst(nodes: &[Node], id: NodeId) -> Option<f64> {
    match nodes[id.index()].op {
        Op::Const(bits) if nodes[id.index()].numel() == 1 => Some(f64::from_bits(bits)),
        _ => None,
    }
}

/// `x` without casts on it.
fn uncast(nodes: &[Node], mut x: NodeId) -> NodeId {
    while let Op::Cast(y) = nodes[x.index()].op {
        x = y;
    }
    x
}

/// `softmax(x, -1)` as [`Tensor::softmax`](super::Tensor::softmax) builds it: its input.
fn softmax_input(nodes: &[Node], p: NodeId) -> Result<NodeId, &'static str> {
    let p = uncast(nodes, p);
    let Op::Binary(BinOp::Div, e, sum) = nodes[p.index()].op else { return Err("the product's first operand is not a softmax") };
    if nodes[sum.index()].op != Op::Reduce(Reduction::Sum, e) {
        return Err("the product's first operand is not a softmax (no row sum)");
    }
    let Op::Unary(UnaryOp::Exp, d) = nodes[e.index()].op else { return Err("the product's first operand is not a softmax (no exp)") };
    let Op::Binary(BinOp::Sub, x, m) = nodes[d.index()].op else { return Err("the product's first operand is not a softmax (no shift)") };
    if nodes[m.index()].op != Op::Reduce(Reduction::Max, x) {
        return Err("the product's first operand is not a softmax (no row max)");
    }
    Ok(uncast(nodes, x))
}

/// `x = s * c`, `s / c` or `s`: `(s, scale)`.
fn scaled(nodes: &[Node], x: NodeId) -> (NodeId, f64) {
    match nodes[x.index()].op {
        Op::Binary(BinOp::Mul, s, c) if konst(nodes, c).is_some() => (uncast(nodes, s), konst(nodes, c).unwrap_or(1.0)),
        Op::Binary(BinOp::Mul, c, s) if konst(nodes, c).is_some() => (uncast(nodes, s), konst(nodes, c).unwrap_or(1.0)),
        Op::Binary(BinOp::Div, s, c) if konst(nodes, c).is_some() => (uncast(nodes, s), 1.0 / konst(nodes, c).unwrap_or(1.0)),
        _ => (x, 1.0),
    }
}

/// A mask under casts (a 0/1 float mask, PyTorch's `torch.tril(torch.ones(T, T))`),
/// reshapes that only add or remove leading axes of 1 and expansions of leading axes (the
/// last two axes stay the tril's own, so each score `[.., i, j]` reads the tril at `[i,
/// j]`): the `Graph::tril` node it reads, if any; or a band, the difference of two such
/// 0/1 trils (`torch.tril(ones) - torch.tril(ones, -w)`, a sliding window): `(the tril
/// the keys are under, the tril they are not in)`.
fn band_under(nodes: &[Node], mut c: NodeId) -> Option<(NodeId, Option<NodeId>)> {
    let last2 = |id: NodeId| {
        let s = &nodes[id.index()].shape;
        (s.len() >= 2).then(|| (s[s.len() - 2], s[s.len() - 1]))
    };
    let leading_ones = |id: NodeId| {
        let s = &nodes[id.index()].shape;
        s.len() >= 2 && s[..s.len() - 2].iter().all(|&d| d == 1)
    };
    loop {
        let here = last2(c)?;
        match nodes[c.index()].op {
            Op::Cast(y) if last2(y) == Some(here) => c = y,
            Op::View(View::Expand, y) if last2(y) == Some(here) => c = y,
            Op::View(View::Reshape, y) if last2(y) == Some(here) && leading_ones(c) && leading_ones(y) => c = y,
            Op::Tril(_) => return Some((c, None)),
            Op::Binary(BinOp::Sub, a, b) if last2(a) == Some(here) && last2(b) == Some(here) => {
                return match (band_under(nodes, a)?, band_under(nodes, b)?) {
                    ((upper, None), (lower, None)) => Some((upper, Some(lower))),
                    _ => None,
                };
            }
            _ => return None,
        }
    }
}

/// A boolean mask of the keys a query sees: a tril (or band) itself, or a 0/1 float one
/// compared with 0 (`m > 0`, `m != 0`).
fn visible(nodes: &[Node], c: NodeId) -> Option<(NodeId, Option<NodeId>)> {
    match nodes[c.index()].op {
        Op::Cmp(super::CmpOp::Gt | super::CmpOp::Ne, m, z) if konst(nodes, z) == Some(0.0) => band_under(nodes, m),
        _ => band_under(nodes, c).filter(|_| nodes[c.index()].dtype == super::DType::Bool),
    }
}

fn is_neg_inf(nodes: &[Node], id: NodeId) -> bool {
    konst(nodes, id) == Some(f64::NEG_INFINITY)
}

/// The keys a masked query sees: those under the tril `upper` (the causal mask when its
/// diagonal is 0), and not under `lower` (a sliding window: `tril(0) - tril(-w)` keeps the
/// `w` keys at and before the query).
type Band = (NodeId, Option<NodeId>);

/// Whether band `(upper, lower)` is one the kernel takes for scores `[.., T, T]`: the causal
/// tril(T, T, 0), less a tril(T, T, -w) below the diagonal (a sliding window).
fn causal_band(nodes: &[Node], (upper, lower): Band, t: usize) -> bool {
    let square = |x: NodeId| nodes[x.index()].shape == [t, t];
    nodes[upper.index()].op == Op::Tril(0) && square(upper) && lower.is_none_or(|l| matches!(nodes[l.index()].op, Op::Tril(d) if d <= -1) && square(l))
}

/// `x` under its masks: a band the kernel's causal flag or sliding window takes
/// ([`masked`], [`causal_band`]) and one from data ([`data_masked`], an added bias times
/// `factor`), each at most once, in either order. Another tril (another diagonal, another
/// shape) is a mask from data.
fn unmasked(nodes: &[Node], mut x: NodeId, (band, data): (&mut Option<Band>, &mut Option<ScoreData>), factor: f64) -> NodeId {
    let s = &nodes[x.index()].shape;
    let t = s[s.len().saturating_sub(2)..].iter().copied().max().unwrap_or(0);
    loop {
        if band.is_none() {
            if let Some((y, b)) = masked(nodes, x).filter(|(_, b)| causal_band(nodes, *b, t)) {
                (x, *band) = (y, Some(b));
                continue;
            }
        }
        if data.is_none() {
            if let Some((y, d)) = data_masked(nodes, x, factor) {
                (x, *data) = (y, Some(d));
                continue;
            }
        }
        return x;
    }
}

/// `m(y)` of the [module docs](self): `(y, the band)`, or `None` when `x` is not
/// masked that way (a mask made of something else is not one the kernel knows).
fn masked(nodes: &[Node], x: NodeId) -> Option<(NodeId, Band)> {
    match nodes[x.index()].op {
        // where(mask, y, -inf): masked_fill(~mask, -inf).
        Op::Where(c, y, n) if is_neg_inf(nodes, n) => visible(nodes, c).map(|t| (uncast(nodes, y), t)),
        // where(mask == 0, -inf, y).
        Op::Where(c, n, y) if is_neg_inf(nodes, n) => match nodes[c.index()].op {
            Op::Cmp(super::CmpOp::Eq, a, z) | Op::Cmp(super::CmpOp::Eq, z, a) if konst(nodes, z) == Some(0.0) => band_under(nodes, a).map(|t| (uncast(nodes, y), t)),
            _ => None,
        },
        // y + where(mask, 0, -inf): an additive bias.
        Op::Binary(BinOp::Add, a, b) => [(a, b), (b, a)].into_iter().find_map(|(y, bias)| match nodes[bias.index()].op {
            Op::Where(c, z, n) if konst(nodes, z) == Some(0.0) && is_neg_inf(nodes, n) => visible(nodes, c).map(|t| (uncast(nodes, y), t)),
            _ => None,
        }),
        _ => None,
    }
}

/// How [`ScoreData`] turns the tensor it reads into a bias of the scores (the kernel's
/// `ScoreBias`; its packing kernel `flash_attention::score_bias_pack` computes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataOp {
    /// Added to the scores, times a factor (its bits, an `f64`): the scale when the bias is
    /// added before it, else 1.
    Add { factor_bits: u64 },
    /// A mask: a key is seen where `x cmp c` (`c`'s bits, an `f64`) holds when `keep`
    /// (`where(cond, s, -inf)`), where it does not otherwise (`where(cond, -inf, s)`).
    Mask { cmp: CmpOp, c_bits: u64, keep: bool },
}

/// Scores masked or biased by data (a tensor, not a tril the kernel's causal flag or
/// sliding window covers): `s + bias`, `where(mask, s, -inf)`, `where(mask == 0, -inf,
/// s)`, broadcast against the scores: one `[B, T, T]` bias shared by every head (padding
/// masks, document masks, a bias per batch) or one per head (ALiBi or a relative-position
/// bias as a tensor), the kernel's `ScoreBias`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScoreData {
    /// The node the scores' `where` or addition reads (the condition, or the bias): where
    /// the attention's interior ends.
    pub at: NodeId,
    /// The tensor read (the bias, or the mask under its comparison with a constant) and the
    /// node its buffer holds (under its strided views, [`strided_root`]).
    pub read: (NodeId, NodeId),
    pub how: DataOp,
}

impl std::fmt::Display for ScoreData {
    /// `bias %12` (`bias %12 * 0.25` when scaled), or `keys where %7 > 0` (`where not`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.how {
            DataOp::Add { factor_bits } if f64::from_bits(factor_bits) == 1.0 => write!(f, "bias {}", self.read.0),
            DataOp::Add { factor_bits } => write!(f, "bias {} * {}", self.read.0, f64::from_bits(factor_bits)),
            DataOp::Mask { c_bits, keep, .. } => {
                let op = ["!=", "==", ">", ">=", "<", "<="][self.how.pack_args().0 as usize - 1];
                write!(f, "keys where {}{} {op} {}", if keep { "" } else { "not " }, self.read.0, f64::from_bits(c_bits))
            }
        }
    }
}

impl DataOp {
    /// The arguments of the packing kernels (`flash_attention::score_bias_pack`, see
    /// `flash_attention::bias_of`): `(op, c, factor, keep)`.
    pub fn pack_args(self) -> (i32, f32, f32, i32) {
        match self {
            DataOp::Add { factor_bits } => (0, 0.0, f64::from_bits(factor_bits) as f32, 1),
            DataOp::Mask { cmp, c_bits, keep } => {
                let op = match cmp {
                    CmpOp::Ne => 1,
                    CmpOp::Eq => 2,
                    CmpOp::Gt => 3,
                    CmpOp::Ge => 4,
                    CmpOp::Lt | CmpOp::ULt => 5,
                    CmpOp::Le => 6,
                };
                (op, f64::from_bits(c_bits) as f32, 1.0, i32::from(keep))
            }
        }
    }
}

/// `cond` of a mask `where(cond, ..)`: `x cmp c` for a constant `c` (either side), or a
/// boolean `x` itself (`x != 0`): `(x, cmp, c)`.
fn condition(nodes: &[Node], cond: NodeId) -> Option<(NodeId, CmpOp, f64)> {
    let flip = |op: CmpOp| match op {
        CmpOp::Lt => CmpOp::Gt,
        CmpOp::Gt => CmpOp::Lt,
        CmpOp::Le => CmpOp::Ge,
        CmpOp::Ge => CmpOp::Le,
        op => op,
    };
    // The constant as the comparison sees it: rounded to its node's type.
    let rounded = |c: NodeId| {
        konst(nodes, c).map(|v| match nodes[c.index()].dtype {
            super::DType::F32 => v as f32 as f64,
            super::DType::F16 => half::f16::from_f64(v).to_f64(),
            super::DType::BF16 => half::bf16::from_f64(v).to_f64(),
            _ => v,
        })
    };
    match nodes[cond.index()].op {
        Op::Cmp(CmpOp::ULt, ..) => None,
        Op::Cmp(op, x, c) if rounded(c).is_some() => rounded(c).map(|c| (x, op, c)),
        Op::Cmp(op, c, x) if rounded(c).is_some() => rounded(c).map(|c| (x, flip(op), c)),
        _ => (nodes[cond.index()].dtype == super::DType::Bool).then_some((cond, CmpOp::Ne, 0.0)),
    }
}

/// Whether `x` leads to the scores' product through casts, constant scales, masks, biases
/// and a soft-cap, and with `ops` through other operations on the scores ([`ScoreOps`]):
/// the side of an addition that is the scores (the other is the bias). Each node is decided
/// once (`memo`): a bias built of shared nodes stays linear.
fn leads_to_product(nodes: &[Node], x: NodeId, ops: bool, memo: &mut std::collections::HashMap<NodeId, bool>) -> bool {
    let x = uncast(nodes, x);
    if let Some(&known) = memo.get(&x) {
        return known;
    }
    let leads = if let Some((y, _)) = soft_capped(nodes, x) {
        leads_to_product(nodes, y, ops, memo)
    } else {
        match nodes[x.index()].op {
            Op::Matmul(..) => true,
            Op::Binary(BinOp::Mul | BinOp::Div, a, c) if konst(nodes, c).is_some() => leads_to_product(nodes, a, ops, memo),
            Op::Binary(BinOp::Mul, c, a) if konst(nodes, c).is_some() => leads_to_product(nodes, a, ops, memo),
            Op::Binary(BinOp::Add, a, b) => leads_to_product(nodes, a, ops, memo) != leads_to_product(nodes, b, ops, memo),
            Op::Where(_, y, n) | Op::Where(_, n, y) if is_neg_inf(nodes, n) => leads_to_product(nodes, y, ops, memo),
            _ if ops => matches!(score_step(nodes, x), Some(Ok((_, y))) if leads_to_product(nodes, y, ops, memo)),
            _ => false,
        }
    };
    memo.insert(x, leads);
    leads
}

/// Scores `x` masked or biased by data (see [`ScoreData`]; `factor` multiplies an added
/// bias): `(the scores under it, the data)`.
fn data_masked(nodes: &[Node], x: NodeId, factor: f64) -> Option<(NodeId, ScoreData)> {
    let shape = &nodes[x.index()].shape;
    let fits = |y: NodeId| nodes[uncast(nodes, y).index()].shape == *shape;
    let mask = |c: NodeId, y: NodeId, keep: bool| {
        let (read, cmp, v) = condition(nodes, c)?;
        fits(y).then(|| (uncast(nodes, y), ScoreData { at: c, read: (read, strided_root(nodes, read)), how: DataOp::Mask { cmp, c_bits: v.to_bits(), keep } }))
    };
    match nodes[x.index()].op {
        Op::Where(c, y, n) if is_neg_inf(nodes, n) => mask(c, y, true),
        Op::Where(c, n, y) if is_neg_inf(nodes, n) => mask(c, y, false),
        Op::Binary(BinOp::Add, a, b) => {
            // The side that leads to the product: through scales, masks and a soft-cap first,
            // through other operations on the scores only where that decides nothing (so
            // that a bias computed through such operations from another product stays one).
            let side = |ops: bool| {
                let memo = &mut std::collections::HashMap::new();
                let (la, lb) = (leads_to_product(nodes, a, ops, memo), leads_to_product(nodes, b, ops, memo));
                (la != lb).then_some(if la { (a, b) } else { (b, a) })
            };
            let (y, bias) = side(false).or_else(|| side(true))?;
            // (A constant added changes nothing the softmax sees: not a bias from data.)
            let constant = matches!(nodes[strided_root(nodes, bias).index()].op, Op::Const(_));
            (!constant && fits(y) && nodes[bias.index()].dtype.is_float())
                .then(|| (uncast(nodes, y), ScoreData { at: bias, read: (bias, strided_root(nodes, bias)), how: DataOp::Add { factor_bits: factor.to_bits() } }))
        }
        _ => None,
    }
}

/// A key or value operand: `(node, repeats)` under an optional repetition of each head
/// along the head axis (1 of `[B, H, T, D]`): `repeat_interleave(G, 1)`, or the
/// Hugging Face `repeat_kv` spelling of it, `y[B, KV, T, D]` reshaped to
/// `[B, KV, 1, T, D]`, expanded to `[B, KV, G, T, D]` and reshaped to `[B, KV * G, T, D]`.
fn heads(nodes: &[Node], x: NodeId) -> (NodeId, usize) {
    let shape = |id: NodeId| nodes[id.index()].shape.as_slice();
    match nodes[x.index()].op {
        Op::View(View::RepeatInterleave { axis: 1, repeats }, y) if shape(x).len() == 4 => (y, repeats as usize),
        Op::View(View::Reshape, e) if shape(x).len() == 4 => {
            let Op::View(View::Expand, u) = nodes[e.index()].op else { return (x, 1) };
            let Op::View(View::Reshape, y) = nodes[u.index()].op else { return (x, 1) };
            let ([b, h, t, d], [b1, kv, g, t1, d1], [b2, kv2, 1, t2, d2], [b3, kv3, t3, d3]) = (shape(x), shape(e), shape(u), shape(y)) else { return (x, 1) };
            let same = [b, b1, b2, b3].iter().all(|z| *z == b) && [kv, kv2, kv3].iter().all(|z| *z == kv) && [t, t1, t2, t3].iter().all(|z| *z == t) && [d, d1, d2, d3].iter().all(|z| *z == d);
            if same && kv * g == *h {
                (y, *g)
            } else {
                (x, 1)
            }
        }
        _ => (x, 1),
    }
}


/// GQA written with the query heads grouped (rank-5 operands): `q[B, H, T, D]` reshaped
/// to `[B, KV, G, T, D]` (head `h` is group `h / G`, as `repeat_interleave` maps it), its
/// scores against `k[B, KV, T, D]` reshaped to `[B, KV, 1, T, D]` (broadcast by the
/// products, `k.unsqueeze(2)`) or that expanded to `[B, KV, G, T, D]`, and `v` the same:
/// the rank-4 operands `(q, k, v)` and `G`. `kt` is the scores' second operand, a
/// transpose of the last two axes of `k`'s rank-5 form. `None` where the operands are not
/// of that form.
fn grouped_queries(nodes: &[Node], q: NodeId, kt: NodeId, v: NodeId) -> Option<(NodeId, NodeId, NodeId, usize)> {
    let shape = |id: NodeId| nodes[id.index()].shape.as_slice();
    let Op::View(View::Reshape, q4) = nodes[q.index()].op else { return None };
    let (&[b, kv, g, t, d], &[b4, h, t4, d4]) = (shape(q), shape(q4)) else { return None };
    if (b4, h, t4, d4) != (b, kv * g, t, d) {
        return None;
    }
    let Op::View(View::Permute(p), k) = nodes[kt.index()].op else { return None };
    if p.perm() != [0, 1, 2, 4, 3] {
        return None;
    }
    // `y[B, KV, T, D]` reshaped to `[B, KV, 1, T, D]`, possibly expanded along the group.
    let unsqueezed = |x: NodeId| -> Option<NodeId> {
        let x = match nodes[x.index()].op {
            Op::View(View::Expand, y) if shape(x) == [b, kv, g, t, d] => y,
            _ => x,
        };
        let Op::View(View::Reshape, y) = nodes[x.index()].op else { return None };
        (shape(x) == [b, kv, 1, t, d] && shape(y) == [b, kv, t, d]).then_some(y)
    };
    Some((q4, unsqueezed(k)?, unsqueezed(v)?, g))
}

/// Whether a tensor of `shape`, broadcast against scores `[B, KV, G, T, T]`, has extent 1
/// along both head axes (or lacks them).
fn shared_by_grouped_heads(shape: &[usize]) -> bool {
    let at = |axis: usize| (axis + shape.len()).checked_sub(5).map_or(1, |j| shape[j]);
    at(1) == 1 && at(2) == 1
}

/// Whether `x`'s last dimension is contiguous in the buffer it is read from (through
/// permutations and expansions): the last axis of the root, not permuted away.
fn last_contiguous(nodes: &[Node], mut x: NodeId) -> bool {
    let mut axis = nodes[x.index()].shape.len() - 1;
    loop {
        match nodes[x.index()].op {
            Op::View(View::Permute(p), y) => {
                axis = p.perm()[axis] as usize;
                x = y;
            }
            Op::View(View::Expand, y) => {
                let off = nodes[x.index()].shape.len() - nodes[y.index()].shape.len();
                if axis < off || nodes[y.index()].shape[axis - off] == 1 {
                    return false;
                }
                axis -= off;
                x = y;
            }
            _ => return axis + 1 == nodes[x.index()].shape.len(),
        }
    }
}

/// Match attention at product `out` (see the [module docs](self)), or say why not.
pub fn match_at(nodes: &[Node], out: NodeId) -> Result<Attention, &'static str> {
    let Op::Matmul(p, v) = nodes[out.index()].op else { return Err("not a product") };
    let x = softmax_input(nodes, p)?;
    // The masks after the scale (and the soft-cap), or before it: a tril (the causal
    // flag, a sliding window) and one from data, in either order.
    let (mut mask, mut data) = (None, None);
    let x = unmasked(nodes, x, (&mut mask, &mut data), 1.0);
    let (x, softcap) = soft_capped(nodes, x).map_or((x, None), |(y, c)| (y, Some(c)));
    // Other operations on the scaled scores (a soft-cap is recognised as such: the dump
    // names it).
    let ops = if softcap.is_none() { score_ops(nodes, x)? } else { None };
    let (s, scale) = scaled(nodes, ops.map_or(x, |o| o.from));
    // Before the scale only without a soft-cap or other operations: masked scores through
    // the cap's tanh would be `-cap`, not `-inf`, which is not what the kernel computes. A
    // bias added there is scaled with the scores.
    let s = if softcap.is_none() && ops.is_none() { unmasked(nodes, s, (&mut mask, &mut data), scale) } else { s };
    // A negative scale before a soft-cap or other operations: its sign goes into the hook,
    // which the kernels' softmax follows ([`ScoreSteps::negated`]).
    let hooked = softcap.is_some() || ops.is_some();
    if !(scale.is_finite() && (scale > 0.0 || (hooked && scale < 0.0))) {
        return Err("the scale is not positive and finite (flash attention takes each row's max before scaling; a negative one only before operations on the scores)");
    }
    if data.is_some() && data_masked(nodes, s, 1.0).is_some() {
        return Err("two masks or biases from data (the kernel takes one: add the biases, or combine the masks, into one tensor)");
    }
    let Op::Matmul(q, kt) = nodes[s.index()].op else { return Err("the softmax's input is not a product q @ k^T (times a constant)") };
    if data.is_some_and(|d| super::fuse::ancestors([d.read.0], |x| nodes[x.index()].op.operands()).contains(&s)) {
        return Err("a mask or bias from data computed from the scores themselves (they would be computed twice, once in memory)");
    }
    // The query heads grouped (rank 5): the same attention on the rank-4 operands.
    if nodes[q.index()].shape.len() == 5 && data.is_some_and(|d| !shared_by_grouped_heads(&nodes[d.read.0.index()].shape)) {
        return Err("a mask or bias from data that differs between heads grouped as [B, KV, G, T, T] (the kernel reads one head stride)");
    }
    let (q, k, v, gk) = if nodes[q.index()].shape.len() == 5 {
        grouped_queries(nodes, q, kt, v).ok_or("rank-5 operands that are not q [B, H, T, D] grouped as [B, KV, G, T, D] against k and v [B, KV, T, D] as [B, KV, 1, T, D] (or expanded)")?
    } else {
        let rank = nodes[q.index()].shape.len();
        if !(3..=4).contains(&rank) || nodes[kt.index()].shape.len() != rank || nodes[v.index()].shape.len() != rank {
            return Err("operands are not [B, H, T, D] (or [B, T, D], or grouped [B, KV, G, T, D])");
        }
        let Op::View(View::Permute(perm), k) = nodes[kt.index()].op else { return Err("the scores' second operand is not a transpose k^T") };
        let swap: Vec<u8> = (0..rank as u8).map(|i| if i as usize == rank - 2 { rank as u8 - 1 } else if i as usize == rank - 1 { rank as u8 - 2 } else { i }).collect();
        if perm.perm() != swap.as_slice() {
            return Err("the scores' second operand is not k.transpose(-1, -2)");
        }
        let ((k, gk), (v, gv)) = (heads(nodes, k), heads(nodes, v));
        if gk != gv {
            return Err("keys and values repeat their heads differently");
        }
        (q, k, v, gk)
    };
    let rank = nodes[q.index()].shape.len();
    let (qs, ks, vs) = (&nodes[q.index()].shape, &nodes[k.index()].shape, &nodes[v.index()].shape);
    let d = qs[rank - 1];
    if !HEAD_DIMS.contains(&d) || vs[rank - 1] != d {
        return Err("head dimension not 16, 32, 64 or 128 (or q and v differ)");
    }
    if ks != vs || ks[rank - 2] != qs[rank - 2] || qs[0] != ks[0] || (rank == 4 && qs[1] != ks[1] * gk) {
        return Err("q, k and v do not have one batch, sequence length and head grouping");
    }
    if gk == 0 || qs.contains(&0) || ks.contains(&0) {
        return Err("no elements (an empty batch, head group, sequence or head)");
    }
    let dtype = nodes[out.index()].dtype;
    for x in [q, k, v] {
        if !last_contiguous(nodes, x) {
            return Err("a head dimension is not contiguous in memory");
        }
        if nodes[x.index()].dtype != dtype {
            return Err("q, k, v and the result are not of one element type");
        }
    }
    let mut window = None;
    if let Some((_, Some(lower))) = mask {
        let Op::Tril(d) = nodes[lower.index()].op else { unreachable!("band_under finds trils") };
        window = Some(u32::try_from(-d).map_err(|_| "a sliding window wider than 2^32 keys")?);
    }
    let root = |x: NodeId| (x, strided_root(nodes, x));
    Ok(Attention { out, q: root(q), k: root(k), v: root(v), group: gk, scale_bits: scale.to_bits(), causal: mask.is_some(), softcap_bits: softcap.map(f64::to_bits), window, data, score_ops: ops })
}

/// Every attention among `live` nodes.
pub fn find(nodes: &[Node], live: &[NodeId]) -> Vec<Attention> {
    live.iter().filter_map(|&id| match_at(nodes, id).ok()).collect()
}

/// Products whose first operand is a softmax but that did not match, with the reason.
pub fn near_misses(nodes: &[Node], live: &[NodeId]) -> Vec<(NodeId, &'static str)> {
    live.iter()
        .filter(|&&id| matches!(nodes[id.index()].op, Op::Matmul(p, _) if softmax_input(nodes, p).is_ok()))
        .filter_map(|&id| match_at(nodes, id).err().map(|e| (id, e)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each operation's derivative in [`ScoreSteps::eval`] (the f64 reference of the
    /// hooked backward) against central differences of its value, on both sides of 0 and
    /// with the score on either side of a binary operation.
    #[test]
    fn score_step_derivatives_match_central_differences() {
        let unary = [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Exp, UnaryOp::Exp2, UnaryOp::Log, UnaryOp::Log2, UnaryOp::Sqrt, UnaryOp::Rsqrt, UnaryOp::Sin, UnaryOp::Cos, UnaryOp::Tanh, UnaryOp::Sigmoid];
        let mut steps: Vec<ScoreStep> = unary.into_iter().map(ScoreStep::Unary).collect();
        steps.push(ScoreStep::Relu);
        for op in [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div, BinOp::Max, BinOp::Min] {
            for score_first in [true, false] {
                steps.push(ScoreStep::Binary { op, c: 0.7, score_first });
            }
        }
        for step in steps {
            let f = ScoreSteps(vec![step]);
            for s in [-1.3, 0.4, 2.1] {
                // Logarithms and roots where they are defined.
                if s < 0.0 && matches!(step, ScoreStep::Unary(UnaryOp::Log | UnaryOp::Log2 | UnaryOp::Sqrt | UnaryOp::Rsqrt)) {
                    continue;
                }
                let h = 1e-6;
                let fd = (f.eval(s + h).0 - f.eval(s - h).0) / (2.0 * h);
                let (_, d) = f.eval(s);
                assert!((d - fd).abs() <= 1e-6 * (1.0 + fd.abs()), "{step:?} at {s}: {d}, central differences {fd}");
            }
        }
        // A chain: the product of the derivatives.
        let chain = ScoreSteps(vec![ScoreStep::Binary { op: BinOp::Mul, c: 0.1, score_first: true }, ScoreStep::Binary { op: BinOp::Add, c: 2.0, score_first: true }, ScoreStep::Unary(UnaryOp::Sigmoid), ScoreStep::Binary { op: BinOp::Mul, c: 6.0, score_first: true }]);
        let g = 1.0 / (1.0 + (-(0.1 * 3.0 + 2.0f64)).exp());
        let (v, d) = chain.eval(3.0);
        assert!((v - 6.0 * g).abs() < 1e-12 && (d - 0.6 * g * (1.0 - g)).abs() < 1e-12, "{v} {d}");
        assert_eq!(chain.to_string(), "sigmoid((s * 0.1) + 2) * 6");
        let first = ScoreSteps(vec![ScoreStep::Binary { op: BinOp::Div, c: 2.0, score_first: false }, ScoreStep::Relu, ScoreStep::Binary { op: BinOp::Max, c: -1.0, score_first: true }]);
        assert_eq!(first.to_string(), "max(relu(2 / s), -1)");
    }

    /// Leading multiplications and divisions by positive constants become one factor of
    /// the kernels' scale, and the operations after them give the same value on the scaled
    /// score; a negative factor, a constant divided by the score, and anything after the
    /// first other operation stay.
    #[test]
    fn leading_positive_factors_move_into_the_scale() {
        let (scale, rest) = ScoreSteps::soft_cap(0.5).split_scale(0.25);
        assert_eq!((scale, rest.to_string()), (0.5, "tanh(s) * 0.5".to_string()));
        for s in [-3.0, 0.2, 5.0] {
            assert!((rest.eval(s * 0.5).0 - ScoreSteps::soft_cap(0.5).eval(s * 0.25).0).abs() < 1e-12);
        }
        let mul = |c: f64| ScoreStep::Binary { op: BinOp::Mul, c, score_first: false };
        let div = |c: f64, score_first: bool| ScoreStep::Binary { op: BinOp::Div, c, score_first };
        let chain = ScoreSteps(vec![mul(0.1), div(4.0, true), ScoreStep::Unary(UnaryOp::Tanh), mul(3.0)]);
        let (scale, rest) = chain.split_scale(1.0);
        assert_eq!((scale, rest.to_string()), ((0.1f64 / 4.0) as f32, "3 * tanh(s)".to_string()));
        for kept in [vec![mul(-2.0), mul(3.0)], vec![div(4.0, false)], vec![ScoreStep::Relu, mul(3.0)]] {
            let steps = ScoreSteps(kept);
            assert_eq!(steps.split_scale(1.0), (1.0, steps.clone()));
        }
        // Only while the scale stays a normal f32: 1e20 once (2.5e19), not twice (2.5e39, past
        // f32); 1e-25 not once (2.5e-26 is normal) but twice (2.5e-51 is not).
        let (scale, rest) = ScoreSteps(vec![mul(1e20), mul(1e20), ScoreStep::Unary(UnaryOp::Tanh)]).split_scale(0.25);
        assert_eq!((scale, rest.0.len()), (2.5e19, 2));
        let (scale, rest) = ScoreSteps(vec![mul(1e-25), mul(1e-25), ScoreStep::Unary(UnaryOp::Tanh)]).split_scale(0.25);
        assert_eq!((scale, rest.0.len()), (2.5e-26, 2));
    }
}
