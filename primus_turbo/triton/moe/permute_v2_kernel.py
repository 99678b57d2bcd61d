"""MoE permute / unpermute, v2: fewer launches per call (``PRIMUS_TURBO_MOE_PERMUTE_IMPL=v2``).

At the MoE sizes (4096 tokens, 16-250 MB moved) a permute is a few tens of microseconds of
copying, so launches, allocations and small torch ops cost as much as the data. v2 per call:

* permute forward, 2 launches: ``v2_hist_kernel`` (per-chunk expert counts, as in
  ``route_map_kernel.py``) and ``permute_fused_kernel``: each program turns its chunk of token
  copies into destination rows (counting sort: all chunk counts summed for the expert starts,
  earlier chunks for its own start, a one-hot cumsum inside the chunk), writes ``row_map`` and
  the permuted probs, copies the rows of its copies (each token row is read K times in a row, so
  from cache) and zeroes its share of the rows no copy fills (padding, dropped copies). The
  top-k ids and probs are read through their strides (no ``contiguous`` copy); no ``src_map``.
* unpermute forward / permute backward, 1 launch: ``reduce_v2_kernel``, the weighted gather-sum
  of ``permute_kernel.reduce_rows_kernel`` that also writes ``p_out[t, k] = w[row_map[t, k]]``
  (the unpermuted probs, or the gradient of the permuted probs).
* unpermute backward: ``rows_to_src_kernel`` (the inverse map, into a -1 filled buffer) and
  ``unpermute_bwd_kernel``, which reads ``y`` only when the probs need a gradient.

Launch geometry (``PRIMUS_TURBO_MOE_PERMUTE_GEOM``, read per call): ``2d`` (default) adds
column splits: the fused permute runs ``(chunks, splits)`` programs (each split re-derives its
chunk's destinations, only split 0 writes the maps and probs; at most 256 chunks, so the count
table every program reads stays small, and splits bring ~4 programs per SM); the unpermute
backward runs one program per (8 tokens, column block) with the K weights loaded once, and
32-row zeroing programs; the unweighted unpermute's backward uses the same kernel (token order,
``dout`` read once) instead of an inverse-map gather. ``v2`` is the session-3 geometry (one
program per chunk over all columns). A/B knobs: ``PRIMUS_TURBO_MOE_PERMUTE_SPLITS``,
``PRIMUS_TURBO_MOE_PERMUTE_CHUNKS``. Both geometries give bitwise equal results.

Round 2 (H200 run 4.2): the 2d permute forward copies in a third launch by default
(``PRIMUS_TURBO_MOE_PERMUTE_COPY=gather``: the map programs, 4 warps at ~106 registers, write
the inverse map instead of rows; ``permute_kernel.gather_rows_kernel`` moves them), since the
fused kernel (211 registers, one program per SM) was 0.52 of copy at 128 experts; and the
unpermute forward stores ``p_out`` / ``src`` after its output tile (``LATE``), not inside the
K-copy loop, where they serialised the K gathers (0.68 of copy at DeepSeek-V3 vs v1's 0.86).

Map conventions are those of ``permute_kernel.py``. No atomics: bitwise deterministic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from primus_turbo.triton.aot import AotSpec
from primus_turbo.triton.moe.permute_kernel import _tile, gather_rows_triton
from primus_turbo.triton.moe.permute_v2_plan import (
    _block_h,
    _plan_v2,
    _splits,
    copy_choice,
    geom_choice,
    reduce_tile,
)


@triton.jit
def _copy_ids(idx_ptr, i, TK, s_t, s_k, K: tl.constexpr):
    """Expert id of flat copy ``i = t * K + k`` read through the ``[T, K]`` strides (-1 past TK)."""
    return tl.load(idx_ptr + (i // K) * s_t + (i % K) * s_k, mask=i < TK, other=-1).to(tl.int32)


@triton.jit
def v2_hist_kernel(
    idx_ptr,
    counts_ptr,
    TK,
    E,
    s_t,
    s_k,
    K: tl.constexpr,
    CHUNK: tl.constexpr,
    SUB: tl.constexpr,
    E_PAD: tl.constexpr,
):
    c = tl.program_id(0)
    base = c.to(tl.int64) * CHUNK
    cols = tl.arange(0, E_PAD)
    acc = tl.zeros([E_PAD], dtype=tl.int32)
    for s in range(0, CHUNK, SUB):
        e = _copy_ids(idx_ptr, base + s + tl.arange(0, SUB), TK, s_t, s_k, K)
        hot = (e[:, None] == cols[None, :]) & (cols[None, :] < E)
        acc += tl.sum(hot.to(tl.int32), axis=0)
    tl.store(counts_ptr + c * E_PAD + cols, acc)


@triton.jit
def permute_fused_kernel(
    idx_ptr,
    counts_ptr,
    probs_ptr,
    x_ptr,
    out_ptr,
    row_map_ptr,
    pprobs_ptr,
    tpe_ptr,
    disp_ptr,
    flag_ptr,
    TK,
    E,
    C,
    N_OUT,
    PAD,
    H,
    s_t,
    s_k,
    p_t,
    p_k,
    stride_x,
    stride_out,
    COLS,
    K: tl.constexpr,
    CHUNK: tl.constexpr,
    SUB: tl.constexpr,
    E_PAD: tl.constexpr,
    CB: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_PROBS: tl.constexpr,
    HAS_PAD: tl.constexpr,
    EVEN_H: tl.constexpr,
    COPY: tl.constexpr = True,
    src_ptr=None,
):
    """``COPY=False`` (the ``gather`` copy mode): no row is touched here; the programs write
    the inverse map ``src[dst] = i`` (-1 for rows no copy fills) and ``gather_rows_kernel``
    copies. The ids (and probs) of the next sub-block are loaded before this one's stores, so
    the walk has no load -> store -> load chain through the ids."""
    c = tl.program_id(0)
    j = tl.program_id(1)  # column split: columns [j * COLS, min(H, (j + 1) * COLS))
    first = j == 0  # the maps, probs and counters are written by the split-0 programs
    h_lo = j * COLS
    h_hi = tl.minimum(H, h_lo + COLS)
    cols = tl.arange(0, E_PAD)
    hcols = tl.arange(0, BLOCK_H)
    total = tl.zeros([E_PAD], dtype=tl.int32)
    before = tl.zeros([E_PAD], dtype=tl.int32)
    for c0 in range(0, C, CB):
        rows = c0 + tl.arange(0, CB)
        blk = tl.load(counts_ptr + rows[:, None] * E_PAD + cols[None, :],
                      mask=(rows < C)[:, None], other=0)  # fmt: skip
        total += tl.sum(blk, axis=0)
        before += tl.sum(tl.where((rows < c)[:, None], blk, 0), axis=0)
    if HAS_PAD:
        sizes = (total + PAD - 1) // PAD * PAD
    else:
        sizes = total
    pstart = tl.cumsum(sizes, axis=0) - sizes
    used = tl.sum(sizes, axis=0)
    if (c == 0) & first:
        tl.store(tpe_ptr + cols, sizes.to(tl.int64), mask=cols < E)
        tl.store(disp_ptr, tl.minimum(used, N_OUT).to(tl.int64))
        tl.store(flag_ptr, (used > N_OUT).to(tl.uint8))
    run = pstart + before
    base = c.to(tl.int64) * CHUNK
    i_nx = base + tl.arange(0, SUB)
    e_nx = _copy_ids(idx_ptr, i_nx, TK, s_t, s_k, K)
    p_nx = tl.zeros([SUB], dtype=tl.float32)
    if HAS_PROBS:
        pm0 = (i_nx < TK) & first
        p_nx = tl.load(probs_ptr + (i_nx // K) * p_t + (i_nx % K) * p_k, mask=pm0, other=0.0)
    for s in range(0, CHUNK, SUB):
        i = base + s + tl.arange(0, SUB)
        m = i < TK
        e = e_nx
        p = p_nx
        i_nx = i + SUB  # prefetch: issued before this sub-block's stores
        e_nx = _copy_ids(idx_ptr, i_nx, TK, s_t, s_k, K)
        if HAS_PROBS:
            pmn = (i_nx < TK) & first & (s + SUB < CHUNK)
            p_nx = tl.load(probs_ptr + (i_nx // K) * p_t + (i_nx % K) * p_k, mask=pmn, other=0.0)
        hot = (e[:, None] == cols[None, :]) & (cols[None, :] < E)
        hot_i = hot.to(tl.int32)
        cum = tl.cumsum(hot_i, axis=0)
        dst = tl.sum(tl.where(hot, run[None, :] + cum - 1, 0), axis=1)
        ok = (tl.sum(hot_i, axis=1) > 0) & (dst < N_OUT)
        dst = tl.where(ok, dst, -1).to(tl.int64)
        tl.store(row_map_ptr + i, dst, mask=m & first)
        if HAS_PROBS:
            tl.store(pprobs_ptr + dst, p, mask=m & ok & first)
        run += tl.sum(hot_i, axis=0)
        if COPY:
            tok = i // K  # consecutive copies share a token row: K reads of it, all but one cached
            d = tl.maximum(dst, 0)
            for h0 in range(h_lo, h_hi, BLOCK_H):
                hc = h0 + hcols
                if EVEN_H:
                    msk = ok[:, None] & (hc < BLOCK_H + h0)[None, :]
                else:
                    msk = ok[:, None] & (hc < H)[None, :]
                v = tl.load(x_ptr + tok[:, None] * stride_x + hc[None, :], mask=msk, other=0.0)
                tl.store(out_ptr + d[:, None] * stride_out + hc[None, :], v, mask=msk)
        else:
            tl.store(src_ptr + dst, i, mask=m & ok)
    # output rows [base, base + CHUNK) that no copy fills: padding, or past the used rows
    fill = pstart + total
    z_lo = 0
    if not HAS_PAD:  # rows below `used` are all filled: start at the sub-block holding `used`
        z_lo = (tl.minimum(tl.maximum(used - base, 0), CHUNK) // SUB * SUB).to(tl.int32)
    for s in range(z_lo, CHUNK, SUB):
        r = base + s + tl.arange(0, SUB)
        if HAS_PAD:
            inside = (r[:, None] >= pstart[None, :]) & (r[:, None] < fill[None, :])
            unused = (tl.sum(inside.to(tl.int32), axis=1) == 0) & (r < N_OUT)
        else:
            unused = (r >= used) & (r < N_OUT)
        if tl.sum(unused.to(tl.int32), axis=0) > 0:
            if HAS_PROBS:
                tl.store(pprobs_ptr + r, tl.zeros([SUB], dtype=tl.float32), mask=unused & first)
            if COPY:
                zero = tl.zeros([SUB, BLOCK_H], dtype=out_ptr.dtype.element_ty)
                for h0 in range(h_lo, h_hi, BLOCK_H):
                    hc = h0 + hcols
                    tl.store(out_ptr + r[:, None] * stride_out + hc[None, :], zero,
                             mask=unused[:, None] & (hc < H)[None, :])  # fmt: skip
            else:
                tl.store(src_ptr + r, tl.full([SUB], -1, tl.int64), mask=unused)


@triton.jit
def reduce_v2_kernel(
    y_ptr,
    map_ptr,
    w_ptr,
    out_ptr,
    p_out_ptr,
    src_ptr,
    T,
    H,
    stride_y,
    stride_out,
    K: tl.constexpr,
    MUL_W: tl.constexpr,
    WRITE_P: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    EVEN_H: tl.constexpr,
    WRITE_SRC: tl.constexpr = False,
    LATE: tl.constexpr = False,
    K_PAD: tl.constexpr = 1,
    COL_FAST: tl.constexpr = False,
):
    """``out[t] = sum_k w * y[row_map[t, k]]`` (fp32, copy order; ``w = 1`` unless ``MUL_W``)
    and, with ``WRITE_P``, ``p_out[t, k] = w_ptr[row_map[t, k]]`` (0 for dropped copies) from
    the programs of the first column block; with ``WRITE_SRC`` those also write the inverse map
    ``src[row_map[t, k]] = t * K + k`` (rows no copy reaches keep whatever the buffer held: the
    backward checks ``row_map[src[r]] == r``, so no -1 fill is needed). ``LATE`` (the 2d
    geometry): those stores come after the output tile, in a branch of the first column block
    only. Inside the copy loop (``LATE=False``, the v2 geometry) every store waits for its
    weight load and the next copy's loads cannot pass the store (the pointers may alias), so
    the K gathers ran one after the other instead of all in flight."""
    if COL_FAST:  # grid (column blocks, token blocks): a token block's columns run together
        pid_t, pid_h = tl.program_id(1), tl.program_id(0)
    else:
        pid_t, pid_h = tl.program_id(0), tl.program_id(1)
    toks = pid_t.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    in_rows = toks < T
    if EVEN_H:
        col_ok = cols < BLOCK_H * (pid_h + 1)
    else:
        col_ok = cols < H
    acc = tl.zeros([ROWS, BLOCK_H], dtype=tl.float32)
    for k in tl.static_range(K):
        r = tl.load(map_ptr + toks * K + k, mask=in_rows, other=-1)
        valid = r >= 0
        rr = tl.maximum(r, 0)
        v = tl.load(y_ptr + rr[:, None] * stride_y + cols[None, :],
                    mask=valid[:, None] & col_ok[None, :], other=0.0).to(tl.float32)  # fmt: skip
        if MUL_W or (WRITE_P and not LATE):
            w = tl.load(w_ptr + rr, mask=valid, other=0.0).to(tl.float32)
            if MUL_W:
                v = v * w[:, None]
            if WRITE_P and not LATE:
                tl.store(p_out_ptr + toks * K + k, w, mask=in_rows & (pid_h == 0))
        if WRITE_SRC and not LATE:
            tl.store(src_ptr + rr, toks * K + k, mask=valid & in_rows & (pid_h == 0))
        acc += v
    tl.store(out_ptr + toks[:, None] * stride_out + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=in_rows[:, None] & col_ok[None, :])  # fmt: skip
    if LATE and (WRITE_P or WRITE_SRC):
        if pid_h == 0:  # a branch: the other column blocks never wait on it
            kk = tl.arange(0, K_PAD)
            cp = toks[:, None] * K + kk[None, :]
            mk = in_rows[:, None] & (kk < K)[None, :]
            rm = tl.load(map_ptr + cp, mask=mk, other=-1)
            ok = rm >= 0
            rr2 = tl.maximum(rm, 0)
            if WRITE_P:
                w2 = tl.load(w_ptr + rr2, mask=ok, other=0.0).to(tl.float32)
                tl.store(p_out_ptr + cp, w2, mask=mk)
            if WRITE_SRC:
                tl.store(src_ptr + rr2, cp, mask=ok)


@triton.jit
def rows_to_src_kernel(map_ptr, src_ptr, TK, BLOCK: tl.constexpr):
    """``src[row_map[i]] = i`` for the copies that have a row (``src`` pre-filled with -1)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    r = tl.load(map_ptr + i, mask=i < TK, other=-1)
    tl.store(src_ptr + tl.maximum(r, 0), i, mask=(i < TK) & (r >= 0))


