"""The CUDA cast-transpose (``torch.ops.primus_turbo_cpp.quant_dual_fp8``,
csrc/kernels/quant_dual.cu) for the 1x128 dual quantization recipe (BLOCKWISE, block 128,
``quantize_fp8_with_trans``) of bf16 inputs on NVIDIA; bitwise the Triton kernel
(tests/pytorch/ops/test_quantization_cuda.py). Default (``PRIMUS_TURBO_QUANT_CUDA_B128`` unset
= ``t``): one 128x128 tile per 256-thread block, 3 blocks per SM; H200 call 9.1 / 9.2: 0.918 /
0.916 of copy (8192/6144/4096/28672 x 4096) vs 0.854 / 0.853 for the persistent kernel ``p`` (2
blocks per SM, the next tile's cp.async in flight; the default from call 7.4 to session 9) and
Triton v3 0.690.

The default on NVIDIA: ``quant_blockwise`` (primus_turbo/triton/quantization/quant_launch.py)
calls :func:`cuda_dual_on` first. ``PRIMUS_TURBO_QUANT_CUDA=0`` forces the Triton kernel
(unset / ``1``: this kernel where it applies). Everything else runs Triton silently: AMD (the
ROCm build compiles a stub and registers no GPU implementation), GPUs before sm_89, fp16/fp32,
non-contiguous, N % 8 != 0, not 16-byte aligned, fp8 types other than e4m3fn / e5m2, an
extension built without the kernel, and torch.compile tracing (Triton, same bits).

The MX dual recipe (``quant_mx(x, dtype, dual=True)``) has a CUDA cast-transpose too
(``torch.ops.primus_turbo_cpp.quant_dual_mx_fp8``, csrc/kernels/quant_dual_mx.cu), the default
on NVIDIA (``PRIMUS_TURBO_QUANT_CUDA_MX`` unset or ``1``; ``0`` = the Triton word kernel): one
128x128 tile per 256-thread block, 3 blocks per SM, its E8M0 scales stored outer-dim-major (the
Triton launcher's layout). H200 call 10.1: 0.903 of copy (4 shapes, each 0.895-0.910) vs 0.831-
0.833 for session 9's default (the same tile in 2x4 thread block clusters gathering row-major
scales) and 0.815-0.818 for the one-tile kernel with row-major scales: row-major E8M0 scales
cost 2 M N / 128 partial L2 write sectors. It takes bf16, contiguous, 16-byte aligned inputs with
both dims multiples of 32 on NVIDIA sm_89+; everything else (and torch.compile tracing) runs
Triton. The MX rows recipe (``dual=False``) always runs Triton (a CUDA rows kernel lost in call
8.2: 0.834 vs 0.875).
"""

from __future__ import annotations

import functools
import os

import torch

from primus_turbo.triton.quantization.quant_launch import _env_flag, _hw_satfinite

_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@functools.cache
def native_fp8_op_available(op: str, index: int = 0) -> bool:
    """True when the loaded extension registers ``primus_turbo_cpp::<op>`` for CUDA (a CUDA
    build of _C) and device ``index`` is NVIDIA sm_89+ (the fp8 conversions every CUDA
    quantization kernel uses)."""
    if torch.version.hip is not None or not torch.cuda.is_available():
        return False
    from primus_turbo.build_info import native_has_gpu, native_ops

    if not native_has_gpu() or not hasattr(native_ops(), op):
        return False
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"primus_turbo_cpp::{op}", "CUDA"):
        return False
    return _hw_satfinite(index)


def cuda_kernel_available(index: int = 0) -> bool:
    """The 1x128 CUDA cast-transpose (``quant_dual_fp8``) on device ``index``."""
    return native_fp8_op_available("quant_dual_fp8", index)


