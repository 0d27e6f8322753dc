#!/usr/bin/python3
"""Open MPI's collectives, timed exactly as `gradwire bench allreduce` times ours.

Per size: warm-up, then per iteration a barrier, the collective, and the slowest rank's time;
the median over iterations; bus bandwidth by the nccl-tests convention. Prints the same JSON
shape as `gradwire bench allreduce --json`, so the two can be compared side by side.

Run (TCP over loopback, as the comparison in the README):
  mpirun --allow-run-as-root --oversubscribe -np 4 --mca btl tcp,self --mca pml ob1 \
      --mca btl_tcp_if_include lo /usr/bin/python3 scripts/bench-mpi.py \
      --sizes 4KiB,64KiB,1MiB,16MiB,64MiB --json mpi.json
"""
import argparse
import json
import time

import numpy as np
from mpi4py import MPI


def parse_size(s):
    units = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
    s = s.strip()
    digits = "".join(ch for ch in s if ch.isdigit())
    unit = "".join(ch for ch in s if not ch.isdigit()).lower()
    return int(digits) * units[unit]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4KiB,64KiB,1MiB,16MiB,64MiB")
    ap.add_argument("--op", default="allreduce", choices=["allreduce", "allgather", "broadcast"])
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    p = comm.Get_size()
    results = []
    for size in [parse_size(s) for s in a.sizes.split(",")]:
        n = size // 4
        iters = a.iters or max(10, min(200, (256 << 20) // size))
        buf = (np.arange(n) % 13).astype(np.float32)
        out = np.empty(n, dtype=np.float32)
        mine = np.ascontiguousarray(buf[: n // p])
        gathered = np.empty((n // p) * p, dtype=np.float32)
        times = np.zeros(iters)
        for i in range(a.warmup + iters):
            comm.Barrier()
            t0 = time.perf_counter()
            if a.op == "allreduce":
                comm.Allreduce(buf, out, op=MPI.SUM)
            elif a.op == "allgather":
                comm.Allgather(mine, gathered)
            else:
                comm.Bcast(buf, root=0)
            dt = time.perf_counter() - t0
            if i >= a.warmup:
                times[i - a.warmup] = dt
        slowest = np.empty_like(times)
        comm.Allreduce(times, slowest, op=MPI.MAX)
        med = float(np.sort(slowest)[len(slowest) // 2])
        factor = {"allreduce": 2 * (p - 1) / p, "allgather": (p - 1) / p, "broadcast": 1.0}[a.op]
        results.append({"bytes": size, "median_us": med * 1e6, "busbw_gbps": size * factor / med / 1e9})
    if comm.Get_rank() == 0:
        rep = {"op": a.op, "transport": "mpi-tcp", "np": p, "algo": "openmpi", "results": results}
        print(json.dumps(rep))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rep, f, indent=2)


if __name__ == "__main__":
    main()
