"""Horovod's collectives on torch tensors: all-reduce, all-gather, broadcast (blocking,
in-place and asynchronous forms), and the broadcasts of parameters, optimizer state and
Python objects. Every rank must make the same calls in the same order (the unnamed ones are
named by their order)."""

import io
import pickle

import torch

from . import _runtime
from ._buffers import Buffer, submit_allreduce, wait_into

Average = "average"
"""All-reduce op: the mean over ranks (Horovod's ``hvd.Average``)."""
Sum = "sum"
"""All-reduce op: the sum over ranks (Horovod's ``hvd.Sum``)."""


def _op(op, average):
    if average is not None:
        if op is not None:
            raise ValueError("give op= or the older average=, not both")
        return Average if average else Sum
    op = Average if op is None else op
    if op not in (Average, Sum):
        raise ValueError(f"op={op!r}: gradwire supports gradwire.torch.Average and Sum")
    return op


class _Pending:
    """An asynchronous operation: the native handle, the output buffer kept alive until
    the result is written into it, and the factor applied on the way out."""

    __slots__ = ("handle", "out", "scale", "kind", "shape")

    def __init__(self, handle, out, scale=1.0, kind="reduce", shape=None):
        self.handle, self.out, self.scale, self.kind, self.shape = handle, out, scale, kind, shape


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0):
    """Starts an in-place all-reduce of ``tensor``; returns a handle for :func:`synchronize`.
    ``op``: :data:`Average` (default) or :data:`Sum`; ``prescale_factor`` multiplies the input,
    ``postscale_factor`` the result. A name registered by a ``DistributedOptimizer`` goes
    through its codec; other names are reduced dense and exact."""
    rt = _runtime.runtime()
    op = _op(op, average)
    name = name or _runtime.auto_name("allreduce")
    buf = Buffer(tensor)
    h = submit_allreduce(rt, name, buf, prescale_factor)
    post = float(postscale_factor) * (rt.size if op == Sum else 1.0)
    return _Pending(h, buf, post)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0):
    """:func:`allreduce_async_` into a new tensor (``tensor`` is left as it is)."""
    return allreduce_async_(tensor.detach().clone(), average, name, op, prescale_factor,
                            postscale_factor)


def allgather_async(tensor, name=None):
    """Starts an all-gather: the result concatenates every rank's ``tensor`` along the first
    dimension, in rank order (the first dimension may differ between ranks). A CUDA tensor
    is gathered through a host copy and the result comes back to its device."""
    rt = _runtime.runtime()
    name = name or _runtime.auto_name("allgather")
    buf = Buffer(tensor.detach().cpu() if tensor.device.type == "cuda" else tensor)
    buf.tensor = tensor
    h = rt.allgather(name, buf.addr, buf.numel)
    return _Pending(h, buf, kind="gather", shape=tuple(tensor.shape[1:]))


def broadcast_async_(tensor, root_rank, name=None):
    """Starts an in-place broadcast of rank ``root_rank``'s ``tensor``."""
    rt = _runtime.runtime()
    name = name or _runtime.auto_name("broadcast")
    buf = Buffer(tensor)
    if buf.on_gpu:
        h = rt.broadcast_device(name, buf.addr, buf.numel, buf.stream, buf.device,
                                int(root_rank))
    else:
        h = rt.broadcast(name, buf.addr, buf.numel, int(root_rank))
    return _Pending(h, buf)


def broadcast_async(tensor, root_rank, name=None):
    """:func:`broadcast_async_` into a new tensor."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name)


def poll(handle):
    """Whether the operation has completed; never blocks."""
    return handle.handle.test()


def synchronize(handle):
    """Waits for the operation and returns its output tensor; raises
    :class:`gradwire.GradwireError` if it failed (a dead rank or a mismatched tensor, named)."""
    if handle.kind == "gather":
        raw = handle.handle.wait_bytes()
        flat = torch.frombuffer(bytearray(raw), dtype=torch.float32)
        out = handle.out.tensor
        rows = flat.view(-1, *handle.shape) if handle.shape else flat
        return rows.to(device=out.device, dtype=out.dtype)
    buf = handle.out
    wait_into(handle.handle, buf, handle.scale)
    return buf.finish()


def allreduce(tensor, average=None, name=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0):
    """The all-reduce of ``tensor`` (mean over ranks by default) as a new tensor."""
    return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                       postscale_factor))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0):
    """In-place :func:`allreduce`; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


