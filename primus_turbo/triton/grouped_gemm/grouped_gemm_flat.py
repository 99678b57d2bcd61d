"""Grouped GEMM forward/dgrad, "flat" variant: the persistent tile loop with a constant K trip
count (the tail pseudo-group moves to its own loop), so Triton can flatten the tile and K loops
into one pipelined loop (``tl.range(..., flatten=True)``, CUDA: the next tile's first loads
are issued while the current tile's epilogue runs), and a one-pass tile lookup.

Same math, operands, clamping and outputs as ``grouped_gemm_kernel`` (see that module); the
differences:
* tile -> group: the group whose tile range ``[ends[g] - tiles[g], ends[g])`` holds the tile,
  found with ONE multi-operand reduction over the ``[G_PAD]`` table (group, first row, last
  row, first tile), instead of a compare-count reduction followed by three extractions (four
  block-wide reductions per tile, each with its own barriers). The table is int32.
* the main loop covers the real groups only, every tile with ``cdiv(K, BLOCK_K)`` K steps;
  the rows past ``offs[G]`` are zeroed by a second, short loop.
Selected by ``PRIMUS_TURBO_GROUPED_GEMM_KERNEL`` (see ``grouped_gemm_kernel``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.gemm.gemm_kernel import _tile_coords, _tile_mma
from primus_turbo.triton.grouped_gemm.grouped_gemm_walk import find_tile, group_table, zero_tail


@triton.jit
def grouped_gemm_flat_kernel(
    a_ptr, b_ptr, c_ptr, offs_ptr, M, N, K, G,
    stride_am, stride_ak, stride_bg, stride_bk, stride_bn, stride_cm, stride_cn,
    num_programs, as_ptr, bs_ptr, stride_as, stride_bsg, stride_bsn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
    SCALED: tl.constexpr, G_PAD: tl.constexpr, FLATTEN: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    gi, lo, hi, first, ends, total = group_table(offs_ptr, M, G, num_pid_n, BLOCK_M, G_PAD)
    rm0 = tl.arange(0, BLOCK_M)
    rn0 = tl.arange(0, BLOCK_N)
    for t_glob in tl.range(pid, total, num_programs, flatten=FLATTEN):
        g, start, stop, t0 = find_tile(t_glob, gi, lo, hi, first, ends)
        m_g = stop - start
        num_pid_m = tl.cdiv(m_g, BLOCK_M)
        pid_m, pid_n = _tile_coords(t_glob - t0, num_pid_m, num_pid_n, GROUP_M)
        rm = pid_m * BLOCK_M + rm0
        rn = pid_n * BLOCK_N + rn0
        rows = start.to(tl.int64) + rm.to(tl.int64)
        rn64 = rn.to(tl.int64)
        mask_m = rm[:, None] < m_g
        mask_n = rn[None, :] < N
        b_base = b_ptr + g.to(tl.int64) * stride_bg
        acc = _tile_mma(
            a_ptr, b_base, rows, rn64, mask_m, mask_n, 0, k_tiles, K,
            stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, UPCAST,
        )  # fmt: skip
        if SCALED:  # fp8: per-row scale of A, per-(group, column) scale of B
            sa = tl.load(as_ptr + rows * stride_as, mask=rm < m_g, other=0.0)
            bs_base = bs_ptr + g.to(tl.int64) * stride_bsg
            sb = tl.load(bs_base + rn64 * stride_bsn, mask=rn < N, other=0.0)
            acc = acc * sa[:, None] * sb[None, :]
        c_ptrs = c_ptr + rows[:, None] * stride_cm + rn64[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)
    zero_tail(c_ptr, offs_ptr, M, N, G, pid, num_programs, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


def launch_flat(a, b, c, group_offs, m, n, k, g, strides, scales, cfg, programs, flags):
    """Launch ``grouped_gemm_flat_kernel`` with the arguments ``grouped_gemm_triton`` built."""
    (sam, sak, sbg, sbk, sbn, scm, scn), (sa, sb, s_as, s_bsg, s_bsn) = strides, scales
    grouped_gemm_flat_kernel[(programs,)](
        a, b, c, group_offs, m, n, k, g, sam, sak, sbg, sbk, sbn, scm, scn, programs,
        sa, sb, s_as, s_bsg, s_bsn,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        G_PAD=triton.next_power_of_2(max(g, 2)), **flags, **cfg.options,
    )  # fmt: skip
