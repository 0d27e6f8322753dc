#!/bin/bash
# Training that survives, measured on one host in one run of this script:
#
#   scripts/bench-elastic.sh            # about 10 minutes on 2 idle cores
#   QUICK=1 scripts/bench-elastic.sh    # short epochs: checks the script
#
# 1. The cost of an on-disk checkpoint (--checkpoint-every 10 against 0): LeNet and the wide
#    MLP (mlp:hidden=2048x3), 2 ranks, 40 steps each; milliseconds per checkpoint as rank 0
#    prints them (its file written and fsynced, the barrier, the marker, the pruning), and
#    as a share of the step (the epoch's training time without checkpoints over its steps).
# 2. Elastic LeNet (--elastic 3:5, 4 workers, EPOCHS epochs): one worker SIGKILLed KILL_AFTER
#    seconds into epoch 2 (the 3 survivors finish it), a fifth process started with `--join`
#    once epoch 2 is done; and the same kill without a joiner (the 3 survivors finish every
#    epoch). Against the undisturbed 4-worker run: accuracy per epoch, each membership event
#    with its cost (seconds from detection to the new world and to training again, steps
#    lost) from run.json's `membership`, and the in-memory commit's cost per commit.
#
# Prints a markdown table with the revision, the date and the command. Run folders stay in
# OUT. Overrides: OUT, G (a built gradwire binary: no build), EPOCHS (3), KILL_AFTER (2),
# DATA (data folder).
set -eu
cd "$(dirname "$0")/.."
CMD="$0${QUICK:+ (QUICK=$QUICK)}"
if [ -z "${G:-}" ]; then
  cargo build --release -p gradwire >&2
  G=target/release/gradwire
fi
[ -x "$G" ] || { echo "no gradwire binary at $G" >&2; exit 2; }
G=$(realpath "$G")
DATA=${DATA:-data}
[ -e "$DATA/fashion-mnist/train-images-idx3-ubyte.gz" ] ||
  { echo "Fashion-MNIST not in $DATA (scripts/fetch-data.sh)" >&2; exit 2; }
OUT=${OUT:-bench-elastic-$(date +%Y%m%d-%H%M)}
mkdir -p "$OUT"
EPOCHS=${EPOCHS:-3}
KILL_AFTER=${KILL_AFTER:-2}
if [ -n "${QUICK:-}" ]; then LIMIT=(--max-steps 150); else LIMIT=(); fi

run() { # name, then gradwire train flags
  local name=$1; shift
  echo "== $name: gradwire train $*" >&2
  "$G" train --quiet --dataset fashion-mnist --data="$DATA" --out="$OUT/$name" "$@" \
    > "$OUT/$name.jsonl" 2> "$OUT/$name.err" ||
    { echo "$name failed; see $OUT/$name.err" >&2; tail -5 "$OUT/$name.err" >&2; exit 1; }
}

CK=(--workers 2 --batch 64 --epochs 1 --max-steps 40 --eval-limit 64)
for m in lenet mlp:hidden=2048x3; do
  tag=${m%%:*}
  run "ckpt-$tag-off" --model "$m" "${CK[@]}" --checkpoint-every 0
  run "ckpt-$tag-on" --model "$m" "${CK[@]}" --checkpoint-every 10
done

EL=(--model lenet --workers 4 --epochs "$EPOCHS" --seed 42 ${LIMIT[@]+"${LIMIT[@]}"})
run undisturbed "${EL[@]}"

# elastic NAME JOIN: the elastic run, a worker SIGKILLed KILL_AFTER s into epoch 2, and with
# JOIN=1 a fifth process joining once epoch 2 is done.
elastic() {
local name=$1 join=$2
echo "== $name: gradwire train ${EL[*]} --elastic 3:5 (kill${join:+, then join})" >&2
"$G" train --quiet --dataset fashion-mnist --data="$DATA" --out="$OUT/$name" "${EL[@]}" \
  --elastic 3:5 > "$OUT/$name.jsonl" 2> "$OUT/$name.err" &
PARENT=$!
JOINER=
trap 'kill $PARENT 2>/dev/null || true; [ -z "$JOINER" ] || kill $JOINER 2>/dev/null || true' EXIT
until [ -s "$OUT/$name/metrics.jsonl" ]; do
  kill -0 $PARENT 2>/dev/null || { echo "the elastic run ended early" >&2; exit 1; }
  sleep 0.05
done
sleep "$KILL_AFTER"
VICTIM=$(pgrep -P $PARENT | sort -n | tail -1)
echo "== SIGKILL worker $VICTIM in epoch 2" >&2
kill -9 "$VICTIM"
if [ -n "$join" ]; then
  until grep -q "generation 1:" "$OUT/$name.err" && [ "$(wc -l < "$OUT/$name/metrics.jsonl")" -ge 2 ]; do
    kill -0 $PARENT 2>/dev/null || { echo "the elastic run ended before epoch 2 did" >&2; exit 1; }
    sleep 0.05
  done
  echo "== gradwire train --join $OUT/$name" >&2
  "$G" train --join "$OUT/$name" > /dev/null 2> "$OUT/$name-joiner.err" &
  JOINER=$!
fi
wait $PARENT || { echo "the elastic run failed; see $OUT/$name.err" >&2; exit 1; }
[ -z "$JOINER" ] || wait $JOINER || { echo "the joiner failed; see $OUT/$name-joiner.err" >&2; exit 1; }
trap - EXIT
}
elastic lost ""
elastic elastic 1

