"""The ranks' programs of the pytest suite: `python jobs.py JOB OUT [ARGS]`, one process per
rank under the variables `launch.Job` sets. Each writes what the test compares to `OUT`."""

import os
import sys
import time

import torch
import torch.nn.functional as F

STEPS = 20
LR, MOMENTUM = 0.05, 0.9


def model(seed=7):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 8))


# A learnable task: the label is the largest of 8 fixed linear scores of the input.
TEACHER = torch.randn(16, 8, generator=torch.Generator().manual_seed(3))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 16, generator=g)
    return x, (x @ TEACHER).argmax(1)


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def rank_world():
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def save(out, name, obj):
    torch.save(obj, os.path.join(out, name))


# ---- dense equivalence: DDP (gloo) against gradwire on the same model, seed and data


def ddp(out, hook="default", codec="none", steps=STEPS):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = rank_world()
    dist.init_process_group("gloo")
    m = model()
    net = DDP(m)
    if hook == "gradwire":
        import gradwire.torch as gw

        gw.init()
        net.register_comm_hook(None, gw.comm_hook(codec=codec))
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for step in range(int(steps)):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if rank == 0:
        result = {"params": flat(m), "losses": losses}
        if hook == "gradwire":
            import gradwire.torch as gw

            result["bytes"] = gw.bytes_sent()
        save(out, f"ddp-{hook}-{codec.replace(':', '_')}.pt", result)
    if hook == "gradwire":
        import gradwire.torch as gw

        gw.shutdown()
    dist.barrier()
    dist.destroy_process_group()


def gw_optimizer(out, codec="none", steps=STEPS):
    import gradwire.torch as gw

    gw.init()
    rank, world = gw.rank(), gw.size()
    m = model()
    gw.broadcast_parameters(m.state_dict(), root_rank=0)
    opt = gw.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM),
                                  named_parameters=m.named_parameters(), codec=codec,
                                  steps_per_epoch=10)
    gw.broadcast_optimizer_state(opt, root_rank=0)
    losses = []
    for step in range(int(steps)):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if rank == 0:
        save(out, f"gw-optimizer-{codec.replace(':', '_')}.pt",
             {"params": flat(m), "losses": losses, "bytes": gw.bytes_sent()})
    gw.shutdown()


def gw_allreduce(out):
    import gradwire.torch as gw

    gw.init()
    rank = gw.rank()
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        for name, p in m.named_parameters():
            gw.allreduce_(p.grad, name=name, op=gw.Average)
        opt.step()
    if rank == 0:
        save(out, "gw-allreduce.pt", {"params": flat(m)})
    gw.shutdown()


# ---- CUDA tensors: the model on the GPU, its gradients reduced from device memory


def cuda(out, codec="none", steps=STEPS):
    """On a machine with a GPU: the MLP trained on it through DistributedOptimizer (the
    gradients submitted as device pointers on the current stream), an in-place all-reduce
    and a broadcast of CUDA tensors. Without one: the refusals a user would meet."""
    import gradwire.torch as gw
    from gradwire import GradwireError

    gw.init()
    rank, world = gw.rank(), gw.size()
    if not torch.cuda.is_available():
        checks = {}
        try:
            gw.allreduce(torch.ones(4, device="meta"), name="meta")
        except ValueError as e:
            checks["meta"] = str(e)
        rt = gw._runtime.runtime()
        try:
            rt.allreduce_device("nodriver", 0x1000, 4, 0, 0)
        except GradwireError as e:
            checks["nodriver"] = str(e)
        save(out, f"cuda-rank{rank}.pt", {"cuda": False, "checks": checks})
        gw.shutdown()
        return
    dev = torch.device("cuda", gw.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    # An all-reduce and a broadcast of CUDA tensors against sums computed here.
    t = torch.arange(1000, dtype=torch.float32, device=dev) * (rank + 1)
    gw.allreduce_(t, name="cuda.sum", op=gw.Sum)
    want = torch.arange(1000, dtype=torch.float32) * sum(r + 1 for r in range(world))
    b = torch.full((77,), float(rank), device=dev)
    gw.broadcast_(b, root_rank=world - 1, name="cuda.bcast")
    m = model().to(dev)
    gw.broadcast_parameters(m.state_dict(), root_rank=0)
    opt = gw.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM),
                                  named_parameters=m.named_parameters(), codec=codec,
                                  steps_per_epoch=10)
    losses = []
    for step in range(int(steps)):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = F.cross_entropy(m(x.to(dev)), y.to(dev))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    save(out, f"cuda-rank{rank}.pt", {
        "cuda": True, "sum_ok": torch.equal(t.cpu(), want),
        "bcast_ok": torch.equal(b.cpu(), torch.full((77,), float(world - 1))),
        "params": flat(m).cpu(), "losses": losses, "bytes": gw.bytes_sent()})
    gw.shutdown()


