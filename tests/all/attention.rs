//! Flash attention (`kernels_lib::attention`) on the interpreter against an f64
//! reference, full and causal, grouped-query heads, sequence lengths that are not
//! multiples of the tiles, both memory layouts, forward and backward; and its GPU code
//! through ptxas.

use crate::common::*;
use dsl_runtime::emit::Target;
use dsl_runtime::prelude::*;
use kernels_lib::attention;
use examples::reference::{unmodified, ScoreFn};
use kernels_lib::flash_attention::{attention_backward_atomic, attention_backward_hooked, attention_backward_scored, attention_backward_with, attention_forward_hooked, attention_forward_scored, attention_forward_with, Hooked, ScoreHook};
use kernels_lib::flash_attention::{all_keys as AK, all_queries as AQ, no_score_mod as NS, unit_score_grad as UG, Grads, Layout, NoScoreMod, Options, ScoreMod, Shape};

/// A score modification under test: `M`, the `args` it reads (`None`: the calls without
/// one), its f64 reference, and how far the kernel's modified scores may be from the
/// reference's beyond the scores' own rounding (the GPU's `tanh.approx`: 2^-11 of the cap).
pub(crate) struct Scored<'a, M: ScoreMod> {
    pub args: Option<Vec<f32>>,
    pub reference: ScoreFn<'a>,
    pub score_err: f64,
    pub m: std::marker::PhantomData<M>,
    /// The modification given at run time (`M` is then `Hooked`; `args` must be given).
    pub hook: Option<&'a ScoreHook>,
}

/// How the tests call the library with modification `Self` (its `args` given): the scored
/// calls, or for a hook (`Hooked<K, Q>`, its bands `K` and `Q` included) the hooked ones.
pub(crate) trait Calls: ScoreMod + Sized {
    #[allow(clippy::too_many_arguments)]
    fn forward<T: Float>(rt: &Runtime, c: &Shape, [q, k, v]: [&Buffer<T>; 3], o: &mut Buffer<T>, lse: &mut Buffer<f32>, scale: f32, args: &Buffer<f32>, _: Option<&ScoreHook>, opts: Options) {
        attention_forward_scored::<T, Self>(rt, c, q, k, v, o, lse, scale, args, opts).unwrap()
    }
    #[allow(clippy::too_many_arguments)]
    fn backward<T: Float>(rt: &Runtime, c: &Shape, g: Grads<'_, T>, delta: &mut Buffer<f32>, scale: f32, args: &Buffer<f32>, _: Option<&ScoreHook>, opts: Options) {
        attention_backward_scored::<T, Self>(rt, c, g, delta, scale, args, opts).unwrap()
    }
}

impl<K: KernelFn, Q: KernelFn> Calls for Hooked<K, Q> {
    #[allow(clippy::too_many_arguments)]
    fn forward<T: Float>(rt: &Runtime, c: &Shape, [q, k, v]: [&Buffer<T>; 3], o: &mut Buffer<T>, lse: &mut Buffer<f32>, scale: f32, args: &Buffer<f32>, hook: Option<&ScoreHook>, opts: Options) {
        attention_forward_hooked::<T, Self>(rt, c, q, k, v, o, lse, scale, args, hook.expect("a hook"), opts).unwrap()
    }
    #[allow(clippy::too_many_arguments)]
    fn backward<T: Float>(rt: &Runtime, c: &Shape, g: Grads<'_, T>, delta: &mut Buffer<f32>, scale: f32, args: &Buffer<f32>, hook: Option<&ScoreHook>, opts: Options) {
        attention_backward_hooked::<T, Self>(rt, c, g, delta, scale, args, hook.expect("a hook"), opts).unwrap()
    }
}

impl Calls for NoScoreMod {}
impl Calls for kernels_lib::flash_attention::SoftCap {}
impl Calls for kernels_lib::flash_attention::SlidingWindow {}
impl Calls for kernels_lib::flash_attention::Alibi {}
impl Calls for kernels_lib::flash_attention::ScoreBias {}
impl Calls for kernels_lib::flash_attention::KeyBias {}
impl Calls for SoftCapAuto {}
impl Calls for MaskSomeQueries {}
impl Calls for SkipFirstTile {}

/// No modification, through the calls without one.
pub(crate) fn plain() -> Scored<'static, NoScoreMod> {
    Scored { args: None, reference: &unmodified, score_err: 0.0, m: std::marker::PhantomData, hook: None }
}

/// Run case `c` on `rt` and check every output element and every saved log-sum-exp.
pub(crate) fn run_case(rt: &Runtime, c: Shape, seed: u64, opts: Options) {
    run_case_scored(rt, c, seed, opts, &plain());
}

/// [`run_case`] with the scores modified by `sm`. A query whose every score it masks must
/// come out exactly 0, with an `lse` of `-inf`.
pub(crate) fn run_case_scored<M: Calls>(rt: &Runtime, c: Shape, seed: u64, opts: Options, sm: &Scored<'_, M>) {
    let (nq, nk) = (c.batch * c.seq * c.heads * c.head_dim, c.batch * c.seq * c.kv_heads * c.head_dim);
    let half = |x: Vec<f32>| x.into_iter().map(|v| bf16::from_f32(v * 0.25)).collect::<Vec<_>>();
    let (q, k, v) = (half(random_f32(nq, seed)), half(random_f32(nk, seed + 1)), half(random_f32(nk, seed + 2)));
    let f = |x: &[bf16]| x.iter().map(|v| v.to_f64()).collect::<Vec<_>>();
    let scale = 1.0 / (c.head_dim as f64).sqrt();
    let examples::reference::Forward { o: want, o_terms: terms, lse: want_lse, score_size: smax } = examples::reference::attention_scored(&c, &f(&q), &f(&k), &f(&v), scale, sm.reference);
    let (q, k, v) = (rt.upload(&q).unwrap(), rt.upload(&k).unwrap(), rt.upload(&v).unwrap());
    let mut o = rt.upload(&vec![bf16::NAN; nq]).unwrap();
    let mut lse = rt.upload(&vec![f32::NAN; c.batch * c.heads * c.seq]).unwrap();
    match &sm.args {
        None => attention_forward_with(rt, &c, &q, &k, &v, &mut o, &mut lse, scale as f32, opts).unwrap(),
        Some(a) => M::forward(rt, &c, [&q, &k, &v], &mut o, &mut lse, scale as f32, &rt.upload(a).unwrap(), sm.hook, opts),
    }
    let sq = c.strides(c.heads);
    let (o, lse) = (o.to_vec().unwrap(), lse.to_vec().unwrap());
    // Output: the probabilities are rounded to bf16 for the second product (at most 2^-8
    // of each, so 2^-8 of the terms' scale), the output to bf16 (2^-8 of itself, at most
    // of the scale); f32 sums and exponentials add far less.
    let bound = 2.5 / 256.0 + 2.0 * sm.score_err;
    // The output is stored in the query layout: row (b, h, i) at the query's offset.
    for b in 0..c.batch {
        for hh in 0..c.heads {
            for i in 0..c.seq {
                let r = (b * c.heads + hh) * c.seq + i;
                let at = b * sq[0] + hh * sq[1] + i * sq[2];
                for d in 0..c.head_dim {
                    let (got, w, s) = (o[at + d].to_f64(), want[at + d], terms[at + d]);
                    assert!((got - w).abs() <= bound * s, "{c:?} seed {seed}: o[{b},{hh},{i},{d}] = {got}, want {w} (scale {s})");
                }
                // lse: the scores' f32 error (gamma_D of their terms' size), in log units.
                if want_lse[r] == f64::NEG_INFINITY {
                    assert_eq!(lse[r], f32::NEG_INFINITY, "{c:?} seed {seed}: lse[{r}] of a fully masked query");
                    continue;
                }
                let e = (lse[r] as f64 - want_lse[r]).abs();
                let lb = 2.0 * c.head_dim as f64 * 2f64.powi(-24) * smax[r] + 2f64.powi(-20) * (1.0 + want_lse[r].abs()) + sm.score_err;
                assert!(e <= lb, "{c:?} seed {seed}: lse[{r}] = {}, want {} (bound {lb:e})", lse[r], want_lse[r]);
            }
        }
    }
}

/// Forward then backward on `rt`, every gradient element checked against the f64
/// reference. The kernels round `P^T` and `dS` to bf16 for their products (2^-8 of each
/// term), take `delta` from the bf16 output (2^-8 of `|dO| |o|`, inside `dS`'s terms),
/// and round the gradients to bf16 (2^-8 of themselves): 3 * 2^-8 of the terms' size,
/// with room for the f32 sums.
pub(crate) fn run_backward_case(rt: &Runtime, c: Shape, seed: u64, opts: Options) {
    run_backward_case_of::<bf16>(rt, c, seed, opts, 1.0 / 256.0);
}

/// [`run_backward_case`] in element type `T`, whose rounding is `unit` (2^-8 for bf16,
/// 2^-11 for f16): the same bound, 3.5 units of each element's terms.
pub(crate) fn run_backward_case_of<T: Float>(rt: &Runtime, c: Shape, seed: u64, opts: Options, unit: f64) {
    run_backward_case_scored::<T, NoScoreMod>(rt, c, seed, opts, unit, &plain());
}

/// [`run_backward_case_of`] with the scores modified by `sm` (its derivative in the
/// reference): the same bound, and the modified scores' error times 4 (it moves `P` and
/// the derivative).
pub(crate) fn run_backward_case_scored<T: Float, M: Calls>(rt: &Runtime, c: Shape, seed: u64, opts: Options, unit: f64, sm: &Scored<'_, M>) {
    backward_case::<T, M>(rt, c, seed, opts, unit, sm, false);
}

/// [`run_backward_case`] through `attention_backward_atomic` (`dQ` summed by atomics in
/// an f32 scratch buffer, NaN-poisoned first: the delta kernel must zero it).
pub(crate) fn run_backward_case_atomic(rt: &Runtime, c: Shape, seed: u64, opts: Options) {
    backward_case::<bf16, NoScoreMod>(rt, c, seed, opts, 1.0 / 256.0, &plain(), true);
}

