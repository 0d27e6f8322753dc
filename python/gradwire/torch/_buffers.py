"""The memory the native module reads and writes: contiguous CPU float32 tensors, passed as
``(address, element count)``. Callers keep the tensor referenced until the operation that
uses it has completed; these helpers make a float32 staging copy when a tensor is of another
dtype or not contiguous, and copy the result back."""

import torch


class Buffer:
    """A tensor's float32 memory: ``addr`` and ``numel``; ``finish()`` copies a staged
    result back into the original tensor."""

    __slots__ = ("tensor", "staged", "addr", "numel")

    def __init__(self, tensor, readonly=False):
        if tensor.device.type != "cpu":
            raise ValueError(
                f"gradwire reduces CPU tensors; this one is on {tensor.device} "
                "(move it with .cpu(), or see docs/guide/pytorch.md for GPUs)"
            )
        if tensor.dtype == torch.float32 and tensor.is_contiguous():
            self.staged = tensor
        elif tensor.is_floating_point():
            self.staged = tensor.detach().to(torch.float32).contiguous()
        else:
            raise TypeError(f"gradwire reduces floating-point tensors, not {tensor.dtype}")
        self.tensor = tensor
        self.addr = self.staged.data_ptr()
        self.numel = self.staged.numel()

    def finish(self):
        """Copies the result from the staging copy into the tensor (when staged)."""
        if self.staged is not self.tensor:
            with torch.no_grad():
                self.tensor.copy_(self.staged.view(self.tensor.shape))
        return self.tensor
