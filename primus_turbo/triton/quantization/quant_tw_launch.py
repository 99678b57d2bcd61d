"""Launcher of ``tw_quant_kernel`` (quant_tensorwise.py): tensorwise FP8, plain and dual.

``PRIMUS_TURBO_QUANT_TW`` picks the tensorwise path (with ``PRIMUS_TURBO_QUANT_IMPL=v3``):
* ``v3``: the session-4 kernels of quant_kernel.py / quant_kernel_v2.py (two launches, the
  cast pass walks the whole tensor backwards, so a tile is re-read by another program),
* ``own`` (default): two launches of ``tw_quant_kernel``; each program re-reads its OWN tiles
  in reverse order (same tiles, same program: the L2 lines it touched last).
H200 run 5.2 (graph time, 3 shapes, of copy): ``own`` 0.647 / 0.671 (plain / dual), ``v3``
0.605 / 0.616; the one-launch grid-barrier variant (``fused``, 0.612 / 0.616) was removed.
Run 6.2: ``own`` 0.635 / 0.655 at 8192x4096, 0.683 / 0.736 at 4096x4096, 0.593 / 0.606 at
16384x8192; a one-launch persistent variant holding tiles in registers (``persist``) was
removed too: wrong bits on the H200 and never faster (0.613 / 0.672 / 0.588 plain, duals
0.54-0.68).
Why tensorwise current scaling is bounded: the scale needs the amax of the WHOLE tensor
before the first value can be cast, so the input is read twice (amax pass, then cast pass)
while the copy it is compared with reads it once. With both reads from HBM the bound is
0.60 of copy (plain: 3 B per bf16 value counted, 5 B moved; dual 4 of 6 B: 0.67); ``own``
gets above it (0.63-0.68 of copy at 4096-8192 x 4096) because part of the cast pass's
second read comes from L2 (the tiles a program read last in the amax pass, read first);
at 16384x8192 (256 MB, five times the 50 MB L2) it is at the bound (0.593).
Knobs (all optional): ``PRIMUS_TURBO_QUANT_TW_BLOCK`` (flat tile, a power of two in
[1024, 32768], default 8192; 16384: 0.633), ``_TW_TILE`` (dual tile ``BMxBN``, powers of two
in [16, 256], default 128x128 on NVIDIA: 0.682 vs 0.671 for 64x128; 64x128 on AMD),
``_TW_WARPS`` (default 8),
``_TW_PER_SM`` (programs per SM/CU, default 4),
``_TW_CS`` (0/1, NVIDIA: streaming stores of the fp8 outputs, default 1),
``_TW_EVICT`` (``last``/``none``/``tail``, see ``_evict_amax``), ``_TW_L2_MB``,
``_TW_EVICT_CAST`` (``first``: the cast walk's loads ``evict_first``, default; ``none``).
"""

from __future__ import annotations

import functools
import os

import torch

from primus_turbo.pytorch.core.platform import num_compute_units, triton_interpret
from primus_turbo.triton.quantization.quant_launch import (
    _empty_like_t,
    _env_flag,
    _env_int,
    _fmax,
    _interp_fmt,
    _nvidia_sat,
    _u8,
)
from primus_turbo.triton.quantization.quant_tensorwise import (
    tw_delayed_guard_kernel,
    tw_delayed_kernel,
    tw_delayed_update_kernel,
    tw_quant_kernel,
)

TW_MODES = ("v3", "own")
_INTERP_PROGRAMS = 3  # interpreter grid of the two-launch path (programs run one by one)


def tw_mode() -> str:
    raw = os.environ.get("PRIMUS_TURBO_QUANT_TW", "").strip().lower() or "own"
    if raw not in TW_MODES:
        raise ValueError(
            f"primus_turbo: PRIMUS_TURBO_QUANT_TW expected one of {TW_MODES}, got {raw!r}"
        )
    return raw


def _pow2_env(var: str, default: int, lo: int, hi: int) -> int:
    v = _env_int(var, default)
    if v < lo or v > hi or v & (v - 1):
        raise ValueError(f"primus_turbo: {var} expected a power of two in [{lo}, {hi}], got {v}")
    return v