# ---- saving and resuming: engine state (codec residuals, DGC's velocity and warm-up) with
# the model and the optimizer


def resume(out, phase, codec, steps="6", stop="3"):
    import gradwire.torch as gw

    gw.init()
    rank = gw.rank()
    m = model()
    opt = gw.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=1e-3),
        named_parameters=m.named_parameters(), codec=codec, steps_per_epoch=4)
    ckpt = os.path.join(out, f"ckpt-rank{rank}.pt")
    first = 0
    if phase == "second":
        saved = torch.load(ckpt)
        m.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        if not os.environ.get("GW_SKIP_ENGINE_STATE"):
            gw.load_state_dict(saved["gradwire"])
        first = int(stop)
    last = int(stop) if phase == "first" else int(steps)
    for step in range(first, last):
        x, y = batch(rank, step)
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()
    if phase == "first":
        torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(),
                    "gradwire": gw.state_dict()}, ckpt)
    elif rank == 0:
        save(out, f"resume-{phase}.pt", {"params": flat(m)})
    gw.shutdown()


# ---- a rank dies mid-step


def kill(out, victim="2", at_step="3"):
    import gradwire
    import gradwire.torch as gw

    gw.init()
    rank = gw.rank()
    m = model()
    opt = gw.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR),
                                  named_parameters=m.named_parameters())
    start = None
    try:
        for step in range(STEPS):
            x, y = batch(rank, step)
            opt.zero_grad()
            F.cross_entropy(m(x), y).backward()
            if step == int(at_step):
                if rank == int(victim):
                    os.kill(os.getpid(), 9)
                start = time.monotonic()
            opt.step()
    except gradwire.GradwireError as e:
        with open(os.path.join(out, f"rank{rank}.txt"), "w") as f:
            f.write(f"{time.monotonic() - start:.3f}\n{e}")
        os._exit(0)  # the engine is dead: skip the collective shutdown at exit
    sys.exit(f"rank {rank}: no error although rank {victim} died")


# ---- Horovod's API on 2+ ranks


def api(out):
    import gradwire
    import gradwire.torch as gw

    gw.init()
    rank, world = gw.rank(), gw.size()
    assert gw.local_rank() == rank and gw.local_size() == world, (gw.local_rank(), gw.local_size())
    t = torch.full((3,), float(rank + 1))
    assert torch.equal(gw.allreduce(t), torch.full((3,), (world + 1) / 2))
    assert torch.equal(gw.allreduce(t, op=gw.Sum), torch.full((3,), world * (world + 1) / 2))
    assert torch.equal(t, torch.full((3,), float(rank + 1))), "allreduce must not modify"
    u = t.clone()
    gw.allreduce_(u, op=gw.Sum, prescale_factor=0.5, postscale_factor=4.0)
    assert torch.allclose(u, torch.full((3,), 2.0 * world * (world + 1) / 2)), u
    # All-gather along dim 0, the first dimension differing per rank.
    g = gw.allgather(torch.full((rank + 1, 2), float(rank)))
    want = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(world)])
    assert torch.equal(g, want), g
    b = gw.broadcast(torch.full((4,), float(rank)), root_rank=world - 1)
    assert torch.equal(b, torch.full((4,), float(world - 1)))
    # float64 goes through a float32 staging copy.
    d = gw.allreduce(torch.full((2,), float(rank), dtype=torch.float64))
    assert d.dtype == torch.float64 and torch.allclose(d, torch.full((2,), (world - 1) / 2,
                                                                      dtype=torch.float64))
    h = gw.allreduce_async(torch.ones(5), name="async")
    assert torch.equal(gw.synchronize(h), torch.ones(5))
    assert gw.broadcast_object({"from": rank}, root_rank=1) == {"from": 1}

    # broadcast_parameters and broadcast_optimizer_state make every rank rank 0's.
    m = model(seed=rank)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    opt.zero_grad()
    F.cross_entropy(m(batch(rank, 0)[0]), batch(rank, 0)[1]).backward()
    opt.step()  # momentum buffers differ per rank
    gw.broadcast_parameters(m.state_dict(), root_rank=0)
    gw.broadcast_optimizer_state(opt, root_rank=0)
    got = gw.allgather(flat(m).unsqueeze(0))
    assert all(torch.equal(got[0], got[r]) for r in range(world)), "parameters differ"
    bufs = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in m.parameters()])
    got = gw.allgather(bufs.unsqueeze(0))
    assert all(torch.equal(got[0], got[r]) for r in range(world)), "optimizer state differs"

    # backward_passes_per_step=2: two local backward passes, one exchange, the sum of both.
    m = model()
    opt = gw.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0),
                                  named_parameters=m.named_parameters(),
                                  backward_passes_per_step=2)
    ref = model()
    opt.zero_grad()
    for s in range(2):
        x, y = batch(rank, s)
        F.cross_entropy(m(x), y).backward()
        F.cross_entropy(ref(x), y).backward()
    opt.step()
    local = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
    mean = gw.allreduce(local, name="bpps.reference")
    got = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
    assert torch.allclose(got, mean, rtol=1e-6, atol=1e-7), (got - mean).abs().max()

    # A branch no rank (or only some ranks) uses must not make step() wait.
    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 2)
            self.unused = torch.nn.Linear(4, 2)
            self.sometimes = torch.nn.Linear(4, 2)

        def forward(self, x, use):
            return self.a(x) + (self.sometimes(x) if use else 0)

    net = Branchy()
    opt = gw.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                  named_parameters=net.named_parameters())
    for step in range(3):
        opt.zero_grad()
        net(torch.ones(2, 4), use=(rank == 0)).sum().backward()
        opt.step()
    assert net.unused.weight.grad is not None and torch.all(net.unused.weight.grad == 0)

    # A tensor submitted with another shape on one rank is an error naming it.
    try:
        gw.allreduce(torch.ones(3 + rank), name="mismatched")
    except gradwire.GradwireError as e:
        assert "mismatched" in str(e), e
    else:
        raise AssertionError("a mismatched tensor did not raise")
    save(out, f"api-rank{rank}.ok", True)
    os._exit(0)  # the mismatch stopped the engine: nothing to shut down


