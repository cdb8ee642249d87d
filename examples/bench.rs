//! Benchmarks of the kernel library, printed as JSON lines (one object per result).
//!
//! ```text
//! bench suite [N]            every workload of `examples::workloads` at N (default 2^26)
//!                            elements, relu-mul-add without bounds guards among them:
//!                            checked, then timed
//! bench smoke [N]            the same workloads on the CPU interpreter, checked, not timed
//! bench spec                 no GPU: the bound every check uses and the configurations the
//!                            row benchmarks sweep, for `bench/anchors.py` (so both sides
//!                            check against the same bounds and sweep the same spaces)
//! bench coldstart            first launch: runtime creation, then compile + load + run
//!                            of relu-mul-add, then of a 1024^3 bf16 matmul, then the
//!                            fuser's seed as a graph (build, compile, run)
//!                            (point RUTILE_CACHE_DIR at an empty directory for a cold
//!                            cache, at the same directory again for a warm one)
//! bench launch               host time per launch of a cached tiny kernel, no syncs; and
//!                            per run of a graph plan, `run` and `run_graph` (CUDA graph)
//! bench tune                 relu-mul-add and a whole-array sum, 2^12..2^28 elements: the
//!                            autotuner's choice per size against the default configuration
//!                            (BLOCK=1024, 4 warps), and the time a sweep takes
//! bench rows                 softmax f32/bf16 and RMSNorm bf16 on 4096 x 4096, softmax f32
//!                            on 32768 x 128, transpose f32 8192 x 8192: every configuration
//!                            the autotuner would consider, checked, then timed; the
//!                            autotuned softmax and RMSNorm launches; and the same softmax
//!                            and RMSNorm written as graphs (`graph_*`: the fuser's kernels)
//! bench attention            `attention_forward` (flash attention, bf16, GQA, [B, H, T, D])
//!                            on the seed's shape (4 x 1024, 8 heads over 4, head dim 64)
//!                            and a long GQA layer (2 x 4096, 32 heads over 8, head dim
//!                            128), full and causal: sampled rows checked against f64, then
//!                            timed (TFLOP/s counts 4 B H T^2 D, halved when causal), by
//!                            events and by device time (`graph_ms`, `graph_timed`); then
//!                            the Llama rows (B1, 32 heads over 8, head dim 128, causal,
//!                            T 4096 and 8192). `BENCH_ATTENTION_ROWS=tuned` (the tuned
//!                            rows only), `=short`, `BENCH_ATTENTION_ONLY`: see
//!                            `ATTENTION_WS_OPTIONS`; `BENCH_ATTENTION_SEED_ONLY=1`: the
//!                            seed shape alone (no long layer, no Llama rows),
//!                            `BENCH_ATTENTION_LLAMA_ONLY=1` the Llama rows alone
//! bench matmul               `matmul_tuned` (bf16 and f16 in, and f32 at tf32 up to 4096
//!                            per dimension; f32 out, and 16-bit out on the large
//!                            16-bit squares) on the shapes of
//!                            `MATMUL_SHAPES` (square 512..8192, ragged, small M): the
//!                            tuning sweep's time, then the tuned launch, checked on sampled
//!                            elements and timed; TFLOP/s. `BENCH_MATMUL=4096x4096x4096`
//!                            (comma-separated `MxNxK`, optionally `:bf16`) runs only
//!                            those shapes (and dtypes), e.g. under a profiler; where
//!                            `split_k_splits` cuts K (small M), `matmul_split_k` at every
//!                            slice count `split_k_fits` allows (`ours-split-k` is the
//!                            planner's pick)
//! ```
//!
//! **Checks.** Every output that is timed is first produced once into a NaN-poisoned
//! buffer and compared, every element, with a float64 reference: elementwise and in
//! relative L2, against the bound its arithmetic allows (`examples::workloads`, module
//! documentation). The `_unchecked` launches (no bounds guard) are checked the same way.
//!
//! **Timing.** A time is the median of CUDA-event timings of 100 launches (50 for the
//! transpose and the tuning rows) after 10 warm-ups, with the L2 cache flushed before each
//! launch (`autotune::CudaTimer`, as Triton's `do_bench` times the anchors). Each row
//! repeats that `BENCH_REPEATS` times (default 5) in the same process and reports the
//! median of the repeats as `ms`, their range as `ms_min`/`ms_max`, and all of them as
//! `runs`; `bench/report.py` calls two implementations level when their ranges overlap.
//!
//! `bench/run_gpu.sh` runs all of them next to the Triton/PyTorch anchors, each step on
//! fresh compile and tuning caches.

use autotune::CudaTimer;
use dsl_runtime::driver::CudaRuntime;
use dsl_runtime::prelude::*;
use examples::workloads::{self, check_relative, Check, ErrorStats};
use kernels_lib::{grid_for, relu_mul_add};
use std::fmt::Write as _;
use std::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let r = match mode.as_str() {
        "suite" => suite(),
        "smoke" => smoke(),
        "spec" => spec(),
        "coldstart" => coldstart(),
        "launch" => launch(),
        "rows" => rows(),
        "tune" => tune(),
        "matmul" => matmul(),
        "attention" => attention(),
        "score_mod" => score_mod(),
        "linear" => linear(),
        _ => Err("usage: bench suite|smoke|spec|coldstart|launch|rows|tune|matmul|linear|attention|score_mod".into()),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    let failed = FAILED_CHECKS.load(std::sync::atomic::Ordering::Relaxed);
    if failed > 0 {
        eprintln!("error: {failed} check(s) failed (the `check_failed` rows); their rows were not timed");
        std::process::exit(1);
    }
}

/// Checks that failed in this process: each printed as a `check_failed` row instead of a
/// timed one, so one failure does not hide the rest of the run; the process then exits
/// with an error.
static FAILED_CHECKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn check_failed(bench: &str, dtype: &str, config: Option<&str>, message: &str) {
    FAILED_CHECKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let config = config.map(|c| format!(",\"config\":\"{c}\"")).unwrap_or_default();
    let message = message.replace('\\', "\\\\").replace('"', "\\\"");
    println!("{{\"bench\":\"{bench}\",\"impl\":\"ours\",\"dtype\":\"{dtype}\"{config},\"check_failed\":\"{message}\"}}");
    eprintln!("check failed: {bench} {dtype}: {message}");
}

fn cuda() -> Res<CudaRuntime> {
    Ok(CudaRuntime::new(0)?)
}

/// The timer of every mode: CUDA events around each launch, 10 warm-ups, the median of
/// `reps`, the L2 cache flushed before each timed launch. This is the autotuner's timer,
/// and the same measurement as Triton's `do_bench`, which times the anchors.
fn timer(rt: &CudaRuntime, reps: usize) -> CudaTimer<'_> {
    CudaTimer::new(rt, 10, reps)
}

/// How many times each row is timed in one process (`BENCH_REPEATS`, default 5).
fn repeats() -> usize {
    std::env::var("BENCH_REPEATS").ok().and_then(|v| v.parse().ok()).unwrap_or(5).max(1)
}

/// The repeated timings of one row, in ms.
struct Timing {
    runs: Vec<f64>,
}

impl Timing {
    fn median(&self) -> f64 {
        let mut v = self.runs.clone();
        v.sort_by(f64::total_cmp);
        let k = v.len();
        if k % 2 == 1 { v[k / 2] } else { (v[k / 2 - 1] + v[k / 2]) / 2.0 }
    }
    fn min(&self) -> f64 {
        self.runs.iter().cloned().fold(f64::INFINITY, f64::min)
    }
    fn max(&self) -> f64 {
        self.runs.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
    }
    /// `"ms":..,"ms_min":..,"ms_max":..,"runs":[..]` with the given key prefix.
    fn json(&self, prefix: &str) -> String {
        let runs: Vec<String> = self.runs.iter().map(|r| format!("{r:.5}")).collect();
        format!(
            "\"{prefix}ms\":{:.5},\"{prefix}ms_min\":{:.5},\"{prefix}ms_max\":{:.5},\"{prefix}runs\":[{}]",
            self.median(),
            self.min(),
            self.max(),
            runs.join(",")
        )
    }
}

/// Time `f` [`repeats`] times, each the median of the timer's launches.
fn timed(t: &CudaTimer, mut f: impl FnMut() -> dsl_runtime::Result<()>) -> Res<Timing> {
    let mut runs = vec![];
    for _ in 0..repeats() {
        runs.push(t.median_ms(&mut || Ok(()), &mut f)?);
    }
    Ok(Timing { runs })
}

/// Writes zeros over `n` i32s: the L2 flush [`graph_timed`] records (a kernel, which a
/// capture takes; a memset on the runtime's stream it would not).
#[kernel]
fn flush_l2<const BLOCK: usize>(out: Ptr<i32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    store(out + offs, offs * 0, offs < n);
}

/// The device time of `f` alone, measured as the anchors' `timed_graph` measures theirs
/// (`triton.testing.do_bench_cudagraph`): 20 pairs (flush L2, `f`) recorded in one CUDA
/// graph and replayed between events (median of 10), less 20 flushes alone recorded the same
/// way, per call; [`repeats`] times. No launch gap and no host time counts, on either side.
fn graph_timed(rt: &Runtime, mut f: impl FnMut() -> dsl_runtime::Result<()>) -> Res<Timing> {
    use dsl_runtime::cudarc::driver::sys::CUevent_flags;
    use dsl_runtime::driver::CapturedGraph;
    const CALLS: usize = 20;
    let Runtime::Cuda(c) = rt else { return Err("graph_timed needs the GPU".into()) };
    let n = autotune::L2Flush::BYTES / 4;
    let mut buf = rt.zeros::<i32>(n)?;
    let cfg = grid_for(n, 1024);
    flush_l2::<1024>::launch(rt, cfg, &mut buf, n as i32)?;
    f()?;
    let both = c.capture(|| (0..CALLS).try_for_each(|_| flush_l2::<1024>::launch(rt, cfg, &mut buf, n as i32).and_then(|_| f())))?;
    let flushes = c.capture(|| (0..CALLS).try_for_each(|_| flush_l2::<1024>::launch(rt, cfg, &mut buf, n as i32)))?;
    let per_call = |g: &CapturedGraph| -> Res<f64> {
        let s = c.stream();
        // SAFETY: the buffers the recorded launches use (`buf`, and `f`'s, borrowed by `f`)
        // outlive this function's graphs.
        unsafe { g.replay()? };
        let mut t = vec![];
        for _ in 0..10 {
            let a = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            unsafe { g.replay()? };
            let b = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            b.synchronize()?;
            t.push(a.elapsed_ms(&b)? as f64 / CALLS as f64);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[t.len() / 2])
    };
    let mut runs = vec![];
    for _ in 0..repeats() {
        runs.push(per_call(&both)? - per_call(&flushes)?);
    }
    Ok(Timing { runs })
}

/// One result row of ours as a JSON line.
fn row_json(bench: &str, dtype: &str, config: Option<&str>, n: Option<usize>, bytes: usize, tm: &Timing, check: &Check) -> String {
    let mut s = format!("{{\"bench\":\"{bench}\",\"impl\":\"ours\",\"dtype\":\"{dtype}\"");
    if let Some(c) = config {
        write!(s, ",\"config\":\"{c}\"").unwrap();
    }
    if let Some(n) = n {
        write!(s, ",\"n\":{n}").unwrap();
    }
    write!(
        s,
        ",\"bytes\":{bytes},{},\"gbs\":{:.1},\"rel_err\":{:e},\"max_rel\":{:e},\"bound\":{:e}}}",
        tm.json(""),
        bytes as f64 / tm.median() / 1e6,
        check.rel_l2,
        check.max_rel,
        check.bound
    )
    .unwrap();
    s
}

fn size_arg(default: usize) -> Res<usize> {
    Ok(std::env::args().nth(2).map(|s| s.parse()).transpose()?.unwrap_or(default))
}

fn suite() -> Res<()> {
    let rt = Runtime::Cuda(cuda()?);
    let Runtime::Cuda(c) = &rt else { unreachable!() };
    let n = size_arg(1 << 26)?;
    let t = timer(c, 100);
    let seed = examples::seed()?;
    for mut w in workloads::suite(&rt, n, seed)? {
        let check = w.check(&rt)?;
        if !check.passed() {
            check_failed(w.name, w.dtype, None, &format!("{check} (seed {seed})"));
            continue;
        }
        let tm = timed(&t, || w.launch(&rt))?;
        println!("{}", row_json(w.name, w.dtype, None, Some(n), w.bytes, &tm, &check));
    }
    Ok(())
}

fn smoke() -> Res<()> {
    let rt = Runtime::interpreter();
    let n = size_arg(5000)?;
    for mut w in workloads::suite(&rt, n, 42)? {
        let c = w.check(&rt)?;
        println!(
            "{{\"bench\":\"{}\",\"impl\":\"ours-interpreter\",\"dtype\":\"{}\",\"n\":{n},\"rel_err\":{:e},\"max_rel\":{:e},\"bound\":{:e},\"ok\":{}}}",
            w.name,
            w.dtype,
            c.rel_l2,
            c.max_rel,
            c.bound,
            c.passed()
        );
        if !c.passed() {
            return Err(format!("{} {}: {c}", w.name, w.dtype).into());
        }
    }
    Ok(())
}

// The row benchmarks' shapes (rows, columns), shared with the anchors through `bench spec`.
const SOFTMAX: (usize, usize) = (4096, 4096);
const SOFTMAX_SHORT: (usize, usize) = (32768, 128);
const RMSNORM: (usize, usize) = (4096, 4096);
const TRANSPOSE: usize = 8192;
/// The matmul shapes (m, n, k), on both sides: square, ragged (no dimension a multiple of
/// a tile), and small M (decode-like).
const MATMUL_SHAPES: [(usize, usize, usize); 8] =
    [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (1000, 777, 300), (3001, 2999, 1537), (16, 4096, 4096)];
/// Transpose tiles and warps, on both sides.
const TRANSPOSE_CONFIGS: [(usize, u32); 3] = [(32, 4), (64, 4), (64, 8)];

/// The configurations the bf16 softmax rows sweep (`softmax::<bf16, 1, _>`, one row per
/// program, as the separate bf16 kernel these rows measured before `softmax` was made
/// generic over its element type): the one-row candidates of the row kernels' space.
fn one_row_sweep(rows: usize, cols: usize) -> Vec<autotune::Config> {
    workloads::row_sweep(rows, cols).into_iter().filter(|c| c.get("ROWS") == 1).collect()
}

