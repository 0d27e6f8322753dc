#!/usr/bin/env bash
# The GPU checks in one run, on a machine with an NVIDIA GPU, PyTorch and NVRTC:
# torch.topk's anchor timings (which also write the shared buffers), then gradwire-gpu-check.
# Everything lands in $OUT (default /tmp/gpu-out): torch-topk.json, gpu-check.json, the logs.
#
#   bash scripts/gpu/device-check.sh [PATH/TO/gradwire-gpu-check] [extra check flags...]
set -u
BIN=${1:-target/release/gradwire-gpu-check}
shift || true
OUT=${OUT:-/tmp/gpu-out}
DATA=${DATA:-/tmp/gwdata}
mkdir -p "$OUT" "$DATA"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia-smi.txt" 2>&1
# NVRTC from the CUDA toolkit or from the nvidia-cuda-nvrtc wheel, whichever is there.
NV=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so.1[0-9]*' 2>/dev/null | grep -v alt | head -1)
if [ -n "$NV" ]; then
    export LD_LIBRARY_PATH="$(dirname "$NV")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "nvrtc: ${NV:-none found}" | tee "$OUT/env.txt"
PYTHONUNBUFFERED=1 timeout 240 python3 scripts/gpu/torch_topk.py "$DATA" >"$OUT/torch-topk.json" 2>"$OUT/torch-topk.log"
echo "torch_topk rc=$?"
timeout 420 "$BIN" --data "$DATA" --out "$OUT/gpu-check.json" "$@" 2>&1 | tee "$OUT/gpu-check.log"
echo "gradwire-gpu-check rc=${PIPESTATUS[0]}"