def cuda_dual_on(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the 1x128 dual recipe of ``x`` (2-D) takes the CUDA kernel."""
    if torch.compiler.is_compiling() or not _env_flag("PRIMUS_TURBO_QUANT_CUDA", True):
        return False
    n = x.shape[1]
    return (
        x.device.type == "cuda"
        and x.dtype == torch.bfloat16
        and dtype in _DTYPES
        and x.is_contiguous()
        and n % 8 == 0
        and x.data_ptr() % 16 == 0
        and cuda_kernel_available(x.device.index or 0)
    )


# PRIMUS_TURBO_QUANT_CUDA_B128: the 1x128 dual CUDA kernel's variant (same bits). Unset / ``t``
# (1, the default since session 9 round 2): one 128x128 tile per 256-thread block, 3 blocks per SM,
# 8 warp tiles of 32x64 (quant_dual_mx.cu's a structure), H200 call 9.1 / 9.2: 0.918 / 0.916 of
# copy (4 shapes, each >= 0.90); ``p`` (0): the persistent cp.async kernel (the default until then,
# 0.854 / 0.853 in the same A/Bs), kept for A/B and as the fallback below. ``t4`` (``t`` at 4 blocks
# per SM, 0.918 in call 9.2: a tie) was removed and is refused like any other value. t indexes rows
# and columns in 32 bits: inputs with a dim >= 2**31 - 256 take ``p`` (any size).
_B128_VARIANTS = {"p": 0, "t": 1}
_B128_INDEX_LIMIT = 2**31 - 256  # 0x7fffff00: the t launch refuses M or N above it


def cuda_b128_variant() -> int:
    """``PRIMUS_TURBO_QUANT_CUDA_B128``: 1 (unset / ``t``) or 0 (``p``)."""
    raw = os.environ.get("PRIMUS_TURBO_QUANT_CUDA_B128", "").strip().lower() or "t"
    if raw not in _B128_VARIANTS:
        raise ValueError(
            "primus_turbo: PRIMUS_TURBO_QUANT_CUDA_B128 expected p or t (or unset = t), "
            f"got {raw!r}"
        )
    return _B128_VARIANTS[raw]


def quant_dual_cuda(x: torch.Tensor, dtype: torch.dtype, fmax: float):
    """``(q, s, qt, st)`` in the Triton launcher's layouts (see quant_dual_op.h)."""
    from primus_turbo.build_info import native_ops

    variant = cuda_b128_variant()
    if variant and max(x.shape) < _B128_INDEX_LIMIT:  # t: 32-bit row and column indices
        return tuple(native_ops().quant_dual_fp8(x, dtype, float(fmax), variant))
    return tuple(native_ops().quant_dual_fp8(x, dtype, float(fmax)))  # p: any size, same bits


def cuda_mx_on() -> bool:
    """``PRIMUS_TURBO_QUANT_CUDA_MX``: unset / ``1`` = the CUDA MX dual kernel, ``0`` = Triton.
    The session-9 variants ``a`` / ``f`` (row-major scales) were removed and are refused."""
    raw = os.environ.get("PRIMUS_TURBO_QUANT_CUDA_MX", "").strip().lower() or "1"
    if raw not in ("0", "1"):
        raise ValueError(f"primus_turbo: PRIMUS_TURBO_QUANT_CUDA_MX expected 0 or 1, got {raw!r}")
    return raw == "1"


def cuda_mx_kernel_available(index: int = 0) -> bool:
    """The CUDA MX cast-transpose (``quant_dual_mx_fp8``) on device ``index``."""
    return native_fp8_op_available("quant_dual_mx_fp8", index)


def cuda_mx_dual_on(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the MX dual recipe of ``x`` (2-D) takes the CUDA kernel."""
    if torch.compiler.is_compiling() or not cuda_mx_on():
        return False
    m, n = x.shape
    return (
        x.device.type == "cuda"
        and torch.version.hip is None
        and x.dtype == torch.bfloat16
        and dtype in _DTYPES
        and x.is_contiguous()
        and m % 32 == 0
        and n % 32 == 0
        and max(m, n) < 2**31 - 256  # the kernel's 32-bit row / column indices
        and x.data_ptr() % 16 == 0
        and cuda_mx_kernel_available(x.device.index or 0)
    )


def quant_dual_mx_cuda(x: torch.Tensor, dtype: torch.dtype):
    """``(q, s, qt, st)`` in the Triton launcher's layouts (see quant_dual_mx_op.h)."""
    from primus_turbo.build_info import native_ops

    return tuple(native_ops().quant_dual_mx_fp8(x, dtype))