fn cfg_str(c: &autotune::Config) -> String {
    let mut s = String::new();
    for k in ["ROWS", "BLOCK", "TILE", "BM", "BN", "BK"] {
        if c.consts.contains_key(k) {
            write!(s, "{k}={} ", c.get(k)).unwrap();
        }
    }
    if c.consts.contains_key("BK") {
        write!(s, "stages={} ", c.num_stages).unwrap();
    }
    format!("{s}warps={}", c.num_warps)
}

fn cfg_json(c: &autotune::Config) -> String {
    let mut s = String::from("{");
    for (k, v) in &c.consts {
        write!(s, "\"{k}\":{v},").unwrap();
    }
    format!("{s}\"warps\":{}}}", c.num_warps)
}

/// What the anchors need to do the same work as ours: the bounds of every check and the
/// row benchmarks' shapes and configurations. Needs no GPU.
/// Flash-attention shapes (batch, seq, heads, kv_heads, head_dim), each full and causal,
/// bf16, `[B, H, T, D]`: the seed's block and a long-sequence GQA layer.
const ATTENTION_SHAPES: [(usize, usize, usize, usize, usize); 2] = [(4, 1024, 8, 4, 64), (2, 4096, 32, 8, 128)];

/// Issue 14's Llama rows, (B, T, H, KV, D), causal, forward only: the autotuned forward,
/// the untuned default and the warp-specialized 128 x 128 tile, against SDPA (`anchors.py`
/// reads them from `bench spec`, `"spec":"attention_llama"`).
const ATTENTION_LLAMA_SHAPES: [(usize, usize, usize, usize, usize); 2] = [(1, 4096, 32, 8, 128), (1, 8192, 32, 8, 128)];

/// The bound of an attention output element relative to `sum_j p_j |v_j|`: probabilities
/// rounded to bf16 before `p v` (2^-8 each), the output rounded to bf16 (2^-8), the f32
/// sums and the online rescaling well below them.
const ATTENTION_BOUND: f64 = 1.0 / 64.0;

/// The bound of a gradient element relative to the size of the terms it adds up (the
/// interpreter test's): `P` and `dS` rounded to bf16 for their products, the gradient
/// rounded to bf16, `delta` from the bf16 output.
const ATTENTION_BWD_BOUND: f64 = 3.5 / 256.0;

/// Pipelining depths and forward query tiles the attention rows are measured at
/// (`Options`; the backward does not depend on the forward's tile, so it is timed at 64).
/// (stages, query tile, key tile, wgmma): `wgmma: false` is the `mma.sync` baseline of the
/// same run.
const ATTENTION_OPTIONS: [(u32, usize, usize, bool); 12] = [
    (1, 64, 64, true),
    (2, 64, 64, true),
    (3, 64, 64, true),
    (3, 64, 64, false),
    (2, 128, 64, true),
    (3, 128, 64, true),
    (3, 128, 64, false),
    (2, 128, 128, true),
    (2, 64, 128, true),
    (3, 64, 128, true),
    // 128 query rows on 4 warps (32 a warp): ATTENTION_FOUR_WARPS.
    (3, 128, 64, true),
    (3, 128, 64, false),
];

/// The backward's tiles, (`dK`/`dV` (queries, keys), `dQ` (queries, keys)): those built at
/// every head dimension first, then the others, each measured at the head dims that build
/// it (`BUILT_BACKWARD_TILES`; `Options::backward_dkdv`, `backward_dq`).
const BACKWARD_TILES: [((usize, usize), (usize, usize)); 9] =
    [((32, 64), (64, 32)), ((64, 128), (128, 64)), ((32, 128), (128, 32)), ((64, 128), (64, 64)), ((64, 128), (64, 32)), ((32, 64), (64, 64)), ((64, 64), (128, 32)), ((64, 64), (64, 64)), ((64, 64), (128, 64))];

/// Forward tiles measured warp-specialized too (`Options::warp_specialize`), after
/// [`ATTENTION_OPTIONS`], against their entries there: (stages, query tile, key tile,
/// `Options::overlap`, `Options::forward_programs`), on `wgmma`, a warp per 16 query rows
/// (and the producer warpgroup); the 64-row tile also compiled for three programs an SM
/// (its register split's default is two).
/// `BENCH_ATTENTION_ROWS=short` runs these, the 128-row tiles on 4 warps and the 64 x 64
/// tile at 3 stages (the causal default where 128-row tiles are few before the
/// warp-specialized one) alone (no backward, no tuned row); `BENCH_ATTENTION_ROWS=tuned` the tuned forward and, from the
/// 64 x 64 tile at 3 stages, the backward at its default tiles, tuned and atomic
/// (`attention_backward_atomic`, both key tiles; and the Llama rows); `BENCH_ATTENTION_ONLY`
/// the rows it names.
const ATTENTION_WS_OPTIONS: [(u32, usize, usize, bool, Option<u32>); 10] = [
    (2, 64, 128, false, None),
    (2, 128, 64, false, None),
    (3, 128, 64, false, None),
    (2, 128, 128, false, None),
    (2, 64, 64, false, None),
    (3, 64, 64, false, None),
    (2, 64, 64, false, Some(3)),
    (3, 64, 64, false, Some(3)),
    (2, 128, 64, true, None),
    (2, 128, 128, true, None),
];

/// The entries of [`ATTENTION_OPTIONS`] from this index on run 128-row tiles on 4 warps.
const ATTENTION_FOUR_WARPS: usize = 10;

/// `attention_forward_with` and `attention_backward_with` (bf16, GQA, `[B, H, T, D]`) on
/// [`ATTENTION_SHAPES`], full and causal, at each of [`ATTENTION_OPTIONS`]: 64 sampled query
/// rows (and the last) of every output, and 64 sampled query rows and key rows of the
/// gradients, checked against f64 on the host, then timed (the backward: its two
/// launches, `dQ` (with the row sums `delta`), then `dK`/`dV`).
fn attention() -> Res<()> {
    use half::bf16;
    use kernels_lib::flash_attention::{attention_backward_atomic, attention_backward_with, Grads, Layout, Options, Shape};
    let rt = Runtime::Cuda(cuda()?);
    let Runtime::Cuda(c) = &rt else { unreachable!() };
    let t = timer(c, 20);
    let s0 = examples::seed()?;
    // Uniform in [-1, 1), in bf16.
    let inputs = |n: usize, s: u64| -> Vec<bf16> { workloads::randoms(n, s).into_iter().map(|x| bf16::from_f32(x / 4.0)).collect() };
    // `BENCH_ATTENTION_SEED_ONLY=1`: the seed shape's rows alone (as `anchors.py`'s).
    // `BENCH_ATTENTION_LLAMA_ONLY=1`: the Llama rows alone (as `anchors.py`'s).
    let seed_only = std::env::var("BENCH_ATTENTION_SEED_ONLY").is_ok_and(|v| v == "1");
    let llama_only = std::env::var("BENCH_ATTENTION_LLAMA_ONLY").is_ok_and(|v| v == "1");
    for (b, tt, h, kv, d) in ATTENTION_SHAPES.into_iter().take(if seed_only { 1 } else if llama_only { 0 } else { ATTENTION_SHAPES.len() }) {
        let (nq, nk) = (b * h * tt * d, b * kv * tt * d);
        let (q, k, v, g) = (inputs(nq, s0), inputs(nk, s0 + 1), inputs(nk, s0 + 2), inputs(nq, s0 + 3));
        let (dq_in, dk_in, dv_in, dgo) = (rt.upload(&q)?, rt.upload(&k)?, rt.upload(&v)?, rt.upload(&g)?);
        let (mut o, mut lse) = (rt.zeros::<bf16>(nq)?, rt.zeros::<f32>(b * h * tt)?);
        let (mut gq, mut gk, mut gv, mut delta) = (rt.zeros::<bf16>(nq)?, rt.zeros::<bf16>(nk)?, rt.zeros::<bf16>(nk)?, rt.zeros::<f32>(b * h * tt)?);
        // The atomic backward's `dQ` scratch (f32), NaN-poisoned: its delta kernel zeroes it.
        let dq_acc = std::cell::RefCell::new(rt.upload(&vec![f32::NAN; nq])?);
        let scale = 1.0 / (d as f32).sqrt();
        let f = |x: bf16| x.to_f64();
        for causal in [false, true] {
            let s = Shape { batch: b, seq: tt, heads: h, kv_heads: kv, head_dim: d, causal, layout: Layout::Bhtd };
            let case = format!("b={b} t={tt} h={h} kv={kv} d={d} causal={causal}");
            // The library's untuned launch for this case (`Options::default()`): which of the
            // rows below is the default (`bench/attention_report.py` reads it).
            let plan = Options::default().forward_plan(&rt, DType::BF16, &s, false);
            let (dkdv, dq) = Options::default().backward_tiles(&rt, DType::BF16, &s);
            println!(
                "{{\"bench\":\"attention_plan\",\"b\":{b},\"t\":{tt},\"h\":{h},\"kv\":{kv},\"d\":{d},\"causal\":{causal},\"stages\":{},\"block_m\":{},\"block_n\":{},\"warps\":{},\"ws\":{},\"programs\":{},\"dkdv\":[{},{}],\"dq\":[{},{}]}}",
                plan.stages, plan.block_m, plan.block_n, plan.warps, plan.warp_specialize, plan.programs, dkdv.0, dkdv.1, dq.0, dq.1
            );
            let flops = 4.0 * (b * h * tt * tt * d) as f64 * if causal { 0.5 } else { 1.0 };
            // Last, the autotuned forward (`Options::tune`): its first call (the check's)
            // tunes, the timed calls launch the winner.
            let specialized = ATTENTION_WS_OPTIONS.into_iter().map(|(st, bm, bn, ..)| Some((st, bm, bn, true)));
            let rows_mode = std::env::var("BENCH_ATTENTION_ROWS").unwrap_or_default();
            let (short, tuned_only) = (rows_mode == "short", rows_mode == "tuned");
            for (i, entry) in ATTENTION_OPTIONS.into_iter().map(Some).chain([None]).chain(specialized).enumerate() {
                let ws = i > ATTENTION_OPTIONS.len();
                if short && !ws && !(ATTENTION_FOUR_WARPS..ATTENTION_OPTIONS.len()).contains(&i) && entry != Some((3, 64, 64, true)) {
                    continue;
                }
                if tuned_only && (ws || !(entry.is_none() || entry == Some((3, 64, 64, true)))) {
                    continue;
                }
                // (Three programs an SM only at head dim 64: at 128 the tile's shared memory
                // leaves room for two.)
                if ws && ATTENTION_WS_OPTIONS[i - ATTENTION_OPTIONS.len() - 1].4.is_some() && d != 64 {
                    continue;
                }
                let (overlap, programs) = if ws { (ATTENTION_WS_OPTIONS[i - ATTENTION_OPTIONS.len() - 1].3, ATTENTION_WS_OPTIONS[i - ATTENTION_OPTIONS.len() - 1].4) } else { (false, None) };
                let (opts, config) = match entry {
                    Some((stages, forward_block_m, forward_block_n, wgmma)) => {
                        let warps = if (ATTENTION_FOUR_WARPS..ATTENTION_OPTIONS.len()).contains(&i) { 4 } else { forward_block_m as u32 / 16 };
                        let opts = Options { stages, forward_block_m: Some(forward_block_m), forward_block_n: Some(forward_block_n), wgmma, forward_warps: Some(warps), forward_stages: Some(stages), warp_specialize: Some(ws), overlap, forward_programs: programs, ..Options::default() };
                        let programs = programs.map(|p| format!(",\"programs\":{p}")).unwrap_or_default();
                        (opts, format!("\"stages\":{stages},\"block_m\":{forward_block_m},\"block_n\":{forward_block_n},\"warps\":{warps},\"wgmma\":{wgmma},\"ws\":{ws},\"overlap\":{overlap}{programs}"))
                    }
                    None => (Options { tune: true, ..Options::default() }, "\"tuned\":true,\"wgmma\":true".to_string()),
                };
                // `BENCH_ATTENTION_ONLY=CASE;CONFIG` (a row's case and its configuration
                // fields, as printed; several joined by `|`): those rows alone, e.g. under
                // a profiler.
                if let Ok(only) = std::env::var("BENCH_ATTENTION_ONLY") {
                    let row = format!("{case};{config}");
                    if !only.split('|').any(|o| o == row) {
                        continue;
                    }
                }
                // A configuration the device cannot launch (shared memory) is reported, and
                // the sweep goes on.
                let Some(got) = attention_forward_row(&rt, &t, &s, &case, &config, opts, [&q, &k, &v], [&dq_in, &dk_in, &dv_in], &mut o, &mut lse)? else {
                    continue;
                };
                let lse_h = lse.to_vec()?;
                let rows = b * h * tt;
                let picks = sampled_rows(rows);
                let score = |bh: usize, i: usize, j: usize| -> f64 {
                    let kvh = (bh / h) * kv + (bh % h) / (h / kv);
                    (0..d).map(|e| f(q[(bh * tt + i) * d + e]) * f(k[(kvh * tt + j) * d + e])).sum::<f64>() * scale as f64
                };
                let Some((stages, 64, 64, wgmma)) = entry.filter(|_| !ws && !short) else {
                    continue;
                };
                // The backward, from the forward's o and lse (checked above): its default
                // tiles, and at head dim 64 with 3 stages on wgmma the others built there.
                // Last, with 3 stages on wgmma, the autotuned backward (`Options::tune`: its
                // first call tunes, not timed here; tiles printed as 0).
                // Last, the atomic backward (`attention_backward_atomic`) at head dim 64.
                for (bi, (tiles, atomic)) in BACKWARD_TILES.iter().map(|x| (Some(x), false)).chain([(None, false), (None, true), (Some(&((64, 128), (0, 0))), true)]).enumerate() {
                let built = |tile: (usize, usize), i: usize| {
                    let (dkdv, dq) = BACKWARD_TILES[0];
                    tile == [dkdv, dq][i] || kernels_lib::flash_attention::BUILT_BACKWARD_TILES.iter().any(|&(hd, dkdv, dq)| hd == d && [dkdv, dq][i].contains(&tile))
                };
                let tuned = tiles.is_none() && !atomic;
                let &(backward_dkdv, backward_dq) = tiles.unwrap_or(if atomic { &((64, 64), (0, 0)) } else { &((0, 0), (0, 0)) });
                if bi > 0 && (stages != 3 || !wgmma || (atomic && d > 64) || (tiles.is_some() && !atomic && (tuned_only || !built(backward_dkdv, 0) || !built(backward_dq, 1)))) {
                    continue;
                }
                let opts = if tuned { Options { tune: true, ..opts } } else { Options { backward_dkdv: Some(backward_dkdv), backward_dq: Some(backward_dq), ..opts } };
                for x in [&mut gq, &mut gk, &mut gv] {
                    poison(x)?;
                }
                let grads = |gq: &mut Buffer<bf16>, gk: &mut Buffer<bf16>, gv: &mut Buffer<bf16>, delta: &mut Buffer<f32>| {
                    let g = Grads { q: &dq_in, k: &dk_in, v: &dv_in, o: &o, lse: &lse, dout: &dgo, dq: gq, dk: gk, dv: gv };
                    if atomic {
                        attention_backward_atomic(&rt, &s, g, delta, &mut dq_acc.borrow_mut(), scale, opts)
                    } else {
                        attention_backward_with(&rt, &s, g, delta, scale, opts)
                    }
                };
                grads(&mut gq, &mut gk, &mut gv, &mut delta)?;
                let (gq_h, gk_h, gv_h) = (gq.to_vec()?, gk.to_vec()?, gv.to_vec()?);
                // Per query row: P from the kernel's lse, delta from its output.
                let p = |bh: usize, i: usize, j: usize| (score(bh, i, j) - lse_h[bh * tt + i] as f64).exp();
                let dp = |bh: usize, i: usize, j: usize| -> (f64, f64) {
                    let kvh = (bh / h) * kv + (bh % h) / (h / kv);
                    (0..d).fold((0.0, 0.0), |(a, m), e| {
                        let x = f(g[(bh * tt + i) * d + e]) * f(v[(kvh * tt + j) * d + e]);
                        (a + x, m + x.abs())
                    })
                };
                let dl = |bh: usize, i: usize| -> (f64, f64) {
                    (0..d).fold((0.0, 0.0), |(a, m), e| {
                        let x = f(g[(bh * tt + i) * d + e]) * f(got[(bh * tt + i) * d + e]);
                        (a + x, m + x.abs())
                    })
                };
                let mut bworst = 0.0f64;
                let mut note = |got: f64, want: f64, terms: f64| {
                    let err = (got - want).abs() / terms.max(1e-30);
                    bworst = if err.is_nan() { f64::INFINITY } else { bworst.max(err) };
                };
                // dQ on sampled query rows.
                for &r in &picks {
                    let (bh, i) = (r / tt, r % tt);
                    let kvh = (bh / h) * kv + (bh % h) / (h / kv);
                    let (dli, dla) = dl(bh, i);
                    let (mut want, mut terms) = (vec![0.0; d], vec![0.0; d]);
                    for j in 0..if causal { i + 1 } else { tt } {
                        let (pij, (dpij, dpa)) = (p(bh, i, j), dp(bh, i, j));
                        let (ds, dsa) = (pij * (dpij - dli), pij * (dpa + dla));
                        for e in 0..d {
                            let kk = f(k[(kvh * tt + j) * d + e]);
                            want[e] += scale as f64 * ds * kk;
                            terms[e] += scale as f64 * dsa * kk.abs();
                        }
                    }
                    for e in 0..d {
                        note(f(gq_h[r * d + e]), want[e], terms[e]);
                    }
                }
                // dK and dV on sampled key rows, summed over the query heads of the group.
                let krows = b * kv * tt;
                for jr in (0..64).map(|i| (i * 7919 + 29) % krows).chain([krows - 1]) {
                    let (bk, j) = (jr / tt, jr % tt);
                    let (bi, hk) = (bk / kv, bk % kv);
                    let (mut wk, mut tk, mut wv, mut tv) = (vec![0.0; d], vec![0.0; d], vec![0.0; d], vec![0.0; d]);
                    for hh in hk * (h / kv)..(hk + 1) * (h / kv) {
                        let bh = bi * h + hh;
                        for i in if causal { j } else { 0 }..tt {
                            let (pij, (dpij, dpa), (dli, dla)) = (p(bh, i, j), dp(bh, i, j), dl(bh, i));
                            let (ds, dsa) = (pij * (dpij - dli), pij * (dpa + dla));
                            for e in 0..d {
                                let (qq, gg) = (f(q[(bh * tt + i) * d + e]), f(g[(bh * tt + i) * d + e]));
                                wk[e] += scale as f64 * ds * qq;
                                tk[e] += scale as f64 * dsa * qq.abs();
                                wv[e] += pij * gg;
                                tv[e] += pij * gg.abs();
                            }
                        }
                    }
                    for e in 0..d {
                        note(f(gk_h[jr * d + e]), wk[e], tk[e]);
                        note(f(gv_h[jr * d + e]), wv[e], tv[e]);
                    }
                }
                if bworst > ATTENTION_BWD_BOUND {
                    check_failed("attention_bwd", "bf16", Some(&case), &format!("stages {stages}, tiles {backward_dkdv:?} {backward_dq:?}: worst gradient error {bworst:e} of its terms > {ATTENTION_BWD_BOUND:e}"));
                    continue;
                }
                let tm = timed(&t, || grads(&mut gq, &mut gk, &mut gv, &mut delta))?;
                let gt = graph_timed(&rt, || grads(&mut gq, &mut gk, &mut gv, &mut delta))?;
                println!(
                    "{{\"bench\":\"attention_bwd\",\"impl\":\"ours\",\"dtype\":\"bf16\",\"b\":{b},\"t\":{tt},\"h\":{h},\"kv\":{kv},\"d\":{d},\"causal\":{causal},\"stages\":{stages},\"wgmma\":{wgmma},\"tuned\":{tuned},\"atomic\":{atomic},\"dkdv\":[{},{}],\"dq\":[{},{}],{},{},\"tflops\":{:.1},\"max_rel\":{bworst:e},\"bound\":{ATTENTION_BWD_BOUND:e}}}",
                    backward_dkdv.0, backward_dkdv.1, backward_dq.0, backward_dq.1,
                    tm.json(""),
                    gt.json("graph_"),
                    2.5 * flops / (tm.median() * 1e-3) / 1e12
                );
                }
            }
        }
    }
    for (b, tt, h, kv, d) in ATTENTION_LLAMA_SHAPES.into_iter().filter(|_| !seed_only) {
        let (nq, nk) = (b * h * tt * d, b * kv * tt * d);
        let (q, k, v) = (inputs(nq, s0), inputs(nk, s0 + 1), inputs(nk, s0 + 2));
        let (dq_in, dk_in, dv_in) = (rt.upload(&q)?, rt.upload(&k)?, rt.upload(&v)?);
        let (mut o, mut lse) = (rt.zeros::<bf16>(nq)?, rt.zeros::<f32>(b * h * tt)?);
        let s = Shape { batch: b, seq: tt, heads: h, kv_heads: kv, head_dim: d, causal: true, layout: Layout::Bhtd };
        let case = format!("b={b} t={tt} h={h} kv={kv} d={d} causal=true");
        let ws = Options { forward_block_m: Some(128), forward_block_n: Some(128), forward_warps: Some(8), forward_stages: Some(2), warp_specialize: Some(true), ..Options::default() };
        let rows = [
            (Options { tune: true, ..Options::default() }, "\"tuned\":true,\"wgmma\":true"),
            (Options::default(), "\"default\":true,\"wgmma\":true"),
            (ws, "\"stages\":2,\"block_m\":128,\"block_n\":128,\"warps\":8,\"wgmma\":true,\"ws\":true,\"overlap\":false"),
        ];
        for (opts, config) in rows {
            attention_forward_row(&rt, &t, &s, &case, config, opts, [&q, &k, &v], [&dq_in, &dk_in, &dv_in], &mut o, &mut lse)?;
        }
    }
    Ok(())
}

