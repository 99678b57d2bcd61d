"""Grouped GEMM forward with Triton's Hopper warp specialisation: the fp8 plan ``f8ws`` of
``grouped_gemm_fp8_tma`` (``SCALED``). The bf16 plan ``ws`` was removed in session 6: on the
H200 (run 6.1) its GPU test and the tuner's first launch at DeepSeek-V3 sizes never finished
(a deadlock of the specialised loop, cause not found).

``tl.range(..., warp_specialize=True)`` on sm_90 splits a loop into a producer warpgroup
(TMA loads) and two consumer warpgroups (each half of the ``BLOCK_M`` rows through wgmma),
the CUTLASS "cooperative" layout that ``torch._grouped_mm`` uses; a ``num_warps=4`` config
launches 12 warps. Triton 3.6's pass only accepts a simple loop body: the one-pass tile lookup
of the flat kernels (vector reductions over the group table) inside the specialised loop
aborts the pass, so this kernel walks the groups in an outer scalar loop (two offset loads per
group) and specialises the loop over that group's tiles, rotating the program-to-tile
assignment by the tiles handed out so far (every program gets every ``num_programs``-th tile
of the global sequence, as in the other kernels). Rows past ``offs[G]`` are zeroed by a
second loop. Operand descriptors as in ``grouped_gemm_tma`` (rows of a neighbouring group /
expert only feed output rows / columns that the masked store drops; NN needs
``K % BLOCK_K == 0``). ``TMA_STORE`` (no plan uses it): full tiles
leave through a TMA store (two ``[BLOCK_M, BLOCK_N / 2]`` halves), ragged ones masked.
CUDA sm_90+ only (the interpreter runs it too, without the specialisation).

The warp-specialised wgrad (plans ``ws`` / ``wsm`` of the variable-K GEMM, session 5) was
removed: its GPU tests failed (wrong results) on the H200 in run 5.3.
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.grouped_gemm.grouped_gemm_walk import (
    desc_tile_mma,
    group_bounds,
    scale_tile,
    store_rows,
    store_tile,
    zero_tail,
)


@triton.jit
def grouped_gemm_ws_kernel(
    a_desc, b_desc, c_ptr, offs_ptr, M, N, K, G, stride_cm, stride_cn, num_programs, c_desc,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    TRANS_B: tl.constexpr, UPCAST: tl.constexpr, TMA_STORE: tl.constexpr, WS: tl.constexpr,
    sa_ptr=None, sb_ptr=None, stride_sa=None, stride_sbg=None, stride_sbn=None,
    SCALED: tl.constexpr = False,
):  # fmt: skip
    """``SCALED`` (plan ``f8ws`` of ``grouped_gemm_fp8_tma``: fp8 E4M3 operands, ``TRANS_B``):
    the tile times ``sa [M]`` per row and ``sb [G, N]`` per (group, column) before the masked
    pointer store."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    rot = 0
    for g in range(0, G):
        start, stop = group_bounds(offs_ptr, g, M)
        tiles_g = tl.cdiv(stop - start, BLOCK_M) * num_pid_n
        first = (pid - rot + num_programs) % num_programs
        for t in tl.range(first, tiles_g, num_programs, warp_specialize=WS):
            row0 = start + (t // num_pid_n) * BLOCK_M
            col0 = (t % num_pid_n) * BLOCK_N
            acc = desc_tile_mma(a_desc, b_desc, g, row0, col0, N, K, k_tiles,
                                BLOCK_M, BLOCK_N, BLOCK_K, TRANS_B, UPCAST)  # fmt: skip
            if SCALED:
                rows = row0.to(tl.int64) + tl.arange(0, BLOCK_M).to(tl.int64)
                rn = col0 + tl.arange(0, BLOCK_N)
                mask_m = rows < stop
                mask_n = rn < N
                acc = scale_tile(acc, sa_ptr, sb_ptr, g, rows, rn, mask_m, mask_n,
                                 stride_sa, stride_sbg, stride_sbn)  # fmt: skip
                store_rows(c_ptr, acc, rows, rn, mask_m, mask_n, stride_cm, stride_cn)
            else:
                store_tile(c_ptr, c_desc, acc, row0, col0, stop, N, stride_cm, stride_cn,
                           BLOCK_M, BLOCK_N, TMA_STORE)  # fmt: skip
        rot = (rot + tiles_g) % num_programs
    zero_tail(c_ptr, offs_ptr, M, N, G, pid, num_programs, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
