"""MoE permute / unpermute row kernels (gather, weighted gather-sum, and its backward).

Maps (built on device by the op layer, never read on the host):
- ``row_map: [T, K]`` int64: permuted row of token ``t``'s ``k``-th copy, ``-1`` when dropped.
- ``src_map: [N]`` int64: ``t * K + k`` feeding permuted row ``n``, ``-1`` for padding rows.

Kernels (gather and reduce: a ``[ROWS, BLOCK_H]`` tile per program, ``BLOCK_H`` up to 1024
columns so each thread moves 16-byte vectors, ~16 KiB per tile; the backward: one program per
token; row offsets are int64 so ``rows * hidden`` past 2**31 is safe; no atomics anywhere, so
every kernel is bitwise deterministic):
- ``gather_rows_kernel``: ``out[n] = x[src_map[n] // K]`` (zeros for padding rows). Permute
  forward, and unpermute's data gradient when no probs are applied.
- ``reduce_rows_kernel``: ``out[t] = sum_k w[t, k] * y[row_map[t, k]]`` in fp32 with
  ``w = probs[row_map[t, k]]`` (or 1). Unpermute forward, and permute's backward.
- ``reduce_rows_bwd_kernel``: for each copy, ``dy[row] = w * dout[t]`` and
  ``dw = <dout[t], y[row]>``: unpermute's backward with probs (programs ``T..T+N`` zero the
  rows no copy maps to, instead of a memset pass).
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
    H,
    stride_dout,
    stride_y,
    stride_dy,
    K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    if pid >= T:
        # programs T.. cover the permuted rows: zero those no token copy maps to (padding,
        # dropped copies), so dy/dw need no separate memset pass
        r = pid - T
        if tl.load(src_ptr + r) < 0:
            for h0 in range(0, H, BLOCK_H):
                cols = h0 + tl.arange(0, BLOCK_H)
                zero = tl.zeros([BLOCK_H], dtype=dy_ptr.dtype.element_ty)
                tl.store(dy_ptr + r * stride_dy + cols, zero, mask=cols < H)
            tl.store(dw_ptr + r, 0.0)
        return
    tok = pid
    g_row = dout_ptr + tok * stride_dout
    for k in tl.static_range(K):
        r = tl.load(map_ptr + tok * K + k)
        if r >= 0:
            w = tl.load(w_ptr + r).to(tl.float32)
            acc = tl.zeros([BLOCK_H], dtype=tl.float32)
            for h0 in range(0, H, BLOCK_H):
                cols = h0 + tl.arange(0, BLOCK_H)
                m = cols < H
                g = tl.load(g_row + cols, mask=m, other=0.0).to(tl.float32)
                y = tl.load(y_ptr + r * stride_y + cols, mask=m, other=0.0).to(tl.float32)
                tl.store(dy_ptr + r * stride_dy + cols, (g * w).to(dy_ptr.dtype.element_ty), mask=m)
                acc += g * y
            tl.store(dw_ptr + r, tl.sum(acc, axis=0))


def _block_h(h: int, cap: int = 8192) -> tuple[int, int]:
    """A whole row (up to ``cap``) per iteration, ~8-16 elements per thread; at most 16 warps
    (an AMD "warp" is a 64-wide wavefront; a workgroup holds at most 1024 threads)."""
    block = min(max(triton.next_power_of_2(h), 64), cap)
    return block, min(max(block // 256, 4), 16)


def _tile(h: int, elem: int, rows_total: int) -> tuple[int, int, int]:
    """``(ROWS, BLOCK_H, num_warps)`` of the row-copy kernels: columns in blocks of up to 1024
    (16-byte vectors: 8 bf16 per thread, 128-256 threads), rows stacked to ~16 KiB per tile."""
    block = min(max(triton.next_power_of_2(h), 16), 1024 if elem <= 2 else 512)
    rows = max(1, min(16384 // (block * elem), 16))
    rows = min(rows, triton.next_power_of_2(max(rows_total, 1)))
    warps = 8 if rows * block * elem >= 16384 else 4
    return rows, block, warps


def gather_rows_triton(x: torch.Tensor, src_map: torch.Tensor, k: int) -> torch.Tensor:
    """``x: [T, H]``, ``src_map: [N]`` -> ``[N, H]`` (padding rows zero)."""
    n, h = src_map.shape[0], x.shape[1]
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
    block, warps = _block_h(h)
    reduce_rows_bwd_kernel[(t + n,)](
        dout, y, row_map, w, src_map, dy, dw, t, h, dout.stride(0), y.stride(0), dy.stride(0),
        K=k, BLOCK_H=block, num_warps=warps,
    )  # fmt: skip
    return dy, dw


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
                       "dw_ptr": "*fp32", "T": "i32", "H": "i32",
                       "stride_dout": "i64", "stride_y": "i64", "stride_dy": "i64"},
            constexprs={"K": 8, "BLOCK_H": 8192},
            options={"num_warps": 16},
        ),
    ]  # fmt: skip
