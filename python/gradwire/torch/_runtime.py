"""This process's rank and its one engine: ``init``, the engine (re)starts that register
tensors, the timeline written at ``shutdown``."""

import atexit
import itertools
import os
import threading
import weakref

from .. import _gradwire

_lock = threading.RLock()
_rt = None
# What the running engine registers: (name, shape) in order, and the one engine config.
_tensors = []
_config = None
_names = {}
_timeline_path = os.environ.get("GRADWIRE_TIMELINE") or None
# The live DistributedOptimizers, told the step when an engine state is loaded.
optimizers = weakref.WeakSet()


def init(transport="auto"):
    """Joins the job: ranks come from gradwire launch's, torchrun's, Open MPI's or Slurm's
    variables (as ``gradwire train`` reads them); a process no launcher started is a world of
    one rank. ``transport``: ``auto`` (mpi under an MPI launcher when built with it, else
    tcp), ``tcp``, ``shm`` (every rank on one host) or ``mpi``. Calling it again does
    nothing."""
    global _rt
    with _lock:
        if _rt is not None and not _rt.closed:
            return
        _rt = _gradwire.Runtime(transport)
        atexit.register(shutdown)


def runtime():
    """The runtime, or ``ValueError`` before ``init()`` (Horovod's behaviour)."""
    rt = _rt
    if rt is None or rt.closed:
        raise ValueError("gradwire has not been initialized; use gradwire.torch.init()")
    return rt


def is_initialized():
    """Whether ``init()`` ran and ``shutdown()`` did not."""
    return _rt is not None and not _rt.closed


def auto_name(kind):
    """``kind.noname.N``: the N-th unnamed ``kind`` operation (the same on every rank when
    every rank makes the same calls, as collectives require)."""
    with _lock:
        counter = _names.setdefault(kind, itertools.count())
        return f"{kind}.noname.{next(counter)}"


def register(tensors, config):
    """Makes the engine register ``tensors`` (``(name, shape)`` pairs) under ``config`` (a
    dict of ``Runtime.start`` arguments): restarts it (collectively: every rank calls this at
    the same point) with the union of everything registered so far. Every registrant must
    ask for the same config; a tensor name registered twice must keep its shape."""
    global _config
    rt = runtime()
    with _lock:
        if _config is not None and config != _config:
            raise ValueError(
                "gradwire runs one engine configuration per process, and this one differs from "
                f"the running one:\n  running:   {_config}\n  requested: {config}\n"
                "give every DistributedOptimizer / comm_hook the same codec, rules and sync "
                "(per-tensor codecs go in rules=)"
            )
        known = dict(_tensors)
        new = []
        for name, shape in tensors:
            shape = [int(d) for d in shape]
            if name in known:
                if list(known[name]) != shape:
                    raise ValueError(
                        f"tensor {name!r} is registered with shape {known[name]}, now {shape}"
                    )
                continue
            known[name] = shape
            new.append((name, shape))
        if not new and _config is not None:
            return
        _tensors.extend(new)
        _config = dict(config)
        rt.start(list(_tensors), timeline=_timeline_path is not None, **_config)


def restart():
    """After an elastic re-form (``Runtime.reform``): starts the engine again with every
    tensor registered so far under the same config (its codec state starts afresh), and
    restarts the counters of unnamed operations (joiners start them at zero too)."""
    rt = runtime()
    with _lock:
        _names.clear()
        if _config is not None:
            rt.start(list(_tensors), timeline=_timeline_path is not None, **_config)


def rank_path(path, rank):
    """``FILE.rankR.EXT`` beside ``FILE.EXT`` (the CLI's per-rank timeline names)."""
    head, tail = os.path.split(path)
    stem, ext = os.path.splitext(tail)
    return os.path.join(head, f"{stem or 'timeline'}.rank{rank}{ext}")


def shutdown():
    """Writes the timeline (``GRADWIRE_TIMELINE=FILE``: each rank ``FILE.rankR.json``, rank 0
    merges them into ``FILE``), then shuts the engine down on every rank and closes the
    transport. Runs at exit when not called."""
    global _rt, _config
    with _lock:
        rt = _rt
        if rt is None or rt.closed:
            return
        try:
            if _timeline_path is not None and _config is not None:
                mine = rank_path(_timeline_path, rt.rank)
                rt.write_timeline(mine)
                # Every rank's file is written before rank 0 merges them.
                rt.barrier("gradwire.timeline").wait_bytes()
                if rt.rank == 0:
                    files = [rank_path(_timeline_path, r) for r in range(rt.size)]
                    _gradwire.Runtime.merge_timelines(files, _timeline_path)
        finally:
            _tensors.clear()
            _config = None
            rt.shutdown()
