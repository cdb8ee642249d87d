#!/usr/bin/env bash
# Build the example, the benchmarks and the GPU test binary (LLVM linked statically) and
# pack them into .gpu/ for the GPU machine (see README, "On the GPU machine"). Also writes
# .gpu/build.txt (the commit the binaries were built from, and whether the tree had changes
# beyond it), which run_gpu.sh copies next to the results.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
cargo build --release -p examples --examples
bin=$(cargo test --release -p tests --features gpu --no-run --message-format=json 2>/dev/null \
  | python3 -c "import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['name'] == 'all': print(m['executable'])")
../shared/tools/gpu-pack target/release/examples/relu_mul_add target/release/examples/gqa_attention target/release/examples/bench "$bin"
dirty=$([ -z "$(git status --porcelain --untracked-files=no)" ] || echo " plus uncommitted changes")
echo "commit $(git rev-parse --short=12 HEAD)$dirty, built $(date -u '+%F %H:%MZ')" > .gpu/build.txt
cat .gpu/build.txt
