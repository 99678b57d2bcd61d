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

import functools
import os
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
from primus_turbo.pytorch.core.platform import cuda_capability, triton_interpret
from primus_turbo.pytorch.reference.grouped_gemm import (
    group_offsets,
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
        """CPU: TORCH. CUDA: TRITON, or with ``PRIMUS_TURBO_GROUPED_GEMM_FP8_DEFAULT=vendor``
        HIPBLASLT (``torch._scaled_grouped_mm``) where it can run."""
        if a.device.type != "cuda":
            return BackendType.TORCH
        if _fp8_default() == "vendor" and GroupedGemmFp8HipblasltBackend.can_handle(a=a, **kwargs):
            return BackendType.HIPBLASLT
        return BackendType.TRITON

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
        """The TMA fp8 kernel (``grouped_gemm_fp8_tma``; sm_90, env
        ``PRIMUS_TURBO_GROUPED_GEMM_FP8_TMA`` not ``0``) where usable, else the pointer kernels
        of ``grouped_gemm_triton``. ``group_offs=None``: the TMA kernel's ``f8s`` plans read
        the sizes (``LENS``), other paths get ``group_offsets(group_lens)``."""
        from primus_turbo.triton.grouped_gemm.grouped_gemm_fp8_tma import (
            fp8_tma_usable,
            grouped_gemm_fp8_tma,
        )
        from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import grouped_gemm_triton

        if fp8_tma_usable(a, b, out_dtype):
            return grouped_gemm_fp8_tma(a, b, group_offs, a_scale, b_scale, out_dtype,
                                        group_lens=group_lens)  # fmt: skip
        if group_offs is None:
            group_offs = group_offsets(group_lens)
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


@functools.cache
def _fp8_default() -> str:
    mode = os.environ.get("PRIMUS_TURBO_GROUPED_GEMM_FP8_DEFAULT", "triton").strip().lower()
    if mode not in ("triton", "vendor"):
        raise ValueError(
            "primus_turbo: PRIMUS_TURBO_GROUPED_GEMM_FP8_DEFAULT expected 'triton' or 'vendor', "
            f"got {mode!r}"
        )
    return mode


def _vendor_gemm_ok(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """What ``torch._scaled_grouped_mm`` (CUTLASS, sm_90) takes: E4M3 (OCP) operands, bf16
    output, K and N multiples of 16, unit inner strides."""
    return (
        a.dtype == torch.float8_e4m3fn
        and b.dtype == torch.float8_e4m3fn
        and out_dtype == torch.bfloat16
        and a.shape[1] % 16 == 0
        and b.shape[1] % 16 == 0
        and a.stride(1) == 1
        and b.stride(2) == 1
    )


@GroupedGemmFp8Dispatcher.register
class GroupedGemmFp8HipblasltBackend(KernelBackend):
    """The vendor FP8 grouped GEMM ``torch._scaled_grouped_mm`` (CUTLASS, CUDA sm_90) for the
    forward and dgrad: E4M3 operands with per-row x per-(expert, column) fp32 scales applied in
    its epilogue, one call on views (``b [G, N, K]`` passed as its ``[G, K, N]`` transpose, the
    column-major operand it wants), then the zero-fill of rows past the last group (see
    ``grouped_gemm_impl``). The wgrad (per-column scales over a variable K) and inputs it does
    not take (E5M2 gradients of ``Format.HYBRID``, K or N not a multiple of 16) run on TRITON.
    """

    backend_type = BackendType.HIPBLASLT
    autotune = False

    @staticmethod
    def can_handle(a, out_dtype=None, **kwargs) -> Verdict:
        if not hasattr(torch, "_scaled_grouped_mm"):
            return no(f"torch {torch.__version__} has no torch._scaled_grouped_mm")
        if a.device.type != "cuda" or torch.version.hip is not None:
            return no(f"torch._scaled_grouped_mm is used on CUDA devices only, got {a.device}")
        cap = cuda_capability(a.device)
        if cap is None or cap < (9, 0):
            return no(f"torch._scaled_grouped_mm needs CUDA capability >= 9.0, got {cap}")
        if out_dtype is not None and out_dtype != torch.bfloat16:
            return no(f"output dtype must be bf16, got {out_dtype}")
        return YES

    @staticmethod
    def execute(a, a_scale, b, b_scale, group_offs, group_lens, out_dtype) -> torch.Tensor:
        if not _vendor_gemm_ok(a, b, out_dtype) or a.shape[0] == 0 or b.shape[0] == 0:
            return GroupedGemmFp8TritonBackend.execute(
                a, a_scale, b, b_scale, group_offs, group_lens, out_dtype
            )
        from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_impl import _vendor_fixup

        if group_offs is None:
            group_offs = group_offsets(group_lens)
        ends = group_offs[1:].to(torch.int32)
        out = torch._scaled_grouped_mm(
            a, b.transpose(1, 2), a_scale.float().contiguous(), b_scale.float().contiguous(),
            offs=ends, out_dtype=torch.bfloat16, use_fast_accum=True,
        )  # fmt: skip
        return _vendor_fixup(out, ends, tail=True)

    @staticmethod
    def variable_k(x, x_scale, y, y_scale, group_offs, group_lens, out_dtype) -> torch.Tensor:
        return GroupedGemmFp8TritonBackend.variable_k(
            x, x_scale, y, y_scale, group_offs, group_lens, out_dtype
        )
