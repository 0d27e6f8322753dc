"""Elastic training with Horovod Elastic's API: ranks may die and processes may join while
the job trains.

.. code-block:: python

    import gradwire.torch as gw
    gw.init()                       # under `gradwire launch --elastic 2:4 -n 4 -- python train.py`
    model, opt = ..., gw.DistributedOptimizer(...)
    state = gw.elastic.TorchState(model=model, optimizer=opt, epoch=0, batch=0)

    @gw.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, EPOCHS):
            for state.batch in range(state.batch, BATCHES):
                ...step...
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0

    train(state)

``gradwire launch --elastic MIN:MAX -n N --join-file F -- CMD`` starts N processes and a
membership coordinator; ``gradwire launch --join F`` starts one more, admitted at the job's
next commit. ``gw.init()`` gets this process's first world from the coordinator.

- ``state.commit()`` keeps an in-memory copy of the model's and the optimizer's state dicts
  and of the extra attributes (``epoch``, ``batch`` above), tagged with a commit counter that
  is the same on every rank (the two newest are kept); then rank 0 asks the coordinator
  whether a process waits to join, the ranks agree, and if one does every rank raises
  :class:`HostsUpdatedInterrupt`.
- ``gw.elastic.run(func)`` calls ``state.sync()`` (rank 0's model, optimizer state and extra
  attributes on every rank), then ``func(state)``. When ``func`` raises ``GradwireError`` (a
  peer died: collectives raise it naming the rank) or :class:`HostsUpdatedInterrupt`, the
  ranks re-form: each asks the coordinator for the next world with the commits it holds,
  joins a new TCP mesh, restarts the engine with the tensors it had registered; the survivors
  restore the newest commit every one of them holds, and ``run`` syncs and calls ``func``
  again. ``gw.rank()`` and ``gw.size()`` give the new world's values. When ``func`` returns,
  the coordinator is told this member is done.
- A lost rank costs the steps since the last commit; a joiner waits at most one commit
  interval. The learning rate stays as it is when the world (and the global batch) changes,
  as Horovod Elastic does by default (:meth:`State.register_reset_callbacks` can change it).

Deliberate difference from ``gradwire train --elastic``: the engine's codec state (error
feedback residuals, DGC's velocities, momentum correction) starts afresh on every rank after
a re-form, where the trainer keeps each survivor's own.

Without ``GRADWIRE_ELASTIC`` (any other launcher, or none), ``run`` calls ``func`` once and
``commit()`` only keeps the copy: the same script runs either way.
"""

import copy
import functools
import time

import torch

from .._gradwire import GradwireError
from . import _runtime
from .ops import broadcast_, broadcast_object, broadcast_optimizer_state, broadcast_parameters

# Commits kept per rank: a rank that died between two commits leaves the others one apart.
KEEP = 2
# Re-forms in a row without a commit between them after which `run` gives up and raises the
# error: a failure that is no peer's (a mismatched tensor) would otherwise repeat forever.
FUTILE_REFORMS = 5


class HostsUpdatedInterrupt(RuntimeError):
    """Raised on every rank at a commit when the ranks agreed to re-form the world to admit
    a process waiting to join (Horovod's name). ``gw.elastic.run`` handles it."""


def _elastic_runtime():
    """The runtime when this process is a member of an elastic job, else ``None``."""
    if not _runtime.is_initialized():
        return None
    rt = _runtime.runtime()
    return rt if rt.elastic else None


