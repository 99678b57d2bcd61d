"""Quantization backends (TRITON fused kernels, TORCH reference) and their dispatcher.

Every backend takes ``x`` (2-D), ``dtype`` (fp8), ``kind`` (``"tensor"``, ``"row"``, ``"block"``,
``"mx"``), ``block`` (int), ``axis`` (int or None; None = 2-D tiles for ``"block"``) and ``dual``
(also quantize ``x.T``), and returns ``(q, s)`` or ``(q, s, qt, st)`` in the conventions of
``primus_turbo.triton.quantization.quant_launch``.
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core.backend import (
    YES,
    AutoKernelDispatcher,
    BackendType,
    KernelBackend,
    PrecisionType,
    Verdict,
    no,
)
from primus_turbo.pytorch.core.low_precision import triton_fp8_support
from primus_turbo.pytorch.core.platform import triton_interpret
from primus_turbo.pytorch.reference import quantization as ref


class QuantizeDispatcher(AutoKernelDispatcher):
    family = "quantization"
    memoize_resolution = True

    @classmethod
    def precision(cls, **kwargs) -> PrecisionType:
        return PrecisionType.FP8

    @classmethod
    def default_backend(cls, x, **kwargs) -> BackendType:
        return BackendType.TRITON

    @classmethod
    def make_key(cls, x, dtype, kind, block, axis, dual, **kwargs):
        return (tuple(x.shape), x.dtype, dtype, kind, block, axis, dual, x.device.type)


@QuantizeDispatcher.register
class QuantizeTritonBackend(KernelBackend):
    backend_type = BackendType.TRITON

    @staticmethod
    def can_handle(x, dtype, kind, block, axis, dual, **kwargs) -> Verdict:
        if x.device.type != "cuda" and not triton_interpret():
            return no(f"needs a GPU tensor (or TRITON_INTERPRET=1), got device {x.device}")
        if kind in ("block", "mx") and block not in (32, 64, 128, 256):
            return no(f"block size must be 32/64/128/256, got {block}")
        ok, reason = triton_fp8_support(dtype, x.device)
        return YES if ok else no(reason)

    @staticmethod
    def execute(x, dtype, kind, block, axis, dual, **kwargs):
        from primus_turbo.triton.quantization import quant_launch as L

        if kind == "tensor":
            return L.quant_tensorwise(x, dtype, dual)
        if kind == "row":
            q, s = L.quant_rowwise(x, dtype, axis)
            if not dual:
                return q, s
            qt, st = L.quant_rowwise(x.t(), dtype, -1)
            return q, s, qt, st
        if kind == "block":
            return L.quant_blockwise(x, dtype, block, axis, dual)
        return L.quant_mx(x, dtype, dual, block)


@QuantizeDispatcher.register
class QuantizeTorchBackend(KernelBackend):
    backend_type = BackendType.TORCH
    autotune = False

    @staticmethod
    def can_handle(**kwargs) -> Verdict:
        return YES

    @staticmethod
    def execute(x, dtype, kind, block, axis, dual, **kwargs):
        def one(t, ax):
            if kind == "tensor":
                return ref.quantize_tensorwise_ref(t, dtype)
            if kind == "row":
                return ref.quantize_rowwise_ref(t, dtype, ax)
            if kind == "block":
                return ref.quantize_blockwise_ref(t, dtype, block, ax)
            return ref.quantize_mx_ref(t, dtype, block)

        q, s = one(x, axis)
        if not dual:
            return q, s
        axis_t = None if (kind == "block" and axis is None) else -1
        qt, st = one(x.t().contiguous(), axis_t)
        return q, s, qt, st


def quantize_impl(x: torch.Tensor, dtype, kind: str, block: int, axis, dual: bool = False):
    """Resolve and run the quantization backend (eager; see ops.quantization)."""
    kw = dict(x=x, dtype=dtype, kind=kind, block=block, axis=axis, dual=dual)
    return QuantizeDispatcher.execute(QuantizeDispatcher.resolve(**kw), **kw)
