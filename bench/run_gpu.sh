#!/usr/bin/env bash
# On the GPU machine, from the repository root, after `bash bench/pack.sh` here:
#   bash bench/run_gpu.sh [OUTDIR [STEP...]]
# Runs the example, the GPU tests, our benchmark suite and the Triton/PyTorch anchors in
# one go, then writes OUTDIR/results.jsonl, OUTDIR/report.md and OUTDIR/chart.png (and, with
# the attention rows, OUTDIR/attention.md and attention.png: bench/attention_report.py).
#
# STEPs (default: all): example tests suite coldstart launch rows tune matmul linear attention score_mod anchors (or one
# of anchors-suite anchors-coldstart anchors-launch anchors-rows anchors-matmul anchors-linear anchors-attention anchors-flex anchors-block anchors-jax) report; and `sanitize`
# (not part of `all`: slow), the GPU tests under compute-sanitizer (bench/sanitize.sh). With steps named,
# results are appended to OUTDIR/results.jsonl instead of replacing it, so a run can be
# split over several commands (a device command may last at most 10 minutes), e.g.
#   bash bench/run_gpu.sh $OUT example tests suite coldstart launch
#   bash bench/run_gpu.sh $OUT rows tune
#   bash bench/run_gpu.sh $OUT anchors-suite anchors-coldstart anchors-launch
#   bash bench/run_gpu.sh $OUT anchors-rows report
# on the same machine and build (OUTDIR/build.txt, OUTDIR/command.txt record both).
#
# Caches: every step runs on fresh, empty cache directories (ours: RUTILE_CACHE_DIR and
# RUTILE_TUNE_DIR; the anchors': TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR), so no step
# can time a kernel that an older compiler built or a configuration that an older tuning
# run chose. The one exception is deliberate: the warm half of each cold-start pair reuses
# the directory its cold half has just filled, because the warm cache is what it measures.
#
# Spread: every timed row is repeated BENCH_REPEATS times (default 5) in one process, on
# both sides; report.py shows the median and the min-max and calls a comparison "level"
# when the two sides' ranges overlap. Cold starts are repeated BENCH_COLD_REPEATS times
# (default 3), each pair on its own fresh directory.
#
# Checks: `bench spec` (no GPU) writes OUTDIR/spec.jsonl, the error bound of every check and
# the configurations the row benchmarks sweep; our bench and bench/anchors.py both use it,
# so both sides are checked against the same bounds and sweep the same spaces.
set -uo pipefail
out=${1:-${OUT:-/tmp/rutile-bench}}
shift || true
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(all)
# want STEP: whether STEP was asked for ("anchors" also selects each anchors-* step).
want() {
  local s
  for s in "${steps[@]}"; do
    if [ "$s" = all ] || [ "$s" = "$1" ] || [ "$s-${1#anchors-}" = "$1" ]; then return 0; fi
  done
  return 1
}
mkdir -p "$out"
log="$out/results.jsonl"
if [ "${steps[*]}" = all ]; then : > "$log"; : > "$out/failures.txt"; : > "$out/command.txt"; else touch "$log" "$out/failures.txt"; fi
export BENCH_REPEATS=${BENCH_REPEATS:-5} BENCH_COLD_REPEATS=${BENCH_COLD_REPEATS:-3}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/rutile-bench.XXXXXX")
status=0
fail() { echo "FAILED: $1" | tee -a "$out/failures.txt"; status=1; }

# fresh NAME CMD...: run CMD with new, empty cache directories of its own.
fresh() {
  local d
  d=$(mktemp -d "$scratch/$1.XXXXXX")
  shift
  mkdir -p "$d/cache" "$d/tune" "$d/triton" "$d/inductor"
  RUTILE_CACHE_DIR="$d/cache" RUTILE_TUNE_DIR="$d/tune" TRITON_CACHE_DIR="$d/triton" TORCHINDUCTOR_CACHE_DIR="$d/inductor" "$@"
}

build=$(cat .gpu/build.txt 2>/dev/null || echo "unknown (no .gpu/build.txt: packed by an older bench/pack.sh)")
echo "bash bench/run_gpu.sh $out ${steps[*]}: started $(date -u '+%F %H:%M:%SZ'), BENCH_REPEATS=$BENCH_REPEATS, build: $build, host: $(hostname)" >> "$out/command.txt"
echo "$build" > "$out/build.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, '/ triton', triton.__version__, '/ CUDA', torch.version.cuda)" | tee -a "$out/device.txt"

echo "== spec (bounds and sweeps shared with the anchors)"
fresh spec bash .gpu/run bench spec > "$out/spec.jsonl" || { fail "bench spec"; exit 1; }

if want example; then
  echo "== example"
  fresh example bash .gpu/run relu_mul_add 2>&1 | tee "$out/example.txt" || fail example
  fresh example bash .gpu/run gqa_attention 2>&1 | tee "$out/gqa_attention.txt" || fail "gqa_attention example"
fi

if want tests; then
  echo "== GPU tests"
  # GPU tests outside `gpu::` are named `.._on_a_gpu..` (graph plans and gradients on the
  # GPU against the interpreter, CUDA-graph replays).
  fresh tests bash .gpu/run all gpu:: on_a_gpu interp:: rows:: bench_smoke:: tune:: --test-threads=1 > "$out/tests.txt" 2>&1
  rc=$?
  echo "test binary exit status: $rc" >> "$out/tests.txt"
  grep -E "^test result|FAILED|panicked|exit status" "$out/tests.txt"
  if [ "$rc" != 0 ]; then
    # A kernel's fault is sticky for the process's CUDA context: every test after it in
    # the process fails too. Each failed test (the first 20) again in a process of its
    # own tells the tests that fail alone from those that only followed one.
    grep -E "^test .* \.\.\. FAILED" "$out/tests.txt" | awk '{print $2}' | head -20 | while read -r t; do
      alone="alone-${t//::/_}.txt"
      fresh tests-alone bash .gpu/run all --exact "$t" < /dev/null > "$out/$alone" 2>&1
      if grep -q "^test result: ok. 1 passed" "$out/$alone"; then
        echo "$t: passes alone (it failed after another test's error)"
      else
        echo "$t: FAILS alone ($alone)"
      fi
    done | tee "$out/tests-alone.txt"
    fail "GPU tests (exit status $rc; tests-alone.txt says which fail alone)"
  fi