fn backward_case<T: Float, M: Calls>(rt: &Runtime, c: Shape, seed: u64, opts: Options, unit: f64, sm: &Scored<'_, M>, atomic: bool) {
    let (nq, nk) = (c.batch * c.seq * c.heads * c.head_dim, c.batch * c.seq * c.kv_heads * c.head_dim);
    let half = |x: Vec<f32>| x.into_iter().map(|v| T::from_f64(v as f64 * 0.25)).collect::<Vec<T>>();
    let (q, k, v, dout) = (half(random_f32(nq, seed)), half(random_f32(nk, seed + 1)), half(random_f32(nk, seed + 2)), half(random_f32(nq, seed + 3)));
    let f = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<_>>();
    let scale = 1.0 / (c.head_dim as f64).sqrt();
    let want = examples::reference::attention_backward_scored(&c, &f(&q), &f(&k), &f(&v), &f(&dout), scale, sm.reference);
    let up = |x: &[T]| rt.upload(x).unwrap();
    let nan = |n: usize| vec![T::from_f64(f64::NAN); n];
    let (q, k, v, dout) = (up(&q), up(&k), up(&v), up(&dout));
    let mut o = up(&nan(nq));
    let nl = c.batch * c.heads * c.seq;
    let (mut lse, mut delta) = (rt.upload(&vec![f32::NAN; nl]).unwrap(), rt.upload(&vec![f32::NAN; nl]).unwrap());
    let args = sm.args.as_ref().map(|a| rt.upload(a).unwrap());
    match &args {
        None => attention_forward_with(rt, &c, &q, &k, &v, &mut o, &mut lse, scale as f32, opts).unwrap(),
        Some(a) => M::forward(rt, &c, [&q, &k, &v], &mut o, &mut lse, scale as f32, a, sm.hook, opts),
    }
    let (mut dq, mut dk, mut dv) = (up(&nan(nq)), up(&nan(nk)), up(&nan(nk)));
    let g = Grads { q: &q, k: &k, v: &v, o: &o, lse: &lse, dout: &dout, dq: &mut dq, dk: &mut dk, dv: &mut dv };
    match &args {
        None if atomic => {
            let mut dq_acc = rt.upload(&vec![f32::NAN; nq]).unwrap();
            attention_backward_atomic(rt, &c, g, &mut delta, &mut dq_acc, scale as f32, opts).unwrap()
        }
        None => attention_backward_with(rt, &c, g, &mut delta, scale as f32, opts).unwrap(),
        Some(a) => M::backward(rt, &c, g, &mut delta, scale as f32, a, sm.hook, opts),
    }
    for (what, got, (w, terms)) in [("dq", dq, &want[0]), ("dk", dk, &want[1]), ("dv", dv, &want[2])] {
        assert_close(&format!("{c:?} seed {seed}: {what}"), &f(&got.to_vec().unwrap()), w, Some(terms), 3.5 * unit + 4.0 * sm.score_err);
    }
}

/// The cases both the interpreter and the GPU run.
pub(crate) fn cases() -> Vec<Shape> {
    let case = |batch, seq, heads, kv_heads, head_dim, causal, layout| Shape { batch, seq, heads, kv_heads, head_dim, causal, layout };
    vec![
        // Grouped-query heads (2 query heads per key/value head), a tail tile.
        case(2, 100, 4, 2, 64, false, Layout::Bthd),
        case(2, 100, 4, 2, 64, true, Layout::Bthd),
        // Multi-query (one key/value head), [B, H, T, D] storage, head dim 32.
        case(1, 130, 3, 1, 32, true, Layout::Bhtd),
        // Multi-head, shorter than one tile.
        case(1, 20, 2, 2, 64, false, Layout::Bhtd),
        // Head dim 128, grouped, causal, a tail tile.
        case(1, 70, 4, 2, 128, true, Layout::Bthd),
    ]
}

#[test]
fn flash_attention_backward_matches_the_f64_reference() {
    let s = seed();
    for (i, c) in cases().into_iter().enumerate() {
        run_backward_case(&Runtime::interpreter(), c, s + 10 * i as u64, Options::default());
    }
}

