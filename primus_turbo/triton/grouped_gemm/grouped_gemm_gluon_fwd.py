"""Hopper grouped GEMM forward/dgrad in Gluon (plans ``glf`` / ``glfs``), pipelined across tiles.

``C[rows of g] = A[rows of g] @ op(B[g])`` as ``grouped_gemm_tma.grouped_gemm_flat_tma_kernel``
(same operand descriptors: A ``[M, K]``, B viewed as ``[G * N, K]`` (``TRANS_B``) or
``[G * K, N]``; rows of a neighbouring group / expert only feed output rows / columns that are
never stored; NN needs ``K % BLOCK_K == 0``), written as one explicit software pipeline over
all K steps of all of this program's tiles (the structure of ``grouped_gemm_gluon``'s wgrad):
TMA loads run ``NUM_BUF - 1`` steps ahead of the wgmma, so the next tile's first loads are in
flight during this tile's epilogue, and at most one wgmma group is outstanding.

* Tiles: the groups' tiles (``ceil(m_g / BLOCK_M) * ceil(N / BLOCK_N)`` each) concatenated;
  this program takes every ``num_programs``-th from ``pid``; a producer and a consumer cursor
  each walk the groups with a scalar ``while`` (one offset load per group passed); within a
  group ``GROUP_M`` row bands.
* Epilogue: ``TMA_STORE``: a tile whose rows all lie in its group goes through a
  ``[BLOCK_M, BLOCK_N]`` shared buffer and a TMA store of ``C [M, N]`` (clipped at ``N`` by
  the hardware; its wait deferred to the next epilogue); a group's ragged last tile is a
  masked pointer store from the wgmma registers (as every tile without ``TMA_STORE``).
* Rows past ``offs[G]`` (an over-allocated A) are zeroed by a last loop.

CUDA sm_90 only (Gluon's Hopper ops; no interpreter): the launcher's caller checks usability.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from primus_turbo.triton.grouped_gemm.grouped_gemm_gluon import _desc, _mma_layout, _sig_desc


@gluon.jit
def _bounds(offs_ptr, g, M):
    """Rows ``[start, stop)`` of group ``g`` clamped to ``[0, M]`` (as ``group_table``)."""
    start = gl.minimum(gl.maximum(gl.load(offs_ptr + g), 0), M).to(gl.int32)
    stop = gl.minimum(gl.maximum(gl.load(offs_ptr + g + 1), start), M).to(gl.int32)
    return start, stop


@gluon.jit
def _advance(t, g, first, end, start, stop, offs_ptr, M, G, num_pid_n, BLOCK_M: gl.constexpr):
    """The group cursor moved forward until tile ``t`` lies in ``[first, end)`` (or the last
    group is reached: ``t`` past every tile, its loads are predicated off)."""
    while (t >= end) & (g < G - 1):
        g += 1
        start, stop = _bounds(offs_ptr, g, M)
        first = end
        end = end + gl.cdiv(stop - start, BLOCK_M) * num_pid_n
    return g, first, end, start, stop


@gluon.jit
def _coords(t, first, start, stop, num_pid_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
            GROUP_M: gl.constexpr):  # fmt: skip
    """``(row0, col0)`` of tile ``t`` of a group starting at tile ``first``: ``GROUP_M``-row
    bands, column-major inside a band."""
    local = t - first
    num_pid_m = gl.cdiv(stop - start, BLOCK_M)
    width = GROUP_M * num_pid_n
    first_m = (local // width) * GROUP_M
    size_m = gl.maximum(gl.minimum(num_pid_m - first_m, GROUP_M), 1)
    pid_m = first_m + (local % width) % size_m
    pid_n = (local % width) // size_m
    return start + pid_m * BLOCK_M, pid_n * BLOCK_N


@gluon.jit
def _cursor(t, g, first, end, start, stop, offs_ptr, M, G, num_pid_n, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):  # fmt: skip
    """The group cursor at tile ``t`` and the tile's ``(row0, col0)``."""
    g, first, end, start, stop = _advance(t, g, first, end, start, stop, offs_ptr, M, G,
                                          num_pid_n, BLOCK_M)  # fmt: skip
    row0, col0 = _coords(t, first, start, stop, num_pid_n, BLOCK_M, BLOCK_N, GROUP_M)
    return g, first, end, start, stop, row0, col0


@gluon.jit
def _issue(s, total, k_tiles, a_desc, b_desc, bars, a_bufs, b_bufs, g, row0, col0, N, K,
           BLOCK_K: gl.constexpr, NUM_BUF: gl.constexpr, TRANS_B: gl.constexpr):  # fmt: skip
    """TMA loads of step ``s`` (``s < total``; K step ``s % k_tiles`` of its tile)."""
    slot = s % NUM_BUF
    pred = s < total
    k0 = (s % k_tiles) * BLOCK_K
    bar = bars.index(slot)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(a_desc, [row0, k0], bar, a_bufs.index(slot), pred)
    if TRANS_B:
        tma.async_copy_global_to_shared(b_desc, [g * N + col0, k0], bar, b_bufs.index(slot), pred)
    else:
        tma.async_copy_global_to_shared(b_desc, [g * K + k0, col0], bar, b_bufs.index(slot), pred)


