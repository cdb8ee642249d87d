//! Attention written in the DSL: the flash-attention forward pass (online softmax over
//! key/value tiles, FlashAttention-2's loop order), with grouped-query heads.
//!
//! [`attention_forward`] checks a call's shapes and buffers and launches the kernel.
//!
//! [`attention_backward`] is FlashAttention-2's backward in two launches
//! ([`attention_bwd_dq`], which also computes the row sums `delta`, then
//! [`attention_bwd_dkdv`]), deterministic
//! (each gradient element written by one program; the key/value gradients of a head summed
//! over its query group inside the kernel, no atomics).
//!
//! [`attention_forward_scored`] and [`attention_backward_scored`] modify the scores inside
//! the kernels with a [`ScoreMod`] (FlexAttention's `score_mod`): a `#[kernel_fn]` and its
//! derivative, the kernels' type parameters (`S: KernelFn`), so each modification is
//! compiled into kernels of its own; the library has [`SoftCap`], [`Alibi`],
//! [`SlidingWindow`], [`KeyBias`] (a bias per key: a padding mask) and [`ScoreBias`] (a bias
//! or mask from data, read through strides, which
//! [`score_bias_pack`] and [`score_mask_pack`] write from a tensor read through strides:
//! how the graph fuser passes masks). A modification that masks bands of keys declares them
//! ([`ScoreMod::KeysFrom`], [`ScoreMod::QueriesTo`]) and their tiles are skipped
//! (FlexAttention's block mask). The unmodified kernels are the same code as before the hook
//! existed (`SCORED = false`). A modification known only at run time (what the graph fuser
//! finds between the scores and the softmax) is a [`ScoreHook`]: code emitted into the same
//! kernels ([`attention_forward_hooked`], [`attention_backward_hooked`]), its derivative
//! taken from that code.
//!
//! Status (issue 14): forward and backward, full or causal, any sequence length, bf16/f16
//! and f32 (tf32 products), checked on the CPU interpreter against f64 and assembled to
//! tensor-core code by ptxas (`tests/all/attention.rs`), run on the GPU by
//! `gpu::flash_attention_on_gpu` (unpipelined and pipelined); head dims 16, 32, 64 and 128
//! (tiles per shape and device, [`Options::forward_plan`] and [`Options::backward_tiles`];
//! every product on `wgmma` on Hopper, forward and backward, `mma.sync` elsewhere; loads
//! pipelined three stages ahead, two in the warp-specialized forward defaults, [`Options`]; the softmax's scale inside one `fma`, as
//! Triton does); score modifications (forward and backward, a user's derivative, declared
//! bands skipped; a derivative by hand or `dsl::Derivative<Score>`, taken automatically);
//! tiles, warps and stages autotuned on request ([`Options::tune`]); a score
//! modification's loads from data (a bias tile) issued a key tile ahead in the forward
//! (`LaunchConfig::prefetch`; in the backward only dK/dV's rows of statistics without a
//! modification at head dim 64, its loops being short of registers); on Hopper the key and
//! value tiles (forward, `dQ`) and the query and output-gradient tiles (`dK`/`dV`) are
//! loaded by TMA (the compiler's, for any strides that are multiples of 16 bytes); the
//! forward warp-specialized where the tuner measures it faster (a producer warpgroup, two
//! consumer warpgroups taking turns at `q k^T`: [`Options::warp_specialize`], and among the
//! tuned candidates; BENCHMARKS.md, "Warp specialization"); causal query tiles launched
//! longest first ([`query_tile()`]); FlashAttention-3's product order on request
//! ([`Options::overlap`], [`attention_overlapped`]: level with the fastest tile, since ptxas
//! still waits for the second product before the softmax). At head dim 128 on Hopper the
//! untuned forward takes the tuner's pick, 128 x 128 warp-specialized, and at head dim 64
//! where 128-row tiles are few, 64 x 64 warp-specialized at three programs an SM causal,
//! 64 x 128 warp-specialized without a mask ([`Options::forward_plan`]); an atomic backward ([`attention_backward_atomic`]: `dQ`
//! added by relaxed atomics from the key tiles' programs, by TMA reductions on 64-key
//! tiles), measured slower than the deterministic default. Not yet: the softmax truly
//! overlapped with the second product within a warpgroup (see [`attention_overlapped`]), a
//! warp-specialized backward, TMA reductions that do not wait for their reads at once.

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
/// With `SCORED`, `S` modifies the scores before the softmax: each `scale * q·k` becomes
/// `S(score, b, hq, query, key, score_args)` (a [`ScoreMod`]'s `Score`), a query whose
/// every score `S` masks (`-inf`) gets a zero output and an `lse` of `-inf`, and key tiles
/// before `K(first query, t, score_args)` (its `KeysFrom`) are skipped. Without, neither
/// `S`, `K` nor `score_args` is read and the code is that of a kernel without the hook
/// (the scores scaled once, straight to log2 units).
///
/// `causal != 0`: query `i` sees keys `0..=i`; key tiles past the diagonal are skipped.
/// Grid: `(T.div_ceil(BM), B * H)`; `D` is the head dimension (a power of two, 16 or
/// more). In f32: the scores, the running max and sum, the output accumulator; the
/// probabilities are rounded to `T` for the second product (as FlashAttention does).
///
/// `attention_tuned::<T, S, K, SCORED, D>` ([`Options::tune`]) launches it with the tiles,
/// warps, stages, warp specialization (8 warps, 64-row tiles, or 128 rows on 4 warps where
/// `BN + D <= 128`) and programs an SM (three for the warp-specialized 64 x 64 tile at head
/// dim 64; [`tuned::attention_tile`](crate::tuned::attention_tile))
/// the autotuner measured fastest for the call's shape (`SCORED` and `D` are the caller's;
/// the grid's second dimension, `B * H`, is `o.len() / (T * D)`).
#[kernel(tune(
    BM = [64, 128], BN = [64, 128], warps = [4, 8], stages = [2, 3], specialize = [false, true], programs = [1, 3],
    key = [t, h, kv, causal, d = D, bh = o.len() / (t.max(1) as usize * D)],
    grid = ((t.max(0) as usize).div_ceil(BM), o.len() / (t.max(1) as usize * D)),
    prune = crate::tuned::attention_tile, tolerance = 1e-2
))]
#[allow(clippy::too_many_arguments)]
pub fn attention<T: Float, S: KernelFn, K: KernelFn, const SCORED: bool, const BM: usize, const BN: usize, const D: usize>(
    q: Ptr<T>, k: Ptr<T>, v: Ptr<T>, o: Ptr<T>, lse: Ptr<f32>, score_args: Ptr<f32>,
    t: i32, h: i32, kv: i32, scale: f32, causal: i32,
    sqb: i32, sqh: i32, sqt: i32, skb: i32, skh: i32, skt: i32, svb: i32, svh: i32, svt: i32, sob: i32, soh: i32, sot: i32,
) {
    let m_tile = query_tile(causal);
    let bh = program_id(1);
    let b = bh / h;
    let hq = bh % h;
    let hk = hq / (h / kv);
    let rm = m_tile * BM + arange::<BM>();
    let rd = arange::<D>();
    let qt = load(q + b * sqb + hq * sqh + rm.col() * sqt + rd.row(), rm.col() < t, 0.0);
    // The exponentials are exp2 of scores in log2 units: the products scaled by `to_log2`
    // inside one FMA with the subtraction of the running max (kept in log2 units). The
    // row max of the unscaled scores scaled is the scaled scores' max (`scale > 0`).
    let to_log2 = if SCORED { 1.4426950408889634 } else { scale * 1.4426950408889634 };
    let mut m_i = full::<f32>([BM], -f32::INFINITY);
    let mut l_i = zeros::<f32>([BM]);
    let mut acc = zeros::<f32>([BM, D]);
    let end = keys_end::<BM>(m_tile, t, causal);
    let start = if SCORED { first_key_tile::<BN>(K(m_tile * BM, t, score_args)) } else { 0 };
    let unmasked = keys_unmasked::<BM, BN>(m_tile, t, causal);
    let kbase = k + b * skb + hk * skh;
    let vbase = v + b * svb + hk * svh;
    for n0 in (start..end).step_by(BN) {
        let rn = n0 + arange::<BN>();
        let kt = load(kbase + rn.col() * skt + rd.row(), rn.col() < t, 0.0);
        // A score modification takes and gives natural units.
        let s = if SCORED { S(dot(qt, trans(kt)) * scale, b, hq, rm.col(), rn.row(), score_args) } else { dot(qt, trans(kt)) };
        // Keys past t, and (causal) keys after the query, take no weight; only the tiles
        // that hold such keys (the diagonal, the tail) pay for the mask.
        let s = if n0 + BN as i32 > unmasked {
            select(seen(rm, rn, t, causal), s, -f32::INFINITY)
        } else {
            s
        };
        let m_new = maximum(m_i, s.max(1) * to_log2);
        // Unmodified, every row sees key 0 in the first tile, so the running max is finite
        // from then on; a row with no score yet (`S` masked all it saw) subtracts 0, so its
        // weights are 0, not NaN.
        let m_sub = if SCORED { select(m_new == -f32::INFINITY, 0.0, m_new) } else { m_new };
        let p = exp2(fma(s, to_log2, -m_sub.col()));
        let alpha = exp2(m_i - m_sub);
        l_i = l_i * alpha + p.sum(1);
        let vt = load(vbase + rn.col() * svt + rd.row(), rn.col() < t, 0.0);
        acc = dot(p.to::<T>(), vt, acc * alpha.col());
        m_i = m_new;
    }
    // A row that saw no key has `l_i = 0`: output 0, lse -inf.
    let l_div = if SCORED { select(l_i == 0.0, 1.0, l_i) } else { l_i };
    store(o + b * sob + hq * soh + rm.col() * sot + rd.row(), (acc / l_div.col()).to::<T>(), rm.col() < t);
    store(lse + bh * t + rm, (m_i + log2(l_i)) * 0.6931471805599453, rm < t);
}

/// [`attention`] with the second product one key tile behind the first, in
/// FlashAttention-3's order: step `j` issues `q k_j^T` and then `p_{j-1} v_{j-1}` (one
/// turn of the two consumer warpgroups, warp-specialized), waits for the first only
/// (`wgmma.wait_group 1`) and computes tile `j`'s softmax; the first tile's softmax comes
/// before the loop and the last tile's product after it. Same arguments, grid and results
/// as [`attention`] ([`Options::overlap`]).
///
/// The softmax is placed while `p v` is in flight, but ptxas waits for that product at
/// the top of the softmax anyway (SASS `WARPGROUP.DEPBAR.LE gsb0, 0x0` before its first
/// `FMNMX`, however the loop is written: BENCHMARKS.md, "Tree reductions"): what remains is
/// both products in one turn. Measured on the H100 (BENCHMARKS.md, "The JIT linker ignores
/// setmaxnreg"): level with [`attention`]'s fastest tile (warp-specialized 128 x 128); the
/// tuner does not offer it.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn attention_overlapped<T: Float, S: KernelFn, K: KernelFn, const SCORED: bool, const BM: usize, const BN: usize, const D: usize>(
    q: Ptr<T>, k: Ptr<T>, v: Ptr<T>, o: Ptr<T>, lse: Ptr<f32>, score_args: Ptr<f32>,
    t: i32, h: i32, kv: i32, scale: f32, causal: i32,
    sqb: i32, sqh: i32, sqt: i32, skb: i32, skh: i32, skt: i32, svb: i32, svh: i32, svt: i32, sob: i32, soh: i32, sot: i32,
) {
    let m_tile = query_tile(causal);
    let bh = program_id(1);
    let b = bh / h;
    let hq = bh % h;
    let hk = hq / (h / kv);
    let rm = m_tile * BM + arange::<BM>();
    let rd = arange::<D>();
    let qt = load(q + b * sqb + hq * sqh + rm.col() * sqt + rd.row(), rm.col() < t, 0.0);
    let to_log2 = if SCORED { 1.4426950408889634 } else { scale * 1.4426950408889634 };
    let end = keys_end::<BM>(m_tile, t, causal);
    let start = if SCORED { first_key_tile::<BN>(K(m_tile * BM, t, score_args)) } else { 0 };
    let unmasked = keys_unmasked::<BM, BN>(m_tile, t, causal);
    let kbase = k + b * skb + hk * skh;
    let vbase = v + b * svb + hk * svh;
    // The first key tile: its softmax, always masked.
    let rn = start + arange::<BN>();
    let kt = load(kbase + rn.col() * skt + rd.row(), rn.col() < t, 0.0);
    let s = if SCORED { S(dot(qt, trans(kt)) * scale, b, hq, rm.col(), rn.row(), score_args) } else { dot(qt, trans(kt)) };
    let s = select(seen(rm, rn, t, causal), s, -f32::INFINITY);
    let mut m_i = s.max(1) * to_log2;
    let m_sub = if SCORED { select(m_i == -f32::INFINITY, 0.0, m_i) } else { m_i };
    let p = exp2(fma(s, to_log2, -m_sub.col()));
    let mut l_i = p.sum(1);
    let mut p_prev = p;
    let mut alpha_prev = full::<f32>([BM], 1.0);
    let mut acc = zeros::<f32>([BM, D]);
    for n0 in (start + BN as i32..end).step_by(BN) {
        let rn = n0 + arange::<BN>();
        let kt = load(kbase + rn.col() * skt + rd.row(), rn.col() < t, 0.0);
        let s = if SCORED { S(dot(qt, trans(kt)) * scale, b, hq, rm.col(), rn.row(), score_args) } else { dot(qt, trans(kt)) };
        // The previous tile's product, issued while this one's runs.
        let rv = (n0 - BN as i32) + arange::<BN>();
        let vt = load(vbase + rv.col() * svt + rd.row(), rv.col() < t, 0.0);
        acc = dot(p_prev.to::<T>(), vt, acc * alpha_prev.col());
        let s = if n0 + BN as i32 > unmasked {
            select(seen(rm, rn, t, causal), s, -f32::INFINITY)
        } else {
            s
        };
        let m_new = maximum(m_i, s.max(1) * to_log2);
        let m_sub = if SCORED { select(m_new == -f32::INFINITY, 0.0, m_new) } else { m_new };
        let p = exp2(fma(s, to_log2, -m_sub.col()));
        alpha_prev = exp2(m_i - m_sub);
        l_i = l_i * alpha_prev + p.sum(1);
        p_prev = p;
        m_i = m_new;
    }
    // The last tile's product.
    let rv = start + maximum(end - start - 1, 0) / BN as i32 * BN as i32 + arange::<BN>();
    let vt = load(vbase + rv.col() * svt + rd.row(), rv.col() < t, 0.0);
    acc = dot(p_prev.to::<T>(), vt, acc * alpha_prev.col());
    let l_div = if SCORED { select(l_i == 0.0, 1.0, l_i) } else { l_i };
    store(o + b * sob + hq * soh + rm.col() * sot + rd.row(), (acc / l_div.col()).to::<T>(), rm.col() < t);
    store(lse + bh * t + rm, (m_i + log2(l_i)) * 0.6931471805599453, rm < t);
}