/// The atomic backward (`attention_backward_atomic`: `dQ` shares added by relaxed atomics
/// from the key-tile programs) matches f64 within the deterministic backward's bound, on
/// the cases at head dims up to 64 (grouped, multi-query, multi-head, causal and full,
/// tail tiles), at both its key tiles, and refuses head dim 128 and a scratch of the
/// wrong length.
#[test]
fn atomic_flash_attention_backward_matches_the_f64_reference() {
    let s = seed();
    let rt = Runtime::interpreter();
    for (i, c) in cases().into_iter().enumerate().filter(|(_, c)| c.head_dim <= 64) {
        run_backward_case_atomic(&rt, c, s + 10 * i as u64 + 8, Options::default());
        run_backward_case_atomic(&rt, c, s + 10 * i as u64 + 9, Options { backward_dkdv: Some((64, 64)), ..Options::default() });
    }
    for (c, n, want) in [(cases()[4], None, "head dim 128"), (cases()[0], Some(7), "`dq_acc` has 7 elements")] {
        let (nq, nk, nl) = (c.batch * c.seq * c.heads * c.head_dim, c.batch * c.seq * c.kv_heads * c.head_dim, c.batch * c.heads * c.seq);
        let (x, y, lse) = (rt.zeros::<bf16>(nq).unwrap(), rt.zeros::<bf16>(nk).unwrap(), rt.zeros::<f32>(nl).unwrap());
        let (mut dq, mut dk, mut dv, mut delta, mut acc) = (rt.zeros::<bf16>(nq).unwrap(), rt.zeros::<bf16>(nk).unwrap(), rt.zeros::<bf16>(nk).unwrap(), rt.zeros::<f32>(nl).unwrap(), rt.zeros::<f32>(n.unwrap_or(nq)).unwrap());
        let g = Grads { q: &x, k: &y, v: &y, o: &x, lse: &lse, dout: &x, dq: &mut dq, dk: &mut dk, dv: &mut dv };
        let e = attention_backward_atomic(&rt, &c, g, &mut delta, &mut acc, 0.25, Options::default()).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

/// `Options::tune`: the forward and backward through `attention_tuned` and the backward
/// kernels' `_tuned` launches (on the interpreter the tuner runs and checks every
/// candidate of the kernel's `tune(..)` that its `prune` keeps, and launches the first)
/// match f64 as the fixed tiles do; the candidates kept are the tiles the kernels are
/// written for, within shared memory, none wider than the sequence.
#[test]
fn flash_attention_tuned_matches_the_f64_reference() {
    use autotune::{Config, Key};
    use kernels_lib::tuned::attention_tile;
    let s = seed();
    for (i, c) in cases().into_iter().enumerate().filter(|(i, _)| [1, 3].contains(i)) {
        run_case(&Runtime::interpreter(), c, s + 10 * i as u64 + 8, Options { tune: true, ..Options::default() });
        run_backward_case(&Runtime::interpreter(), c, s + 10 * i as u64 + 8, Options { tune: true, ..Options::default() });
    }
    let key = |t: i64, d: i64| Key::new().with("t", t, autotune::Bucket::Exact).with("d", d, autotune::Bucket::Exact);
    let kept = |t, d| {
        let mut out = vec![];
        for (bm, bn, warps, stages) in [64, 128].into_iter().flat_map(|bm| [64, 128].into_iter().flat_map(move |bn| [4, 8].into_iter().flat_map(move |w| [2, 3].into_iter().map(move |st| (bm, bn, w, st))))) {
            if attention_tile(&Config::new(&[("BM", bm), ("BN", bn)], warps, stages), &key(t, d)) {
                out.push((bm, bn, warps, stages));
            }
        }
        out
    };
    assert_eq!(kept(1024, 64).len(), 12, "{:?}", kept(1024, 64));
    assert!(kept(1024, 128).iter().all(|&(bm, bn, _, st)| (bm + 2 * st as i64 * bn) * 128 * 2 <= 200 * 1024) && !kept(1024, 128).contains(&(128, 128, 8, 3)));
    assert_eq!(kept(20, 64), vec![(64, 64, 4, 2), (64, 64, 4, 3)]);
    // Warp-specialized: two consumer warpgroups, or one on 64-row tiles, or on 128 rows
    // where 64 keys and head dim 64 fit its registers.
    let ws = |bm: i64, bn: i64, w: u32, d: i64| attention_tile(&Config { warp_specialize: true, ..Config::new(&[("BM", bm), ("BN", bn)], w, 2) }, &key(1024, d));
    assert_eq!((ws(64, 64, 4, 64), ws(128, 64, 8, 64), ws(128, 64, 4, 64)), (true, true, true));
    assert_eq!((ws(128, 128, 4, 64), ws(128, 64, 4, 128)), (false, false));
    // Three programs an SM: the warp-specialized 64 x 64 tile on 4 warps at head dim 64 only.
    let three = |bm: i64, bn: i64, ws: bool, d: i64| attention_tile(&Config { warp_specialize: ws, programs_per_sm: 3, ..Config::new(&[("BM", bm), ("BN", bn)], 4, 2) }, &key(1024, d));
    assert_eq!([three(64, 64, true, 64), three(64, 64, false, 64), three(64, 128, true, 64), three(64, 64, true, 128), three(128, 64, true, 64)], [true, false, false, false, false]);
    // The backward's candidates: a warp per 16 keys (dK/dV) or queries (dQ).
    let k64 = key(1024, 64);
    let dkdv: Vec<_> = [(32, 64, 4), (64, 128, 8), (32, 128, 4), (64, 64, 8)].into_iter().map(|(bm, bn, w)| kernels_lib::tuned::attention_dkdv_tile(&Config::new(&[("BM", bm), ("BN", bn)], w, 3), &k64)).collect();
    let dq: Vec<_> = [(64, 32, 4), (128, 64, 8), (128, 32, 4), (64, 64, 8)].into_iter().map(|(bm, bn, w)| kernels_lib::tuned::attention_dq_tile(&Config::new(&[("BM", bm), ("BN", bn)], w, 3), &k64)).collect();
    assert_eq!((dkdv, dq), (vec![true, true, false, false], vec![true, true, false, false]));
    // `attention_tuned` itself (the head dimension given, the grid's second dimension
    // from `o`): on the interpreter, the first candidate kept, its output written.
    let rt = Runtime::interpreter();
    let (t, h, d) = (20usize, 2usize, 64usize);
    let x = rt.upload(&vec![bf16::from_f32(0.5); t * h * d]).unwrap();
    let (mut o, mut lse) = (rt.upload(&vec![bf16::NAN; t * h * d]).unwrap(), rt.upload(&vec![f32::NAN; h * t]).unwrap());
    let (ti, dd) = (t as i32, d as i32);
    let none: &[f32] = &[];
    let cfg = kernels_lib::flash_attention::attention_tuned::<bf16, NS, AK, false, 64>(&rt, &x, &x, &x, &mut o, &mut lse, none, ti, 2, 2, 0.125, 0, ti * 2 * dd, dd, 2 * dd, ti * 2 * dd, dd, 2 * dd, ti * 2 * dd, dd, 2 * dd, ti * 2 * dd, dd, 2 * dd).unwrap();
    assert_eq!((cfg.get("BM"), cfg.get("BN"), cfg.num_warps, cfg.num_stages), (64, 64, 4, 2), "{cfg}");
    assert!(o.to_vec().unwrap().iter().all(|&v| v == bf16::from_f32(0.5)) && lse.to_vec().unwrap().iter().all(|v| v.is_finite()));
    // No queries: an empty grid, not a division by zero in the key.
    let mut o = rt.upload(&vec![bf16::NAN; t * h * d]).unwrap();
    kernels_lib::flash_attention::attention_tuned::<bf16, NS, AK, false, 64>(&rt, &x, &x, &x, &mut o, &mut lse, none, 0, 2, 2, 0.125, 0, 0, dd, 2 * dd, 0, dd, 2 * dd, 0, dd, 2 * dd, 0, dd, 2 * dd).unwrap();
    assert!(o.to_vec().unwrap().iter().all(|v| v.is_nan()));
}

/// Options with the backward's other tiles at head dim `d` (`BUILT_BACKWARD_TILES`), each
/// `dK`/`dV` and each `dQ` tile in at least one of them.
pub(crate) fn other_backward_tiles(d: usize) -> Vec<Options> {
    let Some(&(_, dkdv, dq)) = kernels_lib::flash_attention::BUILT_BACKWARD_TILES.iter().find(|t| t.0 == d) else { return vec![] };
    (0..dkdv.len().max(dq.len())).map(|i| Options { backward_dkdv: Some(dkdv[i % dkdv.len()]), backward_dq: Some(dq[i % dq.len()]), ..Options::default() }).collect()
}

/// The backward's other tiles (built at head dims 64 and 128: `Options::backward_dkdv` and
/// `backward_dq`), full and causal with a tail; another tile at another head dimension is
/// a clear error.
#[test]
fn flash_attention_backward_tiles_match_the_f64_reference() {
    let s = seed();
    for (i, c) in cases().into_iter().enumerate().filter(|(i, _)| [0, 1, 4].contains(i)) {
        let others = other_backward_tiles(c.head_dim);
        assert!(others.len() >= 2, "head dim {}", c.head_dim);
        for (j, opts) in others.into_iter().enumerate() {
            run_backward_case(&Runtime::interpreter(), c, s + 10 * i as u64 + j as u64, opts);
        }
    }
    let rt = Runtime::interpreter();
    let c = cases()[2];
    let (nq, nk) = (c.batch * c.seq * c.heads * c.head_dim, c.batch * c.seq * c.kv_heads * c.head_dim);
    let x = rt.zeros::<bf16>(nq).unwrap();
    let y = rt.zeros::<bf16>(nk).unwrap();
    let lse = rt.zeros::<f32>(c.batch * c.heads * c.seq).unwrap();
    // dQ and delta poisoned: the dK/dV tile is refused before dQ (which runs first) writes.
    let (mut dq, mut dk, mut dv) = (rt.upload(&vec![bf16::NAN; nq]).unwrap(), rt.zeros::<bf16>(nk).unwrap(), rt.zeros::<bf16>(nk).unwrap());
    let mut delta = rt.upload(&vec![f32::NAN; c.batch * c.heads * c.seq]).unwrap();
    let g = Grads { q: &x, k: &y, v: &y, o: &x, lse: &lse, dout: &x, dq: &mut dq, dk: &mut dk, dv: &mut dv };
    let e = attention_backward_with(&rt, &c, g, &mut delta, 0.25, Options { backward_dkdv: Some((64, 128)), ..Options::default() }).unwrap_err().to_string();
    assert!(e.contains("(64, 128) at head dim 32: not built"), "{e}");
    assert!(dq.to_vec().unwrap().iter().all(|x| x.is_nan()) && delta.to_vec().unwrap().iter().all(|x| x.is_nan()), "dQ ran before the error");
}

/// f16 inputs, gradients and products (rounding 2^-11): the bf16 cases' bound in f16's
/// units, on a grouped causal case and a multi-query one.
#[test]
fn flash_attention_backward_in_f16_matches_the_f64_reference() {
    let s = seed();
    for (i, c) in cases().into_iter().enumerate().filter(|(i, _)| [1, 2].contains(i)) {
        run_backward_case_of::<f16>(&Runtime::interpreter(), c, s + 10 * i as u64 + 7, Options::default(), 1.0 / 2048.0);
    }
}

/// A modification of this file's own (a user's `#[kernel_fn]` and `ScoreMod`): every score
/// of the queries `5i + 2` masked, so that they see no key at all.
#[kernel_fn]
fn mask_some_queries(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
    select(q % 5 == 2, -f32::INFINITY, s)
}
struct MaskSomeQueries;
impl ScoreMod for MaskSomeQueries {
    type Score = mask_some_queries;
    type Grad = UG;
    type KeysFrom = AK;
    type QueriesTo = AQ;
}

/// Soft-capping with its gradient derived from its score.
struct SoftCapAuto;
impl ScoreMod for SoftCapAuto {
    type Score = kernels_lib::flash_attention::soft_cap;
    type Grad = dsl_runtime::dsl::Derivative<kernels_lib::flash_attention::soft_cap>;
    type KeysFrom = AK;
    type QueriesTo = AQ;
    fn args_len(_: &Shape) -> usize {
        1
    }
}

/// Every score modification of the library, and [`MaskSomeQueries`], forward and backward
/// on `rt` against the f64 reference applying the same modification, each on two of the
/// [`cases`]: soft-capping (cap 0.5, about the scores' size) full and causal; ALiBi (the
/// usual slopes `2^(-8 (h + 1) / H)`) causal and full; a sliding window of 20 keys on the
/// causal 130-key case (the later queries see no key of the first tiles: their running
/// max starts at `-inf`), on a full one and on a causal 200-key one (key and query tiles
/// skipped), and one wider than any sequence; the masked queries (zero output, `lse` -inf,
/// no gradient); soft-capping again with `Derivative<soft_cap>` as its gradient.
pub(crate) fn check_score_mods(rt: &Runtime, seed: u64, opts: Options) {
    use kernels_lib::flash_attention::{Alibi, KeyBias, ScoreBias, SlidingWindow, SoftCap};
    use std::marker::PhantomData;
    let cs = cases();
    let cap = 0.5f64;
    // The GPU's `tanh.approx.f32`: 2^-10.99 of the result, at most the cap.
    let tanh_err = if rt.is_gpu() { cap * 2f64.powi(-10) } else { 0.0 };
    let soft = Scored::<SoftCap> {
        args: Some(vec![cap as f32]),
        reference: &|s: f64, _: usize, _: usize, _: usize, _: usize| {
            let y = (s / cap).tanh();
            (cap * y, 1.0 - y * y)
        },
        score_err: tanh_err,
        m: PhantomData,
        hook: None,
    };
    let window = Scored::<SlidingWindow> {
        args: Some(vec![20.0]),
        reference: &|s: f64, _: usize, _: usize, i: usize, j: usize| (if i >= j + 20 { f64::NEG_INFINITY } else { s }, 1.0),
        score_err: 0.0,
        m: PhantomData,
        hook: None,
    };
    let masked = Scored::<MaskSomeQueries> {
        args: Some(vec![0.0]),
        reference: &|s: f64, _: usize, _: usize, i: usize, _: usize| (if i % 5 == 2 { f64::NEG_INFINITY } else { s }, 1.0),
        score_err: 0.0,
        m: PhantomData,
        hook: None,
    };
    let bf = 1.0 / 256.0;
    for (i, c) in [cs[0], cs[2]].into_iter().enumerate() {
        run_case_scored(rt, c, seed + i as u64, opts, &soft);
        run_backward_case_scored::<bf16, _>(rt, c, seed + 2 + i as u64, opts, bf, &soft);
    }
    // The same with its derivative taken automatically (`Derivative<soft_cap>`).
    let auto = Scored::<SoftCapAuto> { args: soft.args.clone(), reference: soft.reference, score_err: soft.score_err, m: PhantomData, hook: None };
    run_backward_case_scored::<bf16, _>(rt, cs[2], seed + 22, opts, bf, &auto);
    // 200 keys, causal, grouped: the later query tiles skip one and two key tiles, the
    // first key tiles' gradients skip the later query tiles.
    let long = Shape { seq: 200, ..cs[1] };
    for (i, c) in [cs[2], cs[0], long].into_iter().enumerate() {
        run_case_scored(rt, c, seed + 4 + 2 * i as u64, opts, &window);
        run_backward_case_scored::<bf16, _>(rt, c, seed + 5 + 2 * i as u64, opts, bf, &window);
    }
    // A window wider than any sequence (1e10, past i32) is no window: nothing skipped.
    let no_window = Scored::<SlidingWindow> { args: Some(vec![1e10]), reference: &unmodified, score_err: 0.0, m: PhantomData, hook: None };
    run_case_scored(rt, long, seed + 20, opts, &no_window);
    run_backward_case_scored::<bf16, _>(rt, long, seed + 21, opts, bf, &no_window);
    for (i, c) in [cs[4], cs[0]].into_iter().enumerate() {
        run_case_scored(rt, c, seed + 10 + i as u64, opts, &masked);
        run_backward_case_scored::<bf16, _>(rt, c, seed + 12 + i as u64, opts, bf, &masked);
    }
    // A bias from data per (batch, head, query, key) (`ScoreBias`): random, the last keys
    // of each batch padded out (`-inf`, a key-padding mask; more in the second batch), and
    // one query row wholly masked (a zero output). Grouped and causal with a tail, one bias
    // per head; one tile, shared by the heads.
    for (i, c) in [cs[1], cs[3]].into_iter().enumerate() {
        let (t, nh) = (c.seq, if i == 0 { c.heads } else { 1 });
        let noise = random_f32(c.batch * nh * t * t, seed + 30 + i as u64);
        let bias: Vec<f32> = (0..c.batch * nh * t * t)
            .map(|x| {
                let (b, q, k) = (x / (nh * t * t), x / t % t, x % t);
                if k + 3 * (b + 1) >= t || q == t / 2 { f32::NEG_INFINITY } else { noise[x] }
            })
            .collect();
        let b64: Vec<f64> = bias.iter().map(|&x| x as f64).collect();
        let scored = Scored::<ScoreBias> {
            args: Some(ScoreBias::args(&c, &bias).unwrap()),
            reference: &|s: f64, b: usize, h: usize, i: usize, j: usize| (s + b64[((b * nh + h % nh) * t + i) * t + j], 1.0),
            score_err: 0.0,
            m: PhantomData,
            hook: None,
        };
        run_case_scored(rt, c, seed + 32 + i as u64, opts, &scored);
        run_backward_case_scored::<bf16, _>(rt, c, seed + 34 + i as u64, opts, bf, &scored);
    }
    // A bias per (batch, key) (`KeyBias`, a key padding mask with values): random, the last
    // keys of each batch padded out (more in the second batch). Causal and grouped (two
    // batches), and full (one tile).
    for (i, c) in [cs[1], cs[3]].into_iter().enumerate() {
        let t = c.seq;
        let noise = random_f32(c.batch * t, seed + 40 + i as u64);
        let bias: Vec<f32> = (0..c.batch * t).map(|x| if x % t + 3 * (x / t + 1) >= t { f32::NEG_INFINITY } else { noise[x] }).collect();
        let b64: Vec<f64> = bias.iter().map(|&x| x as f64).collect();
        let keyed = Scored::<KeyBias> {
            args: Some(KeyBias::args(&c, &bias).unwrap()),
            reference: &|s: f64, b: usize, _: usize, _: usize, j: usize| (s + b64[b * t + j], 1.0),
            score_err: 0.0,
            m: PhantomData,
            hook: None,
        };
        run_case_scored(rt, c, seed + 42 + i as u64, opts, &keyed);
        run_backward_case_scored::<bf16, _>(rt, c, seed + 44 + i as u64, opts, bf, &keyed);
    }
    for (i, c) in [cs[1], cs[3]].into_iter().enumerate() {
        let slopes: Vec<f32> = (0..c.heads).map(|h| 2f32.powf(-8.0 * (h + 1) as f32 / c.heads as f32)).collect();
        let s64: Vec<f64> = slopes.iter().map(|&x| x as f64).collect();
        let alibi = Scored::<Alibi> {
            args: Some(slopes),
            reference: &|s: f64, _: usize, h: usize, i: usize, j: usize| (s - s64[h] * (i as f64 - j as f64).abs(), 1.0),
            score_err: 0.0,
            m: PhantomData,
            hook: None,
        };
        run_case_scored(rt, c, seed + 14 + i as u64, opts, &alibi);
        run_backward_case_scored::<bf16, _>(rt, c, seed + 16 + i as u64, opts, bf, &alibi);
    }
    check_hooked_score_mods(rt, seed + 50, opts);
}

/// Score modifications given at run time ([`ScoreHook`]), forward and backward against the
/// f64 reference, the gradient the derivative of the hook's code: `tanh(2s) / 2 + s^2 / 4`
/// (two uses of the score), full and causal; `s - |q - k| / 16` (the positions, in the
/// order the hook is given them), grouped; and the graph fuser's window over data, a
/// sliding window of 80 keys (its width in the data's header) then a key padding mask
/// (`data_window`, `key_bias` inlined), on 200 keys: tiles skipped by
/// `data_window_keys_from` and `data_window_queries_to`.
pub(crate) fn check_hooked_score_mods(rt: &Runtime, seed: u64, opts: Options) {
    use dsl_runtime::dsl::inlining::inline;
    use dsl_runtime::ir::{BinOp, Operand, UnaryOp};
    use kernels_lib::flash_attention::{data_window, data_window_keys_from, data_window_queries_to, key_bias, KeyBias};
    use std::marker::PhantomData;
    let cs = cases();
    let smooth = ScoreHook::new(|b, x, at| {
        let twice = b.binary(BinOp::Mul, x[0], Operand::Float(2.0), at)?;
        let t = b.unary(UnaryOp::Tanh, twice, at)?;
        let half = b.binary(BinOp::Mul, t, Operand::Float(0.5), at)?;
        let sq = b.binary(BinOp::Mul, x[0], x[0], at)?;
        let quarter = b.binary(BinOp::Mul, sq, Operand::Float(0.25), at)?;
        Ok(Operand::V(b.binary(BinOp::Add, half, quarter, at)?))
    });
    let distance = ScoreHook::new(|b, x, at| {
        let d = b.binary(BinOp::Sub, x[3], x[4], at)?;
        let d = b.unary(UnaryOp::Abs, d, at)?;
        let d = b.cast(d, DType::F32, at)?;
        let d = b.binary(BinOp::Mul, d, Operand::Float(1.0 / 16.0), at)?;
        Ok(Operand::V(b.binary(BinOp::Sub, x[0], d, at)?))
    });
    // The GPU's `tanh.approx.f32`: 2^-10.99 of a result of at most 1/2.
    let tanh_err = if rt.is_gpu() { 0.5 * 2f64.powi(-10) } else { 0.0 };
    let smooth = Scored::<Hooked> {
        args: Some(vec![0.0]),
        reference: &|s: f64, _: usize, _: usize, _: usize, _: usize| {
            let y = (2.0 * s).tanh();
            (0.5 * y + 0.25 * s * s, 1.0 - y * y + 0.5 * s)
        },
        score_err: tanh_err,
        m: PhantomData,
        hook: Some(&smooth),
    };
    let distance = Scored::<Hooked> {
        args: Some(vec![0.0]),
        reference: &|s: f64, _: usize, _: usize, i: usize, j: usize| (s - (i as f64 - j as f64).abs() / 16.0, 1.0),
        score_err: 0.0,
        m: PhantomData,
        hook: Some(&distance),
    };
    let bf = 1.0 / 256.0;
    for (i, c) in [cs[0], cs[2]].into_iter().enumerate() {
        run_case_scored(rt, c, seed + i as u64, opts, &smooth);
        run_backward_case_scored::<bf16, _>(rt, c, seed + 2 + i as u64, opts, bf, &smooth);
    }
    run_case_scored(rt, cs[1], seed + 4, opts, &distance);
    run_backward_case_scored::<bf16, _>(rt, cs[1], seed + 5, opts, bf, &distance);
    let long = Shape { seq: 200, ..cs[1] };
    let padded = |b: usize, j: usize| (j + 3 * b) % 13 == 5;
    let mask: Vec<f32> = (0..long.batch * long.seq).map(|x| if padded(x / long.seq, x % long.seq) { f32::NEG_INFINITY } else { 0.0 }).collect();
    let mut args = KeyBias::args(&long, &mask).unwrap();
    args[5] = 80.0;
    let window_mask = ScoreHook::new(|b, x, at| {
        let y = inline(data_window(x[0], x[1], x[2], x[3], x[4], x[5]), b, at)?;
        inline(key_bias(y, x[1], x[2], x[3], x[4], x[5]), b, at)
    });
    let window_mask = Scored::<Hooked<data_window_keys_from, data_window_queries_to>> {
        args: Some(args),
        reference: &|s: f64, b: usize, _: usize, i: usize, j: usize| (if i >= j + 80 || padded(b, j) { f64::NEG_INFINITY } else { s }, 1.0),
        score_err: 0.0,
        m: PhantomData,
        hook: Some(&window_mask),
    };
    run_case_scored(rt, long, seed + 6, opts, &window_mask);
    run_backward_case_scored::<bf16, _>(rt, long, seed + 7, opts, bf, &window_mask);
}

#[test]
fn flash_attention_with_score_modifications_matches_the_f64_reference() {
    check_score_mods(&Runtime::interpreter(), seed(), Options::default());
}

/// A score modification's helper `F` over a block of scores, at query `q = i`, key
/// `k = i / 2`, head 1: what [`derivatives_of_the_library_modifications_are_their_grads`]
/// compares.
#[kernel]
fn apply_mod<F: KernelFn, const N: usize>(s: Ptr<f32>, args: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let i = arange::<N>();
    store(out + i, F(load(s + i, i < n), 0, 1, i, i / 2, args), i < n);
}

/// `Derivative<Score>` (forward-mode differentiation of the inlined helper) gives each
/// library modification's hand-written `Grad`: soft-capping's `1 - tanh^2` (within a few
/// ulp: it computes `cap (1 - tanh^2) / cap`), ALiBi's 1 and the window's 1 inside it, 0
/// outside (the derivative of the branch `select` takes).
#[test]
fn derivatives_of_the_library_modifications_are_their_grads() {
    use dsl_runtime::dsl::Derivative;
    use kernels_lib::flash_attention::{alibi, sliding_window, soft_cap, soft_cap_grad};
    let rt = Runtime::interpreter();
    let n = 200;
    let x: Vec<f32> = random_f32(n, seed());
    let args = vec![3.0f32, 0.25, 0.5];
    let run = |f: &dyn Fn(&mut Vec<f32>)| {
        let mut out = vec![f32::NAN; n];
        f(&mut out);
        out
    };
    let cfg = LaunchConfig::grid(1);
    let auto = run(&|o| apply_mod::<Derivative<soft_cap>, 256>::launch(&rt, cfg, &x, &args, o, n as i32).unwrap());
    let hand = run(&|o| apply_mod::<soft_cap_grad, 256>::launch(&rt, cfg, &x, &args, o, n as i32).unwrap());
    for i in 0..n {
        assert!((auto[i] - hand[i]).abs() <= 4.0 * f32::EPSILON, "soft-cap at {}: {} vs {}", x[i], auto[i], hand[i]);
    }
    let a = run(&|o| apply_mod::<Derivative<alibi>, 256>::launch(&rt, cfg, &x, &args, o, n as i32).unwrap());
    assert!(a.iter().all(|&d| d == 1.0), "{a:?}");
    // Window 3: query i sees key i / 2 when i - i / 2 < 3, that is i < 5.
    let w = run(&|o| apply_mod::<Derivative<sliding_window>, 256>::launch(&rt, cfg, &x, &args, o, n as i32).unwrap());
    assert!(w.iter().enumerate().all(|(i, &d)| d == if i < 5 { 1.0 } else { 0.0 }), "{w:?}");
}

/// A modification whose score depends on the whole tile (a reduction): not differentiable
/// automatically, a clear error naming it at the backward's launch.
#[kernel_fn]
fn centered(s: f32, b: i32, h: i32, q: i32, k: i32, args: Ptr<f32>) -> f32 {
    s - s.sum()
}
struct Centered;
impl ScoreMod for Centered {
    type Score = centered;
    type Grad = dsl_runtime::dsl::Derivative<centered>;
    type KeysFrom = AK;
    type QueriesTo = AQ;
}

#[test]
fn a_modification_that_cannot_be_differentiated_is_a_clear_error() {
    let rt = Runtime::interpreter();
    let c = Shape { batch: 1, seq: 20, heads: 1, kv_heads: 1, head_dim: 16, causal: false, layout: Layout::Bthd };
    let n = 20 * 16;
    let x = rt.upload(&vec![bf16::from_f32(0.1); n]).unwrap();
    let (o, lse) = (rt.zeros::<bf16>(n).unwrap(), rt.zeros::<f32>(20).unwrap());
    let (mut dq, mut dk, mut dv, mut delta) = (rt.zeros::<bf16>(n).unwrap(), rt.zeros::<bf16>(n).unwrap(), rt.zeros::<bf16>(n).unwrap(), rt.zeros::<f32>(20).unwrap());
    let g = Grads { q: &x, k: &x, v: &x, o: &o, lse: &lse, dout: &x, dq: &mut dq, dk: &mut dk, dv: &mut dv };
    let e = attention_backward_scored::<_, Centered>(&rt, &c, g, &mut delta, 0.25, &rt.upload(&[0.0f32]).unwrap(), Options::default()).unwrap_err().to_string();
    assert!(e.contains("`centered` is not differentiable automatically") && e.contains("Reduce"), "{e}");
}

/// A bias from data whose offsets would pass 32 bits (3 x 30000 x 30000 values) is a
/// clear error before anything is read, not a wrapped index.
#[test]
fn a_score_bias_past_32_bit_offsets_is_a_clear_error() {
    use kernels_lib::flash_attention::ScoreBias;
    let rt = Runtime::interpreter();
    let c = Shape { batch: 3, seq: 30000, heads: 1, kv_heads: 1, head_dim: 16, causal: false, layout: Layout::Bthd };
    let x = rt.upload(&[bf16::from_f32(0.1)]).unwrap();
    let (mut o, mut lse) = (rt.zeros::<bf16>(1).unwrap(), rt.zeros::<f32>(1).unwrap());
    let e = attention_forward_scored::<_, ScoreBias>(&rt, &c, &x, &x, &x, &mut o, &mut lse, 0.25, &rt.upload(&[0.0f32]).unwrap(), Options::default()).unwrap_err().to_string();
    assert!(e.contains("ScoreBias") && e.contains("2^31"), "{e}");
}

/// The packing kernels of a mask or bias from data (how the graph fuser fills `ScoreBias`'s
/// arguments): every comparison both ways round, on a byte mask `[B, H, 1, T]` (a key
/// padding mask per head: `B H T` values written, read with a zero query stride) and a
/// bf16 table `[T, T]` shared by the batches and the heads (zero strides), and a bias per
/// head `[H, T, T]` times a factor read through a transpose, against the same rules on the
/// host, as `ScoreBias` reads them back through the header; `ScoreBias::args`, the dense
/// layouts shared by the heads and per head, read back the same way.
#[test]
fn score_bias_packing_follows_each_comparison() {
    use kernels_lib::flash_attention::{score_bias_pack, score_mask_pack, ScoreBias, BIAS_HEADER};
    let rt = Runtime::interpreter();
    let (b, h, t) = (2usize, 3usize, 5usize);
    let n = BIAS_HEADER + b * h * t * t;
    let cmp = |op: i32, v: f32, c: f32| match op {
        1 => v != c,
        2 => v == c,
        3 => v > c,
        4 => v >= c,
        5 => v < c,
        _ => v <= c,
    };
    // `ScoreBias`'s read of every (batch, head, query, key) from the header's strides.
    let check = |got: &[f32], want: &dyn Fn(usize, usize, usize, usize) -> f32, what: &str| {
        assert_eq!(got[0], t as f32, "{what}: the header's T");
        let [sb, sh, sq, sk] = [got[1], got[2], got[3], got[4]].map(|x| x as usize);
        for (bi, hi, i, j) in (0..b * h * t * t).map(|x| (x / (h * t * t), x / (t * t) % h, x / t % t, x % t)) {
            assert_eq!(got[BIAS_HEADER + bi * sb + hi * sh + i * sq + j * sk], want(bi, hi, i, j), "{what}: batch {bi}, head {hi}, query {i}, key {j}");
        }
    };
    let mask: Vec<u8> = (0..b * h * t).map(|x| (x % 3 == 1 || x % 7 == 2) as u8).collect();
    let mbuf = rt.upload(&mask).unwrap();
    // Eighths in [-1, 1).
    let table: Vec<f32> = (0..h * t * t).map(|x| ((x * 7) % 16) as f32 / 8.0 - 1.0).collect();
    let tbuf = rt.upload(&table.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>()).unwrap();
    let (hi, ti) = (h as i32, t as i32);
    for op in 1..=6 {
        for keep in [0, 1] {
            let seen = |hit: bool| if hit == (keep == 1) { 0.0 } else { f32::NEG_INFINITY };
            // Key mask per head: B H rows of T keys (strides H T, T, 0, 1 read and written).
            let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
            let (ht, cfg) = (hi * ti, LaunchConfig::grid3((b * h) as u32, 1, 1));
            score_mask_pack::<64>::launch(&rt, cfg, &mbuf, &mut out, ti, hi, 1, ti, ht, ti, 0, 1, ht, ti, 0, 1, op, 0.0, 1.0, keep, 7.0).unwrap();
            let got = out.to_vec().unwrap();
            assert_eq!(got[5], 7.0, "the header's window");
            assert!(got[BIAS_HEADER + b * h * t..].iter().all(|x| x.is_nan()), "mask op {op}: wrote past the mask's B H T values");
            check(&got, &|bi, hi, _, j| seen(cmp(op, f32::from(mask[(bi * h + hi) * t + j]), 0.0)), &format!("mask op {op} keep {keep}"));
            // Table: T rows shared by the batches and the heads (strides 0, 0, T, 1).
            let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
            score_bias_pack::<bf16, 64>::launch(&rt, LaunchConfig::grid3(t as u32, 1, 1), &tbuf, &mut out, ti, 1, ti, ti, 0, 0, ti, 1, 0, 0, ti, 1, op, 0.25, 1.0, keep, f32::INFINITY).unwrap();
            let got = out.to_vec().unwrap();
            assert_eq!(got[5], f32::INFINITY, "the header's window");
            check(&got, &|_, _, i, j| seen(cmp(op, table[i * t + j], 0.25)), &format!("table op {op} keep {keep}"));
        }
    }
    // An additive bias per head, scaled (added before the scale), read through a transpose
    // of each head's table; shared by the batches.
    let mut out = rt.upload(&vec![f32::NAN; n]).unwrap();
    let tt = ti * ti;
    score_bias_pack::<bf16, 64>::launch(&rt, LaunchConfig::grid3((h * t) as u32, 1, 1), &tbuf, &mut out, ti, hi, ti, ti, 0, tt, 1, ti, 0, tt, ti, 1, 0, 0.0, 0.5, 1, f32::INFINITY).unwrap();
    check(&out.to_vec().unwrap(), &|_, hi, i, j| table[(hi * t + j) * t + i] * 0.5, "bias per head");
    // The dense layouts.
    let s = Shape { batch: b, seq: t, heads: h, kv_heads: 1, head_dim: 16, causal: false, layout: Layout::Bhtd };
    let shared: Vec<f32> = (0..b * t * t).map(|x| x as f32).collect();
    check(&ScoreBias::args(&s, &shared).unwrap(), &|bi, _, i, j| ((bi * t + i) * t + j) as f32, "ScoreBias::args shared by the heads");
    let per_head: Vec<f32> = (0..b * h * t * t).map(|x| x as f32).collect();
    check(&ScoreBias::args(&s, &per_head).unwrap(), &|bi, hi, i, j| (((bi * h + hi) * t + i) * t + j) as f32, "ScoreBias::args per head");
}

/// A `KeysFrom` and a `QueriesTo` that hide keys their score leaves alone: the first 64
/// keys (one tile) from every query.
#[kernel_fn]
fn from_key_64(q: i32, t: i32, args: Ptr<f32>) -> i32 {
    64
}
#[kernel_fn]
fn no_queries_below_key_64(k: i32, t: i32, args: Ptr<f32>) -> i32 {
    select(k < 64, 0, t)
}
struct SkipFirstTile;
impl ScoreMod for SkipFirstTile {
    type Score = NS;
    type Grad = UG;
    type KeysFrom = from_key_64;
    type QueriesTo = no_queries_below_key_64;
}

/// Every kernel skips the tiles its modification's bands exclude: with bands that hide the
/// first key tile (against their contract, so that skipping shows), the forward is attention
/// over keys 64 on, not over all keys, and so is the backward: `dQ` from those keys alone
/// (`KeysFrom`) and zero `dK`, `dV` for the first 64 keys (`QueriesTo`).
#[test]
fn tiles_outside_the_declared_bands_are_skipped() {
    let sm = Scored::<SkipFirstTile> {
        args: Some(vec![0.0]),
        reference: &|s: f64, _: usize, _: usize, _: usize, j: usize| (if j < 64 { f64::NEG_INFINITY } else { s }, 1.0),
        score_err: 0.0,
        m: std::marker::PhantomData,
        hook: None,
    };
    let c = Shape { batch: 1, seq: 150, heads: 2, kv_heads: 1, head_dim: 32, causal: false, layout: Layout::Bthd };
    run_case_scored(&Runtime::interpreter(), c, seed(), Options::default(), &sm);
    run_backward_case_scored::<bf16, _>(&Runtime::interpreter(), c, seed() + 1, Options::default(), 1.0 / 256.0, &sm);
}

/// Every case at the default tiles, and with 128-query and 128-key tiles (other
/// instantiations of the kernel: the causal tile skipping and the masked diagonal at
/// other sizes).
#[test]
fn flash_attention_matches_the_f64_reference() {
    let s = seed();
    let wide = Options { forward_block_m: Some(128), forward_block_n: Some(128), ..Options::default() };
    for (i, c) in cases().into_iter().enumerate() {
        run_case(&Runtime::interpreter(), c, s + 10 * i as u64, Options::default());
        run_case(&Runtime::interpreter(), c, s + 10 * i as u64 + 3, wide);
        // The second product a tile behind (`attention_overlapped`): its first tile before
        // the loop, its last product after it, tiles of one key block and of several.
        run_case(&Runtime::interpreter(), c, s + 10 * i as u64 + 4, Options { overlap: true, ..Options::default() });
        run_case(&Runtime::interpreter(), c, s + 10 * i as u64 + 5, Options { overlap: true, ..wide });
    }
}

/// The GPU code, specialized as a launch on aligned `[B, T, H, D]` tensors specializes it
/// (strides and lengths divisible by 16): tensor cores for both products (the scores
/// `q k^T` and `p v`), fed from shared memory, no spills, on sm_80 and sm_90a, at head
/// dims 64 and 128 (4 warps, as `attention_forward` launches it). On sm_80 `mma.sync` fed
/// by `ldmatrix`; on sm_90a both products are `wgmma`: the scores read the query and key
/// tiles from shared memory by descriptor, the second product takes the probabilities
/// from registers (`wgmma`'s register form: `HGMMA .., R<a>, gdesc[..]`), nothing is read
/// with `ldmatrix`. The causal/tail mask's index arithmetic stays in registers.
#[test]
fn flash_attention_assembles_to_tensor_cores_without_spills() {
    use crate::codegen::{assemble, loop_bodies, sass};
    use dsl_runtime::ir::ParamSpec;
    let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
    // q k v o lse score_args, t h kv, scale, causal, twelve strides.
    let specs: Vec<ParamSpec> = [al; 6].into_iter().chain([al, no, no, no, no]).chain([al; 12]).collect();
    for (target, arch) in [(Target::SM80, "sm_80"), (Target::SM90, "sm_90a")] {
        for (d, k) in [(64, Box::new(attention::<bf16, NS, AK, false, 64, 64, 64>::new()) as Box<dyn dsl_runtime::launch::Kernel>), (128, Box::new(attention::<bf16, NS, AK, false, 64, 64, 128>::new()))] {
            let art = dsl_runtime::compile::stages_specialized(k.as_ref(), &specs, target.clone(), &LaunchConfig::grid(1).warps(4).stages(1)).unwrap();
            let ptx = art.ptx;
            let name = format!("attention_d{d}");
            // The mask's indices (`rm.col()` in the accumulator's layout) are recomputed,
            // not moved through shared memory (`remat` of `expand_dims`).
            assert!(!ptx.contains("st.shared.u32"), "{arch} head dim {d}: integers through shared memory");
            let report = assemble(&ptx, arch, &name);
            assert!(report.contains("0 bytes spill stores") && report.contains("0 bytes stack frame"), "{arch} head dim {d}:\n{report}");
            let code = sass(&ptx, arch, &name);
            if arch == "sm_80" {
                assert!(code.contains("HMMA.16816.F32.BF16") && code.contains("LDSM"), "{arch} head dim {d}: no tensor cores fed by ldmatrix");
                continue;
            }
            let main = loop_bodies(&code).into_iter().find(|l| l.contains("HGMMA")).unwrap_or_else(|| panic!("head dim {d}: no loop of wgmmas:\n{code}"));
            let from_registers = main.lines().filter(|l| l.contains("HGMMA.64x") && l.split(',').nth(1).is_some_and(|a| a.trim().starts_with('R'))).count();
            let from_shared = main.lines().filter(|l| l.contains("HGMMA.64x") && l.split(',').nth(1).is_some_and(|a| a.trim().starts_with("gdesc"))).count();
            // K steps of 16: the scores over D, the second product over the 64 keys.
            assert_eq!((from_shared, from_registers), (d / 16, 64 / 16), "head dim {d}: wgmmas by operand source:\n{main}");
            assert!(!code.contains("HMMA.16816") && !code.contains("LDSM"), "head dim {d}: mma.sync or ldmatrix left");
        }
    }
}

/// The backward kernels' GPU code, specialized as an aligned launch specializes it, at
/// head dims 64 and 128 (the tiles `attention_backward` launches, and the wider ones it
/// takes at head dim 64), unpipelined and pipelined, with register prefetch where the
/// library turns it on: no local memory (spills) in any loop; on sm_80 every product on `mma.sync` fed by `ldmatrix`; on sm_90a every product
/// on `wgmma`, the query and output-gradient tiles (the key tile in the dQ kernel) each
/// read by two of them from one buffer, directly and transposed, with nothing read by
/// `ldmatrix` and no `wgmma` serialized by ptxas (its C7515).
#[test]
fn flash_attention_backward_assembles_to_tensor_cores_without_spills_in_loops() {
    use crate::codegen::{assemble_to_sass, loop_bodies};
    use dsl_runtime::ir::ParamSpec;
    use dsl_runtime::launch::Kernel;
    use kernels_lib::flash_attention::{attention_bwd_dkdv, attention_bwd_dq};
    let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
    // Pointers, t h kv, scale, causal, strides (dK/dV: and its unused `dq_acc` and `sdq`).
    let specs = |ptrs: usize| -> Vec<ParamSpec> { std::iter::repeat_n(al, ptrs).chain([al, no, no, no, no]).chain(std::iter::repeat_n(al, if ptrs == 10 { 7 } else { 6 })).collect() };
    for (target, arch) in [(Target::SM80, "sm_80"), (Target::SM90, "sm_90a")] {
        // (name, kernel, pointers, warps)
        let kernels: [(&str, Box<dyn Kernel>, usize, u32); 11] = [
            ("dkdv_d64", Box::new(attention_bwd_dkdv::<bf16, NS, UG, AQ, false, false, 32, 64, 64>::new()), 10, 4),
            ("dkdv_d64_long", Box::new(attention_bwd_dkdv::<bf16, NS, UG, AQ, false, false, 32, 128, 64>::new()), 10, 8),
            ("dkdv_d64_square", Box::new(attention_bwd_dkdv::<bf16, NS, UG, AQ, false, false, 64, 64, 64>::new()), 10, 4),
            ("dkdv_d64_wide", Box::new(attention_bwd_dkdv::<bf16, NS, UG, AQ, false, false, 64, 128, 64>::new()), 10, 8),
            ("dkdv_d128", Box::new(attention_bwd_dkdv::<bf16, NS, UG, AQ, false, false, 32, 64, 128>::new()), 10, 4),
            ("dkdv_d128_wide", Box::new(attention_bwd_dkdv::<bf16, NS, UG, AQ, false, false, 64, 128, 128>::new()), 10, 8),
            ("dq_d64", Box::new(attention_bwd_dq::<bf16, NS, UG, AK, false, 64, 32, 64>::new()), 9, 4),
            ("dq_d64_wide", Box::new(attention_bwd_dq::<bf16, NS, UG, AK, false, 64, 64, 64>::new()), 9, 4),
            ("dq_d128", Box::new(attention_bwd_dq::<bf16, NS, UG, AK, false, 64, 32, 128>::new()), 9, 4),
            ("dq_d128_wide", Box::new(attention_bwd_dq::<bf16, NS, UG, AK, false, 64, 64, 128>::new()), 9, 4),
            ("dq_d128_tall", Box::new(attention_bwd_dq::<bf16, NS, UG, AK, false, 128, 64, 128>::new()), 9, 8),
        ];
        for (name, k, ptrs, warps) in kernels {
            // The wide tiles at head dim 128 are for `wgmma` (their `mma.sync` code spills:
            // its fragments take registers that `wgmma` reads from shared memory).
            if arch == "sm_80" && name.contains("d128_") {
                continue;
            }
            for stages in [1, 3] {
                // As the library launches them: register prefetch in dK/dV at head dim 64 on
                // `wgmma` (these have no score modification), nowhere else.
                let prefetch = arch == "sm_90a" && name.starts_with("dkdv_d64");
                let cfg = LaunchConfig::grid(1).warps(warps).stages(stages).prefetch(prefetch);
                let art = dsl_runtime::compile::stages_specialized(k.as_ref(), &specs(ptrs), target.clone(), &cfg).unwrap();
                if prefetch && stages > 1 {
                    // (It takes: the loop's loads of `lse` and `delta` move.)
                    let without = dsl_runtime::compile::stages_specialized(k.as_ref(), &specs(ptrs), target.clone(), &cfg.prefetch(false)).unwrap();
                    assert_ne!(art.opt_ir, without.opt_ir, "{name}: nothing prefetched");
                }
                let (report, code) = assemble_to_sass(&art.ptx, arch, name);
                let loops = loop_bodies(&code);
                // dK/dV at head dim 128 on 64 x 128 tiles: two 64-register accumulators and
                // the 32-register scores and their gradient on 8 warps, at 255 registers; as
                // launched (3 stages) its key loop reloads 3 spilled values an iteration.
                if name == "dkdv_d128_wide" {
                    let inner = loops.iter().filter(|l| !loops.iter().any(|o| o != *l && l.contains(o.as_str())));
                    assert!(stages == 1 || inner.into_iter().all(|l| !l.contains("STL") && l.matches("LDL").count() <= 3), "{name} stages {stages}: more spills");
                } else {
                    for l in &loops {
                        assert!(!l.contains("LDL") && !l.contains("STL"), "{arch} {name} stages {stages}: local memory in a loop:\n{l}");
                    }
                }
                if arch == "sm_80" {
                    assert!(code.contains("HMMA.16816.F32.BF16") && code.contains("LDSM"), "{arch} {name}: no tensor cores fed by ldmatrix");
                    assert!(loops.iter().any(|l| l.contains("HMMA")), "{arch} {name}: no loop of tensor-core products");
                    continue;
                }
                let plan: Vec<&str> = art.opt_ir.lines().filter(|l| l.starts_with("// %")).map(|l| l.split(": ").nth(1).unwrap()).collect();
                assert!(plan.len() >= 3 && plan.iter().all(|p| p.starts_with("wgmma")), "{name} stages {stages}: {plan:?}");
                assert!(loops.iter().any(|l| l.contains("HGMMA")) && !code.contains("HMMA.16816") && !code.contains("LDSM"), "{name} stages {stages}: not all on wgmma");
                assert!(!report.contains("C7515") && !report.contains("serialized"), "{name} stages {stages}: {report}");
                // Pipelined: the query and output-gradient tiles (dK/dV; the key and value
                // tiles in dQ) copied by TMA in the loop, for a later iteration.
                assert_eq!(loops.iter().any(|l| l.contains("UTMALDG")), stages > 1, "{name} stages {stages}: TMA copies in the loop");
            }
        }
    }
}

/// The `gqa_attention` example's block, forward and backward (projections, grouped-query
/// flash attention, output projection, every gradient of `y.sum()`), in bf16 and f32, on
/// the interpreter: every launch within its documented bound.
#[test]
fn the_gqa_attention_example_block_checks_out_on_the_interpreter() {
    let worst = examples::gqa::run(&Runtime::interpreter(), examples::gqa::SMALL).unwrap();
    assert!(worst <= 1.0, "{worst}");
}

/// Kernels with a score modification (soft-capping, the one with most code: a `tanh` and a
/// division in the forward, and its derivative too in the backward) keep their
/// tensor-core products (`wgmma` on sm_90a) and assemble without spills in an inner loop:
/// the forward at its largest tiles (128 x 64 on 8 warps, head dim 128), the backward at
/// head dims 64 and 128, pipelined as launched. The derivative is taken before the
/// products so that the scores do not live across them (on `mma.sync` the key/value
/// backward at head dim 128 spilled in its loop otherwise).
#[test]
fn score_modified_attention_kernels_keep_tensor_cores_without_spills() {
    use crate::codegen::{loop_bodies, sass};
    use dsl_runtime::ir::ParamSpec;
    use dsl_runtime::launch::Kernel;
    use kernels_lib::flash_attention::{attention_bwd_dkdv, attention_bwd_dq, soft_cap, soft_cap_grad};
    let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
    let fwd: Vec<ParamSpec> = [al; 6].into_iter().chain([al, no, no, no, no]).chain([al; 12]).collect();
    // Pointers, t h kv, scale, causal, strides (dK/dV: and its unused `dq_acc` and `sdq`).
    let bwd = |ptrs: usize| -> Vec<ParamSpec> { std::iter::repeat_n(al, ptrs).chain([al, no, no, no, no]).chain(std::iter::repeat_n(al, if ptrs == 10 { 7 } else { 6 })).collect() };
    // (name, kernel, specialization, warps, tensor-core instruction)
    type Case = (&'static str, Box<dyn Kernel>, Vec<ParamSpec>, u32, &'static str);
    let kernels: Vec<Case> = vec![
        ("fwd_softcap_bm128_d128", Box::new(attention::<bf16, soft_cap, AK, true, 128, 64, 128>::new()), fwd, 8, "HGMMA"),
        ("dkdv_softcap_d64", Box::new(attention_bwd_dkdv::<bf16, soft_cap, soft_cap_grad, AQ, true, false, 32, 64, 64>::new()), bwd(10), 4, "HGMMA"),
        ("dkdv_softcap_d128", Box::new(attention_bwd_dkdv::<bf16, soft_cap, soft_cap_grad, AQ, true, false, 32, 64, 128>::new()), bwd(10), 4, "HGMMA"),
        ("dq_softcap_d128", Box::new(attention_bwd_dq::<bf16, soft_cap, soft_cap_grad, AK, true, 64, 32, 128>::new()), bwd(9), 4, "HGMMA"),
    ];
    for (name, k, specs, warps, tensor) in kernels {
        let ptx = dsl_runtime::compile::stages_specialized(k.as_ref(), &specs, Target::SM90, &LaunchConfig::grid(1).warps(warps).stages(3)).unwrap().ptx;
        assert!(ptx.contains("tanh.approx.f32"), "{name}: the modification is not in the kernel");
        let code = sass(&ptx, "sm_90a", name);
        let loops = loop_bodies(&code);
        assert!(loops.iter().any(|l| l.contains(tensor)), "{name}: no loop of {tensor}");
        // As for the unmodified kernels: the innermost loops (over key or query tiles).
        for l in loops.iter().filter(|l| !loops.iter().any(|o| o != *l && l.contains(o.as_str()))) {
            assert!(!l.contains("STL") && !l.contains("LDL"), "{name}: local memory in an inner loop:\n{l}");
        }
    }
}

/// The forward with a bias from data (`ScoreBias`), as the default launch at the seed shape
/// compiles it: the bias's header (`T` and the strides) is loaded once, before the key loop
/// (`passes::hoist`'s loop-invariant loads), and the bias tile is loaded before the
/// product it is added to, so that its latency passes under the tensor cores' (measured
/// on the H100: BENCHMARKS.md, "Loop-invariant loads out of the key loop").
#[test]
fn a_bias_from_data_is_loaded_ahead_of_the_product_and_its_header_once() {
    use dsl_runtime::ir::ParamSpec;
    use kernels_lib::flash_attention::score_bias;
    let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
    let specs: Vec<ParamSpec> = [al; 6].into_iter().chain([al, no, no, no, no]).chain([al; 12]).collect();
    let k = attention::<bf16, score_bias, AK, true, 128, 64, 64>::new();
    // Without the register prefetch, which loads the next tile instead (the test below).
    let ir = dsl_runtime::compile::stages_specialized(&k, &specs, Target::SM90, &LaunchConfig::grid(1).warps(4).stages(3).prefetch(false)).unwrap().opt_ir;
    let (_, head, first_dot, body) = key_loop(&ir);
    let scalar_load = |l: &&str| l.contains(" = load ") && !l.split(" : ").nth(1).unwrap_or("").contains('[');
    assert!(!body.iter().any(scalar_load), "a scalar load in the key loop:\n{}", body.join("\n"));
    let bias = body.iter().position(|l| l.contains(" = load ") && l.contains(": f32[")).expect("the bias tile's load");
    assert!(head + bias < first_dot, "the bias is loaded after the product:\n{}", body.join("\n"));
}

/// The seed forward's key loop in the optimized IR `ir`: all lines, the loop's first line,
/// the first `dot`'s line and the loop's lines.
fn key_loop(ir: &str) -> (Vec<&str>, usize, usize, Vec<&str>) {
    let lines: Vec<&str> = ir.lines().collect();
    let first_dot = lines.iter().position(|l| l.contains(" = dot ")).expect("a dot");
    let head = lines[..first_dot].iter().rposition(|l| l.trim_start().starts_with("for (")).expect("the key loop");
    let indent = &lines[head][..lines[head].len() - lines[head].trim_start().len()];
    let end = head + lines[head..].iter().position(|l| *l == format!("{indent}}}")).expect("the loop's end");
    let body = lines[head..end].to_vec();
    (lines, head, first_dot, body)
}

/// The seed forward with a bias from data, launched as the library launches it
/// (`LaunchConfig::prefetch`, the default): the bias tile of the first key tile is loaded
/// before the key loop, and each iteration loads the next one after the current one's last
/// use, carried to the next iteration in the accumulator's layout (no conversion in the
/// loop: the layout pass decides the carried value before the body's walk), without
/// spills (ptxas). Measured on the H100: BENCHMARKS.md, "Register prefetch".
#[test]
fn a_bias_tile_is_prefetched_a_key_tile_ahead_in_the_accumulators_layout() {
    use dsl_runtime::ir::ParamSpec;
    use kernels_lib::flash_attention::score_bias;
    let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
    let specs: Vec<ParamSpec> = [al; 6].into_iter().chain([al, no, no, no, no]).chain([al; 12]).collect();
    let k = attention::<bf16, score_bias, AK, true, 128, 64, 64>::new();
    let art = dsl_runtime::compile::stages_specialized(&k, &specs, Target::SM90, &LaunchConfig::grid(1).warps(4).stages(3)).unwrap();
    let (lines, head, first_dot, body) = key_loop(&art.opt_ir);
    let tile = |l: &&str| l.contains(" = load ") && l.contains(": f32[128, 64]");
    assert!(lines[..head].iter().any(tile), "no bias tile loaded before the key loop:\n{}", art.opt_ir);
    let inside = body.iter().position(tile).expect("the next bias tile's load");
    assert!(head + inside > first_dot, "the bias is loaded before the product, not a tile ahead:\n{}", body.join("\n"));
    assert!(!body.iter().any(|l| l.contains("convert_layout") && l.contains("f32[128, 64]")), "the carried tile is converted in the loop:\n{}", body.join("\n"));
    let report = crate::codegen::assemble(&art.ptx, "sm_90a", "bias_prefetch");
    assert!(report.contains(" 0 bytes spill stores"), "spills:\n{report}");
}

/// `LaunchConfig::min_programs_per_sm(2)` compiles for two programs an SM: the backward's
/// 8-warp `dQ` tile with a bias from data (over 128 registers a thread without it, where
/// two programs of 256 threads no longer fit an SM's 65536) keeps within 128, without
/// spilling; the launch checks the count.
#[test]
fn min_programs_per_sm_keeps_the_dq_tile_within_two_programs_an_sm() {
    use dsl_runtime::ir::ParamSpec;
    use kernels_lib::flash_attention::{attention_bwd_dq, score_bias};
    let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
    let specs: Vec<ParamSpec> = std::iter::repeat_n(al, 9).chain([al, no, no, no, no]).chain([al; 6]).collect();
    let k = attention_bwd_dq::<bf16, score_bias, UG, AK, true, 128, 32, 64>::new();
    let cfg = LaunchConfig::grid(1).warps(8).stages(3).min_programs_per_sm(2);
    let ptx = dsl_runtime::compile::stages_specialized(&k, &specs, Target::SM90, &cfg).unwrap().ptx;
    assert!(ptx.contains(".minnctapersm 2"), "no launch bounds in the PTX");
    let report = crate::codegen::assemble(&ptx, "sm_90a", "dq_two_programs");
    let regs: usize = report.split("Used ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no register count:\n{report}"));
    assert!(regs <= 128, "{regs} registers a thread: two programs of 256 threads do not fit\n{report}");
    assert!(report.contains(" 0 bytes spill stores"), "spills:\n{report}");
    // None, more than an SM runs, more threads than an SM runs (9 x 256, or 4 x 384 with
    // the producer warpgroup of a warp-specialized launch).
    for bad in [LaunchConfig::grid(1).min_programs_per_sm(0), LaunchConfig::grid(1).min_programs_per_sm(33), LaunchConfig::grid(1).warps(8).min_programs_per_sm(9), LaunchConfig::grid(1).warps(8).warp_specialize(true).min_programs_per_sm(6)] {
        let e = bad.validate("k").unwrap_err().to_string();
        assert!(e.contains("min_programs_per_sm"), "{e}");
    }
    assert!(LaunchConfig::grid(1).warps(8).min_programs_per_sm(8).validate("k").is_ok());
}

/// With the loads pipelined (`Options { stages: 3 }`), every attention kernel's loop loads
/// through `cp.async` (the transposed key tile of the forward, and the query and
/// output-gradient tiles the key/value backward reads both ways, included: they are read
/// through transposed views of one buffer), with no local memory in an inner loop.
#[test]
fn pipelined_attention_kernels_copy_ahead_without_spills_in_loops() {
    use crate::codegen::{loop_bodies, sass};
    use dsl_runtime::ir::ParamSpec;
    use dsl_runtime::launch::Kernel;
    use kernels_lib::flash_attention::{attention_bwd_dkdv, attention_bwd_dq};
    let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
    let fwd: Vec<ParamSpec> = [al; 6].into_iter().chain([al, no, no, no, no]).chain([al; 12]).collect();
    // Pointers, t h kv, scale, causal, strides (dK/dV: and its unused `dq_acc` and `sdq`).
    let bwd = |ptrs: usize| -> Vec<ParamSpec> { std::iter::repeat_n(al, ptrs).chain([al, no, no, no, no]).chain(std::iter::repeat_n(al, if ptrs == 10 { 7 } else { 6 })).collect() };
    // (name, kernel, specialization, warps)
    type Case = (&'static str, Box<dyn Kernel>, Vec<ParamSpec>, u32);
    let kernels: Vec<Case> = vec![
        ("fwd_d64", Box::new(attention::<bf16, NS, AK, false, 64, 64, 64>::new()), fwd.clone(), 4),
        ("fwd_d128", Box::new(attention::<bf16, NS, AK, false, 64, 64, 128>::new()), fwd.clone(), 4),
        ("fwd_bm128_d64", Box::new(attention::<bf16, NS, AK, false, 128, 64, 64>::new()), fwd.clone(), 8),
        ("fwd_bm128_d128", Box::new(attention::<bf16, NS, AK, false, 128, 64, 128>::new()), fwd.clone(), 8),
        ("fwd_bm128_bn128_d64", Box::new(attention::<bf16, NS, AK, false, 128, 128, 64>::new()), fwd.clone(), 8),
        ("fwd_bm128_bn128_d128", Box::new(attention::<bf16, NS, AK, false, 128, 128, 128>::new()), fwd, 8),
        ("dkdv_d64", Box::new(attention_bwd_dkdv::<bf16, NS, UG, AQ, false, false, 32, 64, 64>::new()), bwd(10), 4),
        ("dkdv_d128", Box::new(attention_bwd_dkdv::<bf16, NS, UG, AQ, false, false, 32, 64, 128>::new()), bwd(10), 4),
        ("dq_d64", Box::new(attention_bwd_dq::<bf16, NS, UG, AK, false, 64, 32, 64>::new()), bwd(9), 4),
        ("dq_d128", Box::new(attention_bwd_dq::<bf16, NS, UG, AK, false, 64, 32, 128>::new()), bwd(9), 4),
    ];
    for (name, k, specs, warps) in kernels {
        // The backward without register prefetch, as the library launches it.
        let cfg = LaunchConfig::grid(1).warps(warps).stages(3).prefetch(name.starts_with("fwd"));
        let ptx = dsl_runtime::compile::stages_specialized(k.as_ref(), &specs, Target::SM90, &cfg).unwrap().ptx;
        assert!(ptx.contains("cp.async"), "{name}: nothing copied ahead");
        let code = sass(&ptx, "sm_90a", name);
        // The innermost loops (over key or query tiles): a reload of a spilled value once
        // per iteration of an outer loop (over a group's query heads) costs next to nothing.
        let loops = loop_bodies(&code);
        for l in loops.iter().filter(|l| !loops.iter().any(|o| o != *l && l.contains(o.as_str()))) {
            assert!(!l.contains("LDL") && !l.contains("STL"), "{name}: local memory in an inner loop:\n{l}");
            // The forward's key loop on wgmma: its tiles arrive by `cp.async`, which needs no
            // proxy fence, and the query tile's stores are fenced once, before the loop.
            if name.starts_with("fwd") && l.contains("HGMMA") {
                assert!(!l.contains("FENCE.VIEW.ASYNC") && !l.contains("MEMBAR"), "{name}: a proxy fence in the key loop:\n{l}");
            }
        }
        if name.starts_with("fwd") {
            assert!(loops.iter().any(|l| l.contains("HGMMA")), "{name}: no loop of wgmmas");
        }
    }
}

/// In f32 (tf32 products) every attention kernel assembles to tensor-core code, forward and
/// backward, at head dims 16 (the example's small shape) and 64.
#[test]
fn f32_attention_kernels_assemble_to_tf32_tensor_cores() {
    use crate::codegen::{assemble, sass};
    use dsl_runtime::ir::ParamSpec;
    use dsl_runtime::launch::Kernel;
    use kernels_lib::flash_attention::{attention_bwd_dkdv, attention_bwd_dq};
    let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
    let fwd: Vec<ParamSpec> = [al; 6].into_iter().chain([al, no, no, no, no]).chain([al; 12]).collect();
    // Pointers, t h kv, scale, causal, strides (dK/dV: and its unused `dq_acc` and `sdq`).
    let bwd = |ptrs: usize| -> Vec<ParamSpec> { std::iter::repeat_n(al, ptrs).chain([al, no, no, no, no]).chain(std::iter::repeat_n(al, if ptrs == 10 { 7 } else { 6 })).collect() };
    let kernels: Vec<(&str, Box<dyn Kernel>, Vec<ParamSpec>)> = vec![
        ("fwd_f32_d16", Box::new(attention::<f32, NS, AK, false, 64, 64, 16>::new()), fwd.clone()),
        ("fwd_f32_d64", Box::new(attention::<f32, NS, AK, false, 64, 64, 64>::new()), fwd),
        ("dkdv_f32_d16", Box::new(attention_bwd_dkdv::<f32, NS, UG, AQ, false, false, 32, 64, 16>::new()), bwd(10)),
        ("dkdv_f32_d64", Box::new(attention_bwd_dkdv::<f32, NS, UG, AQ, false, false, 32, 64, 64>::new()), bwd(10)),
        ("dq_f32_d16", Box::new(attention_bwd_dq::<f32, NS, UG, AK, false, 64, 32, 16>::new()), bwd(9)),
        ("dq_f32_d64", Box::new(attention_bwd_dq::<f32, NS, UG, AK, false, 64, 32, 64>::new()), bwd(9)),
    ];
    for (name, k, specs) in kernels {
        let ptx = dsl_runtime::compile::stages_specialized(k.as_ref(), &specs, Target::SM90, &LaunchConfig::grid(1).warps(4).stages(1)).unwrap().ptx;
        assemble(&ptx, "sm_90a", name);
        assert!(sass(&ptx, "sm_90a", name).contains("HMMA.1688.F32.TF32"), "{name}: no tf32 tensor cores");
    }
}

/// Warp specialization of the flash-attention forward on sm_90a: with two consumer
/// warpgroups (128 query rows on 8 warps) they take turns at `q k^T` (named barriers 2
/// and 3, a register operand: no barrier of all the consumers in the loop), and the query
/// tile stored before the loop is published there, once; one warpgroup (64 rows) takes no
/// turns; also compiled for three programs an SM (`Options::forward_programs`, its
/// consumers at 136 registers), and with 128-key tiles (the default without a mask where
/// 128-row tiles are few). Nothing spills.
#[test]
fn warp_specialized_attention_forward_assembles() {
    use crate::codegen::{assemble_to_sass, loop_bodies};
    use dsl_runtime::ir::ParamSpec;
    use dsl_runtime::launch::Kernel;
    let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
    let fwd: Vec<ParamSpec> = [al; 6].into_iter().chain([al, no, no, no, no]).chain([al; 12]).collect();
    let cases: Vec<(&str, Box<dyn Kernel>, u32, u32)> = vec![
        ("bm128_d128", Box::new(attention::<bf16, NS, AK, false, 128, 64, 128>::new()), 8, 1),
        ("bm64_d64", Box::new(attention::<bf16, NS, AK, false, 64, 64, 64>::new()), 4, 1),
        ("bm64_d64_3_programs", Box::new(attention::<bf16, NS, AK, false, 64, 64, 64>::new()), 4, 3),
        // The seed shape's default without a mask.
        ("bm64_bn128_d64", Box::new(attention::<bf16, NS, AK, false, 64, 128, 64>::new()), 4, 1),
        ("bm128_w4_d64", Box::new(attention::<bf16, NS, AK, false, 128, 64, 64>::new()), 4, 1),
    ];
    for (name, k, warps, programs) in cases {
        let cfg = LaunchConfig::grid(1).warps(warps).stages(2).warp_specialize(true).min_programs_per_sm(programs);
        let art = dsl_runtime::compile::stages_specialized(k.as_ref(), &fwd, Target::SM90, &cfg).unwrap();
        assert_eq!(art.opt_ir.contains("turn_begin"), warps == 8, "{name}:\n{}", art.opt_ir);
        let (report, sass) = assemble_to_sass(&art.ptx, "sm_90a", &format!("attention_ws_{name}"));
        assert!(report.contains("0 bytes spill stores"), "{name}: {report}");
        // The consumers' registers (`lower::tma::register_split`): 136 for three programs
        // of one consumer warpgroup, 232 for two.
        let consumer_regs = if programs == 3 { 136 } else if warps == 4 { 232 } else { 240 };
        assert!(sass.lines().any(|l| l.contains("USETMAXREG.TRY_ALLOC.CTAPOOL") && l.trim_end().ends_with(&format!(", {consumer_regs:#x} ;"))), "{name}: setmaxnreg to {consumer_regs}");
        let loops = loop_bodies(&sass);
        let consumer = loops.iter().find(|l| l.contains("HGMMA")).unwrap_or_else(|| panic!("{name}: no wgmma loop"));
        assert!(!consumer.contains("UTMALDG") && consumer.contains("SYNCS.ARRIVE"), "{name}:\n{consumer}");
        // A barrier with a constant id in the loop would hold both warpgroups together.
        assert!(!consumer.lines().any(|l| l.contains("BAR.SYNC") && !l.contains("BAR.SYNC.DEFER_BLOCKING R")), "{name}: a barrier of all the consumers in the loop:\n{consumer}");
        assert_eq!(consumer.contains("BAR.ARV"), warps == 8, "{name}:\n{consumer}");
        // The row max combines a thread's 16 or 32 scores of a row as a tree (4 or 5
        // levels), not as a chain of dependent `FMNMX` (15 or 31).
        let depth = crate::codegen::longest_chain(consumer, "FMNMX");
        assert!((3..=8).contains(&depth), "{name}: a chain of {depth} dependent FMNMX:\n{consumer}");
    }
}

/// `attention_overlapped` (FlashAttention-3's order), warp-specialized on two consumer
/// warpgroups: in its loop both products are issued in one turn (the `bar.arrive` after
/// the second), the probabilities feed the second from registers although the loop
/// carries them (`HGMMA .., R..`), the lowering waits for the first alone
/// (`wgmma.wait_group 1`) and places the softmax (its exponentials) before the wait for
/// the second. (ptxas then waits for the second at the softmax's top anyway:
/// `attention_overlapped`'s docs.)
#[test]
fn overlapped_attention_issues_both_products_and_waits_for_the_first() {
    use crate::codegen::{assemble_to_sass, loop_bodies};
    use dsl_runtime::ir::ParamSpec;
    use kernels_lib::flash_attention::attention_overlapped;
    let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
    let fwd: Vec<ParamSpec> = [al; 6].into_iter().chain([al, no, no, no, no]).chain([al; 12]).collect();
    let k = attention_overlapped::<bf16, NS, AK, false, 128, 64, 128>::new();
    let art = dsl_runtime::compile::stages_specialized(&k, &fwd, Target::SM90, &LaunchConfig::grid(1).warps(8).stages(2).warp_specialize(true)).unwrap();
    let ptx = &art.ptx;
    assert!(ptx.contains("wgmma.wait_group.sync.aligned 1;"), "no wait for the first product alone:\n{ptx}");
    // The wait before a stage goes back to the producer (the second product read it)
    // ends the basic block that computes the softmax.
    let arrive = ptx.find("mbarrier.arrive.shared::cta.b64").expect("a stage given back");
    let zero = ptx[..arrive].rfind("wgmma.wait_group.sync.aligned 0;").expect("a wait for the second product");
    let block = ptx[..zero].rfind("$L__").expect("a block label");
    assert!(ptx[block..zero].contains("ex2.approx"), "the softmax is not placed while the second product is in flight:\n{}", &ptx[block..zero]);
    let (report, sass) = assemble_to_sass(ptx, "sm_90a", "attention_overlapped_ws");
    assert!(report.contains("0 bytes spill stores"), "{report}");
    let loops = loop_bodies(&sass);
    let consumer = loops.iter().find(|l| l.contains("HGMMA") && !l.contains("UTMALDG")).expect("a consumer loop");
    let hgmma: Vec<&str> = consumer.lines().filter(|l| l.contains("HGMMA.64x")).collect();
    let from_registers = hgmma.iter().filter(|l| l.split(',').nth(1).is_some_and(|a| a.trim().starts_with('R'))).count();
    // K steps of 16: the scores over D = 128 from shared memory, the second product over
    // the 64 keys from registers.
    assert_eq!((hgmma.len() - from_registers, from_registers), (8, 4), "{consumer}");
    let lines: Vec<&str> = consumer.lines().collect();
    let last = lines.iter().rposition(|l| l.contains("HGMMA.64x")).unwrap();
    let arrive = lines.iter().position(|l| l.contains("BAR.ARV")).expect("a turn");
    assert!(arrive > last, "the turn ends before the second product is issued:\n{consumer}");
    assert!(consumer.contains("WARPGROUP.DEPBAR.LE gsb0, 0x1"), "{consumer}");
}

/// A score modification given at run time is not autotuned (the tuner's candidates are
/// compiled without the hook): a hooked call with `Options::tune` is a clear error, not a
/// kernel that fails to build; and a hook whose result is not of the score's type is a
/// build error that says so.
#[test]
fn hooked_calls_refuse_tuning_and_hooks_of_the_wrong_type() {
    use dsl_runtime::ir::Operand;
    let rt = Runtime::interpreter();
    let c = Shape { batch: 1, seq: 8, heads: 1, kv_heads: 1, head_dim: 16, causal: false, layout: Layout::Bhtd };
    let n = c.seq * c.head_dim;
    let x = rt.upload(&random_bf16(n, seed())).unwrap();
    let (mut o, mut lse, args) = (rt.zeros::<bf16>(n).unwrap(), rt.zeros::<f32>(c.seq).unwrap(), rt.upload(&[0.0f32]).unwrap());
    let identity = ScoreHook::new(|_, x, _| Ok(x[0]));
    let e = attention_forward_hooked::<_, Hooked>(&rt, &c, &x, &x, &x, &mut o, &mut lse, 0.25, &args, &identity, Options { tune: true, ..Options::default() }).unwrap_err().to_string();
    assert!(e.contains("not autotuned"), "{e}");
    let literal = ScoreHook::new(|_, _, _| Ok(Operand::Float(1.0)));
    let e = attention_forward_hooked::<_, Hooked>(&rt, &c, &x, &x, &x, &mut o, &mut lse, 0.25, &args, &literal, Options::default()).unwrap_err().to_string();
    assert!(e.contains("the hook returned"), "{e}");
    attention_forward_hooked::<_, Hooked>(&rt, &c, &x, &x, &x, &mut o, &mut lse, 0.25, &args, &identity, Options::default()).unwrap();
}

/// The atomic backward's GPU code on sm_90a, as launched (3 stages, both key tiles): all
/// five products on `wgmma` (the key tile, read by two of them, read next to each:
/// `stage::sink_for_wgmma`), its loop pipelined with TMA copies although it adds into
/// memory (the buffer it adds into is one no load of the loop reads), and the `dQ` shares
/// added by TMA reductions (`cp.reduce.async.bulk.tensor`, SASS `UTMAREDG`, the launch's
/// `tma_store`); without `tma_store`, by vector reductions (`red.global.add.v4.f32`), no
/// value read back either way.
#[test]
fn atomic_flash_attention_backward_assembles_to_wgmma_and_vector_reductions() {
    use crate::codegen::{assemble_to_sass, loop_bodies};
    use dsl_runtime::ir::ParamSpec;
    use dsl_runtime::launch::Kernel;
    use kernels_lib::flash_attention::attention_bwd_dkdv;
    let (al, no) = (ParamSpec { div16: true, eq_one: false }, ParamSpec::default());
    let specs: Vec<ParamSpec> = std::iter::repeat_n(al, 10).chain([al, no, no, no, no]).chain([al; 7]).collect();
    let kernels: [(&str, Box<dyn Kernel>, u32); 2] = [
        ("atomic_bn64", Box::new(attention_bwd_dkdv::<bf16, NS, UG, AQ, false, true, 64, 64, 64>::new()), 4),
        ("atomic_bn128", Box::new(attention_bwd_dkdv::<bf16, NS, UG, AQ, false, true, 64, 128, 64>::new()), 8),
    ];
    // (A specialization of the wrong length is an error, not a panic.)
    let short = dsl_runtime::compile::stages_specialized(kernels[0].1.as_ref(), &specs[1..], Target::SM90, &LaunchConfig::grid(1));
    assert!(matches!(&short, Err(dsl_runtime::Error::Launch { message, .. }) if message.contains("21 parameter specializations for 22")), "{:?}", short.err());
    for (name, k, warps) in kernels {
        for by_tma in [true, false] {
            let cfg = LaunchConfig::grid(1).warps(warps).stages(3).tma_store(by_tma);
            let art = dsl_runtime::compile::stages_specialized(k.as_ref(), &specs, Target::SM90, &cfg).unwrap();
            assert_eq!(art.opt_ir.matches("wgmma.m64").count(), 5, "{name}: every product on wgmma:\n{}", art.opt_ir);
            assert_eq!(art.opt_ir.contains("tma_reduce_add"), by_tma, "{name}:\n{}", art.opt_ir);
            let (report, code) = assemble_to_sass(&art.ptx, "sm_90a", name);
            // (The vector reductions' conversion through registers spills a few values.)
            assert!(!by_tma || report.contains("0 bytes spill stores"), "{name}: {report}");
            let lp = loop_bodies(&code).into_iter().filter(|l| l.contains("HGMMA")).min_by_key(|l| l.len()).unwrap_or_else(|| panic!("{name}: no wgmma loop"));
            assert!(lp.contains("UTMALDG"), "{name}: the query loop's tiles are not copied ahead by TMA:\n{lp}");
            assert!(!lp.contains("ATOMG"), "{name}: an atomic reads dQ back:\n{lp}");
            if by_tma {
                assert!(lp.contains("UTMAREDG") && !lp.contains("REDG.E"), "{name}: dQ not added by TMA:\n{lp}");
            } else {
                assert!(lp.contains("REDG.E.ADD.F32x4"), "{name}: dQ not added by vector reductions:\n{lp}");
            }
        }
    }
}
