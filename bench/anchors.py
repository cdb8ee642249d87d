"""Anchors for the benchmark suite, measured in the same run as ours.

  python3 bench/anchors.py suite       copy bandwidth (torch), then every workload of
                                       examples/src/workloads.rs in Triton, PyTorch eager and
                                       torch.compile
  python3 bench/anchors.py coldstart   Triton and torch.compile first call, cold and warm cache (new processes)
  python3 bench/anchors.py launch      host time per launch: Triton and PyTorch eager
  python3 bench/anchors.py rows        softmax f32/bf16, RMSNorm bf16 (4096 x 4096), softmax f32
                                       on short rows (32768 x 128), transpose f32 (8192 x 8192):
                                       Triton (the tutorial kernels) and PyTorch

Prints one JSON object per line. Correctness is checked before any timing.
"""
import json, os, subprocess, sys, tempfile, time

import torch
import triton
import triton.language as tl


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


def emit(**kw):
    print(json.dumps(kw), flush=True)


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
    """(name, dtype, bytes, inputs, outputs-to-poison, triton fn, torch fn, float64 reference fn)."""
    f = lambda dt=torch.float32: torch.empty(n, device="cuda", dtype=torch.float32).uniform_(-4, 4).to(dt)
    a, b, c = f(), f(), f()
    ha, hb, hc = a.bfloat16(), b.bfloat16(), c.bfloat16()
    o32, o16 = torch.empty(n, device="cuda"), torch.empty(n, device="cuda", dtype=torch.bfloat16)
    y = b.clone()
    hh = a.half()
    o_h = torch.empty(n, device="cuda", dtype=torch.float16)
    xi = (a * 100).int()
    o_i, o_f = torch.empty_like(xi), torch.empty(n, device="cuda", dtype=torch.uint8)

    def clamp_torch():
        c = torch.clamp(xi, -150, 200)
        return c, (xi != c).to(torch.uint8)

    rows = [
        ("relu_mul_add", "f32", 16 * n, o32, lambda: triton_rma(a, b, c, o32), lambda: torch.relu(a) * b + c,
         lambda: torch.relu(a.double()) * b.double() + c.double(), lambda: o32),
        ("relu_mul_add", "bf16", 8 * n, o16, lambda: triton_rma(ha, hb, hc, o16, 2048), lambda: torch.relu(ha) * hb + hc,
         lambda: torch.relu(ha.double()) * hb.double() + hc.double(), lambda: o16),
        ("axpy", "f32", 12 * n, None, lambda: axpy_kernel[grid(n, 1024)](a, y, 0.75, n, BLOCK=1024), lambda: y.add_(a, alpha=0.75),
         None, None),
        ("gelu_tanh", "f32", 8 * n, o32, lambda: gelu_kernel[grid(n, 1024)](c, o32, n, BLOCK=1024), lambda: gelu_ref(c),
         lambda: gelu_ref(c.double()), lambda: o32),
        ("silu_mul", "bf16", 6 * n, o16, lambda: silu_mul_kernel[grid(n, 2048)](ha, hb, o16, n, BLOCK=2048),
         lambda: torch.nn.functional.silu(ha) * hb, lambda: torch.nn.functional.silu(ha.double()) * hb.double(), lambda: o16),
        ("f32_to_bf16", "f32->bf16", 6 * n, o16, lambda: cast_kernel[grid(n, 2048)](a, o16, n, BLOCK=2048), lambda: a.bfloat16(),
         lambda: a.bfloat16().double(), lambda: o16),
        ("scale_shift", "f16", 4 * n, o_h, lambda: scale_shift_kernel[grid(n, 2048)](hh, o_h, 0.5, -1.25, n, BLOCK=2048),
         lambda: (hh.float() * 0.5 - 1.25).half(), lambda: hh.double() * 0.5 - 1.25, lambda: o_h),
        ("bf16_to_f32", "bf16->f32", 6 * n, o32, lambda: cast_kernel[grid(n, 2048)](ha, o32, n, BLOCK=2048), lambda: ha.float(),
         lambda: ha.double(), lambda: o32),
        ("clamp_i32", "i32", 9 * n, o_i, lambda: clamp_kernel[grid(n, 1024)](xi, o_i, o_f, -150, 200, n, BLOCK=1024), clamp_torch,
         lambda: torch.cat([torch.clamp(xi, -150, 200).double(), (xi != torch.clamp(xi, -150, 200)).double()]),
         lambda: torch.cat([o_i.double(), o_f.double()])),
    ]
    return rows


def bench(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=500, return_mode="median")


