#!/usr/bin/env bash
# Quick start 2: install what is missing, then run the whole test suite (no GPU needed:
# GPU tests are ignored unless built with `--features gpu`, see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo test --workspace "$@"
