"""Dense GEMM backends (TORCH, HIPBLASLT, TRITON), their dispatcher and the custom op.

Every backend takes the same keywords: ``a, b, trans_a, trans_b, out_dtype`` and returns the
``[M, N]`` product ``op(a) @ op(b)``.
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
from primus_turbo.pytorch.reference.gemm import gemm_ref

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def gemm_dims(a: torch.Tensor, b: torch.Tensor, trans_a: bool, trans_b: bool):
    """``(M, N, K)`` of ``op(a) @ op(b)``."""
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    n = b.shape[0] if trans_b else b.shape[1]
    return m, n, k


class GemmDispatcher(AutoKernelDispatcher):
    family = "gemm"
    memoize_resolution = True  # make_key covers shape, dtypes, layout and device

    @classmethod
    def precision(cls, a: torch.Tensor, **kwargs: Any) -> PrecisionType:
        return PrecisionType.BF16_FP16_FP32

    @classmethod
    def default_backend(cls, a, b, trans_a, trans_b, out_dtype, **kwargs) -> BackendType:
        if a.device.type != "cuda":
            return BackendType.TORCH
        if out_dtype != a.dtype:
            return BackendType.TRITON  # BLAS-Lt through torch.matmul keeps the input dtype
        return BackendType.HIPBLASLT

    @classmethod
    def make_key(cls, a, b, trans_a, trans_b, out_dtype, **kwargs):
        m, n, k = gemm_dims(a, b, trans_a, trans_b)
        return (m, n, k, a.dtype, b.dtype, out_dtype, trans_a, trans_b, a.device.type)

    @classmethod
    def describe(cls, a, b, trans_a, trans_b, out_dtype, **kwargs) -> str:
        m, n, k = gemm_dims(a, b, trans_a, trans_b)
        return (
            f"M={m} N={n} K={k} a:{a.dtype} b:{b.dtype} out:{out_dtype} "
            f"trans_a={trans_a} trans_b={trans_b} device={a.device}"
        )


@GemmDispatcher.register
class GemmHipblasltBackend(KernelBackend):
    """Vendor BLAS-Lt (hipBLASLt on ROCm, cuBLASLt on CUDA) through ``torch.matmul``.

    ``torch.matmul``'s own backward runs the same BLAS-Lt GEMMs (dgrad/wgrad) that our autograd
    function would, so this backend is marked differentiable.
    """

    backend_type = BackendType.HIPBLASLT
    differentiable = True

    @staticmethod
    def can_handle(a, b, trans_a, trans_b, out_dtype, **kwargs) -> Verdict:
        if a.device.type != "cuda":
            return no(f"needs a GPU tensor, got device {a.device}")
        if a.dtype not in FLOAT_DTYPES or b.dtype != a.dtype:
            return no(f"needs a and b of one dtype in fp16/bf16/fp32, got {a.dtype}/{b.dtype}")
        if out_dtype != a.dtype:
            return no(f"output dtype must equal the input dtype {a.dtype}, got {out_dtype}")
        return YES

    @staticmethod
    def execute(a, b, trans_a, trans_b, out_dtype, **kwargs) -> torch.Tensor:
        return torch.matmul(a.t() if trans_a else a, b.t() if trans_b else b)


@GemmDispatcher.register
class GemmTritonBackend(KernelBackend):
    """Our persistent tiled Triton GEMM (fp32 accumulation, any strides)."""

    backend_type = BackendType.TRITON

    @staticmethod
    def can_handle(a, b, trans_a, trans_b, out_dtype, **kwargs) -> Verdict:
        if a.device.type != "cuda" and not triton_interpret():
            return no(f"needs a GPU tensor (or TRITON_INTERPRET=1 on CPU), got device {a.device}")
        if a.dtype not in (torch.float16, torch.bfloat16) or b.dtype != a.dtype:
            return no(f"needs a and b of one dtype in fp16/bf16, got {a.dtype}/{b.dtype}")
        if out_dtype not in FLOAT_DTYPES:
            return no(f"output dtype must be fp16/bf16/fp32, got {out_dtype}")
        return YES

    @staticmethod
    def execute(a, b, trans_a, trans_b, out_dtype, **kwargs) -> torch.Tensor:
        from primus_turbo.triton.gemm.gemm_kernel import gemm_triton

        return gemm_triton(a, b, trans_a, trans_b, out_dtype)


@GemmDispatcher.register
class GemmTorchBackend(KernelBackend):
    """The pure-torch reference (fp32 accumulation); runs anywhere."""

    backend_type = BackendType.TORCH
    autotune = False  # a reference, never the fastest on purpose

    @staticmethod
    def can_handle(a, b, trans_a, trans_b, out_dtype, **kwargs) -> Verdict:
        return YES

    @staticmethod
    def execute(a, b, trans_a, trans_b, out_dtype, **kwargs) -> torch.Tensor:
        acc = torch.float64 if a.dtype == torch.float64 else torch.float32
        return gemm_ref(a, b, trans_a, trans_b, out_dtype, acc_dtype=acc)


@torch.library.custom_op("primus_turbo::gemm_impl", mutates_args=())
def _gemm_impl_op(
    a: torch.Tensor,
    b: torch.Tensor,
    trans_a: bool,
    trans_b: bool,
    out_dtype: torch.dtype,
    backend: int,
) -> torch.Tensor:
    return GemmDispatcher.execute(
        BackendType(backend), a=a, b=b, trans_a=trans_a, trans_b=trans_b, out_dtype=out_dtype
    )


@_gemm_impl_op.register_fake
def _gemm_impl_fake(a, b, trans_a, trans_b, out_dtype, backend):
    m, n, _ = gemm_dims(a, b, trans_a, trans_b)
    return a.new_empty((m, n), dtype=out_dtype)


def gemm_impl(
    a: torch.Tensor,
    b: torch.Tensor,
    trans_a: bool,
    trans_b: bool,
    out_dtype: torch.dtype,
    backend: BackendType,
) -> torch.Tensor:
    """Run one resolved backend. Under torch.compile this is the opaque custom op
    ``primus_turbo::gemm_impl``; in eager mode the backend is called directly, which skips the
    custom-op dispatch cost (a few microseconds) with the same result."""
    if torch.compiler.is_compiling():
        return _gemm_impl_op(a, b, trans_a, trans_b, out_dtype, backend.value)
    return GemmDispatcher.execute(
        backend, a=a, b=b, trans_a=trans_a, trans_b=trans_b, out_dtype=out_dtype
    )
