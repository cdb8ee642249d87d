#!/usr/bin/env bash
# On the GPU machine: Nsight Compute reports of the flash-attention forward at one shape,
# ours and Triton's tutorial kernel side by side, to see where a gap between them lies.
#
#   bash bench/profile_attention.sh OUT [CASE] [TRITON_CONFIG]
#
# CASE is a row's case as `bench attention` prints it (default the seed shape, full:
# "b=4 t=1024 h=8 kv=4 d=64 causal=false"). Writes to OUT: the tuner's choice for the
# case (`tuned.json`, tuned first, not profiled), then one `ncu --set full` report each
# for our tuned forward, our untuned 64 x 64 tile on 4 warps at 3 stages, and Triton's
# tutorial kernel at TRITON_CONFIG (default its pick at the seed shape, "64 64 4 2":
# BM BN warps stages). Clocks are left alone (`--clock-control none`, METHOD.md).
set -uo pipefail
out=${1:?usage: bash bench/profile_attention.sh OUT [CASE] [TRITON_CONFIG]}
case_=${2:-"b=4 t=1024 h=8 kv=4 d=64 causal=false"}
triton_config=${3:-"64 64 4 2"}
cd "$(dirname "$0")/.."
mkdir -p "$out/cache" "$out/tune"
export RUTILE_CACHE_DIR="$out/cache" RUTILE_TUNE_DIR="$out/tune"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "profile_attention: no ncu on this machine" >&2; exit 2; }
ncu_run() { "$ncu" --clock-control none --set full --launch-count 1 --target-processes all "$@"; }

tuned='"tuned":true,"wgmma":true'
BENCH_ATTENTION_ROWS=tuned BENCH_ATTENTION_ONLY="$case_;$tuned" bash .gpu/run bench attention > "$out/tune-run.txt" 2>&1
for f in "$out"/tune/attention*.json; do echo "== $f"; cat "$f"; echo; done > "$out/tuned.json"

BENCH_ATTENTION_ROWS=tuned BENCH_ATTENTION_ONLY="$case_;$tuned" ncu_run --kernel-name regex:'^attention' \
  bash .gpu/run bench attention > "$out/ncu-ours-tuned.txt" 2>&1
fixed='"stages":3,"block_m":64,"block_n":64,"warps":4,"wgmma":true,"ws":false,"overlap":false'
BENCH_ATTENTION_ONLY="$case_;$fixed" ncu_run --kernel-name regex:'^attention' \
  bash .gpu/run bench attention > "$out/ncu-ours-64x64-w4-s3.txt" 2>&1

# Triton's tutorial kernel (bench/anchors.py) at one configuration, no autotuning.
read -r bm bn warps stages <<< "$triton_config"
eval "$(echo "$case_" | tr ' ' '\n' | sed 's/^/s_/')"
cat > "$out/triton_one.py" <<EOF
import sys, torch
sys.path.insert(0, "bench")
sys.argv = ["anchors.py"]
import anchors
from triton.tools.tensor_descriptor import TensorDescriptor
b, t, h, kv, d, causal = $s_b, $s_t, $s_h, $s_kv, $s_d, "$s_causal" == "true"
q = (torch.rand(b, h, t, d, device="cuda") * 2 - 1).to(torch.bfloat16)
k = (torch.rand(b, kv, t, d, device="cuda") * 2 - 1).to(torch.bfloat16)
v = (torch.rand(b, kv, t, d, device="cuda") * 2 - 1).to(torch.bfloat16)
o = torch.empty_like(q)
lse = torch.empty(b * h * t, device="cuda", dtype=torch.float32)
desc = lambda x, rows: TensorDescriptor.from_tensor(x.view(-1, d), [rows, d])
grid = (t // $bm, b * h)
anchors.triton_attention_kernel.fn[grid](desc(q, $bm), desc(k, $bn), desc(v, $bn), desc(o, $bm), lse, h, kv, t,
    d ** -0.5 * 1.4426950408889634, D=d, CAUSAL=causal, BM=$bm, BN=$bn, num_warps=$warps, num_stages=$stages)
torch.cuda.synchronize()
EOF
ncu_run --kernel-name regex:'triton_attention' python3 "$out/triton_one.py" > "$out/ncu-triton-$bm-$bn-w$warps-s$stages.txt" 2>&1
ls -la "$out"
