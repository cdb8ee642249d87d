#!/usr/bin/env bash
# Call 2 (build 64290b5): GPU tests; the backward rows A/B (bench_base: 21ee433, a delta
# kernel; bench: delta computed in the dQ kernel); the seed block (example) and its
# PyTorch anchors (eager, torch.compile). Outputs tarred into $OUT/c2.tgz.
set -u
out=$1; mkdir -p $out
fresh() { RUTILE_CACHE_DIR=$(mktemp -d) RUTILE_TUNE_DIR=$(mktemp -d) "$@"; }
fresh timeout 200 bash .gpu/run all gpu:: on_a_gpu > $out/gpu-tests.txt 2>&1; echo "tests rc=$? $(date +%T)" >> $out/log.txt
C='b=4 t=1024 h=8 kv=4 d=64 causal'
R='"stages":3,"block_m":64,"block_n":64,"warps":4,"wgmma":true,"ws":false,"overlap":false'
for r in 1 2; do
  for b in bench_base bench; do
    fresh env BENCH_ATTENTION_SEED_ONLY=1 BENCH_ATTENTION_ONLY="$C=false;$R|$C=true;$R" \
      timeout 110 bash .gpu/run $b attention > $out/$b-r$r.jsonl 2> $out/$b-r$r.err
    echo "$b r=$r rc=$? $(date +%T)" >> $out/log.txt
  done
done
timeout 330 bash bench/run_gpu.sh $out/block example anchors-block > $out/block-log.txt 2>&1; echo "block rc=$? $(date +%T)" >> $out/log.txt
tar czf $OUT/c2.tgz -C $out .
