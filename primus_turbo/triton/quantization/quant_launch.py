"""Launchers of the fused quantization kernels (2-D inputs, any strides).

Output conventions (shared with reference/quantization.py and ops.quantization):
* ``q`` is contiguous in ``x``'s shape; ``qt`` (dual) is contiguous in ``x.T``'s shape.
* tensorwise scale: 0-d fp32; rowwise: ``[M, 1]`` (axis=-1) or ``[1, N]`` (axis=0);
  1 x b blocks: ``[M, ceil(N/b)]`` stored outer-dim-major (stride ``(1, M)``, the layout
  ``torch._scaled_mm`` wants); b x b tiles: ``[ceil(M/b), ceil(N/b)]`` contiguous;
  MX: ``[M, N/32]`` uint8 (E8M0, biased exponent) stored outer-dim-major (stride ``(1, M)``).
* the dual copy's scales are those of ``x.T`` in the same conventions.
"""

from __future__ import annotations

import functools
import os

import torch

from primus_turbo.pytorch.core.platform import num_compute_units, triton_interpret
from primus_turbo.triton.quantization.quant_dual_launch import (
    launch_sliced,
    launch_words,
    sliced_on,
    words_on,
)
from primus_turbo.triton.quantization.quant_kernel import (
    COLS,
    GIVEN,
    MX,
    ROWS,
    TILE,
    amax_partial_kernel,
    cast_flat_kernel,
    quant_mxfp4_kernel,
    quant_rows_kernel,
    quant_tile_kernel,
)
from primus_turbo.triton.quantization.quant_kernel_v2 import (
    MAXNREG,
    MX4,
    V2_CONFIGS,
    V3_CONFIGS,
    V3_MAXNREG,
    V3_NO_EVEN,
    V3_NO_FAST,
    V3_STAGES,
    quant_tile_v2_kernel,
)

_EMAX = {
    torch.float8_e4m3fn: 8,
    torch.float8_e4m3fnuz: 8,
    torch.float8_e5m2: 15,
    torch.float8_e5m2fnuz: 15,
}


_FMT = {  # (mantissa bits, exponent bias, NaN bit pattern) for the interpreter's encoder
    torch.float8_e4m3fn: (3, 7, 0x7F),
    torch.float8_e4m3fnuz: (3, 8, 0x80),
    torch.float8_e5m2: (2, 15, 0x7F),
    torch.float8_e5m2fnuz: (2, 16, 0x80),
}


def _interp_fmt(dtype: torch.dtype) -> tuple[int, int, int, int]:
    return (1, *_FMT[dtype]) if triton_interpret() else (0, 0, 0, 0)


def _u8(t):
    """Under the interpreter fp8 outputs are written as raw bytes (see ``_fp8_bits``)."""
    return t.view(torch.uint8) if t is not None and triton_interpret() else t