def allgather(tensor, name=None):
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order."""
    return synchronize(allgather_async(tensor, name))


def broadcast(tensor, root_rank, name=None):
    """Rank ``root_rank``'s ``tensor`` as a new tensor, on every rank."""
    return synchronize(broadcast_async(tensor, root_rank, name))


def broadcast_(tensor, root_rank, name=None):
    """In-place :func:`broadcast`; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def barrier(name=None):
    """Returns once every rank has called it."""
    rt = _runtime.runtime()
    rt.barrier(name or _runtime.auto_name("barrier")).wait_bytes()


def broadcast_object(obj, root_rank=0, name=None):
    """Rank ``root_rank``'s picklable ``obj`` on every rank (one float per byte on the wire:
    for small objects; tensors go through :func:`broadcast_`)."""
    rt = _runtime.runtime()
    name = name or _runtime.auto_name("broadcast_object")
    if rt.rank == root_rank:
        f = io.BytesIO()
        torch.save(obj, f)
        data = torch.frombuffer(bytearray(f.getvalue()), dtype=torch.uint8).to(torch.float32)
        length = torch.tensor([float(data.numel())])
    else:
        length = torch.zeros(1)
    broadcast_(length, root_rank, name + ".len")
    if rt.rank != root_rank:
        data = torch.zeros(int(length.item()))
    broadcast_(data, root_rank, name + ".data")
    if rt.rank == root_rank:
        return obj
    raw = bytes(data.to(torch.uint8).tolist())
    return torch.load(io.BytesIO(raw), weights_only=False)


def broadcast_parameters(params, root_rank=0):
    """Overwrites ``params`` (a ``state_dict()``, or ``named_parameters()``, or a list of
    ``(name, tensor)``) with rank ``root_rank``'s values, in place, on every rank."""
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
        if items and not isinstance(items[0], tuple):
            raise ValueError("broadcast_parameters takes a state_dict or (name, tensor) pairs")
    with torch.no_grad():
        pending = [
            broadcast_async_(t.data if isinstance(t, torch.nn.Parameter) else t, root_rank,
                             f"broadcast_parameters.{name}")
            for name, t in items
            if torch.is_tensor(t) and t.is_floating_point()
        ]
        for p in pending:
            synchronize(p)
        # Integer buffers (BatchNorm's num_batches_tracked) travel as an object.
        ints = {n: t for n, t in items if torch.is_tensor(t) and not t.is_floating_point()}
        if ints:
            got = broadcast_object(ints, root_rank, "broadcast_parameters.ints")
            for n, t in ints.items():
                t.copy_(got[n])


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Makes every rank's ``optimizer`` state (its buffers and its hyper-parameters) rank
    ``root_rank``'s. Tensors are broadcast in place; the rest as an object."""
    state = optimizer.state_dict()
    rt = _runtime.runtime()
    # The root says which state tensors exist, with their shapes; other ranks make them.
    layout = None
    if rt.rank == root_rank:
        layout = {
            "param_groups": state["param_groups"],
            "state": {
                k: {n: (("tensor", tuple(v.shape), str(v.dtype)) if torch.is_tensor(v) else
                        ("value", v)) for n, v in s.items()}
                for k, s in state["state"].items()
            },
        }
    layout = broadcast_object(layout, root_rank, "broadcast_optimizer_state.layout")
    new_state = {}
    for k, entries in layout["state"].items():
        mine = state["state"].get(k, {})
        s = {}
        for n, (kind, *rest) in entries.items():
            if kind == "value":
                s[n] = rest[0]
                continue
            shape, dtype = rest
            t = mine.get(n)
            dt = getattr(torch, dtype.replace("torch.", ""))
            if not (torch.is_tensor(t) and tuple(t.shape) == tuple(shape) and t.dtype == dt):
                t = torch.zeros(shape, dtype=dt)
            s[n] = t
        new_state[k] = s
    float_ts = [(f"broadcast_optimizer_state.{k}.{n}", t)
                for k, s in sorted(new_state.items()) for n, t in sorted(s.items())
                if torch.is_tensor(t) and t.is_floating_point()]
    for p in [broadcast_async_(t, root_rank, name) for name, t in float_ts]:
        synchronize(p)
    int_ts = {f"{k}.{n}": t for k, s in new_state.items() for n, t in s.items()
              if torch.is_tensor(t) and not t.is_floating_point()}
    if int_ts:
        got = broadcast_object(int_ts, root_rank, "broadcast_optimizer_state.ints")
        for key, t in int_ts.items():
            t.copy_(got[key])
    optimizer.load_state_dict({"state": new_state, "param_groups": layout["param_groups"]})
