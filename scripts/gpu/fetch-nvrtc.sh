#!/usr/bin/env bash
# Fetches NVRTC (the CUDA run-time compiler, a PyPI wheel: no GPU, driver or toolkit needed)
# so that the `cuda` feature's tests compile the kernels on any x86-64 Linux machine.
# Prints the folder holding libnvrtc.so.13; put it on LD_LIBRARY_PATH.
#
#   export LD_LIBRARY_PATH=$(bash scripts/gpu/fetch-nvrtc.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${1:-$ROOT/target/nvrtc}"
VER="13.0.88"
LIB="$DIR/nvidia/cu13/lib"
if [ ! -e "$LIB/libnvrtc.so.13" ]; then
    mkdir -p "$DIR"
    python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2010_x86_64 \
        -d "$DIR" "nvidia-cuda-nvrtc==$VER" >&2
    python3 -m zipfile -e "$DIR"/nvidia_cuda_nvrtc-"$VER"-*.whl "$DIR" >&2
fi
echo "$LIB"
