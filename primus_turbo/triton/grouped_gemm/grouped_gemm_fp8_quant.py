"""Rowwise fp8 quantization of the rows of a chunk of groups (the pipelined FP8 grouped forward).

``quant_rows_window_kernel`` quantizes rows ``[offs[0], offs[G])`` of ``x [M, K]`` into the
caller's ``q [M, K]`` / ``s [M]`` (one scale per row along K): the row window is read from the
group offsets on the device, so the pipelined forward (``kernels/grouped_gemm/
grouped_gemm_fp8_pipe.py``) quantizes the activation rows of each chunk of experts right before
that chunk's GEMM instead of all of ``a`` before the first one, without the host reading the
group sizes. The math is ``quantize_fp8(..., ROWWISE, axis=-1)``'s (the same
``quant_kernel`` helpers: scale ``FMAX / max(amax, 1e-12)`` with the finite amax, clamp with
NaN kept, ``1 / scale`` stored), so each row's bits equal the whole-tensor quantization's.
Persistent grid-stride walk over the window's row blocks; the whole row in registers
(``K <= 16384``). Rows outside the window are not touched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from primus_turbo.triton.quantization.quant_kernel import _cast, _finite_abs, _scale_of

ROW_IN_REGS = 16384  # the longest row held in registers (the launcher's callers check it)


@triton.jit
def quant_rows_window_kernel(
    x_ptr, q_ptr, s_ptr, offs_ptr, M, K, G, stride_xm, stride_qm, num_programs,
    BM: tl.constexpr, BK: tl.constexpr, FMAX: tl.constexpr, FMT: tl.constexpr,
):  # fmt: skip
    """Rows ``[offs[0], offs[G])`` (clamped to ``[0, M]``) of ``x`` -> ``q`` (fp8) and
    ``s`` (fp32 ``1 / scale`` per row); ``FMT`` as in ``quant_kernel._cast`` (interpreter)."""
    pid = tl.program_id(0)
    lo = tl.minimum(tl.maximum(tl.load(offs_ptr), 0), M).to(tl.int32)
    hi = tl.minimum(tl.maximum(tl.load(offs_ptr + G), lo), M).to(tl.int32)
    cols = tl.arange(0, BK)
    mask_k = cols < K
    for r0 in range(lo + pid * BM, hi, num_programs * BM):
        rows = r0 + tl.arange(0, BM)
        mask_m = rows < hi
        rows64 = rows.to(tl.int64)
        mask = mask_m[:, None] & mask_k[None, :]
        x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)  # fmt: skip
        amax = tl.max(_finite_abs(x), axis=1)
        scale, sinv = _scale_of(amax, FMAX, False, 0)
        q = _cast(x, scale[:, None], FMAX, q_ptr.dtype.element_ty, FMT)
        tl.store(s_ptr + rows64, sinv, mask=mask_m)
        tl.store(q_ptr + rows64[:, None] * stride_qm + cols[None, :], q, mask=mask)


def _tile(k: int) -> tuple[int, int, int]:
    """``(BM, BK, num_warps)``: the one-pass tile of ``quant_launch.quant_rowwise``."""
    bk = max(16, triton.next_power_of_2(k))
    bm = max(1, min(64, 8192 // bk))
    return bm, bk, 16 if bm * bk > 8192 else 8


def quant_rows_window(x, q, s, offs, programs: int | None = None) -> None:
    """Quantize rows ``[offs[0], offs[-1])`` of ``x [M, K]`` (``K <= ROW_IN_REGS``, unit inner
    stride) into ``q [M, K]`` (fp8) and ``s [M]`` fp32; ``offs`` the chunk's group offsets."""
    from primus_turbo.pytorch.core.platform import num_compute_units, triton_interpret
    from primus_turbo.triton.quantization.quant_launch import _fmax, _interp_fmt, _u8

    m, k = x.shape
    if m == 0 or k == 0 or offs.numel() < 2:
        return
    bm, bk, warps = _tile(k)
    if programs is None:
        programs = 4 if triton_interpret() else num_compute_units(x.device) * (64 // warps)
    quant_rows_window_kernel[(programs,)](
        x, _u8(q), s, offs, m, k, offs.numel() - 1, x.stride(0), q.stride(0), programs,
        BM=bm, BK=bk, FMAX=_fmax(q.dtype), FMT=_interp_fmt(q.dtype), num_warps=warps,
    )  # fmt: skip


def aot_specs(target: str) -> list:
    """sm_90 (the pipelined forward is CUDA-only): the DeepSeek-V3 rows (K = 7168, 2048),
    bf16 in, E4M3 out."""
    from primus_turbo.triton.aot import AotSpec

    if target != "sm_90":
        return []
    specs = []
    for k in (7168, 2048):
        bm, bk, warps = _tile(k)
        sig = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "offs_ptr": "*i64",
               "M": "i32", "K": "i32:16", "G": "i32", "stride_xm": "i32:16",
               "stride_qm": "i32:16", "num_programs": "i32"}  # fmt: skip
        consts = {"BM": bm, "BK": bk, "FMAX": float(torch.finfo(torch.float8_e4m3fn).max),
                  "FMT": (0, 0, 0, 0)}  # fmt: skip
        specs.append(AotSpec(f"quant_rows_window_k{k}", quant_rows_window_kernel, sig, consts,
                             {"num_warps": warps, "num_stages": 1}))  # fmt: skip
    return specs