@triton.jit
def _bwd_copy_k(
    g,
    rmap,
    wall,
    kk,
    k,
    w_ptr,
    y_ptr,
    dy_ptr,
    stride_y,
    stride_dy,
    cols,
    col_ok,
    dw,
    HAS_W: tl.constexpr,
    PRELOAD_W: tl.constexpr,
    NEED_DW: tl.constexpr,
):
    """Copy ``k`` of a token tile: ``dy[row] = w * g`` (and ``dw[:, k] += <g, y[row]>``)."""
    r = tl.sum(tl.where(kk[None, :] == k, rmap, 0), axis=1)  # [ROWS] row of copy k
    valid = r >= 0
    rr = tl.maximum(r, 0)
    m = valid[:, None] & col_ok[None, :]
    v = g
    if HAS_W:
        if PRELOAD_W:
            w = tl.sum(tl.where(kk[None, :] == k, wall, 0.0), axis=1)
        else:
            w = tl.load(w_ptr + rr, mask=valid, other=0.0).to(tl.float32)
        v = g * w[:, None]
    tl.store(
        dy_ptr + rr[:, None] * stride_dy + cols[None, :], v.to(dy_ptr.dtype.element_ty), mask=m
    )
    if NEED_DW:
        y = tl.load(y_ptr + rr[:, None] * stride_y + cols[None, :], mask=m, other=0.0)
        part = tl.sum(g * y.to(tl.float32), axis=1)
        dw += tl.where(kk[None, :] == k, part[:, None], 0.0)
    return dw