/// The backward pass for the keys and values: per `BN`-key tile of key/value head `hk`,
/// `dV = sum P^T dO` and `dK = scale * sum dS^T Q` over every query of every query head
/// of the group that reads `hk` (so grouped-query gradients are summed in the kernel, in
/// a fixed order: deterministic, no atomics). `P = exp(scale q k^T - lse)` is recomputed
/// from the forward's `lse`; `dS = P * (dO v^T - delta)` (`delta` as [`attention_bwd_dq`]
/// stores it).
/// The key-major loop (`S^T = K Q^T`) keeps every transpose on loaded tiles, so `P^T` and
/// `dS^T` feed the next product from registers. `P^T` and `dS^T` are rounded to `T` for
/// their products, as FlashAttention does. Causal: query tiles before the key tile are
/// skipped, only the diagonal ones masked. Queries and keys past `t` load as zeros and
/// so add exact zeros. With a score modification, `P` is of the modified scores and `dS`
/// takes the factor `G` (the derivative of `S`) at the unmodified ones
/// ([`ScoreMod`]), and query tiles from its `QueriesTo` (`Q`) of the tile's last key on are
/// skipped. Grid: `(T.div_ceil(BN), B * KV)`.
///
/// `ATOMIC`: FlashAttention-2's backward with atomics. Each query tile's share of
/// `dQ = scale * dS K` is also added into `dq_acc` (`[B * H, T, D]`, f32, rows `sdq = t *
/// D` apart a head, zeroed by [`attention_bwd_delta_zeroed`]) by relaxed atomic adds,
/// which [`attention_bwd_dq_store`] then rounds into `dq`: `P` and `dS` are computed once,
/// not again in a `dQ` kernel, and the sums into `dQ` arrive in an order that varies from
/// run to run (not deterministic in the last bits). Without it `dq_acc` and `sdq` are
/// not read.
///
/// `attention_bwd_dkdv_tuned` (see [`Options::tune`]) tunes the deterministic kernel's
/// tile, a warp per 16 keys, every candidate without register prefetch (the untuned launch
/// takes it without a score modification on `wgmma` at head dim 64, where it measured 2%
/// faster; the tuner's candidates are one kernel for both and run without).
#[kernel(tune(
    BM = [32, 64], BN = [64, 128], warps = [4, 8], stages = [2, 3],
    key = [t, h, kv, causal, d = D, bkv = dk.len() / (t.max(1) as usize * D)],
    grid = ((t.max(0) as usize).div_ceil(BN), dk.len() / (t.max(1) as usize * D)),
    prune = crate::tuned::attention_dkdv_tile, tolerance = 1e-2, prefetch = false
))]
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd_dkdv<T: Float, S: KernelFn, G: KernelFn, Q: KernelFn, const SCORED: bool, const ATOMIC: bool, const BM: usize, const BN: usize, const D: usize>(
    q: Ptr<T>, k: Ptr<T>, v: Ptr<T>, dout: Ptr<T>, lse: Ptr<f32>, delta: Ptr<f32>, score_args: Ptr<f32>, dk: Ptr<T>, dv: Ptr<T>, dq_acc: Ptr<f32>,
    t: i32, h: i32, kv: i32, scale: f32, causal: i32,
    sqb: i32, sqh: i32, sqt: i32, skb: i32, skh: i32, skt: i32, sdq: i32,
) {
    let n_tile = program_id(0);
    let bk = program_id(1);
    let b = bk / kv;
    let hk = bk % kv;
    let group = h / kv;
    let rn = n_tile * BN + arange::<BN>();
    let rd = arange::<D>();
    let kv_at = b * skb + hk * skh + rn.col() * skt + rd.row();
    let kt = load(k + kv_at, rn.col() < t, 0.0);
    let vt = load(v + kv_at, rn.col() < t, 0.0);
    // `exp2` of the scores in log2 units less `lse` in log2 units, one FMA: the products
    // scaled to log2 units in it, or a modification's natural units.
    let to_log2 = if SCORED { 1.4426950408889634 } else { scale * 1.4426950408889634 };
    let mut dk_acc = zeros::<f32>([BN, D]);
    let mut dv_acc = zeros::<f32>([BN, D]);
    // Causal: the queries from the key tile's first on (query tiles start at multiples
    // of BM); those before the tile's last key need the mask.
    let start = causal * (n_tile * BN / BM as i32 * BM as i32);
    let masked_to = causal * (n_tile * BN + BN);
    // A modification's `QueriesTo`: no later query sees any key of the tile.
    let end = if SCORED { minimum(t, Q(n_tile * BN + BN - 1, t, score_args)) } else { t };
    // (Every program walks the query tiles in the same order. In the atomic kernel,
    // rotating them by the key tile's index, so that fewer programs add into one `dQ`
    // tile at a time, measured 3-4% slower. One loop over the group's heads and query
    // tiles, which could be warp-specialized, measured 4% slower unspecialized and level
    // specialized: its step's head and tile take an integer division.)
    for hq in (hk * group)..(hk * group + group) {
        let bh = b * h + hq;
        for m0 in (start..end).step_by(BM) {
            let rm = m0 + arange::<BM>();
            let q_at = b * sqb + hq * sqh + rm.col() * sqt + rd.row();
            let qt = load(q + q_at, rm.col() < t, 0.0);
            let dot_ = load(dout + q_at, rm.col() < t, 0.0);
            // With a modification, `st` are the natural-unit scores `S` and `G` take.
            let st = if SCORED { dot(kt, trans(qt)) * scale } else { dot(kt, trans(qt)) };
            // Queries past `t` weigh nothing, whatever `S` gives there.
            let pt = if SCORED {
                let l2 = lse_log2(load(lse + bh * t + rm, rm < t, -f32::INFINITY));
                select(rm.row() < t, exp2(fma(S(st, b, hq, rm.row(), rn.col(), score_args), to_log2, -l2.row())), 0.0)
            } else {
                exp2(fma(st, to_log2, -(load(lse + bh * t + rm, rm < t, 0.0) * 1.4426950408889634).row()))
            };
            let pt = if m0 < masked_to { select(rm.row() >= rn.col(), pt, 0.0) } else { pt };
            // `P^T` times the modification's derivative, taken now so that the scores
            // need not live across the products.
            let pgt = if SCORED { select(rm.row() < t, pt * G(st, b, hq, rm.row(), rn.col(), score_args), 0.0) } else { pt };
            dv_acc = dot(pt.to::<T>(), dot_, dv_acc);
            let di = load(delta + bh * t + rm, rm < t, 0.0);
            let dpt = dot(vt, trans(dot_));
            let dst = (pgt * (dpt - di.row())).to::<T>();
            dk_acc = dot(dst, qt, dk_acc);
            if ATOMIC {
                // This query tile's share of dQ: `dS K`, `dS` the transpose of `dS^T`. A
                // whole tile (`sdq = t * D` apart a head), so that on Hopper TMA adds it (the
                // launch's `tma_store`), as FlashAttention-3 does.
                let dq_part = dot(trans(dst), kt) * scale;
                atomic_add(dq_acc + bh * sdq + rm.col() * D as i32 + rd.row(), dq_part, rm.col() < t, "relaxed");
            }
        }
    }
    store(dk + kv_at, (dk_acc * scale).to::<T>(), rn.col() < t);
    store(dv + kv_at, dv_acc.to::<T>(), rn.col() < t);
}

/// The atomic backward's preprocessing: `delta[b, h, i] = sum_d o[i, d] * do[i, d]` (in
/// f32, `[B, H, T]`; `o` and `dout` in the query layout, strides over batch, head, time),
/// the row sums FlashAttention-2's backward subtracts from `dP`, and the rows of `dq_acc`
/// (`[B * H, T, D]`, f32) it covers zeroed, for [`attention_bwd_dkdv`] with `ATOMIC` to
/// add into. Grid: `(T.div_ceil(BM), B * H)`.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd_delta_zeroed<T: Float, const BM: usize, const D: usize>(o: Ptr<T>, dout: Ptr<T>, delta: Ptr<f32>, dq_acc: Ptr<f32>, t: i32, h: i32, sb: i32, sh: i32, st: i32) {
    let m_tile = program_id(0);
    let bh = program_id(1);
    let rm = m_tile * BM + arange::<BM>();
    let rd = arange::<D>();
    let at = (bh / h) * sb + (bh % h) * sh + rm.col() * st + rd.row();
    let ot = load(o + at, rm.col() < t, 0.0).to::<f32>();
    let dot_ = load(dout + at, rm.col() < t, 0.0).to::<f32>();
    store(delta + bh * t + rm, (ot * dot_).sum(1), rm < t);
    store(dq_acc + (bh * t + rm.col()) * D as i32 + rd.row(), zeros::<f32>([BM, D]), rm.col() < t);
}

/// `dq = dq_acc` rounded to `T`, `dq` in the query layout (strides over batch, head,
/// time), `dq_acc` `[B * H, T, D]` ([`attention_bwd_dkdv`] with `ATOMIC`). Grid: `(T.div_ceil(BM), B * H)`.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd_dq_store<T: Float, const BM: usize, const D: usize>(dq_acc: Ptr<f32>, dq: Ptr<T>, t: i32, h: i32, sb: i32, sh: i32, st: i32) {
    let m_tile = program_id(0);
    let bh = program_id(1);
    let rm = m_tile * BM + arange::<BM>();
    let rd = arange::<D>();
    let acc = load(dq_acc + (bh * t + rm.col()) * D as i32 + rd.row(), rm.col() < t, 0.0);
    store(dq + (bh / h) * sb + (bh % h) * sh + rm.col() * st + rd.row(), acc.to::<T>(), rm.col() < t);
}

/// The backward pass for the queries: per `BM`-query tile of query head `hq`,
/// `dQ = scale * sum dS K` over the key tiles it saw (causal: up to the diagonal),
/// recomputing `P` and `dS` as [`attention_bwd_dkdv`] does (`dS` rounded to `T`, the
/// score modification's `S` and `G` applied alike, and its `KeysFrom` (`K`) skipping key
/// tiles as in the forward). One program writes each `dQ` tile:
/// deterministic. It first computes its queries' `delta = rowsum(dO * O)` (`O` the
/// forward's output, in the query layout) and stores it (`[B, H, T]`) for
/// [`attention_bwd_dkdv`], which runs after it: no kernel of its own for `delta`.
/// Grid: `(T.div_ceil(BM), B * H)`. `attention_bwd_dq_tuned` (see
/// [`Options::tune`]) tunes the tile, a warp per 16 queries, and warp specialization (a
/// producer warpgroup loading the key and value tiles: one loop, as the forward's).
#[kernel(tune(
    BM = [64, 128], BN = [32, 64], warps = [4, 8], stages = [2, 3], specialize = [false, true],
    key = [t, h, kv, causal, d = D, bh = dq.len() / (t.max(1) as usize * D)],
    grid = ((t.max(0) as usize).div_ceil(BM), dq.len() / (t.max(1) as usize * D)),
    prune = crate::tuned::attention_dq_tile, tolerance = 1e-2, prefetch = false
))]
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd_dq<T: Float, S: KernelFn, G: KernelFn, K: KernelFn, const SCORED: bool, const BM: usize, const BN: usize, const D: usize>(
    q: Ptr<T>, k: Ptr<T>, v: Ptr<T>, o: Ptr<T>, dout: Ptr<T>, lse: Ptr<f32>, delta: Ptr<f32>, score_args: Ptr<f32>, dq: Ptr<T>,
    t: i32, h: i32, kv: i32, scale: f32, causal: i32,
    sqb: i32, sqh: i32, sqt: i32, skb: i32, skh: i32, skt: i32,
) {
    let m_tile = program_id(0);
    let bh = program_id(1);
    let b = bh / h;
    let hq = bh % h;
    let hk = hq / (h / kv);
    let rm = m_tile * BM + arange::<BM>();
    let rd = arange::<D>();
    let q_at = b * sqb + hq * sqh + rm.col() * sqt + rd.row();
    let qt = load(q + q_at, rm.col() < t, 0.0);
    let dot_ = load(dout + q_at, rm.col() < t, 0.0);
    let l2 = if SCORED { lse_log2(load(lse + bh * t + rm, rm < t, -f32::INFINITY)) } else { load(lse + bh * t + rm, rm < t, 0.0) * 1.4426950408889634 };
    // `delta = rowsum(dO * O)` of the tile's queries, for this kernel and, stored, for
    // `attention_bwd_dkdv`, launched after it.
    let di = (load(o + q_at, rm.col() < t, 0.0).to::<f32>() * dot_.to::<f32>()).sum(1);
    store(delta + bh * t + rm, di, rm < t);
    // As in `attention_bwd_dkdv`: one FMA to log2 units less `lse`.
    let to_log2 = if SCORED { 1.4426950408889634 } else { scale * 1.4426950408889634 };
    let mut dq_acc = zeros::<f32>([BM, D]);
    let end = keys_end::<BM>(m_tile, t, causal);
    let start = if SCORED { first_key_tile::<BN>(K(m_tile * BM, t, score_args)) } else { 0 };
    let unmasked = keys_unmasked::<BM, BN>(m_tile, t, causal);
    let kbase = k + b * skb + hk * skh;
    let vbase = v + b * skb + hk * skh;
    for n0 in (start..end).step_by(BN) {
        let rn = n0 + arange::<BN>();
        let kt = load(kbase + rn.col() * skt + rd.row(), rn.col() < t, 0.0);
        let vt = load(vbase + rn.col() * skt + rd.row(), rn.col() < t, 0.0);
        let s = if SCORED { dot(qt, trans(kt)) * scale } else { dot(qt, trans(kt)) };
        let p = exp2(fma(if SCORED { S(s, b, hq, rm.col(), rn.row(), score_args) } else { s }, to_log2, -l2.col()));
        let p = if n0 + BN as i32 > unmasked {
            select(seen(rm, rn, t, causal), p, 0.0)
        } else {
            p
        };
        // Keys past `t` weigh nothing, whatever `G` gives there.
        let pg = if SCORED { select(rn.row() < t, p * G(s, b, hq, rm.col(), rn.row(), score_args), 0.0) } else { p };
        let dp = dot(dot_, trans(vt));
        let ds = pg * (dp - di.col());
        dq_acc = dot(ds.to::<T>(), kt, dq_acc);
    }
    store(dq + q_at, (dq_acc * scale).to::<T>(), rm.col() < t);
}

