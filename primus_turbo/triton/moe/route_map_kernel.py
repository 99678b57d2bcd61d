"""Permute row maps from top-k expert ids in two Triton launches, with no sort and no atomics.

Input: the flat expert ids ``idx[i]`` of the ``TK = T * K`` token copies (``i = t * K + k``),
int32 or int64; ids outside ``[0, E)`` are dropped. Output (the conventions of
``permute_kernel.py``):

* ``row_map[i]``: the permuted row of copy ``i`` (-1 when dropped);
* ``src_map[r]``: the copy feeding row ``r`` (-1 for padding rows and rows no copy reaches);
* ``tokens_per_expert[e]`` (padded to ``PAD`` when ``PAD > 0``), the dispatched row count
  ``min(used, N_OUT)``, the overflow flag ``used > N_OUT``, and optionally
  ``permuted_probs[r] = probs[src_map[r]]`` (0 elsewhere).

Counting sort in chunks of ``CHUNK`` copies, one program per chunk:
1. ``map_hist_kernel``: each program's per-expert counts, a ``[C, E_PAD]`` int32 table (one-hot
   compares of ``SUB`` copies at a time, summed over the copies).
2. ``map_assign_kernel``: each program sums the table (all chunks: expert totals, hence the
   padded sizes and their exclusive scan ``pstart``; chunks before its own: its start inside
   each expert), then walks its copies in order: the rank of a copy among the copies of its
   expert inside a sub-block is an inclusive cumsum of the one-hot matrix down the copies.
   Copies keep their flat order within an expert (the stable, expert-major order). The same
   program also marks its share of unused output rows (-1 / 0), so no memset pass is needed.
Every value is computed by one program in a fixed order: bitwise deterministic. No host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from primus_turbo.triton.aot import AotSpec


@triton.jit
def _onehot(idx_ptr, i, TK, E, E_PAD: tl.constexpr):
    """``[SUB, E_PAD]`` bool: copy ``i`` goes to expert ``e`` (False past TK / out of range)."""
    cols = tl.arange(0, E_PAD)
    e = tl.load(idx_ptr + i, mask=i < TK, other=-1).to(tl.int32)
    return (e[:, None] == cols[None, :]) & (cols[None, :] < E)


@triton.jit
def map_hist_kernel(
    idx_ptr, counts_ptr, TK, E, CHUNK: tl.constexpr, SUB: tl.constexpr, E_PAD: tl.constexpr
):
    c = tl.program_id(0)
    base = c.to(tl.int64) * CHUNK
    cols = tl.arange(0, E_PAD)
    acc = tl.zeros([E_PAD], dtype=tl.int32)
    for s in range(0, CHUNK, SUB):
        i = base + s + tl.arange(0, SUB)
        acc += tl.sum(_onehot(idx_ptr, i, TK, E, E_PAD).to(tl.int32), axis=0)
    tl.store(counts_ptr + c * E_PAD + cols, acc)


@triton.jit
def map_assign_kernel(
    idx_ptr,
    counts_ptr,
    probs_ptr,
    row_map_ptr,
    src_map_ptr,
    pprobs_ptr,
    tpe_ptr,
    disp_ptr,
    flag_ptr,
    TK,
    E,
    C,
    N_OUT,
    PAD,
    CHUNK: tl.constexpr,
    SUB: tl.constexpr,
    E_PAD: tl.constexpr,
    CB: tl.constexpr,
    HAS_PROBS: tl.constexpr,
):
    c = tl.program_id(0)
    cols = tl.arange(0, E_PAD)
    total = tl.zeros([E_PAD], dtype=tl.int32)
    before = tl.zeros([E_PAD], dtype=tl.int32)
    for c0 in range(0, C, CB):
        rows = c0 + tl.arange(0, CB)
        blk = tl.load(counts_ptr + rows[:, None] * E_PAD + cols[None, :],
                      mask=(rows < C)[:, None], other=0)  # fmt: skip
        total += tl.sum(blk, axis=0)
        before += tl.sum(tl.where((rows < c)[:, None], blk, 0), axis=0)
    if PAD > 0:
        sizes = (total + PAD - 1) // PAD * PAD
    else:
        sizes = total
    pstart = tl.cumsum(sizes, axis=0) - sizes
    used = tl.sum(sizes, axis=0)
    if c == 0:
        tl.store(tpe_ptr + cols, sizes.to(tl.int64), mask=cols < E)
        tl.store(disp_ptr, tl.minimum(used, N_OUT).to(tl.int64))
        tl.store(flag_ptr, (used > N_OUT).to(tl.uint8))
    # copies of this chunk, in order: destination = expert start + earlier copies of the expert
    run = pstart + before
    base = c.to(tl.int64) * CHUNK
    for s in range(0, CHUNK, SUB):
        i = base + s + tl.arange(0, SUB)
        m = i < TK
        hot = _onehot(idx_ptr, i, TK, E, E_PAD)
        hot_i = hot.to(tl.int32)
        cum = tl.cumsum(hot_i, axis=0)
        dst = tl.sum(tl.where(hot, run[None, :] + cum - 1, 0), axis=1)
        ok = (tl.sum(hot_i, axis=1) > 0) & (dst < N_OUT)
        dst = tl.where(ok, dst, -1).to(tl.int64)
        tl.store(row_map_ptr + i, dst, mask=m)
        tl.store(src_map_ptr + dst, i, mask=m & ok)
        if HAS_PROBS:
            p = tl.load(probs_ptr + i, mask=m & ok, other=0.0)
            tl.store(pprobs_ptr + dst, p, mask=m & ok)
        run += tl.sum(hot_i, axis=0)
    # output rows [c*CHUNK, (c+1)*CHUNK) that no copy fills: padding, or past the used rows
    fill = pstart + total  # each expert's filled rows are [pstart, pstart + total)
    for s in range(0, CHUNK, SUB):
        r = base + s + tl.arange(0, SUB)
        inside = (r[:, None] >= pstart[None, :]) & (r[:, None] < fill[None, :])
        unused = (tl.sum(inside.to(tl.int32), axis=1) == 0) & (r < N_OUT)
        tl.store(src_map_ptr + r, tl.full([SUB], -1, tl.int64), mask=unused)
        if HAS_PROBS:
            tl.store(pprobs_ptr + r, tl.zeros([SUB], dtype=tl.float32), mask=unused)


def _plan(tk: int, n_out: int, e: int) -> tuple[int, int, int, int, int]:
    """``(E_PAD, SUB, CHUNK, C, CB)``: ~4K-element one-hot tiles, at most ~256 chunks."""
    e_pad = triton.next_power_of_2(max(e, 2))
    sub = max(16, min(256, 4096 // e_pad))
    work = max(tk, n_out, 1)
    chunk = max(sub, triton.next_power_of_2(-(-work // 256)))
    grid = -(-work // chunk)
    cb = max(1, min(64, 4096 // e_pad))
    return e_pad, sub, chunk, grid, cb


def build_route_maps(
    idx: torch.Tensor,
    num_experts: int,
    pad_multiple: int,
    num_out: int,
    probs: torch.Tensor | None = None,
):
    """``idx: [T, K]`` int32/int64 -> ``(row_map [T, K] int64, src_map [N] int64,
    tokens_per_expert [E] int64, num_dispatched 0-d int64, overflow 0-d bool, permuted_probs [N]
    fp32 | None)`` with ``N = num_out``. ``probs``: ``[T, K]`` fp32, contiguous."""
    t, k = idx.shape
    dev = idx.device
    tk = t * k
    flat = idx.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    e_pad, sub, chunk, grid, cb = _plan(tk, num_out, num_experts)
    counts = torch.empty((grid, e_pad), dtype=torch.int32, device=dev)
    row_map = torch.empty((t, k), dtype=torch.int64, device=dev)
    src_map = torch.empty((num_out,), dtype=torch.int64, device=dev)
    tpe = torch.empty((num_experts,), dtype=torch.int64, device=dev)
    disp = torch.empty((), dtype=torch.int64, device=dev)
    flag = torch.empty((), dtype=torch.bool, device=dev)
    pprobs = None
    if probs is not None:
        pprobs = torch.empty((num_out,), dtype=torch.float32, device=dev)
    map_hist_kernel[(grid,)](flat, counts, tk, num_experts, CHUNK=chunk, SUB=sub, E_PAD=e_pad,
                             num_warps=4)  # fmt: skip
    map_assign_kernel[(grid,)](
        flat, counts, probs if probs is not None else counts, row_map, src_map,
        pprobs if pprobs is not None else counts, tpe, disp, flag.view(torch.uint8), tk,
        num_experts, grid, num_out, pad_multiple, CHUNK=chunk, SUB=sub, E_PAD=e_pad, CB=cb,
        HAS_PROBS=probs is not None, num_warps=8,
    )  # fmt: skip
    return row_map, src_map, tpe, disp, flag, pprobs


def aot_specs(target: str) -> list[AotSpec]:
    """int64 ids, 128 experts (Qwen3-MoE), the plan of T=4096, K=8."""
    e_pad, sub, chunk, _, cb = _plan(4096 * 8, 4096 * 8, 128)
    return [
        AotSpec(
            name="moe_map_hist_e128",
            fn=map_hist_kernel,
            signature={"idx_ptr": "*i64", "counts_ptr": "*i32", "TK": "i32", "E": "i32"},
            constexprs={"CHUNK": chunk, "SUB": sub, "E_PAD": e_pad},
            options={"num_warps": 4},
            default=True,
        ),
        AotSpec(
            name="moe_map_assign_e128_probs",
            fn=map_assign_kernel,
            signature={"idx_ptr": "*i64", "counts_ptr": "*i32", "probs_ptr": "*fp32",
                       "row_map_ptr": "*i64", "src_map_ptr": "*i64", "pprobs_ptr": "*fp32",
                       "tpe_ptr": "*i64", "disp_ptr": "*i64", "flag_ptr": "*u8", "TK": "i32",
                       "E": "i32", "C": "i32", "N_OUT": "i32", "PAD": "i32"},
            constexprs={"CHUNK": chunk, "SUB": sub, "E_PAD": e_pad, "CB": cb, "HAS_PROBS": True},
            options={"num_warps": 8},
        ),
    ]  # fmt: skip
