# Temporary: Triton RMSNorm with and without L2 flush, and its PTX.
import os, sys, torch, triton
sys.path.insert(0, os.path.dirname(__file__))
from anchors import rmsnorm_kernel, emit
out_dir = sys.argv[1]
r = n = 4096
x = torch.randn(r, n, device="cuda").to(torch.bfloat16)
w = torch.randn(n, device="cuda").to(torch.bfloat16)
out = torch.empty_like(x)
nbytes = 2 * x.numel() * 2 + n * 2
def noflush(f, reps=200):
    for _ in range(10): f()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts) // 2]
for warps in [4, 8, 16]:
    f = lambda: rmsnorm_kernel[(r,)](x, w, out, n, n, 1e-6, BLOCK=4096, num_warps=warps)
    f()
    ms = triton.testing.do_bench(f, warmup=50, rep=500, return_mode="median")
    emit(bench="rms_triton", impl="triton", dtype="bf16", config=f"warps={warps} flush", bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6)
    ms = noflush(f)
    emit(bench="rms_triton", impl="triton", dtype="bf16", config=f"warps={warps} noflush", bytes=nbytes, ms=ms, gbs=nbytes / ms / 1e6)
    k = rmsnorm_kernel.warmup(x, w, out, n, n, 1e-6, BLOCK=4096, num_warps=warps, grid=(r,))
    open(f"{out_dir}/triton_rms{warps}.ptx", "w").write(k.asm["ptx"])
src = torch.empty(r * n * 2, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
for big in [False, True]:
    if big:
        src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
    f = lambda: dst.copy_(src)
    nb = 2 * src.numel()
    emit(bench="copy", impl="torch", config=f"{src.numel() >> 20}MiB flush", ms=triton.testing.do_bench(f, warmup=50, rep=500, return_mode="median"), bytes=nb)
    emit(bench="copy", impl="torch", config=f"{src.numel() >> 20}MiB noflush", ms=noflush(f), bytes=nb)
