"""Shared Triton helpers of the attention kernels: sequence bounds and visible-block ranges.

Visibility rule (flash-attn semantics, bottom-right aligned): with ``off = seqlen_k - seqlen_q``,
query ``i`` sees key ``j`` iff ``j < seqlen_k`` and
``i + off - win_l <= j`` (when HAS_L) and ``j <= i + off + win_r`` (when HAS_R).
Causal is ``HAS_R`` with ``win_r = 0``. All divisions below act on non-negative values (Triton
integer division truncates toward zero).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def seq_bounds(cu_q_ptr, cu_k_ptr, b, seqlen_q, seqlen_k, VARLEN: tl.constexpr):
    """(start_q, seqlen_q, start_k, seqlen_k) of batch entry ``b`` (packed when VARLEN)."""
    if VARLEN:
        start_q = tl.load(cu_q_ptr + b)
        end_q = tl.load(cu_q_ptr + b + 1)
        start_k = tl.load(cu_k_ptr + b)
        end_k = tl.load(cu_k_ptr + b + 1)
        return start_q, end_q - start_q, start_k, end_k - start_k
    else:
        zero = b * 0  # a tensor, like the varlen branch's loads
        return zero, seqlen_q, zero, seqlen_k


@triton.jit
def key_ranges(
    m_start,
    seqlen_q,
    seqlen_k,
    win_l,
    win_r,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_L: tl.constexpr,
    HAS_R: tl.constexpr,
):
    """Key range of a query block ``[m_start, m_start + BLOCK_M)``: ``lo <= full_lo <= full_hi
    <= hi``; blocks in ``[full_lo, full_hi)`` need no mask, the rest need one, keys outside
    ``[lo, hi)`` are invisible to every row of the block (skipped)."""
    off = seqlen_k - seqlen_q
    lo = 0
    hi = seqlen_k
    if HAS_L:
        lo = tl.maximum(m_start + off - win_l, 0) // BLOCK_N * BLOCK_N
    if HAS_R:
        hi = tl.minimum(hi, tl.maximum(m_start + BLOCK_M + off + win_r, 0))
    hi = tl.maximum(hi, lo)
    full_lo = lo
    full_hi = seqlen_k // BLOCK_N * BLOCK_N
    if HAS_L:
        x = tl.maximum(m_start + BLOCK_M - 1 + off - win_l, 0)
        full_lo = (x + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    if HAS_R:
        full_hi = tl.minimum(full_hi, tl.maximum(m_start + off + win_r + 1, 0) // BLOCK_N * BLOCK_N)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def query_ranges(
    n_start,
    seqlen_q,
    seqlen_k,
    win_l,
    win_r,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_L: tl.constexpr,
    HAS_R: tl.constexpr,
):
    """Query range that sees some key of ``[n_start, n_start + BLOCK_N)`` (same contract as
    ``key_ranges``, roles swapped)."""
    off = seqlen_k - seqlen_q
    lo = 0
    hi = seqlen_q
    if HAS_R:
        lo = tl.maximum(n_start - off - win_r, 0) // BLOCK_M * BLOCK_M
    if HAS_L:
        hi = tl.minimum(hi, tl.maximum(n_start + BLOCK_N - off + win_l, 0))
    hi = tl.maximum(hi, lo)
    full_lo = lo
    full_hi = seqlen_q // BLOCK_M * BLOCK_M
    if n_start + BLOCK_N > seqlen_k:  # ragged key block: every query block needs the mask
        full_hi = 0
    if HAS_R:
        x = tl.maximum(n_start + BLOCK_N - 1 - off - win_r, 0)
        full_lo = (x + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    if HAS_L:
        full_hi = tl.minimum(full_hi, tl.maximum(n_start - off + win_l + 1, 0) // BLOCK_M * BLOCK_M)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def visible(
    offs_m, offs_n, seqlen_q, seqlen_k, win_l, win_r, HAS_L: tl.constexpr, HAS_R: tl.constexpr
):
    """``[len(offs_m), len(offs_n)]`` visibility mask (also masks rows/keys past the ends)."""
    off = seqlen_k - seqlen_q
    ok = (offs_m[:, None] < seqlen_q) & (offs_n[None, :] < seqlen_k)
    if HAS_R:
        ok = ok & (offs_n[None, :] <= offs_m[:, None] + off + win_r)
    if HAS_L:
        ok = ok & (offs_n[None, :] >= offs_m[:, None] + off - win_l)
    return ok
