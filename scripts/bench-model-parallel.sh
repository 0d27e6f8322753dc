#!/bin/bash
# Model parallelism on one host: what splitting a replica costs and buys (DistBelief's
# Figures 2 and 3, at the scale of two cores), in one run of this script.
#
#   scripts/bench-model-parallel.sh            # about 10 minutes on 2 idle cores
#   QUICK=1 scripts/bench-model-parallel.sh    # a few steps per configuration: checks the script
#
# 1. Step time of the wide MLP (mlp:hidden=2048x3, Fashion-MNIST), one replica: whole
#    (K = 1), tensor split over K = 2, and pipeline split over K = 2 with 4 micro-batches
#    (GPipe's schedule), STEPS steps each under the all-reduce engine. The step time is the
#    epoch's training time (wall_s - eval_s in run.json) over its steps.
# 2. Downpour (--sync ps-async, Adagrad on the shards): 2 replicas of K = 2 partitions
#    against 4 data-parallel workers of the whole model (MODEL2, LeNet by default, pipeline
#    split), EPOCHS epochs each; time to accuracy as `gradwire report` counts it (training
#    time, evaluation left out, summed until the held-out accuracy reaches TARGET; TARGET
#    defaults to the data-parallel run's final accuracy less half a point).
#
# Then prints a markdown table: step or time-to-accuracy, final accuracy, the bytes that
# cross partition boundaries per step (the partition plan's `bytes_per_step` in run.json's
# `model_parallel`) and the parameter-server bytes per replica step, with the revision, the
# date and the command. Every run folder stays in OUT. 4 worker processes on 2 cores share
# them: the Downpour times compare configurations on this host, not machines.
#
# Overrides: OUT (folder), G (a built gradwire binary: no build), STEPS (default 50),
# EPOCHS (3), MODEL2 (lenet), TARGET (a fraction, e.g. 0.85), DATA (data folder).
set -eu
cd "$(dirname "$0")/.."
CMD="$0${QUICK:+ (QUICK=$QUICK)}"
if [ -z "${G:-}" ]; then
  cargo build --release -p gradwire >&2
  G=target/release/gradwire
fi
[ -x "$G" ] || { echo "no gradwire binary at $G" >&2; exit 2; }
DATA=${DATA:-data}
[ -e "$DATA/fashion-mnist/train-images-idx3-ubyte.gz" ] ||
  { echo "Fashion-MNIST not in $DATA (scripts/fetch-data.sh)" >&2; exit 2; }
OUT=${OUT:-bench-model-parallel-$(date +%Y%m%d-%H%M)}
mkdir -p "$OUT"
if [ -n "${QUICK:-}" ]; then
  STEPS=${STEPS:-3}; EPOCHS=${EPOCHS:-2}; LIMIT=(--max-steps 5 --eval-limit 200)
else
  STEPS=${STEPS:-50}; EPOCHS=${EPOCHS:-3}; LIMIT=()
fi
MODEL2=${MODEL2:-lenet}

run() { # name, then gradwire train flags
  local name=$1; shift
  echo "== $name: gradwire train $*" >&2
  "$G" train --quiet --dataset fashion-mnist --data="$DATA" --out="$OUT/$name" "$@" \
    > "$OUT/$name.jsonl" 2> "$OUT/$name.err" ||
    { echo "$name failed; see $OUT/$name.err" >&2; tail -5 "$OUT/$name.err" >&2; exit 1; }
}

WIDE=(--model mlp:hidden=2048x3 --workers 1 --epochs 1 --max-steps "$STEPS" --eval-limit 64)
run wide-k1 "${WIDE[@]}"
run wide-k2-tensor "${WIDE[@]}" --model-parallel 2 --mp-split tensor
run wide-k2-pipeline "${WIDE[@]}" --model-parallel 2 --mp-split pipeline --micro-batches 4

DOWN=(--model "$MODEL2" --sync ps-async --epochs "$EPOCHS" ${LIMIT[@]+"${LIMIT[@]}"})
run downpour-dp4 "${DOWN[@]}" --workers 4
run downpour-r2k2 "${DOWN[@]}" --workers 2 --model-parallel 2

REV=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo "-dirty")
/usr/bin/env python3 - "$OUT" "$REV" "$CMD" "${TARGET:-}" <<'EOF'
import datetime, json, sys

out, rev, cmd, target = sys.argv[1:5]
def load(name):
    with open(f"{out}/{name}/run.json") as f:
        return json.load(f)
def train_s(e):
    return max(e["wall_s"] - e.get("eval_s", 0.0), 0.0)
def crossing(r):
    mp = r.get("model_parallel")
    return f"{mp['bytes_per_step'] / 1024:.1f} KiB" if mp else "0"
def layout(r):
    mp = r.get("model_parallel")
    if not mp:
        return f"{r['workers']} x whole"
    split = mp["split"]
    if isinstance(split, dict):  # {"pipeline": {"micro_batches": M}}
        kind, opts = next(iter(split.items()))
        m = (opts or {}).get("micro_batches", 1)
        split = kind + (f", {m} micro-batches" if m > 1 else "")
    return f"{r['workers'] // mp['partitions']} x {mp['partitions']} ({split})"

print(f"Model parallelism, gradwire {rev}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, `{cmd}`\n")
print("Wide MLP step time, one replica (all-reduce engine):\n")
print("| run | ranks | split | ms/step | vs K = 1 | crossing partitions per step |")
print("|---|---|---|---|---|---|")
base = None
for name in ["wide-k1", "wide-k2-tensor", "wide-k2-pipeline"]:
    r = load(name)
    e = r["epochs"][0]
    ms = train_s(e) * 1e3 / max(r["steps_per_epoch"], 1)
    base = base or ms
    print(f"| {name} | {r['workers']} | {layout(r)} | {ms:.1f} | {base / ms:.2f}x | {crossing(r)} |")

runs = {n: load(n) for n in ["downpour-dp4", "downpour-r2k2"]}
final = lambda r: r["epochs"][-1].get("test_accuracy") or 0.0
goal = float(target) if target else final(runs["downpour-dp4"]) - 0.005
print(f"\nDownpour (ps-async), {runs['downpour-dp4']['model']}, time to {goal * 100:.2f}% held-out accuracy:\n")
print("| run | replicas x partitions | epochs | final accuracy | time to target (s) | training time (s) | crossing partitions per step | PS bytes per replica step |")
print("|---|---|---|---|---|---|---|---|")
for name, r in runs.items():
    t, tta = 0.0, None
    for e in r["epochs"]:
        t += train_s(e)
        if tta is None and (e.get("test_accuracy") or 0.0) >= goal:
            tta = t
    ps = r["ps"]
    # Every partition of a replica steps once per replica step.
    k = (r.get("model_parallel") or {}).get("partitions", 1)
    steps = sum(w.get("steps", 0) for w in ps["workers"]) / k or 1
    per_step = (ps["bytes_pushed_all"] + ps["bytes_pulled_all"]) / steps
    print(f"| {name} | {layout(r)} | {len(r['epochs'])} | {final(r) * 100:.2f}% | "
          f"{'not reached' if tta is None else f'{tta:.1f}'} | {t:.1f} | {crossing(r)} | {per_step / 1024:.1f} KiB |")
print(f"\nRun folders in {out}.", flush=True)
EOF
