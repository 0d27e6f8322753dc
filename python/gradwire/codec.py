"""gradwire's gradient codecs, used directly: parse a spec, encode a gradient the way one
rank's codec does, decode a payload. Specs are the CLI's (``gradwire train --codec``), e.g.
``dgc:ratio=0.001``, ``qsgd:bits=4``, ``powersgd:rank=2``; :func:`examples` lists one per
codec and notable option."""

import ctypes
import struct

from . import _gradwire

__all__ = ["examples", "normalize", "encode", "decode"]


def examples():
    """The reference set of codec specs (one per codec and notable option)."""
    return list(_gradwire.codec_examples())


def normalize(spec):
    """``spec`` with every parameter written out (its paper's defaults filled in). Raises
    ``ValueError`` for a spec gradwire does not accept."""
    return _gradwire.codec_normalize(spec)


def _as_bytes(values):
    if isinstance(values, (bytes, bytearray, memoryview)):
        return bytes(values)
    tobytes = getattr(values, "tobytes", None)
    if tobytes is not None and getattr(values, "dtype", None) is not None:
        if str(values.dtype) not in ("float32", "torch.float32"):
            raise TypeError(f"expected float32 values, got {values.dtype}")
        return tobytes()
    if hasattr(values, "data_ptr") and hasattr(values, "numel"):  # a torch tensor
        if str(values.dtype) != "torch.float32":
            raise TypeError(f"expected float32 values, got {values.dtype}")
        # Read the tensor's memory directly: torch's .numpy() needs NumPy installed.
        t = values.detach().cpu().contiguous()
        return ctypes.string_at(t.data_ptr(), t.numel() * 4)
    return struct.pack(f"<{len(values)}f", *values)


def encode(spec, grad, shape=None, steps=1, seed=0, rank=0, world=1, epochs_per_step=0.0):
    """Encodes ``grad`` (float32: bytes, a NumPy array, a torch tensor or a list) of ``shape``
    (default: 1-D) with codec ``spec`` built for ``rank`` of ``world`` with ``seed``,
    ``steps`` times in a row (stateful codecs carry residuals and momentum from one step to
    the next; step ``s`` is at epoch ``s * epochs_per_step``). Returns the payloads, one per
    step."""
    raw = _as_bytes(grad)
    if shape is None:
        shape = [len(raw) // 4]
    return _gradwire.codec_encode(
        spec, raw, list(shape), steps, seed, rank, world, float(epochs_per_step)
    )


def decode(spec, payload, shape):
    """Decodes ``payload`` (a gradient of ``shape``) and returns its values as a list of
    floats."""
    raw = _gradwire.codec_decode(spec, bytes(payload), list(shape))
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))
