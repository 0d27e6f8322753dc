#!/usr/bin/env python3
"""PyTorch counterpart of lenet_step.rs: one LeNet training step (batch 64) split by phase,
single process, 1 intra-op thread by default, medians in ms; plus one evaluation batch of 500.
Run with the anchors venv:  <venv>/bin/python lenet_step_torch.py [threads] [steps] [data_dir]"""
import gzip, os, statistics, sys, time
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
root = sys.argv[3] if len(sys.argv) > 3 else os.environ.get("GRADWIRE_DATA", "data")
torch.set_num_threads(threads)
d = os.path.join(root, "fashion-mnist")


def idx(name):
    raw = gzip.decompress(open(os.path.join(d, name), "rb").read())
    nd = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(bytearray(raw), np.uint8, offset=4 + 4 * nd).reshape(dims)


tx, ty = idx("train-images-idx3-ubyte.gz"), idx("train-labels-idx1-ubyte.gz")
mean, std = tx.mean() / 255.0, (tx / 255.0).std()
table = (torch.arange(256, dtype=torch.float32) / 255.0 - mean) / std
X, Y = torch.from_numpy(np.ascontiguousarray(tx)), torch.from_numpy(ty.astype(np.int64))


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 6, 5, padding=2), nn.Conv2d(6, 16, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


torch.manual_seed(42)
m = LeNet()
opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
bs, warm, n = 64, 10, len(Y)
order = torch.tensor([(i * 7919) % n for i in range((warm + steps) * bs)])
names = ["batch", "forward", "backward", "optim", "step"]
t = {k: [] for k in names}
cpu = {k: [] for k in names}
clk = time.thread_time
for s in range(warm + steps):
    a, ca = time.perf_counter(), clk()
    i = order[s * bs:(s + 1) * bs]
    x, y = table[X[i].long()].unsqueeze(1), Y[i]
    b, cb = time.perf_counter(), clk()
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(m(x), y)
    lv = loss.item()
    c, cc = time.perf_counter(), clk()
    loss.backward()
    dd, cd = time.perf_counter(), clk()
    opt.step()
    e, ce = time.perf_counter(), clk()
    if s >= warm:
        for k, v, w in zip(names, [b - a, c - b, dd - c, e - dd, e - a], [cb - ca, cc - cb, cd - cc, ce - cd, ce - ca]):
            t[k].append(v * 1e3)
            cpu[k].append(w * 1e3)
ev, ev_cpu = [], []
with torch.no_grad():
    xe = table[X[:500].long()].unsqueeze(1)
    for _ in range(5):
        a, ca = time.perf_counter(), clk()
        logp = F.log_softmax(m(xe), 1)
        int((logp.argmax(1) == Y[:500]).sum())
        ev.append((time.perf_counter() - a) * 1e3)
        ev_cpu.append((clk() - ca) * 1e3)
med = statistics.median
print(f"torch {torch.__version__} lenet threads={threads} batch={bs} median wall ms: "
      + " ".join(f"{k}={med(v):.3f}" for k, v in t.items()) + f" eval500={med(ev):.3f}")
print(f"torch {torch.__version__} lenet threads={threads} batch={bs} median cpu ms: "
      + " ".join(f"{k}={med(v):.3f}" for k, v in cpu.items()) + f" eval500={med(ev_cpu):.3f}")