/// The forward's `lse` in log2 units, what the backward subtracts before `exp2`; `+inf`
/// for a query that saw no key (`lse = -inf`, every score masked; and, loaded so, a query
/// past `t`), so that every weight of it is 0.
#[kernel_fn]
pub fn lse_log2(lse: f32) -> f32 {
    select(lse == -f32::INFINITY, f32::INFINITY, lse * 1.4426950408889634)
}

/// The forward's query tile: `program_id(0)`, or, causal, counted from the last (the
/// programs of a head start with the tiles that see the most keys, so the shortest run
/// last and the final wave ends together: FlashAttention-3's longest-first order).
#[kernel_fn]
pub fn query_tile(causal: i32) -> i32 {
    select(causal != 0, num_programs(0) - 1 - program_id(0), program_id(0))
}

/// The start of the key tile holding `first`, the first key a query tile may see (0 if
/// `first` is negative): where a modification's `KeysFrom` starts the key loop.
#[kernel_fn]
pub fn first_key_tile<const BN: usize>(first: i32) -> i32 {
    maximum(first, 0) / BN as i32 * BN as i32
}

/// The end of the keys query tile `m_tile` (of `BM` queries) sees: causal, up to its last
/// query; never past `t`. Shared by the forward and the `dQ` backward.
#[kernel_fn]
pub fn keys_end<const BM: usize>(m_tile: i32, t: i32, causal: i32) -> i32 {
    minimum(t, (m_tile + 1) * BM + (1 - causal) * t)
}

/// Key tiles (of `BN`) starting before this need no mask: all their keys are below `t`
/// and (causal) before query tile `m_tile`'s first query.
#[kernel_fn]
pub fn keys_unmasked<const BM: usize, const BN: usize>(m_tile: i32, t: i32, causal: i32) -> i32 {
    minimum(t / BN as i32 * BN as i32, m_tile * BM + (1 - causal) * t)
}

/// Which (query `rm`, key `rn`) pairs of a tile count: keys before `t` and, causal, not
/// after the query (`[BM, BN]`).
#[kernel_fn]
pub fn seen(rm: i32, rn: i32, t: i32, causal: i32) -> bool {
    (rn.row() < t) & ((rm.col() >= rn.row()) | (causal == 0))
}

/// A modification of the attention scores inside the kernels (FlexAttention's
/// `score_mod`): [`Score`](ScoreMod::Score) maps each score before the softmax, and
/// [`Grad`](ScoreMod::Grad), its derivative with respect to the score, scales the score's
/// gradient in the backward pass: written by hand, or `dsl::Derivative<Score>`, which
/// differentiates `Score`'s code (as FlexAttention differentiates its `score_mod`). Both are `#[kernel_fn]`s taking
/// `(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32`: the score
/// (`scale * q·k`), the batch, the query head, the query's and the key's positions, and the
/// `args` buffer of the call (what is in it is the modification's: a cap, per-head slopes,
/// a table of biases).
///
/// The kernels call them on tiles: `s` is a block, `q` and `k` broadcast against it (one a
/// column, the other a row, in either orientation), `b` and `h` are scalars; so they must
/// be elementwise. A tile's positions run past the sequence's end (up to the next multiple
/// of the tile), and the results there are discarded: a table read by position must mask
/// the read (the example below). `-inf` masks a score (weight 0; a query with every score masked gets a
/// zero output). `Grad` must be finite wherever it is called (at masked scores too: it is
/// multiplied by their zero weight). What `args` hold is not checked, only their number
/// ([`args_len`](ScoreMod::args_len), and that it fits 32-bit offsets): a soft-cap of 0
/// gives NaN. The library's: [`NoScoreMod`], [`SoftCap`], [`Alibi`], [`SlidingWindow`],
/// [`ScoreBias`], [`KeyBias`].
///
/// A modification that masks whole bands of keys says where they are, so that the kernels
/// skip those tiles (what FlexAttention's block mask is for): [`KeysFrom`](ScoreMod::KeysFrom)
/// gives the first key a query may see and [`QueriesTo`](ScoreMod::QueriesTo) the end of the
/// queries that may see a key, both `#[kernel_fn]`s `(x: i32, t: i32, args: Ptr<f32>) -> i32`,
/// non-decreasing in `x`. They must not hide a key `Score` leaves unmasked (the skipped tiles
/// add nothing: the results change). [`all_keys()`] and [`all_queries()`] skip nothing.
///
/// ```
/// use dsl_runtime::prelude::*;
/// use kernels_lib::flash_attention::ScoreMod;
///
/// /// A bias per (query, key) pair from a `T x T` table (`T` = 8 here), read only inside
/// /// it: tiles reach past the sequence's end.
/// #[kernel_fn]
/// fn table_bias(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
///     s + load(args + q * 8 + k, (q < 8) & (k < 8), 0.0)
/// }
/// #[kernel_fn]
/// fn bias_grad(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
///     1.0
/// }
/// struct TableBias;
/// impl ScoreMod for TableBias {
///     type Score = table_bias;
///     type Grad = bias_grad;
///     type KeysFrom = kernels_lib::flash_attention::all_keys;
///     type QueriesTo = kernels_lib::flash_attention::all_queries;
///     fn args_len(s: &kernels_lib::flash_attention::Shape) -> usize { s.seq * s.seq }
/// }
/// ```
pub trait ScoreMod {
    type Score: KernelFn;
    type Grad: KernelFn;
    type KeysFrom: KernelFn;
    type QueriesTo: KernelFn;
    /// How many `args` a call of shape `s` needs at least (checked before a launch).
    fn args_len(s: &Shape) -> usize {
        let _ = s;
        0
    }
}

/// Scores as they are.
pub struct NoScoreMod;
impl ScoreMod for NoScoreMod {
    type Score = no_score_mod;
    type Grad = unit_score_grad;
    type KeysFrom = all_keys;
    type QueriesTo = all_queries;
}

/// A score modification given at run time: `body` emits the code of
/// [`Score`](ScoreMod::Score) for its arguments `(s, b, h, q, k, args)` (see [`ScoreMod`]
/// for what they are and what the code must be), through the IR builder; the kernels' gradient
/// is that code's derivative (`dsl::Derivative`), and the tiles skipped are those of the
/// bands the call's [`Hooked`] names (none by default). Each kernel
/// with the hook is built once per hook ([`ScoreHook::kernel`]) and identified by the code
/// it holds, so a hook that emits the same code as another shares its compiled kernels (in
/// this process and, through the disk cache, the next). For [`attention_forward_hooked`]
/// and [`attention_backward_hooked`]; what the graph fuser compiles the elementwise
/// operations between a graph's scores and its softmax into.
///
/// ```
/// use dsl_runtime::ir::{BinOp, Operand, UnaryOp};
/// use kernels_lib::flash_attention::ScoreHook;
/// // tanh(s) * 4: a soft-cap of 4 on scores already divided by 4.
/// let hook = ScoreHook::new(|b, args, at| {
///     let t = b.unary(UnaryOp::Tanh, args[0], at)?;
///     Ok(Operand::V(b.binary(BinOp::Mul, t, Operand::Float(4.0), at)?))
/// });
/// # let _ = hook;
/// ```
pub struct ScoreHook {
    body: std::sync::Arc<dsl_runtime::ir::builder::HookFn>,
    /// The kernels built with it, by the kernel they were built from.
    kernels: std::sync::Mutex<std::collections::HashMap<dsl_runtime::KernelId, std::sync::Arc<dsl_runtime::IrKernel>>>,
}

impl ScoreHook {
    /// The hook whose score is what `body` emits: pure (the same code for the same
    /// arguments, nothing captured that changes it), an f32 of the score's shape.
    pub fn new<F>(body: F) -> ScoreHook
    where
        F: Fn(&mut dsl_runtime::ir::Builder, &[dsl_runtime::ir::Operand], dsl_runtime::ir::Loc) -> Result<dsl_runtime::ir::Operand, dsl_runtime::BuildError> + Send + Sync + 'static,
    {
        ScoreHook { body: std::sync::Arc::new(body), kernels: Default::default() }
    }

    /// `kernel` (this module's, with [`Hooked`]'s helpers for the score's) with this hook:
    /// built on the first call ([`IrKernel::hooked`](dsl_runtime::IrKernel::hooked)), the
    /// same kernel after.
    pub fn kernel<K: Kernel + Send + Sync + 'static>(&self, kernel: K) -> dsl_runtime::Result<std::sync::Arc<dsl_runtime::IrKernel>> {
        let id = kernel.id();
        if let Some(k) = self.kernels.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
            return Ok(k.clone());
        }
        let built = std::sync::Arc::new(dsl_runtime::IrKernel::hooked(kernel, self.body.clone())?);
        self.kernels.lock().unwrap_or_else(|e| e.into_inner()).insert(id, built.clone());
        Ok(built)
    }
}

impl std::fmt::Debug for ScoreHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScoreHook").finish_non_exhaustive()
    }
}

/// The [`ScoreMod`] of a [`ScoreHook`]: a score whose code the hook emits
/// ([`Hook`]), its derivative taken from that code; the key
/// tiles before `K` and the query tiles from `Q` skipped (the bands of
/// [`ScoreMod::KeysFrom`] and [`ScoreMod::QueriesTo`]; by default none, `Hooked<window_keys_from,
/// window_queries_to>` for a hook that applies a sliding window of `args[0]` keys,
/// `Hooked<data_window_keys_from, data_window_queries_to>` for one that applies
/// [`data_window()`], the window in a bias's header).
pub struct Hooked<K = all_keys, Q = all_queries>(std::marker::PhantomData<fn() -> (K, Q)>);
impl<K: KernelFn, Q: KernelFn> ScoreMod for Hooked<K, Q> {
    type Score = Hook<6>;
    type Grad = Derivative<Hook<6>>;
    type KeysFrom = K;
    type QueriesTo = Q;
}

/// Every key may be seen: no tile skipped.
#[kernel_fn]
pub fn all_keys(q: i32, t: i32, args: Ptr<f32>) -> i32 {
    0
}

/// Every query may see every key: no tile skipped.
#[kernel_fn]
pub fn all_queries(k: i32, t: i32, args: Ptr<f32>) -> i32 {
    t
}

/// The identity, [`NoScoreMod`]'s score.
#[kernel_fn]
pub fn no_score_mod(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
    s
}

/// The derivative 1: of the identity, of an added bias, of a mask.
#[kernel_fn]
pub fn unit_score_grad(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
    1.0
}

/// Soft-capping (Gemma 2, Grok): `cap * tanh(s / cap)`, `cap = args[0]` (the division
/// a multiplication by `1 / cap`, computed once; `tanh` is `tanh.approx.f32` on the GPU).
pub struct SoftCap;
impl ScoreMod for SoftCap {
    type Score = soft_cap;
    type Grad = soft_cap_grad;
    type KeysFrom = all_keys;
    type QueriesTo = all_queries;
    fn args_len(_: &Shape) -> usize {
        1
    }
}

/// [`SoftCap`]'s score.
#[kernel_fn]
pub fn soft_cap(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
    let cap = load(args);
    cap * tanh(s * (1.0 / cap))
}

/// [`SoftCap`]'s derivative, `1 - tanh(s / cap)^2`.
#[kernel_fn]
pub fn soft_cap_grad(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
    let y = tanh(s * (1.0 / load(args)));
    1.0 - y * y
}

/// ALiBi: `s - slope[h] * |q - k|`, the slopes per query head in `args` (`H` of them).
pub struct Alibi;
impl ScoreMod for Alibi {
    type Score = alibi;
    type Grad = unit_score_grad;
    type KeysFrom = all_keys;
    type QueriesTo = all_queries;
    fn args_len(s: &Shape) -> usize {
        s.heads
    }
}

/// [`Alibi`]'s score. The positions are converted to f32 before they meet (a column and a
/// row, not a tile of conversions; exact below 2^24).
#[kernel_fn]
pub fn alibi(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
    s - load(args + h) * abs(q.to::<f32>() - k.to::<f32>())
}

/// A sliding window (Mistral, with `causal`): keys `args[0]` (a whole number) or more
/// positions before the query are masked, and the key tiles wholly before the window of a
/// query tile are skipped.
pub struct SlidingWindow;
impl ScoreMod for SlidingWindow {
    type Score = sliding_window;
    type Grad = unit_score_grad;
    type KeysFrom = window_keys_from;
    type QueriesTo = window_queries_to;
    fn args_len(_: &Shape) -> usize {
        1
    }
}

/// [`SlidingWindow`]'s first key of query `q`: `q - w + 1` (`w` at most `t`, so that a
/// window wider than the sequence, up to `f32::INFINITY`, cannot overflow).
#[kernel_fn]
pub fn window_keys_from(q: i32, t: i32, args: Ptr<f32>) -> i32 {
    q - minimum(load(args).to::<i32>(), t) + 1
}

