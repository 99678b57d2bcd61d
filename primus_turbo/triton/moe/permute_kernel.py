"""MoE permute / unpermute row kernels (gather, weighted gather-sum, and its backward).

Maps (built on device by the op layer, never read on the host):
- ``row_map: [T, K]`` int64: permuted row of token ``t``'s ``k``-th copy, ``-1`` when dropped.
- ``src_map: [N]`` int64: ``t * K + k`` feeding permuted row ``n``, ``-1`` for padding rows.

Kernels (gather and reduce: a ``[ROWS, BLOCK_H]`` tile per program, ``BLOCK_H`` up to 1024
columns so each thread moves 16-byte vectors, ~16 KiB per tile; the backward: ``ROWS`` tokens
per program over the whole hidden dim; row offsets are int64 so ``rows * hidden`` past 2**31
is safe; no atomics anywhere, so every kernel is bitwise deterministic):
- ``gather_rows_kernel``: ``out[n] = x[src_map[n] // K]`` (zeros for padding rows). Permute
  forward, and unpermute's data gradient when no probs are applied.
- ``reduce_rows_kernel``: ``out[t] = sum_k w[t, k] * y[row_map[t, k]]`` in fp32 with
  ``w = probs[row_map[t, k]]`` (or 1). Unpermute forward, and permute's backward.
- ``reduce_rows_bwd_kernel``: for each copy, ``dy[row] = w * dout[t]`` and
  ``dw = <dout[t], y[row]>``: unpermute's backward with probs (``ROWS`` tokens per program;
  extra programs zero the rows no copy maps to, instead of a memset pass).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from primus_turbo.triton.aot import AotSpec, triton_dtype_name


@triton.jit
def gather_rows_kernel(
    x_ptr,
    src_ptr,
    out_ptr,
    N,
    H,
    stride_x,
    stride_out,
    K: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    EVEN_H: tl.constexpr,
):
    """A ``[ROWS, BLOCK_H]`` tile of the output per program (grid: row tiles x column tiles)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_rows = rows < N
    src = tl.load(src_ptr + rows, mask=in_rows, other=-1)
    tok = tl.maximum(src, 0) // K
    if EVEN_H:
        col_ok = tl.full([BLOCK_H], 1, tl.int1)
    else:
        col_ok = cols < H
    v = tl.load(x_ptr + tok[:, None] * stride_x + cols[None, :],
                mask=(src >= 0)[:, None] & col_ok[None, :], other=0.0)  # fmt: skip
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], v,
             mask=in_rows[:, None] & col_ok[None, :])  # fmt: skip


@triton.jit
def reduce_rows_kernel(
    y_ptr,
    map_ptr,
    w_ptr,
    out_ptr,
    T,
    H,
    stride_y,
    stride_out,
    K: tl.constexpr,
    HAS_W: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    EVEN_H: tl.constexpr,
):
    """``[ROWS tokens, BLOCK_H]`` of the output per program; the K copies summed in fp32 in
    copy order."""
    toks = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_rows = toks < T
    if EVEN_H:
        col_ok = tl.full([BLOCK_H], 1, tl.int1)
    else:
        col_ok = cols < H
    acc = tl.zeros([ROWS, BLOCK_H], dtype=tl.float32)
    for k in tl.static_range(K):
        r = tl.load(map_ptr + toks * K + k, mask=in_rows, other=-1)
        valid = r >= 0
        rr = tl.maximum(r, 0)
        v = tl.load(y_ptr + rr[:, None] * stride_y + cols[None, :],
                    mask=valid[:, None] & col_ok[None, :], other=0.0).to(tl.float32)  # fmt: skip
        if HAS_W:
            w = tl.load(w_ptr + rr, mask=valid, other=0.0).to(tl.float32)
            v = v * w[:, None]
        acc += v
    tl.store(out_ptr + toks[:, None] * stride_out + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=in_rows[:, None] & col_ok[None, :])  # fmt: skip


