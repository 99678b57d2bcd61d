"""The CUDA cast-transpose (``torch.ops.primus_turbo_cpp.quant_dual_fp8``,
csrc/kernels/quant_dual.cu) for the two dual quantization recipes of bf16 inputs on NVIDIA:
1x128 blockwise (fp32 scales) and MX (E8M0 per 32). Bitwise the Triton kernels
(tests/pytorch/ops/test_quantization_cuda.py).

``PRIMUS_TURBO_QUANT_CUDA``: ``1`` routes the two dual recipes here (the Triton launchers in
primus_turbo/triton/quantization/quant_launch.py call :func:`cuda_dual_on` first); unset / ``0``
keeps Triton. Inputs the kernel does not take fall back to Triton silently: not CUDA (ROCm keeps
Triton), not bf16, not contiguous 2-D, N % 8 != 0, not 16-byte aligned, MX with M or N not a
multiple of 32, fp8 types other than e4m3fn / e5m2, or an extension built without the kernel.
``PRIMUS_TURBO_QUANT_CUDA_OCC`` (2 default, 3, 4 or ``pipe``): blocks per SM the kernel's
registers are capped for (2: 128 registers, no spill; 3: 80, ~56 bytes spilled; 4: 64, ~200
bytes spilled); ``pipe``: persistent blocks (2 per SM, 128 registers) that load the next tile
with cp.async into a second shared-memory stage while the current one is processed.
"""

from __future__ import annotations

import functools
import os

import torch

_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _flag() -> bool:
    raw = os.environ.get("PRIMUS_TURBO_QUANT_CUDA", "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"primus_turbo: PRIMUS_TURBO_QUANT_CUDA expected 0 or 1, got {raw!r}")
    return raw == "1"


def _occ() -> int:
    raw = os.environ.get("PRIMUS_TURBO_QUANT_CUDA_OCC", "").strip().lower() or "2"
    if raw not in ("2", "3", "4", "pipe"):
        raise ValueError(
            f"primus_turbo: PRIMUS_TURBO_QUANT_CUDA_OCC expected 2, 3, 4 or pipe, got {raw!r}"
        )
    return 1 if raw == "pipe" else int(raw)


@functools.cache
def cuda_kernel_available() -> bool:
    """True when the loaded extension carries the CUDA cast-transpose (a CUDA build of _C)."""
    if torch.version.hip is not None or not torch.cuda.is_available():
        return False
    from primus_turbo.build_info import native_has_gpu, native_ops

    if not native_has_gpu():
        return False
    ops = native_ops()
    if not hasattr(ops, "quant_dual_fp8"):
        return False
    name = "primus_turbo_cpp::quant_dual_fp8"
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA")


def cuda_dual_on(x: torch.Tensor, dtype: torch.dtype, mx: bool) -> bool:
    """Whether the dual recipe (``mx``: MX, else 1x128) of ``x`` takes the CUDA kernel."""
    if not _flag():
        return False
    m, n = x.shape
    return (
        x.device.type == "cuda"
        and x.dtype == torch.bfloat16
        and dtype in _DTYPES
        and x.is_contiguous()
        and n % 8 == 0
        and x.data_ptr() % 16 == 0
        and (not mx or (m % 32 == 0 and n % 32 == 0))
        and cuda_kernel_available()
    )


def quant_dual_cuda(x: torch.Tensor, dtype: torch.dtype, mx: bool, fmax: float, emax: int):
    """``(q, s, qt, st)`` in the Triton launchers' layouts (see quant_dual_op.h)."""
    from primus_turbo.build_info import native_ops

    return tuple(native_ops().quant_dual_fp8(x, dtype, mx, float(fmax), int(emax), _occ()))
