"""torch.topk on the GPU, the anchor for the device DGC's encode time.

Writes the buffers it times (`g25m.f32`, `g100m.f32`: torch.randn, seed 0, little-endian
f32) to DIR so that `gradwire-gpu-check --data DIR` encodes the very same values, and prints
one JSON object: per size, the median of 10 timed calls (CUDA events, after 3 warm-ups) of
`torch.topk(x.abs(), k)` and `torch.topk(x, k)` with k = 0.1% of the elements, and a
device-to-device copy of the buffer for the same ratio to copy bandwidth.

    python3 scripts/gpu/torch_topk.py DIR
"""
import json
import sys

import torch


def timed(fn, reps=10, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    rows = []
    for n, name in [(25_000_000, "g25m.f32"), (100_000_000, "g100m.f32")]:
        x = torch.randn(n, device="cuda", dtype=torch.float32)
        x.cpu().numpy().tofile(f"{out}/{name}")
        k = max(1, (n + 999) // 1000)
        y = torch.empty_like(x)
        rows.append({
            "n": n,
            "k": k,
            "topk_abs_s": timed(lambda: torch.topk(x.abs(), k)),
            "topk_s": timed(lambda: torch.topk(x, k)),
            "device_copy_s": timed(lambda: y.copy_(x)),
        })
    print(json.dumps({
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "rows": rows,
    }, indent=2))


if __name__ == "__main__":
    main()
