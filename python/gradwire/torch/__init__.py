"""gradwire for PyTorch, with Horovod's API: a Horovod script ports by changing its import.

.. code-block:: python

    import gradwire.torch as gw
    gw.init()
    gw.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = gw.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  codec="dgc:ratio=0.001", steps_per_epoch=len(loader))
    gw.broadcast_optimizer_state(opt, root_rank=0)
    loss.backward(); opt.step()

DDP scripts keep DDP and add a comm hook:
``ddp.register_comm_hook(None, gw.comm_hook(codec="powersgd:rank=2"))``.

CUDA tensors are reduced from device memory, never copied in Python: each gradient's copy to
pinned host memory is queued on the current stream after the kernels that produce it, and the
result's copy back on the stream current at ``synchronize``/``step``, so the host never waits
for the GPU. Codecs with a GPU twin (DGC, top-k, QSGD, TernGrad, 1-bit SGD, fp16) encode on
the GPU and only their payloads come to the host (:func:`device_copies` counts both).

Elastic training (ranks lost and admitted while training) follows Horovod Elastic:
``gw.elastic.run`` and ``gw.elastic.TorchState`` under ``gradwire launch --elastic MIN:MAX``
(see :mod:`gradwire.torch.elastic`).

Failures raise :class:`gradwire.GradwireError` with the engine's text: a dead rank is named
within the transport's deadline (``GRADWIRE_TIMEOUT``), a mismatched tensor is named.
"""

from .._gradwire import GradwireError
from . import elastic
from ._runtime import init, is_initialized, shutdown
from ._runtime import runtime as _rt
from .comm_hook import comm_hook
from .ops import (Average, Sum, allgather, allgather_async, allreduce, allreduce_,
                  allreduce_async, allreduce_async_, barrier, broadcast, broadcast_,
                  broadcast_async, broadcast_async_, broadcast_object, broadcast_optimizer_state,
                  broadcast_parameters, poll, synchronize)
from .optimizer import Compression, DistributedOptimizer
from .state import load_state_dict, state_dict
from .timeline import overlap_summary


def rank():
    """This process's rank."""
    return _rt().rank


def size():
    """Number of ranks."""
    return _rt().size


def local_rank():
    """This process's rank among the job's ranks on its host."""
    return _rt().local_rank


def local_size():
    """Ranks of the job on this host."""
    return _rt().local_size


def transport():
    """The transport joining the ranks: ``tcp``, ``shm``, ``mpi``, or ``local`` (one rank)."""
    return _rt().transport


def bytes_sent():
    """Bytes this rank has sent through the engine: ``{"raw_bytes", "wire_bytes",
    "negotiation_bytes", "other_bytes", "sent_bytes"}``."""
    return _rt().bytes()


def device_copies():
    """What went from the GPU to the host for CUDA tensors: ``{"staged", "staged_bytes"}``
    (tensors copied down whole, and their bytes), ``{"encoded", "encoded_bytes",
    "payload_bytes"}`` (tensors compressed on the GPU, their dense bytes, which stayed
    there, and the payloads' bytes, which came to the host)."""
    return _rt().device_copies()


def policies():
    """``{name: "codec@strategy"}`` of every tensor registered with the engine."""
    return dict(_rt().policies())


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "transport", "bytes_sent", "device_copies", "policies", "GradwireError", "Average", "Sum", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "allgather", "allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object",
    "broadcast_parameters", "broadcast_optimizer_state", "barrier", "poll", "synchronize",
    "DistributedOptimizer", "Compression", "comm_hook", "state_dict", "load_state_dict",
    "overlap_summary", "elastic",
]
