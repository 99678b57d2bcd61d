"""Pieces shared by the persistent grouped GEMM forward kernels (``grouped_gemm_flat``,
``grouped_gemm_tma``, ``grouped_gemm_fp8_tma``): the in-kernel group table and one-pass
tile lookup of the flat walks, the TMA-descriptor K loop, the tile stores, the zeroing of the
rows past ``offs[G]``, and the host-side operand descriptors. ``@triton.jit`` helpers are
inlined into each kernel, so every kernel compiles to the same code as when these lines were
written out in it.
No kernels here (nothing for ``aot_specs``: the kernels' modules compile these).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def group_table(offs_ptr, M, G, num_pid_n, BLOCK_M: tl.constexpr, G_PAD: tl.constexpr):
    """The ``[G_PAD]`` group table (int32 rows: ``M < 2**31``; groups past ``G`` are empty):
    ``(gi, lo, hi, first, ends, total)`` = group index, first row, end row, first tile, end
    tile, and the number of tiles of all groups."""
    gi = tl.arange(0, G_PAD)
    real = gi < G
    lo = tl.load(offs_ptr + tl.minimum(gi, G), mask=real, other=0)
    hi = tl.load(offs_ptr + tl.minimum(gi + 1, G), mask=real, other=0)
    lo = tl.minimum(tl.maximum(lo, 0), M).to(tl.int32)
    hi = tl.minimum(tl.maximum(hi, lo), M).to(tl.int32)
    tiles = tl.cdiv(hi - lo, BLOCK_M) * num_pid_n
    ends = tl.cumsum(tiles, axis=0)
    first = ends - tiles
    total = tl.sum(tiles, axis=0)
    return gi, lo, hi, first, ends, total


@triton.jit
def find_tile(t_glob, gi, lo, hi, first, ends):
    """``(g, start, stop, t0)`` of the group whose tile range ``[first, ends)`` holds tile
    ``t_glob``: ONE multi-operand reduction over the group table."""
    here = (first <= t_glob) & (t_glob < ends)
    g, start, stop, t0 = tl.reduce(
        (
            tl.where(here, gi, 0),
            tl.where(here, lo, 0),
            tl.where(here, hi, 0),
            tl.where(here, first, 0),
        ),
        0,
        _add4,
    )
    return g, start, stop, t0


@triton.jit
def desc_tile_mma(a_desc, b_desc, g, row0, col0, N, K, k_tiles,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  TRANS_B: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """The fp32 ``[BLOCK_M, BLOCK_N]`` tile at ``(row0, col0)`` of group ``g``: ``k_tiles``
    TMA loads of A (``[M, K]``) and B (``[G * N, K]`` when ``TRANS_B``, else ``[G * K, N]``).
    ``UPCAST`` (the interpreter): fp32 products."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, k_tiles):
        a = a_desc.load([row0, kt * BLOCK_K])
        if TRANS_B:
            b = b_desc.load([g * N + col0, kt * BLOCK_K])
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b.T, acc)
        else:
            b = b_desc.load([g * K + kt * BLOCK_K, col0])
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def masked_store(c_ptr, acc, row0, col0, stop, N, stride_cm, stride_cn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """The tile ``acc`` at ``(row0, col0)`` of ``c``, rows ``>= stop`` and columns ``>= N``
    dropped."""
    rows = row0.to(tl.int64) + tl.arange(0, BLOCK_M).to(tl.int64)
    rn = col0 + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + rows[:, None] * stride_cm + rn.to(tl.int64)[None, :] * stride_cn
    mask = (rows[:, None] < stop) & (rn[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_tile(c_ptr, c_desc, acc, row0, col0, stop, N, stride_cm, stride_cn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA_STORE: tl.constexpr):  # fmt: skip
    """``masked_store``; with ``TMA_STORE`` a tile whose rows all lie in its group leaves
    through two ``[BLOCK_M, BLOCK_N / 2]`` TMA stores of ``c_desc`` (clipped at ``N`` by the
    hardware), a group's ragged last tile keeps the masked store (a TMA store would
    overwrite the next group's rows)."""
    if TMA_STORE:
        if row0 + BLOCK_M <= stop:
            out = acc.to(c_desc.dtype).reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1)
            lo_half, hi_half = out.split()
            c_desc.store([row0, col0], lo_half)
            c_desc.store([row0, col0 + BLOCK_N // 2], hi_half)
        else:
            masked_store(c_ptr, acc, row0, col0, stop, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
    else:
        masked_store(c_ptr, acc, row0, col0, stop, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


@triton.jit
def scale_tile(acc, sa_ptr, sb_ptr, g, rows, rn, mask_m, mask_n,
               stride_sa, stride_sbg, stride_sbn):  # fmt: skip
    """The fp8 epilogue (``SCALED`` kernels): ``acc`` times the per-row scale of A
    (``sa [M]``) and the per-(group, column) scale of B (``sb [G, N]``)."""
    sa = tl.load(sa_ptr + rows * stride_sa, mask=mask_m, other=0.0)
    sb = tl.load(sb_ptr + tl.cast(g, tl.int64) * stride_sbg + rn.to(tl.int64) * stride_sbn,
                 mask=mask_n, other=0.0)  # fmt: skip
    return acc * sa[:, None] * sb[None, :]


@triton.jit
def store_rows(c_ptr, acc, rows, rn, mask_m, mask_n, stride_cm, stride_cn):
    """The masked pointer store of a tile whose int64 rows, columns and masks are at hand."""
    c_ptrs = c_ptr + rows[:, None] * stride_cm + rn.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def zero_rows_from(c_ptr, tail0, M, N, pid, num_programs, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Rows ``tail0 .. M - 1`` of ``c`` (``tail0`` int64, clamped to ``[0, M]``): zeros, tiles
    dealt round-robin."""
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tail_tiles = tl.cdiv((M - tail0).to(tl.int32), BLOCK_M) * num_pid_n
    zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=c_ptr.dtype.element_ty)
    for t in range(pid, tail_tiles, num_programs):
        rows = tail0 + (t // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        rn = (t % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ptrs = c_ptr + rows[:, None] * stride_cm + rn.to(tl.int64)[None, :] * stride_cn
        tl.store(c_ptrs, zero, mask=(rows[:, None] < M) & (rn[None, :] < N))


@triton.jit
def zero_tail(c_ptr, offs_ptr, M, N, G, pid, num_programs, stride_cm, stride_cn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Rows past ``offs[G]`` (an over-allocated A): zeros, tiles dealt round-robin."""
    tail0 = tl.minimum(tl.maximum(tl.load(offs_ptr + G), 0), M).to(tl.int64)
    zero_rows_from(c_ptr, tail0, M, N, pid, num_programs, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


# AOT: the constexpr-None scale arguments of an unscaled (bf16) compile of a SCALED kernel
UNSCALED = {"sa_ptr": None, "sb_ptr": None, "stride_sa": None, "stride_sbg": None,
            "stride_sbn": None, "SCALED": False}  # fmt: skip


def operand_descs(a, b, trans_b: bool, cfg):
    """Host side: ``(a_desc, b_desc, m, n, k, g)`` for ``c = grouped(a [M, K], op(b))``: A one
    descriptor over ``[M, K]``, B one over ``b`` viewed as ``[G * N, K]`` (``trans_b``) or
    ``[G * K, N]``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from primus_turbo.triton.host_tma import ensure_context

    ensure_context(a.device)
    m, k = a.shape
    g = b.shape[0]
    n = b.shape[1] if trans_b else b.shape[2]
    a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k])
    if trans_b:
        b_desc = TensorDescriptor.from_tensor(b.view(g * n, k), [cfg.block_n, cfg.block_k])
    else:
        b_desc = TensorDescriptor.from_tensor(b.view(g * k, n), [cfg.block_k, cfg.block_n])
    return a_desc, b_desc, m, n, k, g
