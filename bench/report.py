"""Turn one run's results.jsonl into a Markdown report and a chart.

  python3 bench/report.py RESULTS.jsonl DEVICE.txt OUTDIR [TESTS.txt]

Writes OUTDIR/report.md and OUTDIR/chart.png (GB/s per workload: ours, Triton, torch.compile,
PyTorch eager, with the copy-bandwidth ceiling and each bar's min-max over the repeats). Run
where matplotlib is installed (the GPU machine has it).

Spread and the "level" rule: every timed row carries the median of its repeats (`ms`) and
their range (`ms_min`..`ms_max`; `runs` holds them all), measured the same way on both sides
in one process each. A ratio is the anchor's median over ours, with the range
[anchor min / ours max, anchor max / ours min]. When the two sides' ranges overlap the row
says "level" instead of a winner. Where a row sweeps configurations, each side's best
(lowest median) configuration is the one compared.

GPU tests: TESTS.txt (default OUTDIR/tests.txt) is the test binary's output from the same run.
The report counts the tests of tests/all/gpu.rs that need a GPU (those marked
`#[cfg_attr(not(feature = "gpu"), ignore ..)]`) which passed there, from that output.
"""
import datetime, json, os, re, statistics, sys
from collections import defaultdict

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
device = open(sys.argv[2]).read().strip().splitlines()
out = sys.argv[3]
tests_path = sys.argv[4] if len(sys.argv) > 4 else os.path.join(out, "tests.txt")
here = os.path.dirname(os.path.abspath(__file__))
MAIN = ["triton", "torch_compile", "torch_eager"]


def runs(r, prefix=""):
    return r.get(prefix + "runs") or [r[prefix + "ms"]]


class Stat:
    """Median and range of one configuration's repeated timings."""

    def __init__(self, xs, config=None):
        self.runs = list(xs)
        nan = float("nan")
        # No runs (e.g. every cold-start run compiled because the cache was unwritable):
        # the cell says so instead of failing the whole report.
        self.med, self.lo, self.hi = (statistics.median(self.runs), min(self.runs), max(self.runs)) if self.runs else (nan, nan, nan)
        self.config = config

    def cell(self, digits=4):
        if not self.runs:
            return "no runs"
        return f"{self.med:.{digits}f} ({self.lo:.{digits}f}–{self.hi:.{digits}f})"


def best(rs, prefix=""):
    """The best (lowest median) configuration of an implementation's rows."""
    groups = defaultdict(list)
    for r in rs:
        groups[r.get("config")].extend(runs(r, prefix))
    return min((Stat(v, c) for c, v in groups.items()), key=lambda s: s.med)


def verdict(anchor, ours, who="ours"):
    """Ratio anchor / ours (above 1: ours faster), its range, and "level" when the ranges overlap."""
    v, lo, hi = anchor.med / ours.med, anchor.lo / ours.hi, anchor.hi / ours.lo
    if anchor.lo <= ours.hi and ours.lo <= anchor.hi:
        word = "level"
    else:
        word = f"{who} faster" if v > 1 else f"{who} slower"
    return f"{v:.3f} ({lo:.3f}–{hi:.3f}) {word}"


copy_rows = [r for r in rows if r["bench"] == "copy"]
copy = statistics.median([r["gbs"] for r in copy_rows]) if copy_rows else float("nan")
mm = next((r["tflops"] for r in rows if r["bench"] == "matmul_bf16_8192"), None)
by = defaultdict(dict)  # (bench, dtype) -> impl -> list of rows
for r in rows:
    if "impl" in r and "ms" in r:
        by[(r["bench"], r["dtype"])].setdefault(r["impl"], []).append(r)

lines = [
    f"Device: {device[0]}  ",
    f"Software: {device[1] if len(device) > 1 else ''}  ",
]
build = os.path.join(out, "build.txt")
if os.path.exists(build):
    lines.append(f"Build: {open(build).read().strip()}  ")
