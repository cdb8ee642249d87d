#!/usr/bin/env bash
# Install what building and testing need on Debian 12, only where missing:
#   - LLVM 19 development files, linked statically into every binary (llvm-19-dev,
#     libpolly-19-dev, zlib/zstd/ffi dev files);
#   - ptxas, from PyPI's nvidia-cuda-nvcc-cu12 wheel, so PTX is validated without a GPU;
#   - nvdisasm, from PyPI's nvidia-cuda-nvdisasm wheel, so tests can read the machine code
#     (SASS) of a kernel, e.g. that a `dot` became tensor-core HMMA instructions.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
need_apt=()
command -v llvm-config-19 >/dev/null 2>&1 || need_apt+=(llvm-19-dev)
[ -e /usr/lib/llvm-19/lib/libPolly.a ] || need_apt+=(libpolly-19-dev)
for p in zlib1g-dev libzstd-dev libffi-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! python3 -c "import nvidia.cuda_nvcc, os, sys; sys.exit(not os.path.exists(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], 'bin', 'ptxas')))" 2>/dev/null; then
  echo "installing ptxas (nvidia-cuda-nvcc-cu12)"
  python3 -m pip install -q nvidia-cuda-nvcc-cu12==12.9.86
fi
if ! python3 -c "import nvidia, os, glob, sys; sys.exit(not glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'bin', 'nvdisasm')))" 2>/dev/null; then
  echo "installing nvdisasm (nvidia-cuda-nvdisasm)"
  python3 -m pip install -q nvidia-cuda-nvdisasm==13.5.37
fi
