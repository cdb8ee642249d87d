"""Anchors for the benchmark suite, measured in the same run as ours.

  python3 bench/anchors.py suite SPEC       copy bandwidth and bf16 matmul (torch), then every
                                            workload of examples/src/workloads.rs in Triton,
                                            PyTorch eager and torch.compile
  python3 bench/anchors.py coldstart SPEC   Triton and torch.compile first call, cold and warm
                                            cache (new processes)
  python3 bench/anchors.py launch           host time per launch: Triton and PyTorch eager
  python3 bench/anchors.py matmul SPEC      matmul bf16/f16 (and f32 at tf32 up to 4096) on the shapes of `bench spec`: cuBLAS
                                            (torch.matmul, bf16/f16 out, and torch.mm with an f32
                                            out_dtype where torch has it) and Triton's tutorial
                                            matmul autotuned over its own configurations (f32 out)
  python3 bench/anchors.py attention SPEC   flash attention bf16 on the shapes of `bench spec`,
                                            forward and backward: torch SDPA (enable_gqa) as
                                            dispatched and restricted to its FlashAttention-2 and
                                            cuDNN backends, the seed's math (repeat_interleave,
                                            softmax) in eager and under torch.compile, and
                                            (forward) Triton's tutorial kernel, autotuned
  python3 bench/anchors.py flex SPEC        FlexAttention (compiled flex_attention, GQA) with the score
                                            modifications of `bench score_mod` at the seed shape, forward
                                            and forward + backward; SDPA for the unmodified rows
  python3 bench/anchors.py block            the seed's attention block forward and backward (bf16; f32 with
                                            TF32), eager, torch.compile, and with SDPA: the
                                            gqa_attention example's work and protocol
  python3 bench/anchors.py rows SPEC        softmax f32/bf16 (4096 x 4096) and f32 on short rows
                                            (32768 x 128), RMSNorm bf16 (4096 x 4096), transpose f32
                                            (8192 x 8192): Triton and PyTorch

SPEC is the output of `bench spec` (our bench binary; run_gpu.sh writes it first): the bound of
every check and the row benchmarks' shapes and configurations, so that both sides check against
the same bounds and sweep the same spaces.

Prints one JSON object per line.

Checks: every output that is timed (Triton's, PyTorch eager's and torch.compile's) is first
produced once (Triton's into a NaN-poisoned buffer) and compared, every element, with a float64
reference computed on the GPU from the same inputs, elementwise and in relative L2, against the
bound ours uses (examples/src/workloads.rs documents the bounds).

Timing: triton.testing.do_bench (CUDA events, L2 flushed before each launch, median), repeated
BENCH_REPEATS times (default 5) in this process; each row reports the median of the repeats as
`ms`, their range as `ms_min`/`ms_max` and all of them as `runs`, as ours does.

Inputs are uniform in [-4, 4), as ours.
"""
import json, os, statistics, subprocess, sys, tempfile, time

import torch
import triton
import triton.language as tl

REPEATS = max(1, int(os.environ.get("BENCH_REPEATS", "5")))
COLD_REPEATS = max(1, int(os.environ.get("BENCH_COLD_REPEATS", "3")))
NAN = float("nan")


def emit(**kw):
    print(json.dumps(kw), flush=True)


def load_spec(path):
    """Bounds by (bench, dtype), row shapes and configurations by (bench, dtype), and the warps
    Triton's softmax sweeps."""
    bounds, rows, warps = {}, {}, None
    for line in open(path):
        if not line.strip().startswith("{"):
            continue
        s = json.loads(line)
        if s["spec"] == "bound":
            bounds[(s["bench"], s["dtype"])] = s["bound"]
        elif s["spec"] == "rows":
            rows[(s["bench"], s["dtype"])] = s
        elif s["spec"] == "triton_softmax_warps":
            warps = s["warps"]
    return bounds, rows, warps


def spec_arg():
    path = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("BENCH_SPEC")
    if not path or not os.path.exists(path):
        raise SystemExit("anchors.py: give the output of `bench spec` (bash .gpu/run bench spec > spec.jsonl) as the second argument")
    return load_spec(path)


def check(out, ref, scale, bound, what):
    """Every element within `bound` times its scale, and the relative L2 error within `bound`
    (examples/src/workloads.rs, `check`); raise otherwise. Returns the two measures."""
    if isinstance(out, (tuple, list)):
        out = torch.cat([t.double().flatten() for t in out])
    out, ref, scale = out.double().flatten(), ref.double().flatten(), scale.double().flatten()
    assert out.numel() == ref.numel() == scale.numel(), (what, out.numel(), ref.numel())
    if torch.isnan(out).any():
        raise AssertionError(f"{what}: NaN in the output (an element left unwritten?)")
    err = torch.where(out == ref, torch.zeros_like(out), (out - ref).abs())
    ratio = torch.where(err == 0, torch.zeros_like(err), torch.where(scale > 0, err / scale, torch.full_like(err, float("inf"))))
    max_rel, worst = ratio.max().item(), int(ratio.argmax().item())
    l2 = (err.norm() / scale.norm().clamp_min(1e-300)).item()
    if not (max_rel <= bound and l2 <= bound):
        raise AssertionError(f"{what}: largest error {max_rel:.3e} x scale at element {worst} of {out.numel()}, relative L2 {l2:.3e}, bound {bound:.3e}")
    return dict(rel_err=l2, max_rel=max_rel, bound=bound)


FAILED = []


def guarded(bench, impl, dtype, config, run_check):
    """`run_check()`, or, when its check fails or it does not run (an anchor's compiler
    failing on a shape), a `check_failed` row instead of a timed one (so one failure does
    not hide the rest of the run; the script exits with an error at the end)."""
    try:
        return run_check()
    except AssertionError as e:
        FAILED.append(f"{bench} {dtype} {impl} {config or ''}: {e}")
        emit(bench=bench, impl=impl, dtype=dtype, **({"config": config} if config else {}), check_failed=str(e))
        print(f"check failed: {FAILED[-1]}", file=sys.stderr)
        return None
    except Exception as e:  # the anchor did not run at all (a compile error): a failed row, the rest goes on
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        FAILED.append(f"{bench} {dtype} {impl} {config or ''}: did not run: {type(e).__name__}: {first}")
        emit(bench=bench, impl=impl, dtype=dtype, **({"config": config} if config else {}), check_failed=f"did not run: {type(e).__name__}: {first}")
        print(f"check failed: {FAILED[-1]}", file=sys.stderr)
        return None


def timed(fn):
    runs = [triton.testing.do_bench(fn, warmup=50, rep=500, return_mode="median") for _ in range(REPEATS)]
    return dict(ms=statistics.median(runs), ms_min=min(runs), ms_max=max(runs), runs=runs)


def timed_graph(fn):
    """Device time alone, the way ours is timed (the L2 cache flushed before each call): the
    flush and `fn` captured in a CUDA graph and replayed (triton.testing.do_bench_cudagraph,
    median), less the flush alone timed the same way; repeated as `timed`. The host's time per
    call (dynamo's guards, Python, autograd) does not count. `timer` says which timer gave the
    row: "cuda_graph", or "events" (`timed`) where capture fails."""
    flush = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")

    def with_flush():
        flush.zero_()
        fn()

    try:
        runs = []
        for _ in range(REPEATS):
            both = triton.testing.do_bench_cudagraph(with_flush, rep=100, return_mode="median")
            alone = triton.testing.do_bench_cudagraph(flush.zero_, rep=100, return_mode="median")
            runs.append(both - alone)
    except Exception as e:  # a capture the implementation does not allow
        print(f"cuda graph capture failed ({e}); timed with events", file=sys.stderr)
        return dict(timed(fn), timer="events")
    return dict(ms=statistics.median(runs), ms_min=min(runs), ms_max=max(runs), runs=runs, timer="cuda_graph")


def timed_profiled(fn, calls=20):
    """Device time alone where a CUDA graph cannot capture `fn`: `calls` pairs (L2 flush,
    `fn`) under torch's profiler, the durations of the device's kernels and memsets summed,
    the flush's own kernel (an int fill) left out, per call; repeated as `timed`. Like the
    graph, it counts no host time and no gap between launches."""
    from torch.profiler import ProfilerActivity, profile
    flush = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(REPEATS):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                flush.zero_()
                fn()
            torch.cuda.synchronize()
        us = sum(e.self_device_time_total for e in prof.key_averages() if "FillFunctor<int>" not in e.key)
        runs.append(us / 1e3 / calls)
    return dict(ms=statistics.median(runs), ms_min=min(runs), ms_max=max(runs), runs=runs, timer="profiler")


def row(bench, impl, dtype, nbytes, t, chk=None, **kw):
    emit(bench=bench, impl=impl, dtype=dtype, bytes=nbytes, **t, gbs=nbytes / t["ms"] / 1e6, **(chk or {}), **kw)


def uniform(shape, dtype=torch.float32):
    return torch.empty(shape, device="cuda", dtype=torch.float32).uniform_(-4, 4).to(dtype)


# ---------------------------------------------------------------------------------------------
# Elementwise workloads.


@triton.jit
def relu_mul_add_kernel(a, b, c, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(a + offs, mask=mask, other=0.0)
    y = tl.maximum(x, 0.0) * tl.load(b + offs, mask=mask, other=0.0) + tl.load(c + offs, mask=mask, other=0.0)
    tl.store(out + offs, y, mask=mask)


def triton_rma(a, b, c, out, block=1024, warps=4):
    n = a.numel()
    relu_mul_add_kernel[(triton.cdiv(n, block),)](a, b, c, out, n, BLOCK=block, num_warps=warps)


@triton.jit
def seed_relu_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    r = tl.maximum(tl.load(x + offs, mask=mask, other=0.0), 0.0)
    tl.store(out + offs, r + r * 2.0, mask=mask)


def seed_relu_torch(x):
    """The fuser's seed as the user writes it: relu(x) + relu(x) * 2."""
    return torch.relu(x) + torch.relu(x) * 2


@triton.jit
def axpy_kernel(x, y, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y + offs, alpha * tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


@triton.jit
def gelu_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask, other=0.0)
    inner = 0.7978845608 * (v + 0.044715 * v * v * v)
    # tanh(z) = 2 sigmoid(2z) - 1 (tl has no tanh outside libdevice)
    t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0
    tl.store(out + offs, 0.5 * v * (1.0 + t), mask=mask)


@triton.jit
def silu_mul_kernel(g, u, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    gv = tl.load(g + offs, mask=mask, other=0.0).to(tl.float32)
    uv = tl.load(u + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + offs, (gv * tl.sigmoid(gv) * uv).to(tl.bfloat16), mask=mask)


@triton.jit
def cast_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask).to(out.dtype.element_ty), mask=mask)


