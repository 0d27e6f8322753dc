#!/usr/bin/python3
"""Ratio table of a `scripts/bench-openmpi.sh` folder: for each run, transport and P, the
4 KiB latency (gradwire/Open MPI in us, and Open MPI's time over ours) and the bus bandwidth
of the larger sizes (gradwire/Open MPI in GB/s, and ours over theirs). Above 1.0x: gradwire
better. Markdown on stdout.

  scripts/bench-openmpi-table.py docs/bench-openmpi
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
    rows, sizes = [], None
    for gw in sorted(glob.glob(os.path.join(d, "gw-*-p*-r*.json"))):
        m = re.search(r"gw-(tcp|shm)-p(\d+)-r(\d+)\.json$", gw)
        t, p, r = m.group(1), int(m.group(2)), int(m.group(3))
        om = os.path.join(d, f"ompi-{'tcp' if t == 'tcp' else 'vader'}-p{p}-r{r}.json")
        if not os.path.exists(om):
            continue
        a, b = load(gw), load(om)
        sizes = sorted(set(a) & set(b))
        cells = []
        for s in sizes:
            if s <= 4096:
                x, y = a[s]["median_us"], b[s]["median_us"]
                cells.append(f"{x:.1f}/{y:.1f} ({y / x:.2f}x)")
            else:
                x, y = a[s]["busbw_gbps"], b[s]["busbw_gbps"]
                cells.append(f"{x:.2f}/{y:.2f} ({x / y:.2f}x)")
        other = "tcp" if t == "tcp" else "vader"
        rows.append(((t, p, r), f"| {t} vs {other} P={p} r{r} | " + " | ".join(cells) + " |"))
    if not rows:
        sys.exit(f"no pairs of gw-*/ompi-* JSON files in {d}")
    head = [f"{size(s)} latency (us)" if s <= 4096 else size(s) for s in sizes]
    print("| run | " + " | ".join(head) + " |")
    print("|---|" + "--:|" * len(sizes))
    for _, line in sorted(rows, key=lambda x: (x[0][0], x[0][1], x[0][2])):
        print(line)


if __name__ == "__main__":
    main()
