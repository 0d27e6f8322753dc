#!/usr/bin/env python3
"""LeNet-5 (or a wide MLP) on Fashion-MNIST with gradwire's Horovod API, or with plain PyTorch
DDP (gloo) as the baseline: the job of ``gradwire train --model lenet --dataset fashion-mnist``.

    bash scripts/fetch-data.sh
    torchrun --nproc-per-node 4 python/examples/train_lenet.py --epochs 3              # gradwire, dense
    torchrun --nproc-per-node 4 python/examples/train_lenet.py --epochs 3 --ddp        # PyTorch DDP
    torchrun --nproc-per-node 4 python/examples/train_lenet.py --epochs 3 \\
        --codec dgc:ratio=0.001,warmup_epochs=1,min_dense=1024                         # DGC

Set up as gradwire's trainer: LeNet-5 (61,706 parameters) with gradwire's initialization,
inputs normalized by the training set's mean and deviation, one permutation of the 60,000
training images per epoch shared by the ranks (rank r takes the r-th contiguous slice), batch
64 per rank, SGD lr 0.05 momentum 0.9; rank 0 evaluates the 10,000 test images after each
epoch. ``--model mlp-wide`` is 784-2048-2048-2048-10 (gradwire's ``mlp:hidden=2048x3``).

One JSON line per epoch goes to stdout (and is appended to ``--json FILE``): ``epoch``,
``test_accuracy``, ``train_loss``, ``wall_s`` (epoch start to end of its evaluation),
``bytes_sent`` (TCP payload bytes rank 0 put on its connections during the epoch, the same
count for both modes), the configuration, versions, revision and command. With
``GRADWIRE_TIMELINE=FILE`` the last line also carries ``overlap``: how much of the
communication backward hid.
"""

import argparse
import gzip
import json
import math
import os
import socket
import struct
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("lenet", "mlp-wide"), default="lenet",
                   help="lenet (LeNet-5) or mlp-wide (784-2048-2048-2048-10); default lenet")
    p.add_argument("--codec", default="none",
                   help="gradwire codec spec (e.g. dgc:ratio=0.001,warmup_epochs=1,min_dense=1024); "
                        "default none (dense)")
    p.add_argument("--rule", action="append", default=[],
                   help="per-tensor rule SELECTOR=>CODEC[@STRATEGY], as gradwire train --rule")
    p.add_argument("--ddp", action="store_true",
                   help="run plain PyTorch DDP (gloo) instead of gradwire: the baseline")
    p.add_argument("--epochs", type=int, default=1, help="epochs (default 1)")
    p.add_argument("--batch", type=int, default=64, help="samples per step on each rank (64)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (0.05)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (0.9)")
    p.add_argument("--seed", type=int, default=42, help="init and shuffle seed (42)")
    p.add_argument("--max-steps", type=int, default=None, help="cap on steps per epoch")
    p.add_argument("--eval-limit", type=int, default=None, help="cap on test images evaluated")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per rank (default: cores / ranks on this host)")
    p.add_argument("--transport", default="auto", help="gradwire transport: auto, tcp, shm, mpi")
    p.add_argument("--device", default="cpu",
                   help="cpu (default) or cuda: the model, batches and gradients on GPU "
                        "local_rank %% device_count (gradwire only; ranks may share a GPU)")
    p.add_argument("--data", default=None,
                   help="folder holding fashion-mnist/ (default $GRADWIRE_DATA or ./data)")
    p.add_argument("--json", default=None, help="append each epoch's JSON line to this file")
    a = p.parse_args(argv)
    if min(a.epochs, a.batch) < 1 or (a.max_steps is not None and a.max_steps < 1):
        p.error("--epochs, --batch and --max-steps must be positive")
    if a.device not in ("cpu", "cuda") or (a.device == "cuda" and a.ddp):
        p.error("--device is cpu or cuda, and cuda runs gradwire (not --ddp)")
    return a


# ---------------------------------------------------------------------------- data


def find_data(arg):
    root = arg or os.environ.get("GRADWIRE_DATA") or os.path.join(ROOT, "data")
    for d in (os.path.join(root, "fashion-mnist"), root):
        if os.path.isfile(os.path.join(d, "train-images-idx3-ubyte.gz")):
            return d
    sys.exit(f"train_lenet: no Fashion-MNIST under {root!r}: run `bash scripts/fetch-data.sh` "
             "in the gradwire checkout (or pass --data DIR)")