@triton.jit
def unpermute_bwd_kernel(
    dout_ptr,
    y_ptr,
    map_ptr,
    w_ptr,
    src_ptr,
    dy_ptr,
    dw_ptr,
    T,
    N,
    H,
    stride_dout,
    stride_y,
    stride_dy,
    num_tok_programs,
    SPLITS,
    COLS,
    K: tl.constexpr,
    K_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    ZROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    NEED_DW: tl.constexpr,
    HAS_W: tl.constexpr = True,
    FAST: tl.constexpr = False,
    VERIFY: tl.constexpr = False,
):
    """``permute_kernel.reduce_rows_bwd_kernel`` with ``y`` read only when ``NEED_DW``: tokens
    ``[ROWS]`` per program write ``dy[row] = w * dout[t]`` for their K copies (``w = 1``
    without ``HAS_W``; and ``dw``); the programs past ``num_tok_programs * SPLITS`` zero the
    rows no copy maps to (``src < 0``), ``ZROWS`` each. Token programs: ``pid // SPLITS`` is
    the token tile, ``pid % SPLITS`` the column split ``[split * COLS, (split + 1) * COLS)``
    (``SPLITS`` is 1 with ``NEED_DW``: dw sums over the whole row). ``FAST`` (the 2d
    geometry): the K weights are loaded once per program, not per column block and copy (a
    dependent L2 round trip before every store)."""
    pid = tl.program_id(0)
    cols0 = tl.arange(0, BLOCK_H)
    if pid >= num_tok_programs * SPLITS:
        r = (pid - num_tok_programs * SPLITS).to(tl.int64) * ZROWS + tl.arange(0, ZROWS)
        if VERIFY:  # src unfilled (written by the forward): r is live iff row_map[src[r]] == r
            src = tl.load(src_ptr + r, mask=r < N, other=-1)
            inb = (src >= 0) & (src < T * K) & (r < N)
            back = tl.load(map_ptr + tl.where(inb, src, 0), mask=inb, other=-1)
            dead = (back != r) & (r < N)
        else:
            src = tl.load(src_ptr + r, mask=r < N, other=0)
            dead = (src < 0) & (r < N)
        if tl.sum(dead.to(tl.int32), axis=0) > 0:
            zero = tl.zeros([ZROWS, BLOCK_H], dtype=dy_ptr.dtype.element_ty)
            for h0 in range(0, H, BLOCK_H):
                cols = h0 + cols0
                tl.store(dy_ptr + r[:, None] * stride_dy + cols[None, :], zero,
                         mask=dead[:, None] & (cols < H)[None, :])  # fmt: skip
            if NEED_DW:
                tl.store(dw_ptr + r, tl.zeros([ZROWS], dtype=tl.float32), mask=dead)
        return
    toks = (pid // SPLITS).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    h_lo = (pid % SPLITS) * COLS
    h_hi = tl.minimum(H, h_lo + COLS)
    in_rows = toks < T
    kk = tl.arange(0, K_PAD)
    rmap = tl.load(map_ptr + toks[:, None] * K + kk[None, :],
                   mask=in_rows[:, None] & (kk < K)[None, :], other=-1)  # fmt: skip
    wall = tl.zeros([ROWS, K_PAD], dtype=tl.float32)
    if HAS_W and FAST:
        wall = tl.load(w_ptr + tl.maximum(rmap, 0), mask=rmap >= 0, other=0.0).to(tl.float32)
    dw = tl.zeros([ROWS, K_PAD], dtype=tl.float32)
    for h0 in range(h_lo, h_hi, BLOCK_H):
        cols = h0 + cols0
        col_ok = cols < H
        g = tl.load(dout_ptr + toks[:, None] * stride_dout + cols[None, :],
                    mask=in_rows[:, None] & col_ok[None, :], other=0.0).to(tl.float32)  # fmt: skip
        # not unrolled: K tiles of y (or K pointer tiles of dy) in flight cost registers (255
        # and spills on sm_90 when unrolled); the stores need no wait, the weights are loaded
        for k in range(K):
            dw = _bwd_copy_k(g, rmap, wall, kk, k, w_ptr, y_ptr, dy_ptr, stride_y, stride_dy,
                             cols, col_ok, dw, HAS_W, FAST, NEED_DW)  # fmt: skip
    if NEED_DW:
        ok = (rmap >= 0) & in_rows[:, None]
        tl.store(dw_ptr + tl.maximum(rmap, 0), dw, mask=ok)


# ---- launchers -------------------------------------------------------------------------------


def permute_fused_triton(
    x: torch.Tensor,
    idx: torch.Tensor,
    num_experts: int,
    pad_multiple: int,
    num_out: int,
    probs: torch.Tensor | None,
):
    """``x [T, H]``, ``idx [T, K]`` (any strides), ``probs [T, K]`` fp32 or None ->
    ``(out [N, H], row_map [T, K] int64, tokens_per_expert [E] int64, num_dispatched 0-d int64,
    overflow 0-d bool, permuted_probs [N] fp32 | None)``."""
    t, k = idx.shape
    h = x.shape[1]
    dev = x.device
    tk = t * k
    out = torch.empty((num_out, h), dtype=x.dtype, device=dev)
    row_map = torch.empty((t, k), dtype=torch.int64, device=dev)
    tpe = torch.empty((num_experts,), dtype=torch.int64, device=dev)
    disp = torch.empty((), dtype=torch.int64, device=dev)
    flag = torch.empty((), dtype=torch.bool, device=dev)
    pprobs = torch.empty((num_out,), dtype=torch.float32, device=dev) if probs is not None else None
    geom = geom_choice()
    e_pad, sub, chunk, grid, cb = _plan_v2(max(tk, num_out), num_experts, geom)
    counts = torch.empty((grid, e_pad), dtype=torch.int32, device=dev)
    if h > 0 and x.stride(1) != 1:
        x = x.contiguous()
    # 2d: the histogram in up to 8192-element one-hot steps (2 steps a chunk at 128 experts, was 8
    # dependent id loads)
    hsub = sub if geom == "v2" else max(sub, min(chunk, 8192 // e_pad))
    v2_hist_kernel[(grid,)](idx, counts, tk, num_experts, idx.stride(0), idx.stride(1), K=k,
                            CHUNK=chunk, SUB=hsub, E_PAD=e_pad, num_warps=4)  # fmt: skip
    block = _block_h(h, x.element_size())
    copy = geom == "v2" or copy_choice(num_experts) == "fused"
    splits, per = _splits(dev, grid, triton.cdiv(max(h, 1), block), geom, "permute")
    src = None
    if not copy:  # map-only programs; the rows move in a wide gather afterwards
        splits, per = 1, triton.cdiv(max(h, 1), block)
        src = torch.empty((num_out,), dtype=torch.int64, device=dev)
    p_strides = (probs.stride(0), probs.stride(1)) if probs is not None else (0, 0)
    permute_fused_kernel[(grid, splits)](
        idx, counts, probs if probs is not None else counts, x, out, row_map,
        pprobs if pprobs is not None else counts, tpe, disp, flag.view(torch.uint8),
        tk, num_experts, grid, num_out, max(pad_multiple, 1), h, idx.stride(0), idx.stride(1),
        *p_strides, x.stride(0), out.stride(0), per * block, K=k, CHUNK=chunk, SUB=sub,
        E_PAD=e_pad, CB=cb, BLOCK_H=block, HAS_PROBS=probs is not None, HAS_PAD=pad_multiple > 0,
        EVEN_H=h % block == 0, COPY=copy, src_ptr=src, num_warps=8 if copy else 4,
    )  # fmt: skip
    if not copy and num_out > 0 and h > 0:
        out = gather_rows_triton(x, src, k, out=out)
    return out, row_map, tpe, disp, flag, pprobs


def reduce_v2_triton(
    y: torch.Tensor,
    row_map: torch.Tensor,
    w: torch.Tensor | None,
    out_dtype: torch.dtype,
    mul_w: bool,
    write_p: bool,
    write_src: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(out [T, H], p_out [T, K] fp32 | None, src [N] int64 | None)``; see
    ``reduce_v2_kernel`` (``src`` is only meaningful where ``row_map[src[r]] == r``)."""
    t, k = row_map.shape
    h = y.shape[1]
    out = torch.empty((t, h), dtype=out_dtype, device=y.device)
    p_out = torch.empty((t, k), dtype=torch.float32, device=y.device) if write_p else None
    src = torch.empty((y.shape[0],), dtype=torch.int64, device=y.device) if write_src else None
    if t == 0 or k == 0:
        if k == 0:
            out.zero_()
        return out, p_out, src
    if h == 0:  # no column block to write p_out: a torch gather (rare)
        if write_p:
            p_out.copy_(w.index_select(0, row_map.clamp(min=0).reshape(-1)).view(t, k))
            p_out.mul_(row_map >= 0)
        return out, p_out, src  # (h == 0: the backward returns zeros without reading src)
    rows, block, warps, col_fast = reduce_tile(h, t, k, mul_w or write_src)
    grid = (triton.cdiv(t, rows), triton.cdiv(h, block))
    reduce_v2_kernel[grid[::-1] if col_fast else grid](
        y, row_map, w if w is not None else y, out, p_out if p_out is not None else out,
        src if src is not None else row_map, t, h, y.stride(0), out.stride(0), K=k, MUL_W=mul_w,
        WRITE_P=write_p, ROWS=rows, BLOCK_H=block, EVEN_H=h % block == 0,
        WRITE_SRC=write_src, LATE=geom_choice() != "v2", K_PAD=triton.next_power_of_2(k),
        COL_FAST=col_fast, num_warps=warps,
    )  # fmt: skip
    return out, p_out, src


def src_from_rows_triton(row_map: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse map ``src [N]`` (-1 where no copy lands) of ``row_map``: fill + 1 launch."""
    src = torch.full((n,), -1, dtype=torch.int64, device=row_map.device)
    tk = row_map.numel()
    if tk and n:
        block = 1024
        rows_to_src_kernel[(triton.cdiv(tk, block),)](row_map, src, tk, BLOCK=block, num_warps=4)
    return src


def unpermute_bwd_triton(
    dout: torch.Tensor,
    y: torch.Tensor,
    row_map: torch.Tensor,
    w: torch.Tensor | None,
    need_dw: bool,
    src: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(dy [N, H], dw [N] fp32 | None)`` of the unpermute (weighted by ``w``, or not: then
    ``dy[row_map[t, k]] = dout[t]``, each ``dout`` row read once for its K copies). ``src``:
    the unfilled inverse map the forward wrote (one launch here), else built here (fill +
    scatter)."""
    n, h = y.shape
    t, k = row_map.shape
    need_dw = need_dw and w is not None
    dw = torch.empty((n,), dtype=torch.float32, device=y.device) if need_dw else None
    if t == 0 or k == 0 or h == 0 or n == 0:
        return torch.zeros_like(y), (dw.zero_() if dw is not None else None)
    verify = src is not None
    if src is None:
        src = src_from_rows_triton(row_map, n)
    dy = torch.empty((n, h), dtype=y.dtype, device=y.device)
    geom = geom_choice()
    rows, block, warps = _tile(h, 8 if need_dw else 4, t)
    block = min(block, _block_h(h, 4))  # = _tile's block unless a test lowers MAX_BLOCK_BYTES
    tok_programs = triton.cdiv(t, rows)
    blocks = triton.cdiv(h, block)
    splits, per = _splits(
        y.device, tok_programs, blocks, "v2" if need_dw else geom, "unpermute_bwd"
    )
    # zeroing programs: most find no dead row and exit; 32 rows each (v2: ROWS) keeps them few
    zrows = rows if geom == "v2" else max(rows, 32)
    unpermute_bwd_kernel[(tok_programs * splits + triton.cdiv(n, zrows),)](
        dout, y, row_map, w if w is not None else dout, src, dy, dw if dw is not None else dout,
        t, n, h, dout.stride(0), y.stride(0), dy.stride(0), tok_programs, splits, per * block,
        K=k, K_PAD=triton.next_power_of_2(k), ROWS=rows, ZROWS=zrows, BLOCK_H=block,
        NEED_DW=need_dw, HAS_W=w is not None, FAST=geom != "v2", VERIFY=verify,
        num_warps=warps,
    )  # fmt: skip
    return dy, dw


def aot_specs(target: str) -> list[AotSpec]:
    """The AOT specs live in ``permute_v2_aot.py`` (this module stays under 600 lines)."""
    from primus_turbo.triton.moe.permute_v2_aot import aot_specs as specs

    return specs(target)