@triton.jit
def scale_shift_kernel(x, out, s, t, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + offs, (v * s + t).to(tl.float16), mask=mask)


@triton.jit
def clamp_kernel(x, out, flags, lo, hi, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask)
    c = tl.minimum(tl.maximum(v, lo), hi)
    tl.store(out + offs, c, mask=mask)
    tl.store(flags + offs, (v != c).to(tl.uint8), mask=mask)


def grid(n, block):
    return (triton.cdiv(n, block),)


def gelu_ref(v):
    return 0.5 * v * (1.0 + torch.tanh(0.7978845608 * (v + 0.044715 * v * v * v)))


def workloads(n):
    """Each workload: name, dtype, bytes, the Triton launch and the buffers it writes, the torch
    function (returns its output), an optional reset of in-place inputs, and a function giving
    the float64 reference and the scale of each element (the size of the terms it adds up, as
    in examples/src/workloads.rs)."""
    a, b, c = uniform(n), uniform(n), uniform(n)
    ha, hb, hc = a.bfloat16(), b.bfloat16(), c.bfloat16()
    o32, o16 = torch.empty(n, device="cuda"), torch.empty(n, device="cuda", dtype=torch.bfloat16)
    y = b.clone()
    hh = a.half()
    o_h = torch.empty(n, device="cuda", dtype=torch.float16)
    xi = (a * 100).int()
    o_i, o_f = torch.empty_like(xi), torch.empty(n, device="cuda", dtype=torch.uint8)
    D = lambda t: t.double()

    def rma_ref(x, u, z):
        p, q = torch.relu(D(x)) * D(u), D(z)
        return p + q, p.abs() + q.abs()

    def single(r):
        return r, r.abs()

    def gelu_terms():
        v = D(c)
        h = 0.5 * v
        t = h * torch.tanh(0.7978845608 * (v + 0.044715 * v * v * v))
        return h + t, h.abs() + t.abs()

    def clamp_torch():
        cl = torch.clamp(xi, -150, 200)
        return cl, (xi != cl).to(torch.uint8)

    def clamp_ref():
        cl = torch.clamp(xi, -150, 200)
        return single(torch.cat([D(cl), D(xi != cl)]))

    W = dict
    return [
        W(name="relu_mul_add", dtype="f32", bytes=16 * n, triton=lambda: triton_rma(a, b, c, o32), outs=(o32,),
          torch=lambda: torch.relu(a) * b + c, ref=lambda: rma_ref(a, b, c)),
        # The fuser's seed (ours: the graph `x.relu() + x.relu() * 2.0` compiled by the fuser).
        W(name="seed_relu", dtype="f32", bytes=8 * n, triton=lambda: seed_relu_kernel[grid(n, 1024)](a, o32, n, BLOCK=1024), outs=(o32,),
          torch=lambda: seed_relu_torch(a), ref=lambda: single(3 * torch.relu(D(a)))),
        W(name="relu_mul_add", dtype="bf16", bytes=8 * n, triton=lambda: triton_rma(ha, hb, hc, o16, 2048), outs=(o16,),
          torch=lambda: torch.relu(ha) * hb + hc, ref=lambda: rma_ref(ha, hb, hc)),
        # In place: y is reset to b before each check. No torch.compile row (the script does not
        # compile in-place updates).
        W(name="axpy", dtype="f32", bytes=12 * n, triton=lambda: axpy_kernel[grid(n, 1024)](a, y, 0.75, n, BLOCK=1024), outs=(y,),
          torch=lambda: y.add_(a, alpha=0.75), reset=lambda: y.copy_(b), compile=False,
          ref=lambda: (0.75 * D(a) + D(b), (0.75 * D(a)).abs() + D(b).abs())),
        W(name="gelu_tanh", dtype="f32", bytes=8 * n, triton=lambda: gelu_kernel[grid(n, 1024)](c, o32, n, BLOCK=1024), outs=(o32,),
          torch=lambda: gelu_ref(c), ref=gelu_terms),
        W(name="silu_mul", dtype="bf16", bytes=6 * n, triton=lambda: silu_mul_kernel[grid(n, 2048)](ha, hb, o16, n, BLOCK=2048), outs=(o16,),
          torch=lambda: torch.nn.functional.silu(ha) * hb, ref=lambda: single(torch.nn.functional.silu(D(ha)) * D(hb))),
        W(name="f32_to_bf16", dtype="f32->bf16", bytes=6 * n, triton=lambda: cast_kernel[grid(n, 2048)](a, o16, n, BLOCK=2048), outs=(o16,),
          torch=lambda: a.bfloat16(), ref=lambda: single(D(a.bfloat16()))),
        W(name="scale_shift", dtype="f16", bytes=4 * n, triton=lambda: scale_shift_kernel[grid(n, 2048)](hh, o_h, 0.5, -1.25, n, BLOCK=2048), outs=(o_h,),
          torch=lambda: (hh.float() * 0.5 - 1.25).half(), ref=lambda: (D(hh) * 0.5 - 1.25, (D(hh) * 0.5).abs() + 1.25)),
        W(name="bf16_to_f32", dtype="bf16->f32", bytes=6 * n, triton=lambda: cast_kernel[grid(n, 2048)](ha, o32, n, BLOCK=2048), outs=(o32,),
          torch=lambda: ha.float(), ref=lambda: single(D(ha))),
        W(name="clamp_i32", dtype="i32", bytes=9 * n, triton=lambda: clamp_kernel[grid(n, 1024)](xi, o_i, o_f, -150, 200, n, BLOCK=1024), outs=(o_i, o_f),
          torch=clamp_torch, ref=clamp_ref),
    ]


def poison(t):
    t.fill_(NAN if t.is_floating_point() else 0x5A)


def suite():
    bounds, _, _ = spec_arg()
    n = 1 << 26
    x = torch.randn(1 << 28, device="cuda")
    yy = torch.empty_like(x)
    t = timed(lambda: yy.copy_(x))
    emit(bench="copy", bytes=2 * x.numel() * 4, **t, gbs=2 * x.numel() * 4 / t["ms"] / 1e6)
    del x, yy
    torch.cuda.empty_cache()
    # bf16 matmul ceiling, for the report header.
    m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: m @ m)
    emit(bench="matmul_bf16_8192", tflops=2 * 8192**3 / t["ms"] / 1e9, **t)
    del m
    for w in workloads(n):
        name, dtype, nbytes = w["name"], w["dtype"], w["bytes"]
        bound = bounds[(name, dtype)]
        reset = w.get("reset", lambda: None)
        ref, scale = w["ref"]()
        # Triton, into poisoned outputs.
        reset()
        if "reset" not in w:  # an in-place workload's output is its input
            for o in w["outs"]:
                poison(o)
        w["triton"]()
        chk = guarded(name, "triton", dtype, None, lambda: check(w["outs"], ref, scale, bound, f"{name} {dtype} triton"))
        if chk:
            row(name, "triton", dtype, nbytes, timed(w["triton"]), chk, n=n)
        # PyTorch eager.
        reset()
        chk = guarded(name, "torch_eager", dtype, None, lambda: check(w["torch"](), ref, scale, bound, f"{name} {dtype} torch eager"))
        if chk:
            row(name, "torch_eager", dtype, nbytes, timed(w["torch"]), chk, n=n)
        if w.get("compile", True):
            cf = torch.compile(w["torch"])
            reset()
            chk = guarded(name, "torch_compile", dtype, None, lambda: check(cf(), ref, scale, bound, f"{name} {dtype} torch.compile"))
            if chk:
                row(name, "torch_compile", dtype, nbytes, timed(cf), chk, n=n)
        del ref, scale
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Row kernels.


@triton.jit
def softmax_persistent_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols, BLOCK_SIZE: tl.constexpr,
                              num_stages: tl.constexpr):
    # Adapted from Triton's fused-softmax tutorial as of Triton 3.x
    # (python/tutorials/02-fused-softmax.py, MIT license, (c) the Triton authors): a persistent
    # grid, each program taking rows `program_id, program_id + num_programs, ...` in a loop
    # software-pipelined over `num_stages`. The only change: the row is converted to f32 after
    # the load and back to the output's type at the store, so that bf16 rows use f32 math (a
    # no-op for f32, the tutorial's case).
    row_start = tl.program_id(0)
    row_step = tl.num_programs(0)
    for row_idx in tl.range(row_start, n_rows, row_step, num_stages=num_stages):
        row_start_ptr = input_ptr + row_idx * input_row_stride
        col_offsets = tl.arange(0, BLOCK_SIZE)
        input_ptrs = row_start_ptr + col_offsets
        mask = col_offsets < n_cols
        row = tl.load(input_ptrs, mask=mask, other=-float("inf")).to(tl.float32)
        row_minus_max = row - tl.max(row, axis=0)
        numerator = tl.exp(row_minus_max)
        denominator = tl.sum(numerator, axis=0)
        softmax_output = numerator / denominator
        output_row_start_ptr = output_ptr + row_idx * output_row_stride
        output_ptrs = output_row_start_ptr + col_offsets
        tl.store(output_ptrs, softmax_output.to(output_ptr.dtype.element_ty), mask=mask)


def tutorial_stages():
    """The tutorial's choice: 4 stages where the SM has more than 200 KB of shared memory."""
    props = triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device())
    return 4 if props["max_shared_mem"] > 200000 else 2