@gluon.jit
def grouped_gemm_gluon_kernel(
    a_desc, b_desc, c_desc, c_ptr, offs_ptr, M, N, K, G, stride_cm, num_programs,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    NUM_BUF: gl.constexpr, G_PAD: gl.constexpr, TRANS_B: gl.constexpr, TMA_STORE: gl.constexpr,
    num_warps: gl.constexpr,
):  # fmt: skip
    pid = gl.program_id(0)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)

    vec: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    gi = gl.arange(0, G_PAD, layout=vec)
    real = gi < G
    lo = gl.load(offs_ptr + gi, mask=real, other=0)
    hi = gl.load(offs_ptr + gi + 1, mask=real, other=0)
    lo = gl.minimum(gl.maximum(lo, 0), M).to(gl.int32)
    hi = gl.minimum(gl.maximum(hi, lo), M).to(gl.int32)
    total_tiles = gl.sum(gl.cdiv(hi - lo, BLOCK_M) * num_pid_n, axis=0)
    mine = gl.where(total_tiles > pid, (total_tiles - pid + num_programs - 1) // num_programs, 0)
    total = mine * k_tiles

    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF] + b_desc.block_type.shape, b_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(bars.index(i), count=1)
    if TMA_STORE:
        c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)

    mma: gl.constexpr = _mma_layout(BLOCK_M, BLOCK_N, num_warps)
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma)

    # group cursors of the producer (p*) and the consumer (c*), both at tile pid
    start0, stop0 = _bounds(offs_ptr, 0, M)
    end0 = gl.cdiv(stop0 - start0, BLOCK_M) * num_pid_n
    zero_i = pid * 0  # int32 tensors (loop-carried through the cursor's while loop)
    pg, pfirst, pend, pstart, pstop = _advance(pid, zero_i, zero_i, end0, start0, stop0, offs_ptr,
                                               M, G, num_pid_n, BLOCK_M)  # fmt: skip
    cg, cfirst, cend, cstart, cstop = pg, pfirst, pend, pstart, pstop
    pt = pid
    prow, pcol = _coords(pt, pfirst, pstart, pstop, num_pid_n, BLOCK_M, BLOCK_N, GROUP_M)
    ct = pid
    crow, ccol = prow, pcol

    for i in gl.static_range(NUM_BUF - 1):
        _issue(i, total, k_tiles, a_desc, b_desc, bars, a_bufs, b_bufs, pg, prow, pcol, N, K,
               BLOCK_K, NUM_BUF, TRANS_B)  # fmt: skip
        if (i + 1) % k_tiles == 0:  # the producer's next tile
            pt += num_programs
            pg, pfirst, pend, pstart, pstop, prow, pcol = _cursor(
                pt, pg, pfirst, pend, pstart, pstop, offs_ptr, M, G, num_pid_n,
                BLOCK_M, BLOCK_N, GROUP_M)  # fmt: skip

    for s in range(total):
        slot = s % NUM_BUF
        mbarrier.wait(bars.index(slot), (s // NUM_BUF) & 1)
        kk = s % k_tiles
        if TRANS_B:
            b_op = b_bufs.index(slot).permute((1, 0))
        else:
            b_op = b_bufs.index(slot)
        acc = warpgroup_mma(a_bufs.index(slot), b_op, acc, use_acc=kk > 0, is_async=True)
        # <= 1 wgmma in flight: step s - 1's is done, its ring slot takes step s + NUM_BUF - 1
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        nxt = s + NUM_BUF - 1
        _issue(nxt, total, k_tiles, a_desc, b_desc, bars, a_bufs, b_bufs, pg, prow, pcol, N, K,
               BLOCK_K, NUM_BUF, TRANS_B)  # fmt: skip
        if (nxt + 1) % k_tiles == 0:
            pt += num_programs
            pg, pfirst, pend, pstart, pstop, prow, pcol = _cursor(
                pt, pg, pfirst, pend, pstart, pstop, offs_ptr, M, G, num_pid_n,
                BLOCK_M, BLOCK_N, GROUP_M)  # fmt: skip
        if kk == k_tiles - 1:  # the tile's last step: epilogue (next tile's loads in flight)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            out = acc.to(dtype)
            full = crow + BLOCK_M <= cstop
            if TMA_STORE and full:
                tma.store_wait(pendings=0)  # the previous tile's store left the buffer
                gl.thread_barrier()
                c_smem.store(out)
                fence_async_shared()
                gl.thread_barrier()
                tma.async_copy_shared_to_global(c_desc, [crow, ccol], c_smem)
            else:
                rm = crow + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
                rn = ccol + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
                ptrs = c_ptr + gl.expand_dims(rm.to(gl.int64) * stride_cm, 1)
                ptrs = ptrs + gl.expand_dims(rn, 0)
                mask = gl.expand_dims(rm < cstop, 1) & gl.expand_dims(rn < N, 0)
                gl.store(ptrs, out, mask=mask)
            ct += num_programs
            cg, cfirst, cend, cstart, cstop, crow, ccol = _cursor(
                ct, cg, cfirst, cend, cstart, cstop, offs_ptr, M, G, num_pid_n,
                BLOCK_M, BLOCK_N, GROUP_M)  # fmt: skip
    if TMA_STORE:
        tma.store_wait(pendings=0)
    for i in gl.static_range(NUM_BUF):
        mbarrier.invalidate(bars.index(i))

    # rows past offs[G]: zeros, tiles dealt round-robin
    tail0 = gl.minimum(gl.maximum(gl.load(offs_ptr + G), 0), M).to(gl.int32)
    tail_tiles = gl.cdiv(M - tail0, BLOCK_M) * num_pid_n
    zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    zero = gl.zeros((BLOCK_M, BLOCK_N), dtype=dtype, layout=zl)
    zm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, zl))
    zn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, zl))
    for t in range(pid, tail_tiles, num_programs):
        rm = tail0 + (t // num_pid_n) * BLOCK_M + zm
        rn = (t % num_pid_n) * BLOCK_N + zn
        ptrs = c_ptr + gl.expand_dims(rm.to(gl.int64) * stride_cm, 1) + gl.expand_dims(rn, 0)
        gl.store(ptrs, zero, mask=gl.expand_dims(rm < M, 1) & gl.expand_dims(rn < N, 0))


# plan name -> TMA_STORE (the ring depth is the config's num_stages)
GLUON_FWD_VARIANTS = {"glf": False, "glfs": True}


def gluon_fwd_usable(a, b, trans_b: bool, variant: str, cfg) -> bool:
    """CUDA sm_90+ (not ROCm), bf16/fp16 operands with TMA-able layouts (``b`` contiguous: it
    is viewed as ``[G * N, K]`` / ``[G * K, N]``), NN only with whole K tiles; ``glfs`` also
    16-byte output rows."""
    import torch

    from primus_turbo.triton.grouped_gemm.grouped_gemm_tma import _tma_layout_ok

    if not (a.is_cuda and torch.version.hip is None) or not b.is_contiguous():
        return False
    if torch.cuda.get_device_capability(a.device)[0] < 9:
        return False
    if not (_tma_layout_ok(a) and _tma_layout_ok(b)):
        return False
    k = a.shape[1]
    if not trans_b and k % cfg.block_k:
        return False
    n = b.shape[1] if trans_b else b.shape[2]
    return not GLUON_FWD_VARIANTS[variant] or (n * 2) % 16 == 0


def launch_gluon_fwd(a, b, c, group_offs, trans_b, cfg, programs, variant) -> None:
    """``c = grouped(a, op(b))`` with ``grouped_gemm_gluon_kernel`` (check
    ``gluon_fwd_usable`` first; ``c`` is a fresh contiguous ``[M, N]``)."""
    m, k = a.shape
    g = b.shape[0]
    n = b.shape[1] if trans_b else b.shape[2]
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    a_desc = _desc(a, [bm, bk])
    if trans_b:
        b_desc = _desc(b.view(g * n, k), [bn, bk])
    else:
        b_desc = _desc(b.view(g * k, n), [bk, bn])
    tma_store = GLUON_FWD_VARIANTS[variant]
    c_desc = _desc(c, [bm, bn]) if tma_store else None
    grouped_gemm_gluon_kernel[(programs,)](
        a_desc, b_desc, c_desc, c, group_offs, m, n, k, g, c.stride(0), programs,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m, NUM_BUF=cfg.num_stages,
        G_PAD=triton.next_power_of_2(max(g, 2)), TRANS_B=trans_b, TMA_STORE=tma_store,
        num_warps=cfg.num_warps,
    )  # fmt: skip


def aot_specs(target: str) -> list:
    """sm_90 only: every Gluon forward plan, NT (forward) and NN (dgrad), bf16."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.aot import AotSpec
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import gluon_fwd_plans

    if target != "sm_90":
        return []
    specs = []
    for variant, cfg in gluon_fwd_plans(ArchFamily.HOPPER):
        bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
        for lay, trans_b in (("nt", True), ("nn", False)):
            sig = {"a_desc": _sig_desc([bm, bk]),
                   "b_desc": _sig_desc([bn, bk] if trans_b else [bk, bn]), "c_ptr": "*bf16",
                   "offs_ptr": "*i64", "M": "i32", "N": "i32:16", "K": "i32:16", "G": "i32",
                   "stride_cm": "i32:16", "num_programs": "i32"}  # fmt: skip
            cx = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": cfg.group_m,
                  "NUM_BUF": cfg.num_stages, "G_PAD": 256, "TRANS_B": trans_b,
                  "TMA_STORE": GLUON_FWD_VARIANTS[variant], "num_warps": cfg.num_warps}  # fmt: skip
            if cx["TMA_STORE"]:
                sig["c_desc"] = _sig_desc([bm, bn])
            else:
                cx["c_desc"] = None
            name = f"grouped_gemm_{variant}_bf16_{lay}_{cfg.name}"
            specs.append(AotSpec(name, grouped_gemm_gluon_kernel, sig, cx, cfg.options))
    return specs