/// [`SlidingWindow`]'s end of the queries that see key `k`: `k + w` (`w` at most `t`).
#[kernel_fn]
pub fn window_queries_to(k: i32, t: i32, args: Ptr<f32>) -> i32 {
    k + minimum(load(args).to::<i32>(), t)
}

/// [`SlidingWindow`]'s score.
#[kernel_fn]
pub fn sliding_window(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
    select(q - k < load(args).to::<i32>(), s, -f32::INFINITY)
}

/// A sliding window over data ([`ScoreBias`]'s or [`KeyBias`]'s `args`, its width the
/// header's sixth value): the first key query `q` sees, as [`window_keys_from()`].
#[kernel_fn]
pub fn data_window_keys_from(q: i32, t: i32, args: Ptr<f32>) -> i32 {
    q - minimum(load(args + 5).to::<i32>(), t) + 1
}

/// The end of the queries that see key `k` under the window of [`data_window_keys_from()`].
#[kernel_fn]
pub fn data_window_queries_to(k: i32, t: i32, args: Ptr<f32>) -> i32 {
    k + minimum(load(args + 5).to::<i32>(), t)
}

/// [`sliding_window()`] with the width in a bias's header: the graph fuser inlines it, then
/// [`score_bias()`] or [`key_bias()`], into a score hook (a window and a mask from data in one
/// kernel; the window's tiles skipped by [`data_window_keys_from()`]).
#[kernel_fn]
pub fn data_window(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
    select(q - k < load(args + 5).to::<i32>(), s, -f32::INFINITY)
}

/// A bias per (batch, head, query, key) from data: an attention mask given as a tensor
/// (`scores + bias`, a padding mask, `where(mask, s, -inf)` as a bias of 0 and `-inf`, an
/// ALiBi or relative-position bias per head), what FlexAttention reads from a captured
/// tensor in its `score_mod`. `args` holds a header of [`BIAS_HEADER`] values, the
/// sequence length `T`, the bias's strides over (batch, query head, query, key) (each
/// an integer exact in f32; 0 broadcasts: a key padding mask shared by the heads is `B T`
/// values with strides `(T, 0, 0, 1)`) and a sliding window that only [`data_window()`]
/// reads, then the bias: `bias[b, h, q, k]` is `args[6 + b sb + h sh + q sq + k sk]`.
/// [`ScoreBias::args`] writes a dense `[B, T, T]` (shared by the heads) or `[B, H, T, T]` one, [`score_bias_pack`] any (how the graph
/// fuser passes masks). `-inf` masks a key; a query whose keys are all masked gets a zero
/// output. The bias is a constant of the backward (its derivative with respect to the
/// score is 1; no gradient of the bias is computed).
///
/// The strides are the caller's to keep inside the buffer: `args_len` asks for the length
/// of a dense bias shared by the heads, which any strides [`score_bias_pack`] writes for
/// such a tensor stay within; a bias per head needs `H` times as many (the launch's bounds
/// guard catches a read past the buffer, not a stride that reads the wrong values).
pub struct ScoreBias;
impl ScoreMod for ScoreBias {
    type Score = score_bias;
    type Grad = unit_score_grad;
    type KeysFrom = all_keys;
    type QueriesTo = all_queries;
    fn args_len(s: &Shape) -> usize {
        BIAS_HEADER + s.batch * f32_exact(s.seq * s.seq)
    }
}

/// The values before [`ScoreBias`]'s bias in its `args`: `T`, the four strides (batch,
/// head, query, key), and the width of a sliding window combined with the data
/// ([`data_window()`]: the graph fuser's window and mask from data in one hook; `inf` where
/// there is none; [`ScoreBias`] and [`KeyBias`] do not read it).
pub const BIAS_HEADER: usize = 6;

/// The least integer at or above `x` that an f32 holds exactly (`x` itself up to 2^24):
/// the batch stride of a dense [`ScoreBias`].
///
/// ```
/// use kernels_lib::flash_attention::f32_exact;
/// assert_eq!(f32_exact(1000 * 1000), 1000 * 1000);
/// // 4097^2 = 16785409, odd and above 2^24: the next even number.
/// assert_eq!(f32_exact(4097 * 4097), 16785410);
/// assert_eq!(f32_exact(16785410) as f32 as usize, 16785410);
/// ```
pub fn f32_exact(x: usize) -> usize {
    let ulp = 1usize << (usize::BITS - x.leading_zeros()).saturating_sub(24);
    x.div_ceil(ulp) * ulp
}

impl ScoreBias {
    /// The `args` of a dense bias (row-major) for calls of shape `s` (`T` its sequence
    /// length, `B` its batch, `H` its query heads): `[B, T, T]`, shared by the heads, with
    /// the header `(T, f32_exact(T T), 0, T, 1, inf)`, or `[B, H, T, T]`, one per head, with
    /// `(T, f32_exact(H f32_exact(T T)), f32_exact(T T), T, 1, inf)`; then the bias. An error
    /// when the bias is neither `B T T` nor `B H T T` values (the kernels would read past it).
    ///
    /// ```
    /// use kernels_lib::flash_attention::{Layout, ScoreBias, Shape};
    /// let s = Shape { batch: 1, seq: 2, heads: 2, kv_heads: 1, head_dim: 16, causal: false, layout: Layout::Bhtd };
    /// // The second key hidden from the first query, for both heads.
    /// let args = ScoreBias::args(&s, &[0.0, f32::NEG_INFINITY, 0.5, 0.0]).unwrap();
    /// assert_eq!(args[..6], [2.0, 4.0, 0.0, 2.0, 1.0, f32::INFINITY]);
    /// assert_eq!(args[6..], [0.0, f32::NEG_INFINITY, 0.5, 0.0]);
    /// // A bias per head: head 1's at 4 values past head 0's.
    /// let args = ScoreBias::args(&s, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]).unwrap();
    /// assert_eq!(args[..6], [2.0, 8.0, 4.0, 2.0, 1.0, f32::INFINITY]);
    /// // Neither: an error, not a read past the bias.
    /// assert!(ScoreBias::args(&s, &[0.0; 5]).is_err());
    /// ```
    pub fn args(s: &Shape, bias: &[f32]) -> dsl_runtime::Result<Vec<f32>> {
        let (b, h, t) = (s.batch, s.heads, s.seq);
        let heads = if bias.len() == b * t * t { 1 } else { h };
        if bias.len() != b * heads * t * t {
            return Err(bad_bias("ScoreBias", format!("a bias of {} values is neither [{b}, {t}, {t}] nor [{b}, {h}, {t}, {t}]", bias.len())));
        }
        Ok(bias_args(b, heads, t, t * t, t, bias))
    }
}

/// How [`score_bias_pack`] and [`score_mask_pack`] turn a value into a bias: with `op` 0,
/// `v * factor` (a bias added to the scores, times the scale when it is added before it);
/// with `op` 1 to 6 a mask: the comparison `v != c`, `v == c`, `v > c`, `v >= c`, `v < c`
/// or `v <= c` (IEEE: false on a NaN, but for `!=`), the key seen (bias 0) where it holds
/// and hidden (`-inf`) where not, or the reverse when `keep` is 0.
#[kernel_fn]
pub fn bias_of(v: f32, op: i32, c: f32, factor: f32, keep: i32) -> f32 {
    let hit = if op == 1 {
        select(v != c, 1.0, 0.0)
    } else if op == 2 {
        select(v == c, 1.0, 0.0)
    } else if op == 3 {
        select(v > c, 1.0, 0.0)
    } else if op == 4 {
        select(v >= c, 1.0, 0.0)
    } else if op == 5 {
        select(v < c, 1.0, 0.0)
    } else {
        select(v <= c, 1.0, 0.0)
    };
    let seen = if keep != 0 { hit } else { 1.0 - hit };
    if op == 0 {
        v * factor
    } else {
        select(seen > 0.5, 0.0, -f32::INFINITY)
    }
}

/// Writes [`ScoreBias`]'s `args` from a float tensor read through strides over (batch,
/// head, query, key) (`sb`, `sh`, `sq`, `sk`; 0 broadcasts), as [`bias_of()`] says (`op`,
/// `c`, `factor`, `keep`): how the graph fuser passes a bias or a mask of the scores to
/// the kernels. Only the extents the tensor has are written, `nh` heads (`H` or 1) of `nq`
/// queries (`T` or 1) of `nk` keys (`T` or 1) a batch (the grid's rows: `B` or 1 batches
/// of `nh nq`), at the strides `ob`, `oh`, `oq`, `ok`, which go into the header with `t`.
/// One program per written row (grid axis 0) and `BLOCK` keys (axis 1).
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn score_bias_pack<X: Float, const BLOCK: usize>(
    x: Ptr<X>, args: Ptr<f32>, t: i32, nh: i32, nq: i32, nk: i32, sb: i32, sh: i32, sq: i32, sk: i32, ob: i32, oh: i32, oq: i32, ok: i32, op: i32, c: f32, factor: f32,
    keep: i32, w: f32,
) {
    let row = program_id(0);
    let k = program_id(1) * BLOCK + arange::<BLOCK>();
    let m = k < nk;
    let v = load(x + pack_row(row, nh, nq, sb, sh, sq) + k * sk, m, 0.0).to::<f32>();
    store(args + 6 + pack_row(row, nh, nq, ob, oh, oq) + k * ok, bias_of(v, op, c, factor, keep), m);
    store(args + k, pack_header(k, t, ob, oh, oq, ok, w), (k < 6) & (row == 0));
}

/// [`score_bias_pack`] of a boolean mask (one byte an element, 0 or 1; `op` a comparison).
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn score_mask_pack<const BLOCK: usize>(
    x: Ptr<u8>, args: Ptr<f32>, t: i32, nh: i32, nq: i32, nk: i32, sb: i32, sh: i32, sq: i32, sk: i32, ob: i32, oh: i32, oq: i32, ok: i32, op: i32, c: f32, factor: f32,
    keep: i32, w: f32,
) {
    let row = program_id(0);
    let k = program_id(1) * BLOCK + arange::<BLOCK>();
    let m = k < nk;
    let v = load(x + pack_row(row, nh, nq, sb, sh, sq) + k * sk, m, 0).to::<f32>();
    store(args + 6 + pack_row(row, nh, nq, ob, oh, oq) + k * ok, bias_of(v, op, c, factor, keep), m);
    store(args + k, pack_header(k, t, ob, oh, oq, ok, w), (k < 6) & (row == 0));
}

/// The offset of row `row` of the packing kernels' grid at strides `sb`, `sh`, `sq` over
/// its (batch, head, query): `nh` heads of `nq` queries a batch.
#[kernel_fn]
pub fn pack_row(row: i32, nh: i32, nq: i32, sb: i32, sh: i32, sq: i32) -> i32 {
    let b = row / (nh * nq);
    let hq = row - b * (nh * nq);
    let h = hq / nq;
    b * sb + h * sh + (hq - h * nq) * sq
}

/// The header [`ScoreBias`] reads, as the values of lanes `k` 0 to 5 (`t`, the strides and
/// the window `w`).
#[kernel_fn]
pub fn pack_header(k: i32, t: i32, ob: i32, oh: i32, oq: i32, ok: i32, w: f32) -> f32 {
    select(k == 5, w, select(k == 0, t, select(k == 1, ob, select(k == 2, oh, select(k == 3, oq, ok)))).to::<f32>())
}

/// [`ScoreBias`]'s score: `s + bias[b, h, q, k]`, read within the sequence (tiles run past
/// its end).
#[kernel_fn]
pub fn score_bias(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
    let t = load(args).to::<i32>();
    let sb = load(args + 1).to::<i32>();
    let sh = load(args + 2).to::<i32>();
    let sq = load(args + 3).to::<i32>();
    let sk = load(args + 4).to::<i32>();
    // One i32 offset: the bounds guard then compares it once, in 32 bits.
    s + load(args + (6 + b * sb + h * sh + q * sq + k * sk), (q < t) & (k < t), 0.0)
}

/// A bias per (batch, head, key) from data, shared by the queries: a key padding mask
/// (`where(mask[b, k], s, -inf)`, a `[B, 1, 1, T]` mask). Its `args` are [`ScoreBias`]'s
/// with a query stride of 0 (which it does not read): `bias[b, h, k]` is `args[6 + b sb +
/// h sh + k sk]`, so [`score_bias_pack`] writes both. Where [`ScoreBias`] reads a
/// `BM x BN` tile of the same values every key tile, this reads the `BN` of them once
/// (the graph fuser takes it for masks and biases that do not change along the queries).
pub struct KeyBias;
impl ScoreMod for KeyBias {
    type Score = key_bias;
    type Grad = unit_score_grad;
    type KeysFrom = all_keys;
    type QueriesTo = all_queries;
    fn args_len(s: &Shape) -> usize {
        BIAS_HEADER + s.batch * f32_exact(s.seq)
    }
}

impl KeyBias {
    /// The `args` of a bias `[B, T]` (row-major, shared by the heads) or `[B, H, T]` (one
    /// per head) for calls of shape `s`: the header `(T, f32_exact(T), 0, 0, 1, inf)` or
    /// `(T, f32_exact(H T), T, 0, 1, inf)`, then the bias. An error when the bias is neither `B T`
    /// nor `B H T` values.
    ///
    /// ```
    /// use kernels_lib::flash_attention::{KeyBias, Layout, Shape};
    /// let s = Shape { batch: 2, seq: 2, heads: 1, kv_heads: 1, head_dim: 16, causal: false, layout: Layout::Bhtd };
    /// // The second key of the first sequence padded.
    /// let args = KeyBias::args(&s, &[0.0, f32::NEG_INFINITY, 0.0, 0.0]).unwrap();
    /// assert_eq!(args, [2.0, 2.0, 0.0, 0.0, 1.0, f32::INFINITY, 0.0, f32::NEG_INFINITY, 0.0, 0.0]);
    /// ```
    pub fn args(s: &Shape, bias: &[f32]) -> dsl_runtime::Result<Vec<f32>> {
        let (b, h, t) = (s.batch, s.heads, s.seq);
        let heads = if bias.len() == b * t { 1 } else { h };
        if bias.len() != b * heads * t {
            return Err(bad_bias("KeyBias", format!("a bias of {} values is neither [{b}, {t}] nor [{b}, {h}, {t}]", bias.len())));
        }
        Ok(bias_args(b, heads, t, t, 0, bias))
    }
}

