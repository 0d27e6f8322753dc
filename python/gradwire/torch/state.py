"""The engine's per-rank synchronization state (codec residuals, DGC's velocity and warm-up
position, momentum-correction velocities), saved and restored with the model:
``torch.save({"model": m.state_dict(), "gradwire": gw.state_dict()}, f)``."""

from . import _runtime


def state_dict():
    """This rank's engine state as ``bytes`` (each rank saves its own: residuals differ per
    rank). Call between steps."""
    return _runtime.runtime().save_state()


def load_state_dict(state):
    """Restores a :func:`state_dict` into the running engine (same tensors, codecs, seed and
    world size; anything else raises ``GradwireError`` naming what differs and changes
    nothing), and the step count of every ``DistributedOptimizer`` (so DGC's warm-up and the
    codecs' random streams go on where they were). Call it after creating the optimizer."""
    step, epoch = _runtime.runtime().load_state(bytes(state))
    for opt in list(_runtime.optimizers):
        opt._resume_at(step, epoch)


__all__ = ["state_dict", "load_state_dict"]
