"""DDP communication hooks: ``ddp.register_comm_hook(state, gradwire.torch.comm_hook(codec=...))``
hands DDP's gradient buckets to gradwire's engine, so an existing DDP script gains gradwire's
codecs and transports without other changes.

DDP builds its buckets during the first iteration and rebuilds them once after it; until the
layout has been the same for a whole iteration, buckets are reduced dense and exact (as
PyTorch's own PowerSGD hook starts with plain all-reduces). Then, at the start of the next
iteration, every rank registers each bucket's gradients as tensors (``ddp.bBUCKET.J``, the
parameter shapes) with the codec, and from then on each bucket's tensors go through it: fused,
compressed, with error feedback and the codec's state per tensor. ``codec="none"`` never
registers: every bucket is averaged dense, as DDP's default hook does.

The returned ``torch.futures.Future`` is completed by a waiter thread once the engine has
reduced the bucket (or set to the engine's error, naming the rank or tensor). CUDA buckets
stay on the GPU: their copies to and from pinned host memory are queued on the stream the
hook was called on, so DDP's work after the future reads the reduced bucket."""

import queue
import threading

import torch

from . import _buffers, _runtime


class _Waiter:
    """One daemon thread completing futures in submission order."""

    def __init__(self):
        self.q = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="gradwire-comm-hook", daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            fut, buffer, stream, parts = item
            try:
                for h, buf in parts:
                    _buffers.wait_into(h, buf, 1.0, stream)
                fut.set_result(buffer)
            except Exception as e:  # the engine's error, for DDP to raise in backward
                fut.set_exception(e)


class GradwireHook:
    """The callable that ``comm_hook`` returns (DDP calls it as ``hook(state, bucket)``)."""

    def __init__(self, codec="none", rules=None, sync="auto", seed=42, momentum=None):
        from .. import codec as _codec

        self.codec = _codec.normalize(codec)
        self.config = {"codec": self.codec, "rules": list(rules or []), "sync": sync,
                       "momentum": momentum, "seed": int(seed)}
        self.dense = self.codec == _codec.normalize("none") and not rules
        self.layout = {}          # bucket index -> parameter shapes, this iteration
        self.previous = None      # the last complete iteration's layout
        self.stable = False       # the last two complete iterations had the same layout
        self.registered = None    # the layout registered with the engine
        self.waiter = None
        self.iteration = 0

    def _start_iteration(self):
        if self.layout:
            done = dict(self.layout)
            self.stable = done == self.previous
            self.previous = done
        self.layout = {}
        if not self.dense and self.registered is None and self.stable:
            tensors = [(f"ddp.b{i}.{j}", shape) for i in sorted(self.previous)
                       for j, shape in enumerate(self.previous[i])]
            _runtime.register(tensors, self.config)
            self.registered = self.previous

    def __call__(self, state, bucket):
        rt = _runtime.runtime()
        if self.waiter is None:
            self.waiter = _Waiter()
        index = bucket.index()
        if index == 0:
            self._start_iteration()
            self.iteration += 1
        grads = bucket.gradients()
        shapes = [list(g.shape) for g in grads]
        self.layout[index] = shapes
        buffer = bucket.buffer()
        if buffer.dtype != torch.float32 or buffer.device.type not in ("cpu", "cuda"):
            raise TypeError(f"gradwire's comm hook reduces float32 CPU or CUDA buckets, not "
                            f"{buffer.dtype} on {buffer.device}")
        stream = torch.cuda.current_stream(buffer.device) if buffer.is_cuda else None
        fut = torch.futures.Future()
        if self.registered is not None and self.registered.get(index) == shapes:
            parts = []
            for j, g in enumerate(grads):
                if not g.is_contiguous():
                    raise TypeError("a bucket's gradient view is not contiguous")
                buf = _buffers.Buffer(g)
                parts.append((_buffers.submit_allreduce(rt, f"ddp.b{index}.{j}", buf, 1.0), buf))
            if bucket.is_last():
                rt.flush()
        else:
            name = f"ddp.dense.b{index}.{buffer.numel()}"
            buf = _buffers.Buffer(buffer)
            parts = [(_buffers.submit_allreduce(rt, name, buf, 1.0), buf)]
        self.waiter.q.put((fut, buffer, stream, parts))
        return fut


def comm_hook(codec="none", rules=None, sync="auto", seed=42):
    """A DDP communication hook that reduces each gradient bucket through gradwire's engine
    with ``codec`` (any gradwire codec spec, e.g. ``"powersgd:rank=2"``), per-tensor ``rules``
    and strategy ``sync``. Register it with ``ddp.register_comm_hook(None, hook)``; DDP's
    process group only starts the job (gradwire's transport carries the gradients)."""
    impl = GradwireHook(codec, rules, sync, seed)

    def gradwire_comm_hook(state, bucket):
        return impl(state, bucket)

    gradwire_comm_hook.gradwire = impl
    return gradwire_comm_hook


__all__ = ["comm_hook", "GradwireHook"]
