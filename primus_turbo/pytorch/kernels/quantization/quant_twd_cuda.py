"""The CUDA delayed-scaling tensorwise cast (``torch.ops.primus_turbo_cpp.quant_tw_delayed_fp8``,
csrc/kernels/quant_tw_delayed.cu) for ``quant_tensorwise_delayed`` (ops.fp8_delayed,
Float8Linear, gemm_fp8's DELAYED strategy) of bf16 inputs on NVIDIA: bitwise the Triton
``tw_delayed_kernel`` (q, q^T, 1 / scale, the amax folded into the slot), one read of x. Dual:
the tile structure of the 1x128 cast-transpose's variant t (one 128x128 tile per 256-thread
block, 4 blocks per SM, each value converted once and byte-transposed in registers); plain: a
flat kernel (16-byte loads, 8-byte stores, 16384 values per block). One atomicMax per block.

``PRIMUS_TURBO_QUANT_CUDA_TWD``: unset / ``1`` = this kernel (the default: H200 call 10.1, graph
timing, geomean of 8192/6144/4096/28672 x 4096, plain 0.913 of copy vs Triton 0.865, dual 0.910
vs 0.861; streaming ``.cs`` stores tied / lost, removed); ``0`` = the Triton kernel (off switch).
The hook in ``quant_tw_launch.quant_tensorwise_delayed`` replaces only the cast launch:
``store=False`` (amax only) takes it too, zero-size inputs stay on the launcher's early return,
and the saturation ``guard`` kernel (Triton) still follows it on the same tensors (it re-reads
the recorded amax and re-casts everything when it fires, so the bits equal the all-Triton path).
Everything else runs Triton silently: the knob at 0, AMD, GPUs before sm_89, CPU tensors,
non-bf16 inputs, fp8 types other than e4m3fn / e5m2, a scale or amax that is not a 1-element
fp32 tensor on x's device, x not 16-byte aligned, dual with N % 8 != 0 or a dim >= 2**31 - 256
(32-bit rows and columns), plain with M * N % 8 != 0, an extension built without the op,
``TRITON_INTERPRET=1`` (the interpreter runs the Triton kernel) and torch.compile tracing
(compiled graphs keep the Triton kernel).
"""

from __future__ import annotations

import os

import torch

from primus_turbo.pytorch.core.platform import triton_interpret

_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_VARIANTS = {"0": 0, "1": 1}
_INDEX_LIMIT = 2**31 - 256  # dual: 32-bit rows / columns (the launch refuses above)


def cuda_twd_variant() -> int:
    """``PRIMUS_TURBO_QUANT_CUDA_TWD``: 1 (unset: the CUDA kernel) or 0 (Triton)."""
    raw = os.environ.get("PRIMUS_TURBO_QUANT_CUDA_TWD", "").strip().lower() or "1"
    if raw not in _VARIANTS:
        raise ValueError(f"primus_turbo: PRIMUS_TURBO_QUANT_CUDA_TWD expected 0 or 1, got {raw!r}")
    return _VARIANTS[raw]


def cuda_twd_available(index: int = 0) -> bool:
    """True when the loaded extension carries the CUDA delayed cast (a CUDA build of _C) and
    device ``index`` is NVIDIA sm_89+ (fp8 conversions)."""
    from primus_turbo.pytorch.kernels.quantization.quant_cuda import native_fp8_op_available

    return native_fp8_op_available("quant_tw_delayed_fp8", index)


def _scalar_ok(t: torch.Tensor, x: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.numel() == 1 and t.device == x.device


def cuda_twd_on(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor, amax: torch.Tensor,
                dual: bool) -> int:  # fmt: skip
    """The variant (1) that casts ``x`` (2-D, contiguous, non-empty), or 0 (Triton)."""
    if torch.compiler.is_compiling():
        return 0
    variant = cuda_twd_variant()
    if variant == 0 or triton_interpret():
        return 0
    m, n = x.shape
    fits = (n % 8 == 0 and max(m, n) < _INDEX_LIMIT) if dual else (m * n) % 8 == 0
    ok = (
        fits
        and x.device.type == "cuda"
        and x.dtype == torch.bfloat16
        and dtype in _DTYPES
        and x.is_contiguous()
        and x.data_ptr() % 16 == 0
        and _scalar_ok(scale, x)
        and _scalar_ok(amax, x)
        and cuda_twd_available(x.device.index or 0)
    )
    return variant if ok else 0


def quant_twd_cuda(x, dtype, q, qt, scale, sinv, amax, dual: bool, store: bool) -> bool:
    """Run the CUDA cast into the launcher's tensors (``q`` / ``qt`` / ``sinv`` None when not
    ``store``; ``qt`` None unless dual) and return True, or return False (the caller launches
    Triton)."""
    variant = cuda_twd_on(x, dtype, scale, amax, dual)
    if not variant:
        return False
    from primus_turbo.build_info import native_ops

    native_ops().quant_tw_delayed_fp8(
        x, scale, amax, q if store else None, qt if store and dual else None,
        sinv if store else None, dual, variant,
    )  # fmt: skip
    return True