/// One forward row of `bench attention` on shape `s` (`case`, as printed) with `opts`
/// (`config`, its fields as printed): launched into a poisoned `o`, 64 sampled query rows
/// (and the last) checked against f64 on the host (`host`: q, k, v), then timed and
/// printed. `None`, reported as a failed check, where it does not launch or is off; else
/// the output, for the backward's checks.
#[allow(clippy::too_many_arguments)]
fn attention_forward_row(
    rt: &Runtime,
    t: &CudaTimer,
    s: &kernels_lib::flash_attention::Shape,
    case: &str,
    config: &str,
    opts: kernels_lib::flash_attention::Options,
    host: [&[half::bf16]; 3],
    [q, k, v]: [&Buffer<half::bf16>; 3],
    o: &mut Buffer<half::bf16>,
    lse: &mut Buffer<f32>,
) -> Res<Option<Vec<half::bf16>>> {
    use kernels_lib::flash_attention::attention_forward_with;
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    poison(o)?;
    if let Err(e) = attention_forward_with(rt, s, q, k, v, o, lse, scale, opts) {
        check_failed("attention", "bf16", Some(case), &format!("{opts:?}: {e}"));
        return Ok(None);
    }
    let got = o.to_vec()?;
    let worst = attention_rows_error(s, host, &got, scale as f64, &examples::reference::unmodified);
    if worst > ATTENTION_BOUND {
        check_failed("attention", "bf16", Some(case), &format!("{config}: worst error {worst:e} of sum p|v| > {ATTENTION_BOUND:e}"));
        return Ok(None);
    }
    let tm = timed(t, || attention_forward_with(rt, s, q, k, v, o, lse, scale, opts))?;
    let gt = graph_timed(rt, || attention_forward_with(rt, s, q, k, v, o, lse, scale, opts))?;
    let (b, tt, h, kv, d, causal) = (s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, s.causal);
    let flops = 4.0 * (b * h * tt * tt * d) as f64 * if causal { 0.5 } else { 1.0 };
    println!(
        "{{\"bench\":\"attention\",\"impl\":\"ours\",\"dtype\":\"bf16\",\"b\":{b},\"t\":{tt},\"h\":{h},\"kv\":{kv},\"d\":{d},\"causal\":{causal},{config},{},{},\"tflops\":{:.1},\"max_rel\":{worst:e},\"bound\":{ATTENTION_BOUND:e}}}",
        tm.json(""),
        gt.json("graph_"),
        flops / (tm.median() * 1e-3) / 1e12
    );
    Ok(Some(got))
}

/// The (batch * head, query) rows of `rows` the attention checks sample: 64 spread over
/// all of them, and the last.
fn sampled_rows(rows: usize) -> Vec<usize> {
    (0..64).map(|i| (i * 7919 + 13) % rows).chain([rows - 1]).collect()
}

/// The worst error of the [`sampled_rows`] of a `[B, H, T, D]` attention output `got`
/// (of `[q, k, v]`) against f64 with the scores modified by `m`, relative to
/// `sum_j p_j |v_j|`; a row whose every score is masked must be exactly 0.
fn attention_rows_error(s: &kernels_lib::flash_attention::Shape, [q, k, v]: [&[half::bf16]; 3], got: &[half::bf16], scale: f64, m: examples::reference::ScoreFn<'_>) -> f64 {
    let (h, kv, tt, d) = (s.heads, s.kv_heads, s.seq, s.head_dim);
    let f = |x: half::bf16| x.to_f64();
    let mut worst = 0.0f64;
    for r in sampled_rows(s.batch * h * tt) {
        let (bh, i) = (r / tt, r % tt);
        let kvh = (bh / h) * kv + (bh % h) / (h / kv);
        let n = if s.causal { i + 1 } else { tt };
        let sc: Vec<f64> = (0..n).map(|j| m((0..d).map(|e| f(q[(bh * tt + i) * d + e]) * f(k[(kvh * tt + j) * d + e])).sum::<f64>() * scale, bh / h, bh % h, i, j).0).collect();
        let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = sc.iter().map(|x| (x - mx).exp()).sum();
        for e in 0..d {
            let (mut want, mut mag) = (0.0, 0.0);
            if mx > f64::NEG_INFINITY {
                for (j, x) in sc.iter().enumerate() {
                    let (p, vv) = ((x - mx).exp() / l, f(v[(kvh * tt + j) * d + e]));
                    want += p * vv;
                    mag += p * vv.abs();
                }
            }
            let err = (f(got[r * d + e]) - want).abs() / mag.max(1e-30);
            worst = if err.is_nan() || (mag == 0.0 && f(got[r * d + e]) != 0.0) { f64::INFINITY } else { worst.max(err) };
        }
    }
    worst
}

