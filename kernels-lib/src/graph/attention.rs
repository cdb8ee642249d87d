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
//! x      = m(f(s * c)) | m(f(s / c))   c a constant: the scale (c or 1 / c); the mask m
//!        | m(f(s))                     applied before or after the scale, or none; f the
//!                                      soft-cap `cap * tanh(y / cap)` (Gemma 2, as
//!                                      `tanh(y / cap) * cap` or with `* (1 / cap)`), or
//!                                      none: the kernel's `SoftCap` score modification
//! s      = matmul(q, k'^T)             k'^T = k'.transpose(-1, -2), k' like v'
//! m(y)   = where(tril, y, -inf)        tril = Graph::tril(T, T, 0), possibly reshaped
//!        | where(tril == 0, -inf, y)   or expanded to [.., T, T]: the causal mask,
//!        | y + where(tril, 0, -inf)     the kernel's causal flag (masked_fill, an additive
//!                                      bias); or the band tril(T, T, 0) - tril(T, T, -w)
//!                                      of 0/1 floats (compared with 0: `== 0`, `> 0`,
//!                                      `!= 0`): a sliding window of w keys, the causal
//!                                      flag and the kernel's `SlidingWindow` (not with a
//!                                      soft-cap: one score modification per kernel)
//! ```
//!
//! with `q`, `k`, `v` read through strides (permutations and expansions of a graph input
//! or of a stored value, [`fuse::strided_root`](super::fuse::strided_root)), the head
//! dimension contiguous and one of 16, 32, 64, 128, and the sequence lengths of `q` and
//! `k` equal. What does not match runs as written (products, a softmax); [`near_misses`]
//! says why a softmax between two products did not match.

use super::fuse::strided_root;
use super::{BinOp, Node, NodeId, Op, Reduction, UnaryOp, View};

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

/// Scores `y` masked or biased by data: `where(c, s, -inf)` or `where(c, -inf, s)`, or
/// `s + bias`, with `s` the product `q @ k^T` (under a cast or a constant scale), and the
/// mask or bias computed from no tril (one that is, in a way [`masked`] does not take, is
/// another near miss).
fn from_data(nodes: &[Node], y: NodeId) -> bool {
    let product = |z: NodeId| matches!(nodes[scaled(nodes, uncast(nodes, z)).0.index()].op, Op::Matmul(..));
    let data = |m: NodeId| !reads_tril(nodes, m);
    match nodes[y.index()].op {
        Op::Where(c, a, b) => data(c) && ((is_neg_inf(nodes, b) && product(a)) || (is_neg_inf(nodes, a) && product(b))),
        Op::Binary(BinOp::Add, a, b) => (product(a) && data(b)) || (product(b) && data(a)),
        _ => false,
    }
}

/// Whether `x` is computed from a `tril` (each node visited once).
fn reads_tril(nodes: &[Node], x: NodeId) -> bool {
    let (mut stack, mut seen) = (vec![x], std::collections::HashSet::new());
    while let Some(y) = stack.pop() {
        if !seen.insert(y) {
            continue;
        }
        if matches!(nodes[y.index()].op, Op::Tril(_)) {
            return true;
        }
        stack.extend(nodes[y.index()].op.operands());
    }
    false
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
    // The mask after the scale (and the soft-cap), or before it.
    let (x, mut mask) = masked(nodes, x).map_or((x, None), |(y, t)| (y, Some(t)));
    let (x, softcap) = soft_capped(nodes, x).map_or((x, None), |(y, c)| (y, Some(c)));
    let (mut s, scale) = scaled(nodes, x);
    // Before the scale only without a soft-cap: masked scores through the cap's tanh would
    // be `-cap`, not `-inf`, which is not what the kernel computes.
    if mask.is_none() && softcap.is_none() {
        if let Some((y, t)) = masked(nodes, s) {
            (s, mask) = (y, Some(t));
        }
    }
    if !(scale > 0.0 && scale.is_finite()) {
        return Err("the scale is not positive and finite (flash attention takes each row's max before scaling)");
    }
    if from_data(nodes, x) || from_data(nodes, s) {
        return Err("the scores are masked or biased by data (a bias added, or `where` on a mask that is not a tril): the kernel's `ScoreBias` takes such a bias, but the fuser does not pass one to it yet");
    }
    let Op::Matmul(q, kt) = nodes[s.index()].op else { return Err("the softmax's input is not a product q @ k^T (times a constant)") };
    let rank = nodes[q.index()].shape.len();
    if !(3..=4).contains(&rank) || nodes[kt.index()].shape.len() != rank || nodes[v.index()].shape.len() != rank {
        return Err("operands are not [B, H, T, D] (or [B, T, D])");
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
    let (qs, ks, vs) = (&nodes[q.index()].shape, &nodes[k.index()].shape, &nodes[v.index()].shape);
    let d = qs[rank - 1];
    if !HEAD_DIMS.contains(&d) || vs[rank - 1] != d {
        return Err("head dimension not 16, 32, 64 or 128 (or q and v differ)");
    }
    if ks != vs || ks[rank - 2] != qs[rank - 2] || qs[0] != ks[0] || (rank == 4 && qs[1] != ks[1] * gk) {
        return Err("q, k and v do not have one batch, sequence length and head grouping");
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
    if let Some((t, lower)) = mask {
        let tq = qs[rank - 2];
        if nodes[t.index()].op != Op::Tril(0) {
            return Err("the mask is a tril with a diagonal other than 0 (the kernel's mask is the causal one)");
        }
        if nodes[t.index()].shape != [tq, tq] {
            return Err("the causal mask is not [T, T] for the sequence length T");
        }
        if let Some(l) = lower {
            let Op::Tril(d) = nodes[l.index()].op else { unreachable!("band_under finds trils") };
            if d > -1 || nodes[l.index()].shape != [tq, tq] {
                return Err("a band whose lower tril is not [T, T] below the diagonal (a sliding window is tril(0) - tril(-w), w >= 1)");
            }
            if softcap.is_some() {
                return Err("a sliding window and a soft-cap together (the kernel takes one score modification)");
            }
            window = Some(u32::try_from(-d).map_err(|_| "a sliding window wider than 2^32 keys")?);
        }
    }
    let root = |x: NodeId| (x, strided_root(nodes, x));
    Ok(Attention { out, q: root(q), k: root(k), v: root(v), group: gk, scale_bits: scale.to_bits(), causal: mask.is_some(), softcap_bits: softcap.map(f64::to_bits), window })
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
