"""FP8 grouped GEMM backends (TRITON, TORCH) and their dispatcher (family ``grouped_gemm``,
precision FP8, so ``set_grouped_gemm_backend(..., precision=PrecisionType.FP8)`` applies).

Operands arrive quantized with fp32 dequantisation scales:
* ``execute(a, a_scale, b, b_scale, group_offs, group_lens, out_dtype)``: ``a [M, K]`` fp8 with
  ``a_scale [M]`` (per row; a 0-stride expand for tensorwise), ``b [G, N, K]`` fp8 with
  ``b_scale [G, N]`` (per expert and output column); returns ``[M, N]``.
* ``variable_k(x, x_scale, y, y_scale, group_offs, group_lens, out_dtype)``: ``x [M, P]``,
  ``y [M, Q]`` fp8 with per-column scales ``[P]`` / ``[Q]``; returns ``[G, P, Q]``.
"""

from __future__ import annotations

from typing import Any

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
from primus_turbo.pytorch.core.platform import triton_interpret
from primus_turbo.pytorch.reference.grouped_gemm import (
    grouped_gemm_ref,
    grouped_gemm_variable_k_ref,
)


class GroupedGemmFp8Dispatcher(AutoKernelDispatcher):
    family = "grouped_gemm"
    memoize_resolution = True

    @classmethod
    def precision(cls, **kwargs: Any) -> PrecisionType:
        return PrecisionType.FP8

    @classmethod
    def default_backend(cls, a, **kwargs) -> BackendType:
        return BackendType.TRITON if a.device.type == "cuda" else BackendType.TORCH

    @classmethod
    def make_key(cls, a, b, out_dtype, **kwargs):
        return (*a.shape, *b.shape, a.dtype, b.dtype, out_dtype, a.device.type, "fp8")


@GroupedGemmFp8Dispatcher.register
class GroupedGemmFp8TritonBackend(KernelBackend):
    backend_type = BackendType.TRITON

    @staticmethod
    def can_handle(a, **kwargs) -> Verdict:
        if a.device.type != "cuda" and not triton_interpret():
            return no(f"needs a GPU tensor (or TRITON_INTERPRET=1 on CPU), got device {a.device}")
        return YES

    @staticmethod
    def execute(a, a_scale, b, b_scale, group_offs, group_lens, out_dtype) -> torch.Tensor:
        from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import grouped_gemm_triton

        return grouped_gemm_triton(a, b, group_offs, True, out_dtype, scales=(a_scale, b_scale))

    @staticmethod
    def variable_k(x, x_scale, y, y_scale, group_offs, group_lens, out_dtype) -> torch.Tensor:
        from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import variable_k_triton

        g = group_lens.shape[0]
        return variable_k_triton(x, y, group_offs, g, out_dtype, scales=(x_scale, y_scale))


@GroupedGemmFp8Dispatcher.register
class GroupedGemmFp8TorchBackend(KernelBackend):
    """Dequantize, then the fp32 reference loop (reads the group sizes on the host)."""

    backend_type = BackendType.TORCH
    autotune = False

    @staticmethod
    def can_handle(**kwargs) -> Verdict:
        return YES

    @staticmethod
    def execute(a, a_scale, b, b_scale, group_offs, group_lens, out_dtype) -> torch.Tensor:
        a32 = a.float() * a_scale.float().reshape(-1, 1)
        b32 = b.float() * b_scale.float()[:, :, None]
        return grouped_gemm_ref(a32, b32, group_lens.cpu(), True, out_dtype)

    @staticmethod
    def variable_k(x, x_scale, y, y_scale, group_offs, group_lens, out_dtype) -> torch.Tensor:
        x32 = x.float() * x_scale.float().reshape(1, -1)
        y32 = y.float() * y_scale.float().reshape(1, -1)
        return grouped_gemm_variable_k_ref(x32, y32, group_lens.cpu(), out_dtype)
