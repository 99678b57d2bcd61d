"""The CUDA one-launch "hold" kernel (``torch.ops.primus_turbo_cpp.quant_tw_hold_fp8``,
csrc/kernels/quant_tw_hold.cu) for dynamic tensorwise FP8 quantization (``quantize_fp8(x, dtype,
TENSORWISE)``, one output) of bf16 inputs on NVIDIA sm_90+; bitwise the Triton kernels
(tests/pytorch/ops/test_quantization_tw_hold.py).

Why: the scale needs the whole tensor's amax before the first cast, so the Triton path reads x
twice (amax launch, then cast launch; H200: 0.626 of copy, the two-read bound 0.600). The hold
kernel runs one cooperative grid of exactly the co-resident blocks (one per SM); each block loads
its contiguous range into 224 KB of shared memory (bulk copies) and 112-128 KB of registers,
streams the rest (inputs above ~45 MB on an H200) for the amax only, newest last with L2
evict_last; a grid barrier; every block reduces the partial maxima; then the block re-reads the
streamed rest newest-first (mostly L2 hits) and casts everything it holds without reading x again.

``PRIMUS_TURBO_QUANT_CUDA_TW`` (read per call; default ``0`` until measured: the Triton kernels):
``hold`` = 512 threads x 16 held vectors (128 registers), 8 remainder loads in flight per thread,
L2 hints and ``.cs`` stores (flags 3); ``hold1k`` = 1024 threads x 8 vectors, 1 in flight;
``hold1k7`` = 1024 x 7, 2 in flight; ``holdn`` = ``hold`` without the L2 evict hints (flags 2);
``holdw`` = ``hold`` with plain (not ``.cs``) stores (flags 1). All give the same bits.
``PRIMUS_TURBO_QUANT_CUDA_TW_MIN`` (default 1048576): smaller inputs keep Triton.
The dual recipe (``quantize_fp8_with_trans``: q and q^T with one scale) has its own knob,
``PRIMUS_TURBO_QUANT_CUDA_TW_DUAL`` (default ``0`` = Triton; ``hold`` / ``holdn`` / ``holdw`` =
flags 3 / 2 / 1 as above, ``hold12`` = 12 register tiles and 8 streamed tiles in flight instead of
16 and 4): csrc/kernels/quant_tw_hold_dual.cu, 64 x 64 tiles (26 held in shared memory, 16 in
registers per 512-thread block, the rest streamed), the transposed copy through
XOR-swizzled shared memory; M and N multiples of 64 (else Triton). Everything else runs Triton
silently too: AMD, GPUs before sm_90, fp16/fp32, non-contiguous or not 16-byte aligned inputs, fp8
types other than e4m3fn / e5m2, an extension built without the kernel, a device where the grid
cannot be co-resident (the occupancy query says 0), and torch.compile tracing (the same bits).
"""

from __future__ import annotations

import functools
import os

import torch

from primus_turbo.triton.quantization.quant_launch import _env_int, _fmax

_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_OP = "quant_tw_hold_fp8"
# name -> (kernel variant of quant_tw_hold.h, flags: 1 = L2 evict_last on the streamed
# remainder's amax loads and evict_first on its re-read, 2 = streaming .cs stores of q)
TW_VARIANTS = {
    "hold": (0, 3),
    "hold1k": (1, 3),
    "hold1k7": (2, 3),
    "holdn": (0, 2),
    "holdw": (0, 1),
}
# dual: name -> (dual kernel variant: 0 = 16 register tiles and 4 streamed tiles in flight, 1 = 12
# and 8; flags as above)
TW_DUAL_VARIANTS = {"hold": (0, 3), "hold12": (1, 3), "holdn": (0, 2), "holdw": (0, 1)}
DUAL_BLOCKS_ID = 3  # quant_tw_hold_blocks's id of dual variant 0 (kQuantTwHoldDualVariant)
MIN_NUMEL = 1 << 20
_MAX_VEC_PER_BLOCK = 2**31 - 4096  # the kernel's 32-bit per-block vector counts (the op refuses)


def cuda_tw_variant() -> tuple[int, int] | None:
    """``PRIMUS_TURBO_QUANT_CUDA_TW``: None (unset / ``0``: Triton) or ``(variant, flags)``."""
    raw = os.environ.get("PRIMUS_TURBO_QUANT_CUDA_TW", "").strip().lower() or "0"
    if raw == "0":
        return None
    if raw not in TW_VARIANTS:
        raise ValueError(
            "primus_turbo: PRIMUS_TURBO_QUANT_CUDA_TW expected 0 or one of "
            f"{tuple(TW_VARIANTS)}, got {raw!r}"
        )
    return TW_VARIANTS[raw]


