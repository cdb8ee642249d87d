#!/usr/bin/env bash
# On the GPU machine, from the repository root, after `bash bench/pack.sh` here:
#   bash bench/run_gpu.sh [OUTDIR]
# Runs the example, the GPU tests, our benchmark suite and the Triton/PyTorch anchors in
# one go, then writes OUTDIR/results.jsonl, OUTDIR/report.md and OUTDIR/chart.png.
set -uo pipefail
out=${1:-${OUT:-/tmp/rutile-bench}}
mkdir -p "$out"
log="$out/results.jsonl"
: > "$log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, '/ triton', triton.__version__, '/ CUDA', torch.version.cuda)" | tee -a "$out/device.txt"
echo "== example"; bash .gpu/run relu_mul_add 2>&1 | tee "$out/example.txt"
echo "== GPU tests"; bash .gpu/run all gpu:: interp:: rows:: bench_smoke:: --test-threads=1 2>&1 | tee "$out/tests.txt" | grep -E "test result|FAILED|panicked"
echo "== ours: suite (3 runs)"; for i in 1 2 3; do bash .gpu/run bench suite | tee -a "$log"; done
# CUDA_CACHE_DISABLE=1 keeps the driver's own JIT cache out of the cold numbers.
echo "== ours: cold start"; cache=$(mktemp -d)
for i in 1 2; do CUDA_CACHE_DISABLE=1 RUTILE_CACHE_DIR=$cache bash .gpu/run bench coldstart | tee -a "$log"; done
echo "== ours: launch"; bash .gpu/run bench launch | tee -a "$log"
echo "== ours: rows (softmax, RMSNorm, transpose)"; bash .gpu/run bench rows | tee -a "$log"
echo "== ours: autotuning"; RUTILE_TUNE_DIR="$out/tune" bash .gpu/run bench tune | tee -a "$log"
echo "== anchors"; for m in suite coldstart launch rows; do python3 bench/anchors.py $m 2>&1 | grep '^{' | tee -a "$log"; done
echo "== report"; python3 bench/report.py "$log" "$out/device.txt" "$out"