def _tile_env(nvidia: bool, var: str = "PRIMUS_TURBO_QUANT_TW_TILE") -> tuple[int, int]:
    """Dual tile: 128x128 on NVIDIA (H200 run 5.2; 64 registers, a 52 B spill in the amax walk
    on sm_90, still faster), 64x128 elsewhere (not measured; 128x128 spills SGPRs on gfx950)."""
    raw = os.environ.get(var, "").strip().lower() or ("128x128" if nvidia else "64x128")
    try:
        bm, bn = (int(v) for v in raw.split("x"))
    except ValueError:
        bm = bn = 0
    for v in (bm, bn):
        if v < 16 or v > 256 or v & (v - 1):
            raise ValueError(
                f"primus_turbo: {var} expected BMxBN, powers of two in [16, 256], got {raw!r}"
            )
    return bm, bn


@functools.cache
def _programs(ntiles: int, cap: int) -> int:
    """At most ``cap`` programs; the largest divisor of ``ntiles`` in [3/4 cap, cap] when there
    is one (every program then walks the same number of full tiles: no masks, no tail)."""
    if ntiles <= cap:
        return ntiles
    for p in range(cap, (3 * cap + 3) // 4 - 1, -1):
        if ntiles % p == 0:
            return p
    return cap


def _walk(m: int, n: int, dual: bool, bm: int, bn: int, block: int, cap: int):
    """``(ntiles, programs, even)`` of one tensorwise launch: ``bm x bn`` tiles for the dual
    cast, ``block``-element chunks otherwise; ``even`` when every program walks only full tiles
    and the same number of them."""
    if dual:
        ntiles = -(-m // bm) * -(-n // bn)
        full = m % bm == 0 and n % bn == 0
    else:
        ntiles = -(-(m * n) // block)
        full = (m * n) % block == 0
    p = _programs(ntiles, cap)
    return ntiles, p, full and ntiles % p == 0


def _shape_kw(dual: bool, block: int, bm: int, bn: int) -> dict:
    """The tile constexprs (the unused kind pinned to 16 so it compiles once)."""
    return dict(BLOCK=16 if dual else block, BM=bm if dual else 16, BN=bn if dual else 16)


def _maxnreg(nvidia: bool, per_sm: int, warps: int) -> dict:
    """NVIDIA register cap that keeps ``per_sm`` programs of ``warps`` warps resident."""
    return {"maxnreg": min(255, 65536 // (per_sm * warps * 32)) // 8 * 8} if nvidia else {}


def _choice(var: str, choices: tuple[str, ...], default: str) -> str:
    raw = os.environ.get(var, "").strip().lower() or default
    if raw not in choices:
        raise ValueError(f"primus_turbo: {var} expected one of {choices}, got {raw!r}")
    return raw


@functools.cache
def _l2_bytes(index) -> int:
    """The device's L2 size (NVIDIA: 50 MB on an H200); 0 where torch does not report it."""
    return int(getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 0)


def _evict_amax(x: torch.Tensor, ntiles: int, p: int, tile_bytes: int) -> tuple[int, int]:
    """``(EVA, ktail)`` from ``PRIMUS_TURBO_QUANT_TW_EVICT``: ``last`` (default: every amax
    load ``evict_last``), ``none`` or ``tail`` (``evict_last`` only for the last walk steps
    whose tiles fit in ``PRIMUS_TURBO_QUANT_TW_L2_MB`` MB, default 3/4 of the device's L2;
    ``evict_first`` before)."""
    mode = _choice("PRIMUS_TURBO_QUANT_TW_EVICT", ("last", "none", "tail"), "last")
    if mode != "tail":
        return (1 if mode == "last" else 0), 0
    dev_l2 = _l2_bytes(x.device.index) if x.device.type == "cuda" else 0
    mb = _env_int("PRIMUS_TURBO_QUANT_TW_L2_MB", max(1, dev_l2 * 3 // 4 >> 20))
    steps = (mb << 20) // max(1, p * tile_bytes)
    return 2, max(0, -(-ntiles // p) - steps)


def quant_tensorwise_tw(x: torch.Tensor, dtype: torch.dtype, dual: bool):
    """``(q, s)`` or ``(q, s, qt, s)`` through ``tw_quant_kernel``; ``x`` 2-D, non-empty."""
    m, n = x.shape
    xc = x if x.is_contiguous() else x.contiguous()
    q = torch.empty(x.shape, dtype=dtype, device=x.device)
    s = torch.empty((), dtype=torch.float32, device=x.device)
    qt = _empty_like_t(x, dtype) if dual else None
    interp = triton_interpret()
    nvidia = not interp and x.device.type == "cuda" and torch.version.hip is None
    warps = _env_int("PRIMUS_TURBO_QUANT_TW_WARPS", 8)
    bm, bn = _tile_env(nvidia)
    per_sm = _env_int("PRIMUS_TURBO_QUANT_TW_PER_SM", 4)
    if nvidia and per_sm * warps > 64:  # 2048 threads per SM
        raise ValueError(
            "primus_turbo: PRIMUS_TURBO_QUANT_TW_PER_SM x PRIMUS_TURBO_QUANT_TW_WARPS expected "
            f"<= 64, got {per_sm} x {warps}"
        )
    block = _pow2_env("PRIMUS_TURBO_QUANT_TW_BLOCK", 8192, 1024, 32768)
    numel = m * n
    cap = _INTERP_PROGRAMS if interp else per_sm * num_compute_units(x.device)
    ntiles, p, even = _walk(m, n, dual, bm, bn, block, cap)
    npb = max(2, 1 << (p - 1).bit_length())
    parts = torch.empty(p, dtype=torch.float32, device=x.device)
    extra = _maxnreg(nvidia, per_sm, warps)
    eva, ktail = _evict_amax(x, ntiles, p, (bm * bn if dual else block) * x.element_size())
    evc = _choice("PRIMUS_TURBO_QUANT_TW_EVICT_CAST", ("first", "none"), "first")
    args = (xc, _u8(q), _u8(qt if dual else q), s, parts, numel, m, n, xc.stride(0), p, ktail)
    kw = dict(
        **_shape_kw(dual, block, bm, bn), DUAL=dual,
        NPB=npb, FMAX=_fmax(dtype), FMT=_interp_fmt(dtype), SAT=_nvidia_sat(xc),
        EVEN=even, FAST=True,
        CS=nvidia and _env_flag("PRIMUS_TURBO_QUANT_TW_CS", True), EVA=eva,
        EVC="evict_first" if evc == "first" else "", num_warps=warps, **extra,
    )  # fmt: skip
    tw_quant_kernel[(p,)](*args, PHASE=1, **kw)
    tw_quant_kernel[(p,)](*args, PHASE=2, **kw)
    return (q, s, qt, s) if dual else (q, s)


def quant_tensorwise_delayed(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor,
                             amax: torch.Tensor, dual: bool, store: bool = True,
                             guard: int | None = None):  # fmt: skip
    """One-pass tensorwise cast with a GIVEN scale (``tw_delayed_kernel``): ``(q, sinv)`` or
    ``(q, sinv, qt, sinv)``; ``sinv`` a fresh 0-d ``1 / scale``. ``amax`` (fp32, 1 element,
    contiguous) becomes ``max(amax, amax(x))`` (finite values only). ``store=False``: only the
    amax, returns None. No host sync. Launch as the cast pass of ``quant_tensorwise_tw``
    (``P`` = ``_TW_PER_SM`` programs per SM walking their own tiles; ``_TW_BLOCK``, ``_TW_TILE``,
    ``_TW_WARPS``, ``_TW_CS``, ``_TW_EVICT_CAST`` apply; ``_TW_EVICT_CAST`` defaults to ``none``
    for the dual cast: H200 call 8.1 0.866 of copy vs 0.837 with ``first``) with its own
    ``_TWD_TILE`` (dual tile, default as ``_TW_TILE``: 128x128 on NVIDIA, 64x128 on AMD), 4
    programs per SM (3 for a dual tile of 128x128 or more on NVIDIA: the register cap 80
    instead of 64, where sm_90 spills 32 B); the dual cast reduces each tile's max to a scalar
    (``RED``). Call 8.1 losers removed: ``_TWD_PER_SM`` 2 (0.829) or 4 at 128x128 (0.823),
    dual 64x128 (0.798) and the tile-shaped running max (``_TWD_RED=0``, 0.816).
    ``guard`` (the scaler's margin, or None): then ``tw_delayed_guard_kernel`` follows on the
    same grid and re-casts the tensor with the recorded amax's scale if the given scale
    saturated it (see the kernel; a launch of early-returning programs otherwise)."""
    m, n = x.shape
    q = torch.empty(x.shape, dtype=dtype, device=x.device) if store else None
    qt = _empty_like_t(x, dtype) if dual and store else None
    sinv = torch.empty((), dtype=torch.float32, device=x.device) if store else None
    if m == 0 or n == 0:
        if store:
            torch.reciprocal(scale.reshape(()), out=sinv)
            return (q, sinv, qt, sinv) if dual else (q, sinv)
        return None
    xc = x if x.is_contiguous() else x.contiguous()
    interp = triton_interpret()
    nvidia = not interp and x.device.type == "cuda" and torch.version.hip is None
    warps = _env_int("PRIMUS_TURBO_QUANT_TW_WARPS", 8)
    bm, bn = _tile_env(nvidia, "PRIMUS_TURBO_QUANT_TWD_TILE")
    per_sm = 3 if nvidia and dual and bm * bn >= 16384 else 4
    block = _pow2_env("PRIMUS_TURBO_QUANT_TW_BLOCK", 8192, 1024, 32768)
    numel = m * n
    cap = _INTERP_PROGRAMS if interp else per_sm * num_compute_units(x.device)
    _, p, even = _walk(m, n, dual, bm, bn, block, cap)
    extra = _maxnreg(nvidia, per_sm, warps)
    evc = _choice(
        "PRIMUS_TURBO_QUANT_TW_EVICT_CAST", ("first", "none"), "none" if dual else "first"
    )
    cs = nvidia and _env_flag("PRIMUS_TURBO_QUANT_TW_CS", True)
    a32 = amax.view(torch.int32)
    dummy = _u8(q) if store else a32
    args = (xc, dummy, _u8(qt) if dual and store else dummy, scale, sinv if store else amax, a32,
            numel, m, n, xc.stride(0), p)  # fmt: skip
    from primus_turbo.pytorch.kernels.quantization.quant_twd_cuda import quant_twd_cuda

    if not quant_twd_cuda(xc, dtype, q, qt, scale, sinv, amax, dual, store):  # CUDA, same bits
        tw_delayed_kernel[(p,)](
            *args, **_shape_kw(dual, block, bm, bn),
            DUAL=dual, FMAX=_fmax(dtype), FMT=_interp_fmt(dtype), SAT=_nvidia_sat(xc),
            EVEN=even, FAST=True,
            CS=cs, EVC="evict_first" if evc == "first" else "", STORE=store,
            RED=dual, num_warps=warps, **extra,
        )  # fmt: skip
    if not store:
        return None
    if guard is not None:
        tw_delayed_guard_kernel[(p,)](
            *args[:5], amax, *args[6:], **_shape_kw(dual, block, bm, bn), DUAL=dual,
            FMAX=_fmax(dtype), MARGIN_MUL=2.0**-guard, FMT=_interp_fmt(dtype), SAT=_nvidia_sat(xc),
            EVEN=even, CS=cs, num_warps=warps, **extra,
        )  # fmt: skip
    return (q, sinv, qt, sinv) if dual else (q, sinv)


def delayed_update(history: torch.Tensor, scale: torch.Tensor, scale_inv: torch.Tensor,
                   fmax: float, most_recent: bool, margin: int) -> None:  # fmt: skip
    """In place, one launch: see ``tw_delayed_update_kernel`` (fp32 contiguous buffers)."""
    n = history.numel()
    block = max(16, 1 << (n - 1).bit_length())
    tw_delayed_update_kernel[(1,)](
        history, scale, scale_inv, n, FMAX=fmax, MARGIN_MUL=2.0**-margin,
        MOST_RECENT=most_recent, BLOCK=block, num_warps=4 if block <= 4096 else 8,
    )  # fmt: skip