def cuda_tw_dual_variant() -> tuple[int, int] | None:
    """``PRIMUS_TURBO_QUANT_CUDA_TW_DUAL``: None (unset / ``0``: Triton) or ``(variant, flags)``."""
    raw = os.environ.get("PRIMUS_TURBO_QUANT_CUDA_TW_DUAL", "").strip().lower() or "0"
    if raw == "0":
        return None
    if raw not in TW_DUAL_VARIANTS:
        raise ValueError(
            "primus_turbo: PRIMUS_TURBO_QUANT_CUDA_TW_DUAL expected 0 or one of "
            f"{tuple(TW_DUAL_VARIANTS)}, got {raw!r}"
        )
    return TW_DUAL_VARIANTS[raw]


@functools.cache
def tw_kernel_available(index: int = 0) -> bool:
    """True when the loaded extension carries the hold kernel (a CUDA build of _C) and device
    ``index`` is NVIDIA sm_90+ (bulk copies, cooperative launch)."""
    if torch.version.hip is not None or not torch.cuda.is_available():
        return False
    from primus_turbo.build_info import native_has_gpu, native_ops

    if not native_has_gpu() or not hasattr(native_ops(), _OP):
        return False
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"primus_turbo_cpp::{_OP}", "CUDA"):
        return False
    return torch.cuda.get_device_capability(index) >= (9, 0)


@functools.cache
def resident_blocks(index: int, variant: int, dtype: torch.dtype) -> int:
    """The cooperative grid of ``variant`` on device ``index`` (0: it cannot be co-resident)."""
    from primus_turbo.build_info import native_ops

    probe = torch.empty(0, dtype=torch.bfloat16, device=torch.device("cuda", index))
    return int(native_ops().quant_tw_hold_blocks(probe, dtype, variant))


def cuda_tw_on(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the tensorwise recipe (one output) of ``x`` takes the hold kernel."""
    if torch.compiler.is_compiling():
        return False
    v = cuda_tw_variant()
    if v is None:
        return False
    if not (
        x.device.type == "cuda"
        and torch.version.hip is None
        and x.dtype == torch.bfloat16
        and dtype in _DTYPES
        and x.is_contiguous()
        and x.data_ptr() % 16 == 0
        and x.numel() >= _env_int("PRIMUS_TURBO_QUANT_CUDA_TW_MIN", MIN_NUMEL)
    ):
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if not tw_kernel_available(index):
        return False
    blocks = resident_blocks(index, v[0], dtype)
    return blocks > 0 and x.numel() // 8 // blocks < _MAX_VEC_PER_BLOCK


def cuda_tw_dual_on(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the dual tensorwise recipe of ``x`` (2-D) takes the dual hold kernel."""
    if torch.compiler.is_compiling():
        return False
    v = cuda_tw_dual_variant()
    if v is None:
        return False
    if not (
        x.device.type == "cuda"
        and torch.version.hip is None
        and x.dtype == torch.bfloat16
        and dtype in _DTYPES
        and x.dim() == 2
        and x.is_contiguous()
        and x.shape[0] % 64 == 0
        and x.shape[1] % 64 == 0
        and x.data_ptr() % 16 == 0
        and x.numel() >= _env_int("PRIMUS_TURBO_QUANT_CUDA_TW_MIN", MIN_NUMEL)
    ):
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if not tw_kernel_available(index) or not hasattr(_ops(), "quant_tw_hold_dual_fp8"):
        return False
    blocks = resident_blocks(index, DUAL_BLOCKS_ID + v[0], dtype)
    return blocks > 0 and x.numel() // 4096 // blocks < _MAX_VEC_PER_BLOCK


def quant_tw_dual_cuda(x: torch.Tensor, dtype: torch.dtype):
    """``(q, s, qt, s)`` as the Triton launcher (qt = x.T quantized, contiguous [N, M])."""
    variant, flags = cuda_tw_dual_variant()
    q, s, qt = _ops().quant_tw_hold_dual_fp8(x, dtype, _fmax(dtype), variant, flags)
    return q, s, qt, s


def _ops():
    from primus_turbo.build_info import native_ops

    return native_ops()


def quant_tw_cuda(x: torch.Tensor, dtype: torch.dtype):
    """``(q, s)`` as the Triton launcher: q in x's shape, s a 0-d fp32 scale_inv."""
    from primus_turbo.build_info import native_ops

    variant, flags = cuda_tw_variant()
    q, s = native_ops().quant_tw_hold_fp8(x, dtype, _fmax(dtype), variant, flags)
    return q, s