@triton.jit
def reduce_rows_bwd_kernel(
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
    K: tl.constexpr,
    K_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Programs ``< num_tok_programs``: ``ROWS`` tokens each, the hidden dim in ``BLOCK_H``
    chunks; every chunk of ``dout`` is read once for all K copies, ``dw`` sums in a fixed order.
    The rest: ``ROWS`` permuted rows each, zeroing those no copy maps to (padding, dropped
    copies), so dy/dw need no separate memset pass."""
    pid = tl.program_id(0)
    cols0 = tl.arange(0, BLOCK_H)
    if pid >= num_tok_programs:
        r = (pid - num_tok_programs).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        src = tl.load(src_ptr + r, mask=r < N, other=0)
        dead = (src < 0) & (r < N)
        if tl.sum(dead.to(tl.int32), axis=0) > 0:
            zero = tl.zeros([ROWS, BLOCK_H], dtype=dy_ptr.dtype.element_ty)
            for h0 in range(0, H, BLOCK_H):
                cols = h0 + cols0
                tl.store(dy_ptr + r[:, None] * stride_dy + cols[None, :], zero,
                         mask=dead[:, None] & (cols < H)[None, :])  # fmt: skip
            tl.store(dw_ptr + r, tl.zeros([ROWS], dtype=tl.float32), mask=dead)
        return
    toks = pid.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    in_rows = toks < T
    kk = tl.arange(0, K_PAD)
    rmap = tl.load(map_ptr + toks[:, None] * K + kk[None, :],
                   mask=in_rows[:, None] & (kk < K)[None, :], other=-1)  # fmt: skip
    dw = tl.zeros([ROWS, K_PAD], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + cols0
        col_ok = cols < H
        g = tl.load(dout_ptr + toks[:, None] * stride_dout + cols[None, :],
                    mask=in_rows[:, None] & col_ok[None, :], other=0.0).to(tl.float32)  # fmt: skip
        for k in range(K):  # not unrolled: K tiles of y in flight cost occupancy
            r = tl.sum(tl.where(kk[None, :] == k, rmap, 0), axis=1)  # [ROWS] row of copy k
            valid = r >= 0
            rr = tl.maximum(r, 0)
            w = tl.load(w_ptr + rr, mask=valid, other=0.0).to(tl.float32)
            m = valid[:, None] & col_ok[None, :]
            y = tl.load(y_ptr + rr[:, None] * stride_y + cols[None, :], mask=m, other=0.0)
            tl.store(dy_ptr + rr[:, None] * stride_dy + cols[None, :],
                     (g * w[:, None]).to(dy_ptr.dtype.element_ty), mask=m)  # fmt: skip
            part = tl.sum(g * y.to(tl.float32), axis=1)
            dw += tl.where(kk[None, :] == k, part[:, None], 0.0)
    ok = (rmap >= 0) & in_rows[:, None]
    tl.store(dw_ptr + tl.maximum(rmap, 0), dw, mask=ok)


@triton.jit
def dequant_rows_kernel(
    q_ptr, s_ptr, out_ptr, N, H, stride_q, stride_out, ROWS: tl.constexpr, BLOCK_H: tl.constexpr
):  # fmt: skip
    """``out[n] = (q[n] * s[n])`` in fp32, rounded to out's dtype: the rowwise fp8 rows of a
    permute / fused activation back in high precision for a weight gradient (one read of 1
    byte, one write of 2 per element; torch's ``q.float() * s`` moves 19)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = (rows < N)[:, None] & (cols < H)[None, :]
    sc = tl.load(s_ptr + rows, mask=rows < N, other=0.0)
    q = tl.load(q_ptr + rows[:, None] * stride_q + cols[None, :], mask=m, other=0.0)
    y = q.to(tl.float32) * sc[:, None]
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
             y.to(out_ptr.dtype.element_ty), mask=m)  # fmt: skip


def _tile(h: int, elem: int, rows_total: int) -> tuple[int, int, int]:
    """``(ROWS, BLOCK_H, num_warps)`` of the row-copy kernels: columns in blocks of up to 1024
    (16-byte vectors: 8 bf16 per thread, 128-256 threads), rows stacked to ~16 KiB per tile."""
    block = min(max(triton.next_power_of_2(h), 16), 1024 if elem <= 2 else 512)
    rows = max(1, min(16384 // (block * elem), 16))
    rows = min(rows, triton.next_power_of_2(max(rows_total, 1)))
    warps = 8 if rows * block * elem >= 16384 else 4
    return rows, block, warps


def gather_rows_triton(
    x: torch.Tensor, src_map: torch.Tensor, k: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x: [T, H]``, ``src_map: [N]`` -> ``[N, H]`` (padding rows zero), into ``out`` if given
    (``[N, H]``, unit column stride)."""
    n, h = src_map.shape[0], x.shape[1]
    if out is None:
        out = torch.empty((n, h), dtype=x.dtype, device=x.device)
    if n == 0 or h == 0:
        return out
    rows, block, warps = _tile(h, x.element_size(), n)
    grid = (triton.cdiv(n, rows), triton.cdiv(h, block))
    gather_rows_kernel[grid](
        x, src_map, out, n, h, x.stride(0), out.stride(0), K=k, ROWS=rows, BLOCK_H=block,
        EVEN_H=h % block == 0, num_warps=warps,
    )  # fmt: skip
    return out


def reduce_rows_triton(
    y: torch.Tensor, row_map: torch.Tensor, w: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    """``y: [N, H]``, ``row_map: [T, K]``, ``w: [N]`` fp32 or None -> ``[T, H]``."""
    t, k = row_map.shape
    h = y.shape[1]
    out = torch.empty((t, h), dtype=out_dtype, device=y.device)
    if t == 0 or h == 0:
        return out
    if k == 0:
        return out.zero_()
    rows, block, warps = _tile(h, 4, t)  # fp32 accumulator: size the tile by 4-byte elements
    grid = (triton.cdiv(t, rows), triton.cdiv(h, block))
    reduce_rows_kernel[grid](
        y, row_map, w if w is not None else y, out, t, h, y.stride(0), out.stride(0),
        K=k, HAS_W=w is not None, ROWS=rows, BLOCK_H=block, EVEN_H=h % block == 0,
        num_warps=warps,
    )  # fmt: skip
    return out


def reduce_rows_bwd_triton(
    dout: torch.Tensor,
    y: torch.Tensor,
    row_map: torch.Tensor,
    w: torch.Tensor,
    src_map: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(dy [N, H] in y's dtype, dw [N] fp32)``; rows no token maps to
    (``src_map < 0``) are zero."""
    n, h = y.shape
    t, k = row_map.shape
    if t == 0 or k == 0 or h == 0 or n == 0:
        return torch.zeros_like(y), torch.zeros((n,), dtype=torch.float32, device=y.device)
    dy = torch.empty((n, h), dtype=y.dtype, device=y.device)
    dw = torch.empty((n,), dtype=torch.float32, device=y.device)
    rows, block, warps = _tile(h, 8, t)  # half the forward's tile: dout, y and dy in flight
    tok_programs = triton.cdiv(t, rows)
    reduce_rows_bwd_kernel[(tok_programs + triton.cdiv(n, rows),)](
        dout, y, row_map, w, src_map, dy, dw, t, n, h, dout.stride(0), y.stride(0),
        dy.stride(0), tok_programs, K=k, K_PAD=triton.next_power_of_2(k), ROWS=rows,
        BLOCK_H=block, num_warps=warps,
    )  # fmt: skip
    return dy, dw


def dequant_rows_triton(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q [N, H]`` fp8 (unit column stride), ``s [N]`` fp32 -> ``[N, H]`` of ``dtype``
    (compiled GPU kernels only: the interpreter cannot load fp8)."""
    n, h = q.shape
    out = torch.empty((n, h), dtype=dtype, device=q.device)
    if n == 0 or h == 0:
        return out
    rows, block, warps = _tile(h, 2, n)
    grid = (triton.cdiv(n, rows), triton.cdiv(h, block))
    dequant_rows_kernel[grid](
        q, s, out, n, h, q.stride(0), out.stride(0), ROWS=rows, BLOCK_H=block, num_warps=warps
    )
    return out


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 rows, hidden 7168-class blocks, top-8."""
    dt = triton_dtype_name(torch.bfloat16)
    return [
        AotSpec(
            name="moe_gather_rows_bf16",
            fn=gather_rows_kernel,
            signature={"x_ptr": f"*{dt}", "src_ptr": "*i64", "out_ptr": f"*{dt}", "N": "i32",
                       "H": "i32", "stride_x": "i64:16", "stride_out": "i64:16"},
            constexprs={"K": 8, "ROWS": 8, "BLOCK_H": 1024, "EVEN_H": True},
            options={"num_warps": 8},
            default=True,
        ),
        AotSpec(
            name="moe_reduce_rows_bf16_w",
            fn=reduce_rows_kernel,
            signature={"y_ptr": f"*{dt}", "map_ptr": "*i64", "w_ptr": "*fp32",
                       "out_ptr": f"*{dt}", "T": "i32", "H": "i32", "stride_y": "i64:16",
                       "stride_out": "i64:16"},
            constexprs={"K": 8, "HAS_W": True, "ROWS": 8, "BLOCK_H": 512, "EVEN_H": True},
            options={"num_warps": 8},
        ),
        AotSpec(
            name="moe_reduce_rows_bwd_bf16",
            fn=reduce_rows_bwd_kernel,
            signature={"dout_ptr": f"*{dt}", "y_ptr": f"*{dt}", "map_ptr": "*i64",
                       "w_ptr": "*fp32", "src_ptr": "*i64", "dy_ptr": f"*{dt}",
                       "dw_ptr": "*fp32", "T": "i32", "N": "i32", "H": "i32",
                       "stride_dout": "i64:16", "stride_y": "i64:16", "stride_dy": "i64:16",
                       "num_tok_programs": "i32"},
            constexprs={"K": 8, "K_PAD": 8, "ROWS": 4, "BLOCK_H": 512},
            options={"num_warps": 8},
        ),
        AotSpec(
            name="moe_dequant_rows_e4m3_bf16",
            fn=dequant_rows_kernel,
            signature={"q_ptr": "*fp8e4b8" if target == "gfx942" else "*fp8e4nv",
                       "s_ptr": "*fp32", "out_ptr": f"*{dt}", "N": "i32", "H": "i32",
                       "stride_q": "i64:16", "stride_out": "i64:16"},
            constexprs={"ROWS": 8, "BLOCK_H": 1024},
            options={"num_warps": 8},
        ),
    ]  # fmt: skip