def _fmax(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _tile(x, q, s, qt, st, amax, bm, bn, mode, dual, dtype, s_strides, st_strides, warps=4, np_=1):
    m, n = x.shape
    if m == 0 or n == 0:
        return
    qt_strides = (qt.stride(1), qt.stride(0)) if dual else (0, 0)
    grid = (_cdiv(m, bm), _cdiv(n, bn))
    quant_tile_kernel[grid](
        x, _u8(q), s, _u8(qt if dual else q), st if dual else s, amax if amax is not None else s,
        m, n, x.stride(0), x.stride(1), q.stride(0), q.stride(1), *s_strides,
        *qt_strides, *st_strides,
        BM=bm, BN=bn, MODE=mode, DUAL=dual, FMAX=_fmax(dtype), EMAX=_EMAX[dtype],
        FMT=_interp_fmt(dtype), NP=np_,
        num_warps=warps,
    )  # fmt: skip


def quant_impl_version() -> str:
    """``PRIMUS_TURBO_QUANT_IMPL``: ``v3`` (default) is ``v2`` plus the v3 kernel flags:
    ``FAST`` amax (plain ``|x|``, the inf/NaN filter only for a tile/row whose amax is not
    finite), ``EVEN`` (no masks when the shape is a multiple of the tile) and, for rowwise and
    the tensorwise cast, ``SAT`` (NVIDIA satfinite conversion, no clamp); same results.
    ``v2`` routes the blockwise 1x128 dual, 128x128 and MX recipes of row-contiguous inputs to
    ``quant_tile_v2_kernel``; ``v1`` keeps every recipe on ``quant_tile_kernel`` (for A/B
    runs). ``PRIMUS_TURBO_QUANT_STAGES``, ``PRIMUS_TURBO_QUANT_WARPS`` and
    ``PRIMUS_TURBO_QUANT_MAXNREG`` (NVIDIA register cap, default 128; v3: ``V3_MAXNREG`` per
    config, 80 for the 128x128 tile) override the v2/v3 stages / warps / cap of every config,
    ``PRIMUS_TURBO_QUANT_<KNOB>_<CONFIG>`` (e.g. ``_MAXNREG_BLOCK_DUAL``, ``_WARPS_TILE``) of
    one config (it wins over the global one); ``PRIMUS_TURBO_QUANT_FAST`` / ``_EVEN`` (0/1)
    force the FAST / EVEN flags of the tile kernels (default: v3 per config, see
    ``V3_NO_FAST`` / ``V3_NO_EVEN``; EVEN still needs a shape that is a multiple of the
    tile)."""
    v = os.environ.get("PRIMUS_TURBO_QUANT_IMPL", "v3").strip().lower()
    if v not in ("v1", "v2", "v3"):
        raise ValueError(f"PRIMUS_TURBO_QUANT_IMPL must be v1, v2 or v3, got {v!r}")
    return v


def _v3() -> bool:
    return quant_impl_version() == "v3"


def _nvidia_sat(x: torch.Tensor) -> bool:
    """The NVIDIA satfinite conversion may replace the clamp (compiled kernels only)."""
    return (
        not triton_interpret()
        and x.device.type == "cuda"
        and torch.version.hip is None
        and _hw_satfinite(x.device.index)
    )


def _env_int(var: str, default: int) -> int:
    """A positive integer override from ``var`` (unset or empty: ``default``)."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return int(default)
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"primus_turbo: {var} expected a positive integer, got {raw!r}")
    return value


def _env_flag(var: str, default: bool) -> bool:
    """A 0/1 override from ``var`` (unset or empty: ``default``)."""
    raw = os.environ.get(var, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"primus_turbo: {var} expected 0 or 1, got {raw!r}")
    return raw == "1" if raw else bool(default)


def _use_v2(x: torch.Tensor) -> bool:
    return quant_impl_version() != "v1" and x.stride(1) == 1


@functools.cache
def _hw_satfinite(index) -> bool:
    """NVIDIA sm_89+: Triton converts fp32 -> fp8 with ``cvt.rn.satfinite`` (checked in the
    sm_90 PTX for e4m3 and e5m2), so the kernels may skip their clamp."""
    return torch.cuda.get_device_capability(index) >= (8, 9)


# configs whose tile is not the scale block (their tile may be overridden)
_FREE_TILES = ("mx_dual", "mx_rows", "mx4_dual", "mx4_rows", "given_dual")


def _config(name: str):
    """``V2_CONFIGS[name]``; for the MX and tensorwise-dual configs (whose tile shape is free)
    ``PRIMUS_TURBO_QUANT_TILE_<NAME>=BMxBN`` (e.g. ``PRIMUS_TURBO_QUANT_TILE_MX_DUAL=64x64``)
    overrides the tile: powers of two, multiples of 32 for MX, at most 256 x 256."""
    mode, bm, bn, dual, warps, stages = {**V2_CONFIGS, **V3_CONFIGS}[name]
    if name not in _FREE_TILES:
        return mode, bm, bn, dual, warps, stages
    var = f"PRIMUS_TURBO_QUANT_TILE_{name.upper()}"
    raw = os.environ.get(var, "").strip().lower()
    if raw:
        try:
            bm, bn = (int(v) for v in raw.split("x"))
        except ValueError:
            bm = bn = 0
        least = 32 if mode == MX else 16
        for v in (bm, bn):
            if v < least or v > 256 or v & (v - 1):
                raise ValueError(
                    f"primus_turbo: {var} expected BMxBN, powers of two in [{least}, 256], "
                    f"got {raw!r}"
                )
    return mode, bm, bn, dual, warps, stages


def _knob(knob: str, name: str, default: int) -> int:
    """``PRIMUS_TURBO_QUANT_<KNOB>_<NAME>`` (one config, e.g. ``_MAXNREG_BLOCK_DUAL``), else
    ``PRIMUS_TURBO_QUANT_<KNOB>`` (every config), else ``default``."""
    return _env_int(f"PRIMUS_TURBO_QUANT_{knob}_{name.upper()}",
                    _env_int(f"PRIMUS_TURBO_QUANT_{knob}", default))  # fmt: skip


def _tile_v2(x, q, s, qt, st, name, dtype, s_strides, st_strides, np_=1):
    """Launch ``quant_tile_v2_kernel`` with ``V2_CONFIGS[name]`` (see quant_kernel_v2)."""
    mode, bm, bn, dual, warps, stages = _config(name)
    v3 = _v3()
    if v3:
        stages = V3_STAGES.get(name, stages)
    interp = triton_interpret()
    nvidia = not interp and x.device.type == "cuda" and torch.version.hip is None
    stages = _knob("STAGES", name, stages if nvidia or interp else 1)
    if mode == MX4:  # one tile per program, always (no persistent loop)
        stages = 1
    warps = _knob("WARPS", name, warps)
    maxnreg = _knob("MAXNREG", name, V3_MAXNREG.get(name, MAXNREG) if v3 else MAXNREG)
    m, n = x.shape
    if m == 0 or n == 0:
        return
    ntiles = _cdiv(m, bm) * _cdiv(n, bn)
    grid = ntiles
    if stages > 1:  # persistent: the programs that fit at once (registers capped at MAXNREG)
        per_sm = max(1, 65536 // (maxnreg * 32 * warps)) if nvidia else 2
        grid = min(ntiles, per_sm * num_compute_units(x.device if not interp else None))
    extra = {"maxnreg": maxnreg} if nvidia else {}
    sat = nvidia and _hw_satfinite(x.device.index)
    fast = _env_flag("PRIMUS_TURBO_QUANT_FAST", v3 and name not in V3_NO_FAST)
    even = _env_flag("PRIMUS_TURBO_QUANT_EVEN", v3 and name not in V3_NO_EVEN)
    even = even and m % bm == 0 and n % bn == 0
    quant_tile_v2_kernel[(grid,)](
        x, _u8(q), s, _u8(qt if dual else q), st if st is not None else s,
        m, n, x.stride(0), q.stride(0), qt.stride(0) if dual else 0, *s_strides, *st_strides,
        BM=bm, BN=bn, MODE=mode, DUAL=dual, FMAX=_fmax(dtype), EMAX=_EMAX[dtype],
        FMT=_interp_fmt(dtype), STAGES=stages, SAT=sat, NP=np_,
        FAST=fast, EVEN=even, num_warps=warps, **extra,
    )  # fmt: skip


def _empty_like_t(x: torch.Tensor, dtype) -> torch.Tensor:
    return torch.empty((x.shape[1], x.shape[0]), dtype=dtype, device=x.device)


_FLAT_BLOCK = 8192  # tensorwise tile: 8 warps x 32 lanes x 32 values (four 16-byte bf16 loads)
_MAX_PARTS = 1024  # tensorwise programs per pass: a power of two


@functools.cache
def _resident_parts(device_type: str, index) -> int:
    """The largest power of two <= 4 programs (of 8 warps) per SM/CU: every program of the
    grid-stride passes is resident at once (512 on an H200, 1024 on an MI300X), so no second
    partial wave makes a tail."""
    cus = num_compute_units(torch.device(device_type, index) if device_type == "cuda" else None)
    return 1 << max(0, (4 * cus).bit_length() - 1)


def _parts(x: torch.Tensor) -> int:
    """Programs of the tensorwise passes: a power of two, at most one per tile."""
    tiles = max(1, _cdiv(x.numel(), _FLAT_BLOCK))
    cap = min(_MAX_PARTS, _resident_parts(x.device.type, x.device.index))
    return min(cap, 1 << (tiles - 1).bit_length())


def quant_tensorwise(x: torch.Tensor, dtype: torch.dtype, dual: bool = False):
    """``(q, s)`` or ``(q, s, qt, s)`` in two launches and no host sync: pass 1 writes ``NP``
    partial maxima (one per program, no zero-init), pass 2 reduces them per program and casts
    (flat and in reverse tile order for ``q`` alone; 2-D tiles transposed in registers with
    ``dual``). Traffic: the input is read twice (the second read partly from L2) and ``q``
    written once -- 5 bytes per bf16 element (6 with ``dual``), vs 4 for a copy."""
    m, n = x.shape
    if m and n and _v3():  # PRIMUS_TURBO_QUANT_TW: own (default) / v3 (below)
        from primus_turbo.triton.quantization import quant_tw_launch as tw

        if tw.tw_mode() != "v3":
            return tw.quant_tensorwise_tw(x, dtype, dual)
    q = torch.empty(x.shape, dtype=dtype, device=x.device)
    s = torch.empty((), dtype=torch.float32, device=x.device)
    qt = _empty_like_t(x, dtype) if dual else None
    if m == 0 or n == 0:
        s.fill_(1.0 / (_fmax(dtype) / 1e-12))
        return (q, s, qt, s) if dual else (q, s)
    xc = x if x.is_contiguous() else x.contiguous()
    numel = xc.numel()
    np_ = _parts(xc)
    parts = torch.empty(np_, dtype=torch.float32, device=x.device)
    v3 = _v3()
    even = v3 and numel % _FLAT_BLOCK == 0
    amax_partial_kernel[(np_,)](
        xc, parts, numel, BLOCK=_FLAT_BLOCK, NP=np_, FAST=v3, EVEN=even, num_warps=8
    )
    if dual and _use_v2(xc):
        _tile_v2(xc, q, s, qt, parts, "given_dual", dtype, (0, 0), (0, 0), np_)
        return q, s, qt, s
    if dual:
        _tile(xc, q, s, qt, s, parts, 64, 128, GIVEN, True, dtype, (0, 0), (0, 0), 4, np_)
        return q, s, qt, s
    cast_flat_kernel[(np_,)](
        xc, _u8(q), s, parts, numel, BLOCK=_FLAT_BLOCK, NP=np_, FMAX=_fmax(dtype),
        FMT=_interp_fmt(dtype), SAT=v3 and _nvidia_sat(xc), EVEN=even, num_warps=8,
    )  # fmt: skip
    return q, s


_ROW_IN_REGS = 16384  # rowwise rows up to this length are read once and held in registers


def quant_rowwise(x: torch.Tensor, dtype: torch.dtype, axis: int):
    """One scale per row (axis=-1/1) or per column (axis=0) of any length."""
    m, n = x.shape
    src = x if axis in (-1, 1) else x.t()
    q = torch.empty(x.shape, dtype=dtype, device=x.device)
    qv = q if axis in (-1, 1) else q.t()
    s = torch.empty(src.shape[0], dtype=torch.float32, device=x.device)
    rows, cols = src.shape
    if rows and cols:
        contiguous_rows = src.stride(1) == 1
        row = max(16, 1 << (cols - 1).bit_length())
        one_pass = contiguous_rows and row <= _ROW_IN_REGS
        if one_pass:  # the whole row in registers: one read; ~8K values per program
            bm, bn = max(1, min(64, 8192 // row)), row
            warps = 16 if bm * bn > 8192 else 8
        else:
            bm, bn = (4, 1024) if contiguous_rows else (64, 64)
            bn, warps = min(bn, row), 4
        v3 = one_pass and _v3()  # v3 flags of the one-pass path (see quant_rows_kernel)
        quant_rows_kernel[(_cdiv(rows, bm),)](
            src, _u8(qv), s, rows, cols, src.stride(0), src.stride(1), qv.stride(0), qv.stride(1),
            1, BM=bm, BN=bn, FMAX=_fmax(dtype), FMT=_interp_fmt(dtype), ONE_PASS=one_pass,
            SAT=v3 and _nvidia_sat(x), FAST=v3, EVEN=v3 and cols == bn and rows % bm == 0,
            num_warps=warps,
        )  # fmt: skip
    return q, (s.view(m, 1) if axis in (-1, 1) else s.view(1, n))


def _outer_major(rows: int, cols: int, device) -> torch.Tensor:
    return torch.empty((cols, rows), dtype=torch.float32, device=device).t()


def _cuda_on(x: torch.Tensor, dtype) -> bool:
    """NVIDIA: the 1x128 dual of ``x`` takes the CUDA cast-transpose (quant_cuda.py; the default,
    ``PRIMUS_TURBO_QUANT_CUDA=0`` forces Triton)."""
    if x.device.type != "cuda" or torch.version.hip is not None:
        return False
    from primus_turbo.pytorch.kernels.quantization.quant_cuda import cuda_dual_on

    return cuda_dual_on(x, dtype)


def _cuda_dual(x: torch.Tensor, dtype):
    from primus_turbo.pytorch.kernels.quantization.quant_cuda import quant_dual_cuda

    return quant_dual_cuda(x, dtype, _fmax(dtype))


def quant_blockwise(x: torch.Tensor, dtype: torch.dtype, block: int, axis, dual: bool = False):
    """1 x block blocks along ``axis`` (axis=-1/1: along N; axis=0: along M) or block x block
    tiles (``axis=None``). ``dual`` (axis=-1/1 or None) also returns ``x.T`` quantized the same
    way in one pass: ``(q, s, qt, st)``."""
    m, n = x.shape
    dev = x.device
    quant_impl_version()  # a bad PRIMUS_TURBO_QUANT_IMPL raises whichever kernel runs
    if dual and block == 128 and axis in (-1, 1) and _cuda_on(x, dtype):
        return _cuda_dual(x, dtype)  # NVIDIA: CUDA cast-transpose (PRIMUS_TURBO_QUANT_CUDA=0: off)
    q = torch.empty(x.shape, dtype=dtype, device=dev)
    if axis is None:
        s = torch.empty((_cdiv(m, block), _cdiv(n, block)), dtype=torch.float32, device=dev)
        qt = _empty_like_t(x, dtype) if dual else None
        st = s.t() if dual else None  # same tiles, transposed: written once
        if block == 128 and _use_v2(x):
            name = "tile_dual" if dual else "tile"
            _tile_v2(x, q, s, qt, s, name, dtype, s.stride(), (0, 0))
            return (q, s, qt, st) if dual else (q, s)
        _tile(x, q, s, qt, s, None, block, block, TILE, dual, dtype, s.stride(), (0, 0), 8)
        return (q, s, qt, st) if dual else (q, s)
    if axis == 0 and not dual:
        s = torch.empty((_cdiv(m, block), n), dtype=torch.float32, device=dev)
        _tile(x, q, s, None, None, None, block, 64, COLS, False, dtype, s.stride(), (0, 0))
        return q, s
    if axis not in (-1, 1):
        raise ValueError(f"quant_blockwise: dual needs axis -1/1 or None, got {axis}")
    s = _outer_major(m, _cdiv(n, block), dev)
    if not dual:
        _tile(x, q, s, None, None, None, 32, block, ROWS, False, dtype, s.stride(), (0, 0))
        return q, s
    qt = _empty_like_t(x, dtype)
    st = _outer_major(n, _cdiv(m, block), dev)  # scales of x.T: [N, ceil(M/b)]
    st_strides = (st.stride(1), st.stride(0))  # the kernel indexes (m-block, n)
    if block == 128 and _use_v2(x):
        _tile_v2(x, q, s, qt, st, "block_dual", dtype, s.stride(), st_strides)
        return q, s, qt, st
    _tile(x, q, s, qt, st, None, block, block, ROWS, True, dtype, s.stride(), st_strides, 8)
    return q, s, qt, st


# MX tiles (BM, BN, warps): several 32-blocks per program in both directions (a 32x32 tile per
# program was ~0.32x of copy on the H200); multiples of 32, BM a multiple of 32 for the dual copy
_MX_TILE = (32, 128, 4)
_MX_TILE_DUAL = (64, 64, 4)


def _mx4d(dual: bool) -> bool:
    """v3: ``PRIMUS_TURBO_QUANT_MX4D`` unset -> the 4-D MX kernel for the row-only recipe
    (8 SASS instructions per element on sm_90 vs ~12 for the reshaped tile) and the reshaped
    tile for the dual one (its 4-D form reduces the 32-row groups across threads: ~40 vs ~25);
    ``1``: 4-D for both; ``0``: for neither."""
    raw = os.environ.get("PRIMUS_TURBO_QUANT_MX4D", "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"primus_turbo: PRIMUS_TURBO_QUANT_MX4D expected 0 or 1, got {raw!r}")
    return raw == "1" if raw else not dual


def _mx_scales(rows: int, cols: int, device) -> torch.Tensor:
    """E8M0 bytes ``[rows, cols]`` stored outer-dim-major (stride ``(1, rows)``): a tile's scale
    stores are runs along ``rows``. Row-major scales cost the CUDA MX dual kernel 10% (session 10,
    call 10.1: 0.815 vs 0.903 of copy) and the Triton word kernel 11% (0.785 vs 0.871)."""
    return torch.empty((cols, rows), dtype=torch.uint8, device=device).t()


def quant_mx(x: torch.Tensor, dtype: torch.dtype, dual: bool = False, block: int = 32):
    """MXFP8: E8M0 scales per 32 along N (and, with ``dual``, of ``x.T`` per 32 along M)."""
    if dual and block == 32 and x.device.type == "cuda" and torch.version.hip is None:
        from primus_turbo.pytorch.kernels.quantization import quant_cuda

        if quant_cuda.cuda_mx_dual_on(x, dtype):  # PRIMUS_TURBO_QUANT_CUDA_MX=0: Triton
            return quant_cuda.quant_dual_mx_cuda(x, dtype)
    m, n = x.shape
    dev = x.device
    q = torch.empty(x.shape, dtype=dtype, device=dev)
    s = _mx_scales(m, n // block, dev)
    qt = _empty_like_t(x, dtype) if dual else None
    st = _mx_scales(n, m // block, dev) if dual else None
    st_strides = (st.stride(1), st.stride(0)) if dual else (0, 0)
    if words_on("mx_dual" if dual else "mx_rows", x):  # quant_dual_launch / quant_words
        launch_words(x, q, s, qt, st, "mx_dual" if dual else "mx_rows", dtype, s.stride(),
                     st_strides)  # fmt: skip
        return (q, s, qt, st) if dual else (q, s)
    if _use_v2(x) and sliced_on("mx_dual" if dual else "mx_rows"):  # quant_dual_launch
        launch_sliced(x, q, s, qt, st, "mx_dual" if dual else "mx_rows", dtype, s.stride(),
                      st_strides)  # fmt: skip
        return (q, s, qt, st) if dual else (q, s)
    if _use_v2(x):
        name = "mx_dual" if dual else "mx_rows"
        if _v3() and _mx4d(dual):
            name = "mx4_dual" if dual else "mx4_rows"
        _tile_v2(x, q, s, qt, st, name, dtype, s.stride(), st_strides)
        return (q, s, qt, st) if dual else (q, s)
    bm, bn, warps = _MX_TILE_DUAL if dual else _MX_TILE
    _tile(x, q, s, qt, st, None, bm, bn, MX, dual, dtype, s.stride(), st_strides, warps)
    return (q, s, qt, st) if dual else (q, s)


def quant_mxfp4(x: torch.Tensor, block: int = 32):
    """MXFP4 along N: ``(packed uint8 [M, N/2], scale_e8m0 uint8 [M, N/32])``; N % 32 == 0."""
    m, n = x.shape
    q = torch.empty((m, n // 2), dtype=torch.uint8, device=x.device)
    s = torch.empty((m, n // block), dtype=torch.uint8, device=x.device)
    if m and n:
        quant_mxfp4_kernel[(_cdiv(m, 32), n // block)](
            x, q, s, m, n, x.stride(0), x.stride(1), q.stride(0), s.stride(0), BM=32, num_warps=4
        )
    return q, s