/// The error of a bias that fits no shape the modification `what` reads.
fn bad_bias(what: &str, message: String) -> dsl_runtime::Error {
    dsl_runtime::Error::Launch { kernel: format!("attention ({what}::args)"), message }
}

/// The `args` of [`ScoreBias`] and [`KeyBias`] for `b` sequences of `t` and `h` heads (1:
/// shared by the heads): the header `(t, sb, sh, sq, 1, inf)`, then `bias` (row-major),
/// `per_head` values a head, each head at `sh = f32_exact(per_head)` (0 for one) and each
/// batch at `sb = f32_exact(h sh)`.
fn bias_args(b: usize, h: usize, t: usize, per_head: usize, sq: usize, bias: &[f32]) -> Vec<f32> {
    let sh = f32_exact(per_head);
    let sb = f32_exact(h * sh);
    let mut args = vec![0.0; BIAS_HEADER + b * sb];
    let sh_read = if h > 1 { sh } else { 0 };
    args[..BIAS_HEADER].copy_from_slice(&[t as f32, sb as f32, sh_read as f32, sq as f32, 1.0, f32::INFINITY]);
    for (i, values) in bias.chunks(per_head.max(1)).enumerate() {
        args[BIAS_HEADER + i / h * sb + i % h * sh..][..values.len()].copy_from_slice(values);
    }
    args
}

/// [`KeyBias`]'s score: `s + bias[b, h, k]`, read within the sequence (one value a key: a
/// row or a column of the tile, broadcast).
#[kernel_fn]
pub fn key_bias(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
    let t = load(args).to::<i32>();
    let sb = load(args + 1).to::<i32>();
    let sh = load(args + 2).to::<i32>();
    let sk = load(args + 4).to::<i32>();
    s + load(args + (6 + b * sb + h * sh + k * sk), k < t, 0.0)
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
/// assert!(attention_forward(&rt, &s, &x, &kv, &kv, &mut o, &mut lse, -0.25).is_err());
/// ```
#[allow(clippy::too_many_arguments)]
pub fn attention_forward<T: Float>(rt: &Runtime, s: &Shape, q: &Buffer<T>, k: &Buffer<T>, v: &Buffer<T>, o: &mut Buffer<T>, lse: &mut Buffer<f32>, scale: f32) -> dsl_runtime::Result<()> {
    attention_forward_with(rt, s, q, k, v, o, lse, scale, Options::default())
}

/// How the attention kernels are launched: the software-pipelining depth of their
/// key/value (forward, `dQ`) or query/output-gradient (`dK`/`dV`) loads, the forward's
/// query tile (64 rows on 4 warps, or 128 on 8; a 16-row slice a warp, so the
/// probabilities stay in registers; or 128 rows on 4 warps, 32 a warp) and key tile (64 or
/// 128), and whether the tensor-core
/// products may use Hopper's `wgmma` (on an sm_90a device; `false` keeps `mma.sync`, for
/// comparison). The default is what measured fastest (BENCHMARKS.md); the interpreter
/// ignores all of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub stages: u32,
    /// 64 or 128 (anything else is an error); `None`: chosen per call by
    /// [`Options::forward_plan`].
    pub forward_block_m: Option<usize>,
    /// 64 or 128 (anything else is an error); `None`: chosen per call by
    /// [`Options::forward_plan`] (64, or 128 where it takes the warp-specialized 128 x 128
    /// tile at head dim 128).
    pub forward_block_n: Option<usize>,
    pub wgmma: bool,
    /// The backward's `dK`/`dV` tile (queries, keys per program; a warp per 16 keys): (32,
    /// 64) at every head dimension, the others of [`BUILT_BACKWARD_TILES`] at head dims 64
    /// and 128; `None`: chosen per call by [`Options::backward_tiles`].
    pub backward_dkdv: Option<(usize, usize)>,
    /// The backward's `dQ` tile (queries per program, keys per step; a warp per 16
    /// queries): (64, 32) at every head dimension, the others of [`BUILT_BACKWARD_TILES`]
    /// at head dims 64 and 128; `None`: chosen per call by [`Options::backward_tiles`].
    pub backward_dq: Option<(usize, usize)>,
    /// The forward's warps: one per 16 query rows, or `Some(4)` with 128-row tiles for 32
    /// rows a warp (anything else is an error); `None`: chosen per call by
    /// [`Options::forward_plan`].
    pub forward_warps: Option<u32>,
    /// The forward's pipelining depth; `None`: [`Options::forward_plan`] chooses
    /// (`stages`, or 2 for the tiles that measured fastest with 2).
    pub forward_stages: Option<u32>,
    /// The forward's key/value loop warp-specialized on Hopper
    /// ([`LaunchConfig::warp_specialize`]: a producer warpgroup issues the TMA copies, the
    /// query tile's warps only wait, compute and give the stages back); untuned launches.
    /// `None`: chosen per call by [`Options::forward_plan`].
    pub warp_specialize: Option<bool>,
    /// The forward's second product one key tile behind the first
    /// ([`attention_overlapped`], FlashAttention-3's order); untuned launches.
    pub overlap: bool,
    /// Programs an SM the forward's kernel is compiled for
    /// ([`LaunchConfig::min_programs_per_sm`]; a warp-specialized kernel splits its
    /// registers for them): `None` leaves it to the tile (two programs of one consumer
    /// warpgroup when warp-specialized; [`Options::forward_plan`] picks three for its causal
    /// 64 x 64 default); untuned launches. Nothing checks that the tile fits: more programs
    /// than its registers or shared memory allow spill (ptxas keeps the registers under the
    /// split) or run fewer.
    pub forward_programs: Option<u32>,
    /// Tiles, warps and stages (and, in the forward and `dQ`, warp specialization; in the
    /// forward, programs an SM) chosen by the autotuner per shape, forward and backward
    /// (`attention_tuned`, `attention_bwd_dkdv_tuned`, `attention_bwd_dq_tuned`: the first
    /// call of a shape measures every candidate, later ones, in this process or, through
    /// the tuning cache, the next, launch the fastest); the tile, warps, `stages` and
    /// `wgmma` fields are then not read (`wgmma` wherever it fits). On the interpreter the
    /// candidates are checked, not timed.
    pub tune: bool,
}

impl Default for Options {
    /// The forward's launch per call ([`Options::forward_plan`]). Measured on an H100 (build
    /// 66f122d, BENCHMARKS.md, "Flash attention on wgmma"):
    /// with `wgmma`, 128-query tiles on 8 warps (two warpgroups, which the SMs interleave)
    /// and three stages are the fastest forward at the seed shape (0.0423 ms, against 0.0565
    /// at 64-query tiles and 0.0486 for the best `mma.sync`) and on the long D128 layer
    /// (level with 128-key tiles at two stages); on `mma.sync` 64-query tiles are (level
    /// with 128 without a mask, 1.08-1.14x faster causal). 64-key tiles. The backward keeps
    /// its own tiles and three stages (1.15-1.4x faster than unpipelined on the H200).
    /// Since `exp2` flushes subnormals (build 9360926) 64-query tiles are 3-18% faster at
    /// the seed shape (twice the programs) while 128 stay 3-12% faster on the long layer:
    /// hence the choice by program count. Since build afb830b, 128-row tiles on 4 warps (32
    /// rows a warp, FlashAttention-2's tile for head dim 64) are 12% faster than any other
    /// at the seed shape without a mask, and slower causal (7%) and at head dim 128 (32%).
    fn default() -> Options {
        Options { stages: 3, forward_block_m: None, forward_block_n: None, wgmma: true, forward_warps: None, forward_stages: None, warp_specialize: None, overlap: false, forward_programs: None, backward_dkdv: None, backward_dq: None, tune: false }
    }
}

impl Options {
    /// The forward's query tile and warps on `rt` for a call of shape `s` with inputs of
    /// `dtype`: `forward_block_m` and `forward_warps` where given. Otherwise, where both
    /// products run on `wgmma` (16-bit inputs on an sm_90a device, `wgmma` allowed): 128
    /// rows on 4 warps at head dims up to 64 without a mask (build afb830b, BENCHMARKS.md:
    /// 12% faster than any other tile at the seed shape; 7% slower causal, where smaller
    /// tiles balance the triangle, and 32% slower at head dim 128, whose accumulator then
    /// holds 128 registers a thread); else 128 rows on 8 warps where 128-row tiles still make
    /// at least 4 programs per SM, else 64 on 4 (twice the programs; build 9360926: 3-18%
    /// faster at the seed shape, 128 3-12% faster on the long D128 layer; the threshold
    /// lies between those two points, not fitted closer). Since TMA loads (build `fc2e18c`,
    /// BENCHMARKS.md, "Warp specialization": the tuner's files), at head dim 128 where
    /// 128-row tiles are busy, 128 rows on 4 warps at 2 stages ([`Options::forward_stages`];
    /// two programs an SM) is the fastest unspecialized tile, full and causal (1.05 and
    /// 0.63 ms on the long layer, against 1.37 and 0.76 for 8 warps at 3 stages).
    /// `mma.sync` takes 64 rows on 4 warps everywhere (level or faster in every measured
    /// shape). The unspecialized tile: [`Options::forward_plan`] launches it where neither
    /// of its warp-specialized defaults applies.
    pub fn forward_tile(&self, rt: &Runtime, dtype: DType, s: &Shape) -> (usize, u32) {
        self.tile_on(Gpu::of(rt), dtype, s)
    }

    /// [`Options::forward_tile`] on the device `gpu` describes.
    fn tile_on(&self, gpu: Gpu, dtype: DType, s: &Shape) -> (usize, u32) {
        let (on_wgmma, busy) = (self.on_wgmma(gpu, dtype), gpu.busy(s));
        let four_warps = on_wgmma && ((s.head_dim <= 64 && !s.causal) || (s.head_dim == 128 && busy && self.wide_d128(gpu)));
        let bm = self.forward_block_m.unwrap_or(if four_warps || (on_wgmma && busy) { 128 } else { 64 });
        let warps = self.forward_warps.unwrap_or(if bm == 128 && four_warps { 4 } else { bm as u32 / 16 });
        (bm, warps)
    }

    /// The forward's launch on `rt` for a call of shape `s` with inputs of `dtype`: where
    /// nothing of it is given (tiles, warps, stages, warp specialization), at head dim 128
    /// with 16-bit inputs on an sm_90a device where 128-row tiles make at least 4 programs
    /// per SM, 128 x 128 tiles on 8 warps at 2 stages, warp-specialized (the tuner's pick on
    /// the long D128 layer, full and causal: 0.94 / 0.54 ms against 1.11 / 0.64 for the
    /// previous default, 128 x 64 on 4 warps; H100, build `6ff9831`, BENCHMARKS.md, "The JIT
    /// linker ignores setmaxnreg"); causal at head dim 64 where 128-row tiles are fewer (the
    /// seed shape), 64 x 64 tiles on 4 warps at 2 stages, warp-specialized and compiled for
    /// three programs an SM (H200, build `159c6d7`, BENCHMARKS.md, "Three programs an SM for
    /// the causal forward": 0.0220 against 0.0232 ms for the previous default, the
    /// unspecialized 64 x 64 tile at 3 stages, and 0.0237 at two programs an SM); and there
    /// without a mask, 64 x 128 tiles on 4 warps at 2 stages, warp-specialized (the tuner's
    /// pick at the seed shape on the H200: 0.0250 against 0.0261 ms for the previous
    /// default, 128 x 64 on 4 warps unspecialized; BENCHMARKS.md, "The seed shape's
    /// defaults"). All for unmodified scores only (`scored`: a score modification keeps the unspecialized
    /// default, since the tests do not run its warp-specialized form on the GPU and a
    /// modification whose first key tile comes from `args`, a window, leaves no loop a
    /// producer can run); otherwise
    /// [`Options::forward_tile`], [`Options::forward_stages`], 64-key tiles and no warp
    /// specialization, each where not given.
    pub fn forward_plan(&self, rt: &Runtime, dtype: DType, s: &Shape, scored: bool) -> ForwardPlan {
        self.plan_on(Gpu::of(rt), dtype, s, scored)
    }

    /// [`Options::forward_plan`] on the device `gpu` describes.
    pub(crate) fn plan_on(&self, gpu: Gpu, dtype: DType, s: &Shape, scored: bool) -> ForwardPlan {
        let free = self.forward_block_m.is_none() && self.forward_block_n.is_none() && self.forward_warps.is_none() && self.forward_stages.is_none() && self.warp_specialize.is_none() && self.forward_programs.is_none();
        if free && !scored && self.on_wgmma(gpu, dtype) && gpu.busy(s) && s.head_dim == 128 && self.stages > 1 {
            return ForwardPlan { block_m: 128, block_n: 128, warps: 8, stages: 2, warp_specialize: true, programs: 1 };
        }
        if free && !self.overlap && !scored && self.on_wgmma(gpu, dtype) && !gpu.busy(s) && s.head_dim == 64 && self.stages > 1 {
            return if s.causal {
                ForwardPlan { block_m: 64, block_n: 64, warps: 4, stages: 2, warp_specialize: true, programs: 3 }
            } else {
                ForwardPlan { block_m: 64, block_n: 128, warps: 4, stages: 2, warp_specialize: true, programs: 1 }
            };
        }
        let (block_m, warps) = self.tile_on(gpu, dtype, s);
        ForwardPlan { block_m, block_n: self.forward_block_n.unwrap_or(64), warps, stages: self.stages_for((block_m, warps), s), warp_specialize: self.warp_specialize.unwrap_or(false), programs: self.forward_programs.unwrap_or(1) }
    }

