"""Turn one run's results.jsonl into a Markdown report and a chart.

  python3 bench/report.py RESULTS.jsonl DEVICE.txt OUTDIR

Writes OUTDIR/report.md (tables with ratios to the anchors measured in the same run) and
OUTDIR/chart.png (GB/s per workload: ours, Triton, torch.compile, PyTorch eager, with the
copy-bandwidth ceiling). Run where matplotlib is installed (the GPU machine has it).
"""
import datetime, json, sys
from collections import defaultdict

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
device = open(sys.argv[2]).read().strip().splitlines()
out = sys.argv[3]

copy = next(r["gbs"] for r in rows if r["bench"] == "copy")
mm = next((r["tflops"] for r in rows if r["bench"] == "matmul_bf16_8192"), None)
by = defaultdict(dict)  # (bench, dtype) -> impl -> list of rows
for r in rows:
    if "impl" in r and "ms" in r:
        by[(r["bench"], r["dtype"])].setdefault(r["impl"], []).append(r)


def med(rs, key):
    """Median over repeated runs of one configuration; with several configurations (the
    rows kernels sweep num_warps and tiles, on each side), the best configuration's."""
    groups = defaultdict(list)
    for x in rs:
        groups[x.get("config")].append(x[key])
    meds = [sorted(v)[len(v) // 2] for v in groups.values()]
    return min(meds)


def best_config(rs):
    groups = defaultdict(list)
    for x in rs:
        groups[x.get("config")].append(x["ms"])
    return min(groups, key=lambda c: sorted(groups[c])[len(groups[c]) // 2])


lines = [
    f"Device: {device[0]}  ",
    f"Software: {device[1] if len(device) > 1 else ''}  ",
    f"Date: {datetime.date.today().isoformat()}  ",
    f"Ceilings measured in this run: copy {copy:.0f} GB/s (1 GiB device-to-device, read + write)"
    + (f", bf16 matmul 8192^3 {mm:.0f} TFLOP/s" if mm else ""),
    "",
    "| workload | dtype | ours ms | ours GB/s | % of copy | Triton ms | torch.compile ms | eager ms | Triton / ours | compile / ours | eager / ours |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
chart = []
for (bench, dtype), impls in by.items():
    if "ours" not in impls:
        continue
    o = med(impls["ours"], "ms")
    gbs = impls["ours"][0]["bytes"] / o / 1e6
    cell = lambda impl: (f"{med(impls[impl], 'ms'):.4f}" if impl in impls else "–")
    ratio = lambda impl: (f"{med(impls[impl], 'ms') / o:.3f}" if impl in impls else "–")
    lines.append(
        f"| {bench} | {dtype} | {o:.4f} | {gbs:.0f} | {100 * gbs / copy:.1f}% | {cell('triton')} | {cell('torch_compile')} | {cell('torch_eager')} | {ratio('triton')} | {ratio('torch_compile')} | {ratio('torch_eager')} |"
    )
    chart.append((f"{bench}\n{dtype}", {k: impls[k][0]["bytes"] / med(impls[k], "ms") / 1e6 for k in ["ours", "triton", "torch_compile", "torch_eager"] if k in impls}))
lines += ["", "Ratios are the anchor's time over ours: above 1 means ours is faster. Where a row sweeps configurations (num_warps, tile), each side's best is shown:", ""]
for (bench, dtype), impls in by.items():
    cfgs = [f"{impl} {best_config(rs)}" for impl, rs in impls.items() if best_config(rs)]
    if cfgs:
        lines.append(f"- {bench} {dtype}: " + ", ".join(cfgs))
lines.append("")

cold = [r for r in rows if r["bench"] == "coldstart"]
lines += ["| getting a kernel running | first launch, cold cache (ms) | first launch, warm cache, new process (ms) |", "|---|---|---|"]
ours_cold = [r for r in cold if "impl" not in r]
if ours_cold:
    c = next(r for r in ours_cold if r["compiled"] == 1)
    w = next(r for r in ours_cold if r["compiled"] == 0)
    lines.append(f"| ours | {c['first_launch_ms']:.1f} | {w['first_launch_ms']:.2f} (+{w['runtime_ms']:.0f} ms CUDA context creation) |")
for impl in ["triton", "torch_compile"]:
    rs = {r["cache"]: r for r in cold if r.get("impl") == impl}
    if rs:
        lines.append(f"| {impl} | {rs['cold']['first_call_ms']:.0f} | {rs['warm']['first_call_ms']:.0f} |")
launch = [r for r in rows if r["bench"] in ("launch", "launch_driver_floor")]
lines += ["", "| host time per launch of a cached tiny kernel, no syncs | µs | launches/s |", "|---|---|---|"]
for r in launch:
    name = "raw cuLaunchKernel (driver floor)" if r["bench"] == "launch_driver_floor" else r.get("impl", "ours")
    lines.append(f"| {name} | {r['host_us_per_launch']:.2f} | {1e6 / r['host_us_per_launch']:.0f} |")
open(f"{out}/report.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

impls = ["ours", "triton", "torch_compile", "torch_eager"]
colors = {"ours": "#b7410e", "triton": "#4c72b0", "torch_compile": "#55a868", "torch_eager": "#8c8c8c"}
fig, ax = plt.subplots(figsize=(11, 4.5))
width = 0.2
for i, impl in enumerate(impls):
    xs = [j + (i - 1.5) * width for j in range(len(chart))]
    ys = [g.get(impl, 0) for _, g in chart]
    ax.bar(xs, ys, width, label=impl.replace("_", " "), color=colors[impl])
ax.axhline(copy, color="black", linestyle="--", linewidth=1, label=f"copy bandwidth {copy:.0f} GB/s")
ax.set_xticks(range(len(chart)))
ax.set_xticklabels([k for k, _ in chart], fontsize=8)
ax.set_ylabel("GB/s (minimum bytes moved / time)")
ax.set_title(f"Elementwise kernels, 2^26 elements, {device[0].split(',')[0]}")
ax.legend(fontsize=8, loc="lower right")
fig.tight_layout()
fig.savefig(f"{out}/chart.png", dpi=120)