/// Score modifications at the seed shape (B 4, T 1024, H 8 / KV 4, D 64, bf16,
/// `[B, H, T, D]`, default `Options`): none (the kernel without the hook), soft-capping
/// (cap 20, Gemma 2's; and the same given at run time, `ScoreHook`), ALiBi (slopes `2^(-8 (h + 1) / H)`), a bias from data (`ScoreBias`,
/// with the time of packing it as the graph fuser does), a key padding mask from data
/// (`ScoreBias` with a zero query stride), full; a sliding window of 256
/// keys, and no modification, causal. The forward's sampled rows are checked against f64
/// with the same modification (the backward's scored kernels are checked by the GPU
/// tests, `gpu::flash_attention_with_score_modifications_on_gpu`); then the forward, and
/// the forward and backward together, are timed.
fn score_mod() -> Res<()> {
    use half::bf16;
    use dsl_runtime::ir::{BinOp, Operand, UnaryOp};
    use kernels_lib::flash_attention::{score_bias_pack, Alibi, Hooked, KeyBias, Layout, NoScoreMod, ScoreBias, ScoreHook, Shape, SlidingWindow, SoftCap};
    let rt = Runtime::Cuda(cuda()?);
    let Runtime::Cuda(c) = &rt else { unreachable!() };
    let t = timer(c, 20);
    let s0 = examples::seed()?;
    let (b, tt, h, kv, d) = ATTENTION_SHAPES[0];
    let inputs = |n: usize, s: u64| -> Vec<bf16> { workloads::randoms(n, s).into_iter().map(|x| bf16::from_f32(x / 4.0)).collect() };
    let (nq, nk) = (b * h * tt * d, b * kv * tt * d);
    let host = [inputs(nq, s0), inputs(nk, s0 + 1), inputs(nk, s0 + 2), inputs(nq, s0 + 3)];
    let bufs = ModBufs {
        q: rt.upload(&host[0])?,
        k: rt.upload(&host[1])?,
        v: rt.upload(&host[2])?,
        dout: rt.upload(&host[3])?,
        o: rt.zeros::<bf16>(nq)?,
        lse: rt.zeros::<f32>(b * h * tt)?,
        delta: rt.zeros::<f32>(b * h * tt)?,
        grads: [rt.zeros::<bf16>(nq)?, rt.zeros::<bf16>(nk)?, rt.zeros::<bf16>(nk)?],
    };
    let mut cx = ModBench { rt: &rt, t: &t, host, bufs, fold: 1.0 };
    let shape = |causal| Shape { batch: b, seq: tt, heads: h, kv_heads: kv, head_dim: d, causal, layout: Layout::Bhtd };
    let (cap, window) = (20.0f32, 256usize);
    let slopes: Vec<f32> = (0..h).map(|i| 2f32.powf(-8.0 * (i + 1) as f32 / h as f32)).collect();
    let s64: Vec<f64> = slopes.iter().map(|&x| x as f64).collect();
    let unmodified = &examples::reference::unmodified;
    cx.row::<NoScoreMod>("none", shape(false), None, None, unmodified)?;
    cx.row::<SoftCap>("softcap", shape(false), Some(&[cap]), None, &|s: f64, _: usize, _: usize, _: usize, _: usize| (cap as f64 * (s / cap as f64).tanh(), 0.0))?;
    // The same soft-cap given at run time (`ScoreHook`, as the graph fuser compiles
    // operations on the scores): its cap a constant in the code, its gradient the
    // derivative of that code.
    let softcap_hook = ScoreHook::new(move |b, x, at| {
        let y = b.binary(BinOp::Mul, x[0], Operand::Float(1.0 / cap as f64), at)?;
        let y = b.unary(UnaryOp::Tanh, y, at)?;
        Ok(Operand::V(b.binary(BinOp::Mul, y, Operand::Float(cap as f64), at)?))
    });
    cx.row::<Hooked>("softcap_hooked", shape(false), Some(&[0.0]), Some(&softcap_hook), &|s: f64, _: usize, _: usize, _: usize, _: usize| (cap as f64 * (s / cap as f64).tanh(), 0.0))?;
    // The same with its `1 / cap` moved into the kernels' scale: `tanh(s) * cap` on scores
    // already divided by the cap (one multiplication a score fewer).
    let folded_hook = ScoreHook::new(move |b, x, at| {
        let y = b.unary(UnaryOp::Tanh, x[0], at)?;
        Ok(Operand::V(b.binary(BinOp::Mul, y, Operand::Float(cap as f64), at)?))
    });
    cx.fold = 1.0 / cap;
    cx.row::<Hooked>("softcap_hooked_folded", shape(false), Some(&[0.0]), Some(&folded_hook), &|s: f64, _: usize, _: usize, _: usize, _: usize| (cap as f64 * (s / cap as f64).tanh(), 0.0))?;
    cx.fold = 1.0;
    cx.row::<Alibi>("alibi", shape(false), Some(&slopes), None, &|s: f64, _: usize, h: usize, i: usize, j: usize| (s - s64[h] * (i as f64 - j as f64).abs(), 0.0))?;
    cx.row::<NoScoreMod>("none", shape(true), None, None, unmodified)?;
    cx.row::<SlidingWindow>("window", shape(true), Some(&[window as f32]), None, &|s: f64, _: usize, _: usize, i: usize, j: usize| (if i >= j + window { f64::NEG_INFINITY } else { s }, 0.0))?;
    // A bias from data ([B, T, T] f32, the same for every head and here every batch, which
    // the anchors' reference assumes): eighths in [-1, 1), and every 17th key hidden.
    let bias = |i: usize, j: usize| if j % 17 == 3 { f64::NEG_INFINITY } else { ((i * 31 + j * 17) % 16) as f64 / 8.0 - 1.0 };
    let table: Vec<f32> = (0..b * tt * tt).map(|x| bias(x / tt % tt, x % tt) as f32).collect();
    let args = ScoreBias::args(&shape(false), &table)?;
    cx.row::<ScoreBias>("bias", shape(false), Some(&args), None, &|s: f64, _: usize, _: usize, i: usize, j: usize| (s + bias(i, j), 0.0))?;
    // What the graph fuser adds to it: packing the bias from the tensor (read through
    // strides) into the kernel's arguments, once a run.
    let (src, mut packed) = (rt.upload(&table)?, rt.zeros::<f32>(args.len())?);
    let (n, cfg) = (tt as i32, LaunchConfig::grid3((b * tt) as u32, tt.div_ceil(256) as u32, 1).warps(4));
    let tm = timed(&t, || score_bias_pack::<f32, 256>::launch(&rt, cfg, &src, &mut packed, n, 1, n, n, n * n, 0, n, 1, n * n, 0, n, 1, 0, 0.0, 1.0, 1, f32::INFINITY))?;
    if packed.to_vec()? != args {
        check_failed("attention_mod", "bf16", Some("mod=bias pass=pack"), "the packed bias differs from ScoreBias::args");
    } else {
        println!("{{\"bench\":\"attention_mod\",\"impl\":\"ours\",\"dtype\":\"bf16\",\"mod\":\"bias\",\"b\":{b},\"t\":{tt},\"h\":{h},\"kv\":{kv},\"d\":{d},\"causal\":false,\"pass\":\"pack\",{}}}", tm.json(""));
    }
    // A key padding mask from data ([B, 1, 1, T], every 17th key hidden): `B T` values,
    // strides (T, 0, 0, 1), as the fuser packs it, read by `KeyBias` (a row of keys a tile), as
    // the fuser reads it; `keymask_tile` reads the same through `ScoreBias` (a tile of the
    // row, every query reading it again: the fuser's reading before `KeyBias`; its buffer as
    // long as the dense layout's, which the launch checks).
    let hidden = |j: usize| j % 17 == 3;
    let mask: Vec<f32> = (0..b * tt).map(|x| if hidden(x % tt) { f32::NEG_INFINITY } else { 0.0 }).collect();
    let masked = |s: f64, _: usize, _: usize, _: usize, j: usize| (if hidden(j) { f64::NEG_INFINITY } else { s }, 0.0);
    cx.row::<KeyBias>("keymask", shape(false), Some(&KeyBias::args(&shape(false), &mask)?), None, &masked)?;
    let mut keys = vec![0.0f32; <ScoreBias as kernels_lib::flash_attention::ScoreMod>::args_len(&shape(false))];
    let header = kernels_lib::flash_attention::BIAS_HEADER;
    keys[..header].copy_from_slice(&[tt as f32, tt as f32, 0.0, 0.0, 1.0, f32::INFINITY]);
    keys[header..header + b * tt].copy_from_slice(&mask);
    cx.row::<ScoreBias>("keymask_tile", shape(false), Some(&keys), None, &masked)?;
    Ok(())
}

/// The device buffers of [`score_mod`]'s rows.
struct ModBufs {
    q: Buffer<half::bf16>,
    k: Buffer<half::bf16>,
    v: Buffer<half::bf16>,
    dout: Buffer<half::bf16>,
    o: Buffer<half::bf16>,
    lse: Buffer<f32>,
    delta: Buffer<f32>,
    grads: [Buffer<half::bf16>; 3],
}

struct ModBench<'a> {
    rt: &'a Runtime,
    t: &'a CudaTimer<'a>,
    /// q, k, v and the output gradient on the host.
    host: [Vec<half::bf16>; 4],
    bufs: ModBufs,
    /// What the kernels' scale is multiplied by (a constant factor of the modification
    /// moved into the scale); 1 but for the row that measures that.
    fold: f32,
}

impl ModBench<'_> {
    /// One modification's rows: `args` `None` is the call without a modification.
    /// With `hook`, `M` is `Hooked` and the calls are the hooked ones.
    fn row<M: kernels_lib::flash_attention::ScoreMod>(&mut self, name: &str, s: kernels_lib::flash_attention::Shape, args: Option<&[f32]>, hook: Option<&kernels_lib::flash_attention::ScoreHook>, m: examples::reference::ScoreFn<'_>) -> Res<()> {
        use kernels_lib::flash_attention::{attention_backward_hooked, attention_backward_scored, attention_backward_with, attention_forward_hooked, attention_forward_scored, attention_forward_with, Grads, Hooked, Options};
        let (rt, opts) = (self.rt, Options::default());
        let args = args.map(|a| rt.upload(a)).transpose()?;
        // The reference's scale, and the kernels' (a factor of the modification moved in).
        let (reference_scale, scale) = (1.0 / (s.head_dim as f32).sqrt(), self.fold / (s.head_dim as f32).sqrt());
        let x = &mut self.bufs;
        let fwd = |o: &mut Buffer<half::bf16>, lse: &mut Buffer<f32>| match (&args, hook) {
            (None, _) => attention_forward_with(rt, &s, &x.q, &x.k, &x.v, o, lse, scale, opts),
            (Some(a), None) => attention_forward_scored::<_, M>(rt, &s, &x.q, &x.k, &x.v, o, lse, scale, a, opts),
            (Some(a), Some(h)) => attention_forward_hooked::<_, Hooked>(rt, &s, &x.q, &x.k, &x.v, o, lse, scale, a, h, opts),
        };
        let (mut o, mut lse) = (std::mem::replace(&mut x.o, rt.zeros(0)?), std::mem::replace(&mut x.lse, rt.zeros(0)?));
        poison(&mut o)?;
        fwd(&mut o, &mut lse)?;
        let worst = attention_rows_error(&s, [&self.host[0], &self.host[1], &self.host[2]], &o.to_vec()?, reference_scale as f64, m);
        let case = format!("b={} t={} h={} kv={} d={} causal={} mod={name}", s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, s.causal);
        let head = format!("\"impl\":\"ours\",\"dtype\":\"bf16\",\"mod\":\"{name}\",\"b\":{},\"t\":{},\"h\":{},\"kv\":{},\"d\":{},\"causal\":{}", s.batch, s.seq, s.heads, s.kv_heads, s.head_dim, s.causal);
        if worst > ATTENTION_BOUND {
            check_failed("attention_mod", "bf16", Some(&case), &format!("worst error {worst:e} of sum p|v| > {ATTENTION_BOUND:e}"));
        } else {
            let tm = timed(self.t, || fwd(&mut o, &mut lse))?;
            println!("{{\"bench\":\"attention_mod\",{head},\"pass\":\"fwd\",{},\"max_rel\":{worst:e},\"bound\":{ATTENTION_BOUND:e}}}", tm.json(""));
            let [gq, gk, gv] = &mut x.grads;
            let tm = timed(self.t, || {
                fwd(&mut o, &mut lse)?;
                let g = Grads { q: &x.q, k: &x.k, v: &x.v, o: &o, lse: &lse, dout: &x.dout, dq: &mut *gq, dk: &mut *gk, dv: &mut *gv };
                match (&args, hook) {
                    (None, _) => attention_backward_with(rt, &s, g, &mut x.delta, scale, opts),
                    (Some(a), None) => attention_backward_scored::<_, M>(rt, &s, g, &mut x.delta, scale, a, opts),
                    (Some(a), Some(h)) => attention_backward_hooked::<_, Hooked>(rt, &s, g, &mut x.delta, scale, a, h, opts),
                }
            })?;
            println!("{{\"bench\":\"attention_mod\",{head},\"pass\":\"fwd_bwd\",{}}}", tm.json(""));
        }
        (x.o, x.lse) = (o, lse);
        Ok(())
    }
}

fn spec() -> Res<()> {
    use workloads::{rmsnorm_bound, softmax_bound, suite_bounds, ROW_SWEEP_WARPS};
    for (b, t, h, kv, d) in ATTENTION_SHAPES {
        println!("{{\"spec\":\"attention\",\"b\":{b},\"t\":{t},\"h\":{h},\"kv\":{kv},\"d\":{d},\"bound\":{ATTENTION_BOUND:e},\"bound_bwd\":{ATTENTION_BWD_BOUND:e}}}");
    }
    for (b, t, h, kv, d) in ATTENTION_LLAMA_SHAPES {
        println!("{{\"spec\":\"attention_llama\",\"b\":{b},\"t\":{t},\"h\":{h},\"kv\":{kv},\"d\":{d},\"bound\":{ATTENTION_BOUND:e}}}");
    }
    for (name, dtype, b) in suite_bounds() {
        println!("{{\"spec\":\"bound\",\"bench\":\"{name}\",\"dtype\":\"{dtype}\",\"bound\":{b:e}}}");
    }
    let rows = |bench: &str, dtype: &str, (r, c): (usize, usize), bound: f64, configs: Vec<autotune::Config>| {
        let cfgs: Vec<String> = configs.iter().map(cfg_json).collect();
        println!("{{\"spec\":\"bound\",\"bench\":\"{bench}\",\"dtype\":\"{dtype}\",\"bound\":{bound:e}}}");
        println!("{{\"spec\":\"rows\",\"bench\":\"{bench}\",\"dtype\":\"{dtype}\",\"rows\":{r},\"cols\":{c},\"configs\":[{}]}}", cfgs.join(","));
    };
    rows("softmax", "f32", SOFTMAX, softmax_bound(SOFTMAX.1, false), workloads::row_sweep(SOFTMAX.0, SOFTMAX.1));
    rows("softmax_short_rows", "f32", SOFTMAX_SHORT, softmax_bound(SOFTMAX_SHORT.1, false), workloads::row_sweep(SOFTMAX_SHORT.0, SOFTMAX_SHORT.1));
    rows("softmax", "bf16", SOFTMAX, softmax_bound(SOFTMAX.1, true), one_row_sweep(SOFTMAX.0, SOFTMAX.1));
    rows("rmsnorm", "bf16", RMSNORM, rmsnorm_bound(RMSNORM.1), workloads::row_sweep(RMSNORM.0, RMSNORM.1));
    let tr = TRANSPOSE_CONFIGS.iter().map(|&(tile, w)| autotune::Config::new(&[("TILE", tile as i64)], w, 1)).collect();
    rows("transpose", "f32", (TRANSPOSE, TRANSPOSE), 0.0, tr);
    // Triton's softmax (its tutorial kernel) has no ROWS: it sweeps the warps list of ours.
    let w: Vec<String> = ROW_SWEEP_WARPS.iter().map(|w| w.to_string()).collect();
    println!("{{\"spec\":\"triton_softmax_warps\",\"warps\":[{}]}}", w.join(","));
    for (m, n, k) in MATMUL_SHAPES {
        println!("{{\"spec\":\"matmul\",\"m\":{m},\"n\":{n},\"k\":{k},\"bound\":{:e},\"bound_tf32\":{:e}}}", workloads::matmul_bound(k), workloads::matmul_bound_tf32(k));
    }
    for (m, n, k) in LINEAR_SHAPES {
        println!("{{\"spec\":\"linear\",\"m\":{m},\"n\":{n},\"k\":{k},\"bound\":{:e}}}", linear_bound(k));
    }
    Ok(())
}

