#!/usr/bin/env python3
"""Validates `gradwire simulate` against measured step times (docs/results/cost-model).

For each link, rank count and codec: one short `gradwire train` run (2 epochs of --steps
steps; the second epoch is measured, so start-up and the first step's set-up are not), then
two predictions from `gradwire simulate --calibrate --host-cores CORES`:
  A: everything measured by simulate itself: a whole training step of the P ranks measured
     on this machine without a link (P model copies stepping at once, each through the
     engine with the codec, TCP on 127.0.0.1: crates/cli/src/simulate/host.rs), plus the
     link's communication from the alpha-beta model (crates/sim/src/predict.rs);
  B: the run's own compute per step (--compute-ms, the ranks' mean, without the wait for the
     slowest) plus the modelled codec costs, scaled by max(1, P / CORES) since the P ranks
     share the cores, plus the communication: the codec and communication model alone.
All of it --repeats times, the whole sweep once per repeat (so a slow spell of the machine
touches every cell alike); a cell's measured time and predictions are the medians over the
repeats. On this 2-core machine a single run of a CPU-bound cell at 8 ranks varied by up
to 50% between sweeps (validation at `2bdd68f`, 2026-12-03).
Prints a markdown table; writes every number to --out/validation.json.

Usage: GRADWIRE_DATA=/work/main/data scripts/simulate-validate.py --gradwire PATH
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gradwire", default="gradwire")
    ap.add_argument("--model", default="mlp:hidden=1024x2")
    ap.add_argument("--links", default="100mbit;1gbit")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument(
        "--codecs",
        default="none;dgc:ratio=0.001,warmup_epochs=0;onebit;powersgd:rank=2",
    )
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--out", default="out/simulate-validate")
    ap.add_argument("--reuse", action="store_true",
                    help="keep the measured runs already in --out; only predict again")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cells = [(link, int(p), codec) for link in a.links.split(";")
             for p in a.ranks.split(",") for codec in a.codecs.split(";")]
    samples = {cell: [] for cell in cells}
    for rep in range(a.repeats):
        for link, p, codec in cells:
            tag = f"{link}-{p}-{codec}".replace(":", "_").replace(",", "_").replace("=", "")
            tag = os.path.join(f"rep{rep}", tag)
            rec = os.path.join(a.out, tag, "run.json")
            if not (a.reuse and os.path.exists(rec)):
                run([a.gradwire, "train", "--model", a.model, "--workers", str(p),
                     "--link", link, "--codec", codec, "--max-steps", str(a.steps),
                     "--epochs", "2", "--eval-limit", "64", "--quiet",
                     "--out", os.path.join(a.out, tag)])
            with open(rec) as f:
                r = json.load(f)
            e = r["epochs"][-1]
            steps = r["steps_per_epoch"]
            measured = e["wall_s"] / steps
            compute = e["compute_s"] / steps
            preds = []
            for extra in ([], ["--compute-ms", str(compute * 1e3)]):
                sj = os.path.join(a.out, tag + ("-b" if extra else "-a") + ".sim.json")
                run([a.gradwire, "simulate", "--model", a.model, "--workers", str(p),
                     "--link", link, "--codec", codec, "--calibrate",
                     "--host-cores", str(a.cores), "--json", sj] + extra)
                with open(sj) as f:
                    preds.append(json.load(f)["results"][0]["step_s"])
            sample = dict(measured_s=measured, run_compute_s=compute,
                          predicted_a_s=preds[0], predicted_b_s=preds[1])
            samples[(link, p, codec)].append(sample)
            print(json.dumps(dict(repeat=rep, link=link, ranks=p, codec=codec, **sample)),
                  file=sys.stderr, flush=True)
    rows = []
    for (link, p, codec), ss in samples.items():
        row = dict(link=link, ranks=p, codec=codec)
        for k in ("measured_s", "run_compute_s", "predicted_a_s", "predicted_b_s"):
            row[k] = statistics.median(s[k] for s in ss)
        row["samples"] = ss
        rows.append(row)
    with open(os.path.join(a.out, "validation.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("| link | ranks | codec | measured ms/step | predicted A | error A | run compute ms | predicted B | error B |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ea = (r["predicted_a_s"] - r["measured_s"]) / r["measured_s"] * 100
        eb = (r["predicted_b_s"] - r["measured_s"]) / r["measured_s"] * 100
        print(f"| {r['link']} | {r['ranks']} | `{r['codec']}` | {r['measured_s']*1e3:.0f} | "
              f"{r['predicted_a_s']*1e3:.0f} | {ea:+.0f}% | {r['run_compute_s']*1e3:.0f} | "
              f"{r['predicted_b_s']*1e3:.0f} | {eb:+.0f}% |")
    for k in ("a", "b"):
        ok = sum(abs(r[f"predicted_{k}_s"] / r["measured_s"] - 1) <= 0.15 for r in rows)
        print(f"\nprediction {k.upper()}: {ok} of {len(rows)} cells within 15%")


if __name__ == "__main__":
    main()