def tutorial_programs(y, x, n_rows, n_cols, block, warps, stages):
    """The tutorial's persistent grid: as many programs as fit on the GPU at once, judged from
    the compiled kernel's registers and shared memory (NVIDIA branch of the tutorial), at most
    one per row. Guards added: shared memory 0, occupancy 0."""
    props = triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device())
    args = (y, x, x.stride(0), y.stride(0), n_rows, n_cols)
    try:
        k = softmax_persistent_kernel.warmup(*args, BLOCK_SIZE=block, num_stages=stages, num_warps=warps, grid=(1,))
    except Exception as e:  # an API change in `warmup`: a launch returns the compiled kernel too
        print(f"anchors.py: softmax warmup() failed ({e!r}); reading registers from a launch instead", file=sys.stderr)
        k = softmax_persistent_kernel[(1, 1, 1)](*args, block, stages, num_warps=warps)
    k._init_handles()
    occupancy = props["max_num_regs"] // (k.n_regs * props["warpSize"] * warps)
    if k.metadata.shared:
        occupancy = min(occupancy, props["max_shared_mem"] // k.metadata.shared)
    return max(1, min(props["multiprocessor_count"] * max(1, occupancy), n_rows))


@triton.jit
def softmax_one_row_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    # Triton's earlier fused-softmax tutorial kernel: one program per row.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    y = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_rows, n_cols, stride, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # The same algorithm as ours (kernels-lib `rmsnorm_bf16`, one-block path): a ROWS x BLOCK
    # tile per program, weights loaded first, rows past the end touch no column.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    g = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    limit = tl.where(rows < n_rows, n_cols, 0)
    m = cols[None, :] < limit[:, None]
    offs = rows[:, None] * stride + cols[None, :]
    v = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(v * v, axis=1) / n_cols + eps)
    tl.store(out_ptr + offs, (v * r[:, None] * g[None, :]).to(tl.bfloat16), mask=m)


@triton.jit
def transpose_kernel(x_ptr, out_ptr, rows, cols, TILE: tl.constexpr):
    r = tl.program_id(1) * TILE + tl.arange(0, TILE)
    c = tl.program_id(0) * TILE + tl.arange(0, TILE)
    m = (r[:, None] < rows) & (c[None, :] < cols)
    t = tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=m)
    tl.store(out_ptr + c[:, None] * rows + r[None, :], tl.trans(t), mask=tl.trans(m))


def softmax_anchors(bench, dtype, spec, bound, warps_list):
    nr, nc = spec["rows"], spec["cols"]
    x = uniform((nr, nc), torch.float32 if dtype == "f32" else torch.bfloat16)
    y = torch.empty_like(x)
    ref = torch.softmax(x.double(), dim=1)
    scale = ref.abs()
    nbytes = 2 * x.numel() * x.element_size()
    block = triton.next_power_of_2(nc)
    stages = tutorial_stages()
    for w in warps_list:
        programs = tutorial_programs(y, x, nr, nc, block, w, stages)
        f = lambda: softmax_persistent_kernel[(programs, 1, 1)](y, x, x.stride(0), y.stride(0), nr, nc, block, stages, num_warps=w)
        y.fill_(NAN)
        f()
        config = f"tutorial persistent programs={programs} warps={w} stages={stages}"
        chk = guarded(bench, "triton", dtype, config, lambda: check(y, ref, scale, bound, f"{bench} {dtype} triton warps={w}"))
        if chk:
            row(bench, "triton", dtype, nbytes, timed(f), chk, config=config)
    # Triton's earlier tutorial kernel (one row per program), which earlier reports compared
    # with: shown apart, not the ratio's anchor.
    for w in warps_list:
        f = lambda: softmax_one_row_kernel[(nr,)](y, x, x.stride(0), y.stride(0), nc, BLOCK=block, num_warps=w)
        y.fill_(NAN)
        f()
        config = f"BLOCK={block} warps={w}"
        chk = guarded(bench, "triton_one_row_per_program", dtype, config, lambda: check(y, ref, scale, bound, f"{bench} {dtype} triton one row per program warps={w}"))
        if chk:
            row(bench, "triton_one_row_per_program", dtype, nbytes, timed(f), chk, config=config)
    # Checked first (which also compiles torch.compile's), then timed.
    f = lambda: torch.softmax(x, dim=1)
    chk = guarded(bench, "torch_eager", dtype, None, lambda: check(f(), ref, scale, bound, f"{bench} {dtype} torch eager"))
    if chk:
        row(bench, "torch_eager", dtype, nbytes, timed(f), chk)
    cf = torch.compile(lambda t: torch.softmax(t, dim=1))
    g = lambda: cf(x)
    chk = guarded(bench, "torch_compile", dtype, None, lambda: check(g(), ref, scale, bound, f"{bench} {dtype} torch.compile"))
    if chk:
        row(bench, "torch_compile", dtype, nbytes, timed(g), chk)


def rows_bench():
    bounds, specs, warps_list = spec_arg()
    softmax_anchors("softmax", "f32", specs[("softmax", "f32")], bounds[("softmax", "f32")], warps_list)
    softmax_anchors("softmax", "bf16", specs[("softmax", "bf16")], bounds[("softmax", "bf16")], warps_list)
    softmax_anchors("softmax_short_rows", "f32", specs[("softmax_short_rows", "f32")], bounds[("softmax_short_rows", "f32")], warps_list)
    torch.cuda.empty_cache()

    # RMSNorm bf16: exactly the configurations ours sweeps (the autotuner's candidates).
    s = specs[("rmsnorm", "bf16")]
    nr, nc = s["rows"], s["cols"]
    bound = bounds[("rmsnorm", "bf16")]
    x = uniform((nr, nc), torch.bfloat16)
    # The copy ceiling at this size (32 MiB each way, below the 1 GiB copy's bandwidth).
    yc = torch.empty_like(x)
    t = timed(lambda: yc.copy_(x))
    row("copy_4096x4096_bf16", "torch", "bf16", 2 * x.numel() * 2, t)
    del yc
    w = uniform(nc, torch.bfloat16)
    out = torch.empty_like(x)
    xd = x.double()
    ref = xd * torch.rsqrt((xd * xd).mean(dim=1, keepdim=True) + 1e-6) * w.double()
    scale = ref.abs()
    del xd
    nbytes = 2 * x.numel() * 2 + nc * 2
    for cfg in s["configs"]:
        rows_, block, warps = cfg["ROWS"], cfg["BLOCK"], cfg["warps"]
        f = lambda: rmsnorm_kernel[(triton.cdiv(nr, rows_),)](x, w, out, nr, nc, nc, 1e-6, ROWS=rows_, BLOCK=block, num_warps=warps)
        out.fill_(NAN)
        f()
        config = f"ROWS={rows_} BLOCK={block} warps={warps}"
        chk = guarded("rmsnorm", "triton", "bf16", config, lambda: check(out, ref, scale, bound, f"rmsnorm triton {cfg}"))
        if chk:
            row("rmsnorm", "triton", "bf16", nbytes, timed(f), chk, config=config)
    tf = lambda: torch.nn.functional.rms_norm(x, (nc,), w, 1e-6)
    chk = guarded("rmsnorm", "torch_eager", "bf16", None, lambda: check(tf(), ref, scale, bound, "rmsnorm torch eager"))
    if chk:
        row("rmsnorm", "torch_eager", "bf16", nbytes, timed(tf), chk)
    cf = torch.compile(tf)
    chk = guarded("rmsnorm", "torch_compile", "bf16", None, lambda: check(cf(), ref, scale, bound, "rmsnorm torch.compile"))
    if chk:
        row("rmsnorm", "torch_compile", "bf16", nbytes, timed(cf), chk)
    del ref, scale, out, x
    torch.cuda.empty_cache()

    # Transpose f32: the same tiles and warps as ours; exact.
    s = specs[("transpose", "f32")]
    n = s["rows"]
    x = uniform((n, n))
    out = torch.empty_like(x)
    ref = x.t().contiguous()
    scale = ref.abs()
    nbytes = 2 * x.numel() * 4
    for cfg in s["configs"]:
        tile, warps = cfg["TILE"], cfg["warps"]
        f = lambda: transpose_kernel[(triton.cdiv(n, tile), triton.cdiv(n, tile))](x, out, n, n, TILE=tile, num_warps=warps)
        out.fill_(NAN)
        f()
        config = f"TILE={tile} warps={warps}"
        chk = guarded("transpose", "triton", "f32", config, lambda: check(out, ref, scale, 0.0, f"transpose triton {cfg}"))
        if chk:
            row("transpose", "triton", "f32", nbytes, timed(f), chk, config=config)
    f = lambda: out.copy_(x.t())
    out.fill_(NAN)
    chk = guarded("transpose", "torch_eager", "f32", None, lambda: check(f(), ref, scale, 0.0, "transpose torch eager"))
    if chk:
        row("transpose", "torch_eager", "f32", nbytes, timed(f), chk)
    del x, out, ref, scale
    torch.cuda.empty_cache()
    # Copy bandwidth in this run, the ceiling for all of them.
    y = torch.randn(1 << 28, device="cuda")
    yy = torch.empty_like(y)
    t = timed(lambda: yy.copy_(y))
    emit(bench="copy", bytes=2 * y.numel() * 4, **t, gbs=2 * y.numel() * 4 / t["ms"] / 1e6)


# ---------------------------------------------------------------------------------------------
# Start-up and launch cost.

