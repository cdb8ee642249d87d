#!/usr/bin/env bash
out=$1
C='b=4 t=1024 h=8 kv=4 d=64 causal'
FULL="$C=false;\"stages\":3,\"block_m\":128,\"block_n\":64,\"warps\":4,\"wgmma\":true,\"ws\":false,\"overlap\":false"
CAUS="$C=true;\"stages\":2,\"block_m\":64,\"block_n\":64,\"warps\":4,\"wgmma\":true,\"ws\":true,\"overlap\":false,\"programs\":3"
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
for row in FULL CAUS; do
  RUTILE_CACHE_DIR=$(mktemp -d) RUTILE_TUNE_DIR=$(mktemp -d) BENCH_REPEATS=1 BENCH_ATTENTION_SEED_ONLY=1 BENCH_ATTENTION_ONLY="${!row}" \
   timeout 200 ncu -k regex:'^attention$' --launch-skip 20 --launch-count 1 $S bash .gpu/run bench_base attention > $out/ncu-$row.txt 2>&1
done
timeout 200 ncu -k regex:'cudnn|fmha|flash|sm90' --launch-skip 2 --launch-count 2 $S python3 prof_sdpa.py > $out/ncu-cudnn.txt 2>&1
