"""gradwire: communication-efficient distributed training.

The native engine, codecs and transports of the gradwire project, for Python. Most users want
:mod:`gradwire.torch` (Horovod's API and DDP comm hooks for PyTorch). This module holds what
needs no torch: the codecs, and the error every gradwire failure raises.
"""

from ._gradwire import GradwireError, MPI_BUILT, __version__
from ._gradwire import init_logging as _init_logging
from . import codec

_init_logging()

__all__ = ["GradwireError", "MPI_BUILT", "__version__", "codec"]
