"""The memory the native module reads and writes: contiguous float32 tensors, passed as
``(address, element count)``, on the CPU or on a CUDA device. Callers keep the tensor
referenced until the operation that uses it has completed; these helpers make a float32
staging copy (on the tensor's own device) when a tensor is of another dtype or not
contiguous, and copy the result back.

A CUDA tensor also carries its device index and the stream current when it was submitted
(``torch.cuda.current_stream().cuda_stream``): the native side queues its copy to pinned
host memory on that stream, after the kernels that produce it, and never copies it in
Python."""

import torch


class Buffer:
    """A tensor's float32 memory: ``addr`` and ``numel``; on a GPU also ``device`` (its
    index) and ``stream``; ``finish()`` copies a staged result back into the original
    tensor."""

    __slots__ = ("tensor", "staged", "addr", "numel", "device", "stream")

    def __init__(self, tensor, readonly=False):
        kind = tensor.device.type
        if kind not in ("cpu", "cuda"):
            raise ValueError(
                f"gradwire reduces CPU and CUDA tensors; this one is on {tensor.device}")
        if tensor.dtype == torch.float32 and tensor.is_contiguous():
            self.staged = tensor
        elif tensor.is_floating_point():
            self.staged = tensor.detach().to(torch.float32).contiguous()
        else:
            raise TypeError(f"gradwire reduces floating-point tensors, not {tensor.dtype}")
        self.tensor = tensor
        self.addr = self.staged.data_ptr()
        self.numel = self.staged.numel()
        if kind == "cuda":
            self.device = tensor.device.index if tensor.device.index is not None else \
                torch.cuda.current_device()
            self.stream = torch.cuda.current_stream(tensor.device).cuda_stream
        else:
            self.device = None
            self.stream = None

    @property
    def on_gpu(self):
        """Whether the memory is on a CUDA device."""
        return self.device is not None

    def finish(self):
        """Copies the result from the staging copy into the tensor (when staged)."""
        if self.staged is not self.tensor:
            with torch.no_grad():
                self.tensor.copy_(self.staged.view(self.tensor.shape))
        return self.tensor


def submit_allreduce(rt, name, buf, prescale):
    """Starts the native all-reduce of ``buf`` (host or device path)."""
    if buf.on_gpu:
        return rt.allreduce_device(name, buf.addr, buf.numel, buf.stream, buf.device,
                                   float(prescale))
    return rt.allreduce(name, buf.addr, buf.numel, float(prescale))


def wait_into(handle, buf, scale, stream=None):
    """Waits for ``handle`` and writes its result, times ``scale``, into ``buf``. On a GPU
    the copy is queued on ``stream`` (default: the current stream), so that work queued
    there afterwards sees the result, and the host does not wait for it."""
    if buf.on_gpu:
        if stream is None:
            stream = torch.cuda.current_stream(buf.staged.device)
        # The copy may run on another stream than the one the memory was made on.
        buf.staged.record_stream(stream)
        handle.wait_into_device(buf.addr, buf.numel, stream.cuda_stream, float(scale))
    else:
        handle.wait_into(buf.addr, buf.numel, float(scale))
