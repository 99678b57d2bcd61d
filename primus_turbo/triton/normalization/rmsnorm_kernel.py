"""RMSNorm in Triton, forward and backward, fp32 accumulation.

Math (``x [M, N]``, ``w [N]``; ``w`` is ``1 + gamma`` when zero-centered):
``rstd = 1 / sqrt(mean(x^2) + eps)``, ``y = x * rstd * w``;
``xhat = x * rstd``, ``dx = rstd * (w * dy - xhat * mean(xhat * w * dy))``,
``dw = sum_rows(dy * xhat)``.

Dtypes: x/y/dy/dx fp16/bf16/fp32 (one dtype); w/dw any float dtype; rstd fp32. Rows are addressed
by a row stride (last dim contiguous); row offsets are int64.

Grid mapping: forward, one program per ``ROWS`` rows, either the whole row in one ``BLOCK_N``
tile (``tile``: the row is read once into registers) or ``looped`` (Inductor's form of this
reduction): pass 1 walks the row in ``RBLOCK`` chunks summing squares (loads marked evict-last),
pass 2 re-reads the chunks (L2 hits, evict-first), scales and stores; few registers per thread,
so many programs per SM; or ``inductor``: the code shape torch.compile generates (one row per
program, the width a compile-time constant so the chunk loop unrolls or vanishes, the sum of
squares kept as a full ``[RBLOCK]`` fp32 vector and reduced after the loop, rstd stored before
pass 2, 16 warps at RBLOCK 8192). Which one: :func:`fwd_knobs` (env
``PRIMUS_TURBO_RMSNORM_TRITON_FWD*``, re-read after :func:`reload_env`). Backward: a persistent
grid of ``G`` programs (the device's SMs/CUs times a few) walks row blocks with stride ``G``;
each keeps its fp32 dw sums in registers and writes one partial row; ``dw_reduce_kernel`` then
sums the ``G`` partial rows in a fixed order, so dw is bitwise reproducible for a given device.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch
import triton
import triton.language as tl

from primus_turbo.pytorch.core.platform import is_rocm, num_compute_units, triton_interpret
from primus_turbo.triton.aot import AOT_TARGETS, AotSpec, triton_dtype_name

MAX_HIDDEN = 65536  # one tile per row (tile forward, backward); the looped forward has no limit
FWD_MODES = ("auto", "tile", "looped", "inductor")


@dataclasses.dataclass(frozen=True)
class FwdKnobs:
    """Forward kernel choice, from the environment (read once; :func:`reload_env` re-reads):

    - ``PRIMUS_TURBO_RMSNORM_TRITON_FWD``: ``auto`` (default: ``inductor`` at hidden 2048-8192,
      the fastest forward at every width measured in H200 run 5.3: 8192 4165 GB/s (compile
      4144), 7168 3866 (tile 3765), 4096 3629 (looped 3592), 2880 3334 (tile 3239);
      ``looped`` above 8192 and at multiples of 2048 from ``..._FWD_LOOPED_MIN_N`` (default
      4096), else ``tile``), ``tile``, ``looped`` or ``inductor`` (see the module doc;
      RBLOCK default the row up to 8192, 16 elements per lane, HINTS default 1 = Inductor's,
      ROWS/REVERSE ignored). Rows wider than ``MAX_HIDDEN`` always loop (``looped`` unless
      ``inductor``).
    - ``..._FWD_PER_THREAD`` (tile; a power of two 4..64, default 32): elements per thread, so
      num_warps = tile elements / (32 * it) (16 was the session-4 default: 16 warps at 8192).
    - ``..._FWD_RBLOCK`` (looped; a power of two 64..16384, default 0 = 4096 from hidden 8192,
      else 2048; capped at the row), ``..._FWD_ROWS`` (rows per program, a power of two 1..16,
      default 1), ``..._FWD_WARPS`` (power of two 1..32; default 0 = one 16-byte bf16 vector
      per lane: rows * RBLOCK / (8 * warp size), at most 16: 16 warps at RBLOCK 4096 on
      NVIDIA), ``..._FWD_STAGES`` (num_stages, 1..4, default 1), ``..._FWD_HINTS`` (bits,
      default -1: 3 looped, 1 inductor; 1: Inductor's loads, pass 1 evict-last, pass 2
      evict-first, the weight evict-last; 2: y stored evict-first; 0: no cache hints),
      ``..._FWD_REVERSE`` (1: pass 2 walks the chunks last to first; default 0). H200 run 5.2
      at 16384x8192 (compile 4157 GB/s): RBLOCK 2048/8 warps 3989, RBLOCK 4096+16 warps 4064,
      HINTS 3 4073.
    """

    mode: str = "auto"
    looped_min_n: int = 4096
    per_thread: int = 32
    rblock: int = 0
    rows: int = 1
    warps: int = 0
    stages: int = 1
    hints: int = -1  # per variant: 3 looped, 1 inductor
    reverse: bool = False


def _env_int(name: str, default: int, lo: int, hi: int, pow2: bool = False) -> int:
    v = os.environ.get(f"PRIMUS_TURBO_RMSNORM_TRITON_FWD_{name}", "").strip()
    n = int(v) if v.isdigit() else default
    if n < lo or n > hi or (pow2 and n & (n - 1)):
        return default
    return n


@functools.lru_cache(maxsize=1)
def fwd_knobs() -> FwdKnobs:
    d = FwdKnobs()
    mode = os.environ.get("PRIMUS_TURBO_RMSNORM_TRITON_FWD", "").strip().lower()
    return FwdKnobs(
        mode=mode if mode in FWD_MODES else d.mode,
        looped_min_n=_env_int("LOOPED_MIN_N", d.looped_min_n, 0, 1 << 30),
        per_thread=_env_int("PER_THREAD", d.per_thread, 4, 64, pow2=True),
        rblock=_env_int("RBLOCK", d.rblock, 64, 16384, pow2=True),
        rows=_env_int("ROWS", d.rows, 1, 16, pow2=True),
        warps=_env_int("WARPS", d.warps, 1, 32, pow2=True),
        stages=_env_int("STAGES", d.stages, 1, 4),
        hints=_env_int("HINTS", d.hints, 0, 3),
        reverse=_env_int("REVERSE", 0, 0, 1) == 1,
    )


def reload_env() -> None:
    """Re-read the ``PRIMUS_TURBO_RMSNORM_TRITON_FWD*`` variables at the next launch."""
    fwd_knobs.cache_clear()


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
def rmsnorm_fwd_looped_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    rstd_ptr,
    M,
    N,
    stride_x,
    stride_y,
    eps,
    RBLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_M: tl.constexpr,
    HINTS: tl.constexpr,
    REVERSE: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
):
    """Two passes over ``RBLOCK`` chunks of ``ROWS`` rows: sum of squares, then scale and store
    (the second pass reads the row back from L2). HINTS bits: 1 = Inductor's load hints (x
    evict-last in pass 1, evict-first in pass 2; w evict-last), 2 = y stored evict-first.
    REVERSE: pass 2 walks the chunks last to first (the most recently read first)."""
    LOAD1: tl.constexpr = "evict_last" if HINTS % 2 == 1 else ""
    LOAD2: tl.constexpr = "evict_first" if HINTS % 2 == 1 else ""
    STORE: tl.constexpr = "evict_first" if HINTS // 2 % 2 == 1 else ""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    rows64 = rows.to(tl.int64)
    xrow = x_ptr + rows64[:, None] * stride_x
    yrow = y_ptr + rows64[:, None] * stride_y
    r = tl.arange(0, RBLOCK)
    acc = tl.zeros([ROWS, RBLOCK], dtype=tl.float32)
    for start in range(0, N, RBLOCK):
        cols = start + r
        if EVEN_N and EVEN_M:
            x = tl.load(xrow + cols[None, :], eviction_policy=LOAD1)
        else:
            mask = rmask[:, None] & (cols < N)[None, :]
            x = tl.load(xrow + cols[None, :], mask=mask, other=0.0, eviction_policy=LOAD1)
        x = x.to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / N + eps)
    nchunks = tl.cdiv(N, RBLOCK)
    for i in range(0, nchunks):
        if REVERSE:
            cols = (nchunks - 1 - i) * RBLOCK + r
        else:
            cols = i * RBLOCK + r
        if EVEN_N:
            w = tl.load(w_ptr + cols, eviction_policy=LOAD1)
        else:
            w = tl.load(w_ptr + cols, mask=cols < N, other=0.0, eviction_policy=LOAD1)
        w = w.to(tl.float32)
        if ZERO_CENTERED:
            w = w + 1.0
        if EVEN_N and EVEN_M:
            x = tl.load(xrow + cols[None, :], eviction_policy=LOAD2)
            y = x.to(tl.float32) * rstd[:, None] * w[None, :]
            tl.store(yrow + cols[None, :], y.to(y_ptr.dtype.element_ty), eviction_policy=STORE)
        else:
            mask = rmask[:, None] & (cols < N)[None, :]
            x = tl.load(xrow + cols[None, :], mask=mask, other=0.0, eviction_policy=LOAD2)
            y = x.to(tl.float32) * rstd[:, None] * w[None, :]
            tl.store(
                yrow + cols[None, :],
                y.to(y_ptr.dtype.element_ty),
                mask=mask,
                eviction_policy=STORE,
            )
    tl.store(rstd_ptr + rows, rstd, mask=rmask)


@triton.jit
def rmsnorm_fwd_inductor_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    rstd_ptr,
    stride_x,
    stride_y,
    eps,
    N: tl.constexpr,
    RBLOCK: tl.constexpr,
    HINTS: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
):
    """torch.compile's kernel for this reduction, written out (Inductor's XBLOCK 1): one row per
    program (the grid is exactly M, so no row mask), the width ``N`` a compile-time constant
    (a row of one chunk runs each loop once), masked chunk loads, the sum of squares as a full
    ``[1, RBLOCK]`` fp32 vector reduced after the loop, rsqrt, rstd stored after a barrier and
    before pass 2. HINTS bits as in the looped kernel (1 = Inductor's load hints)."""
    LOAD1: tl.constexpr = "evict_last" if HINTS % 2 == 1 else ""
    LOAD2: tl.constexpr = "evict_first" if HINTS % 2 == 1 else ""
    STORE: tl.constexpr = "evict_first" if HINTS // 2 % 2 == 1 else ""
    row = tl.program_id(0).to(tl.int64)
    xrow = x_ptr + row * stride_x
    yrow = y_ptr + row * stride_y
    rbase = tl.arange(0, RBLOCK)[None, :]
    acc = tl.full([1, RBLOCK], 0, tl.float32)
    for off in tl.range(0, N, RBLOCK):
        cols = off + rbase
        cmask = cols < N
        x = tl.load(xrow + cols, cmask, eviction_policy=LOAD1, other=0.0).to(tl.float32)
        acc = tl.where(cmask, acc + x * x, acc)
    ss = tl.sum(acc, 1)[:, None]
    rstd = tl.rsqrt(ss / N + eps)
    tl.debug_barrier()
    tl.store(rstd_ptr + row + tl.zeros([1, 1], dtype=tl.int64), rstd)
    for off in tl.range(0, N, RBLOCK):
        cols = off + rbase
        cmask = cols < N
        x = tl.load(xrow + cols, cmask, eviction_policy=LOAD2, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, cmask, eviction_policy=LOAD1, other=0.0).to(tl.float32)
        if ZERO_CENTERED:
            w = w + 1.0
        y = x * rstd * w
        tl.store(yrow + cols, y.to(y_ptr.dtype.element_ty), cmask, eviction_policy=STORE)


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
    per_thread = 8 if backward else fwd_knobs().per_thread  # bwd: x, dy and the dw sums
    num_warps = max(1, min(16, elems // (32 * per_thread)))
    return RmsNormConfig(block_n, rows, num_warps)


@dataclasses.dataclass(frozen=True)
class LoopedConfig:
    rblock: int
    rows: int
    num_warps: int
    num_stages: int
    hints: int
    reverse: bool


def fwd_variant(n: int) -> str:
    """``tile``, ``looped`` or ``inductor``: the forward kernel for hidden size ``n`` under
    :func:`fwd_knobs`."""
    k = fwd_knobs()
    if k.mode == "inductor":
        return "inductor"
    if n > MAX_HIDDEN:
        return "looped"
    if k.mode != "auto":
        return k.mode
    if 2048 <= n <= 8192:  # H200 run 5.3: best forward at 2880, 4096, 7168 and 8192
        return "inductor"
    return "looped" if n > 8192 or (n >= k.looped_min_n and n % 2048 == 0) else "tile"


def select_looped_config(n: int, warp_size: int = 32) -> LoopedConfig:
    """Looped forward config for hidden ``n`` (see :class:`FwdKnobs`): by default RBLOCK 4096
    from hidden 8192 (else 2048) and 8 elements (one 16-byte bf16 vector) per lane."""
    k = fwd_knobs()
    rblock = k.rblock or (4096 if n >= 8192 else 2048)
    rblock = max(16, min(rblock, triton.next_power_of_2(max(n, 1))))
    warps = k.warps or max(1, min(16, k.rows * rblock // (8 * warp_size)))
    hints = 3 if k.hints < 0 else k.hints
    return LoopedConfig(rblock, k.rows, warps, k.stages, hints, k.reverse)


def select_inductor_config(n: int, warp_size: int = 32) -> LoopedConfig:
    """``inductor`` forward config: RBLOCK the whole row up to 8192 (Inductor's R0_BLOCK at
    16384x8192), 16 elements per lane (its 16 warps there), one row per program, Inductor's
    cache hints (HINTS 1) unless set."""
    k = fwd_knobs()
    rblock = max(16, min(k.rblock or 8192, triton.next_power_of_2(max(n, 1))))
    warps = k.warps or max(1, min(16, rblock // (16 * warp_size)))
    return LoopedConfig(rblock, 1, warps, k.stages, 1 if k.hints < 0 else k.hints, False)


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
    variant = fwd_variant(n)
    ws = 64 if is_rocm() and not triton_interpret() else 32
    if variant == "inductor":
        ic = select_inductor_config(n, ws)
        rmsnorm_fwd_inductor_kernel[(m,)](
            x, w, y, rstd, x.stride(0), y.stride(0), eps,
            N=n, RBLOCK=ic.rblock, HINTS=ic.hints, ZERO_CENTERED=zero_centered,
            num_warps=ic.num_warps, num_stages=ic.num_stages,
        )  # fmt: skip
        return y, rstd
    if variant == "looped":
        lc = select_looped_config(n, ws)
        rmsnorm_fwd_looped_kernel[(triton.cdiv(m, lc.rows),)](
            x, w, y, rstd, m, n, x.stride(0), y.stride(0), eps,
            RBLOCK=lc.rblock, ROWS=lc.rows, EVEN_N=n % lc.rblock == 0, EVEN_M=m % lc.rows == 0,
            HINTS=lc.hints, REVERSE=lc.reverse, ZERO_CENTERED=zero_centered,
            num_warps=lc.num_warps, num_stages=lc.num_stages,
        )  # fmt: skip
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
    """bf16 forward (tile, looped, inductor) and backward at the benchmark hidden sizes (2880,
    8192; looped also 4096), and the reduce."""
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
    ws = AOT_TARGETS[target][2]
    fwd_sig = {"x_ptr": f"*{t}", "w_ptr": f"*{t}", "y_ptr": f"*{t}", "rstd_ptr": "*fp32",
               "M": "i32", "N": "i32:16", "stride_x": "i32:16", "stride_y": "i32:16",
               "eps": "fp32"}  # fmt: skip
    # looped forward: the default (RBLOCK 4096) at 8192, 4096 (RBLOCK 2048), 2880 (masked
    # tail), a 2-row variant with the reversed second pass
    for n, rblock, rows in ((8192, 4096, 1), (4096, 2048, 1), (2880, 1024, 1), (8192, 4096, 2)):
        extra = rows > 1
        warps = max(1, min(16, rows * rblock // (8 * ws)))
        specs.append(
            AotSpec(
                name=f"rmsnorm_fwd_looped_{t}_n{n}_r{rblock}x{rows}",
                fn=rmsnorm_fwd_looped_kernel,
                signature=fwd_sig,
                constexprs={
                    "RBLOCK": rblock,
                    "ROWS": rows,
                    "EVEN_N": n % rblock == 0,
                    "EVEN_M": True,
                    "HINTS": 3,
                    "REVERSE": extra,
                    "ZERO_CENTERED": False,
                },  # fmt: skip
                options={"num_warps": warps, "num_stages": 1},
                default=False,
            )
        )
    # the Inductor-shaped forward at 8192 (the default there: one 8192 chunk, 16 warps of 32,
    # Inductor's hints) and 2880 (masked; y evict-first)
    for n in (8192, 2880):
        rblock = min(8192, triton.next_power_of_2(n))
        specs.append(
            AotSpec(
                name=f"rmsnorm_fwd_inductor_{t}_n{n}",
                fn=rmsnorm_fwd_inductor_kernel,
                signature={
                    "x_ptr": f"*{t}",
                    "w_ptr": f"*{t}",
                    "y_ptr": f"*{t}",
                    "rstd_ptr": "*fp32",
                    "stride_x": "i32:16",
                    "stride_y": "i32:16",
                    "eps": "fp32",
                },  # fmt: skip
                constexprs={
                    "N": n,
                    "RBLOCK": rblock,
                    "HINTS": 1 if n == 8192 else 3,
                    "ZERO_CENTERED": False,
                },  # fmt: skip
                options={"num_warps": max(1, min(16, rblock // (16 * ws))), "num_stages": 1},
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
