"""The engine's per-rank synchronization state (codec residuals, DGC's velocity and warm-up
position, momentum-correction velocities), saved and restored with the model:
``torch.save({"model": m.state_dict(), "gradwire": gw.state_dict()}, f)``."""

from . import _runtime


def state_dict():
    """This rank's engine state as ``bytes`` (each rank saves its own: residuals differ per
    rank). Call between steps."""
    return _runtime.runtime().save_state()


def load_state_dict(state):
    """Restores a :func:`state_dict` into the running engine (same tensors, codecs and world
    size; anything else raises ``GradwireError`` naming what differs)."""
    _runtime.runtime().load_state(bytes(state))


__all__ = ["state_dict", "load_state_dict"]