CHILD = r"""
import time, json, torch
t0 = time.perf_counter()
import triton, triton.language as tl
import importlib.util, sys
spec = importlib.util.spec_from_file_location("anchors", sys.argv[1]); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
n = 4096
a = m.uniform(n); b = m.uniform(n); c = m.uniform(n); out = torch.full_like(a, float("nan"))
torch.cuda.synchronize()
t1 = time.perf_counter()
m.triton_rma(a, b, c, out)
torch.cuda.synchronize()
t2 = time.perf_counter()
p, q = torch.relu(a.double()) * b.double(), c.double()
chk = m.check(out, p + q, p.abs() + q.abs(), float(sys.argv[2]), "coldstart triton")
# A matmul's first call (compile + load + run) at one fixed configuration, as ours:
# 1024^3 bf16, 128 x 128 x 32 tiles, 4 warps, 3 stages, f32 out.
x = (torch.rand(1024, 1024, device="cuda") * 2 - 1).to(torch.bfloat16); y = (torch.rand(1024, 1024, device="cuda") * 2 - 1).to(torch.bfloat16)
z = torch.full((1024, 1024), float("nan"), device="cuda")
torch.cuda.synchronize()
t3 = time.perf_counter()
m.matmul_kernel.fn[(64,)](x, y, z, 1024, 1024, 1024, 1024, 1, 1024, 1, 1024, 1, BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3)
torch.cuda.synchronize()
t4 = time.perf_counter()
ref = x.double() @ y.double()
m.check(z, ref, x.double().abs() @ y.double().abs(), float(sys.argv[3]), "coldstart triton matmul")
print(json.dumps(dict(first_call_ms=(t2 - t1) * 1e3, first_matmul_ms=(t4 - t3) * 1e3, **chk)))
"""


CHILD_COMPILE = r"""
import time, json, torch
import importlib.util, sys
spec = importlib.util.spec_from_file_location("anchors", sys.argv[1]); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
n = 4096
a = m.uniform(n); b = m.uniform(n); c = m.uniform(n)
torch.cuda.synchronize()
t1 = time.perf_counter()
f = torch.compile(lambda a, b, c: torch.relu(a) * b + c)
out = f(a, b, c)
torch.cuda.synchronize()
t2 = time.perf_counter()
p, q = torch.relu(a.double()) * b.double(), c.double()
chk = m.check(out, p + q, p.abs() + q.abs(), float(sys.argv[2]), "coldstart torch.compile")
# The fuser's seed compiled second in the same process, as ours compiles its graph second.
t3 = time.perf_counter()
g = torch.compile(m.seed_relu_torch)
y = g(a)
torch.cuda.synchronize()
t4 = time.perf_counter()
r = 3 * torch.relu(a.double())
m.check(y, r, r.abs(), float(sys.argv[4]), "coldstart torch.compile seed")
print(json.dumps(dict(first_call_ms=(t2 - t1) * 1e3, first_graph_ms=(t4 - t3) * 1e3, **chk)))
"""


def coldstart():
    bounds, _, _ = spec_arg()
    bound = bounds[("relu_mul_add", "f32")]
    seed_bound = bounds[("seed_relu", "f32")]
    mm_bound = matmul_spec_bound(1024)
    for rep in range(COLD_REPEATS):
        for impl, child in [("triton", CHILD), ("torch_compile", CHILD_COMPILE)]:
            # A fresh cache for each cold/warm pair; "warm" is a second new process on it.
            with tempfile.TemporaryDirectory() as d:
                env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(d, "triton"), TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"))
                for label in ["cold", "warm"]:
                    r = subprocess.run([sys.executable, "-c", child, os.path.abspath(__file__), repr(bound), repr(mm_bound), repr(seed_bound)], env=env, capture_output=True, text=True)
                    if r.returncode != 0:
                        raise SystemExit(r.stderr)
                    emit(bench="coldstart", impl=impl, cache=label, rep=rep, **json.loads(r.stdout.strip().splitlines()[-1]))


def matmul_spec_bound(k):
    """The matmul bound `bench spec` prints for k (the first shape with that k)."""
    path = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("BENCH_SPEC")
    for line in open(path):
        if line.startswith("{"):
            s = json.loads(line)
            if s["spec"] == "matmul" and s["k"] == k:
                return s["bound"]
    raise SystemExit(f"anchors.py: no matmul bound for k={k} in the spec")


def host_times(fn, iters):
    """Host time per call of `fn` (no syncs inside), measured BENCH_REPEATS times."""
    runs = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        runs.append((time.perf_counter() - t) * 1e6 / iters)
        torch.cuda.synchronize()
    return dict(host_us_per_launch=statistics.median(runs), host_us_min=min(runs), host_us_max=max(runs), host_us_runs=runs)


def launch():
    n = 1024
    a, b, c = (torch.randn(n, device="cuda") for _ in range(3))
    out = torch.empty_like(a)
    for _ in range(1000):
        triton_rma(a, b, c, out)
    torch.cuda.synchronize()
    iters = 20000
    emit(bench="launch", impl="triton", **host_times(lambda: triton_rma(a, b, c, out), iters))
    emit(bench="launch", impl="torch_eager_add", **host_times(lambda: torch.add(a, b, out=out), iters))
    cf = torch.compile(lambda a, b, c: torch.relu(a) * b + c)
    for _ in range(100):
        cf(a, b, c)
    torch.cuda.synchronize()
    emit(bench="launch", impl="torch_compile", **host_times(lambda: cf(a, b, c), iters))
    plan_host()


def plan_host():
    """The fuser's seed relu(x) + relu(x) * 2 on 1024 elements, as ours times its plans
    (`bench launch`'s plan_host rows): each call timed alone, to its return (host) and to the
    end of a synchronize after it (wall); BENCH_REPEATS rounds of 2000 calls, the median of
    each round. Eager PyTorch (four kernels: relu twice, the product, the sum), torch.compile
    (one fused kernel) and torch.compile(mode="reduce-overhead") (the same kernel, replayed
    as a CUDA graph). Every output checked against float64 first."""
    bounds, _, _ = spec_arg()
    n = 1024
    x = uniform(n)
    ref = 3 * torch.relu(x.double())
    for impl, fn in [("torch_eager", seed_relu_torch), ("torch_compile", torch.compile(seed_relu_torch)),
                     ("torch_compile_reduce_overhead", torch.compile(seed_relu_torch, mode="reduce-overhead"))]:
        for _ in range(100):
            out = fn(x)
        torch.cuda.synchronize()
        chk = check((out,), ref, ref.abs(), bounds[("seed_relu", "f32")], f"plan_host {impl}")
        host, wall = [], []
        for _ in range(REPEATS):
            h, w = [], []
            for _ in range(2000):
                t = time.perf_counter()
                fn(x)
                h.append((time.perf_counter() - t) * 1e6)
                torch.cuda.synchronize()
                w.append((time.perf_counter() - t) * 1e6)
            host.append(statistics.median(h))
            wall.append(statistics.median(w))
        emit(bench="plan_host", graph="seed", impl=impl, n=n, host_us=statistics.median(host), host_us_min=min(host), host_us_max=max(host),
             host_us_runs=host, wall_us=statistics.median(wall), wall_us_runs=wall, max_rel=chk["max_rel"])


# ---------------------------------------------------------------------------------------------
# Matmul.


def tutorial_matmul_configs():
    """The configurations of Triton's matmul tutorial (03-matrix-multiplication, CUDA list)."""
    cfg = lambda bm, bn, bk, stages, warps: triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_stages=stages, num_warps=warps)
    return [cfg(128, 256, 64, 3, 8), cfg(64, 256, 32, 4, 4), cfg(128, 128, 32, 4, 4), cfg(128, 64, 32, 4, 4),
            cfg(64, 128, 32, 4, 4), cfg(128, 32, 32, 4, 4), cfg(64, 32, 32, 5, 2), cfg(32, 64, 32, 5, 2)]


@triton.autotune(configs=tutorial_matmul_configs(), key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # The tutorial's kernel, storing the f32 accumulator (as ours does).
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = pid // per_group * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * sam + rk[None, :] * sak
    b_ptrs = b_ptr + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=rk[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + cm[:, None] * scm + cn[None, :] * scn, acc, mask=(cm[:, None] < M) & (cn[None, :] < N))


def triton_matmul(a, b, c):
    M, K = a.shape
    N = b.shape[1]
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))


def matmul_bench():
    """Rows for every (shape, dtype) of the spec: cuBLAS through torch.matmul (output in the
    input type: its bound adds that rounding) and torch.mm with an f32 out_dtype, and Triton's
    tutorial matmul, autotuned (its sweep's wall time reported), f32 out. Each output is
    checked, every element, against an f64 product of the same inputs computed on the GPU."""
    shapes = []
    path = sys.argv[2] if len(sys.argv) > 2 else None
    for line in open(path):
        if line.startswith("{"):
            s = json.loads(line)
            if s["spec"] == "matmul":
                shapes.append((s["m"], s["n"], s["k"], s["bound"], s.get("bound_tf32")))
    # With DISABLE_MMA_V3=1 Triton compiles for mma.sync (its sm_80 path) even on Hopper:
    # rows of Triton alone, named triton_mma_v2, to compare with our mma.sync path.
    mma_v2 = os.environ.get("DISABLE_MMA_V3") == "1"
    # BENCH_MATMUL=MxNxK[:dtype],...: only those shapes (and dtypes), as `bench matmul`.
    only = [w.strip().split(":") for w in os.environ.get("BENCH_MATMUL", "").split(",") if w.strip()]
    wanted = lambda m, n, k, dtype: not only or any(w[0] == f"{m}x{n}x{k}" and (len(w) == 1 or w[1] == dtype) for w in only)
    for (m, n, k, bound16, bound_tf32) in shapes:
        # f32 inputs at tf32 (torch with TF32 allowed; Triton's tl.dot default), as ours: up
        # to 4096 per dimension.
        f32 = [("f32", torch.float32, 0.0)] if bound_tf32 and max(m, n, k) <= 4096 else []
        for dtype, tdt, u in [("bf16", torch.bfloat16, 2.0**-8), ("f16", torch.float16, 2.0**-11)] + f32:
            if not wanted(m, n, k, dtype):
                continue
            bound = bound_tf32 if dtype == "f32" else bound16
            torch.backends.cuda.matmul.allow_tf32 = dtype == "f32"
            a = (torch.rand(m, k, device="cuda") * 2 - 1).to(tdt)
            b = (torch.rand(k, n, device="cuda") * 2 - 1).to(tdt)
            ref = a.double() @ b.double()
            scale = a.double().abs() @ b.double().abs()
            flops = 2.0 * m * n * k
            emit_mm = lambda impl, t, chk, **kw: emit(bench="matmul", impl=impl, dtype=dtype, m=m, n=n, k=k, **t, tflops=flops / t["ms"] / 1e9, **chk, **kw)

            def triton_row(impl):
                """Triton's tutorial matmul, autotuned on its first call (the sweep's wall
                time reported), into a poisoned f32 output, checked, then timed."""
                c = torch.empty(m, n, device="cuda", dtype=torch.float32)
                poison(c)
                t0 = time.perf_counter()
                triton_matmul(a, b, c)
                torch.cuda.synchronize()
                sweep_s = time.perf_counter() - t0
                chk = guarded("matmul", impl, dtype, None, lambda: check(c, ref, scale, bound, f"matmul {dtype} {impl}"))
                if chk:
                    best = matmul_kernel.best_config
                    emit_mm(impl, timed(lambda: triton_matmul(a, b, c)), chk, out="f32", sweep_s=sweep_s,
                            config=f"BM={best.kwargs['BLOCK_M']} BN={best.kwargs['BLOCK_N']} BK={best.kwargs['BLOCK_K']} warps={best.num_warps} stages={best.num_stages}")

            if mma_v2:
                triton_row("triton_mma_v2")
                del a, b, ref, scale
                torch.cuda.empty_cache()
                continue
            # cuBLAS, output in the input type (torch.matmul's own choice).
            chk = guarded("matmul", "torch", dtype, None, lambda: check(a @ b, ref, scale, bound + u, f"matmul {dtype} torch"))
            if chk:
                emit_mm("torch", timed(lambda: a @ b), chk, out="input type")
            # cuBLAS with an f32 output, like ours (for f32 inputs the row above is that).
            try:
                torch.mm(a, b, out_dtype=torch.float32)
                has_out_dtype = dtype != "f32"
            except (TypeError, RuntimeError):
                has_out_dtype = False
            if has_out_dtype:
                chk = guarded("matmul", "torch_f32_out", dtype, None, lambda: check(torch.mm(a, b, out_dtype=torch.float32), ref, scale, bound, f"matmul {dtype} torch f32 out"))
                if chk:
                    emit_mm("torch_f32_out", timed(lambda: torch.mm(a, b, out_dtype=torch.float32)), chk, out="f32")
            triton_row("triton")
            del a, b, ref, scale
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Attention.


