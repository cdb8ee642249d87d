"""Anchors for the foundation benchmarks, measured in the same run as ours.

  python3 bench/anchors.py bandwidth   copy bandwidth (torch), Triton and PyTorch relu-mul-add
  python3 bench/anchors.py coldstart   Triton first call, cold cache and warm cache (new processes)
  python3 bench/anchors.py launch      host time per launch: Triton and PyTorch eager

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


def bandwidth():
    n = 1 << 26
    dev = "cuda"
    # Copy bandwidth: 1 GiB device-to-device, bytes read + written.
    x = torch.randn(1 << 28, device=dev)
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=50, rep=500, return_mode="median")
    emit(bench="copy", bytes=2 * x.numel() * 4, ms=ms, gbs=2 * x.numel() * 4 / ms / 1e6)
    del x, y
    for dtype, name, esize, blocks in [(torch.float32, "f32", 4, [(1024, 4)]), (torch.bfloat16, "bf16", 2, [(1024, 4), (2048, 4), (4096, 8)])]:
        a, b, c = (torch.randn(n, device=dev, dtype=dtype) for _ in range(3))
        ref = (torch.relu(a.double()) * b.double() + c.double())
        for block, warps in blocks:
            out = torch.full_like(a, float("nan"))
            triton_rma(a, b, c, out, block, warps)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < (1e-6 if dtype == torch.float32 else 1e-2), err
            ms = triton.testing.do_bench(lambda: triton_rma(a, b, c, out, block, warps), warmup=50, rep=500, return_mode="median")
            emit(bench="relu_mul_add", impl="triton", dtype=name, block=block, n=n, ms=ms, gbs=4 * n * esize / ms / 1e6, rel_err=err)
        ms = triton.testing.do_bench(lambda: torch.relu(a) * b + c, warmup=50, rep=500, return_mode="median")
        emit(bench="relu_mul_add", impl="torch_eager", dtype=name, n=n, ms=ms, gbs=4 * n * esize / ms / 1e6)
        f = torch.compile(lambda a, b, c: torch.relu(a) * b + c)
        f(a, b, c)
        ms = triton.testing.do_bench(lambda: f(a, b, c), warmup=50, rep=500, return_mode="median")
        emit(bench="relu_mul_add", impl="torch_compile", dtype=name, n=n, ms=ms, gbs=4 * n * esize / ms / 1e6)


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


def coldstart():
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TRITON_CACHE_DIR=d)
        for label in ["cold", "warm"]:
            r = subprocess.run([sys.executable, "-c", CHILD, os.path.abspath(__file__)], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(r.stderr)
            emit(bench="coldstart", impl="triton", cache=label, **json.loads(r.stdout.strip().splitlines()[-1]))


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


if __name__ == "__main__":
    {"bandwidth": bandwidth, "coldstart": coldstart, "launch": launch}[sys.argv[1]]()
