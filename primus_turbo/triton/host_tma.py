"""The CUDA context that host-side TMA descriptors need.

Triton 3.6 encodes a host descriptor (``triton.tools.tensor_descriptor.TensorDescriptor``,
``cuTensorMapEncodeTiled``) while it prepares a launch's arguments, before its launcher makes a
CUDA context current (``ensureCudaContext``). A thread that has made no CUDA runtime call yet has
no current context, and PyTorch runs backward passes on such threads (the autograd engine's
device threads): the first TMA-descriptor launch there fails with "Failed to create tensor map
descriptor: invalid device context". H200 call 10.6 hit it in the first backward of a benchmark
process, where the grouped GEMM's dgrad ran the TMA plan. Every launcher that builds host
descriptors calls :func:`ensure_context` first.
"""

from __future__ import annotations

import threading

import torch

_bound = threading.local()


def ensure_context(device: torch.device) -> None:
    """Make ``device``'s primary CUDA context current on the calling thread (once per thread and
    device: a stream query, a CUDA runtime call, binds it). No-op off CUDA."""
    if device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    done = getattr(_bound, "devices", None)
    if done is None:
        done = _bound.devices = set()
    if index in done:
        return
    with torch.cuda.device(index):
        torch.cuda.current_stream(index).query()
    done.add(index)
