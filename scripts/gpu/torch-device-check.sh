#!/usr/bin/env bash
# The PyTorch package on a GPU, in one run on a machine with an NVIDIA GPU and PyTorch but no
# Rust and no network: installs the wheel built beforehand, then
#   1. the pytest of CUDA tensors (python/tests/test_cuda.py: a model trained on the GPU
#      through DistributedOptimizer equals the CPU run; CUDA all-reduce and broadcast sums),
#   2. LeNet on Fashion-MNIST, 2 ranks sharing the GPU, dense and with DGC, gradients reduced
#      from device memory; each epoch's JSON line carries `device_copies`: DGC's tensors are
#      encoded on the GPU and only their payloads come to the host.
# Everything lands in $OUT (default /tmp/torch-gpu-out).
#
# Prepare here (x86-64, with Rust), then carry .whl-gw and data/fashion-mnist:
#   python3 -m pip install "maturin>=1.9,<2"
#   maturin build --release -m python/Cargo.toml -o .whl-gw
#   bash scripts/fetch-data.sh
# and on the device, from the repository root:
#   bash scripts/gpu/torch-device-check.sh
set -u
OUT=${OUT:-/tmp/torch-gpu-out}
EPOCHS=${EPOCHS:-2}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia-smi.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gw-site .whl-gw/*.whl \
    || { echo "no wheel in .whl-gw"; exit 1; }
export PYTHONPATH=/tmp/gw-site${PYTHONPATH:+:$PYTHONPATH}
# NVRTC compiles the device codecs' kernels: the CUDA toolkit's, or the nvidia-cuda-nvrtc
# wheel's that PyTorch brings.
NV=$(find /usr/local /opt /usr/lib "$(python3 -c 'import site; print(site.getsitepackages()[0])')" \
    -name 'libnvrtc.so.1[0-9]*' 2>/dev/null | grep -v alt | head -1)
if [ -n "$NV" ]; then
    export LD_LIBRARY_PATH="$(dirname "$NV")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
{
    echo "nvrtc: ${NV:-none found}"
    python3 -c 'import torch, gradwire; print("torch", torch.__version__, "gradwire", gradwire.__version__)'
    git rev-parse --short HEAD 2>/dev/null || true
} | tee "$OUT/env.txt"
export GRADWIRE_TIMEOUT=60 RUST_LOG=${RUST_LOG:-warn}
PYTHONUNBUFFERED=1 timeout 240 python3 -m pytest -q python/tests/test_cuda.py 2>&1 | tee "$OUT/pytest-cuda.log"
echo "pytest rc=${PIPESTATUS[0]}"
for codec in none dgc:ratio=0.001,warmup_epochs=1,min_dense=1024; do
    tag=$(echo "$codec" | cut -d: -f1)
    PYTHONUNBUFFERED=1 timeout 200 torchrun --nproc-per-node 2 python/examples/train_lenet.py \
        --device cuda --epochs "$EPOCHS" --codec "$codec" --data data \
        --json "$OUT/lenet-cuda-$tag.jsonl" >"$OUT/lenet-cuda-$tag.log" 2>&1
    echo "lenet $codec rc=$?"
    tail -n 3 "$OUT/lenet-cuda-$tag.log"
done