fn coldstart() -> Res<()> {
    let t0 = Instant::now();
    let rt = cuda()?;
    let t_rt = t0.elapsed().as_secs_f64() * 1e3;
    let n = 4096;
    let s = rt.stream();
    let host = workloads::randoms(n, examples::seed()?);
    let (a, b, c) = (s.clone_htod(&host)?, s.clone_htod(&host)?, s.clone_htod(&host)?);
    let mut out = s.clone_htod(&vec![f32::NAN; n])?;
    s.synchronize()?;
    let t1 = Instant::now();
    relu_mul_add::<f32, 1024>::launch(&rt, grid_for(n, 1024), &a, &b, &c, &mut out, n as i32)?;
    rt.synchronize()?;
    let t_first = t1.elapsed().as_secs_f64() * 1e3;
    let got = s.clone_dtoh(&out)?;
    let mut e = ErrorStats::default();
    for (&g, &h) in got.iter().zip(&host) {
        let (p, c) = ((h as f64).max(0.0) * h as f64, h as f64);
        e.push(g as f64, p + c, p.abs() + c.abs());
    }
    let check = e.judge(workloads::suite_bound("relu_mul_add", "f32"));
    // A matmul's first launch (compile + load + run) at one fixed configuration, as the
    // anchors: 1024^3 bf16, 128 x 128 x 32 tiles, 4 warps, 3 stages, f32 out.
    let mm = 1024;
    let hx: Vec<half::bf16> = xorshift_fill(mm * mm, 7, -1.0, 1.0).into_iter().map(half::bf16::from_f32).collect();
    let hy: Vec<half::bf16> = xorshift_fill(mm * mm, 8, -1.0, 1.0).into_iter().map(half::bf16::from_f32).collect();
    let (dx, dy) = (s.clone_htod(&hx)?, s.clone_htod(&hy)?);
    let mut dz = s.clone_htod(&vec![f32::NAN; mm * mm])?;
    s.synchronize()?;
    let t2 = Instant::now();
    let m32 = mm as i32;
    kernels_lib::matmul::<half::bf16, f32, 128, 128, 32, 8>::launch(&rt, LaunchConfig::grid(64).warps(4).stages(3), &dx, &dy, &mut dz, m32, m32, m32, m32, 1, m32, 1, m32, 1)?;
    rt.synchronize()?;
    let t_matmul = t2.elapsed().as_secs_f64() * 1e3;
    let z = s.clone_dtoh(&dz)?;
    let mut em = ErrorStats::default();
    for (i, j) in [(0, 0), (mm - 1, mm - 1), (17, 1000), (1000, 3)] {
        let (mut want, mut scale) = (0.0, 0.0);
        for p in 0..mm {
            let x = hx[i * mm + p].to_f64() * hy[p * mm + j].to_f64();
            want += x;
            scale += x.abs();
        }
        em.push(z[i * mm + j] as f64, want, scale);
    }
    let mm_check = em.judge(workloads::matmul_bound(mm));
    // A graph's first call: the fuser's seed `relu(x) + relu(x) * 2` built, compiled (the
    // fusion pass, IR, LLVM, PTX, load) and run once, synchronized; after the launches
    // above, as the anchors' second `torch.compile` of the same process.
    let t3 = Instant::now();
    let (seed_out, plan_kernels) = {
        use kernels_lib::graph::{Graph, TensorMut};
        let rt = Runtime::Cuda(CudaRuntime::with_stream(rt.stream().clone())?);
        let g = Graph::new();
        let x = g.input("x", DType::F32, &[n]);
        g.output("y", x.relu() + x.relu() * 2.0)?;
        let mut plan = g.compile(&rt)?;
        let (x, mut y) = (rt.upload(&host)?, rt.upload(&vec![f32::NAN; n])?);
        plan.run(&rt, &[(&x).into()], &mut [TensorMut::from(&mut y)])?;
        (y.to_vec()?, plan.kernel_count())
    };
    let t_graph = t3.elapsed().as_secs_f64() * 1e3;
    let mut eg = ErrorStats::default();
    for (&g, &h) in seed_out.iter().zip(&host) {
        let r = 3.0 * (h as f64).max(0.0);
        eg.push(g as f64, r, r);
    }
    let graph_check = eg.judge(workloads::suite_bound("seed_relu", "f32"));
    let st = rt.compiler().stats();
    println!(
        "{{\"bench\":\"coldstart\",\"runtime_ms\":{t_rt:.1},\"first_launch_ms\":{t_first:.2},\"first_matmul_ms\":{t_matmul:.2},\"first_graph_ms\":{t_graph:.2},\"graph_kernels\":{plan_kernels},\"compiled\":{},\"disk_hits\":{},\"correct\":{},\"max_rel\":{:e}}}",
        st.compiled,
        st.disk_hits,
        check.passed() && mm_check.passed() && graph_check.passed(),
        check.max_rel.max(mm_check.max_rel).max(graph_check.max_rel)
    );
    if !graph_check.passed() {
        return Err(format!("coldstart graph: {graph_check}").into());
    }
    if !check.passed() {
        return Err(format!("coldstart relu_mul_add: {check}").into());
    }
    if !mm_check.passed() {
        return Err(format!("coldstart matmul: {mm_check}").into());
    }
    Ok(())
}

fn launch() -> Res<()> {
    let rt = cuda()?;
    let iters = 20000;
    host_per_launch(&rt, iters)?;
    raw_driver_floor(&rt, iters)?;
    checked_cost(&rt)?;
    plan_host(rt)
}

/// Host time per guarded launch of relu-mul-add on 1024 elements, `iters` back to back with
/// no synchronization, `BENCH_REPEATS` rounds; one JSON row.
fn host_per_launch(rt: &CudaRuntime, iters: usize) -> Res<()> {
    let n = 1024;
    let s = rt.stream();
    let host = vec![1.0f32; n];
    let (a, b, c) = (s.clone_htod(&host)?, s.clone_htod(&host)?, s.clone_htod(&host)?);
    let mut out = s.alloc_zeros::<f32>(n)?;
    let cfg = grid_for(n, 1024);
    for _ in 0..1000 {
        relu_mul_add::<f32, 1024>::launch(rt, cfg, &a, &b, &c, &mut out, n as i32)?;
    }
    rt.synchronize()?;
    let (mut host_us, mut wall_us) = (vec![], vec![]);
    for _ in 0..repeats() {
        let t = Instant::now();
        for _ in 0..iters {
            relu_mul_add::<f32, 1024>::launch(rt, cfg, &a, &b, &c, &mut out, n as i32)?;
        }
        host_us.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
        rt.synchronize()?;
        wall_us.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
    }
    if s.clone_dtoh(&out)?.iter().any(|&v| v != 2.0) {
        return Err("launch: relu(1) * 1 + 1 is not 2".into());
    }
    let (h, w) = (median(&host_us), median(&wall_us));
    println!(
        "{{\"bench\":\"launch\",\"host_us_per_launch\":{h:.2},\"host_us_min\":{:.2},\"host_us_max\":{:.2},\"host_us_runs\":{},\"wall_us_per_launch\":{w:.2},\"launches_per_s\":{:.0}}}",
        min(&host_us),
        max(&host_us),
        json_list(&host_us),
        1e6 / h
    );
    Ok(())
}

/// Host cost per run of a compiled graph: the fuser's seed `relu(x) + relu(x) * 2` on 1024
/// elements (one kernel) and the same graph unfused (three: relu, the product, the sum),
/// each through `Plan::run` (a launch per kernel) and `Plan::run_graph` (one CUDA-graph
/// replay). Each run is timed alone: to its return (the host's cost) and to the end of a
/// synchronize after it (the wall time of one run); `BENCH_REPEATS` rounds of 2000 runs,
/// the median of each round. The anchors time `torch.compile` (default and
/// reduce-overhead) and eager PyTorch on the same graph the same way.
fn plan_host(cuda: CudaRuntime) -> Res<()> {
    use kernels_lib::graph::{Graph, Options, TensorMut};
    let rt = Runtime::Cuda(cuda);
    let n = 1024;
    let host = workloads::randoms(n, examples::seed()?);
    let want: Vec<f32> = host.iter().map(|&v| v.max(0.0) + v.max(0.0) * 2.0).collect();
    let x = rt.upload(&host)?;
    let g = Graph::new();
    let gx = g.input("x", DType::F32, &[n]);
    g.output("y", gx.relu() + gx.relu() * 2.0)?;
    for (name, options) in [("seed", Options::default()), ("seed_unfused", Options::unfused())] {
        let mut plan = g.compile_with(&rt, &options)?;
        for graph in [false, true] {
            let mut y = rt.upload(&vec![f32::NAN; n])?;
            let mut once = |y: &mut Buffer<f32>| if graph { plan.run_graph(&rt, &[(&x).into()], &mut [TensorMut::from(y)]) } else { plan.run(&rt, &[(&x).into()], &mut [TensorMut::from(y)]) };
            once(&mut y)?;
            // f32: relu and the product by 2 are exact, the sum rounds as on the host.
            if y.to_vec()? != want {
                return Err(format!("plan_host {name}: the output is not relu(x) + relu(x) * 2").into());
            }
            for _ in 0..100 {
                once(&mut y)?;
            }
            rt.synchronize()?;
            let (mut host_us, mut wall_us) = (vec![], vec![]);
            for _ in 0..repeats() {
                let (mut h, mut w) = (Vec::with_capacity(2000), Vec::with_capacity(2000));
                for _ in 0..2000 {
                    let t = Instant::now();
                    once(&mut y)?;
                    h.push(t.elapsed().as_secs_f64() * 1e6);
                    rt.synchronize()?;
                    w.push(t.elapsed().as_secs_f64() * 1e6);
                }
                host_us.push(median(&h));
                wall_us.push(median(&w));
            }
            println!(
                "{{\"bench\":\"plan_host\",\"graph\":\"{name}\",\"impl\":\"{}\",\"kernels\":{},\"n\":{n},\"host_us\":{:.2},\"host_us_min\":{:.2},\"host_us_max\":{:.2},\"host_us_runs\":{},\"wall_us\":{:.2},\"wall_us_runs\":{}}}",
                if graph { "ours_run_graph" } else { "ours_run" },
                plan.kernel_count(),
                median(&host_us),
                min(&host_us),
                max(&host_us),
                json_list(&host_us),
                median(&wall_us),
                json_list(&wall_us)
            );
        }
    }
    Ok(())
}

/// What a checked launch (`LaunchConfig::debug(true)`: bounds checks before every access,
/// then a synchronization to read the out-of-bounds record) costs against a plain guarded
/// launch that is also synchronized, at a small size (launch-bound) and at 2^26 elements
/// (bandwidth-bound). Wall time per launch + synchronize, `BENCH_REPEATS` runs each.
fn checked_cost(rt: &CudaRuntime) -> Res<()> {
    let s = rt.stream();
    for n in [1usize << 10, 1 << 26] {
        let host: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
        let (a, b, c) = (s.clone_htod(&host)?, s.clone_htod(&host)?, s.clone_htod(&host)?);
        let mut out = s.alloc_zeros::<f32>(n)?;
        let iters = if n < 1 << 20 { 2000 } else { 50 };
        let mut time = |debug: bool| -> Res<Vec<f64>> {
            let cfg = grid_for(n, 1024).debug(debug);
            for _ in 0..10 {
                relu_mul_add::<f32, 1024>::launch(rt, cfg, &a, &b, &c, &mut out, n as i32)?;
            }
            rt.synchronize()?;
            let mut runs = vec![];
            for _ in 0..repeats() {
                let t = Instant::now();
                for _ in 0..iters {
                    relu_mul_add::<f32, 1024>::launch(rt, cfg, &a, &b, &c, &mut out, n as i32)?;
                    rt.synchronize()?;
                }
                runs.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
            }
            Ok(runs)
        };
        let (plain, checked) = (time(false)?, time(true)?);
        let want: Vec<f64> = host.iter().map(|&x| (x.max(0.0) * x + x) as f64).collect();
        let got: Vec<f64> = s.clone_dtoh(&out)?.into_iter().map(f64::from).collect();
        let chk = check_relative(&got, &want, workloads::suite_bounds()[0].2.max(1e-6));
        if !chk.passed() {
            return Err(format!("checked launch: wrong output: {chk}").into());
        }
        println!(
            "{{\"bench\":\"checked_launch\",\"n\":{n},\"us_plain\":{:.2},\"us_plain_min\":{:.2},\"us_plain_max\":{:.2},\"us_checked\":{:.2},\"us_checked_min\":{:.2},\"us_checked_max\":{:.2},\"runs\":{}}}",
            median(&plain),
            min(&plain),
            max(&plain),
            median(&checked),
            min(&checked),
            max(&checked),
            plain.len()
        );
    }
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    Timing { runs: v.to_vec() }.median()
}
fn min(v: &[f64]) -> f64 {
    Timing { runs: v.to_vec() }.min()
}
fn max(v: &[f64]) -> f64 {
    Timing { runs: v.to_vec() }.max()
}
fn json_list(v: &[f64]) -> String {
    format!("[{}]", v.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(","))
}

