//! Attention written in the DSL: the flash-attention forward pass (online softmax over
//! key/value tiles, FlashAttention-2's loop order), with grouped-query heads.
//!
//! Status (issue 14): the forward pass, full or causal, any sequence length, checked on
//! the CPU interpreter against an f64 reference and assembled to tensor-core code by ptxas
//! (`tests/all/attention.rs`); not yet run or timed on a GPU, no backward pass, no
//! score-modification hook, no autotuning.

use dsl_runtime::prelude::*;

/// `o = softmax(scale * q k^T) v` per (batch, query head), with `lse` (the natural log of
/// each row's softmax denominator, `scale * q k^T` units) saved for a backward pass.
///
/// Shapes: `q` and `o` are `[B, T, H, D]`-like and `k`, `v` `[B, T, KV, D]`-like, given by
/// element strides over (batch, head, time) for each, the head dimension contiguous: both
/// `[B, T, H, D]` (what a projection produces) and `[B, H, T, D]` work without a copy.
/// Query head `hq` reads key/value head `hq / (H / KV)` (grouped-query attention; `H` a
/// multiple of `KV`; `KV = 1` is multi-query, `KV = H` multi-head). `lse` is `[B, H, T]`
/// contiguous.
///
/// `causal != 0`: query `i` sees keys `0..=i`; key tiles past the diagonal are skipped.
/// Grid: `(T.div_ceil(BM), B * H)`; `D` is the head dimension (a power of two, 16 or
/// more). In f32: the scores, the running max and sum, the output accumulator; the
/// probabilities are rounded to `T` for the second product (as FlashAttention does).
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn attention<T: Float, const BM: usize, const BN: usize, const D: usize>(
    q: Ptr<T>, k: Ptr<T>, v: Ptr<T>, o: Ptr<T>, lse: Ptr<f32>,
    t: i32, h: i32, kv: i32, scale: f32, causal: i32,
    sqb: i32, sqh: i32, sqt: i32, skb: i32, skh: i32, skt: i32, svb: i32, svh: i32, svt: i32, sob: i32, soh: i32, sot: i32,
) {
    let m_tile = program_id(0);
    let bh = program_id(1);
    let b = bh / h;
    let hq = bh % h;
    let hk = hq / (h / kv);
    let rm = m_tile * BM + arange::<BM>();
    let rd = arange::<D>();
    let qt = load(q + b * sqb + hq * sqh + rm.col() * sqt + rd.row(), rm.col() < t, 0.0);
    // Scores in log2 units, so the exponentials are exp2.
    let qk_scale = scale * 1.4426950408889634;
    let mut m_i = full::<f32>([BM], -f32::INFINITY);
    let mut l_i = zeros::<f32>([BM]);
    let mut acc = zeros::<f32>([BM, D]);
    // Causal: keys up to the tile's last query (and no further than t).
    let end = minimum(t, (m_tile + 1) * BM + (1 - causal) * t);
    let kbase = k + b * skb + hk * skh;
    let vbase = v + b * svb + hk * svh;
    for n0 in (0..end).step_by(BN) {
        let rn = n0 + arange::<BN>();
        let kt = load(kbase + rn.col() * skt + rd.row(), rn.col() < t, 0.0);
        let s = dot(qt, trans(kt)) * qk_scale;
        // Keys past t, and (causal) keys after the query, take no weight.
        let seen = (rn.row() < t) & ((rm.col() >= rn.row()) | (causal == 0));
        let s = select(seen, s, -f32::INFINITY);
        // Every row sees key 0 in the first tile, so the running max is finite from then on.
        let m_new = maximum(m_i, s.max(1));
        let p = exp2(s - m_new.col());
        let alpha = exp2(m_i - m_new);
        l_i = l_i * alpha + p.sum(1);
        let vt = load(vbase + rn.col() * svt + rd.row(), rn.col() < t, 0.0);
        acc = dot(p.to::<T>(), vt, acc * alpha.col());
        m_i = m_new;
    }
    store(o + b * sob + hq * soh + rm.col() * sot + rd.row(), (acc / l_i.col()).to::<T>(), rm.col() < t);
    store(lse + bh * t + rm, (m_i + log2(l_i)) * 0.6931471805599453, rm < t);
}