lines += [
    f"Date: {datetime.date.today().isoformat()}  ",
    f"Ceilings measured in this run: copy {copy:.0f} GB/s (1 GiB device-to-device, read + write)"
    + (f", bf16 matmul 8192^3 {mm:.0f} TFLOP/s" if mm else ""),
    "",
]

failed = [r for r in rows if "check_failed" in r]
if failed:
    lines.append(f"**{len(failed)} check(s) failed; those rows were not timed and are missing below:**")
    lines += [f"- {r['bench']} {r['dtype']} {r['impl']} {r.get('config', '')}: {r['check_failed']}" for r in failed]
    lines.append("")

# GPU tests, counted from the test output of this run.
gated = []
try:
    src = open(os.path.join(here, "..", "tests", "all", "gpu.rs")).read()
    gated = re.findall(r'#\[cfg_attr\(not\(feature\s*=\s*"gpu"\),\s*ignore[^\]]*\]\s*(?:#\[[^\]]*\]\s*)*(?:pub\s+)?fn\s+(\w+)', src)
except OSError as e:
    lines.append(f"**GPU tests: tests/all/gpu.rs not readable ({e}).**")
if gated and os.path.exists(tests_path):
    text = open(tests_path, errors="replace").read()
    status = dict(re.findall(r"^test gpu::(\w+) \.\.\. (\w+)", text, re.M))
    passed = [t for t in gated if status.get(t) == "ok"]
    missing = [f"{t} ({status.get(t, 'did not run')})" for t in gated if status.get(t) != "ok"]
    summary = re.findall(r"^test result: .*$", text, re.M)
    lines.append(
        f"GPU tests: **{len(passed)} of the {len(gated)} tests in `tests/all/gpu.rs` that need a GPU passed on the device in this run**"
        + (f"; not passed: {', '.join(missing)}" if missing else "")
        + f" (counted from `tests.txt`; {'; '.join(s.replace('test result: ', '') for s in summary) or 'no test result line'})."
    )
    for mod in ["interp", "rows", "bench_smoke", "tune", "cache"]:
        ok = len(re.findall(rf"^test {mod}::\w+ \.\.\. ok", text, re.M))
        bad = len(re.findall(rf"^test {mod}::\w+ \.\.\. FAILED", text, re.M))
        if ok or bad:
            lines.append(f"- `{mod}::` tests in the same run: {ok} passed, {bad} failed")
    lines.append("")
elif gated:
    lines += [f"**GPU tests: no test output at {tests_path}.**", ""]