# ---- elastic training (gradwire launch --elastic): a rank dies, the others go on, a joiner
# is admitted


def elastic_mlp(out, victim="2", at_commit="3", min_epochs="2"):
    """Trains under ``gw.elastic.run``, committing every 2 steps; rank ``victim`` of
    generation 0 kills itself after commit ``at_commit``. Trains at least ``min_epochs`` and
    until the world has re-formed twice (lost, then joined). Appends ``generation size rank``
    to ``log-PID.txt`` at every (re)start and writes its final parameters' hash to
    ``final-PID.json``."""
    import hashlib
    import json
    import signal

    import gradwire.torch as gw

    gw.init()
    pid = os.getpid()
    m = model()
    opt = gw.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM),
                                  named_parameters=m.named_parameters())
    state = gw.elastic.TorchState(model=m, optimizer=opt, epoch=0, batch=0)
    rt = gw._rt()
    batches = 6

    @gw.elastic.run
    def train(state):
        with open(os.path.join(out, f"log-{pid}.txt"), "a") as f:
            f.write(f"{rt.generation} {gw.size()} {gw.rank()}\n")
        for state.epoch in range(state.epoch, 1000):
            for state.batch in range(state.batch, batches):
                x, y = batch(gw.rank(), state.epoch * batches + state.batch)
                opt.zero_grad()
                F.cross_entropy(m(x), y).backward()
                if (rt.generation == 0 and gw.rank() == int(victim)
                        and state.commits == int(at_commit)):
                    os.kill(os.getpid(), signal.SIGKILL)
                opt.step()
                time.sleep(0.02)
                if state.batch % 2 == 1:
                    state.commit()
            state.batch = 0
            # The same on every rank of a world: they stop at the same epoch.
            if state.epoch + 1 >= int(min_epochs) and rt.generation >= 2:
                return state.epoch + 1

    epochs = train(state)
    digest = hashlib.sha256(bytes(flat(m).view(torch.uint8).tolist())).hexdigest()
    with open(os.path.join(out, f"final-{pid}.json"), "w") as f:
        json.dump({"hash": digest, "size": gw.size(), "rank": gw.rank(),
                   "generation": rt.generation, "epochs": epochs}, f)


def elastic_local(out):
    """Without an elastic launcher: ``run`` calls the function once, and commit/restore
    round-trip the model, the optimizer and the attributes."""
    import gradwire.torch as gw

    gw.init()
    assert not gw._rt().elastic
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
    state = gw.elastic.TorchState(model=m, optimizer=opt, epoch=0)
    calls = []

    def step(s):
        x, y = batch(0, s)
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()

    @gw.elastic.run
    def train(state):
        calls.append(1)
        step(0)
        state.epoch = 3
        state.commit()
        return "done"

    assert train(state) == "done" and len(calls) == 1, calls
    assert state.commits == 1
    kept = flat(m).clone()
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    step(1)
    state.epoch = 4
    assert not torch.equal(flat(m), kept)
    state.restore()
    assert torch.equal(flat(m), kept), "the model was not restored"
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], momentum)
    assert state.epoch == 3
    # The restored copy stays intact when training goes on from it.
    step(2)
    state.restore()
    assert torch.equal(flat(m), kept)
    # The commit before (counter 0, at construction) is kept too.
    state.restore(0)
    assert state.epoch == 0 and not torch.equal(flat(m), kept)
    save(out, "elastic-local.ok", True)
    gw.shutdown()


if __name__ == "__main__":
    job, out, *args = sys.argv[1:]
    globals()[job](out, *args)
