"""RMSNorm in Triton, forward and backward, fp32 accumulation.

Math (``x [M, N]``, ``w [N]``; ``w`` is ``1 + gamma`` when zero-centered):
``rstd = 1 / sqrt(mean(x^2) + eps)``, ``y = x * rstd * w``;
``xhat = x * rstd``, ``dx = rstd * (w * dy - xhat * mean(xhat * w * dy))``,
``dw = sum_rows(dy * xhat)``.

Dtypes: x/y/dy/dx fp16/bf16/fp32 (one dtype); w/dw any float dtype; rstd fp32. Rows are addressed
by a row stride (last dim contiguous); row offsets are int64.

Grid mapping: forward, one program per ``ROWS`` rows, the whole row in one ``BLOCK_N`` tile (the
row is read once). Backward: a persistent grid of ``G`` programs (the device's SMs/CUs times a
few) walks row blocks with stride ``G``; each keeps its fp32 dw sums in registers and writes one
partial row; ``dw_reduce_kernel`` then sums the ``G`` partial rows in a fixed order, so dw is
bitwise reproducible for a given device.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl

from primus_turbo.pytorch.core.platform import num_compute_units, triton_interpret
from primus_turbo.triton.aot import AOT_TARGETS, AotSpec, triton_dtype_name

MAX_HIDDEN = 65536  # one tile per row; larger rows go to another backend


def _env_per_thread(default: int) -> int:
    """PRIMUS_TURBO_RMSNORM_TRITON_FWD_PER_THREAD (read once at import; a power of two 4..64):
    elements per thread of the forward kernel, so num_warps = tile elements / (32 * it). Default
    16 (16 warps at hidden 8192); 32 gives 8 warps of 4 x 16-byte bf16 loads per thread, like
    Inductor's one-pass kernel and the C++ tiles plan."""
    v = os.environ.get("PRIMUS_TURBO_RMSNORM_TRITON_FWD_PER_THREAD", "")
    n = int(v) if v.isdigit() else default
    return n if 4 <= n <= 64 and n & (n - 1) == 0 else default


FWD_PER_THREAD = _env_per_thread(16)


