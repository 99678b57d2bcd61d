"""Delayed tensorwise quantization backends (TRITON one-pass kernel, TORCH reference).

Every backend takes ``x`` (2-D), ``dtype`` (fp8), ``scale`` (fp32, 1 element: the multiplier),
``amax`` (fp32, 1 element, updated in place to ``max(amax, amax(x))``), ``dual`` (also write
``x.T`` quantized with the same scale), ``store`` (False: only record the amax) and ``guard``
(None, or the scaler's margin: re-cast with the recorded amax's scale where the given scale
saturated, see ``tw_delayed_guard_kernel``) and returns
``(q, scale_inv)`` / ``(q, scale_inv, q_t, scale_inv)`` (None when not ``store``); see
reference/fp8_delayed.py for the math.
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
from primus_turbo.pytorch.reference import fp8_delayed as ref


class QuantizeDelayedDispatcher(AutoKernelDispatcher):
    family = "quantization"  # shares PRIMUS_TURBO_QUANTIZATION_BACKEND with quantize_fp8
    memoize_resolution = True

    @classmethod
    def precision(cls, **kwargs) -> PrecisionType:
        return PrecisionType.FP8

    @classmethod
    def default_backend(cls, x, **kwargs) -> BackendType:
        return BackendType.TRITON

    @classmethod
    def make_key(cls, x, dtype, dual, store, **kwargs):
        return (tuple(x.shape), x.dtype, dtype, dual, store, x.device.type)


@QuantizeDelayedDispatcher.register
class QuantizeDelayedTritonBackend(KernelBackend):
    backend_type = BackendType.TRITON

    @staticmethod
    def can_handle(x, dtype, **kwargs) -> Verdict:
        if x.device.type != "cuda" and not triton_interpret():
            return no(f"needs a GPU tensor (or TRITON_INTERPRET=1), got device {x.device}")
        ok, reason = triton_fp8_support(dtype, x.device)
        return YES if ok else no(reason)

    @staticmethod
    def execute(x, dtype, scale, amax, dual, store, guard=None, **kwargs):
        from primus_turbo.triton.quantization.quant_tw_launch import quant_tensorwise_delayed

        return quant_tensorwise_delayed(x, dtype, scale, amax, dual, store, guard)


@QuantizeDelayedDispatcher.register
class QuantizeDelayedTorchBackend(KernelBackend):
    backend_type = BackendType.TORCH
    autotune = False

    @staticmethod
    def can_handle(**kwargs) -> Verdict:
        return YES

    @staticmethod
    def execute(x, dtype, scale, amax, dual, store, guard=None, **kwargs):
        q, sinv, a = ref.quantize_tensorwise_given_ref(x, dtype, scale)
        torch.maximum(amax.reshape(()), a, out=amax.reshape(()))
        if not store:
            return None
        if guard is not None:  # device ops only (no host sync): always re-cast here
            s = ref.guard_scale(amax.reshape(()), scale.reshape(()).float(), dtype, guard)
            q, sinv, _ = ref.quantize_tensorwise_given_ref(x, dtype, s)
        if not dual:
            return q, sinv
        return q, sinv, q.t().contiguous(), sinv


def quantize_delayed_impl(x: torch.Tensor, dtype, scale, amax, dual: bool = False,
                          store: bool = True, guard: int | None = None):  # fmt: skip
    """Resolve and run the delayed-quantization backend (eager; see ops.fp8_delayed)."""
    kw = dict(x=x, dtype=dtype, scale=scale, amax=amax, dual=dual, store=store)
    backend = QuantizeDelayedDispatcher.resolve(**kw)
    return QuantizeDelayedDispatcher.execute(backend, guard=guard, **kw)