/// The driver's own cost: `cuLaunchKernel` of an empty kernel with the same 9 parameters
/// as the guarded relu-mul-add, on the same stream.
fn raw_driver_floor(rt: &CudaRuntime, iters: usize) -> Res<()> {
    use dsl_runtime::cudarc::driver::{result, sys};
    use std::ffi::c_void;
    let ptx = c".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry empty(.param .u64 a, .param .u64 b, .param .u64 c, .param .u64 d, .param .u32 n, .param .u64 la, .param .u64 lb, .param .u64 lc, .param .u64 ld) { ret; }\n";
    rt.context().bind_to_thread()?;
    let (mut module, mut func) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: `ptx` is a NUL-terminated C string literal (the driver reads PTX up to the
    // NUL); the runtime's context is current on this thread (bound above); the driver writes
    // one handle to each `&mut` out-parameter; `c"empty"` is NUL-terminated.
    unsafe {
        sys::cuModuleLoadData(&mut module, ptx.as_ptr() as *const c_void).result()?;
        sys::cuModuleGetFunction(&mut func, module, c"empty".as_ptr()).result()?;
    }
    let mut slots = [0u64; 9];
    let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
    let stream = rt.stream().cu_stream();
    let mut host_us = vec![];
    for _ in 0..repeats() {
        let t = Instant::now();
        for _ in 0..iters {
            // SAFETY: `func` comes from `module`, loaded in this context and never unloaded
            // (leaked for the process); `params` holds 9 pointers to live `u64` slots, one
            // per parameter of `empty`, which the driver copies before returning; the kernel
            // touches no memory.
            unsafe { result::launch_kernel(func, (1, 1, 1), (128, 1, 1), 0, stream, &mut params)? };
        }
        host_us.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
        rt.synchronize()?;
    }
    println!(
        "{{\"bench\":\"launch_driver_floor\",\"host_us_per_launch\":{:.2},\"host_us_min\":{:.2},\"host_us_max\":{:.2},\"host_us_runs\":{}}}",
        median(&host_us),
        min(&host_us),
        max(&host_us),
        json_list(&host_us)
    );
    Ok(())
}

fn poison<T: Element>(b: &mut Buffer<T>) -> Res<()> {
    let v = if T::DTYPE.is_float() { T::from_f64(f64::NAN) } else { T::from_i64(0x5a) };
    Ok(b.copy_from(&vec![v; b.len()])?)
}

fn f64s<T: Element>(b: &Buffer<T>) -> Res<Vec<f64>> {
    Ok(b.to_vec()?.into_iter().map(|x| x.to_f64()).collect())
}

/// One row configuration: launch once into the NaN-poisoned `out`, `check` it (every
/// element), then time the launch; print the row. A check that does not pass prints a
/// `check_failed` row instead, untimed.
fn row_case<T: Element>(
    t: &CudaTimer,
    (bench, dtype, config): (&str, &str, &str),
    bytes: usize,
    out: &mut Buffer<T>,
    check: impl FnOnce(&Buffer<T>) -> Res<Check>,
    mut launch: impl FnMut(&mut Buffer<T>) -> dsl_runtime::Result<()>,
) -> Res<()> {
    poison(out)?;
    launch(out)?;
    let c = check(out)?;
    if !c.passed() {
        check_failed(bench, dtype, Some(config), &c.to_string());
        return Ok(());
    }
    let tm = timed(t, || launch(out))?;
    println!("{}", row_json(bench, dtype, Some(config), None, bytes, &tm, &c));
    Ok(())
}

/// Run a one-output graph plan as a plain launch.
fn graph_launch<'a, T: Element>(rt: &Runtime, plan: &mut kernels_lib::graph::Plan, inputs: &[kernels_lib::graph::TensorRef<'_>], out: &'a mut Buffer<T>) -> dsl_runtime::Result<()>
where
    kernels_lib::graph::TensorMut<'a>: From<&'a mut Buffer<T>>,
{
    plan.run(rt, inputs, &mut [out.into()]).map_err(|e| dsl_runtime::Error::Launch { kernel: "graph".into(), message: e.to_string() })
}

/// The fuser's cost model on a value two kernels need: `p = exp(x0 x1 + x2 x3 + x4 x5)`
/// on 8192 x 1024 f32 (inputs in [-0.5, 0.5)), read by a softmax over its rows and a sum
/// over its columns, `y = softmax(p) * colsum(p)`. Stored once (the cost model: the six
/// inputs read once, `p` written once and read twice, three kernels) against recomputed
/// by both kernels (`Fusion::Recompute`: each reads the six inputs, two kernels). Checked
/// against f64; the bytes counted are the inputs and the output, once.
fn shared_value(rt: &Runtime, t: &CudaTimer) -> Res<()> {
    use kernels_lib::graph::{fuse::Fusion, Graph, Options};
    let (nr, nc) = (8192, 1024);
    let s0 = examples::seed()?;
    let host: Vec<Vec<f32>> = (0..6).map(|i| xorshift_fill(nr * nc, s0 + 300 + i, -0.5, 0.5)).collect();
    let g = Graph::new();
    let xs: Vec<_> = (0..6).map(|i| g.input(&format!("x{i}"), DType::F32, &[nr, nc])).collect();
    let p = (xs[0] * xs[1] + xs[2] * xs[3] + xs[4] * xs[5]).exp();
    g.output("y", p.softmax(-1) * p.transpose(0, 1).sum(-1).reshape(&[nc]))?;
    // The f64 reference.
    let p64: Vec<f64> = (0..nr * nc).map(|i| (0..3).map(|k| host[2 * k][i] as f64 * host[2 * k + 1][i] as f64).sum::<f64>().exp()).collect();
    let soft = workloads::softmax_rows(&p64, nc);
    let cols: Vec<f64> = (0..nc).map(|j| (0..nr).map(|r| p64[r * nc + j]).sum()).collect();
    let reference: Vec<f64> = soft.iter().enumerate().map(|(i, v)| v * cols[i % nc]).collect();
    // `s` (three products, two sums, |s| < 0.75) is off by at most 5u x 0.75 absolute, which
    // with exp's own error moves `p` (in [0.47, 2.12]) relatively by `dp`; the softmax of `p`
    // (differences below 8) is within `softmax_bound`, plus 2 x 2.12 dp from `p` itself;
    // the column sum by dp and its tree's gamma; the product rounds once.
    let dp = 5.0 * workloads::U_F32 * 0.75 + workloads::exp_error(0.75);
    let bound = workloads::chain(&[workloads::softmax_bound(nc, false), 2.0 * 2.12 * dp, dp, workloads::sum_bound(nr, nr.next_power_of_two(), 8), workloads::U_F32]);
    let chk = |o: &Buffer<f32>| -> Res<Check> { Ok(check_relative(&f64s(o)?, &reference, bound)) };
    let inputs: Vec<Buffer<f32>> = host.iter().map(|h| rt.upload(h)).collect::<Result<_, _>>()?;
    let ins: Vec<kernels_lib::graph::TensorRef> = inputs.iter().map(|b| b.into()).collect();
    let mut dout = rt.zeros::<f32>(nr * nc)?;
    let bytes = 7 * nr * nc * 4;
    for (name, fusion) in [("graph_shared_value", Fusion::On), ("graph_shared_value_recompute", Fusion::Recompute)] {
        let mut plan = g.compile_with(rt, &Options { fusion, ..Options::default() })?;
        let config = format!("{} kernels, {} stored by the cost model", plan.kernel_count(), plan.partition().stored_by_cost.len());
        row_case(t, (name, "f32", &config), bytes, &mut dout, chk, |o| graph_launch(rt, &mut plan, &ins, o))?;
    }
    Ok(())
}

/// The shapes (m, n, k) of the `linear` rows: an MLP's up-projection of 8192 tokens, and
/// the seed block's projection (4096 tokens, d_model 512).
pub const LINEAR_SHAPES: [(usize, usize, usize); 2] = [(8192, 4096, 1024), (4096, 512, 512)];

/// The elements of an `m x n` product a matmul row checks: its last row and column (the
/// masked edges) and 4096 random ones.
fn matmul_picks(m: usize, n: usize, seed: u64) -> Vec<(usize, usize)> {
    let mut picks: Vec<(usize, usize)> = (0..n).map(|j| (m - 1, j)).chain((0..m).map(|i| (i, n - 1))).collect();
    let mut r = seed | 1;
    for _ in 0..4096 {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        picks.push(((r >> 32) as usize % m, (r & 0xffff_ffff) as usize % n));
    }
    picks
}

/// The bound of a `linear` row relative to its terms (see [`linear`]).
fn linear_bound(k: usize) -> f64 {
    1.1 * 6.0 * workloads::U_BF16 + workloads::matmul_bound(k)
}

/// A linear layer with an epilogue, `y = silu(x w + b) + r` in bf16 (`x` `[m, k]`, `w`
/// `[k, n]`, `b` `[n]`, `r` `[m, n]`), as a graph through the fuser: the epilogue fused
/// into the product's kernel (one kernel), kept apart ([`Fusion::NoEpilogues`]: the
/// library matmul, then one pointwise kernel), and the library's hand-written
/// `matmul_epilogue_tuned` (its epilogue in f32, rounded once); the product alone as the
/// floor; and tuned over the library matmul's tiles (`Options::tune`, each candidate a
/// `linear_tune` row). `linear_cast`: the same on f32 activations cast to bf16 in the
/// graph, the cast fused into the product's loads (its prologue) or a kernel of its own. Each output is poisoned, then checked at the last row and column and 4096
/// random elements against f64 relative to the terms (`|x| |w| + |b| + |r| + 1`): the
/// graph rounds the product and each of its five pointwise nodes to bf16 (its unit
/// roundoff 2^-8 each, at a slope of at most 1.1), the products' f32 sums add `gamma(k)`.
fn linear() -> Res<()> {
    use half::bf16;
    use kernels_lib::graph::{fuse::Fusion, Graph, Options, TensorMut};
    let rt = Runtime::Cuda(cuda()?);
    let Runtime::Cuda(cu) = &rt else { unreachable!() };
    let t = timer(cu, 20);
    let seed = examples::seed()?;
    for (m, n, k) in LINEAR_SHAPES {
        let fill = |len: usize, s: u64| xorshift_fill(len, seed + s, -1.0, 1.0).into_iter().map(bf16::from_f32).collect::<Vec<_>>();
        let (hx, hw, hb, hr) = (fill(m * k, 1), fill(k * n, 2), fill(n, 3), fill(m * n, 4));
        let (dx, dw, db, dr) = (rt.upload(&hx)?, rt.upload(&hw)?, rt.upload(&hb)?, rt.upload(&hr)?);
        let mut dy = rt.zeros::<bf16>(m * n)?;
        let f = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
        let (x64, w64, b64, r64) = (f(&hx), f(&hw), f(&hb), f(&hr));
        let picks = matmul_picks(m, n, seed);
        // (want, scale) at each pick; the product alone's too.
        let refs: Vec<((f64, f64), (f64, f64))> = picks
            .iter()
            .map(|&(i, j)| {
                let (mut p, mut sc) = (0.0, 0.0);
                for q in 0..k {
                    let v = x64[i * k + q] * w64[q * n + j];
                    p += v;
                    sc += v.abs();
                }
                let h = p + b64[j];
                ((h / (1.0 + (-h).exp()) + r64[i * n + j], sc + b64[j].abs() + r64[i * n + j].abs() + 1.0), (p, sc + 1.0))
            })
            .collect();
        let bound = linear_bound(k);
        let check = |o: &Buffer<bf16>, product: bool| -> Res<Check> {
            let got = o.to_vec()?;
            let mut e = ErrorStats::default();
            for (&(i, j), &(full, alone)) in picks.iter().zip(&refs) {
                let (want, scale) = if product { alone } else { full };
                e.push(got[i * n + j].to_f64(), want, scale);
            }
            Ok(e.judge(if product { workloads::U_BF16 + workloads::matmul_bound(k) } else { bound }))
        };
        let bytes = 2 * (m * k + k * n + n + 2 * m * n);
        let shape = format!("m={m} n={n} k={k}");
        // The same layer on f32 activations cast to bf16 in the graph (`linear_cast`): the
        // cast is the product's prologue (or, apart, a kernel of its own). The same inputs
        // (x's bf16 values, as f32): the same reference and check.
        let dx32 = rt.upload(&hx.iter().map(|v| v.to_f32()).collect::<Vec<f32>>())?;
        for bench in ["linear", "linear_cast"] {
            let g = Graph::new();
            let x = if bench == "linear" { g.input("x", DType::BF16, &[m, k]) } else { g.input("x", DType::F32, &[m, k]).cast(DType::BF16) };
            let (w, b, r) = (g.input("w", DType::BF16, &[k, n]), g.input("b", DType::BF16, &[n]), g.input("r", DType::BF16, &[m, n]));
            let h = x.matmul(w) + b;
            g.output("y", h * h.sigmoid() + r)?;
            let ins = [if bench == "linear" { (&dx).into() } else { (&dx32).into() }, (&dw).into(), (&db).into(), (&dr).into()];
            let bytes = if bench == "linear" { bytes } else { bytes + 2 * m * k };
            for (name, fusion, tune) in [("fuser, epilogue fused", Fusion::On, false), ("fuser, epilogue apart", Fusion::NoEpilogues, false), ("fuser, epilogue fused, tuned", Fusion::On, true)] {
                let mut plan = g.compile_with(&rt, &Options { fusion, tune, ..Options::default() })?;
                if tune {
                    // Tune first (the sweep's candidates as rows of their own), then time the winner.
                    plan.run(&rt, &ins, &mut [TensorMut::from(&mut dy)])?;
                    for (i, s) in plan.tune_sessions() {
                        for (cfg, outcome, _) in &s.candidates {
                            let ms = match outcome {
                                autotune::tuner::Outcome::Timed(ms) => format!("{ms}"),
                                _ => "null".into(),
                            };
                            println!("{{\"bench\":\"{bench}_tune\",\"impl\":\"ours\",\"dtype\":\"bf16\",\"config\":\"{shape} k{i}: {}\",\"ms\":{ms},\"outcome\":\"{}\"}}", cfg_str(cfg), format!("{outcome:?}").replace('"', "'"));
                        }
                    }
                }
                let config = format!("{shape}: {name} ({} kernels){}", plan.kernel_count(), if tune { format!(" {}", plan_tuned(&plan)) } else { String::new() });
                row_case(&t, (bench, "bf16", &config), bytes, &mut dy, |o| check(o, false), |o| {
                    plan.run(&rt, &ins, &mut [TensorMut::from(o)]).map_err(|e| dsl_runtime::Error::Launch { kernel: "graph".into(), message: e.to_string() })
                })?;
            }
        }
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        row_case(&t, ("linear", "bf16", &format!("{shape}: library matmul_epilogue_tuned")), bytes, &mut dy, |o| check(o, false), |o| {
            tuned_launch("matmul_epilogue_tuned", kernels_lib::matmul_epilogue_tuned(&rt, &dx, &dw, o, &db, &dr, mi, ni, ki, ki, 1, ni, 1, ni, 1, ni, 1, 1.0, kernels_lib::activation::SILU, 1, 1))
        })?;
        let g = Graph::new();
        g.output("p", g.input("x", DType::BF16, &[m, k]).matmul(g.input("w", DType::BF16, &[k, n])))?;
        let mut plan = g.compile(&rt)?;
        row_case(&t, ("linear", "bf16", &format!("{shape}: fuser, the product alone")), 2 * (m * k + k * n + m * n), &mut dy, |o| check(o, true), |o| {
            plan.run(&rt, &[(&dx).into(), (&dw).into()], &mut [TensorMut::from(o)]).map_err(|e| dsl_runtime::Error::Launch { kernel: "graph".into(), message: e.to_string() })
        })?;
    }
    Ok(())
}

/// The configurations a tuned plan's kernels won (`BLOCK`, `ROWS`, warps), for the row's
/// config column.
fn plan_tuned(plan: &kernels_lib::graph::Plan) -> String {
    plan.tune_sessions().iter().map(|(i, s)| format!("k{i}: {}", cfg_str(&s.winner))).collect::<Vec<_>>().join("; ")
}

/// Launch a tuned kernel's wrapper (which returns its configuration) as a plain launch.
fn tuned_launch(kernel: &str, r: Result<autotune::Config, autotune::TuneError>) -> dsl_runtime::Result<()> {
    r.map(drop).map_err(|e| dsl_runtime::Error::Launch { kernel: kernel.into(), message: e.to_string() })
}

