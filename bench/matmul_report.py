"""Matmul rows of a run (`bench matmul` and `anchors.py matmul`) as a Markdown table and a chart.

  python3 bench/matmul_report.py RESULTS.jsonl OUTDIR

Writes OUTDIR/matmul.md (TFLOP/s per shape and dtype: ours (and its split-K path where
`bench` runs it: the small-M shapes; its sm_80 path forced, the fastest of the tiles `bench`
runs it at, on the large 16-bit squares), Triton's mma.sync path
(DISABLE_MMA_V3=1), Triton, cuBLAS with an f32 and with a bf16/f16 output, ours with a
16-bit output where `bench` runs it (the large 16-bit squares); ratios of ours to each with
their ranges over the repeats, and of ours with a 16-bit output to cuBLAS's) and OUTDIR/matmul.png (bf16 TFLOP/s over shapes) where
matplotlib is installed. A ratio whose range includes 1 is "level".
"""
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
out = sys.argv[2]
IMPLS = [("ours", "ours"), ("ours-split-k", "ours split-K"), ("ours-mma-sync", "ours mma.sync"), ("triton_mma_v2", "Triton mma.sync"), ("triton", "Triton"), ("torch_f32_out", "cuBLAS f32 out"), ("torch", "cuBLAS 16-bit out"), ("ours-16-out", "ours 16-bit out")]
by = {}
for r in rows:
    if r.get("bench") == "matmul" and "ms" in r:
        key = (r["m"], r["n"], r["k"], r["dtype"], r["impl"])
        # Our forced mma.sync rows are one per tile: the fastest stands for the path.
        if key not in by or r["impl"] != "ours-mma-sync" or r["ms"] < by[key]["ms"]:
            by[key] = r
shapes = []
for r in rows:
    if r.get("bench") != "matmul" or "m" not in r:
        continue
    s = (r["m"], r["n"], r["k"])
    if s not in shapes:
        shapes.append(s)


def tflops(r, ms):
    return 2.0 * r["m"] * r["n"] * r["k"] / ms / 1e9


def ratio(ours, other):
    """ours / other in throughput (other's time / ours), with the range over the repeats."""
    med = other["ms"] / ours["ms"]
    lo, hi = other["ms_min"] / ours["ms_max"], other["ms_max"] / ours["ms_min"]
    tag = " level" if lo <= 1.0 <= hi else ""
    return f"{med:.2f} ({lo:.2f}-{hi:.2f}){tag}"


lines = ["| m x n x k | dtype | " + " | ".join(f"{name} TFLOP/s" for _, name in IMPLS) + " | ours / Triton mma.sync | ours / Triton | ours / cuBLAS f32 out | ours split-K / cuBLAS f32 out | ours mma.sync / Triton mma.sync | ours 16-bit out / cuBLAS 16-bit out | ours' config |",
         "|---|---|" + "---|" * (len(IMPLS) + 7)]
for (m, n, k) in shapes:
    for dtype in ["bf16", "f16", "f32"]:
        if not any((m, n, k, dtype, impl) in by for impl, _ in IMPLS):
            continue
        cells = []
        for impl, _ in IMPLS:
            r = by.get((m, n, k, dtype, impl))
            cells.append(f"{tflops(r, r['ms']):.1f}" if r else "-")
        ours = by.get((m, n, k, dtype, "ours"))
        rat = [ratio(ours, by[(m, n, k, dtype, i)]) if ours and (m, n, k, dtype, i) in by else "-" for i in ["triton_mma_v2", "triton", "torch_f32_out"]]
        split, cublas = by.get((m, n, k, dtype, "ours-split-k")), by.get((m, n, k, dtype, "torch_f32_out"))
        rat.append(ratio(split, cublas) if split and cublas else "-")
        forced, v2 = by.get((m, n, k, dtype, "ours-mma-sync")), by.get((m, n, k, dtype, "triton_mma_v2"))
        rat.append(ratio(forced, v2) + f" ({forced['config']})" if forced and v2 else "-")
        o16, c16 = by.get((m, n, k, dtype, "ours-16-out")), by.get((m, n, k, dtype, "torch"))
        rat.append(ratio(o16, c16) if o16 and c16 else "-")
        lines.append(f"| {m} x {n} x {k} | {dtype} | " + " | ".join(cells) + " | " + " | ".join(rat) + f" | {ours['config'] if ours else '-'} |")
open(f"{out}/matmul.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
fig, ax = plt.subplots(figsize=(11, 4.5))
w = 0.11
for j, (impl, name) in enumerate(IMPLS):
    xs, ys = [], []
    for i, (m, n, k) in enumerate(shapes):
        r = by.get((m, n, k, "bf16", impl))
        if r:
            xs.append(i + (j - len(IMPLS) // 2) * w)
            ys.append(tflops(r, r["ms"]))
    ax.bar(xs, ys, w, label=name)
ax.set_xticks(range(len(shapes)))
ax.set_xticklabels([f"{m}x{n}x{k}" for m, n, k in shapes], fontsize=8)
ax.set_ylabel("TFLOP/s (bf16 in, median of 5)")
ax.set_title("matmul on an H100: ours (mma.sync, cp.async pipeline) vs Triton and cuBLAS")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(f"{out}/matmul.png", dpi=120)
