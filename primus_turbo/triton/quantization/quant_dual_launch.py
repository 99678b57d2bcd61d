"""Launchers of ``quant_words_kernel`` (quant_words.py) and ``quant_sliced_kernel``
(quant_dual.py) for the MX rows / MX dual recipes, selected in quant_launch by env vars.

* ``PRIMUS_TURBO_QUANT_WORDS`` (session 6): unset / ``1`` = the word-sliced kernel for the
  MX rows and MX dual recipes of bf16 inputs with an even ``N`` (see ``words_on`` /
  ``launch_words``; H200 run 6.2, 8192x4096, x of copy: MX rows 0.866 vs sliced 0.846, MX dual
  0.779 (64x256 tile) vs 0.720; run 6.3, 8192x4096 / 6144x4096: MX dual 128x128 tile, now the
  default, 0.791 / 0.793, 64x256 0.785 / 0.779), ``0`` = the sliced kernel (A/B only), or a
  comma list of ``mx_rows`` / ``mx_dual``. Other row-contiguous inputs (fp16 / fp32, odd ``N``,
  unaligned) take the sliced kernel. The 1x128 dual stays on the v3 tile kernel (run 6.2: words
  0.58, v3 0.695; run 5.2: sliced 0.645, v3 0.696): its words and sliced paths were removed.
* ``PRIMUS_TURBO_QUANT_SLICED_MX`` (rows) / ``PRIMUS_TURBO_QUANT_SLICED`` (dual): ``0`` sends
  the inputs the words kernel does not take to the v3 tile kernels instead of the sliced one
  (default ``1``; ``mx`` is accepted for the dual one, as before). Run 5.2: MX dual sliced
  0.721 vs v3 0.496, MX rows 0.817 vs 0.783.
* ``PRIMUS_TURBO_QUANT_WARPS`` / ``_MAXNREG`` (or one recipe's ``_MAXNREG_WORDS_MX_DUAL``,
  ``_WARPS_SLICED_MX_ROWS``, ...) / ``_EVEN`` apply to both kernels.
"""

from __future__ import annotations

import os

import torch

from primus_turbo.pytorch.core.platform import triton_interpret
from primus_turbo.triton.quantization.quant_common import slice_warps
from primus_turbo.triton.quantization.quant_dual import SLICED_CONFIGS, quant_sliced_kernel
from primus_turbo.triton.quantization.quant_words import (
    WORDS_CONFIGS,
    WORDS_MAXNREG,
    quant_words_kernel,
)


def _flag(var: str) -> bool:
    raw = os.environ.get(var, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"primus_turbo: {var} expected 0 or 1, got {raw!r}")
    return raw == "1"


def sliced_on(name: str) -> bool:
    """Whether MX recipe ``name`` (``mx_dual``, ``mx_rows``) takes the sliced kernel when the
    words kernel does not (v1 never does)."""
    from primus_turbo.triton.quantization.quant_launch import quant_impl_version

    if name == "mx_rows":
        on = os.environ.get("PRIMUS_TURBO_QUANT_SLICED_MX", "").strip() == "" or _flag(
            "PRIMUS_TURBO_QUANT_SLICED_MX"
        )
    else:
        raw = os.environ.get("PRIMUS_TURBO_QUANT_SLICED", "").strip().lower()
        if raw not in ("", "mx", "0", "1"):
            raise ValueError(
                f"primus_turbo: PRIMUS_TURBO_QUANT_SLICED expected 0, 1 or mx, got {raw!r}"
            )
        on = raw != "0"
    return on and quant_impl_version() != "v1"