fi

if want suite; then
  echo "== ours: suite"
  fresh suite bash .gpu/run bench suite | tee -a "$log" || fail "ours: suite"
fi

# CUDA_CACHE_DISABLE=1 keeps the driver's own JIT cache out of the cold numbers.
if want coldstart; then
  echo "== ours: cold start ($BENCH_COLD_REPEATS pairs)"
  for i in $(seq "$BENCH_COLD_REPEATS"); do
    cache=$(mktemp -d "$scratch/coldstart.XXXXXX")
    # Cold: the empty directory. Warm: a second new process on the directory the cold one
    # just filled -- the cache reused on purpose, since it is what this row measures.
    for label in cold warm; do
      CUDA_CACHE_DISABLE=1 RUTILE_CACHE_DIR=$cache RUTILE_TUNE_DIR=$cache/tune bash .gpu/run bench coldstart | tee -a "$log" || fail "ours: coldstart ($label)"
    done
  done
fi

if want launch; then
  echo "== ours: launch"
  fresh launch bash .gpu/run bench launch | tee -a "$log" || fail "ours: launch"
fi

if want rows; then
  echo "== ours: rows (softmax, RMSNorm, transpose)"
  fresh rows bash .gpu/run bench rows | tee -a "$log" || fail "ours: rows"
fi

if want tune; then
  echo "== ours: autotuning"
  tunedir=$(mktemp -d "$scratch/tune.XXXXXX")
  mkdir -p "$tunedir/cache" "$tunedir/tune"
  RUTILE_CACHE_DIR="$tunedir/cache" RUTILE_TUNE_DIR="$tunedir/tune" bash .gpu/run bench tune | tee -a "$log" || fail "ours: tune"
  # The tuning files this run wrote, as one archive: file names like `relu_mul_add[T=f32].json`
  # and their number would keep the device tool from returning the folder's other results.
  rm -rf "$out/tune" "$out/tune.tar.gz" && tar -czf "$out/tune.tar.gz" -C "$tunedir" tune
fi

if want matmul; then
  echo "== ours: matmul"
  fresh matmul bash .gpu/run bench matmul | tee -a "$log" || fail "ours: matmul"
fi

if want linear; then
  echo "== ours: linear layer with an epilogue (graph fuser)"
  fresh linear bash .gpu/run bench linear | tee -a "$log" || fail "ours: linear"
fi

if want attention; then
  echo "== ours: attention"
  fresh attention bash .gpu/run bench attention | tee -a "$log" || fail "ours: attention"
  # The configurations the tuned rows chose (`Options::tune`): the tuner's results files,
  # as a tarball (their names hold characters the device tool does not bring back).
  rm -rf "$out/tune-attention" "$out/tune-attention.tar.gz"
  tar -czf "$out/tune-attention.tar.gz" -C "$(ls -d "$scratch"/attention.* | head -1)" tune 2>/dev/null || true
fi

if want score_mod; then
  echo "== ours: attention with score modifications"
  fresh score_mod bash .gpu/run bench score_mod | tee -a "$log" || fail "ours: score_mod"
fi

for m in suite coldstart launch rows matmul linear attention flex block jax; do
  want "anchors-$m" || continue
  echo "== anchors: $m"
  fresh "anchors-$m" python3 bench/anchors.py "$m" "$out/spec.jsonl" > "$out/anchors-$m.txt" 2>&1 || fail "anchors: $m (see anchors-$m.txt)"
  grep '^{"bench"' "$out/anchors-$m.txt" | tee -a "$log"
done
# Triton's sm_80 path (mma.sync) on the same shapes, for our mma.sync path.
if want anchors-matmul; then
  echo "== anchors: matmul, Triton with DISABLE_MMA_V3=1"
  DISABLE_MMA_V3=1 fresh anchors-matmul-v2 python3 bench/anchors.py matmul "$out/spec.jsonl" > "$out/anchors-matmul-v2.txt" 2>&1 || fail "anchors: matmul mma v2 (see anchors-matmul-v2.txt)"
  grep '^{"bench"' "$out/anchors-matmul-v2.txt" | tee -a "$log"
fi

# Named only: `all` does not include it.
if [[ " ${steps[*]} " == *" sanitize "* ]]; then
  echo "== compute-sanitizer over the GPU tests"
  fresh sanitize bash bench/sanitize.sh "$out/sanitize" || fail "compute-sanitizer (see sanitize/)"
fi

if want report; then
  echo "== report"
  python3 bench/report.py "$log" "$out/device.txt" "$out" "$out/tests.txt" || fail report
  # Issue 14's attention table and chart (attention.md, attention.png), where the run has
  # our attention rows (their `attention_plan` lines name the default launch).
  if grep -q '"bench":"attention_plan"' "$log"; then
    python3 bench/attention_report.py "$out/device.txt" "$log" "$out" > /dev/null || fail "attention report"
  fi
fi
rm -rf "$scratch"
[ "$status" = 0 ] || { echo "some steps failed:"; cat "$out/failures.txt"; }
exit "$status"
