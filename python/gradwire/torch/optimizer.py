"""``DistributedOptimizer``: Horovod's wrapper, with gradwire's codecs behind it.

Each parameter's gradient goes to the engine from a post-accumulate-grad hook the moment
backward has produced it (non-blocking: the engine negotiates, fuses, compresses and reduces it
while backward goes on with earlier layers); ``step()`` waits only for what is still in flight,
then runs the wrapped optimizer. The codec, per-tensor rules and the momentum rules are those of
``gradwire train``:

- DGC owns the momentum (its momentum correction): the reduced gradient arrives
  momentum-corrected, so SGD applies it as it is and keeps a momentum of its own only for the
  weight-decay term (as gradwire's trainer and DGC's reference optimizer do);
- ``momentum_correction="on"`` moves SGD's momentum into the engine for any other codec;
- error feedback, residuals and DGC's warm-up live in the engine, per tensor;
  :func:`gradwire.torch.state_dict` saves them.
"""

import os

import torch

from . import _buffers, _runtime
from .ops import Average, Sum

# The codec used for Horovod's ``compression=`` values.
_COMPRESSION_CODEC = {"none": None, "fp16": "fp16", "bf16": "bf16"}


class Compression:
    """Horovod's ``compression=`` argument: ``none`` (no compression: the ``codec=``
    argument, dense by default) or ``fp16`` (gradwire's ``fp16`` codec); ``bf16`` too."""

    none = "none"
    fp16 = "fp16"
    bf16 = "bf16"


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, codec, rules, compression,
                 backward_passes_per_step, op, gradient_predivide_factor, sync,
                 momentum_correction, steps_per_epoch, seed, allow_dgc_adaptive):
        super(self.__class__, self).__init__(params)
        rt = _runtime.runtime()
        if op not in (Average, Sum):
            raise ValueError(f"op={op!r}: DistributedOptimizer supports Average and Sum")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        if not gradient_predivide_factor > 0:
            raise ValueError("gradient_predivide_factor must be positive")
        compression = getattr(compression, "name", compression)
        if compression not in _COMPRESSION_CODEC:
            raise ValueError(f"compression={compression!r}: expected Compression.none or fp16")
        if _COMPRESSION_CODEC[compression] is not None:
            if codec not in (None, "none"):
                raise ValueError("give compression= or codec=, not both")
            codec = _COMPRESSION_CODEC[compression]
        codec = codec or "none"

        params_in_groups = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(n, tuple) for n in named):
                raise ValueError("named_parameters must be (name, parameter) pairs, as "
                                 "model.named_parameters() gives")
            names = [n for n, _ in named]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError(f"parameter names must be unique: {dups}")
            by_id = {id(p): n for n, p in named}
            missing = [i for i, p in enumerate(params_in_groups) if id(p) not in by_id]
            if missing:
                raise ValueError(
                    f"named_parameters does not name every parameter of the optimizer "
                    f"({len(missing)} not named): pass model.named_parameters() of the model "
                    "whose parameters the optimizer holds")
        else:
            by_id = {id(p): f"allreduce.noname.{i}" for i, p in enumerate(params_in_groups)}
        self._params = [p for p in params_in_groups if p.requires_grad]
        self._names = {p: by_id[id(p)] for p in self._params}

        # The training rules, as gradwire train applies them.
        group = self.param_groups[0]
        is_sgd = isinstance(self, torch.optim.SGD)
        resolved = rt_resolve(codec, type(self).__name__, is_sgd,
                              float(group.get("momentum", 0.0) or 0.0),
                              bool(group.get("nesterov", False)), momentum_correction,
                              allow_dgc_adaptive)
        self._codec = resolved["codec"]
        om = resolved["optimizer_momentum"]
        # None: keep; (): corrected, SGD's own factor; (factor, nesterov): corrected with it.
        self._corrected = None if om is None or not is_sgd else om
        config = {
            "codec": self._codec,
            "rules": list(rules or []),
            "sync": sync,
            "momentum": resolved["momentum_correction"],
            "seed": int(seed),
        }
        _runtime.register([(self._names[p], list(p.shape)) for p in self._params], config)
        self._rt = rt
        self._op = op
        self._predivide = float(gradient_predivide_factor)
        self._passes = int(backward_passes_per_step)
        self._steps_per_epoch = steps_per_epoch
        self._step_count = 0
        self._delay = {p: self._passes for p in self._params}
        self._handles = {}
        self._synchronized = False
        self._should_sync = True
        self._first_hook_us = None
        rt.set_progress(0, 0.0)
        _runtime.optimizers.add(self)
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook) for p in self._params]

    # ---- the hot path: one hook per parameter, called as backward produces its gradient

    def _hook(self, p):
        if p in self._handles:
            raise AssertionError(
                "a gradient was computed more often than backward_passes_per_step before "
                "step(): raise backward_passes_per_step to accumulate gradients locally")
        self._delay[p] -= 1
        if self._delay[p] == 0:
            if self._first_hook_us is None:
                self._first_hook_us = _now()
            self._submit(p)
            if len(self._handles) == len(self._params):
                self._rt.flush()

    def _submit(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        g = p.grad
        if g.is_sparse or g.dtype != torch.float32 or not g.is_contiguous() or \
                g.device.type not in ("cpu", "cuda"):
            raise TypeError(
                f"{self._names[p]}: gradwire reduces dense contiguous float32 gradients on the "
                f"CPU or a CUDA device, this one is {g.dtype} on {g.device}")
        buf = _buffers.Buffer(g)
        h = _buffers.submit_allreduce(self._rt, self._names[p], buf, 1.0 / self._predivide)
        self._handles[p] = (h, buf)

    def synchronize(self):
        """Waits for every gradient of this step (submitting, as zeros, those of parameters
        that got none: unused branches never make a rank wait) and writes the reduced
        gradients into ``p.grad``."""
        for p in self._params:
            if p not in self._handles:
                self._submit(p)
        self._rt.flush()
        last_us = _now()
        scale = self._predivide * (self._rt.size if self._op == Sum else 1.0)
        try:
            for h, buf in self._handles.values():
                _buffers.wait_into(h, buf, scale)
        finally:
            if self._first_hook_us is not None:
                self._rt.record_span("backward", "backward", self._first_hook_us, last_us)
            self._handles.clear()
            self._delay = {p: self._passes for p in self._params}
            self._first_hook_us = None
        self._synchronized = True

    def skip_synchronize(self):
        """A context in which ``step()`` does not synchronize (after an explicit
        ``synchronize()`` and, say, gradient clipping), as in Horovod."""
        opt = self

        class _Skip:
            def __enter__(self):
                opt._should_sync = False

            def __exit__(self, *exc):
                opt._should_sync = True

        return _Skip()

    def step(self, closure=None):
        """Waits for the gradients still in flight, then the wrapped optimizer's step."""
        if self._should_sync and not self._synchronized:
            self.synchronize()
        self._synchronized = False
        start = _now()
        if self._corrected is not None:
            loss = self._corrected_step(closure)
        else:
            loss = super(self.__class__, self).step(closure)
        self._rt.record_span("update", "update", start, _now())
        self._step_count += 1
        epoch = self._step_count / self._steps_per_epoch if self._steps_per_epoch else 0.0
        self._rt.set_progress(self._step_count, float(epoch))
        return loss

    def _corrected_step(self, closure):
        # The gradient arrived momentum-corrected (DGC, or momentum_correction="on"): SGD
        # adds it as it is; the weight-decay term keeps a momentum of its own.
        saved = []
        with torch.no_grad():
            for group in self.param_groups:
                mu, nesterov = (group["momentum"], group["nesterov"]) if self._corrected == () \
                    else self._corrected
                wd, damp = group["weight_decay"], group.get("dampening", 0.0)
                if wd and mu:
                    for p in group["params"]:
                        if p.grad is None:
                            continue
                        d = p.detach() * wd
                        # In the optimizer's own state, so that its state_dict() keeps it.
                        b = self.state[p].get("gradwire_wd_momentum")
                        if b is None:
                            b = self.state[p]["gradwire_wd_momentum"] = d.clone()
                        else:
                            b.mul_(mu).add_(d, alpha=1.0 - damp)
                        p.grad.add_(d + mu * b if nesterov else b)
                elif wd:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.grad.add_(p.detach(), alpha=wd)
                saved.append((group, group["momentum"], group["weight_decay"]))
                group["momentum"], group["weight_decay"] = 0.0, 0.0
        try:
            return super(self.__class__, self).step(closure)
        finally:
            for group, mu, wd in saved:
                group["momentum"], group["weight_decay"] = mu, wd

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError(
                "zero_grad() while gradients are in flight: call step() or synchronize() first")
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def _resume_at(self, step, epoch):
        self._step_count = int(step)

    def set_epoch(self, epoch):
        """Tells the codecs where training is, in epochs (DGC's warm-up counts epochs), when
        ``steps_per_epoch`` was not given."""
        self._rt.set_progress(self._step_count, float(epoch))


def _now():
    from .. import _gradwire

    return _gradwire.now_us()


def rt_resolve(codec, optimizer, is_sgd, momentum, nesterov, momentum_correction,
               allow_dgc_adaptive):
    from .. import _gradwire

    return _gradwire.resolve_rules(codec, optimizer, is_sgd, momentum, nesterov, None,
                                   momentum_correction, "global", allow_dgc_adaptive)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         codec=None, rules=None, sync="auto", momentum_correction="auto",
                         steps_per_epoch=None, seed=42, allow_dgc_adaptive=False):
    """Wraps ``optimizer`` so that ``step()`` applies the gradients averaged (``op=Sum``:
    summed) over every rank, as Horovod's ``hvd.DistributedOptimizer`` does.

    Horovod's arguments: ``named_parameters`` (names the tensors; every rank must give the
    same), ``compression`` (``Compression.none`` or ``.fp16``), ``backward_passes_per_step``
    (accumulate that many backward passes locally before communicating), ``op``,
    ``gradient_predivide_factor`` (divide before the sum, multiply after).

    gradwire's: ``codec`` (any gradwire codec spec, e.g. ``"dgc:ratio=0.001"``; default dense),
    ``rules`` (per-tensor rules as ``gradwire train --rule``: ``"max=1023=>none"``), ``sync``
    (the strategy; ``auto`` picks the codec's), ``momentum_correction`` (``auto``: DGC owns the
    momentum; ``on``: every codec; ``off``), ``steps_per_epoch`` (codecs whose warm-up counts
    epochs, DGC's, need it or :meth:`set_epoch`), ``seed`` (the codecs' random streams),
    ``allow_dgc_adaptive`` (DGC under a non-SGD optimizer, refused by default)."""
    if codec is not None and not isinstance(codec, str):
        raise TypeError("codec= takes a gradwire codec spec string, e.g. 'dgc:ratio=0.001'")
    if steps_per_epoch is None and codec and "dgc" in codec and "warmup_epochs=0" not in codec:
        if os.environ.get("GRADWIRE_QUIET") is None:
            import warnings

            warnings.warn("DGC's warm-up counts epochs: pass steps_per_epoch= (or call "
                          "opt.set_epoch(e) each epoch), else the warm-up never ends",
                          stacklevel=2)
    if steps_per_epoch is not None and not (isinstance(steps_per_epoch, int) and
                                            steps_per_epoch > 0):
        raise ValueError("steps_per_epoch must be a positive integer")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, codec, rules, compression,
               backward_passes_per_step, op, gradient_predivide_factor, sync,
               momentum_correction, steps_per_epoch, seed, allow_dgc_adaptive)


__all__ = ["DistributedOptimizer", "Compression"]