def seed_attention(q, k, v, causal, scale):
    """The seed's math: key/value heads repeated to the query heads, scores, softmax in f32,
    probabilities back to the input type, `@ v`."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ k.transpose(-1, -2)).float() * scale
    if causal:
        t = q.shape[2]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1).to(q.dtype) @ v


def attention_bwd_reference(q, k, v, g, causal, scale):
    """float64 gradients on 4 sampled key/value heads (every query head of their groups):
    {(batch, kv head): (dk, dk_terms, dv, dv_terms, {query head: (dq, dq_terms)})}, each
    `_terms` the size of the terms its element adds up (ours: tests/all/attention.rs)."""
    b, h, t, d = q.shape
    kv = k.shape[1]
    out = {}
    for i in range(4):
        bi, hk = (i * 7 + 1) % b, (i * 5 + 2) % kv
        K, V = k[bi, hk].double(), v[bi, hk].double()
        dk = torch.zeros_like(K); dkt = torch.zeros_like(K); dv = torch.zeros_like(K); dvt = torch.zeros_like(K)
        dqs = {}
        for hh in range(hk * (h // kv), (hk + 1) * (h // kv)):
            Q, G = q[bi, hh].double(), g[bi, hh].double()
            s = (Q @ K.T) * scale
            if causal:
                s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
            p = torch.softmax(s, -1)
            o = p @ V
            dp, dpa = G @ V.T, G.abs() @ V.abs().T
            dl, dla = (G * o).sum(-1, keepdim=True), (G * o).abs().sum(-1, keepdim=True)
            ds, dsa = p * (dp - dl), p * (dpa + dla)
            dqs[hh] = (scale * ds @ K, scale * dsa @ K.abs())
            dk += scale * ds.T @ Q; dkt += scale * dsa.T @ Q.abs()
            dv += p.T @ G; dvt += p.T @ G.abs()
        out[(bi, hk)] = (dk, dkt, dv, dvt, dqs)
    return out


def check_grads(grads, ref, bound, what):
    dq, dk, dv = grads
    worst = 0.0
    for (bi, hk), (rk, tk, rv, tv, dqs) in ref.items():
        pairs = [(dk[bi, hk], rk, tk), (dv[bi, hk], rv, tv)] + [(dq[bi, hh], r, tr) for hh, (r, tr) in dqs.items()]
        for got, want, terms in pairs:
            err = ((got.double() - want).abs() / terms.clamp_min(1e-30)).max().item()
            worst = float("inf") if err != err else max(worst, err)
    if worst > bound:
        raise AssertionError(f"{what}: worst gradient error {worst:e} of its terms > {bound:e}")
    return dict(max_rel=worst, bound=bound)


def check_attention_rows(out, q, k, v, causal, scale, bound, what, score=lambda s, hh, i, j: s):
    """64 sampled (batch * head, query) rows of a [B, H, T, D] attention output (and the
    last) against float64 with the scores modified by `score(s, head, query, keys)`, relative
    to sum_j p_j |v_j|, within `bound` (ours: `attention_rows_error` in examples/bench.rs)."""
    b, h, t, _ = q.shape
    kv = k.shape[1]
    rows = b * h * t
    worst = 0.0
    for r in [(i * 7919 + 13) % rows for i in range(64)] + [rows - 1]:
        bh, i = divmod(r, t)
        bi, hh = divmod(bh, h)
        kh = hh // (h // kv)
        n = i + 1 if causal else t
        s = score((k[bi, kh, :n].double() @ q[bi, hh, i].double()) * scale, hh, i, torch.arange(n, device=q.device))
        p = torch.softmax(s, 0)
        vv = v[bi, kh, :n].double()
        want, mag = p @ vv, p @ vv.abs()
        err = ((out[bi, hh, i].double() - want).abs() / mag.clamp_min(1e-30)).max().item()
        worst = float("inf") if err != err else max(worst, err)
    if worst > bound:
        raise AssertionError(f"{what}: worst error {worst:e} of sum p|v| > {bound:e}")
    return dict(max_rel=worst, bound=bound)


def triton_attention_configs():
    """The search space of Triton's fused-attention tutorial (06-fused-attention) on Hopper:
    128 or 64 query rows, 32 to 128 keys a step, 2 to 6 stages, 4 or 8 warps, 8 warps only
    where the tile has at least 128 x 128 elements."""
    return [triton.Config({"BM": bm, "BN": bn}, num_stages=s, num_warps=w, pre_hook=triton_attention_blocks)
            for bm in (64, 128) for bn in (32, 64, 128) for s in (2, 3, 4, 6) for w in (4, 8)
            if w == 4 or bm * bn >= 128 * 128]


def triton_attention_blocks(nargs):
    """Each tensor descriptor's block for the configuration being launched."""
    bm, bn, d = nargs["BM"], nargs["BN"], nargs["D"]
    nargs["desc_q"].block_shape = nargs["desc_o"].block_shape = [bm, d]
    nargs["desc_k"].block_shape = nargs["desc_v"].block_shape = [bn, d]


def triton_attention_prune(configs, nargs, **kw):
    """The tutorial's limits: no more keys a step than the head dimension; causal, a query
    tile a whole number of key steps (its diagonal loop covers one query tile)."""
    args = {**nargs, **kw}
    return [c for c in configs if c.kwargs["BN"] <= args["D"] and (not args["CAUSAL"] or c.kwargs["BM"] % c.kwargs["BN"] == 0)]


