#!/usr/bin/python3
"""Ratio table of a `scripts/bench-openmpi.sh` folder: for each run, transport and P, the
4 KiB latency (gradwire/Open MPI in us, and Open MPI's time over ours) and the bus bandwidth
of the larger sizes (gradwire/Open MPI in GB/s, and ours over theirs). Above 1.0x: gradwire
better. Rows marked "base" are an older gradwire binary run alongside (BASE= in
bench-openmpi.sh) against the same Open MPI run. Then the targets, checked
on the gradwire rows: bus bandwidth at least 1.2x Open MPI's from 1 MiB up, 4 KiB latency at
least 1.0x. Markdown on stdout.

  scripts/bench-openmpi-table.py docs/results/allreduce-openmpi/tcp-shm-p2-p4
"""
import glob
import json
import os
import re
import sys


def load(path):
    with open(path) as f:
        return {r["bytes"]: r for r in json.load(f)["results"]}


def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    rows, sizes, misses, checked = [], None, {}, set()
    for path in sorted(glob.glob(os.path.join(d, "*-*-p*-r*.json"))):
        m = re.search(r"/(gw|base)-(tcp|shm)-p(\d+)-r(\d+)\.json$", path)
        if not m:
            continue
        who, t, p, r = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
        other = "tcp" if t == "tcp" else "vader"
        om = os.path.join(d, f"ompi-{other}-p{p}-r{r}.json")
        if not os.path.exists(om):
            continue
        a, b = load(path), load(om)
        sizes = sorted(set(a) & set(b))
        cells = []
        for s in sizes:
            if s <= 4096:
                x, y = a[s]["median_us"], b[s]["median_us"]
                ratio, want = y / x, 1.0
                cells.append(f"{x:.1f}/{y:.1f} ({ratio:.2f}x)")
            else:
                x, y = a[s]["busbw_gbps"], b[s]["busbw_gbps"]
                ratio, want = x / y, 1.2
                cells.append(f"{x:.2f}/{y:.2f} ({ratio:.2f}x)")
            if who == "gw" and (s <= 4096 or s >= 1 << 20):
                checked.add(t)
                if ratio < want:
                    misses.setdefault(t, []).append(f"P={p} r{r} {size(s)} {ratio:.2f}x")
        name = f"{t} vs {other}" if who == "gw" else f"{t} (base) vs {other}"
        rows.append(((t, p, who == "base", r), f"| {name} P={p} r{r} | " + " | ".join(cells) + " |"))
    if not rows:
        sys.exit(f"no pairs of gw-*/ompi-* JSON files in {d}")
    head = [f"{size(s)} latency (us)" if s <= 4096 else size(s) for s in sizes]
    print("| run | " + " | ".join(head) + " |")
    print("|---|" + "--:|" * len(sizes))
    for _, line in sorted(rows, key=lambda x: x[0]):
        print(line)
    print()
    for t in sorted(checked):
        miss = misses.get(t, [])
        verdict = "met" if not miss else "missed in " + ", ".join(miss)
        print(f"- {t}: targets (bandwidth >= 1.2x from 1 MiB, 4 KiB latency >= 1.0x) {verdict}")


if __name__ == "__main__":
    main()