def suite():
    n = 1 << 26
    x = torch.randn(1 << 28, device="cuda")
    yy = torch.empty_like(x)
    ms = bench(lambda: yy.copy_(x))
    emit(bench="copy", bytes=2 * x.numel() * 4, ms=ms, gbs=2 * x.numel() * 4 / ms / 1e6)
    del x, yy
    torch.cuda.empty_cache()
    # bf16 matmul ceiling, for later rows and the report header.
    m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench(lambda: m @ m)
    emit(bench="matmul_bf16_8192", tflops=2 * 8192**3 / ms / 1e9, ms=ms)
    del m
    for name, dtype, nbytes, poison, tfn, torch_fn, ref_fn, out_fn in workloads(n):
        if ref_fn is not None:
            poison.fill_(float("nan") if poison.is_floating_point() else 0x5A)
            tfn()
            ref = ref_fn()
            err = ((out_fn().double() - ref).norm() / ref.norm()).item()
            tol = {"f32": 1e-6, "f16": 1e-3, "i32": 0.0, "bf16->f32": 0.0, "f32->bf16": 0.0}.get(dtype, 1e-2)
            if name == "gelu_tanh":
                tol = 1e-5
            assert err <= tol and err == err, (name, dtype, err)
        else:
            err = None
        ms = bench(tfn)
        emit(bench=name, impl="triton", dtype=dtype, n=n, bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6, rel_err=err)
        ms = bench(torch_fn)
        emit(bench=name, impl="torch_eager", dtype=dtype, n=n, bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6)
        if name != "axpy":
            cf = torch.compile(torch_fn)
            cf()
            ms = bench(cf)
            emit(bench=name, impl="torch_compile", dtype=dtype, n=n, bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6)
        torch.cuda.empty_cache()


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    # Triton's fused-softmax tutorial kernel, one program per row.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    y = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride + cols, (x * r * w).to(tl.bfloat16), mask=mask)


@triton.jit
def transpose_kernel(x_ptr, out_ptr, rows, cols, TILE: tl.constexpr):
    r = tl.program_id(1) * TILE + tl.arange(0, TILE)
    c = tl.program_id(0) * TILE + tl.arange(0, TILE)
    m = (r[:, None] < rows) & (c[None, :] < cols)
    t = tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=m)
    tl.store(out_ptr + c[:, None] * rows + r[None, :], tl.trans(t), mask=tl.trans(m))