    /// Whether both products of the forward run on `wgmma` on `rt` for inputs of `dtype`:
    /// 16-bit inputs on an sm_90a device, `wgmma` allowed.
    fn on_wgmma(&self, gpu: Gpu, dtype: DType) -> bool {
        self.wgmma && dtype.size() == 2 && gpu.has_wgmma()
    }

    /// Whether the 128-row, 4-warp tile at head dim 128 is the forward's default on `rt`:
    /// it is fast at 2 stages, with TMA loads (sm_90a), and where the forward's depth is
    /// not given otherwise.
    fn wide_d128(&self, gpu: Gpu) -> bool {
        self.forward_stages.is_none_or(|st| st == 2) && gpu.has_wgmma()
    }

    /// The forward's pipelining depth for a call of shape `s`: `forward_stages` where given;
    /// else 2 where [`Options::forward_tile`] picks 128 rows on 4 warps at head dim 128
    /// (its loads at 3 stages leave one program an SM: 1.46 against 1.05 ms on the long
    /// layer, H100, build `fc2e18c`), else `stages`. That of [`Options::forward_tile`]'s
    /// tile: the warp-specialized defaults of [`Options::forward_plan`] take 2.
    pub fn forward_stages(&self, rt: &Runtime, dtype: DType, s: &Shape) -> u32 {
        self.stages_for(self.forward_tile(rt, dtype, s), s)
    }

    /// [`Options::forward_stages`] for the forward's `(rows, warps)` tile.
    fn stages_for(&self, tile: (usize, u32), s: &Shape) -> u32 {
        let wide = tile == (128, 4) && s.head_dim == 128;
        self.forward_stages.unwrap_or(if wide && self.stages > 1 { 2 } else { self.stages })
    }

    /// The backward's tiles on `rt` for a call of shape `s` with inputs of `dtype`:
    /// `backward_dkdv` and `backward_dq` where given. Otherwise, where the products run on
    /// `wgmma` (16-bit inputs on an sm_90a device, `wgmma` allowed): at head dim 64, 64 x
    /// 64 on 4 warps for `dK`/`dV`, and for `dQ` 64 x 64 on 4 causal (the autotuner's pick
    /// at the seed shape, H100, build f4abd46, BENCHMARKS.md: 0.0826 ms against 0.0922 for
    /// the previous default; the fastest of the fixed tiles on the H200 too), 128 x 64 on 8
    /// without a mask (0.0731 ms against 0.0796 for the earlier pick, `dQ` on 128 x 32, and
    /// 0.0760 for 64 x 128 with 128 x 64, at the seed shape on an H200, BENCHMARKS.md, "The
    /// seed shape's defaults"; not yet measured on the H100; with a score modification,
    /// unmeasured on it, the earlier pick stays: what [`attention_backward_scored`]
    /// launches, where this function gives the tiles of unmodified scores); at head dim 128,
    /// 64 queries x 128 keys on 8 warps for `dK`/`dV` and 128 x 64 on 8 for `dQ` (build
    /// 7806a0a: 12% and 5% faster than (32, 64) and (64, 32) on the long layer, full and
    /// causal; the tuner's pick too without a mask). On `mma.sync`: the wide
    /// `dK`/`dV` tile with `dQ` on 64 x 64 for 16-bit inputs at head dim 64 without a mask
    /// (8% faster at the seed shape on the H100, build 551c7f5; 6% slower causal, and the
    /// f32 seed block 11% slower), (32, 64) and (64, 32) elsewhere.
    pub fn backward_tiles(&self, rt: &Runtime, dtype: DType, s: &Shape) -> (Tile, Tile) {
        self.backward_tiles_for(rt, dtype, s, false)
    }

    /// [`Options::backward_tiles`] for scores modified (`scored`) or not.
    fn backward_tiles_for(&self, rt: &Runtime, dtype: DType, s: &Shape, scored: bool) -> (Tile, Tile) {
        let (dkdv, dq) = match (self.on_wgmma(Gpu::of(rt), dtype), s.head_dim) {
            (true, 64) if s.causal => ((64, 64), (64, 64)),
            (true, 64) if scored => ((64, 64), (128, 32)),
            (true, 64) => ((64, 64), (128, 64)),
            (true, 128) => ((64, 128), (128, 64)),
            (false, 64) if dtype.size() == 2 && !s.causal => ((64, 128), (64, 64)),
            _ => ((32, 64), (64, 32)),
        };
        (self.backward_dkdv.unwrap_or(dkdv), self.backward_dq.unwrap_or(dq))
    }
}

/// What the launch plans read of a runtime: its GPU's target and SM count (`None` on the
/// interpreter).
#[derive(Clone, Copy)]
pub(crate) struct Gpu<'a> {
    pub(crate) target: Option<&'a dsl_runtime::emit::Target>,
    pub(crate) sms: Option<u32>,
}

impl<'a> Gpu<'a> {
    fn of(rt: &'a Runtime) -> Gpu<'a> {
        Gpu { target: rt.target(), sms: rt.sm_count() }
    }

    /// Whether it is a GPU with `wgmma` (sm_90a).
    fn has_wgmma(&self) -> bool {
        self.target.is_some_and(|t| t.has_wgmma())
    }

    /// Whether 128-row query tiles of shape `s` make at least 4 programs per SM.
    fn busy(&self, s: &Shape) -> bool {
        self.sms.is_some_and(|sms| s.batch * s.heads * s.seq.div_ceil(128) >= 4 * sms as usize)
    }
}

/// A forward launch ([`Options::forward_plan`]): query and key tiles, warps, stages,
/// warp specialization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardPlan {
    pub block_m: usize,
    pub block_n: usize,
    pub warps: u32,
    pub stages: u32,
    pub warp_specialize: bool,
    /// [`LaunchConfig::min_programs_per_sm`] ([`Options::forward_programs`]).
    pub programs: u32,
}

/// A program's tile: (queries, keys).
pub type Tile = (usize, usize);

/// The backward's tiles built besides the defaults ((32, 64) for `dK`/`dV`, (64, 32) for
/// `dQ`, at every head dimension), per head dimension: (head dim, `dK`/`dV` tiles, `dQ`
/// tiles), for [`Options::backward_dkdv`] and [`Options::backward_dq`].
pub const BUILT_BACKWARD_TILES: [(usize, &[Tile], &[Tile]); 2] =
    [(64, &[(32, 128), (64, 128), (64, 64)], &[(64, 64), (128, 32), (128, 64)]), (128, &[(64, 128)], &[(64, 64), (128, 64)])];

/// [`attention_forward`] with launch [`Options`].
#[allow(clippy::too_many_arguments)]
pub fn attention_forward_with<T: Float>(rt: &Runtime, s: &Shape, q: &Buffer<T>, k: &Buffer<T>, v: &Buffer<T>, o: &mut Buffer<T>, lse: &mut Buffer<f32>, scale: f32, opts: Options) -> dsl_runtime::Result<()> {
    forward::<T, NoScoreMod, false>(rt, s, q, k, v, o, lse, scale, NO_ARGS, None, opts)
}

/// [`attention_forward_with`] with the scores modified by `M` ([`ScoreMod`]), which reads
/// `args` (at least `M::args_len(s)` of them).
///
/// ```
/// use dsl_runtime::prelude::*;
/// use half::bf16;
/// use kernels_lib::flash_attention::{attention_forward_scored, Layout, Options, Shape, SlidingWindow};
/// let rt = Runtime::interpreter();
/// let s = Shape { batch: 1, seq: 6, heads: 1, kv_heads: 1, head_dim: 16, causal: true, layout: Layout::Bthd };
/// let q = rt.upload(&vec![bf16::from_f32(0.5); 6 * 16]).unwrap();
/// // Value row i holds i: with a window of 2, query 5 averages values 4 and 5.
/// let v = rt.upload(&(0..6 * 16).map(|i| bf16::from_f32((i / 16) as f32)).collect::<Vec<_>>()).unwrap();
/// let (mut o, mut lse) = (rt.zeros::<bf16>(6 * 16).unwrap(), rt.zeros::<f32>(6).unwrap());
/// let window = rt.upload(&[2.0f32]).unwrap();
/// attention_forward_scored::<_, SlidingWindow>(&rt, &s, &q, &q, &v, &mut o, &mut lse, 0.25, &window, Options::default()).unwrap();
/// assert_eq!(o.to_vec().unwrap()[5 * 16], bf16::from_f32(4.5));
/// // The window must be given.
/// let none = rt.zeros::<f32>(0).unwrap();
/// assert!(attention_forward_scored::<_, SlidingWindow>(&rt, &s, &q, &q, &v, &mut o, &mut lse, 0.25, &none, Options::default()).is_err());
/// ```
#[allow(clippy::too_many_arguments)]
pub fn attention_forward_scored<T: Float, M: ScoreMod>(rt: &Runtime, s: &Shape, q: &Buffer<T>, k: &Buffer<T>, v: &Buffer<T>, o: &mut Buffer<T>, lse: &mut Buffer<f32>, scale: f32, args: &Buffer<f32>, opts: Options) -> dsl_runtime::Result<()> {
    check_args::<M>("attention", s, args.len())?;
    forward::<T, M, true>(rt, s, q, k, v, o, lse, scale, args, None, opts)
}

/// [`attention_forward_with`] with the scores modified by the code `hook` emits
/// ([`ScoreHook`]), which may read `args` (none of them checked), the tiles `M`'s bands
/// exclude skipped (`M` is [`Hooked`], or `Hooked<K, Q>` with bands). Not autotuned
/// ([`Options::tune`] is an error): the tuner's candidates are compiled without the hook.
#[allow(clippy::too_many_arguments)]
pub fn attention_forward_hooked<T: Float, M: ScoreMod<Score = Hook<6>>>(rt: &Runtime, s: &Shape, q: &Buffer<T>, k: &Buffer<T>, v: &Buffer<T>, o: &mut Buffer<T>, lse: &mut Buffer<f32>, scale: f32, args: &Buffer<f32>, hook: &ScoreHook, opts: Options) -> dsl_runtime::Result<()> {
    check_args::<M>("attention", s, args.len())?;
    forward::<T, M, true>(rt, s, q, k, v, o, lse, scale, args, Some(hook), opts)
}

/// The score arguments of [`NoScoreMod`], which reads none: an empty slice, a null pointer
/// on the GPU.
const NO_ARGS: &[f32] = &[];

/// The deterministic [`attention_bwd_dkdv`]'s `dq_acc`, which it does not write: an empty
/// host buffer, a null pointer of length 0 on the GPU (no allocation).
fn no_dq_acc() -> Buffer<f32> {
    Buffer::Host(Vec::new())
}

