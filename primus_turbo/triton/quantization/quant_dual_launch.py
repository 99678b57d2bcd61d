"""Launchers of ``quant_sliced_kernel`` (quant_dual.py) and ``quant_words_kernel``
(quant_words.py), selected in quant_launch by env vars.

* ``PRIMUS_TURBO_QUANT_WORDS`` (session 6): unset / ``1`` = the word-sliced kernel for the
  MX rows and MX dual recipes of bf16 inputs with an even ``N`` (see ``words_on`` /
  ``launch_words``; H200 run 6.2, 8192x4096, x of copy: MX rows 0.866 vs sliced 0.846, MX dual
  0.779 (64x256 tile) vs 0.720), ``0`` = the routing below (A/B only), or a comma list of
  ``mx_rows`` / ``mx_dual``. The 1x128 dual stays on the v3 tile kernel (words 0.58, v3 0.695).
  Other inputs (fp16 / fp32, odd ``N``, unaligned) take the routing below.

Defaults below are the H200 winners of run 5.2 (graph device time, 3 shapes, x of copy):
MX dual 0.721 sliced vs 0.496 v3, MX rows 0.817 vs 0.783; the 1x128 dual 0.645 vs 0.696 for v3
(stays on the tile kernel); persistent 0.67 / 0.80 (MX), 0.39-0.60 (1x128): opt-in only.

* ``PRIMUS_TURBO_QUANT_SLICED``: unset or ``mx`` (default): the MX dual recipe takes the sliced
  kernel, the 1x128 dual does not; ``1``: both (row-contiguous input, v2/v3); ``0``: neither.
* ``PRIMUS_TURBO_QUANT_SLICED_MX``: the MX row-only recipe; unset / ``1`` (default) sliced,
  ``0`` the v3 4-D kernel.
* ``PRIMUS_TURBO_QUANT_SLICED_BN``: MX tile width (64, 128, 256 or 512; default 256); warps
  follow (one 16-byte vector per thread and slice; the 1x128 tile is always 128 x 128).
* ``PRIMUS_TURBO_QUANT_SLICED_BM``: MX tile height, 32 (default) or 64 (two 32-row column
  groups per tile in the dual recipe: 64-byte transposed row segments instead of 32).
* ``PRIMUS_TURBO_QUANT_SLICED_IE8``: ``1``: E8M0 scales with integer ops only (the scale's
  fp32 bits built from the biased exponent, no ``exp2``; bitwise the same); default ``0``.
* ``PRIMUS_TURBO_QUANT_SLICED_OFF32``: ``1``: 32-bit element offsets for the input and both
  fp8 outputs where they fit (sm_90 AOT: MX rows 93 vs 100 registers; MX dual 114 vs 115,
  and with ``MAXNREG=96`` 94 without spilling, 5 programs/SM instead of 4); default ``0``.
* ``PRIMUS_TURBO_QUANT_SLICED_PERSIST``: ``0`` (default) one tile per program; ``P >= 1``:
  ``P`` persistent programs per SM/CU, each prefetching its next tile into registers (measured
  slower on the H200; kept opt-in).
* ``PRIMUS_TURBO_QUANT_WARPS`` / ``_MAXNREG`` (or one recipe's ``_WARPS_SLICED_MX_DUAL``,
  ``_MAXNREG_SLICED_MX_ROWS``, ``.._SLICED_BLOCK_DUAL``) / ``_RCP`` (NVIDIA: 1x128 scales
  through ``rcp.approx``, same bits, see ``_scale_rcp``) / ``_EVEN`` apply. sm_90 AOT at the
  128-register cap: the persistent 1x128 tile spills with 8 warps (~250 B), so it takes 16
  (none spill; ``MAXNREG=168`` with 8 warps neither); the persistent MX tiles do not spill
  when even.
"""

from __future__ import annotations

import os

import torch

from primus_turbo.pytorch.core.platform import num_compute_units, triton_interpret
from primus_turbo.triton.quantization.quant_dual import (
    SLICED_CONFIGS,
    quant_sliced_kernel,
    sliced_warps,
)
from primus_turbo.triton.quantization.quant_words import (
    WORDS_CONFIGS,
    WORDS_MAXNREG,
    quant_words_kernel,
    words_warps,
)


def _flag(var: str) -> bool:
    raw = os.environ.get(var, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"primus_turbo: {var} expected 0 or 1, got {raw!r}")
    return raw == "1"