def rows_bench():
    r = n = 4096
    for dtype, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        x = torch.randn(r, n, device="cuda").to(dtype)
        out = torch.empty_like(x)
        ref = torch.softmax(x.double(), dim=1)
        nbytes = 2 * x.numel() * x.element_size()
        for warps in [4, 8, 16]:
            f = lambda: softmax_kernel[(r,)](out, x, x.stride(0), out.stride(0), n, BLOCK=4096, num_warps=warps)
            out.fill_(float("nan")); f()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < (1e-5 if name == "f32" else 1e-2), err
            ms = bench(f)
            emit(bench="softmax", impl="triton", dtype=name, config=f"BLOCK=4096 warps={warps}", bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6, rel_err=err)
        ms = bench(lambda: torch.softmax(x, dim=1))
        emit(bench="softmax", impl="torch_eager", dtype=name, bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6)
        cf = torch.compile(lambda t: torch.softmax(t, dim=1)); cf(x)
        ms = bench(lambda: cf(x))
        emit(bench="softmax", impl="torch_compile", dtype=name, bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6)
    # Short rows: 32768 x 128 f32, one row per program (the tutorial kernel's grid).
    rr, nn = 32768, 128
    x = torch.randn(rr, nn, device="cuda")
    out = torch.empty_like(x)
    ref = torch.softmax(x.double(), dim=1)
    nbytes = 2 * x.numel() * 4
    for warps in [1, 2, 4]:
        f = lambda: softmax_kernel[(rr,)](out, x, x.stride(0), out.stride(0), nn, BLOCK=128, num_warps=warps)
        out.fill_(float("nan")); f()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-5, err
        ms = bench(f)
        emit(bench="softmax_short_rows", impl="triton", dtype="f32", config=f"BLOCK=128 warps={warps}", bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6, rel_err=err)
    ms = bench(lambda: torch.softmax(x, dim=1))
    emit(bench="softmax_short_rows", impl="torch_eager", dtype="f32", bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6)
    cf = torch.compile(lambda t: torch.softmax(t, dim=1)); cf(x)
    ms = bench(lambda: cf(x))
    emit(bench="softmax_short_rows", impl="torch_compile", dtype="f32", bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6)
    x = torch.randn(r, n, device="cuda").to(torch.bfloat16)
    # The copy ceiling at this size (32 MiB each way, below the 1 GiB copy's bandwidth).
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    emit(bench="copy_4096x4096_bf16", impl="torch", dtype="bf16", bytes=2 * x.numel() * 2, ms=ms, gbs=2 * x.numel() * 2 / ms / 1e6)
    del y
    w = torch.randn(n, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(x)
    xd = x.double()
    ref = xd * torch.rsqrt((xd * xd).mean(dim=1, keepdim=True) + 1e-6) * w.double()
    nbytes = 2 * x.numel() * 2 + n * 2
    for warps in [4, 8, 16]:
        f = lambda: rmsnorm_kernel[(r,)](x, w, out, n, n, 1e-6, BLOCK=4096, num_warps=warps)
        out.fill_(float("nan")); f()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, err
        ms = bench(f)
        emit(bench="rmsnorm", impl="triton", dtype="bf16", config=f"BLOCK=4096 warps={warps}", bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6, rel_err=err)
    tf = lambda: torch.nn.functional.rms_norm(x, (n,), w, 1e-6)
    ms = bench(tf)
    emit(bench="rmsnorm", impl="torch_eager", dtype="bf16", bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6)
    cf = torch.compile(tf); cf()
    ms = bench(cf)
    emit(bench="rmsnorm", impl="torch_compile", dtype="bf16", bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6)
    t = 8192
    x = torch.randn(t, t, device="cuda")
    out = torch.empty_like(x)
    nbytes = 2 * x.numel() * 4
    for tile, warps in [(32, 4), (64, 4), (64, 8)]:
        f = lambda: transpose_kernel[(t // tile, t // tile)](x, out, t, t, TILE=tile, num_warps=warps)
        out.fill_(float("nan")); f()
        assert torch.equal(out, x.t())
        ms = bench(f)
        emit(bench="transpose", impl="triton", dtype="f32", config=f"TILE={tile} warps={warps}", bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6)
    ms = bench(lambda: out.copy_(x.t()))
    emit(bench="transpose", impl="torch_eager", dtype="f32", bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6)
    # Copy bandwidth in this run, the ceiling for all three.
    y = torch.randn(1 << 28, device="cuda"); yy = torch.empty_like(y)
    ms = bench(lambda: yy.copy_(y))
    emit(bench="copy", bytes=2 * y.numel() * 4, ms=ms, gbs=2 * y.numel() * 4 / ms / 1e6)


CHILD = r"""
import time, json, torch
t0 = time.perf_counter()
import triton, triton.language as tl
import importlib.util, sys
spec = importlib.util.spec_from_file_location("anchors", sys.argv[1]); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
n = 4096
a = torch.randn(n, device="cuda"); b = torch.randn(n, device="cuda"); c = torch.randn(n, device="cuda"); out = torch.empty_like(a)
torch.cuda.synchronize()
t1 = time.perf_counter()
m.triton_rma(a, b, c, out)
torch.cuda.synchronize()
t2 = time.perf_counter()
ok = bool(torch.allclose(out, torch.relu(a) * b + c, rtol=1e-6, atol=1e-6))
print(json.dumps(dict(first_call_ms=(t2 - t1) * 1e3, correct=ok)))
"""


CHILD_COMPILE = r"""
import time, json, torch
n = 4096
a = torch.randn(n, device="cuda"); b = torch.randn(n, device="cuda"); c = torch.randn(n, device="cuda")
torch.cuda.synchronize()
t1 = time.perf_counter()
f = torch.compile(lambda a, b, c: torch.relu(a) * b + c)
out = f(a, b, c)
torch.cuda.synchronize()
t2 = time.perf_counter()
ok = bool(torch.allclose(out, torch.relu(a) * b + c, rtol=1e-6, atol=1e-6))
print(json.dumps(dict(first_call_ms=(t2 - t1) * 1e3, correct=ok)))
"""


def coldstart():
    for impl, child in [("triton", CHILD), ("torch_compile", CHILD_COMPILE)]:
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(d, "triton"), TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"))
            for label in ["cold", "warm"]:
                r = subprocess.run([sys.executable, "-c", child, os.path.abspath(__file__)], env=env, capture_output=True, text=True)
                if r.returncode != 0:
                    raise SystemExit(r.stderr)
                emit(bench="coldstart", impl=impl, cache=label, **json.loads(r.stdout.strip().splitlines()[-1]))


def launch():
    n = 1024
    a, b, c = (torch.randn(n, device="cuda") for _ in range(3))
    out = torch.empty_like(a)
    for _ in range(1000):
        triton_rma(a, b, c, out)
    torch.cuda.synchronize()
    iters = 20000
    t = time.perf_counter()
    for _ in range(iters):
        triton_rma(a, b, c, out)
    host = (time.perf_counter() - t) * 1e6 / iters
    torch.cuda.synchronize()
    emit(bench="launch", impl="triton", host_us_per_launch=host)
    t = time.perf_counter()
    for _ in range(iters):
        torch.add(a, b, out=out)
    host = (time.perf_counter() - t) * 1e6 / iters
    torch.cuda.synchronize()
    emit(bench="launch", impl="torch_eager_add", host_us_per_launch=host)
    cf = torch.compile(lambda a, b, c: torch.relu(a) * b + c)
    for _ in range(100):
        cf(a, b, c)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        cf(a, b, c)
    host = (time.perf_counter() - t) * 1e6 / iters
    torch.cuda.synchronize()
    emit(bench="launch", impl="torch_compile", host_us_per_launch=host)


if __name__ == "__main__":
    {"suite": suite, "coldstart": coldstart, "launch": launch, "rows": rows_bench}[sys.argv[1]]()
