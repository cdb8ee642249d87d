"""Issue 14's attention rows of a run (`bench attention` and `anchors.py attention`) as a
Markdown table and a chart.

  python3 bench/attention_report.py [DEVICE.txt] RESULTS.jsonl [RESULTS.jsonl ...] OUTDIR

Where several files hold a case, the first row of each side counts. Ours is the library's untuned launch (`Options::default()`): at the seed-like shapes the
forward and backward rows whose configuration is the one the run's `attention_plan` line
gives for the case; at the Llama shapes the `"default":true` row. Times are device times
(`graph_ms`: calls replayed from a CUDA graph, both sides), median of the repeats with their
min-max. Forward + backward: ours is the sum of the forward's and the backward's device
times (ranges summed), the anchors' one graph of forward and backward (`fwdbwd_graph_ms`).
A ratio is the anchor's time over ours (above 1: ours faster), with the range [anchor min /
ours max, anchor max / ours min]; where the range holds 1 it says "level".

Writes OUTDIR/attention.md and, where matplotlib is installed, OUTDIR/attention.png
(TFLOP/s: 4 B H T^2 D a forward, halved when causal, 3.5 times that forward + backward).
"""
import json, sys

paths, out = sys.argv[1:-1], sys.argv[-1]
# The device: the first line of a run's device.txt ("NAME, DRIVER").
device = next((open(p).readline().split(",")[0].strip() for p in paths if p.endswith("device.txt")), "")
rows = [json.loads(l) for p in paths if not p.endswith("device.txt") for l in open(p) if l.strip().startswith("{")]
# Rows that did not run (a failed check, a configuration a side does not support) carry no
# shape and no time.
rows = [r for r in rows if "b" in r and not r.get("check_failed") and not r.get("unsupported")]
ANCHORS = [("torch_sdpa_cudnn", "cuDNN (SDPA)"), ("torch_sdpa_flash", "FlashAttention-2 (SDPA)"), ("triton_tutorial", "Triton tutorial")]
SHAPE = ("b", "t", "h", "kv", "d", "causal")


def case(r):
    return tuple(r[k] for k in SHAPE)


def timing(r, prefix="graph_"):
    """(median, min, max) device time of a row, or None."""
    if r is None or r.get(prefix + "ms") is None:
        return None
    return r[prefix + "ms"], r[prefix + "ms_min"], r[prefix + "ms_max"]


def plan_matches(r, p):
    """Whether forward row `r` runs the untuned plan `p`."""
    want = {"stages": p["stages"], "block_m": p["block_m"], "block_n": p["block_n"], "warps": p["warps"], "ws": p["ws"]}
    return r.get("wgmma") is True and all(r.get(k) == v for k, v in want.items()) and r.get("programs", 1) == p["programs"] and not r.get("overlap")


plans = {case(r): r for r in rows if r.get("bench") == "attention_plan"}
ours_fwd, ours_bwd, anchor = {}, {}, {}
for r in rows:
    if r.get("impl") == "ours" and r.get("bench") == "attention":
        c = case(r)
        if r.get("default") or (c in plans and plan_matches(r, plans[c])):
            ours_fwd.setdefault(c, r)
    elif r.get("impl") == "ours" and r.get("bench") == "attention_bwd":
        c = case(r)
        p = plans.get(c)
        if p and r.get("wgmma") and r.get("stages") == 3 and not r["tuned"] and not r["atomic"] and r["dkdv"] == p["dkdv"] and r["dq"] == p["dq"]:
            ours_bwd.setdefault(c, r)
    elif r.get("bench") in ("attention", "attention_bwd"):
        anchor.setdefault((r["bench"], r["impl"], case(r)), r)


def ratio(ours, other):
    med, lo, hi = other[0] / ours[0], other[1] / ours[2], other[2] / ours[1]
    return f"{med:.2f} ({lo:.2f}-{hi:.2f}){' level' if lo <= 1.0 <= hi else ''}"


def label(c):
    b, t, h, kv, d, causal = c
    return f"B{b} T{t} H{h}/KV{kv} D{d} {'causal' if causal else 'full'}"


def flops(c):
    b, t, h, kv, d, causal = c
    return 4.0 * b * h * t * t * d * (0.5 if causal else 1.0)


lines = ["| case | pass | ours ms (min-max) | ours' launch | " + " | ".join(f"{n} ms | {n} / ours" for _, n in ANCHORS) + " |", "|---|---|---|---|" + "---|---|" * len(ANCHORS)]
bars = []  # (label, {impl: TFLOP/s})
for c in sorted(ours_fwd, key=lambda c: (c[1] > 1024, c[1], c[5])):
    f = ours_fwd[c]
    fwd = timing(f)
    launch = "default" if f.get("default") else f"{f['block_m']} x {f['block_n']}, {f['warps']} warps, {f['stages']} stages{', warp-specialized' if f['ws'] else ''}{', ' + str(f['programs']) + ' programs an SM' if 'programs' in f else ''}"
    passes = [("forward", fwd, "attention", "graph_", 1.0, launch)]
    b = ours_bwd.get(c)
    if b and timing(b):
        bt = timing(b)
        passes.append(("forward + backward", tuple(x + y for x, y in zip(fwd, bt)), "attention_bwd", "fwdbwd_graph_", 3.5, f"+ backward dK/dV {b['dkdv'][0]} x {b['dkdv'][1]}, dQ {b['dq'][0]} x {b['dq'][1]} (backward alone {bt[0]:.4f} ms)"))
    for name, ours, bench, prefix, mult, how in passes:
        cells, tf = [], {"ours": mult * flops(c) / (ours[0] * 1e-3) / 1e12}
        for impl, _ in ANCHORS:
            a = timing(anchor.get((bench, impl, c)), prefix)
            cells.append(f"{a[0]:.4f} | {ratio(ours, a)}" if a else "- | -")
            if a:
                tf[impl] = mult * flops(c) / (a[0] * 1e-3) / 1e12
        lines.append(f"| {label(c)} | {name} | {ours[0]:.4f} ({ours[1]:.4f}-{ours[2]:.4f}) | {how} | " + " | ".join(cells) + " |")
        bars.append((f"{label(c)}\n{name}", tf))
open(f"{out}/attention.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
impls = [("ours", "ours (untuned default)")] + ANCHORS
fig, ax = plt.subplots(figsize=(12, 4.8))
w = 0.2
for j, (impl, name) in enumerate(impls):
    xs = [i + (j - 1.5) * w for i, (_, tf) in enumerate(bars) if impl in tf]
    ys = [tf[impl] for _, tf in bars if impl in tf]
    ax.bar(xs, ys, w, label=name)
ax.set_xticks(range(len(bars)))
ax.set_xticklabels([l for l, _ in bars], fontsize=7)
ax.set_ylabel("TFLOP/s (bf16, device time, median of 5)")
ax.set_title("Flash attention with grouped-query heads: ours vs cuDNN, FlashAttention-2 and Triton" + (f" ({device})" if device else ""))
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(f"{out}/attention.png", dpi=120)
