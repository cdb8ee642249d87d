//! Attention written in the DSL: the flash-attention forward pass (online softmax over
//! key/value tiles, FlashAttention-2's loop order), with grouped-query heads.
//!
//! [`attention_forward`] checks a call's shapes and buffers and launches the kernel.
//!
//! Status (issue 14): the forward pass, full or causal, any sequence length, checked on
//! the CPU interpreter against an f64 reference and assembled to tensor-core code by ptxas
//! (`tests/all/attention.rs`), run on the GPU by `gpu::flash_attention_on_gpu`; no
//! backward pass, no score-modification hook, no autotuning, no pipelining of the K/V
//! loads; head dims 16, 32, 64 and 128 (64 x 64 tiles, 4 warps).

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
    // Tiles before this need no mask: all their keys are < t and (causal) before the
    // tile's first query.
    let unmasked = minimum(t / BN as i32 * BN as i32, m_tile * BM + (1 - causal) * t);
    let kbase = k + b * skb + hk * skh;
    let vbase = v + b * svb + hk * svh;
    for n0 in (0..end).step_by(BN) {
        let rn = n0 + arange::<BN>();
        let kt = load(kbase + rn.col() * skt + rd.row(), rn.col() < t, 0.0);
        let s = dot(qt, trans(kt)) * qk_scale;
        // Keys past t, and (causal) keys after the query, take no weight; only the tiles
        // that hold such keys (the diagonal, the tail) pay for the mask.
        let s = if n0 + BN as i32 > unmasked {
            let seen = (rn.row() < t) & ((rm.col() >= rn.row()) | (causal == 0));
            select(seen, s, -f32::INFINITY)
        } else {
            s
        };
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

/// How q, k, v and o are stored: `[B, T, heads, D]` (what a projection produces) or
/// `[B, heads, T, D]`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Layout {
    Bthd,
    Bhtd,
}

/// The sizes of an attention call.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Shape {
    pub batch: usize,
    pub seq: usize,
    /// Query heads (`H`), and key/value heads (`KV`, dividing `H`).
    pub heads: usize,
    pub kv_heads: usize,
    /// 16, 32, 64 or 128.
    pub head_dim: usize,
    pub causal: bool,
    pub layout: Layout,
}

impl Shape {
    /// Element strides over (batch, head, time) of a tensor with `heads` heads (q and o:
    /// `self.heads`; k and v: `self.kv_heads`).
    pub fn strides(&self, heads: usize) -> [usize; 3] {
        let (t, d) = (self.seq, self.head_dim);
        match self.layout {
            Layout::Bthd => [t * heads * d, d, heads * d],
            Layout::Bhtd => [heads * t * d, t * d, d],
        }
    }
}

/// Flash attention forward ([`attention`]) with its arguments checked: `heads` a multiple
/// of `kv_heads`, a head dimension the kernel is built for, and every buffer the length
/// the shape needs (`q`, `o`: `B T H D`; `k`, `v`: `B T KV D`; `lse`: `B H T`). `scale`
/// multiplies the scores (usually `1 / sqrt(D)`). 64 x 64 tiles, 4 warps (a 16-row tile
/// each, so the probabilities stay in registers between the two products).
///
/// ```
/// use dsl_runtime::prelude::*;
/// use half::bf16;
/// use kernels_lib::flash_attention::{attention_forward, Layout, Shape};
/// let rt = Runtime::interpreter();
/// let s = Shape { batch: 1, seq: 5, heads: 2, kv_heads: 1, head_dim: 16, causal: true, layout: Layout::Bthd };
/// let x = rt.upload(&vec![bf16::from_f32(0.5); 5 * 2 * 16]).unwrap();
/// let kv = rt.upload(&vec![bf16::from_f32(0.25); 5 * 16]).unwrap();
/// let (mut o, mut lse) = (rt.zeros::<bf16>(5 * 2 * 16).unwrap(), rt.zeros::<f32>(2 * 5).unwrap());
/// attention_forward(&rt, &s, &x, &kv, &kv, &mut o, &mut lse, 0.25).unwrap();
/// // Every key equal: the output is the value.
/// assert!(o.to_vec().unwrap().iter().all(|&v| v == bf16::from_f32(0.25)));
/// let bad = Shape { heads: 3, kv_heads: 2, ..s };
/// assert!(attention_forward(&rt, &bad, &x, &kv, &kv, &mut o, &mut lse, 0.25).is_err());
/// ```
#[allow(clippy::too_many_arguments)]
pub fn attention_forward<T: Float>(rt: &Runtime, s: &Shape, q: &Buffer<T>, k: &Buffer<T>, v: &Buffer<T>, o: &mut Buffer<T>, lse: &mut Buffer<f32>, scale: f32) -> dsl_runtime::Result<()> {
    let bad = |message: String| dsl_runtime::Error::Launch { kernel: "attention".into(), message };
    if s.kv_heads == 0 || !s.heads.is_multiple_of(s.kv_heads) {
        return Err(bad(format!("{} query heads are not a multiple of {} key/value heads", s.heads, s.kv_heads)));
    }
    let (nq, nk, nl) = (s.batch * s.seq * s.heads * s.head_dim, s.batch * s.seq * s.kv_heads * s.head_dim, s.batch * s.heads * s.seq);
    for (what, len, want) in [("q", q.len(), nq), ("k", k.len(), nk), ("v", v.len(), nk), ("o", o.len(), nq), ("lse", lse.len(), nl)] {
        if len != want {
            return Err(bad(format!("`{what}` has {len} elements where {s:?} needs {want}")));
        }
    }
    let too_large = [nq, nk, nl].iter().any(|&n| n > i32::MAX as usize);
    if too_large || s.seq == 0 || s.batch * s.heads == 0 {
        return Err(bad(format!("{s:?}: empty, or too large for 32-bit offsets")));
    }
    let ([qb, qh, qt], [kb, kh, kt]) = (s.strides(s.heads).map(|x| x as i32), s.strides(s.kv_heads).map(|x| x as i32));
    let grid = LaunchConfig::grid3(s.seq.div_ceil(64) as u32, (s.batch * s.heads) as u32, 1).warps(4);
    let (t, h, kv, c) = (s.seq as i32, s.heads as i32, s.kv_heads as i32, s.causal as i32);
    match s.head_dim {
        16 => attention::<T, 64, 64, 16>::launch(rt, grid, q, k, v, o, lse, t, h, kv, scale, c, qb, qh, qt, kb, kh, kt, kb, kh, kt, qb, qh, qt),
        32 => attention::<T, 64, 64, 32>::launch(rt, grid, q, k, v, o, lse, t, h, kv, scale, c, qb, qh, qt, kb, kh, kt, kb, kh, kt, qb, qh, qt),
        64 => attention::<T, 64, 64, 64>::launch(rt, grid, q, k, v, o, lse, t, h, kv, scale, c, qb, qh, qt, kb, kh, kt, kb, kh, kt, qb, qh, qt),
        128 => attention::<T, 64, 64, 128>::launch(rt, grid, q, k, v, o, lse, t, h, kv, scale, c, qb, qh, qt, kb, kh, kt, kb, kh, kt, qb, qh, qt),
        d => Err(bad(format!("head dim {d}: built for 16, 32, 64 and 128"))),
    }
}