fn rows() -> Res<()> {
    use autotune::dispatch;
    use dsl_runtime::DType;
    use kernels_lib::graph::Graph;
    use half::bf16;
    use kernels_lib::{rmsnorm_bf16, rmsnorm_bf16_tuned, rows_grid, softmax, softmax_tuned, transpose};
    use workloads::{rmsnorm_bound, softmax_bound};
    let rt = Runtime::Cuda(cuda()?);
    let Runtime::Cuda(c) = &rt else { unreachable!() };
    let t = timer(c, 100);
    let mut rng = 0x2545F4914F6CDD1Du64 ^ examples::seed()?;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
    };
    let to_f64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let no_config = "config without an instantiation here";

    // Softmax f32: 4096 x 4096, and short rows (32768 x 128) where several rows per program
    // keep threads busy: every candidate of the autotuner, then the tuned launch.
    for (name, (nr, nc)) in [("softmax", SOFTMAX), ("softmax_short_rows", SOFTMAX_SHORT)] {
        let x: Vec<f32> = (0..nr * nc).map(|_| next()).collect();
        let reference = workloads::softmax_rows(&to_f64(&x), nc);
        let bound = softmax_bound(nc, false);
        let (dx, mut dout) = (rt.upload(&x)?, rt.zeros::<f32>(nr * nc)?);
        let bytes = 2 * nr * nc * 4;
        let chk = |o: &Buffer<f32>| -> Res<Check> { Ok(check_relative(&f64s(o)?, &reference, bound)) };
        let (r32, c32) = (nr as i32, nc as i32);
        for cfg in workloads::row_sweep(nr, nc) {
            let grid = rows_grid(nr.div_ceil(cfg.get("ROWS") as usize), cfg.num_warps);
            let id = (name, "f32", cfg_str(&cfg));
            dispatch!(cfg.get("ROWS"), [1, 2, 4, 8], |R| dispatch!(cfg.get("BLOCK"), [128, 4096], |B| row_case(
                &t,
                (id.0, id.1, &id.2),
                bytes,
                &mut dout,
                chk,
                |o| softmax::<f32, R, B>::launch(&rt, grid, &dx, o, r32, c32, c32)
            )))
            .flatten()
            .ok_or(no_config)??;
        }
        let cfg = softmax_tuned(&rt, &dx, &mut dout, r32, c32, c32)?;
        let tuned = format!("{name}_tuned");
        row_case(&t, (&tuned, "f32", &cfg_str(&cfg)), bytes, &mut dout, chk, |o| tuned_launch("softmax_tuned", softmax_tuned(&rt, &dx, o, r32, c32, c32)))?;
        // The same softmax written as a graph (`x.softmax(-1)`): the fuser's rows kernel.
        let g = Graph::new();
        g.output("y", g.input("x", DType::F32, &[nr, nc]).softmax(-1))?;
        let mut plan = g.compile(&rt)?;
        let graph_name = format!("graph_{name}");
        row_case(&t, (&graph_name, "f32", "fuser rows kernel"), bytes, &mut dout, chk, |o| graph_launch(&rt, &mut plan, &[(&dx).into()], o))?;
        // And compiled with `Options::tune`: the rows a program and warps autotuned.
        let mut plan = g.compile_with(&rt, &kernels_lib::graph::Options { tune: true, ..Default::default() })?;
        graph_launch(&rt, &mut plan, &[(&dx).into()], &mut dout)?;
        let graph_tuned = format!("graph_{name}_tuned");
        row_case(&t, (&graph_tuned, "f32", &plan_tuned(&plan)), bytes, &mut dout, chk, |o| graph_launch(&rt, &mut plan, &[(&dx).into()], o))?;
    }

    // Softmax bf16 (f32 math), one row per program, with and without the bounds guard.
    let (nr, nc) = SOFTMAX;
    let x: Vec<f32> = (0..nr * nc).map(|_| next()).collect();
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let xb64: Vec<f64> = xb.iter().map(|v| v.to_f64()).collect();
    let reference = workloads::softmax_rows(&xb64, nc);
    let bound = softmax_bound(nc, true);
    let (dx, mut dout) = (rt.upload(&xb)?, rt.zeros::<bf16>(nr * nc)?);
    let chk = |o: &Buffer<bf16>| -> Res<Check> { Ok(check_relative(&f64s(o)?, &reference, bound)) };
    let bytes = 2 * nr * nc * 2;
    for cfg in one_row_sweep(nr, nc) {
        let grid = rows_grid(nr, cfg.num_warps);
        let id = cfg_str(&cfg);
        row_case(&t, ("softmax", "bf16", &id), bytes, &mut dout, chk, |o| softmax::<bf16, 1, 4096>::launch(&rt, grid, &dx, o, nr as i32, nc as i32, nc as i32))?;
        // SAFETY: one program per row, each touching columns < n_cols of its own row.
        // SAFETY (launch_unchecked): the grid has one program per row and the kernel masks
        // columns by `nc`, so every enabled lane is inside `dx` and `o` (rows x nc each).
        row_case(&t, ("softmax_unchecked", "bf16", &id), bytes, &mut dout, chk, |o| unsafe { softmax::<bf16, 1, 4096>::launch_unchecked(&rt, grid, &dx, o, nr as i32, nc as i32, nc as i32) })?;
    }

    // RMSNorm bf16: every candidate of the autotuner, with and without the bounds guard,
    // then the tuned launch.
    let (nr, nc) = RMSNORM;
    let w: Vec<bf16> = (0..nc).map(|_| bf16::from_f32(next())).collect();
    let w64: Vec<f64> = w.iter().map(|v| v.to_f64()).collect();
    let reference = workloads::rmsnorm_rows(&xb64, &w64, 1e-6);
    let bound = rmsnorm_bound(nc);
    let dw = rt.upload(&w)?;
    let chk = |o: &Buffer<bf16>| -> Res<Check> { Ok(check_relative(&f64s(o)?, &reference, bound)) };
    let bytes = 2 * nr * nc * 2 + nc * 2;
    let (r32, c32) = (nr as i32, nc as i32);
    for cfg in workloads::row_sweep(nr, nc) {
        let grid = rows_grid(nr.div_ceil(cfg.get("ROWS") as usize), cfg.num_warps);
        let id = cfg_str(&cfg);
        dispatch!(cfg.get("ROWS"), [1, 2, 4, 8], |R| {
            row_case(&t, ("rmsnorm", "bf16", &id), bytes, &mut dout, chk, |o| rmsnorm_bf16::<R, 4096>::launch(&rt, grid, &dx, &dw, o, r32, c32, c32, 1e-6))?;
            // SAFETY: rows past n_rows touch no column (their limit is 0); each row touches
            // columns < n_cols of itself and of the weights.
            row_case(&t, ("rmsnorm_unchecked", "bf16", &id), bytes, &mut dout, chk, |o| unsafe {
                rmsnorm_bf16::<R, 4096>::launch_unchecked(&rt, grid, &dx, &dw, o, r32, c32, c32, 1e-6)
            })
        })
        .ok_or(no_config)??;
    }
    let cfg = rmsnorm_bf16_tuned(&rt, &dx, &dw, &mut dout, r32, c32, c32, 1e-6)?;
    row_case(&t, ("rmsnorm_tuned", "bf16", &cfg_str(&cfg)), bytes, &mut dout, chk, |o| {
        tuned_launch("rmsnorm_bf16_tuned", rmsnorm_bf16_tuned(&rt, &dx, &dw, o, r32, c32, c32, 1e-6))
    })?;
    // The same RMSNorm written as a graph (`x.rms_norm(Some(w), 1e-6)`, f32 math).
    let g = Graph::new();
    let (gx, gw) = (g.input("x", DType::BF16, &[nr, nc]), g.input("w", DType::BF16, &[nc]));
    g.output("y", gx.rms_norm(Some(gw), 1e-6))?;
    let mut plan = g.compile(&rt)?;
    row_case(&t, ("graph_rmsnorm", "bf16", "fuser rows kernel"), bytes, &mut dout, chk, |o| graph_launch(&rt, &mut plan, &[(&dx).into(), (&dw).into()], o))?;
    let mut plan = g.compile_with(&rt, &kernels_lib::graph::Options { tune: true, ..Default::default() })?;
    graph_launch(&rt, &mut plan, &[(&dx).into(), (&dw).into()], &mut dout)?;
    row_case(&t, ("graph_rmsnorm_tuned", "bf16", &plan_tuned(&plan)), bytes, &mut dout, chk, |o| graph_launch(&rt, &mut plan, &[(&dx).into(), (&dw).into()], o))?;
    drop((dx, dout, dw));
    shared_value(&rt, &t)?;

    // Transpose f32 8192 x 8192: every element must be the one it came from.
    let timer50 = timer(c, 50);
    let n = TRANSPOSE;
    let xt: Vec<f32> = (0..n * n).map(|_| next()).collect();
    let (dx, mut dout) = (rt.upload(&xt)?, rt.zeros::<f32>(n * n)?);
    let chk = |o: &Buffer<f32>| -> Res<Check> {
        let got = o.to_vec()?;
        let mut e = ErrorStats::default();
        for (k, &v) in xt.iter().enumerate() {
            // x[i][j] = xt[i n + j] lands at out[j][i].
            e.push(got[(k % n) * n + k / n] as f64, v as f64, (v as f64).abs());
        }
        Ok(e.judge(0.0))
    };
    for (tile, warps) in TRANSPOSE_CONFIGS {
        let grid = LaunchConfig::grid3(n.div_ceil(tile) as u32, n.div_ceil(tile) as u32, 1).warps(warps);
        let id = format!("TILE={tile} warps={warps}");
        dispatch!(tile as i64, [32, 64], |T| row_case(&timer50, ("transpose", "f32", &id), 2 * n * n * 4, &mut dout, chk, |o| transpose::<T>::launch(&rt, grid, &dx, o, n as i32, n as i32)))
            .ok_or(no_config)??;
    }
    Ok(())
}

