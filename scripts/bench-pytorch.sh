#!/usr/bin/env bash
# The Python package against PyTorch DDP (gloo) on the same jobs, side by side in one run, on
# an otherwise idle machine: every result lands as JSON lines in OUT (default
# docs/results/pytorch). Needs torch and the package installed in PY's environment
# (`pip install ./python`), the data (`bash scripts/fetch-data.sh`) and, for the shaped
# link, root (scripts/netns-link.sh).
#
#   scripts/bench-pytorch.sh [OUT]       PY=python (default: the python on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="$(realpath -m "${1:-docs/results/pytorch}")"
PY="${PY:-python}"
TORCHRUN="$(dirname "$(command -v "$PY")")/torchrun"
EX=python/examples/train_lenet.py
DGC="dgc:ratio=0.001,warmup_epochs=1,min_dense=1024"
mkdir -p "$OUT"
rm -f "$OUT"/*.jsonl
log() { echo "[bench-pytorch $(date -u +%H:%M:%S)] $*" >&2; }
run4() { "$TORCHRUN" --nproc-per-node 4 "$EX" "$@" 2> >(grep -v '^W[0-9]\|^\*\*\*' >&2); }

# 1. LeNet, 4 ranks, 3 epochs: gradwire dense against DDP, alternating, seeds 1 to 3.
for seed in 1 2 3; do
  log "lenet dense, gradwire, seed $seed"; run4 --epochs 3 --seed $seed --json "$OUT/lenet-gradwire-none.jsonl" >/dev/null
  log "lenet dense, DDP, seed $seed";      run4 --epochs 3 --seed $seed --ddp --json "$OUT/lenet-ddp.jsonl" >/dev/null
done
log "lenet dense, gradwire, timeline"
GRADWIRE_TIMELINE="$OUT/timeline-lenet.json" run4 --epochs 1 --json "$OUT/lenet-gradwire-none-timeline.jsonl" >/dev/null

# 2. LeNet, 4 ranks, 5 epochs: DGC with the README main job's spec against dense.
log "lenet DGC, 5 epochs";   run4 --epochs 5 --codec "$DGC" --json "$OUT/lenet-gradwire-dgc-5ep.jsonl" >/dev/null
log "lenet dense, 5 epochs"; run4 --epochs 5 --json "$OUT/lenet-gradwire-none-5ep.jsonl" >/dev/null

# 3. The wide MLP, 2 ranks, one in each of two namespaces joined by a shaped 1 Gbit/s veth
#    pair (gloo's traffic is shaped too), and DDP over loopback as the free codec's limit.
MLP=(--model mlp-wide --epochs 3 --max-steps 50 --eval-limit 2000)
pair() {  # pair NAME ARGS...: rank 0 in gwns0, rank 1 in gwns1
  local name="$1"; shift
  local port=$((29600 + RANDOM % 1000))
  for r in 1 0; do
    ip netns exec "gwns$r" env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      MASTER_ADDR=10.77.0.1 MASTER_PORT=$port GLOO_SOCKET_IFNAME="gwveth$r" \
      GRADWIRE_TOKEN=bench-pytorch GRADWIRE_TIMELINE="${TIMELINE:-}" \
      "$PY" "$EX" "${MLP[@]}" --threads 1 "$@" --json "$OUT/$name.jsonl" > /dev/null &
  done
  wait
}
bash scripts/netns-link.sh up 1gbit
trap 'bash scripts/netns-link.sh down' EXIT
log "mlp-wide 1 Gbit/s: DDP dense";      pair mlp-1gbit-ddp --ddp
log "mlp-wide 1 Gbit/s: gradwire dense"; pair mlp-1gbit-gradwire-none
log "mlp-wide 1 Gbit/s: gradwire DGC";   pair mlp-1gbit-gradwire-dgc --codec "$DGC"
log "mlp-wide 1 Gbit/s: gradwire dense, timeline"
TIMELINE="$OUT/timeline-mlp-1gbit.json" pair mlp-1gbit-gradwire-none-timeline
log "mlp-wide loopback: DDP dense"
"$TORCHRUN" --nproc-per-node 2 "$EX" "${MLP[@]}" --threads 1 --ddp --json "$OUT/mlp-loopback-ddp.jsonl" >/dev/null 2>&1
log "done: $OUT"
