#!/usr/bin/env bash
set -u
out=$1; mkdir -p $out
C='b=4 t=1024 h=8 kv=4 d=64 causal'
R='"stages":3,"block_m":64,"block_n":64,"warps":4,"wgmma":true,"ws":false,"overlap":false'
for r in 1 2; do
  RUTILE_CACHE_DIR=$(mktemp -d) RUTILE_TUNE_DIR=$(mktemp -d) BENCH_ATTENTION_SEED_ONLY=1 BENCH_ATTENTION_ONLY="$C=false;$R|$C=true;$R" \
    timeout 100 bash .gpu/run bench attention > $out/bwd-r$r.jsonl 2> $out/bwd-r$r.err
  echo "r=$r rc=$? $(date +%T)" >> $out/log.txt
done