/// A call's `args` against what `M` reads.
fn check_args<M: ScoreMod>(kernel: &str, s: &Shape, len: usize) -> dsl_runtime::Result<()> {
    let need = M::args_len(s);
    // The kernels index `args` with 32-bit offsets, and read the strides of a bias from it
    // as 32-bit integers: the least they need, and any they are given (a bias per head is
    // `H` times `need`), must fit.
    if need.max(len) > i32::MAX as usize {
        let name = std::any::type_name::<M>();
        return Err(dsl_runtime::Error::Launch { kernel: kernel.into(), message: format!("the score modification {name} for {s:?} reads {need} `args` of {len}: more than 2^31 - 1") });
    }
    if len < need {
        let name = std::any::type_name::<M>();
        return Err(dsl_runtime::Error::Launch { kernel: kernel.into(), message: format!("the score modification {name} reads {need} `args` for {s:?}; the call gives {len}") });
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
/// The kernel a launch takes: the typed one, or one built from it with a [`ScoreHook`].
enum Chosen<K> {
    Typed(K),
    Hooked(std::sync::Arc<dsl_runtime::IrKernel>),
}

impl<K: Kernel + Send + Sync + 'static> Chosen<K> {
    /// `typed`, with `hook` if there is one ([`ScoreHook::kernel`]).
    fn of(typed: K, hook: Option<&ScoreHook>) -> dsl_runtime::Result<Chosen<K>> {
        Ok(match hook {
            None => Chosen::Typed(typed),
            Some(h) => Chosen::Hooked(h.kernel(typed)?),
        })
    }
    fn kernel(&self) -> &dyn Kernel {
        match self {
            Chosen::Typed(k) => k,
            Chosen::Hooked(k) => &**k,
        }
    }
}

/// A hooked call with [`Options::tune`]: refused (the tuner launches its candidates
/// without the hook).
fn untuned(kernel: &str, hook: Option<&ScoreHook>, opts: Options) -> dsl_runtime::Result<()> {
    if hook.is_some() && opts.tune {
        return Err(dsl_runtime::Error::Launch { kernel: kernel.into(), message: "a score modification given at run time (`ScoreHook`) is not autotuned: call without `Options::tune`".into() });
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn forward<T: Float, M: ScoreMod, const SCORED: bool>(rt: &Runtime, s: &Shape, q: &Buffer<T>, k: &Buffer<T>, v: &Buffer<T>, o: &mut Buffer<T>, lse: &mut Buffer<f32>, scale: f32, args: impl InPtr<f32> + Copy, hook: Option<&ScoreHook>, opts: Options) -> dsl_runtime::Result<()> {
    check("attention", s, scale, &[("q", q.len(), 'q'), ("k", k.len(), 'k'), ("v", v.len(), 'k'), ("o", o.len(), 'q'), ("lse", lse.len(), 'l')])?;
    untuned("attention", hook, opts)?;
    let ([qb, qh, qt], [kb, kh, kt]) = (s.strides(s.heads).map(|x| x as i32), s.strides(s.kv_heads).map(|x| x as i32));
    let (t, h, kv, c) = (s.seq as i32, s.heads as i32, s.kv_heads as i32, s.causal as i32);
    if opts.tune {
        macro_rules! tuned {
            ($d:literal) => {
                attention_tuned::<T, M::Score, M::KeysFrom, SCORED, $d>(rt, q, k, v, o, lse, args, t, h, kv, scale, c, qb, qh, qt, kb, kh, kt, kb, kh, kt, qb, qh, qt)
            };
        }
        let tuned = match s.head_dim {
            16 => tuned!(16),
            32 => tuned!(32),
            64 => tuned!(64),
            _ => tuned!(128),
        };
        return tuned.map(|_| ()).map_err(|e| dsl_runtime::Error::Launch { kernel: "attention".into(), message: format!("autotuning: {e}") });
    }
    let plan = opts.forward_plan(rt, T::DTYPE, s, SCORED);
    let (bm, bn, warps) = (plan.block_m, plan.block_n, plan.warps);
    for (what, x) in [("forward_block_m", bm), ("forward_block_n", bn)] {
        if x != 64 && x != 128 {
            return Err(dsl_runtime::Error::Launch { kernel: "attention".into(), message: format!("{what} {x}: 64 or 128") });
        }
    }
    if warps != bm as u32 / 16 && (warps, bm) != (4, 128) {
        return Err(dsl_runtime::Error::Launch { kernel: "attention".into(), message: format!("forward_warps {warps} with {bm}-row tiles: one warp per 16 rows, or 4 warps for 128") });
    }
    let grid = LaunchConfig::grid3(s.seq.div_ceil(bm) as u32, (s.batch * s.heads) as u32, 1).warps(warps).stages(plan.stages).wgmma(opts.wgmma).warp_specialize(plan.warp_specialize).min_programs_per_sm(plan.programs);
    macro_rules! launch {
        ($kernel:ident, $bm:literal, $bn:literal, $d:literal) => {{
            let chosen = Chosen::of($kernel::<T, M::Score, M::KeysFrom, SCORED, $bm, $bn, $d>::new(), hook)?;
            $kernel::<T, M::Score, M::KeysFrom, SCORED, $bm, $bn, $d>::launch_as(chosen.kernel(), rt, grid, q, k, v, o, lse, args, t, h, kv, scale, c, qb, qh, qt, kb, kh, kt, kb, kh, kt, qb, qh, qt)
        }};
    }
    macro_rules! go {
        ($kernel:ident, $bm:literal, $bn:literal) => {
            match s.head_dim {
                16 => launch!($kernel, $bm, $bn, 16),
                32 => launch!($kernel, $bm, $bn, 32),
                64 => launch!($kernel, $bm, $bn, 64),
                _ => launch!($kernel, $bm, $bn, 128),
            }
        };
        ($kernel:ident) => {
            match (bm, bn) {
                (128, 128) => go!($kernel, 128, 128),
                (128, _) => go!($kernel, 128, 64),
                (_, 128) => go!($kernel, 64, 128),
                _ => go!($kernel, 64, 64),
            }
        };
    }
    if opts.overlap {
        go!(attention_overlapped)
    } else {
        go!(attention)
    }
}

/// The buffers of a backward call: what the forward read and wrote, the output's
/// gradient, and the gradients it writes (`dq` in the query layout, `dk` and `dv` in the
/// key/value layout, of the forward's shape).
pub struct Grads<'a, T: Float> {
    pub q: &'a Buffer<T>,
    pub k: &'a Buffer<T>,
    pub v: &'a Buffer<T>,
    pub o: &'a Buffer<T>,
    pub lse: &'a Buffer<f32>,
    pub dout: &'a Buffer<T>,
    pub dq: &'a mut Buffer<T>,
    pub dk: &'a mut Buffer<T>,
    pub dv: &'a mut Buffer<T>,
}

/// Checks a call's shape, head dimension, buffer lengths (`'q'`: `B T H D`, `'k'`:
/// `B T KV D`, otherwise `B H T`) and scale (positive and finite: the kernels take each
/// row's max before scaling).
fn check(kernel: &str, s: &Shape, scale: f32, lens: &[(&str, usize, char)]) -> dsl_runtime::Result<()> {
    let bad = |message: String| dsl_runtime::Error::Launch { kernel: kernel.into(), message };
    if !(scale > 0.0 && scale.is_finite()) {
        return Err(bad(format!("scale {scale}: the softmax scale must be positive and finite")));
    }
    if s.kv_heads == 0 || !s.heads.is_multiple_of(s.kv_heads) {
        return Err(bad(format!("{} query heads are not a multiple of {} key/value heads", s.heads, s.kv_heads)));
    }
    // Checked: a shape's products may pass usize (and wrap to a buffer's length); past
    // u128, u128::MAX, which no buffer has.
    let n = |dims: &[usize]| crate::graph::checked_numel(dims.iter().copied()).unwrap_or(u128::MAX);
    let (nq, nk, nl) = (n(&[s.batch, s.seq, s.heads, s.head_dim]), n(&[s.batch, s.seq, s.kv_heads, s.head_dim]), n(&[s.batch, s.heads, s.seq]));
    for &(what, len, kind) in lens {
        let (want, dims) = match kind {
            'q' => (nq, "B T H D"),
            'k' => (nk, "B T KV D"),
            _ => (nl, "B H T"),
        };
        if len as u128 != want {
            return Err(bad(format!("`{what}` has {len} elements where {s:?} needs {want} ({dims})")));
        }
    }
    let too_large = [nq, nk, nl].iter().any(|&n| n > i32::MAX as u128);
    if too_large || s.seq == 0 || s.batch * s.heads == 0 {
        return Err(bad(format!("{s:?}: empty, or too large for 32-bit offsets")));
    }
    if ![16, 32, 64, 128].contains(&s.head_dim) {
        return Err(bad(format!("head dim {}: built for 16, 32, 64 and 128", s.head_dim)));
    }
    Ok(())
}

/// Flash attention backward, FlashAttention-2's algorithm in two launches:
/// [`attention_bwd_dq`] (one program per query tile and head; it also stores the row sums
/// `delta` into the scratch `delta`), then [`attention_bwd_dkdv`] (one program per key tile
/// and key/value head, summing the head's query group). Deterministic: every gradient element is written by one
/// program, in a fixed order (no atomics; [`attention_backward_atomic`], with them,
/// measured slower). `g.lse` is
/// what [`attention_forward`] saved, `scale` the one it was given; `delta` is scratch
/// (`B H T` f32). Checks the same things as the forward, for every buffer.
///
/// ```
/// use dsl_runtime::prelude::*;
/// use half::bf16;
/// use kernels_lib::flash_attention::{attention_backward, attention_forward, Grads, Layout, Shape};
/// let rt = Runtime::interpreter();
/// let s = Shape { batch: 1, seq: 5, heads: 2, kv_heads: 1, head_dim: 16, causal: false, layout: Layout::Bthd };
/// let q = rt.upload(&vec![bf16::from_f32(0.5); 5 * 2 * 16]).unwrap();
/// let kv = rt.upload(&vec![bf16::from_f32(0.25); 5 * 16]).unwrap();
/// let (mut o, mut lse) = (rt.zeros::<bf16>(5 * 2 * 16).unwrap(), rt.zeros::<f32>(2 * 5).unwrap());
/// attention_forward(&rt, &s, &q, &kv, &kv, &mut o, &mut lse, 0.25).unwrap();
/// let dout = rt.upload(&vec![bf16::from_f32(1.0); 5 * 2 * 16]).unwrap();
/// let (mut dq, mut dk, mut dv) = (rt.zeros::<bf16>(5 * 2 * 16).unwrap(), rt.zeros::<bf16>(5 * 16).unwrap(), rt.zeros::<bf16>(5 * 16).unwrap());
/// let mut delta = rt.zeros::<f32>(2 * 5).unwrap();
/// let g = Grads { q: &q, k: &kv, v: &kv, o: &o, lse: &lse, dout: &dout, dq: &mut dq, dk: &mut dk, dv: &mut dv };
/// attention_backward(&rt, &s, g, &mut delta, 0.25).unwrap();
/// // Every score equal: the scores' gradient is zero, and each value gets 1/5 of every
/// // query's output gradient, summed over 5 queries and 2 query heads.
/// assert!(dq.to_vec().unwrap().iter().all(|&x| x == bf16::ZERO));
/// assert!(dv.to_vec().unwrap().iter().all(|&x| x == bf16::from_f32(2.0)));
/// ```
pub fn attention_backward<T: Float>(rt: &Runtime, s: &Shape, g: Grads<'_, T>, delta: &mut Buffer<f32>, scale: f32) -> dsl_runtime::Result<()> {
    attention_backward_with(rt, s, g, delta, scale, Options::default())
}

/// [`attention_backward`] with launch [`Options`].
pub fn attention_backward_with<T: Float>(rt: &Runtime, s: &Shape, g: Grads<'_, T>, delta: &mut Buffer<f32>, scale: f32, opts: Options) -> dsl_runtime::Result<()> {
    backward::<T, NoScoreMod, false>(rt, s, g, delta, scale, NO_ARGS, None, opts)
}

/// [`attention_backward_with`] with atomics (FlashAttention-2's backward as published):
/// [`attention_bwd_delta_zeroed`], then [`attention_bwd_dkdv`] with `ATOMIC`, one program per key tile
/// and key/value head computing `dK`, `dV` and its share of `dQ` from one `P` and `dS`,
/// adding the shares into `dq_acc` (scratch: `B H T D` f32) by relaxed atomic adds
/// (on sm_90a TMA reductions, `cp.reduce.async.bulk.tensor`, at 64-key tiles, as
/// FlashAttention-3 does; `red.global.add.v4.f32` at 128), and [`attention_bwd_dq_store`] rounding them into
/// `g.dq`. `P` and `dS` are computed once instead of again in a `dQ` kernel, at the price
/// of the atomics; `dQ`'s sums arrive in a different order from run to run, so its last
/// bits vary (`dK` and `dV` are summed in a fixed order, as the deterministic backward's).
/// Reads `Options::stages`, `wgmma` and `backward_dkdv`.
///
/// **Slower than the default, deterministic backward**, so not the default: at the seed
/// shape (B4 T1024 H8/KV4 D64, bf16) on an H200 (device time, BENCHMARKS.md, "`delta` in
/// the dQ kernel"), 0.0850 ms full and 0.0830 causal at 128-key tiles, 0.0900 and 0.0832 at
/// 64, against 0.0714 and 0.0682 (earlier: "The atomic backward", "The seed shape's
/// defaults"). For comparison and for callers who want one kernel over the keys.
///
/// Unmodified scores, head dims up to 64 (the `dQ` share's accumulator takes the
/// registers a wider head needs: an `Err` beyond); key tiles of 128 (8 warps) or, by
/// `Options::backward_dkdv = Some((64, 64))`, of 64 (4 warps), 64 queries a step.
pub fn attention_backward_atomic<T: Float>(rt: &Runtime, s: &Shape, g: Grads<'_, T>, delta: &mut Buffer<f32>, dq_acc: &mut Buffer<f32>, scale: f32, opts: Options) -> dsl_runtime::Result<()> {
    const KERNEL: &str = "attention_backward_atomic";
    let lens = [
        ("q", g.q.len(), 'q'), ("k", g.k.len(), 'k'), ("v", g.v.len(), 'k'), ("o", g.o.len(), 'q'), ("lse", g.lse.len(), 'l'),
        ("dout", g.dout.len(), 'q'), ("dq", g.dq.len(), 'q'), ("dk", g.dk.len(), 'k'), ("dv", g.dv.len(), 'k'), ("delta", delta.len(), 'l'),
        ("dq_acc", dq_acc.len(), 'q'),
    ];
    check(KERNEL, s, scale, &lens)?;
    if s.head_dim > 64 {
        return Err(dsl_runtime::Error::Launch { kernel: KERNEL.into(), message: format!("head dim {}: the atomic backward is built for 16, 32 and 64", s.head_dim) });
    }
    if opts.tune {
        return Err(dsl_runtime::Error::Launch { kernel: KERNEL.into(), message: "Options::tune: the atomic backward is not tuned".into() });
    }
    let ([qb, qh, qt], [kb, kh, kt]) = (s.strides(s.heads).map(|x| x as i32), s.strides(s.kv_heads).map(|x| x as i32));
    let (t, h, kv, c) = (s.seq as i32, s.heads as i32, s.kv_heads as i32, s.causal as i32);
    let bh = (s.batch * s.heads) as u32;
    let tile = opts.backward_dkdv.unwrap_or((64, 128));
    if tile != (64, 64) && tile != (64, 128) {
        return Err(dsl_runtime::Error::Launch { kernel: KERNEL.into(), message: format!("tile {tile:?}: the atomic backward is built for (64, 64) and (64, 128)") });
    }
    let rows = LaunchConfig::grid3(s.seq.div_ceil(64) as u32, bh, 1).warps(4);
    // On Hopper the 64-key tile's `dQ` shares are added by TMA (`tma_store`: a relaxed add
    // of a whole tile becomes `cp.reduce.async.bulk.tensor`), 1-4% faster than vector
    // `red`s on the H200; the 128-key tile's by vector `red`s, which measured 12% faster
    // there than TMA (its 8 warps wait at a barrier for the one thread that waits for
    // the copy to read the tile: BENCHMARKS.md, "The seed shape's defaults").
    let keys = LaunchConfig::grid3(s.seq.div_ceil(tile.1) as u32, (s.batch * s.kv_heads) as u32, 1).warps(tile.1 as u32 / 16).stages(opts.stages).wgmma(opts.wgmma).tma_store(tile.1 == 64);
    let sdq = t * s.head_dim as i32;
    macro_rules! go {
        ($d:literal) => {{
            attention_bwd_delta_zeroed::<T, 64, $d>::launch(rt, rows, g.o, g.dout, &mut *delta, &mut *dq_acc, t, h, qb, qh, qt)?;
            if tile.1 == 128 {
                attention_bwd_dkdv::<T, no_score_mod, unit_score_grad, all_queries, false, true, 64, 128, $d>::launch(rt, keys, g.q, g.k, g.v, g.dout, g.lse, &*delta, NO_ARGS, g.dk, g.dv, &mut *dq_acc, t, h, kv, scale, c, qb, qh, qt, kb, kh, kt, sdq)?;
            } else {
                attention_bwd_dkdv::<T, no_score_mod, unit_score_grad, all_queries, false, true, 64, 64, $d>::launch(rt, keys, g.q, g.k, g.v, g.dout, g.lse, &*delta, NO_ARGS, g.dk, g.dv, &mut *dq_acc, t, h, kv, scale, c, qb, qh, qt, kb, kh, kt, sdq)?;
            }
            attention_bwd_dq_store::<T, 64, $d>::launch(rt, rows, &*dq_acc, g.dq, t, h, qb, qh, qt)
        }};
    }
    match s.head_dim {
        16 => go!(16),
        32 => go!(32),
        _ => go!(64),
    }
}

/// [`attention_backward_with`] of [`attention_forward_scored`]: the same `M` and `args`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_scored<T: Float, M: ScoreMod>(rt: &Runtime, s: &Shape, g: Grads<'_, T>, delta: &mut Buffer<f32>, scale: f32, args: &Buffer<f32>, opts: Options) -> dsl_runtime::Result<()> {
    check_args::<M>("attention_backward", s, args.len())?;
    backward::<T, M, true>(rt, s, g, delta, scale, args, None, opts)
}

/// [`attention_backward_with`] of [`attention_forward_hooked`]: the same `M`, `hook` and
/// `args`, the score's gradient the derivative of the hook's code.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_hooked<T: Float, M: ScoreMod<Score = Hook<6>>>(rt: &Runtime, s: &Shape, g: Grads<'_, T>, delta: &mut Buffer<f32>, scale: f32, args: &Buffer<f32>, hook: &ScoreHook, opts: Options) -> dsl_runtime::Result<()> {
    check_args::<M>("attention_backward", s, args.len())?;
    backward::<T, M, true>(rt, s, g, delta, scale, args, Some(hook), opts)
}