def sliced_on(name: str) -> bool:
    """Whether recipe ``name`` (``block_dual``, ``mx_dual``, ``mx_rows``) takes the sliced
    kernel (v1 never does)."""
    from primus_turbo.triton.quantization.quant_launch import quant_impl_version

    if name == "mx_rows":
        raw = os.environ.get("PRIMUS_TURBO_QUANT_SLICED_MX", "").strip()
        on = _flag("PRIMUS_TURBO_QUANT_SLICED_MX") or raw == ""
    else:
        raw = os.environ.get("PRIMUS_TURBO_QUANT_SLICED", "").strip().lower()
        if raw not in ("", "mx", "0", "1"):
            raise ValueError(
                f"primus_turbo: PRIMUS_TURBO_QUANT_SLICED expected 0, 1 or mx, got {raw!r}"
            )
        on = raw == "1" or raw in ("", "mx") and name == "mx_dual"
    return on and quant_impl_version() != "v1"


def _int_env(var: str, default: int, least: int) -> int:
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        raise ValueError(f"primus_turbo: {var} expected an integer >= {least}, got {raw!r}")
    return value


def launch_sliced(x, q, s, qt, st, name, dtype, s_strides, st_strides):
    """Quantize ``x`` into ``q``/``s`` (and ``qt``/``st`` for the dual recipes) with
    ``SLICED_CONFIGS[name]``."""
    from primus_turbo.triton.quantization import quant_launch as ql

    mode, bm, bn, dual, _ = SLICED_CONFIGS[name]
    m, n = x.shape
    if m == 0 or n == 0:
        return
    if name != "block_dual":
        bn = _int_env("PRIMUS_TURBO_QUANT_SLICED_BN", bn, 64)
        if bn not in (64, 128, 256, 512):
            raise ValueError(
                f"primus_turbo: PRIMUS_TURBO_QUANT_SLICED_BN expected 64, 128, 256 or 512, got {bn}"
            )
        bm = _int_env("PRIMUS_TURBO_QUANT_SLICED_BM", bm, 32)
        if bm not in (32, 64):
            raise ValueError(
                f"primus_turbo: PRIMUS_TURBO_QUANT_SLICED_BM expected 32 or 64, got {bm}"
            )
    interp = triton_interpret()
    gpu = not interp and x.device.type == "cuda"
    nvidia = gpu and torch.version.hip is None
    lanes = 64 if gpu and torch.version.hip is not None else 32
    per_sm = _int_env("PRIMUS_TURBO_QUANT_SLICED_PERSIST", 0, 0)
    warps = sliced_warps(bm, bn, lanes, persist=per_sm > 0, mode=mode)
    warps = ql._knob("WARPS", f"sliced_{name}", warps)
    extra = {"maxnreg": ql._knob("MAXNREG", f"sliced_{name}", ql.MAXNREG)} if nvidia else {}
    ntiles = ql._cdiv(m, bm) * ql._cdiv(n, bn)
    grid = ntiles
    if per_sm:
        grid = min(ntiles, per_sm * num_compute_units(x.device if not interp else None))
    even = ql._env_flag("PRIMUS_TURBO_QUANT_EVEN", True) and m % bm == 0 and n % bn == 0
    # OFF32: int32 element offsets for x / q / qt when every one (edge tiles included) fits
    reach = max(x.stride(0), q.stride(0)) * (m + bm) + (qt.stride(0) * (n + bn) if dual else 0)
    off32 = _flag("PRIMUS_TURBO_QUANT_SLICED_OFF32") and reach + m + n + bm + bn < 2**31
    quant_sliced_kernel[(grid,)](
        x, ql._u8(q), s, ql._u8(qt if dual else q), st if dual else s,
        m, n, x.stride(0), q.stride(0), qt.stride(0) if dual else 0, *s_strides, *st_strides,
        BM=bm, BN=bn, MODE=mode, DUAL=dual, FMAX=ql._fmax(dtype), EMAX=ql._EMAX[dtype],
        FMT=ql._interp_fmt(dtype), SAT=nvidia and ql._hw_satfinite(x.device.index), EVEN=even,
        RCP=ql._env_flag("PRIMUS_TURBO_QUANT_RCP", False) and nvidia, PERSIST=per_sm > 0,
        IE8=_flag("PRIMUS_TURBO_QUANT_SLICED_IE8"), I64=not off32,
        num_warps=warps, **extra,
    )  # fmt: skip