def read_idx(path):
    with open(path, "rb") as f:
        raw = bytearray(gzip.decompress(f.read()))
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    nd = raw[3]
    dims = struct.unpack(">" + "I" * nd, raw[4:4 + 4 * nd])
    data = torch.frombuffer(raw, dtype=torch.uint8, offset=4 + 4 * nd)
    if data.numel() != math.prod(dims):
        raise ValueError(f"{path}: {data.numel()} bytes for dims {dims}")
    return data.view(*dims)


def load(d):
    tx = read_idx(os.path.join(d, "train-images-idx3-ubyte.gz"))
    ty = read_idx(os.path.join(d, "train-labels-idx1-ubyte.gz")).long()
    vx = read_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz"))
    vy = read_idx(os.path.join(d, "t10k-labels-idx1-ubyte.gz")).long()
    return tx, ty, vx, vy


def normalizer(images):
    """gradwire's pixel statistics: mean and population deviation of p/255 over every
    training pixel (f64 over the histogram), as a 256-entry lookup table."""
    hist = torch.bincount(images.reshape(-1).long(), minlength=256).double()
    x = torch.arange(256, dtype=torch.float64) / 255.0
    n = hist.sum()
    mean = float((x * hist).sum() / n)
    var = max(float((x * x * hist).sum() / n) - mean * mean, 0.0)
    std = math.sqrt(var) if var > 1e-12 else 1.0
    mean, std = float(torch.tensor(mean, dtype=torch.float32)), float(torch.tensor(std, dtype=torch.float32))
    return (torch.arange(256, dtype=torch.float32) / 255.0 - mean) / std


# ---------------------------------------------------------------------------- models


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class WideMlp(nn.Module):
    def __init__(self, hidden=(2048, 2048, 2048)):
        super().__init__()
        dims = (784,) + tuple(hidden) + (10,)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x):
        x = torch.flatten(x, 1)
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)


