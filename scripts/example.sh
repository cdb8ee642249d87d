#!/usr/bin/env bash
# Quick start 1: install what is missing, then run the relu-mul-add example (on the GPU
# when there is one, on the CPU interpreter otherwise; it says which).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo run --release -p examples --example relu_mul_add -- "$@"
