#!/usr/bin/env bash
# Build the example, the benchmarks and the GPU test binary (LLVM linked statically) and
# pack them into .gpu/ for the GPU machine (see README, "On the GPU machine").
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
cargo build --release -p examples --examples
bin=$(cargo test --release -p tests --features gpu --no-run --message-format=json 2>/dev/null \
  | python3 -c "import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['name'] == 'all': print(m['executable'])")
../shared/tools/gpu-pack target/release/examples/relu_mul_add target/release/examples/bench "$bin"