/// Uniform values in [lo, hi) from a xorshift generator (fast enough for 2^28 elements).
fn xorshift_fill(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut r = seed | 1;
    (0..n)
        .map(|_| {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            lo + (hi - lo) * ((r >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

fn tune() -> Res<()> {
    use kernels_lib::tuned;
    let rt = Runtime::Cuda(cuda()?);
    let Runtime::Cuda(cu) = &rt else { unreachable!() };
    let t = timer(cu, 50);
    let seed = examples::seed()?;
    let default = tuned::default_config();
    for kernel in ["relu_mul_add", "sum_f32"] {
        for log2 in (12..=28).step_by(2) {
            let n = 1usize << log2;
            let (lo, hi) = if kernel == "sum_f32" { (0.0, 1.0) } else { (-4.0, 4.0) };
            let ha = xorshift_fill(n, seed + log2 as u64, lo, hi);
            let a = rt.upload(&ha)?;
            let (b, cc) = if kernel == "sum_f32" { (rt.zeros::<f32>(1)?, rt.zeros::<f32>(1)?) } else { (rt.upload(&xorshift_fill(n, seed + 100, -4.0, 4.0))?, rt.upload(&xorshift_fill(n, seed + 200, -4.0, 4.0))?) };
            let mut out = rt.upload(&vec![if kernel == "sum_f32" { 0.0 } else { f32::NAN }; if kernel == "sum_f32" { 1 } else { n }])?;
            // First launch for this size: tunes (compiles, checks and times every candidate).
            let t0 = Instant::now();
            let cfg = if kernel == "sum_f32" {
                kernels_lib::sum_f32_tuned(&rt, &a, &mut out, n as i32)?
            } else {
                kernels_lib::relu_mul_add_tuned(&rt, &a, &b, &cc, &mut out, n as i32)?
            };
            rt.synchronize()?;
            let sweep_s = t0.elapsed().as_secs_f64();
            // The tuned launch left one launch's result: check it, every element.
            let got = out.to_vec()?;
            let check = if kernel == "sum_f32" {
                let want: f64 = ha.iter().map(|&v| v as f64).sum();
                let mut e = ErrorStats::default();
                e.push(got[0] as f64, want, want);
                e.judge(workloads::sum_bound(n, cfg.get("BLOCK") as usize, cfg.num_warps as usize))
            } else {
                let (hb, hc) = (b.to_vec()?, cc.to_vec()?);
                let mut e = ErrorStats::default();
                for i in 0..n {
                    let (p, c) = ((ha[i] as f64).max(0.0) * hb[i] as f64, hc[i] as f64);
                    e.push(got[i] as f64, p + c, p.abs() + c.abs());
                }
                e.judge(workloads::suite_bound("relu_mul_add", "f32"))
            };
            if !check.passed() {
                check_failed("tune", kernel, Some(&format!("n={n} {cfg}")), &check.to_string());
                continue;
            }
            let mut time = |cfg: &autotune::Config| -> Res<Timing> { timed(&t, || tuned::with_config(&rt, cfg, kernel, &a, &b, &cc, &mut out).expect("a listed block")) };
            let (d, tu) = (time(&default)?, time(&cfg)?);
            let bytes = if kernel == "sum_f32" { 4 * n } else { 16 * n };
            println!(
                "{{\"bench\":\"tune\",\"kernel\":\"{kernel}\",\"n\":{n},\"default\":\"{default}\",{},\"tuned\":\"{cfg}\",{},\"speedup\":{:.3},\"tuned_gbs\":{:.1},\"sweep_s\":{sweep_s:.3},\"rel_err\":{:e},\"max_rel\":{:e},\"bound\":{:e}}}",
                d.json("default_"),
                tu.json("tuned_"),
                d.median() / tu.median(),
                bytes as f64 / tu.median() / 1e6,
                check.rel_l2,
                check.max_rel,
                check.bound
            );
        }
    }
    Ok(())
}

/// One row of `bench matmul` besides the tuned launch: `launch` into the poisoned `out`,
/// checked by `judge` (on the output as f32), then timed and printed with `fields` (impl,
/// config and any more JSON fields) for `product` (dtype, m, n, k, seed). A launch or a
/// check that fails is reported (`id` names the row), and the other rows still run.
fn matmul_row<O: dsl_runtime::dsl::Float>(
    t: &CudaTimer,
    (dtype, m, n, k, seed): (&str, usize, usize, usize, u64),
    out: &mut Buffer<O>,
    (fields, id): (String, String),
    judge: &dyn Fn(&[f32]) -> Check,
    launch: &mut dyn FnMut(&mut Buffer<O>) -> dsl_runtime::Result<()>,
) -> Res<()> {
    poison(out)?;
    if let Err(e) = launch(out) {
        check_failed("matmul", dtype, Some(&format!("m={m} n={n} k={k} {id}")), &format!("launch failed: {e}"));
        return Ok(());
    }
    let got: Vec<f32> = out.to_vec()?.iter().map(|x| x.to_f64() as f32).collect();
    let check = judge(&got);
    if !check.passed() {
        check_failed("matmul", dtype, Some(&format!("m={m} n={n} k={k} {id}")), &format!("{check} (seed {seed})"));
        return Ok(());
    }
    let tm = timed(t, || launch(out))?;
    let flops = 2.0 * (m * n * k) as f64;
    println!(
        "{{\"bench\":\"matmul\",{fields},\"dtype\":\"{dtype}\",\"m\":{m},\"n\":{n},\"k\":{k},{},\"tflops\":{:.1},\"max_rel\":{:e},\"bound\":{:e}}}",
        tm.json(""),
        flops / tm.median() / 1e9,
        check.max_rel,
        check.bound
    );
    Ok(())
}

/// `matmul_tuned` on every shape of [`MATMUL_SHAPES`] in bf16 and f16 (row-major operands,
/// f32 output): the first launch tunes (its wall time is the sweep's), the tuned launch is
/// then checked and timed. The check compares 4096 sampled elements and the last row and
/// column (the masked edges) with an f64 reference of the rounded inputs, against
/// [`workloads::matmul_bound`].
fn matmul() -> Res<()> {
    use half::{bf16, f16};
    let rt = Runtime::Cuda(cuda()?);
    let Runtime::Cuda(cu) = &rt else { unreachable!() };
    let t = timer(cu, 20);
    let seed = examples::seed()?;
    fn one<T: dsl_runtime::dsl::Float>(rt: &Runtime, t: &CudaTimer, (m, n, k): (usize, usize, usize), seed: u64, dtype: &str, bound: f64) -> Res<()> {
        let round = |v: Vec<f32>| v.into_iter().map(|x| T::from_f64(x as f64)).collect::<Vec<T>>();
        let (ha, hb) = (round(xorshift_fill(m * k, seed, -1.0, 1.0)), round(xorshift_fill(k * n, seed + 1, -1.0, 1.0)));
        let (da, db) = (rt.upload(&ha)?, rt.upload(&hb)?);
        let mut dc = rt.upload(&vec![f32::NAN; m * n])?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let t0 = Instant::now();
        let cfg = kernels_lib::matmul_tuned(rt, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, ni, 1)?;
        rt.synchronize()?;
        let sweep_s = t0.elapsed().as_secs_f64();
        let (a64, b64): (Vec<f64>, Vec<f64>) = (ha.iter().map(|x| x.to_f64()).collect(), hb.iter().map(|x| x.to_f64()).collect());
        let picks = matmul_picks(m, n, seed);
        let judge_within = |got: &[f32], bound: f64| {
            let mut e = ErrorStats::default();
            for &(i, j) in &picks {
                let (mut want, mut scale) = (0.0, 0.0);
                for p in 0..k {
                    let x = a64[i * k + p] * b64[p * n + j];
                    want += x;
                    scale += x.abs();
                }
                e.push(got[i * n + j] as f64, want, scale);
            }
            e.judge(bound)
        };
        let judge = |got: &[f32]| judge_within(got, bound);
        let check = judge(&dc.to_vec()?);
        let id = format!("m={m} n={n} k={k} {cfg}");
        if !check.passed() {
            check_failed("matmul", dtype, Some(&id), &format!("{check} (seed {seed})"));
            return Ok(());
        }
        let tm = timed(t, || tuned_launch("matmul_tuned", kernels_lib::matmul_tuned(rt, &da, &db, &mut dc, mi, ni, ki, ki, 1, ni, 1, ni, 1)))?;
        let flops = 2.0 * (m * n * k) as f64;
        println!(
            "{{\"bench\":\"matmul\",\"impl\":\"ours\",\"dtype\":\"{dtype}\",\"m\":{m},\"n\":{n},\"k\":{k},\"config\":\"{cfg}\",{},\"tflops\":{:.1},\"sweep_s\":{sweep_s:.3},\"rel_err\":{:e},\"max_rel\":{:e},\"bound\":{:e}}}",
            tm.json(""),
            flops / tm.median() / 1e9,
            check.rel_l2,
            check.max_rel,
            check.bound
        );
        // One row of another launch of the same product (`fields`: its impl, config and
        // any more JSON fields): into the poisoned `dc`, checked as above, then timed. A
        // launch that fails is reported like a failed check, and the others still run.
        let product = (dtype, m, n, k, seed);
        let mut other_row = |fields: String, id: String, launch: &mut dyn FnMut(&mut Buffer<f32>) -> dsl_runtime::Result<()>| matmul_row(t, product, &mut dc, (fields, id), &judge, launch);
        // Split-K (`matmul_split_k`) where its planner cuts K (the small-M shapes), at
        // every slice count it could take, its pick marked (`"planned"`).
        let Runtime::Cuda(c) = rt else { unreachable!() };
        let planned = kernels_lib::split_k_splits(m, n, k, c.sm_count() as usize);
        for splits in [2, 4, 8, 16].into_iter().filter(|&s| planned > 1 && kernels_lib::split_k_fits(k, s)) {
            let mut ws = rt.zeros::<f32>(splits * m * n)?;
            let name = if splits == planned { "ours-split-k" } else { "ours-split-k-other" };
            let fields = format!("\"impl\":\"{name}\",\"config\":\"split_k={splits}\",\"planned\":{}", splits == planned);
            other_row(fields, format!("split_k={splits}"), &mut |dc| kernels_lib::matmul_split_k(rt, &da, &db, dc, &mut ws, mi, ni, ki, ki, 1, ni, 1, ni, 1, splits))?;
        }
        // The sm_80 path forced (`LaunchConfig::wgmma(false)`: `mma.sync` fed by `ldmatrix`,
        // `cp.async` pipeline) on the large 16-bit squares, over the tiles that won there
        // before wgmma (each side's best against Triton's mma.sync path, `DISABLE_MMA_V3=1`).
        if std::mem::size_of::<T>() == 2 && m == n && m == k && m >= 2048 {
            macro_rules! mma_sync {
                ($bm:literal, $bn:literal, $bk:literal, $w:literal, $st:literal) => {{
                    let grid = LaunchConfig::grid((m.div_ceil($bm) * n.div_ceil($bn)) as u32).warps($w).stages($st).wgmma(false);
                    let config = format!("BM={} BN={} BK={} warps={} stages={}", $bm, $bn, $bk, $w, $st);
                    other_row(format!("\"impl\":\"ours-mma-sync\",\"config\":\"{config}\""), format!("mma.sync {config}"), &mut |dc| kernels_lib::matmul::<T, f32, $bm, $bn, $bk, 8>::launch(rt, grid, &da, &db, dc, mi, ni, ki, ki, 1, ni, 1, ni, 1))?;
                }};
            }
            mma_sync!(128, 128, 32, 4, 3);
            mma_sync!(128, 128, 32, 4, 4);
            mma_sync!(128, 256, 32, 8, 3);
            mma_sync!(128, 256, 32, 8, 4);
            mma_sync!(128, 128, 64, 4, 3);
        }
        // f32 (tf32) on the large squares: the tiles around the tuner's, on sm_90a
        // `wgmma` (b N-contiguous: `cᵀ = bᵀ aᵀ`, bᵀ from registers) and forced `mma.sync`.
        if std::mem::size_of::<T>() == 4 && m == n && m == k && m >= 2048 {
            macro_rules! fixed {
                ($bm:literal, $bn:literal, $bk:literal, $w:literal, $st:literal, $wgmma:expr) => {{
                    let grid = LaunchConfig::grid((m.div_ceil($bm) * n.div_ceil($bn)) as u32).warps($w).stages($st).wgmma($wgmma);
                    let config = format!("BM={} BN={} BK={} warps={} stages={}{}", $bm, $bn, $bk, $w, $st, if $wgmma { "" } else { " mma.sync" });
                    other_row(format!("\"impl\":\"ours-fixed\",\"config\":\"{config}\""), config.clone(), &mut |dc| kernels_lib::matmul::<T, f32, $bm, $bn, $bk, 8>::launch(rt, grid, &da, &db, dc, mi, ni, ki, ki, 1, ni, 1, ni, 1))?;
                }};
            }
            fixed!(128, 128, 32, 4, 3, true);
            fixed!(128, 128, 32, 4, 4, true);
            fixed!(128, 64, 32, 4, 3, true);
            fixed!(64, 128, 32, 4, 3, true);
            fixed!(64, 64, 32, 4, 3, true);
            fixed!(128, 128, 32, 8, 3, true);
            fixed!(128, 256, 32, 8, 3, true);
            fixed!(128, 64, 32, 4, 1, true);
            fixed!(128, 64, 32, 4, 3, false);
            fixed!(128, 64, 32, 4, 1, false);
        }
        // The widest tile at 3 and 4 stages, warp-specialized (`LaunchConfig::warp_specialize`)
        // and not, its output stored by TMA (`LaunchConfig::tma_store`) and not, on the large
        // 16-bit shapes.
        if std::mem::size_of::<T>() == 2 && m.min(n).min(k) >= 4096 {
            for stages in [3u32, 4] {
                for (ws, tma_store) in [(false, false), (true, false), (false, true), (true, true)] {
                    let grid = LaunchConfig::grid((m.div_ceil(128) * n.div_ceil(256)) as u32).warps(8).stages(stages).warp_specialize(ws).tma_store(tma_store);
                    let fields = format!("\"impl\":\"ours-fixed\",\"config\":\"BM=128 BN=256 BK=64 w8 s{stages}\",\"ws\":{ws},\"tma_store\":{tma_store}");
                    other_row(fields, format!("128x256x64 w8 s{stages} ws={ws} tma_store={tma_store}"), &mut |dc| kernels_lib::matmul::<T, f32, 128, 256, 64, 8>::launch(rt, grid, &da, &db, dc, mi, ni, ki, ki, 1, ni, 1, ni, 1))?;
                }
                // The same tile on a persistent grid (`matmul_persistent`): one program an SM
                // (the tile's ring takes more than half an SM's shared memory), each looping
                // over its tiles in the grouped order.
                let programs = (c.sm_count() as usize).min(m.div_ceil(128) * n.div_ceil(256)) as u32;
                let grid = LaunchConfig::grid(programs).warps(8).stages(stages);
                let fields = format!("\"impl\":\"ours-persistent\",\"config\":\"BM=128 BN=256 BK=64 w8 s{stages} programs={programs}\"");
                other_row(fields, format!("128x256x64 w8 s{stages} persistent"), &mut |dc| kernels_lib::matmul_persistent::<T, f32, 128, 256, 64, 8>::launch(rt, grid, &da, &db, dc, mi, ni, ki, ki, 1, ni, 1, ni, 1))?;
            }
            // 16-bit output, as `torch.matmul`'s (the anchors' "torch" rows): the tuned launch
            // (its own tuner: the output type is part of the instantiation) and the widest
            // tile with and without TMA stores, into a `T` buffer, the bound widened by the
            // output's rounding (a unit of `T` of the result, at most of the terms' sum).
            let unit = if T::DTYPE == dsl_runtime::DType::BF16 { 2f64.powi(-8) } else { 2f64.powi(-11) };
            let mut dc16 = rt.upload(&vec![T::from_f64(f64::NAN); m * n])?;
            // (Tuned first, so that the row's fields name the pick.)
            let pick = match kernels_lib::matmul_tuned(rt, &da, &db, &mut dc16, mi, ni, ki, ki, 1, ni, 1, ni, 1) {
                Ok(c) => c.to_string(),
                Err(e) => {
                    check_failed("matmul", dtype, Some(&format!("m={m} n={n} k={k} tuned, 16-bit out")), &format!("tuning failed: {e}"));
                    String::new()
                }
            };
            let judge16 = |got: &[f32]| judge_within(got, bound + unit);
            let mut row16 = |fields: String, id: String, launch: &mut dyn FnMut(&mut Buffer<T>) -> dsl_runtime::Result<()>| matmul_row(t, product, &mut dc16, (format!("{fields},\"out\":\"input type\""), id), &judge16, launch);
            if !pick.is_empty() {
                row16(format!("\"impl\":\"ours-16-out\",\"config\":\"{pick}\""), "tuned, 16-bit out".into(), &mut |dc| tuned_launch("matmul_tuned", kernels_lib::matmul_tuned(rt, &da, &db, dc, mi, ni, ki, ki, 1, ni, 1, ni, 1)))?;
            }
            for (stages, ws) in [(3u32, false), (3, true), (4, true)] {
                for tma_store in [false, true] {
                    let grid = LaunchConfig::grid((m.div_ceil(128) * n.div_ceil(256)) as u32).warps(8).stages(stages).warp_specialize(ws).tma_store(tma_store);
                    let fields = format!("\"impl\":\"ours-fixed-16-out\",\"config\":\"BM=128 BN=256 BK=64 w8 s{stages}\",\"ws\":{ws},\"tma_store\":{tma_store}");
                    row16(fields, format!("128x256x64 w8 s{stages} ws={ws} tma_store={tma_store}, 16-bit out"), &mut |dc| kernels_lib::matmul::<T, T, 128, 256, 64, 8>::launch(rt, grid, &da, &db, dc, mi, ni, ki, ki, 1, ni, 1, ni, 1))?;
                }
            }
        }
        Ok(())
    }
    // `BENCH_MATMUL`: only the listed shapes (and dtypes).
    let only = std::env::var("BENCH_MATMUL").ok();
    let want = |(m, n, k): (usize, usize, usize), dtype: &str| {
        only.as_deref().is_none_or(|o| o.split(',').any(|w| {
            let (shape, ty) = w.trim().split_once(':').unwrap_or((w.trim(), dtype));
            shape == format!("{m}x{n}x{k}") && ty == dtype
        }))
    };
    for shape in MATMUL_SHAPES {
        if want(shape, "bf16") {
            one::<bf16>(&rt, &t, shape, seed, "bf16", workloads::matmul_bound(shape.2))?;
        }
        if want(shape, "f16") {
            one::<f16>(&rt, &t, shape, seed + 7, "f16", workloads::matmul_bound(shape.2))?;
        }
        // f32 inputs at tf32 (`dot`'s default), up to 4096 per dimension.
        if shape.0.max(shape.1).max(shape.2) <= 4096 && want(shape, "f32") {
            one::<f32>(&rt, &t, shape, seed + 11, "f32", workloads::matmul_bound_tf32(shape.2))?;
        }
    }
    Ok(())
}