@triton.jit
def triton_attention_keys(acc, l, m, q, desc_k, desc_v, kv_row, lo, hi, rows, qk_scale,
                          BN: tl.constexpr, MASKED: tl.constexpr):
    """Online softmax over the keys [lo, hi) of one query tile (FlashAttention-2's loop, in
    base 2); MASKED applies the causal mask (the diagonal's keys)."""
    cols = tl.arange(0, BN)
    for n in range(lo, hi, BN):
        n = tl.multiple_of(n, BN)
        s = tl.dot(q, desc_k.load([kv_row + n, 0]).T)
        if MASKED:
            s = s * qk_scale + tl.where(rows[:, None] >= n + cols[None, :], 0.0, -1.0e6)
            m_new = tl.maximum(m, tl.max(s, 1))
            s -= m_new[:, None]
        else:
            m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
            s = s * qk_scale - m_new[:, None]
        p = tl.math.exp2(s)
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        v = desc_v.load([kv_row + n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
    return acc, l, m


@triton.autotune(configs=triton_attention_configs(), key=["T", "D", "CAUSAL"], prune_configs_by={"early_config_prune": triton_attention_prune})
@triton.jit
def triton_attention_kernel(desc_q, desc_k, desc_v, desc_o, lse, H, KV, T, qk_scale,
                            D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Triton's tutorial flash-attention forward (FlashAttention-2 with TMA descriptors, the
    causal keys in two loops: below the diagonal unmasked, the diagonal masked), written for
    this anchor with grouped-query heads: query head h reads key/value head h / (H / KV)."""
    tile, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    q_row = bh * T + tile * BM
    kv_row = (b * KV + h // (H // KV)) * T
    rows = tile * BM + tl.arange(0, BM)
    m = tl.full([BM], float("-inf"), tl.float32)
    l = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    q = desc_q.load([q_row, 0])
    if CAUSAL:
        acc, l, m = triton_attention_keys(acc, l, m, q, desc_k, desc_v, kv_row, 0, tile * BM, rows, qk_scale, BN, False)
        acc, l, m = triton_attention_keys(acc, l, m, q, desc_k, desc_v, kv_row, tile * BM, (tile + 1) * BM, rows, qk_scale, BN, True)
    else:
        acc, l, m = triton_attention_keys(acc, l, m, q, desc_k, desc_v, kv_row, 0, T, rows, qk_scale, BN, False)
    tl.store(lse + bh * T + rows, m + tl.math.log2(l))
    desc_o.store([q_row, 0], (acc / l[:, None]).to(q.dtype))


def triton_attention(q, k, v, causal, scale):
    """`[B, H, T, D]` queries, `[B, KV, T, D]` keys and values (contiguous, T a multiple of
    128): the output and the base-2 logsumexp, through `triton_attention_kernel`."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    b, h, t, d = q.shape
    kv = k.shape[1]
    out = torch.empty_like(q)
    lse = torch.empty(b * h * t, device=q.device, dtype=torch.float32)
    desc = lambda x: TensorDescriptor.from_tensor(x.view(-1, d), [1, d])
    grid = lambda meta: (t // meta["BM"], b * h)
    triton_attention_kernel[grid](desc(q), desc(k), desc(v), desc(out), lse, h, kv, t, scale * 1.4426950408889634, D=d, CAUSAL=causal)
    return out


def sdpa_on(backend):
    """SDPA restricted to one of its backends (`torch.nn.attention.sdpa_kernel`), GQA
    without copies."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    def call(q, k, v, causal, scale):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
    return call


def attention_impls(backward):
    """The attention anchors: (name, fn(q, k, v, causal, scale)). SDPA as torch dispatches
    it, and restricted to FlashAttention-2 (its flash backend) and to cuDNN; the seed's math
    eager and compiled; forward only, Triton's tutorial kernel."""
    from torch.nn.attention import SDPBackend
    import torch.nn.functional as F
    default = lambda q, k, v, causal, scale: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
    impls = [("torch_sdpa", default),
             ("torch_sdpa_flash", sdpa_on(SDPBackend.FLASH_ATTENTION)),
             ("torch_sdpa_cudnn", sdpa_on(SDPBackend.CUDNN_ATTENTION)),
             ("torch_eager_seed", seed_attention),
             ("torch_compile_seed", torch.compile(seed_attention))]
    return impls if backward else impls + [("triton_tutorial", triton_attention)]


def device_time(impl, fn):
    """For SDPA's and Triton's rows, their device time alone as well (`timed_graph`, or
    `timed_profiled` where capture fails; fields `graph_ms`, `graph_ms_min`, `graph_ms_max`,
    and `graph_timer` saying which): at the seed shape a call's host time (the backend's
    context manager, autograd, Triton's launcher and its tensor descriptors) exceeds the
    kernels', and the events then time the host. Ours reports its device time the same way
    (`graph_timed` in examples/bench.rs) besides its events."""
    if not (impl.startswith("torch_sdpa") or impl.startswith("triton")):
        return {}
    g = timed_graph(fn)
    if g["timer"] == "events":
        g = timed_profiled(fn)
    best = dict(triton_config=str(triton_attention_kernel.best_config)) if impl.startswith("triton") else {}
    return dict(graph_ms=g["ms"], graph_ms_min=g["ms_min"], graph_ms_max=g["ms_max"], graph_timer=g["timer"], **best)


def runs_at_all(bench, impl, config, fn):
    """Calls `fn` once. An SDPA backend that does not take the case (torch raises
    RuntimeError: no kernel for these inputs) gets an `unsupported` row instead of a timed
    one; any other failure (Triton's compile, a launch) is a failed row, as a failed check
    is, and the run goes on."""
    try:
        fn()
        return True
    except Exception as e:
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        if impl.startswith("torch_sdpa_") and isinstance(e, RuntimeError):
            emit(bench=bench, impl=impl, dtype="bf16", config=config, unsupported=first)
        else:
            FAILED.append(f"{bench} bf16 {impl} {config}: {type(e).__name__}: {first}")
            emit(bench=bench, impl=impl, dtype="bf16", config=config, check_failed=f"{type(e).__name__}: {first}")
            print(f"failed: {FAILED[-1]}", file=sys.stderr)
        return False


def attention_bench():
    """Rows for every attention shape of the spec, full and causal, forward and backward,
    and the forward of the Llama shapes (causal): the implementations of
    `attention_impls`. Each output is checked on 64 sampled query rows (and the last)
    against a float64 reference, relative to sum_j p_j |v_j|, with the bound ours uses."""
    # The backward is timed with retain_graph=True (the forward's graph kept, so only the
    # backward runs); a compiled backward that donates its buffers refuses that.
    import torch._functorch.config
    torch._functorch.config.donated_buffer = False
    path = sys.argv[2] if len(sys.argv) > 2 else None
    specs = [json.loads(l) for l in open(path) if l.startswith("{")]

    def qkv(sp):
        """A spec row's shape, bound, and fresh q, k, v in [-1, 1) ([B, H, T, D], bf16)."""
        b, t, h, kv, d, bound = sp["b"], sp["t"], sp["h"], sp["kv"], sp["d"], sp["bound"]
        # Drawn on the host: torch's CUDA generator would refuse to draw after a failed
        # capture (`device_time` falls back to events when an implementation cannot capture).
        q = (torch.rand(b, h, t, d) * 2 - 1).bfloat16().cuda()
        k = (torch.rand(b, kv, t, d) * 2 - 1).bfloat16().cuda()
        v = (torch.rand(b, kv, t, d) * 2 - 1).bfloat16().cuda()
        return (b, t, h, kv, d, bound), (q, k, v)

    def forward_rows(dims, q, k, v, causal, bound, impls):
        """A forward row for each of `impls`: run once (`runs_at_all`), checked, timed."""
        b, t, h, kv, d = dims
        scale = 1.0 / d ** 0.5
        flops = 4 * b * h * t * t * d * (0.5 if causal else 1.0)
        config = f"b={b} t={t} h={h} kv={kv} d={d} causal={causal}"
        for impl, attn in impls:
            fn = lambda: attn(q, k, v, causal, scale)
            if not runs_at_all("attention", impl, config, fn):
                continue
            chk = guarded("attention", impl, "bf16", config, lambda: check_attention_rows(fn(), q, k, v, causal, scale, bound, f"attention {impl} {config}"))
            if chk:
                tm = timed(fn)
                emit(bench="attention", impl=impl, dtype="bf16", b=b, t=t, h=h, kv=kv, d=d, causal=causal, **tm, tflops=flops / (tm["ms"] * 1e-3) / 1e12, **chk, **device_time(impl, fn))
            torch.cuda.empty_cache()

    # BENCH_ATTENTION_SEED_ONLY=1: the seed shape's rows alone; BENCH_ATTENTION_LLAMA_ONLY=1:
    # the Llama rows alone (as `bench attention`'s).
    seed_only = os.environ.get("BENCH_ATTENTION_SEED_ONLY") == "1"
    llama_only = os.environ.get("BENCH_ATTENTION_LLAMA_ONLY") == "1" and not seed_only  # (as ours: seed-only wins)
    for sp in (sp for sp in specs if sp["spec"] == "attention" and not llama_only and not (seed_only and sp["t"] != 1024)):
        (b, t, h, kv, d, bound), (q, k, v) = qkv(sp)
        scale = 1.0 / d ** 0.5
        for causal in (False, True):
            forward_rows((b, t, h, kv, d), q, k, v, causal, bound, attention_impls(backward=False))
            flops = 4 * b * h * t * t * d * (0.5 if causal else 1.0)
            config = f"b={b} t={t} h={h} kv={kv} d={d} causal={causal}"

            # The backward: dq, dk, dv for the output gradient g, each implementation's autograd
            # (SDPA's own backward kernels; the seed's math eager; under torch.compile, its
            # AOTAutograd backward), timed alone (the forward's graph kept). Checked on 4 sampled
            # key/value heads (their query groups whole) against float64, relative to the size
            # of each element's terms, with the bound ours uses.
            g = (torch.rand(b, h, t, d) * 2 - 1).bfloat16().cuda()
            ref = attention_bwd_reference(q, k, v, g, causal, scale)
            for impl, attn in attention_impls(backward=True):
                qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
                if not runs_at_all("attention_bwd", impl, config, lambda: torch.autograd.grad(attn(qq, kk, vv, causal, scale), (qq, kk, vv), g)):
                    continue
                out = attn(qq, kk, vv, causal, scale)
                back = lambda: torch.autograd.grad(out, (qq, kk, vv), g, retain_graph=True)
                chk = guarded("attention_bwd", impl, "bf16", config, lambda: check_grads(back(), ref, sp["bound_bwd"], f"attention_bwd {impl} {config}"))
                if chk:
                    tm = timed(back)
                    # Device time through a CUDA graph of forward and backward together, by
                    # `autograd.grad` (no gradient accumulated into the leaves). Neither the
                    # backward of a forward outside the capture nor `.backward(g)` captured
                    # (9c7ae6b: "operation failed due to a previous error during capture";
                    # the latter also warns that AccumulateGrad's stream differs).
                    both = device_time(impl, lambda: torch.autograd.grad(attn(qq, kk, vv, causal, scale), (qq, kk, vv), g))
                    emit(bench="attention_bwd", impl=impl, dtype="bf16", b=b, t=t, h=h, kv=kv, d=d, causal=causal, **tm, tflops=2.5 * flops / (tm["ms"] * 1e-3) / 1e12, **chk,
                         **{f"fwdbwd_{k}": x for k, x in both.items()})
                del qq, kk, vv, out
                torch.cuda.empty_cache()

    # Issue 14's Llama rows (`"spec":"attention_llama"`): causal, forward only, without the
    # seed's math (its score matrix alone is 4 GiB in bf16 at T 8192).
    for sp in (sp for sp in specs if sp["spec"] == "attention_llama" and not seed_only):
        (b, t, h, kv, d, bound), (q, k, v) = qkv(sp)
        impls = [(i, a) for i, a in attention_impls(backward=False) if i not in ("torch_eager_seed", "torch_compile_seed")]
        forward_rows((b, t, h, kv, d), q, k, v, True, bound, impls)
        del q, k, v
        torch.cuda.empty_cache()


def flex_bench():
    """The rows of `bench score_mod` (ours: examples/bench.rs) for FlexAttention, torch's
    `score_mod` API: the seed shape (B 4, T 1024, H 8 / KV 4, D 64, bf16), unmodified (and
    SDPA), soft-capping (cap 20), ALiBi (slopes 2^(-8 (h + 1) / H)), a bias from data (a
    [B, T, T] f32 tensor read by the score_mod; SDPA with it as a bf16 attn_mask), a key
    padding mask from data ([B, T] bool; SDPA's attn_mask [B, 1, 1, T]), full; unmodified and a
    sliding window of 256 keys, causal. flex_attention compiled (its documented use), GQA
    without copies (enable_gqa); causal through a block mask, as FlexAttention does it; the
    window as a score_mod under the causal block mask (every tile below the diagonal
    computed), and as a mask_mod in the block mask (FlexAttention's best: it skips the tiles
    outside the window, as ours does through the window's KeysFrom/QueriesTo). Sampled output rows checked against float64 with the bound
    ours uses; forward timed, and forward + backward (autograd, `out.backward(g)`), each by
    its device time in a CUDA graph (`timed_graph`: called eagerly, a compiled
    flex_attention's host time per call exceeds its kernel's at this shape), with the eager
    call's time (`timed`, events) beside it as `call_ms`."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch.nn.functional as F
    path = sys.argv[2] if len(sys.argv) > 2 else None
    sp = [json.loads(l) for l in open(path) if l.startswith("{") and json.loads(l)["spec"] == "attention"][0]
    b, t, h, kv, d, bound = sp["b"], sp["t"], sp["h"], sp["kv"], sp["d"], sp["bound"]
    q = (torch.rand(b, h, t, d, device="cuda") * 2 - 1).bfloat16()
    k = (torch.rand(b, kv, t, d, device="cuda") * 2 - 1).bfloat16()
    v = (torch.rand(b, kv, t, d, device="cuda") * 2 - 1).bfloat16()
    g = (torch.rand(b, h, t, d, device="cuda") * 2 - 1).bfloat16()
    scale = 1.0 / d ** 0.5
    cap, window = 20.0, 256
    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device="cuda")
    causal_mask = create_block_mask(lambda b_, h_, qi, ki: qi >= ki, None, None, t, t)
    window_mask = create_block_mask(lambda b_, h_, qi, ki: (qi >= ki) & (qi - ki < window), None, None, t, t)
    # A bias from data, the same as ours (`bench score_mod`): [B, T, T] f32, eighths in
    # [-1, 1) (exact in bf16: SDPA's mask is bf16), every 17th key hidden.
    ii, jj = torch.arange(t, device="cuda")[:, None], torch.arange(t, device="cuda")[None, :]
    bias64 = torch.where(jj % 17 == 3, -float("inf"), ((ii * 31 + jj * 17) % 16).double() / 8.0 - 1.0)
    bias = bias64.float().expand(b, t, t).contiguous()
    # A key padding mask from data, the same as ours: every 17th key hidden, [B, T].
    keymask = (torch.arange(t, device="cuda") % 17 != 3).expand(b, t).contiguous()
    km64 = torch.where(keymask[0], 0.0, -float("inf")).double()
    mods = {
        "none": (lambda s, b_, h_, qi, ki: s, lambda s, hh, i, j: s),
        "softcap": (lambda s, b_, h_, qi, ki: cap * torch.tanh(s / cap), lambda s, hh, i, j: cap * torch.tanh(s / cap)),
        "alibi": (lambda s, b_, h_, qi, ki: s - slopes[h_] * (qi - ki).abs(), lambda s, hh, i, j: s - slopes[hh].double() * (i - j).abs()),
        "window": (lambda s, b_, h_, qi, ki: torch.where(qi - ki >= window, -float("inf"), s), lambda s, hh, i, j: torch.where(i - j >= window, -float("inf"), s)),
        "bias": (lambda s, b_, h_, qi, ki: s + bias[b_, qi, ki], lambda s, hh, i, j: s + bias64[i, j]),
        "keymask": (lambda s, b_, h_, qi, ki: torch.where(keymask[b_, ki], s, -float("inf")), lambda s, hh, i, j: s + km64[j]),
    }

    cases = [("none", False), ("softcap", False), ("alibi", False), ("bias", False), ("keymask", False), ("none", True), ("window", True)]
    for name, causal in cases:
        score, ref_mod = mods[name]
        impls = [("torch_flex", score, causal_mask if causal else None)]
        if name == "window":
            impls.append(("torch_flex_mask", None, window_mask))
        if name in ("none", "bias", "keymask"):
            impls.append(("torch_sdpa", None, None))
        for impl, sm, bm in impls:
            config = f"b={b} t={t} h={h} kv={kv} d={d} causal={causal} mod={name}"
            # A fresh compilation per row: one compiled flex_attention recompiles for every
            # score_mod and for inputs that require grad, and past dynamo's recompile limit it
            # falls back to the unfused eager implementation (materialized scores).
            torch._dynamo.reset()
            flex = torch.compile(flex_attention)
            if impl == "torch_sdpa" and name in ("bias", "keymask"):
                mask = bias[:, None].bfloat16() if name == "bias" else keymask[:, None, None, :]
                fn = lambda q, k, v, mask=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
            elif impl == "torch_sdpa":
                fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
            else:
                fn = lambda q, k, v, sm=sm, bm=bm: flex(q, k, v, score_mod=sm, block_mask=bm, scale=scale, enable_gqa=True)
            chk = guarded("attention_mod", impl, "bf16", config, lambda: check_attention_rows(fn(q, k, v), q, k, v, causal, scale, bound, f"attention_mod {impl} {config}", ref_mod))
            if not chk:
                continue
            call = timed(lambda: fn(q, k, v))
            tm = timed_graph(lambda: fn(q, k, v))
            emit(bench="attention_mod", impl=impl, dtype="bf16", mod=name, b=b, t=t, h=h, kv=kv, d=d, causal=causal, **{"pass": "fwd"}, **tm, call_ms=call["ms"], **chk)
            qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
            call = timed(lambda: fn(qq, kk, vv).backward(g))
            tm = timed_graph(lambda: fn(qq, kk, vv).backward(g))
            emit(bench="attention_mod", impl=impl, dtype="bf16", mod=name, b=b, t=t, h=h, kv=kv, d=d, causal=causal, **{"pass": "fwd_bwd"}, **tm, call_ms=call["ms"])
            del qq, kk, vv
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# The seed's attention block, forward and backward.


def block_bench():
    """The seed's block (examples/src/gqa.rs does the same work) at the seed's shape, written
    the seed's way (projections, view, transpose, repeat_interleave, scores divided by
    sqrt(d_h), softmax, @ v, output projection) in eager and under torch.compile, and with
    torch SDPA (enable_gqa) in place of the attention math; bf16, and f32 with TF32 matmuls
    (ours: tf32 products). The loss is y.sum(); gradients of x and every weight. Timed with
    the example's protocol: 10 warm-up steps, 100 timed with CUDA events, mean, std, p99;
    peak memory is torch.cuda.max_memory_allocated over the timed steps."""
    import math
    import torch.nn.functional as F
    b, t, dm, h, kv, hd = 4, 1024, 512, 8, 4, 64

    def seed(x, wq, wk, wv, wo):
        q = (x @ wq).view(b, t, h, hd).transpose(1, 2)
        k = (x @ wk).view(b, t, kv, hd).transpose(1, 2).repeat_interleave(h // kv, dim=1)
        v = (x @ wv).view(b, t, kv, hd).transpose(1, 2).repeat_interleave(h // kv, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        o = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h * hd)
        return o @ wo

    def sdpa(x, wq, wk, wv, wo):
        q = (x @ wq).view(b, t, h, hd).transpose(1, 2)
        k = (x @ wk).view(b, t, kv, hd).transpose(1, 2)
        v = (x @ wv).view(b, t, kv, hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2).reshape(b, t, h * hd)
        return o @ wo

    def stats(fn):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(100):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        mean = statistics.fmean(times)
        return dict(mean_ms=mean, std_ms=statistics.pstdev(times), p99_ms=sorted(times)[math.ceil(0.99 * len(times)) - 1])

    for dtype in (torch.bfloat16, torch.float32):
        torch.backends.cuda.matmul.allow_tf32 = dtype == torch.float32
        name = "bf16" if dtype == torch.bfloat16 else "f32"
        w = 1 / math.sqrt(dm)
        params = [((torch.rand(*sh, device="cuda") * 2 - 1) * sc).to(dtype).requires_grad_() for sh, sc in [((b, t, dm), 1.0), ((dm, h * hd), w), ((dm, kv * hd), w), ((dm, kv * hd), w), ((h * hd, dm), w)]]
        # torch.compile in the modes the seed lists: the default, "reduce-overhead" (CUDA
        # graphs) and "max-autotune" (Triton templates for the products, autotuned, and
        # CUDA graphs); each compiled afresh (fresh Inductor cache, see run_gpu.sh).
        impls = [
            ("torch_eager_seed", seed),
            ("torch_compile_seed", torch.compile(seed)),
            ("torch_compile_seed_reduce_overhead", torch.compile(seed, mode="reduce-overhead")),
            ("torch_compile_seed_max_autotune", torch.compile(seed, mode="max-autotune")),
            ("torch_sdpa", sdpa),
            ("torch_compile_sdpa", torch.compile(sdpa)),
            ("torch_compile_sdpa_reduce_overhead", torch.compile(sdpa, mode="reduce-overhead")),
        ]
        for impl, fn in impls:
            # Each compiled mode from scratch: Dynamo caches compiled frames per function
            # (here across modes and element types), which would hand one mode another's code.
            torch._dynamo.reset()
            def fwd():
                with torch.no_grad():
                    fn(*params)

            def step():
                for p in params:
                    p.grad = None
                fn(*params).sum().backward()

            try:
                # The first step compiles (torch.compile) and checks that it runs; its wall
                # time, to the end of its work, is the first-call time (fresh Inductor and
                # Triton caches per run_gpu.sh step).
                t0 = time.perf_counter()
                step()
                torch.cuda.synchronize()
                first_call_ms = (time.perf_counter() - t0) * 1e3
                torch.cuda.reset_peak_memory_stats()
                row = dict(forward=stats(fwd), step=stats(step))
                emit(bench="block", impl=impl, dtype=name, b=b, t=t, d=dm, h=h, kv=kv, hd=hd, **{f"{k}_{m}": v for k, r in row.items() for m, v in r.items()}, peak_mib=torch.cuda.max_memory_allocated() / 2**20, first_call_ms=first_call_ms)
            except Exception as e:  # noqa: BLE001 - report and go on
                FAILED.append(f"block {name} {impl}: {e}")
                emit(bench="block", impl=impl, dtype=name, failed=str(e)[:300])
            torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False


# The seed's block under JAX's jit, in a child process (JAX and PyTorch each take the GPU's
# memory their own way; the child also keeps JAX's allocator from preallocating).
CHILD_JAX = r"""
import os, sys, json, math, time, statistics
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import numpy as np
import jax, jax.numpy as jnp
# The seed's shape, or another given as `b,t,d,h,kv,hd` (to try the script small).
b, t, dm, h, kv, hd = (int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "4,1024,512,8,4,64").split(","))

def block(x, wq, wk, wv, wo):
    q = (x @ wq).reshape(b, t, h, hd).transpose(0, 2, 1, 3)
    k = jnp.repeat((x @ wk).reshape(b, t, kv, hd).transpose(0, 2, 1, 3), h // kv, axis=1)
    v = jnp.repeat((x @ wv).reshape(b, t, kv, hd).transpose(0, 2, 1, 3), h // kv, axis=1)
    s = (q @ jnp.swapaxes(k, -1, -2)) / math.sqrt(hd)
    o = (jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(v.dtype) @ v).transpose(0, 2, 1, 3).reshape(b, t, h * hd)
    return o @ wo

def reference(p):
    # float64, batch element 0: the forward the check compares with.
    x, wq, wk, wv, wo = [np.asarray(a, dtype=np.float64) for a in p]
    x = x[0]
    q = (x @ wq).reshape(t, h, hd).transpose(1, 0, 2)
    k = np.repeat((x @ wk).reshape(t, kv, hd).transpose(1, 0, 2), h // kv, axis=0)
    v = np.repeat((x @ wv).reshape(t, kv, hd).transpose(1, 0, 2), h // kv, axis=0)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
    e = np.exp(s - s.max(-1, keepdims=True))
    o = ((e / e.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(t, h * hd)
    return o @ wo

fwd = jax.jit(block)
step = jax.jit(jax.grad(lambda *p: block(*p).astype(jnp.float32).sum(), argnums=(0, 1, 2, 3, 4)))
rng = np.random.default_rng(int(sys.argv[1]))
w = 1 / math.sqrt(dm)
# One element type per process (argv[3]), so that its device-memory peak is its own.
only = sys.argv[3] if len(sys.argv) > 3 else None
def peak_mib():
    # The allocator's peak since the process started (None where the backend keeps none).
    stats = jax.devices()[0].memory_stats() or {}
    return stats["peak_bytes_in_use"] / 2**20 if "peak_bytes_in_use" in stats else None
for name, dtype, bound in [("bf16", jnp.bfloat16, 2.0 ** -5), ("f32", jnp.float32, 2.0 ** -7)]:
    if only and name != only:
        continue
    host = [(rng.uniform(-1, 1, sh) * sc).astype(np.float32) for sh, sc in [((b, t, dm), 1.0), ((dm, h * hd), w), ((dm, kv * hd), w), ((dm, kv * hd), w), ((h * hd, dm), w)]]
    params = [jnp.asarray(a, dtype=dtype) for a in host]
    t0 = time.perf_counter()
    jax.block_until_ready(step(*params))
    first_call_ms = (time.perf_counter() - t0) * 1e3
    y = np.asarray(fwd(*params), dtype=np.float64)[0]
    want = reference([np.asarray(a, dtype=np.float64) for a in params])
    rel = float(np.linalg.norm(y - want) / np.linalg.norm(want))
    if not rel <= bound:
        raise SystemExit(f"jax {name}: forward off by {rel:e} relative L2 (bound {bound:e})")
    peak = {}
    def stats(fn, what):
        for _ in range(10):
            jax.block_until_ready(fn())
        times = []
        for _ in range(100):
            t1 = time.perf_counter()
            jax.block_until_ready(fn())
            times.append((time.perf_counter() - t1) * 1e3)
        # The peak of one step at a time (before the pipelined steps, whose 100 results
        # are alive at once).
        peak[what] = peak_mib()
        # Back to back: 100 steps dispatched, one wait (the host runs ahead of the GPU).
        t1 = time.perf_counter()
        outs = [fn() for _ in range(100)]
        jax.block_until_ready(outs)
        pipelined = (time.perf_counter() - t1) * 10.0
        mean = statistics.fmean(times)
        return dict(mean_ms=mean, std_ms=statistics.pstdev(times), p99_ms=sorted(times)[math.ceil(0.99 * len(times)) - 1], pipelined_ms=pipelined)
    # The step first: its peak is then that of the first call, the check and the step's
    # timed loop (the forward's pipelined results would raise it).
    row = dict(step=stats(lambda: step(*params), "step"), forward=stats(lambda: fwd(*params), "forward"))
    print(json.dumps(dict(bench="block", impl="jax_jit", dtype=name, b=b, t=t, d=dm, h=h, kv=kv, hd=hd, timer="wall, block_until_ready each", rel_l2=rel, bound=bound, first_call_ms=first_call_ms, jax=jax.__version__, device=str(jax.devices()[0]), peak_mib=peak["step"], **{f"{k}_{m}": v for k, r in row.items() for m, v in r.items()})))
"""


def jax_bench():
    """The seed's block (as `block_bench`) under `jax.jit`, forward and forward + backward
    (the gradients of y.sum() for x and every weight), bf16 and f32 (JAX's default
    precision: TF32 products on this GPU, as ours); the forward checked against float64 on
    one batch element (relative L2 within 2^-5 for bf16, 2^-7 for f32 with TF32 products:
    four products of 2^-11 operands). JAX has no CUDA
    events: each step is timed on the host to `block_until_ready` (10 warm-ups, 100 timed:
    mean, std, p99), and 100 steps back to back with one wait (`pipelined_ms`, the host
    running ahead), which is the closer to device time. Each element type in a process of
    its own: `peak_mib` is its allocator's peak through the first call, the check and the
    timed steps one at a time (`memory_stats()["peak_bytes_in_use"]`, preallocation off)."""
    for dtype in ["bf16", "f32"]:
        r = subprocess.run([sys.executable, "-c", CHILD_JAX, str(int(time.time())), "4,1024,512,8,4,64", dtype], capture_output=True, text=True)
        if r.returncode != 0:
            FAILED.append(f"jax {dtype}: {r.stderr.strip()[-500:]}")
            emit(bench="block", impl="jax_jit", dtype=dtype, failed=r.stderr.strip()[-300:])
            continue
        for line in r.stdout.splitlines():
            if line.startswith("{"):
                emit(**json.loads(line))


def linear_bench():
    """The `linear` rows' anchors (examples/bench.rs `linear`): `y = silu(x w + b) + r` in
    bf16 for each (m, n, k) of the spec (and `linear_cast`: x given in f32, cast to bf16), by torch eager (cuBLAS, then pointwise kernels),
    torch.compile (default: cuBLAS and one fused pointwise kernel) and torch.compile
    max-autotune-no-cudagraphs (Triton matmul templates with the epilogue fused, where they
    win its autotuning), each output checked, every element, against f64 relative to
    the terms |x| |w| + |b| + |r| + 1 at the spec's bound, then timed as ours (events, L2
    flushed)."""
    path = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("BENCH_SPEC")
    shapes = [json.loads(l) for l in open(path) if l.startswith("{") and json.loads(l)["spec"] == "linear"]
    f = lambda x, w, b, r: torch.nn.functional.silu(x @ w + b) + r
    f_cast = lambda x, w, b, r: torch.nn.functional.silu(x.to(torch.bfloat16) @ w + b) + r
    for s in shapes:
        m, n, k, bound = s["m"], s["n"], s["k"], s["bound"]
        x, w, b, r = [(torch.rand(*sh, device="cuda") * 2 - 1).to(torch.bfloat16) for sh in [(m, k), (k, n), (n,), (m, n)]]
        xd, wd, bd, rd = x.double(), w.double(), b.double(), r.double()
        ref = torch.nn.functional.silu(xd @ wd + bd) + rd
        scale = xd.abs() @ wd.abs() + bd.abs() + rd.abs() + 1.0
        nbytes = 2 * (m * k + k * n + n + 2 * m * n)
        x32 = x.float()
        for bench, fx, xin, nb in [("linear", f, x, nbytes), ("linear_cast", f_cast, x32, nbytes + 2 * m * k)]:
            for impl, fn in [("torch_eager", fx), ("torch_compile", None), ("torch_compile_max_autotune", None)]:
                t0 = time.perf_counter()
                if fn is None:
                    torch._dynamo.reset()
                    fn = torch.compile(fx, mode="max-autotune-no-cudagraphs" if "max" in impl else None)
                out = fn(xin, w, b, r)
                torch.cuda.synchronize()
                first_s = time.perf_counter() - t0
                config = f"m={m} n={n} k={k}"
                chk = guarded(bench, impl, "bf16", config, lambda: check(out, ref, scale, bound, f"{bench} {impl} {config}"))
                if chk:
                    row(bench, impl, "bf16", nb, timed(lambda: fn(xin, w, b, r)), chk, config=config, m=m, n=n, k=k, first_call_s=first_s)


if __name__ == "__main__":
    {"linear": linear_bench, "suite": suite, "coldstart": coldstart, "launch": launch, "rows": rows_bench, "matmul": matmul_bench, "attention": attention_bench, "flex": flex_bench, "block": block_bench, "jax": jax_bench}[sys.argv[1]]()
    if FAILED:
        raise SystemExit(f"anchors.py: {len(FAILED)} check(s) failed (the check_failed rows); their rows were not timed")