def words_on(name: str, x: torch.Tensor) -> bool:
    """Whether MX recipe ``name`` (``mx_rows``, ``mx_dual``) takes ``quant_words_kernel``
    (quant_words.py): ``PRIMUS_TURBO_QUANT_WORDS`` unset / ``1`` both, ``0`` none, or a comma
    list; v2/v3 only, and only where word loads are exact (a bf16 row-contiguous input with an
    even ``N`` and row stride, 4-byte aligned)."""
    from primus_turbo.triton.quantization.quant_launch import quant_impl_version

    raw = os.environ.get("PRIMUS_TURBO_QUANT_WORDS", "").strip().lower()
    if raw in ("", "1"):
        names = tuple(WORDS_CONFIGS)
    elif raw == "0":
        names = ()
    else:
        names = tuple(v.strip() for v in raw.split(","))
        bad = [v for v in names if v not in WORDS_CONFIGS]
        if bad:
            raise ValueError(
                "primus_turbo: PRIMUS_TURBO_QUANT_WORDS expected 0, 1 or a comma list of "
                f"{', '.join(WORDS_CONFIGS)}, got {raw!r}"
            )
    return (
        name in names
        and quant_impl_version() != "v1"
        and x.dtype == torch.bfloat16
        and x.stride(1) == 1
        and x.shape[1] % 2 == 0
        and x.stride(0) % 2 == 0
        and x.data_ptr() % 4 == 0
    )


def launch_words(x, q, s, qt, st, name, dtype, s_strides, st_strides):
    """Quantize ``x`` into ``q``/``s`` (and ``qt``/``st``) with ``WORDS_CONFIGS[name]``;
    ``PRIMUS_TURBO_QUANT_WARPS`` / ``_MAXNREG`` (or ``_MAXNREG_WORDS_<NAME>``), ``_EVEN``,
    ``PRIMUS_TURBO_QUANT_WORDS_OFF32`` (``1``: 32-bit element offsets where they fit; run 6.2
    MX dual 32x256: 0.733 vs 0.725 of copy, to re-measure on the 64x256 tile) and
    ``PRIMUS_TURBO_QUANT_WORDS_TILE=BMxBN`` (BM 32, 64 or 128, BN 64..512, at most 32768
    elements; default 64x256 dual, 32x256 rows; warps follow) apply."""
    from primus_turbo.triton.quantization import quant_launch as ql

    bm, bn, dual = WORDS_CONFIGS[name]
    m, n = x.shape
    if m == 0 or n == 0:
        return
    raw = os.environ.get("PRIMUS_TURBO_QUANT_WORDS_TILE", "").strip().lower()
    if raw:
        try:
            bm, bn = (int(v) for v in raw.split("x"))
        except ValueError:
            bm = bn = 0
        if bm not in (32, 64, 128) or bn not in (64, 128, 256, 512) or bm * bn > 32768:
            raise ValueError(
                "primus_turbo: PRIMUS_TURBO_QUANT_WORDS_TILE expected BMxBN with BM 32, 64 or "
                f"128, BN 64, 128, 256 or 512 and BM * BN <= 32768, got {raw!r}"
            )
    interp = triton_interpret()
    gpu = not interp and x.device.type == "cuda"
    nvidia = gpu and torch.version.hip is None
    lanes = 64 if gpu and torch.version.hip is not None else 32
    warps = ql._knob("WARPS", f"words_{name}", words_warps(bm, bn, lanes))
    nreg = ql._knob("MAXNREG", f"words_{name}", WORDS_MAXNREG[name])
    extra = {"maxnreg": nreg} if nvidia else {}
    even = ql._env_flag("PRIMUS_TURBO_QUANT_EVEN", True) and m % bm == 0 and n % bn == 0
    ql._env_flag("PRIMUS_TURBO_QUANT_FAST", True)  # validated only: the key amax needs no filter
    reach = max(x.stride(0), q.stride(0)) * (m + bm) + (qt.stride(0) * (n + bn) if dual else 0)
    off32 = _flag("PRIMUS_TURBO_QUANT_WORDS_OFF32") and reach + m + n + bm + bn < 2**31
    grid_m, grid_n = ql._cdiv(m, bm), ql._cdiv(n, bn)
    grid2d = grid_m <= 65535
    quant_words_kernel[(grid_n, grid_m) if grid2d else (grid_m * grid_n,)](
        x, ql._u8(q), s, ql._u8(qt if dual else q), st if dual else s,
        m, n, x.stride(0) // 2, q.stride(0), qt.stride(0) if dual else 0, *s_strides,
        *st_strides, BM=bm, BN=bn, DUAL=dual, FMAX=ql._fmax(dtype), EMAX=ql._EMAX[dtype],
        FMT=ql._interp_fmt(dtype), SAT=nvidia and ql._hw_satfinite(x.device.index), EVEN=even,
        I64=not off32, GRID2D=grid2d, num_warps=warps, **extra,
    )  # fmt: skip