class State:
    """What a rank commits, restores and syncs: the extra attributes given as keyword
    arguments (``state.epoch``), plus what subclasses add. Horovod's ``ObjectState``."""

    def __init__(self, **kwargs):
        self._extra = list(kwargs)
        self._commits = []  # (counter, snapshot), oldest first
        self._counter = 0
        self._reset_callbacks = []
        self._reported_generation = 0
        for k, v in kwargs.items():
            setattr(self, k, v)
        self.save()

    @property
    def commits(self):
        """The commit counter: how many commits the job has made (the same on every rank)."""
        return self._counter

    # ---- what a snapshot holds (subclasses add to it)

    def _snapshot(self):
        return {"extra": {k: copy.deepcopy(getattr(self, k)) for k in self._extra}}

    def _load(self, snap):
        for k, v in snap["extra"].items():
            setattr(self, k, copy.deepcopy(v))

    def _broadcast(self):
        """Rank 0's state on every rank (collective)."""
        got = broadcast_object(
            {"counter": self._counter, "extra": {k: getattr(self, k) for k in self._extra}},
            0, "gradwire.elastic.sync")
        self._counter = got["counter"]
        for k, v in got["extra"].items():
            setattr(self, k, v)

    # ---- Horovod's State API

    def save(self):
        """Keeps a copy of the state tagged with the current commit counter (replacing one of
        the same counter; the two newest are kept). No communication."""
        snap = self._snapshot()
        self._commits = [(c, s) for c, s in self._commits if c != self._counter]
        self._commits.append((self._counter, snap))
        del self._commits[:-KEEP]

    def restore(self, step=None):
        """Puts back the commit with counter ``step`` (default: the newest)."""
        if not self._commits:
            raise ValueError("nothing was committed")
        if step is None:
            counter, snap = self._commits[-1]
        else:
            found = [(c, s) for c, s in self._commits if c == step]
            if not found:
                raise ValueError(f"no commit {step} is kept (kept: "
                                 f"{[c for c, _ in self._commits]})")
            counter, snap = found[0]
        self._load(snap)
        self._counter = counter

    def sync(self):
        """Makes every rank's state rank 0's (collective), and keeps it as the current
        commit."""
        self._broadcast()
        self.save()

    def commit(self):
        """Counts a commit and keeps a copy of the state; in an elastic job, then checks
        whether a process waits to join (collective: every rank commits at the same point)
        and raises :class:`HostsUpdatedInterrupt` on every rank if one does."""
        self._counter += 1
        self.save()
        rt = _elastic_runtime()
        if rt is None:
            return
        generation = rt.generation
        if rt.rank == 0 and generation > self._reported_generation:
            # The re-formed world has trained up to here.
            rt.resumed(generation, time.time())
        self._reported_generation = generation
        self.check_host_updates()

    def check_host_updates(self):
        """Raises :class:`HostsUpdatedInterrupt` on every rank when a process waits to join
        (rank 0 asks the coordinator, every rank gets its answer). Collective."""
        rt = _elastic_runtime()
        if rt is None:
            return
        flag = torch.tensor([1.0 if rt.rank == 0 and rt.pending() else 0.0])
        broadcast_(flag, 0, "gradwire.elastic.pending")
        if flag.item() > 0:
            raise HostsUpdatedInterrupt("a process waits to join: re-forming the world")

    def register_reset_callbacks(self, callbacks):
        """Functions called (without arguments) after each re-form, before ``func`` runs
        again: e.g. to scale the learning rate to ``gw.size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for cb in self._reset_callbacks:
            cb()


class ObjectState(State):
    """A state of plain attributes only (Horovod's ``ObjectState``)."""


class TorchState(State):
    """A model's and an optimizer's state with extra attributes: ``TorchState(model=m,
    optimizer=opt, epoch=0, batch=0)`` (Horovod's ``TorchState``). A commit holds deep copies
    of ``model.state_dict()``, ``optimizer.state_dict()`` (the wrapped torch optimizer's) and
    the attributes."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        super().__init__(**kwargs)

    def _snapshot(self):
        snap = super()._snapshot()
        if self.model is not None:
            snap["model"] = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            snap["optimizer"] = copy.deepcopy(self.optimizer.state_dict())
        return snap

    def _load(self, snap):
        super()._load(snap)
        if self.model is not None:
            self.model.load_state_dict(snap["model"])
        if self.optimizer is not None:
            # A copy: the optimizer keeps the tensors it is given and updates them in place.
            self.optimizer.load_state_dict(copy.deepcopy(snap["optimizer"]))

    def _broadcast(self):
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        super()._broadcast()


def _reform(state):
    """Moves this rank to the next world after a failure or an agreed re-form."""
    rt = _runtime.runtime()
    kept = [c for c, _ in state._commits]
    _generation, rank, _size, restore_step, survivors = rt.reform(kept, max(kept, default=0))
    _runtime.restart()
    # Whatever a step left in flight belongs to the old world.
    for opt in list(_runtime.optimizers):
        opt._handles.clear()
        opt._delay = {p: opt._passes for p in opt._params}
        opt._synchronized = False
        opt._first_hook_us = None
        spe = opt._steps_per_epoch
        rt.set_progress(opt._step_count, opt._step_count / spe if spe else 0.0)
    if restore_step is not None and rank < survivors:
        state.restore(restore_step)
    state.on_reset()


def run(func):
    """Wraps ``func(state, ...)`` to survive lost ranks and admit joiners (Horovod's
    ``hvd.elastic.run``): syncs ``state`` from rank 0, calls ``func``; on ``GradwireError``
    or :class:`HostsUpdatedInterrupt` re-forms the world, restores the newest common commit,
    and calls it again; tells the coordinator this member is done when ``func`` returns.
    After ``FUTILE_REFORMS`` re-forms in a row with no commit between them the error is
    raised. Without an elastic launcher it calls ``func`` once."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        rt = _elastic_runtime()
        if rt is None:
            return func(state, *args, **kwargs)
        futile, counter = 0, None
        while True:
            try:
                state.sync()
                result = func(state, *args, **kwargs)
            except (GradwireError, HostsUpdatedInterrupt):
                futile = futile + 1 if state.commits == counter else 1
                if futile > FUTILE_REFORMS:
                    raise
                counter = state.commits
                _reform(state)
                continue
            rt.done()
            return result

    return wrapper


__all__ = ["run", "State", "ObjectState", "TorchState", "HostsUpdatedInterrupt"]