@triton.jit
def rmsnorm_fwd_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    rstd_ptr,
    M,
    N,
    stride_x,
    stride_y,
    eps,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    rows64 = rows.to(tl.int64)
    # w first (its latency overlaps x's); x is streamed once: evict it first, keep w in cache.
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    x = tl.load(
        x_ptr + rows64[:, None] * stride_x + cols[None, :],
        mask=mask,
        other=0.0,
        eviction_policy="evict_first",
    )
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    if ZERO_CENTERED:
        w = w + 1.0
    y = x * rstd[:, None] * w[None, :]
    tl.store(
        y_ptr + rows64[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask
    )
    tl.store(rstd_ptr + rows, rstd, mask=rmask)


@triton.jit
def rmsnorm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    dx_ptr,
    part_ptr,
    M,
    N,
    stride_dy,
    stride_x,
    stride_dx,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        w = tl.where(cmask, w + 1.0, 0.0)
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    for start in range(pid * ROWS, M, nprog * ROWS):
        rows = start + tl.arange(0, ROWS)
        rmask = rows < M
        mask = rmask[:, None] & cmask[None, :]
        rows64 = rows.to(tl.int64)
        x = tl.load(
            x_ptr + rows64[:, None] * stride_x + cols[None, :],
            mask=mask,
            other=0.0,
            eviction_policy="evict_first",
        )
        dy = tl.load(
            dy_ptr + rows64[:, None] * stride_dy + cols[None, :],
            mask=mask,
            other=0.0,
            eviction_policy="evict_first",
        )
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        xhat = x.to(tl.float32) * rstd[:, None]
        dy = dy.to(tl.float32)
        wdy = dy * w[None, :]
        c = tl.sum(xhat * wdy, axis=1) / N
        dx = (wdy - xhat * c[:, None]) * rstd[:, None]
        tl.store(
            dx_ptr + rows64[:, None] * stride_dx + cols[None, :],
            dx.to(dx_ptr.dtype.element_ty),
            mask=mask,
        )
        acc += dy * xhat
    tl.store(part_ptr + pid.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=cmask)


@triton.jit
def dw_reduce_kernel(part_ptr, dw_ptr, G, N, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < N
    acc = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    for g0 in range(0, G, BLOCK_G):  # fixed order: deterministic
        g = g0 + tl.arange(0, BLOCK_G)
        m = (g < G)[:, None] & cmask[None, :]
        acc += tl.load(part_ptr + g.to(tl.int64)[:, None] * N + cols[None, :], mask=m, other=0.0)
    tl.store(dw_ptr + cols, tl.sum(acc, axis=0).to(dw_ptr.dtype.element_ty), mask=cmask)


@dataclasses.dataclass(frozen=True)
class RmsNormConfig:
    block_n: int
    rows: int
    num_warps: int


def select_config(n: int, backward: bool = False) -> RmsNormConfig:
    """Tile for hidden size ``n``: the whole row in one power-of-two tile; several rows per
    program while the tile stays small (forward: up to 8K elements, so hidden 2880/4096 take 2
    rows per program and 16 warps, twice the loads in flight per program; backward: 4K, it also
    holds dy and the dw sums); ~16 (forward) / 8 (backward) elements per thread."""
    block_n = triton.next_power_of_2(max(n, 1))
    rows = max(1, min(16, (4096 if backward else 8192) // block_n))
    elems = block_n * rows
    per_thread = 8 if backward else FWD_PER_THREAD  # backward holds x, dy and the dw sums
    num_warps = max(1, min(16, elems // (32 * per_thread)))
    return RmsNormConfig(block_n, rows, num_warps)


def _bwd_programs(m: int, rows: int, device: torch.device) -> int:
    blocks = triton.cdiv(m, rows)
    if triton_interpret() or device.type != "cuda":
        return max(1, min(blocks, 4))
    return max(1, min(blocks, 4 * num_compute_units(device)))


def rmsnorm_fwd_triton(
    x: torch.Tensor, w: torch.Tensor, eps: float, zero_centered: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, N]`` (last dim contiguous), ``w [N]`` -> ``(y [M, N] of x.dtype, rstd [M] fp32)``."""
    m, n = x.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0 or n == 0:
        return y, rstd
    cfg = select_config(n)
    rmsnorm_fwd_kernel[(triton.cdiv(m, cfg.rows),)](
        x, w, y, rstd, m, n, x.stride(0), y.stride(0), eps,
        BLOCK_N=cfg.block_n, ROWS=cfg.rows, ZERO_CENTERED=zero_centered,
        num_warps=cfg.num_warps,
    )  # fmt: skip
    return y, rstd


def rmsnorm_bwd_triton(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor, zero_centered: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dy, x [M, N]``, ``w [N]``, ``rstd [M]`` -> ``(dx [M, N], dw [N] of w.dtype)``."""
    m, n = x.shape
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    dw = torch.empty((n,), dtype=w.dtype, device=x.device)
    if n == 0:
        return dx, dw
    if m == 0:
        return dx, dw.zero_()
    cfg = select_config(n, backward=True)
    g = _bwd_programs(m, cfg.rows, x.device)
    part = torch.empty((g, n), dtype=torch.float32, device=x.device)
    rmsnorm_bwd_kernel[(g,)](
        dy, x, w, rstd, dx, part, m, n, dy.stride(0), x.stride(0), dx.stride(0),
        BLOCK_N=cfg.block_n, ROWS=cfg.rows, ZERO_CENTERED=zero_centered,
        num_warps=cfg.num_warps,
    )  # fmt: skip
    block_c = 64
    dw_reduce_kernel[(triton.cdiv(n, block_c),)](part, dw, g, n, BLOCK_G=32, BLOCK_C=block_c)
    return dx, dw


# ---- ahead-of-time check -------------------------------------------------------------------


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 forward and backward at the benchmark hidden sizes (2880, 8192), and the reduce."""
    assert target in AOT_TARGETS, target
    specs = []
    t = triton_dtype_name(torch.bfloat16)
    for n in (2880, 8192):
        fcfg, bcfg = select_config(n), select_config(n, backward=True)
        specs.append(
            AotSpec(
                name=f"rmsnorm_fwd_{t}_n{n}",
                fn=rmsnorm_fwd_kernel,
                signature={
                    "x_ptr": f"*{t}",
                    "w_ptr": f"*{t}",
                    "y_ptr": f"*{t}",
                    "rstd_ptr": "*fp32",
                    "M": "i32",
                    "N": "i32:16",
                    "stride_x": "i32:16",
                    "stride_y": "i32:16",
                    "eps": "fp32",
                },  # fmt: skip
                constexprs={"BLOCK_N": fcfg.block_n, "ROWS": fcfg.rows, "ZERO_CENTERED": False},
                options={"num_warps": fcfg.num_warps, "num_stages": 1},
                default=n == 8192,
            )
        )
        specs.append(
            AotSpec(
                name=f"rmsnorm_bwd_{t}_n{n}",
                fn=rmsnorm_bwd_kernel,
                signature={
                    "dy_ptr": f"*{t}",
                    "x_ptr": f"*{t}",
                    "w_ptr": f"*{t}",
                    "rstd_ptr": "*fp32",
                    "dx_ptr": f"*{t}",
                    "part_ptr": "*fp32",
                    "M": "i32",
                    "N": "i32:16",
                    "stride_dy": "i32:16",
                    "stride_x": "i32:16",
                    "stride_dx": "i32:16",
                },  # fmt: skip
                constexprs={"BLOCK_N": bcfg.block_n, "ROWS": bcfg.rows, "ZERO_CENTERED": False},
                options={"num_warps": bcfg.num_warps, "num_stages": 1},
                default=n == 8192,
            )
        )
    specs.append(
        AotSpec(
            name=f"rmsnorm_dw_reduce_{t}",
            fn=dw_reduce_kernel,
            signature={"part_ptr": "*fp32", "dw_ptr": f"*{t}", "G": "i32", "N": "i32:16"},
            constexprs={"BLOCK_G": 32, "BLOCK_C": 64},
            options={"num_warps": 4, "num_stages": 1},
        )
    )
    return specs