REV=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo "-dirty")
/usr/bin/env python3 - "$OUT" "$REV" "$CMD" <<'EOF'
import datetime, json, re, sys

out, rev, cmd = sys.argv[1:4]
def load(name):
    with open(f"{out}/{name}/run.json") as f:
        return json.load(f)
def train_s(e):
    return max(e["wall_s"] - e.get("eval_s", 0.0), 0.0)
def err(name):
    with open(f"{out}/{name}.err") as f:
        return f.read()

print(f"Training that survives, gradwire {rev}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, `{cmd}`\n")
print("On-disk checkpoint (`--checkpoint-every 10`), 2 ranks, 40 steps:\n")
print("| model | file per rank | ms per checkpoint (rank 0) | step (ms, no checkpoints) | checkpoint / step |")
print("|---|---|---|---|---|")
import glob, os
for tag, model in [("lenet", "lenet"), ("mlp", "mlp:hidden=2048x3")]:
    off = load(f"ckpt-{tag}-off")
    step_ms = train_s(off["epochs"][0]) * 1e3 / max(off["steps_per_epoch"], 1)
    m = re.search(r"checkpoint\(s\) in .*?, ([0-9.]+) ms each", err(f"ckpt-{tag}-on"))
    ck = float(m.group(1)) if m else float("nan")
    files = glob.glob(f"{out}/ckpt-{tag}-on/checkpoints/*.rank0.ckpt")
    size = os.path.getsize(files[0]) / 1e6 if files else float("nan")
    print(f"| `{model}` | {size:.1f} MB | {ck:.1f} | {step_ms:.1f} | {ck / step_ms:.2f} steps |")

base, el, lost = load("undisturbed"), load("elastic"), load("lost")
acc = lambda r: r["epochs"][-1]["test_accuracy"]
print(f"\nElastic LeNet, 4 workers, {len(base['epochs'])} epochs, one worker SIGKILLed in epoch 2; in the second elastic run a fifth joins after epoch 2:\n")
print("| run | " + " | ".join(f"epoch {e['epoch']}" for e in base["epochs"]) + " | training time (s) |")
print("|---|" + "---|" * len(base["epochs"]) + "---|")
for name, r in [("undisturbed, 4 workers", base), ("a worker lost in epoch 2: 4, then 3", lost),
                ("lost, then a fifth joining after epoch 2: 4, then 3, then 4", el)]:
    accs = " | ".join(f"{e['test_accuracy'] * 100:.2f}%" for e in r["epochs"])
    print(f"| {name} | {accs} | {sum(train_s(e) for e in r['epochs']):.1f} |")
print(f"\nFinal accuracy against undisturbed: lost {(acc(lost) - acc(base)) * 100:+.2f} points, "
      f"lost then joined {(acc(el) - acc(base)) * 100:+.2f} points.\n")
print("| run | generation | event | world | lost ranks | joined | restored step | steps lost | detection to new world (s) | detection to training again (s) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for run_name, e in [("lost", e) for e in lost["membership"][1:]] + [("lost, joined", e) for e in el["membership"][1:]]:
    f = lambda v: "-" if v is None else f"{v:.2f}"
    print(f"| {run_name} | {e['generation']} | {e['kind']} | {e['world_size_before']} -> {e['world_size_after']} | "
          f"{e['lost_ranks']} | {e['joined']} | {e['restore_step'] if e['restore_step'] is not None else '-'} | "
          f"{e['steps_lost']} | {f(e.get('detect_to_world_s'))} | {f(e.get('detect_to_training_s'))} |")
m = re.findall(r"([0-9]+) commit\(s\), ([0-9.]+) ms each", err("elastic"))
if m:
    n, ms = m[-1]
    step_ms = train_s(base["epochs"][0]) * 1e3 / max(base["steps_per_epoch"], 1)
    print(f"\nIn-memory commit (every 10 steps), last generation's rank 0: {n} commits, {float(ms):.2f} ms each "
          f"({float(ms) / step_ms:.3f} of an undisturbed step of {step_ms:.1f} ms).")
print(f"\nRun folders in {out}.", flush=True)
EOF
