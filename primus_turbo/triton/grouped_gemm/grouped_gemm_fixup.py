"""Tiny zero-fill kernels around the vendor grouped GEMM (``torch._grouped_mm``), host-sync free.

``torch._grouped_mm`` leaves two regions of its ``torch.empty`` output unwritten:
* the forward/dgrad rows past the last group end (``out[ends[G-1]:]``), and
* the wgrad blocks of empty groups (``out[g]`` with no rows) on some GPUs (not on the H200
  with torch 2.11: ``grouped_gemm_impl.vendor_zeroes_empty_groups`` probes it once per device
  and the default fix-up mode skips this pass where the vendor writes them).
Our contract makes both zero. A ``masked_fill_`` over the whole output costs a full read and
write of it (up to 0.3 ms per call on the MoE shapes); these kernels read the int32 group ends
and write only the region that needs zeros, so with no tail and no empty group they are one
launch whose programs exit at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from primus_turbo.triton.aot import AotSpec, triton_dtype_name

_TAIL_ROWS, _TAIL_COLS, _TAIL_PROGRAMS = 16, 256, 64
_BLOCK, _MAX_SPLIT = 2048, 1024


@triton.jit
def zero_tail_rows_kernel(
    c_ptr, ends_ptr, G, M, N, stride_cm, stride_cn, num_programs,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """``c[ends[G-1]:M, :] = 0`` (the end is clamped to ``[0, M]``); ``G >= 1``."""
    pid = tl.program_id(0)
    total = tl.load(ends_ptr + G - 1).to(tl.int64)
    total = tl.minimum(tl.maximum(total, 0), M)
    rr = tl.arange(0, BLOCK_R)
    cn = tl.arange(0, BLOCK_N)
    zero = tl.zeros((BLOCK_R, BLOCK_N), dtype=c_ptr.dtype.element_ty)
    for rb in range(total // BLOCK_R + pid, tl.cdiv(M, BLOCK_R), num_programs):
        rows = rb * BLOCK_R + rr.to(tl.int64)
        row_ok = (rows >= total) & (rows < M)
        for n0 in range(0, N, BLOCK_N):
            cols = n0 + cn
            ptrs = c_ptr + rows[:, None] * stride_cm + cols.to(tl.int64)[None, :] * stride_cn
            tl.store(ptrs, zero, mask=row_ok[:, None] & (cols[None, :] < N))


@triton.jit
def zero_empty_groups_kernel(c_ptr, ends_ptr, G, PQ, stride_cg, chunk, BLOCK: tl.constexpr):
    """``c[g] = 0`` for every group ``g`` with ``ends[g] <= ends[g-1]``; ``c[g]`` is a contiguous
    block of ``PQ`` elements. Program ``s`` walks the group ends and zeroes elements
    ``[s * chunk, (s+1) * chunk)`` of each empty group: all programs share every empty group,
    so one empty expert's block is written by the whole GPU (a grid of ``(G, 64)`` left it to
    64 programs: 237 us for Mixtral-8x7B's 235 MB gate_up block, H200 call 12.1)."""
    s = tl.program_id(0)
    start = s * chunk
    stop = tl.minimum(start + chunk, PQ)
    offs = tl.arange(0, BLOCK)
    zero = tl.zeros((BLOCK,), dtype=c_ptr.dtype.element_ty)
    lo = tl.full((), 0, ends_ptr.dtype.element_ty)
    goff = tl.full((), 0, tl.int64)  # g * stride_cg in 64 bits
    for g in range(0, G):
        hi = tl.load(ends_ptr + g)
        if hi <= lo:
            base = c_ptr + goff
            for i in range(start, stop, BLOCK):
                idx = i + offs
                tl.store(base + idx, zero, mask=idx < stop)
        lo = hi
        goff += stride_cg


def zero_tail_rows(out: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Zero ``out[ends[-1]:]`` in place (``out [M, N]``, ``ends`` int32/int64 ``[G]``)."""
    m, n = out.shape
    if m == 0 or n == 0:
        return out
    if ends.numel() == 0:
        return out.zero_()
    programs = max(1, min(_TAIL_PROGRAMS, -(-m // _TAIL_ROWS)))
    zero_tail_rows_kernel[(programs,)](
        out, ends, ends.numel(), m, n, out.stride(0), out.stride(1), programs,
        BLOCK_R=_TAIL_ROWS, BLOCK_N=_TAIL_COLS,
    )  # fmt: skip
    return out


def zero_empty_groups(out: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Zero ``out[g]`` in place for every empty group (``out [G, P, Q]`` contiguous per group,
    ``ends`` int32/int64 ``[G]`` inclusive group ends)."""
    g = out.shape[0]
    pq = out[0].numel() if g else 0
    if g == 0 or pq == 0:
        return out
    if not out[0].is_contiguous() or pq >= 2**31 - _MAX_SPLIT * _BLOCK:  # (int32 indices)
        return out.masked_fill_(_empty_mask(ends)[:, None, None], 0)
    split = max(1, min(_MAX_SPLIT, _cdiv(pq, _BLOCK)))
    chunk = _cdiv(_cdiv(pq, split), _BLOCK) * _BLOCK
    split = _cdiv(pq, chunk)  # no program without elements
    zero_empty_groups_kernel[(split,)](out, ends, g, pq, out.stride(0), chunk, BLOCK=_BLOCK)
    return out


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)


def _empty_mask(ends: torch.Tensor) -> torch.Tensor:
    prev = torch.cat([ends.new_zeros(1), ends[:-1]])
    return ends <= prev


def aot_specs(target: str) -> list[AotSpec]:
    """Both kernels for a bf16 output and int32 ends (what the HIPBLASLT backend launches)."""
    t = triton_dtype_name(torch.bfloat16)
    return [
        AotSpec(
            name=f"grouped_gemm_zero_tail_{t}",
            fn=zero_tail_rows_kernel,
            signature={
                "c_ptr": f"*{t}",
                "ends_ptr": "*i32",
                "G": "i32",
                "M": "i32",
                "N": "i32",
                "stride_cm": "i32:16",
                "stride_cn": "i32:1",
                "num_programs": "i32",
            },  # fmt: skip
            constexprs={"BLOCK_R": _TAIL_ROWS, "BLOCK_N": _TAIL_COLS},
            options={},
        ),
        AotSpec(
            name=f"grouped_gemm_zero_empty_{t}",
            fn=zero_empty_groups_kernel,
            signature={
                "c_ptr": f"*{t}",
                "ends_ptr": "*i32",
                "G": "i32",
                "PQ": "i32",
                "stride_cg": "i32:16",
                "chunk": "i32:16",
            },  # fmt: skip
            constexprs={"BLOCK": _BLOCK},
            options={},
        ),
    ]
