#!/usr/bin/env bash
# On the GPU machine, after `bash bench/pack.sh` here: run the GPU tests' kernels under
# NVIDIA's compute-sanitizer, one tool at a time, and write each tool's report to OUTDIR.
#   bash bench/sanitize.sh [OUTDIR] [TEST FILTER...]
# The default filter is every `gpu::` test except the ones that are slow under a
# sanitizer (2^31 elements, 10,000 launches) or fail on purpose (a failed device_assert,
# which memcheck reports as a trap; a 1 TiB allocation, which it reports as an API error). Exit status: non-zero if any tool reported an error.
set -uo pipefail
out=${1:-${OUT:-/tmp/rutile-sanitize}}
shift || true
mkdir -p "$out"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -z "$san" ]; then
  echo "compute-sanitizer is not on this machine (PyPI carries only its API library, nvidia-cuda-sanitizer-api-cu12, not the tool)" | tee "$out/sanitizer.txt"
  exit 2
fi
filter=("$@")
if [ ${#filter[@]} -eq 0 ]; then
  filter=(gpu:: --skip offsets_past_2_pow_31 --skip many_launches --skip device_assert --skip bad_launches_and_allocations)
fi
status=0
for tool in memcheck racecheck synccheck initcheck; do
  "$san" --tool "$tool" --target-processes all --error-exitcode 99 \
    bash .gpu/run all "${filter[@]}" --test-threads=1 > "$out/sanitizer-$tool.txt" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$out/sanitizer-$tool.txt" | tr '\n' ' ')
  echo "compute-sanitizer --tool $tool: exit $rc; $summary" | tee -a "$out/sanitizer.txt"
  [ $rc -eq 0 ] || status=1
done
exit $status