#[allow(clippy::too_many_arguments)]
fn backward<T: Float, M: ScoreMod, const SCORED: bool>(rt: &Runtime, s: &Shape, g: Grads<'_, T>, delta: &mut Buffer<f32>, scale: f32, args: impl InPtr<f32> + Copy, hook: Option<&ScoreHook>, opts: Options) -> dsl_runtime::Result<()> {
    untuned("attention_backward", hook, opts)?;
    let lens = [
        ("q", g.q.len(), 'q'), ("k", g.k.len(), 'k'), ("v", g.v.len(), 'k'), ("o", g.o.len(), 'q'), ("lse", g.lse.len(), 'l'),
        ("dout", g.dout.len(), 'q'), ("dq", g.dq.len(), 'q'), ("dk", g.dk.len(), 'k'), ("dv", g.dv.len(), 'k'), ("delta", delta.len(), 'l'),
    ];
    check("attention_backward", s, scale, &lens)?;
    let ([qb, qh, qt], [kb, kh, kt]) = (s.strides(s.heads).map(|x| x as i32), s.strides(s.kv_heads).map(|x| x as i32));
    let (t, h, kv, c) = (s.seq as i32, s.heads as i32, s.kv_heads as i32, s.causal as i32);
    let bh = (s.batch * s.heads) as u32;
    let ((dkdv_m, dkdv_n), (dq_m, dq_n)) = opts.backward_tiles_for(rt, T::DTYPE, s, SCORED);
    let bad = |what: &str, tile: (usize, usize)| dsl_runtime::Error::Launch { kernel: "attention_backward".into(), message: format!("{what} tile {tile:?} at head dim {}: not built (Options::backward_dkdv, backward_dq)", s.head_dim) };
    // One warp per 16 keys (dK/dV) or queries (dQ) of a program's tile.
    // Register prefetch (`LaunchConfig::prefetch`, which the forward gains from) only in
    // dK/dV without a score modification on `wgmma` at head dim 64: there its `lse` and
    // `delta` rows issued an iteration ahead make the backward 2% faster (H100,
    // BENCHMARKS.md, "Register prefetch"). With a modification the key/value loop's four
    // products leave no registers for a bias tile carried across iterations (spills, or
    // 3-15% slower), on `mma.sync` the 64 x 64 tile spills, and `dQ`'s registers are
    // capped for two programs an SM.
    let dkdv_prefetch = !SCORED && s.head_dim == 64 && opts.on_wgmma(Gpu::of(rt), T::DTYPE);
    let keys = LaunchConfig::grid3(s.seq.div_ceil(dkdv_n) as u32, (s.batch * s.kv_heads) as u32, 1).warps(dkdv_n as u32 / 16).stages(opts.stages).wgmma(opts.wgmma).prefetch(dkdv_prefetch);
    // The 8-warp dQ tile at head dim 64 compiled for two programs an SM (128 registers a
    // thread, no spills): a score modification's hoisted loads and addresses otherwise take
    // it past 128 and to one program an SM (H100, BENCHMARKS.md, "Loop-invariant loads out
    // of the key loop": 1.2x slower backward with a bias from data). At head dim 128 it
    // would spill.
    let dq_programs = if dq_m == 128 && s.head_dim <= 64 { 2 } else { 1 };
    let queries = LaunchConfig::grid3(s.seq.div_ceil(dq_m) as u32, bh, 1).warps(dq_m as u32 / 16).stages(opts.stages).wgmma(opts.wgmma).min_programs_per_sm(dq_programs).prefetch(false);
    // Each kernel's launch at its tile (its hooked kernel built), as a closure taking
    // `delta`: both chosen before either runs, so that a tile that is not built, or a hook
    // that does not build, is an error before anything runs.
    type Launch<'a> = Box<dyn FnOnce(&mut Buffer<f32>) -> dsl_runtime::Result<()> + 'a>;
    macro_rules! dkdv {
        ($bm:literal, $bn:literal, $d:literal) => {{
            let chosen = Chosen::of(attention_bwd_dkdv::<T, M::Score, M::Grad, M::QueriesTo, SCORED, false, $bm, $bn, $d>::new(), hook)?;
            let launch: Launch = Box::new(move |delta| {
                attention_bwd_dkdv::<T, M::Score, M::Grad, M::QueriesTo, SCORED, false, $bm, $bn, $d>::launch_as(chosen.kernel(), rt, keys, g.q, g.k, g.v, g.dout, g.lse, &*delta, args, g.dk, g.dv, &mut no_dq_acc(), t, h, kv, scale, c, qb, qh, qt, kb, kh, kt, 0)
            });
            launch
        }};
    }
    macro_rules! dq {
        ($bm:literal, $bn:literal, $d:literal) => {{
            let chosen = Chosen::of(attention_bwd_dq::<T, M::Score, M::Grad, M::KeysFrom, SCORED, $bm, $bn, $d>::new(), hook)?;
            let launch: Launch = Box::new(move |delta| {
                attention_bwd_dq::<T, M::Score, M::Grad, M::KeysFrom, SCORED, $bm, $bn, $d>::launch_as(chosen.kernel(), rt, queries, g.q, g.k, g.v, g.o, g.dout, g.lse, delta, args, g.dq, t, h, kv, scale, c, qb, qh, qt, kb, kh, kt)
            });
            launch
        }};
    }
    // The default tiles at every head dimension; the others at head dims 64 (the seed's)
    // and 128 (`BUILT_BACKWARD_TILES`). `dQ` first: it stores the `delta` rows dK/dV reads.
    if opts.tune {
        let tuning = |e: autotune::TuneError| dsl_runtime::Error::Launch { kernel: "attention_backward".into(), message: format!("autotuning: {e}") };
        macro_rules! tuned {
            ($d:literal) => {{
                attention_bwd_dq_tuned::<T, M::Score, M::Grad, M::KeysFrom, SCORED, $d>(rt, g.q, g.k, g.v, g.o, g.dout, g.lse, &mut *delta, args, g.dq, t, h, kv, scale, c, qb, qh, qt, kb, kh, kt).map_err(tuning)?;
                attention_bwd_dkdv_tuned::<T, M::Score, M::Grad, M::QueriesTo, SCORED, false, $d>(rt, g.q, g.k, g.v, g.dout, g.lse, &*delta, args, g.dk, g.dv, &mut no_dq_acc(), t, h, kv, scale, c, qb, qh, qt, kb, kh, kt, 0).map_err(tuning)?;
            }};
        }
        match s.head_dim {
            16 => tuned!(16),
            32 => tuned!(32),
            64 => tuned!(64),
            _ => tuned!(128),
        }
        return Ok(());
    }
    let dq = match (s.head_dim, (dq_m, dq_n)) {
        (16, (64, 32)) => dq!(64, 32, 16),
        (32, (64, 32)) => dq!(64, 32, 32),
        (64, (64, 32)) => dq!(64, 32, 64),
        (128, (64, 32)) => dq!(64, 32, 128),
        (64, (64, 64)) => dq!(64, 64, 64),
        (64, (128, 32)) => dq!(128, 32, 64),
        (64, (128, 64)) => dq!(128, 64, 64),
        (128, (64, 64)) => dq!(64, 64, 128),
        (128, (128, 64)) => dq!(128, 64, 128),
        _ => return Err(bad("dQ", (dq_m, dq_n))),
    };
    let dkdv = match (s.head_dim, (dkdv_m, dkdv_n)) {
        (16, (32, 64)) => dkdv!(32, 64, 16),
        (32, (32, 64)) => dkdv!(32, 64, 32),
        (64, (32, 64)) => dkdv!(32, 64, 64),
        (128, (32, 64)) => dkdv!(32, 64, 128),
        (64, (32, 128)) => dkdv!(32, 128, 64),
        (64, (64, 128)) => dkdv!(64, 128, 64),
        (64, (64, 64)) => dkdv!(64, 64, 64),
        (128, (64, 128)) => dkdv!(64, 128, 128),
        _ => return Err(bad("dK/dV", (dkdv_m, dkdv_n))),
    };
    dq(delta)?;
    dkdv(delta)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forward's untuned launch per shape on an sm_90 GPU of 132 SMs (an H100's): the
    /// seed shape causal at head dim 64 takes the warp-specialized 64 x 64 tile at three
    /// programs an SM, but not with a score modification, `overlap`, a tile given, f32
    /// inputs, or where 128-row tiles make 4 programs an SM; without a mask the
    /// warp-specialized 64 x 128 tile, and where 128-row tiles are busy the 128 x 64 tile on
    /// 4 warps; the long D128 layer the warp-specialized 128 x 128 tile; the interpreter the
    /// unspecialized 64-row tile.
    #[test]
    fn forward_plans_per_shape_and_device() {
        let h100 = Gpu { target: Some(&dsl_runtime::emit::Target::SM90), sms: Some(132) };
        let seed = |causal| Shape { batch: 4, seq: 1024, heads: 8, kv_heads: 4, head_dim: 64, causal, layout: Layout::Bhtd };
        let o = Options::default();
        let plan = |o: &Options, dtype, s: &Shape, scored| o.plan_on(h100, dtype, s, scored);
        let three = ForwardPlan { block_m: 64, block_n: 64, warps: 4, stages: 2, warp_specialize: true, programs: 3 };
        assert_eq!(plan(&o, DType::BF16, &seed(true), false), three);
        assert_eq!(plan(&o, DType::F16, &seed(true), false), three);
        assert_eq!(plan(&o, DType::BF16, &seed(false), false), ForwardPlan { block_m: 64, block_n: 128, warps: 4, stages: 2, warp_specialize: true, programs: 1 });
        let busy = Shape { batch: 32, ..seed(true) };
        assert_eq!(plan(&o, DType::BF16, &Shape { causal: false, ..busy }, false), ForwardPlan { block_m: 128, block_n: 64, warps: 4, stages: 3, warp_specialize: false, programs: 1 });
        for (what, p) in [
            ("scored", plan(&o, DType::BF16, &seed(true), true)),
            ("scored, full", plan(&o, DType::BF16, &seed(false), true)),
            ("overlap", plan(&Options { overlap: true, ..Options::default() }, DType::BF16, &seed(true), false)),
            ("tile given", plan(&Options { forward_block_m: Some(64), ..Options::default() }, DType::BF16, &seed(true), false)),
            ("f32", plan(&o, DType::F32, &seed(true), false)),
            ("busy", plan(&o, DType::BF16, &busy, false)),
        ] {
            assert!(!p.warp_specialize && p.programs == 1, "{what}: {p:?}");
        }
        let long = Shape { batch: 2, seq: 4096, heads: 32, kv_heads: 8, head_dim: 128, causal: true, layout: Layout::Bhtd };
        assert_eq!(plan(&o, DType::BF16, &long, false), ForwardPlan { block_m: 128, block_n: 128, warps: 8, stages: 2, warp_specialize: true, programs: 1 });
        let cpu = Gpu { target: None, sms: None };
        assert_eq!(o.plan_on(cpu, DType::BF16, &seed(true), false), ForwardPlan { block_m: 64, block_n: 64, warps: 4, stages: 3, warp_specialize: false, programs: 1 });
    }

    /// A shape whose element counts pass usize (B T H D = 2^68, wrapped to the empty
    /// buffers' 0) or u128 is refused.
    #[test]
    fn shapes_past_usize_are_refused() {
        for (batch, seq, heads) in [(1 << 32, 1 << 32, 1), (1 << 62, 1 << 62, 1 << 62)] {
            let s = Shape { batch, seq, heads, kv_heads: 1, head_dim: 16, causal: false, layout: Layout::Bhtd };
            let e = check("attention", &s, 0.5, &[("q", 0, 'q'), ("k", 0, 'k'), ("lse", 0, 'l')]).unwrap_err().to_string();
            assert!(e.contains("`q` has 0 elements"), "{e}");
        }
    }

    /// A call's `args` longer than 32-bit offsets reach (a bias per head of `B H T T`
    /// values, 2^31 here) is refused, as a modification that needs that many is: the
    /// header's strides would not fit the `i32`s the kernels read them as.
    #[test]
    fn args_past_32_bit_offsets_are_refused() {
        let s = Shape { batch: 2, seq: 8192, heads: 32, kv_heads: 8, head_dim: 64, causal: false, layout: Layout::Bhtd };
        assert!(check_args::<ScoreBias>("attention", &s, ScoreBias::args_len(&s)).is_ok());
        let e = check_args::<ScoreBias>("attention", &s, BIAS_HEADER + s.batch * s.heads * s.seq * s.seq).unwrap_err().to_string();
        assert!(e.contains("ScoreBias") && e.contains("2^31"), "{e}");
    }
}