def build(name, seed):
    """The model with gradwire's initialization: hidden weights He-uniform (bound
    sqrt(6 / fan_in)), every bias and the output weight U(+-1 / sqrt(fan_in))."""
    torch.manual_seed(seed)
    m = LeNet() if name == "lenet" else WideMlp()
    gen = torch.Generator().manual_seed(seed)
    layers = [mod for mod in m.modules() if isinstance(mod, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        for i, layer in enumerate(layers):
            fan = layer.weight[0].numel()
            out = i == len(layers) - 1
            bound = 1 / math.sqrt(fan) if out else math.sqrt(6.0 / fan)
            layer.weight.uniform_(-bound, bound, generator=gen)
            layer.bias.uniform_(-1 / math.sqrt(fan), 1 / math.sqrt(fan), generator=gen)
    return m


# ---------------------------------------------------------------------------- bytes on the wire

_TCP_INFO = getattr(socket, "TCP_INFO", 11)


def tcp_bytes_sent(skip_port):
    """Payload bytes this process's TCP connections put on the wire, first transmissions only
    (TCP_INFO: bytes_sent - bytes_retrans), leaving out connections to or from `skip_port`
    (torchrun's store)."""
    total = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                peer, local = s.getpeername(), s.getsockname()
            except OSError:
                continue
            if skip_port in (peer[1], local[1]):
                continue
            info = s.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 256)
            if len(info) >= 216:
                total += struct.unpack_from("=Q", info, 200)[0] - struct.unpack_from("=Q", info, 208)[0]
        except (OSError, struct.error):
            pass
        finally:
            s.close()
    return total


def revision():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


# ---------------------------------------------------------------------------- training


def main(argv=None):
    a = parse_args(argv)
    data_dir = find_data(a.data)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("GRADWIRE_LOCAL_SIZE", "1")))
    threads = a.threads or max(1, (os.cpu_count() or 1) // local)
    torch.set_num_threads(threads)
    # The job's store (DDP's TCPStore, or torchrun's agent store) listens on MASTER_PORT: its
    # connection is not gradient traffic. gradwire's own rendezvous there (no store) is.
    store = a.ddp or os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store_port = int(os.environ.get("MASTER_PORT", "0")) if store else -1
    device = torch.device("cpu")

    if a.ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = build(a.model, a.seed)
        net = DDP(model)
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
        mode, gw = "ddp", None
    else:
        import gradwire.torch as gw

        gw.init(a.transport)
        rank, world = gw.rank(), gw.size()
        if a.device == "cuda":
            if not torch.cuda.is_available():
                sys.exit("train_lenet: --device cuda, but torch sees no GPU")
            device = torch.device("cuda", gw.local_rank() % torch.cuda.device_count())
            torch.cuda.set_device(device)
        model = net = build(a.model, a.seed).to(device)
        gw.broadcast_parameters(model.state_dict(), root_rank=0)
        mode = "gradwire"

    tx, ty, vx, vy = load(data_dir)
    table = normalizer(tx)
    # On a GPU the data set and the lookup table live there too (60,000 images, 47 MB).
    tx, ty, vx, vy, table = (t.to(device) for t in (tx, ty, vx, vy, table))
    n = len(ty)
    per = n // world
    steps = per // a.batch if a.max_steps is None else min(per // a.batch, a.max_steps)
    if steps == 0:
        sys.exit(f"{n} images over {world} ranks give no full batch of {a.batch}")
    if gw is not None:
        opt = gw.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum),
            named_parameters=model.named_parameters(), codec=a.codec, rules=a.rule,
            steps_per_epoch=steps, seed=a.seed)
    eval_n = len(vy) if a.eval_limit is None else min(a.eval_limit, len(vy))
    shape = (1, 28, 28) if a.model == "lenet" else (784,)

    def images(x, idx):
        return table[x[idx].long()].view(-1, *shape)

    if rank == 0:
        print(f"train_lenet: {mode}{'' if a.ddp else ' codec ' + a.codec}, {a.model}, "
              f"{world} rank(s) x {threads} thread(s), {steps} steps/epoch x {a.epochs} epochs, "
              f"batch {a.batch} per rank", file=sys.stderr, flush=True)
    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(a.seed + epoch)
        shard = torch.randperm(n, generator=g)[rank * per:(rank + 1) * per].to(device)
        sent0 = tcp_bytes_sent(store_port)
        loss_sum = 0.0
        for step in range(steps):
            idx = shard[step * a.batch:(step + 1) * a.batch]
            opt.zero_grad()
            loss = F.cross_entropy(net(images(tx, idx)), ty[idx])
            loss.backward()
            opt.step()
            # On a GPU the sum stays there: .item() would make the host wait every step.
            loss_sum += loss.item() if a.device == "cpu" else loss.detach().double()
        sent = tcp_bytes_sent(store_port) - sent0
        mean_loss = torch.tensor([float(loss_sum) / steps], device=device)
        if gw is None:
            torch.distributed.all_reduce(mean_loss)
            mean_loss /= world
        else:
            gw.allreduce_(mean_loss, name="train_loss")
        if rank == 0:
            correct = 0
            with torch.no_grad():
                for i in range(0, eval_n, 500):
                    j = min(i + 500, eval_n)
                    correct += int((model(images(vx, slice(i, j))).argmax(1) == vy[i:j]).sum())
            rec = {
                "epoch": epoch + 1,
                "test_accuracy": correct / eval_n,
                "train_loss": float(mean_loss),
                "wall_s": time.perf_counter() - t0,
                "bytes_sent": sent,
                "mode": mode,
                "codec": None if a.ddp else a.codec,
                "model": a.model,
                "workers": world,
                "threads": threads,
                "steps": steps,
                "batch": a.batch,
                "seed": a.seed,
                "torch": torch.__version__.split("+")[0],
                "gradwire": None if gw is None else __import__("gradwire").__version__,
                "revision": revision(),
                "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
            }
            if gw is not None:
                rec["engine_bytes"] = gw.bytes_sent()["sent_bytes"]
                if a.device == "cuda":
                    rec["device"] = torch.cuda.get_device_name(device)
                    rec["device_copies"] = gw.device_copies()
                if epoch + 1 == a.epochs and os.environ.get("GRADWIRE_TIMELINE"):
                    rec["overlap"] = gw.overlap_summary()
            line = json.dumps(rec)
            print(line, flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(line + "\n")
    if gw is None:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    else:
        gw.shutdown()


if __name__ == "__main__":
    main()
