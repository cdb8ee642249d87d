#!/usr/bin/env bash
# Call 3 (build in .gpu/build.txt): the seed shape's attention rows with cuDNN, FA2 and
# Triton in the same run; then the Llama rows with theirs. Tarred into $OUT/c3.tgz.
set -u
out=$1; mkdir -p $out
BENCH_ATTENTION_SEED_ONLY=1 timeout 320 bash bench/run_gpu.sh $out/seed attention anchors-attention > $out/seed-log.txt 2>&1; echo "seed rc=$? $(date +%T)" >> $out/log.txt
BENCH_ATTENTION_LLAMA_ONLY=1 timeout 230 bash bench/run_gpu.sh $out/llama attention anchors-attention > $out/llama-log.txt 2>&1; echo "llama rc=$? $(date +%T)" >> $out/log.txt
tar czf $OUT/c3.tgz -C $out .