def launch_sliced(x, q, s, qt, st, name, dtype, s_strides, st_strides):
    """Quantize ``x`` into ``q``/``s`` (and ``qt``/``st`` for the dual recipe) with
    ``SLICED_CONFIGS[name]``."""
    from primus_turbo.triton.quantization import quant_launch as ql

    bm, bn, dual, _ = SLICED_CONFIGS[name]
    m, n = x.shape
    if m == 0 or n == 0:
        return
    interp = triton_interpret()
    gpu = not interp and x.device.type == "cuda"
    nvidia = gpu and torch.version.hip is None
    lanes = 64 if gpu and torch.version.hip is not None else 32
    warps = ql._knob("WARPS", f"sliced_{name}", slice_warps(bm, bn, lanes))
    extra = {"maxnreg": ql._knob("MAXNREG", f"sliced_{name}", ql.MAXNREG)} if nvidia else {}
    even = ql._env_flag("PRIMUS_TURBO_QUANT_EVEN", True) and m % bm == 0 and n % bn == 0
    quant_sliced_kernel[(ql._cdiv(m, bm) * ql._cdiv(n, bn),)](
        x, ql._u8(q), s, ql._u8(qt if dual else q), st if dual else s,
        m, n, x.stride(0), q.stride(0), qt.stride(0) if dual else 0, *s_strides, *st_strides,
        BM=bm, BN=bn, DUAL=dual, FMAX=ql._fmax(dtype), EMAX=ql._EMAX[dtype],
        FMT=ql._interp_fmt(dtype), SAT=nvidia and ql._hw_satfinite(x.device.index), EVEN=even,
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
    ``PRIMUS_TURBO_QUANT_WARPS`` / ``_MAXNREG`` (or ``_MAXNREG_WORDS_<NAME>``), ``_EVEN`` and
    ``PRIMUS_TURBO_QUANT_WORDS_TILE=BMxBN`` (A/B: BM 32, 64 or 128, BN 64..512, at most 16384
    elements; default 128x128 dual, 32x256 rows; warps follow) apply. Every offset is 64-bit
    (run 6.3, MX dual 64x256: 32-bit offsets 0.780 / 0.776 vs 0.785 / 0.779 of copy: the
    OFF32 knob was removed); tiles over 16384 elements (16 warps) are refused (128x256:
    0.767 / 0.750)."""
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
        if bm not in (32, 64, 128) or bn not in (64, 128, 256, 512) or bm * bn > 16384:
            raise ValueError(
                "primus_turbo: PRIMUS_TURBO_QUANT_WORDS_TILE expected BMxBN with BM 32, 64 or "
                f"128, BN 64, 128, 256 or 512 and BM * BN <= 16384, got {raw!r}"
            )
    interp = triton_interpret()
    gpu = not interp and x.device.type == "cuda"
    nvidia = gpu and torch.version.hip is None
    lanes = 64 if gpu and torch.version.hip is not None else 32
    warps = ql._knob("WARPS", f"words_{name}", slice_warps(bm, bn, lanes))
    nreg = ql._knob("MAXNREG", f"words_{name}", WORDS_MAXNREG[name])
    extra = {"maxnreg": nreg} if nvidia else {}
    even = ql._env_flag("PRIMUS_TURBO_QUANT_EVEN", True) and m % bm == 0 and n % bn == 0
    ql._env_flag("PRIMUS_TURBO_QUANT_FAST", True)  # validated only: the key amax needs no filter
    grid_m, grid_n = ql._cdiv(m, bm), ql._cdiv(n, bn)
    grid2d = grid_m <= 65535
    quant_words_kernel[(grid_n, grid_m) if grid2d else (grid_m * grid_n,)](
        x, ql._u8(q), s, ql._u8(qt if dual else q), st if dual else s,
        m, n, x.stride(0) // 2, q.stride(0), qt.stride(0) if dual else 0, *s_strides,
        *st_strides, BM=bm, BN=bn, DUAL=dual, FMAX=ql._fmax(dtype), EMAX=ql._EMAX[dtype],
        FMT=ql._interp_fmt(dtype), SAT=nvidia and ql._hw_satfinite(x.device.index), EVEN=even,
        GRID2D=grid2d, num_warps=warps, **extra,
    )  # fmt: skip