lines += [
    "Times in ms: median of the repeats (min–max). Ratios: the anchor's median over ours (above 1: ours faster), "
    "with their range [anchor min / ours max – anchor max / ours min]; \"level\" where the two ranges overlap.",
    "",
    "| workload | dtype | ours ms | ours GB/s | % of copy | Triton ms | torch.compile ms | eager ms | Triton / ours | compile / ours | eager / ours |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
chart = []
for (bench, dtype), impls in by.items():
    if "ours" not in impls:
        continue
    o = best(impls["ours"])
    nbytes = impls["ours"][0]["bytes"]
    gbs = nbytes / o.med / 1e6
    st = {k: best(v) for k, v in impls.items()}
    cell = lambda impl: st[impl].cell() if impl in st else "–"
    ratio = lambda impl: verdict(st[impl], o) if impl in st else "–"
    lines.append(
        f"| {bench} | {dtype} | {o.cell()} | {gbs:.0f} | {100 * gbs / copy:.1f}% | {cell('triton')} | {cell('torch_compile')} | {cell('torch_eager')} | {ratio('triton')} | {ratio('torch_compile')} | {ratio('torch_eager')} |"
    )
    if not bench.endswith(("_tuned", "_unchecked")):
        chart.append((f"{bench}\n{dtype}", {k: (nbytes / st[k].med / 1e6, nbytes / st[k].hi / 1e6, nbytes / st[k].lo / 1e6) for k in ["ours"] + MAIN if k in st}))

others = [(b, d, i) for (b, d), impls in by.items() if "ours" in impls for i in impls if i not in ["ours"] + MAIN]
if others:
    lines += ["", "Other anchors (shown for reference, not the rows' anchors):", "", "| workload | dtype | anchor | its ms | anchor / ours |", "|---|---|---|---|---|"]
    for b, d, i in others:
        a, o = best(by[(b, d)][i]), best(by[(b, d)]["ours"])
        lines.append(f"| {b} | {d} | {i} | {a.cell()} | {verdict(a, o)} |")

lines += ["", "Where a row sweeps configurations (num_warps, rows per program, tile), each side's best is shown:", ""]
for (bench, dtype), impls in by.items():
    cfgs = []
    for impl, rs in impls.items():
        b = best(rs)
        if b.config:
            n = len({r.get("config") for r in rs})
            cfgs.append(f"{impl} {b.config} (best of {n})")
    if cfgs:
        lines.append(f"- {bench} {dtype}: " + ", ".join(cfgs))

lines += ["", "Checks (every element of every timed output against a float64 reference; largest error in units of each element's scale, over all configurations):", "",
          "| workload | dtype | bound | ours | Triton | torch.compile | eager |", "|---|---|---|---|---|---|---|"]
for (bench, dtype), impls in by.items():
    if "ours" not in impls:
        continue
    worst = lambda impl: (f"{max(r.get('max_rel', float('nan')) for r in impls[impl]):.2e}" if impl in impls and all("max_rel" in r for r in impls[impl]) else "–")
    bounds = {r["bound"] for rs in impls.values() for r in rs if "bound" in r}
    bound = ", ".join(f"{b:.2e}" for b in sorted(bounds)) + (" (sides differ!)" if len(bounds) > 1 else "")
    lines.append(f"| {bench} | {dtype} | {bound} | {worst('ours')} | {worst('triton')} | {worst('torch_compile')} | {worst('torch_eager')} |")
lines.append("")

cold = [r for r in rows if r["bench"] == "coldstart"]
lines += ["| getting a kernel running | first launch, cold cache (ms) | first launch, warm cache, new process (ms) |", "|---|---|---|"]
ours_cold = [r for r in cold if "impl" not in r]
if ours_cold:
    c = Stat([r["first_launch_ms"] for r in ours_cold if r["compiled"] >= 1])
    w = Stat([r["first_launch_ms"] for r in ours_cold if r["compiled"] == 0])
    ctx = statistics.median([r["runtime_ms"] for r in ours_cold])
    lines.append(f"| ours | {c.cell(1)} | {w.cell(2)} (+{ctx:.0f} ms CUDA context creation) |")
for impl in ["triton", "torch_compile"]:
    rs = [r for r in cold if r.get("impl") == impl]
    if rs:
        c = Stat([r["first_call_ms"] for r in rs if r["cache"] == "cold"])
        w = Stat([r["first_call_ms"] for r in rs if r["cache"] == "warm"])
        lines.append(f"| {impl} | {c.cell(0)} | {w.cell(0)} |")
graph_cold = [r for r in cold if "first_graph_ms" in r]
if graph_cold:
    lines += ["", "| the fuser's seed as a graph: build, compile, first run, after one launch in the process | first call, cold cache (ms) | first call, warm cache, new process (ms) |", "|---|---|---|"]
    ours = [r for r in graph_cold if "impl" not in r]
    if ours:
        lines.append(f"| ours (graph → fuser → plan) | {Stat([r['first_graph_ms'] for r in ours if r['compiled'] >= 1]).cell(1)} | {Stat([r['first_graph_ms'] for r in ours if r['compiled'] == 0]).cell(1)} |")
    tc = [r for r in graph_cold if r.get("impl") == "torch_compile"]
    if tc:
        lines.append(f"| torch.compile | {Stat([r['first_graph_ms'] for r in tc if r['cache'] == 'cold']).cell(0)} | {Stat([r['first_graph_ms'] for r in tc if r['cache'] == 'warm']).cell(0)} |")
lines.append("")
lines.append("Cold and warm: each pair on its own fresh cache directory, the warm launch a second new process on the same directory; median (min–max) over the pairs.")

launch = [r for r in rows if r["bench"] in ("launch", "launch_driver_floor")]
lines += ["", "| host time per launch of a cached tiny kernel, no syncs | µs | launches/s |", "|---|---|---|"]
for r in launch:
    name = "raw cuLaunchKernel (driver floor)" if r["bench"] == "launch_driver_floor" else r.get("impl", "ours")
    s = Stat(r.get("host_us_runs") or [r["host_us_per_launch"]])
    lines.append(f"| {name} | {s.cell(2)} | {1e6 / s.med:.0f} |")

plan_host = [r for r in rows if r["bench"] == "plan_host"]
if plan_host:
    lines += ["", "| a graph's run, each run alone (2000 a round) | kernels | host µs to return | wall µs to a synchronize after it |", "|---|---|---|---|"]
    for r in plan_host:
        lines.append(f"| {r['graph']}, {r['impl']} | {r.get('kernels', '–')} | {Stat(r['host_us_runs']).cell(2)} | {Stat(r['wall_us_runs']).cell(2)} |")

checked = [r for r in rows if r["bench"] == "checked_launch"]
if checked:
    lines += ["", "| checked launches (bounds checks + a sync to read the record) vs plain, both synchronized | µs plain | µs checked | checked / plain |", "|---|---|---|---|"]
    for r in checked:
        lines.append(f"| relu-mul-add f32, n = {r['n']} | {r['us_plain']:.2f} ({r['us_plain_min']:.2f}–{r['us_plain_max']:.2f}) | {r['us_checked']:.2f} ({r['us_checked_min']:.2f}–{r['us_checked_max']:.2f}) | {r['us_checked'] / r['us_plain']:.3f} |")

tune = [r for r in rows if r["bench"] == "tune"]
if tune:
    lines += ["", "| kernel | n | tuned configuration | default ms | tuned ms | default / tuned | sweep (s) |", "|---|---|---|---|---|---|---|"]
    for r in tune:
        d, t = Stat(runs(r, "default_")), Stat(runs(r, "tuned_"))
        lines.append(f"| {r['kernel']} | 2^{r['n'].bit_length() - 1} | {r['tuned']} | {d.cell()} | {t.cell()} | {verdict(d, t, 'tuned')} | {r['sweep_s']:.2f} |")

open(f"{out}/report.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

impls = ["ours"] + MAIN
colors = {"ours": "#b7410e", "triton": "#4c72b0", "torch_compile": "#55a868", "torch_eager": "#8c8c8c"}
fig, ax = plt.subplots(figsize=(max(11, 0.9 * len(chart)), 4.5))
width = 0.2
for i, impl in enumerate(impls):
    have = [(j, g[impl]) for j, (_, g) in enumerate(chart) if impl in g]
    xs = [j + (i - 1.5) * width for j, _ in have]
    ys = [v[0] for _, v in have]
    err = [[v[0] - v[1] for _, v in have], [v[2] - v[0] for _, v in have]]
    ax.bar(xs, ys, width, yerr=err, capsize=2, label=impl.replace("_", " "), color=colors[impl])
ax.axhline(copy, color="black", linestyle="--", linewidth=1, label=f"copy bandwidth {copy:.0f} GB/s")
ax.set_xticks(range(len(chart)))
ax.set_xticklabels([k for k, _ in chart], fontsize=7)
ax.set_ylabel("GB/s (minimum bytes moved / median time)")
ax.set_title(f"Memory-bound kernels, {device[0].split(',')[0]} (bars: median; whiskers: min–max of the repeats)")
ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=5)
fig.tight_layout()
fig.savefig(f"{out}/chart.png", dpi=120)
