"""Sliced dual quantization: 1x128 + 128x1 blocks and MXFP8 (1x32 + 32x1), optionally persistent.

``quant_sliced_kernel`` (``PRIMUS_TURBO_QUANT_SLICED=1``, see quant_dual_launch) loads a
``BM x BN`` tile as 8 row slices, each a 3-D ``[R, G, C]`` view (``R = BM / 8`` rows, ``G = BN / C``
groups of ``C`` columns; ``C`` is the row block: 32 for MX, ``BN`` = 128 for 1x128): slice ``k``
holds rows ``8 r + k`` and columns ``C g + c``. All slices share one register layout, so a thread
holds an ``8 x 8`` block of the tile (8 slices x one 16-byte vector). R is the outer dimension
so that, for the MX tile (32 x 256, 4 warps), Triton's layout puts it on lanes, not warps
(sm_90 SASS: the column reduction and the transposed copy need no shared memory; LDS/STS 7/6 per
thread vs 30/70 for the tile kernel, 18.5 vs 28 instructions per element):
* row amax: per slice, a reduction over ``c`` (MX: in-thread 8 + 4 lanes);
* column amax: an element-wise max over the 8 slices (in-thread), then over ``R``;
* the row output: 8 stores of 8 contiguous bytes per thread; the 8 slices' row scales are
  joined and stored once per tile (one store per slice cost 2 barriers each);
* the column (transposed) output: the 8 cast slices joined along a new last axis, so a thread
  owns 8 consecutive M positions of a transposed row: 8-byte stores along M;
* E8M0 scales from the fp32 exponent bits (``_e8m0_scale``), 1x128 scales as ``_scale_of`` (or
  ``_scale_rcp`` with ``RCP``).
``PERSIST``: programs loop over the tiles ``pid, pid + P, ...`` and load the next tile (bf16,
in registers) before quantizing the current one, so its DRAM latency overlaps this tile's math
and stores (the one-tile-per-program kernels wait for every load with nothing else to do; H200
run 4.2: halving the resident programs per SM halved the 1x128 dual's speed).
Round-2 variants (opt-in, see quant_dual_launch): MX ``BM = 64`` (two 32-row column groups per
tile, 64-byte transposed row segments), ``IE8`` (E8M0 scales in integer ops, ``_e8m0_int``),
``I64 = False`` (OFF32: 32-bit element offsets).
Results are bitwise those of ``quant_tile_v2_kernel`` (same ``_finite_abs`` amaxes, scale
functions and ``_cast2``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.aot import AOT_TARGETS, AotSpec
from primus_turbo.triton.quantization.quant_common import _scale_rcp, aot_fp8, tile_signature
from primus_turbo.triton.quantization.quant_kernel import MX, ROWS, _finite_abs
from primus_turbo.triton.quantization.quant_kernel_v2 import MAXNREG, _cast2, _e8m0_scale


@triton.jit
def _join8(c0, c1, c2, c3, c4, c5, c6, c7):
    """``[R, G, C, 8]`` with ``c_k`` at index ``k`` of the new (register-held) last axis; nested
    joins index ``[i, j, l]`` -> ``c_{4i + 2j + l}`` after the row-major reshape."""
    lo = tl.join(tl.join(c0, c4), tl.join(c2, c6))
    t = tl.join(lo, tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    return tl.reshape(t, (c0.shape[0], c0.shape[1], c0.shape[2], 8))


@triton.jit
def _e8m0_int(amax, EMAX: tl.constexpr):
    """``_e8m0_scale`` in integer ops (``IE8``): the biased exponent ``eb = e + 127`` clamped to
    [0, 254] from the fp32 bits of ``max(amax, 2^-126)`` (``amax`` finite, >= 0), the scale
    ``2^-e`` as the fp32 whose exponent field is ``254 - eb`` (>= 1: ``eb <= 254 - EMAX``),
    so no ``exp2``; returns (scale, ``eb`` as int32), bitwise ``_e8m0_scale``'s values."""
    a = tl.maximum(amax, 1.1754943508222875e-38)
    eb = (a.to(tl.int32, bitcast=True) >> 23) - EMAX
    eb = tl.minimum(tl.maximum(eb, 0), 254)
    return ((254 - eb) << 23).to(tl.float32, bitcast=True), eb


@triton.jit
def _ccast(f, sc, NB: tl.constexpr, FMAX: tl.constexpr, qty, FMT: tl.constexpr,
               SAT: tl.constexpr):  # fmt: skip
    """Column-quantize slice ``f`` ``[R, G, C]`` with the column scales ``sc`` ``[NB, G, C]``
    (``NB`` 32-row groups per tile, rows ``r`` of the slice in group ``r // (R / NB)``)."""
    if NB == 1:  # sc: [1, G, C]
        return _cast2(f, sc, FMAX, qty, FMT, SAT)
    R: tl.constexpr = f.shape[0]
    f4 = tl.reshape(f, (NB, R // NB, f.shape[1], f.shape[2]))
    return tl.reshape(_cast2(f4, sc[:, None, :, :], FMAX, qty, FMT, SAT), f.shape)


@triton.jit
def _offsets(t, grid_n, BM: tl.constexpr, BN: tl.constexpr, C: tl.constexpr):
    """(rows of slice 0 ``[R, 1, 1]``, columns ``[1, G, C]``) of tile ``t``."""
    G: tl.constexpr = BN // C
    R: tl.constexpr = BM // 8
    pid_m = t // grid_n
    pid_n = t - pid_m * grid_n
    rows = pid_m * BM + tl.arange(0, R)[:, None, None] * 8
    cols = pid_n * BN + tl.arange(0, G)[None, :, None] * C + tl.arange(0, C)[None, None, :]
    return rows, cols


@triton.jit
def _ptrs(base, outer, stride, inner, I64: tl.constexpr):
    """``base + outer * stride + inner``: 64-bit offsets, or with ``I64 = False`` (OFF32)
    32-bit ones (the launcher checked that every offset fits)."""
    if I64:
        return base + outer.to(tl.int64) * stride + inner
    return base + (outer * stride + inner)


@triton.jit
def _ld(x_ptr, rows, cols, M, N, stride_xm, EVEN: tl.constexpr, I64: tl.constexpr = True):
    ptrs = _ptrs(x_ptr, rows, stride_xm, cols, I64)
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=(rows < M) & (cols < N), other=0.0)


@triton.jit
def _ld8(x_ptr, rows, cols, M, N, stride_xm, EVEN: tl.constexpr, I64: tl.constexpr):
    """The tile's 8 row slices (rows ``rows + k``), as 8 ``_ld`` calls."""
    return (_ld(x_ptr, rows + 0, cols, M, N, stride_xm, EVEN, I64),
            _ld(x_ptr, rows + 1, cols, M, N, stride_xm, EVEN, I64),
            _ld(x_ptr, rows + 2, cols, M, N, stride_xm, EVEN, I64),
            _ld(x_ptr, rows + 3, cols, M, N, stride_xm, EVEN, I64),
            _ld(x_ptr, rows + 4, cols, M, N, stride_xm, EVEN, I64),
            _ld(x_ptr, rows + 5, cols, M, N, stride_xm, EVEN, I64),
            _ld(x_ptr, rows + 6, cols, M, N, stride_xm, EVEN, I64),
            _ld(x_ptr, rows + 7, cols, M, N, stride_xm, EVEN, I64))  # fmt: skip


@triton.jit
def _row_out(x, a, k: tl.constexpr, rows0, cols, q_ptr, M, N, stride_qm, MODE: tl.constexpr,
             FMAX: tl.constexpr, EMAX: tl.constexpr, FMT: tl.constexpr, SAT: tl.constexpr,
             EVEN: tl.constexpr, RCP: tl.constexpr, IE8: tl.constexpr,
             I64: tl.constexpr):  # fmt: skip
    """Row-quantize slice ``k`` (fp32 ``x``, its finite ``|x|`` ``a``), store it and return its
    scales ``[R, G]``, one per row and C-group (stored by the caller, all slices at once): MX
    E8M0 (C = 32), ROWS fp32 (C = BN = 128, G = 1)."""
    rows = rows0 + k
    if MODE == 4:
        if IE8:  # (one return per function: Triton checks the types of every return)
            scale, sinv = _e8m0_int(tl.max(a, axis=2), EMAX)
        else:
            scale, sinv = _e8m0_scale(tl.max(a, axis=2), EMAX)
    else:
        scale, sinv = _scale_rcp(tl.max(a, axis=2), FMAX, RCP)
    q = _cast2(x, scale[:, :, None], FMAX, q_ptr.dtype.element_ty, FMT, SAT)
    ptrs = _ptrs(q_ptr, rows, stride_qm, cols, I64)
    if EVEN:
        tl.store(ptrs, q)
    else:
        tl.store(ptrs, q, mask=(rows < M) & (cols < N))
    return sinv


@triton.jit
def _row_out8(f0, f1, f2, f3, f4, f5, f6, f7, a0, a1, a2, a3, a4, a5, a6, a7, r, c, q, M, N, sq,
              MODE: tl.constexpr, FMAX: tl.constexpr, EMAX: tl.constexpr, FMT: tl.constexpr,
              SAT: tl.constexpr, EVEN: tl.constexpr, RCP: tl.constexpr, IE8: tl.constexpr,
              I64: tl.constexpr):  # fmt: skip
    """``_row_out`` of the 8 slices, in slice order; their row scales."""
    return (_row_out(f0, a0, 0, r, c, q, M, N, sq, MODE, FMAX, EMAX, FMT, SAT, EVEN, RCP, IE8, I64),
            _row_out(f1, a1, 1, r, c, q, M, N, sq, MODE, FMAX, EMAX, FMT, SAT, EVEN, RCP, IE8, I64),
            _row_out(f2, a2, 2, r, c, q, M, N, sq, MODE, FMAX, EMAX, FMT, SAT, EVEN, RCP, IE8, I64),
            _row_out(f3, a3, 3, r, c, q, M, N, sq, MODE, FMAX, EMAX, FMT, SAT, EVEN, RCP, IE8, I64),
            _row_out(f4, a4, 4, r, c, q, M, N, sq, MODE, FMAX, EMAX, FMT, SAT, EVEN, RCP, IE8, I64),
            _row_out(f5, a5, 5, r, c, q, M, N, sq, MODE, FMAX, EMAX, FMT, SAT, EVEN, RCP, IE8, I64),
            _row_out(f6, a6, 6, r, c, q, M, N, sq, MODE, FMAX, EMAX, FMT, SAT, EVEN, RCP, IE8, I64),
            _row_out(f7, a7, 7, r, c, q, M, N, sq, MODE, FMAX, EMAX, FMT, SAT, EVEN, RCP,
                     IE8, I64))  # fmt: skip


@triton.jit
def _store_row_scales(s0, s1, s2, s3, s4, s5, s6, s7, rows0, pid_n, s_ptr, M, N, stride_sm,
                      stride_sn, C: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """The 8 slices' row scales joined along a new last axis (slice ``k`` at index ``k``) and
    stored at once: one layout conversion for the tile instead of one per slice."""
    R: tl.constexpr = rows0.shape[0]
    G: tl.constexpr = s0.shape[1]
    sv = _join8(s0[:, :, None], s1[:, :, None], s2[:, :, None], s3[:, :, None],
                s4[:, :, None], s5[:, :, None], s6[:, :, None], s7[:, :, None])  # fmt: skip
    sv = tl.reshape(sv, (R, G, 8)).to(s_ptr.dtype.element_ty)
    r = tl.reshape(rows0, (R, 1, 1)) + tl.arange(0, 8)[None, None, :]
    g = pid_n * G + tl.arange(0, G)[None, :, None]
    ptrs = s_ptr + r.to(tl.int64) * stride_sm + g * stride_sn
    if EVEN:
        tl.store(ptrs, sv)
    else:
        tl.store(ptrs, sv, mask=(r < M) & (g * C < N))


@triton.jit
def _quant_tile(
    x0, x1, x2, x3, x4, x5, x6, x7, t, grid_n, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_qm,
    stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn, BM: tl.constexpr,
    BN: tl.constexpr, MODE: tl.constexpr, DUAL: tl.constexpr, FMAX: tl.constexpr,
    EMAX: tl.constexpr, FMT: tl.constexpr, SAT: tl.constexpr, EVEN: tl.constexpr,
    RCP: tl.constexpr, IE8: tl.constexpr, I64: tl.constexpr,
):  # fmt: skip
    """Quantize one tile given as its 8 bf16 slices (see the module docstring)."""
    C: tl.constexpr = 32 if MODE == 4 else BN
    rows, cols = _offsets(t, grid_n, BM, BN, C)
    pid_m = t // grid_n
    pid_n = t - pid_m * grid_n
    f0, f1, f2, f3 = x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32)
    f4, f5, f6, f7 = x4.to(tl.float32), x5.to(tl.float32), x6.to(tl.float32), x7.to(tl.float32)
    a0, a1, a2, a3 = _finite_abs(f0), _finite_abs(f1), _finite_abs(f2), _finite_abs(f3)
    a4, a5, a6, a7 = _finite_abs(f4), _finite_abs(f5), _finite_abs(f6), _finite_abs(f7)
    s0, s1, s2, s3, s4, s5, s6, s7 = _row_out8(f0, f1, f2, f3, f4, f5, f6, f7, a0, a1, a2, a3,
                                               a4, a5, a6, a7, rows, cols, q_ptr, M, N,
                                               stride_qm, MODE, FMAX, EMAX, FMT, SAT, EVEN,
                                               RCP, IE8, I64)  # fmt: skip
    _store_row_scales(s0, s1, s2, s3, s4, s5, s6, s7, rows, pid_n, s_ptr, M, N, stride_sm,
                      stride_sn, C, EVEN)  # fmt: skip
    if DUAL:  # MX: NB = BM / 32 column groups per tile; ROWS: BM = 128, one: a scale per column
        NB: tl.constexpr = BM // 32 if MODE == 4 else 1
        R: tl.constexpr = BM // 8
        G: tl.constexpr = BN // C
        a = tl.maximum(tl.maximum(tl.maximum(a0, a1), tl.maximum(a2, a3)),
                       tl.maximum(tl.maximum(a4, a5), tl.maximum(a6, a7)))  # fmt: skip
        if NB == 1:  # the 1-tile-row path exactly as measured in run 5.2
            ac = tl.max(a, axis=0)  # [G, C]
        else:
            ac = tl.max(tl.reshape(a, (NB, R // NB, G, C)), axis=1)  # [NB, G, C]
        if MODE == 4 and IE8:
            sc, sinv_c = _e8m0_int(ac, EMAX)
        elif MODE == 4:
            sc, sinv_c = _e8m0_scale(ac, EMAX)
        else:
            sc, sinv_c = _scale_rcp(ac, FMAX, RCP)
        sv = sinv_c.to(st_ptr.dtype.element_ty)
        if NB == 1:
            c2 = tl.reshape(cols, (G, C))
            st_ptrs = st_ptr + pid_m * stride_stm + c2.to(tl.int64) * stride_stn
            if EVEN:
                tl.store(st_ptrs, sv)
            else:
                tl.store(st_ptrs, sv, mask=c2 < N)
            sc = sc[None, :, :]
        else:
            c3 = tl.reshape(cols, (1, G, C))
            mb = pid_m * NB + tl.arange(0, NB)[:, None, None]
            st_ptrs = st_ptr + mb * stride_stm + c3.to(tl.int64) * stride_stn
            if EVEN:
                tl.store(st_ptrs, sv)
            else:
                tl.store(st_ptrs, sv, mask=(c3 < N) & (mb * 32 < M))
        qty = qt_ptr.dtype.element_ty
        qt = _join8(
            _ccast(f0, sc, NB, FMAX, qty, FMT, SAT), _ccast(f1, sc, NB, FMAX, qty, FMT, SAT),
            _ccast(f2, sc, NB, FMAX, qty, FMT, SAT), _ccast(f3, sc, NB, FMAX, qty, FMT, SAT),
            _ccast(f4, sc, NB, FMAX, qty, FMT, SAT), _ccast(f5, sc, NB, FMAX, qty, FMT, SAT),
            _ccast(f6, sc, NB, FMAX, qty, FMT, SAT), _ccast(f7, sc, NB, FMAX, qty, FMT, SAT),
        )  # fmt: skip
        m4 = rows[:, :, :, None] + tl.arange(0, 8)[None, None, None, :]
        n4 = cols[:, :, :, None]
        qt_ptrs = _ptrs(qt_ptr, n4, stride_qtn, m4, I64)
        if EVEN:
            tl.store(qt_ptrs, qt)
        else:
            tl.store(qt_ptrs, qt, mask=(m4 < M) & (n4 < N))


@triton.jit
def quant_sliced_kernel(
    x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm, stride_qm, stride_qtn, stride_sm,
    stride_sn, stride_stm, stride_stn, BM: tl.constexpr, BN: tl.constexpr, MODE: tl.constexpr,
    DUAL: tl.constexpr, FMAX: tl.constexpr, EMAX: tl.constexpr = 8,
    FMT: tl.constexpr = (0, 0, 0, 0), SAT: tl.constexpr = False, EVEN: tl.constexpr = False,
    RCP: tl.constexpr = False, PERSIST: tl.constexpr = False, IE8: tl.constexpr = False,
    I64: tl.constexpr = True,
):  # fmt: skip
    """``x`` [M, N] (unit column stride) -> ``q`` [M, N] and, with ``DUAL``, ``qt`` [N, M]
    (unit column strides). MX (``BM = 32`` with ``DUAL``): ``s`` [M, N/32] / ``st`` [N, M/32]
    E8M0 by (row, group) / (M group, column) strides; ROWS (1x128 dual, ``BM = BN = 128``):
    fp32 ``s`` (row, block) / ``st`` (M block, column) by strides. ``PERSIST``: a grid of
    fewer programs than tiles, each prefetching its next tile (see the module docstring)."""
    C: tl.constexpr = 32 if MODE == 4 else BN  # the row block: MX 32, ROWS the tile width
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BN)
    ntiles = tl.cdiv(M, BM) * grid_n
    if PERSIST:
        last = ntiles - 1
        rows, cols = _offsets(pid, grid_n, BM, BN, C)
        y0, y1, y2, y3, y4, y5, y6, y7 = _ld8(x_ptr, rows, cols, M, N, stride_xm, EVEN, I64)
        for t in range(pid, ntiles, tl.num_programs(0)):
            x0, x1, x2, x3, x4, x5, x6, x7 = y0, y1, y2, y3, y4, y5, y6, y7
            # the next tile (the last one again past the end: a harmless re-read, no mask)
            rows, cols = _offsets(tl.minimum(t + tl.num_programs(0), last), grid_n, BM, BN, C)
            y0, y1, y2, y3, y4, y5, y6, y7 = _ld8(x_ptr, rows, cols, M, N, stride_xm, EVEN, I64)
            _quant_tile(x0, x1, x2, x3, x4, x5, x6, x7, t, grid_n, q_ptr, s_ptr, qt_ptr, st_ptr,
                        M, N, stride_qm, stride_qtn, stride_sm, stride_sn, stride_stm,
                        stride_stn, BM, BN, MODE, DUAL, FMAX, EMAX, FMT, SAT, EVEN,
                        RCP, IE8, I64)  # fmt: skip
    else:
        rows, cols = _offsets(pid, grid_n, BM, BN, C)
        x0, x1, x2, x3, x4, x5, x6, x7 = _ld8(x_ptr, rows, cols, M, N, stride_xm, EVEN, I64)
        _quant_tile(x0, x1, x2, x3, x4, x5, x6, x7, pid, grid_n, q_ptr, s_ptr, qt_ptr, st_ptr,
                    M, N, stride_qm, stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn,
                    BM, BN, MODE, DUAL, FMAX, EMAX, FMT, SAT, EVEN, RCP, IE8,
                    I64)  # fmt: skip


# ---- ahead-of-time check -------------------------------------------------------------------

# (name, mode, BM, BN, dual, warps on NVIDIA) as quant_launch picks them with
# PRIMUS_TURBO_QUANT_SLICED=1 (AMD: half the warps, wavefront 64: the same lanes per tile)
SLICED_CONFIGS = {
    "block_dual": (ROWS, 128, 128, True, 8),
    "mx_dual": (MX, 32, 256, True, 4),
    "mx_rows": (MX, 32, 256, False, 4),
}
# AOT only: the MX tile widths PRIMUS_TURBO_QUANT_SLICED_BN may pick besides the default
_AOT_EXTRA = {"mx_dual_bn128": (MX, 32, 128, True, 2), "mx_dual_bn64": (MX, 32, 64, True, 1)}
# AOT only, even and one tile per program: the round-2 variants (name: (config, tile height,
# tile width, IE8 (2: OFF32), sm_90 register cap[, warps])): SLICED_BM=64, BN=512, IE8=1,
# OFF32=1, MAXNREG 96 (dual; 4 B spill) / 80 / 64 (rows; no spill). sm_90 AOT, also measured
# here: dual MAXNREG 80 spills 140 B, 8 warps 112 regs (+ layout conversions), BM=64 at 96
# spills 120 B; OFF32 dual 114 regs (vs 115), with MAXNREG 96 94 and no spill (80: 104 B)
_AOT_R2 = {
    "mx_dual_bm64": ("mx_dual", 64, 256, False, MAXNREG),
    "mx_rows_bm64": ("mx_rows", 64, 256, False, MAXNREG),
    "mx_dual_bn512": ("mx_dual", 32, 512, False, MAXNREG),
    "mx_rows_bn512": ("mx_rows", 32, 512, False, MAXNREG),
    "mx_dual_ie8": ("mx_dual", 32, 256, True, MAXNREG),
    "mx_dual_r96": ("mx_dual", 32, 256, False, 96),
    "mx_rows_r80": ("mx_rows", 32, 256, False, 80),
    "mx_rows_r64": ("mx_rows", 32, 256, False, 64),
    "mx_dual_off32": ("mx_dual", 32, 256, 2, MAXNREG),
    "mx_rows_off32": ("mx_rows", 32, 256, 2, MAXNREG),
    "mx_dual_off32_r96": ("mx_dual", 32, 256, 2, 96),
}


def sliced_warps(bm: int, bn: int, lanes: int, persist: bool = False, mode: int = MX) -> int:
    """One 16-byte bf16 vector per thread and slice: ``BM * BN / (8 slices * 8 values)``
    threads; twice that for the persistent 1x128 tile (8 warps spill ~250 B on sm_90 at the
    128-register cap with the prefetched tile; 16 warps do not)."""
    return max(1, bm * bn // (64 * lanes)) * (2 if persist and mode == ROWS else 1)


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 input, the target's e4m3 output (FNUZ on gfx942; MX only on gfx950 / sm_90);
    one-tile and persistent, even (no masks) and masked."""
    assert target in AOT_TARGETS, target
    fp8, fmax = aot_fp8(target)
    specs = []
    nv = {"maxnreg": MAXNREG} if target == "sm_90" else {}
    lanes = AOT_TARGETS[target][2]
    for name, (mode, bm, bn, dual, _) in {**SLICED_CONFIGS, **_AOT_EXTRA}.items():
        if mode == MX and target == "gfx942":
            continue
        ssig = tile_signature(fp8, mode == MX)
        for persist in (False, True):
            for even in (True, False):
                cx = {"BM": bm, "BN": bn, "MODE": mode, "DUAL": dual, "FMAX": fmax, "EMAX": 8,
                      "FMT": (0, 0, 0, 0), "SAT": target == "sm_90", "EVEN": even,
                      "RCP": False, "PERSIST": persist, "IE8": False,
                      "I64": True}  # fmt: skip
                tag = ("_persist" if persist else "") + ("_even" if even else "")
                specs.append(
                    AotSpec(f"quant_sliced_{name}{tag}_{fp8}", quant_sliced_kernel, ssig, cx,
                            {"num_warps": sliced_warps(bm, bn, lanes, persist, mode), **nv},
                            default=even and not persist and name in ("mx_dual", "mx_rows"))
                )  # fmt: skip
    for name, (base, bm, bn, ie8, nreg, *warps) in _AOT_R2.items():
        mode, _, _, dual, _ = SLICED_CONFIGS[base]
        if target == "gfx942" or (target != "sm_90" and nreg != MAXNREG):
            continue
        ssig = tile_signature(fp8, True)
        cx = {"BM": bm, "BN": bn, "MODE": mode, "DUAL": dual, "FMAX": fmax, "EMAX": 8,
              "FMT": (0, 0, 0, 0), "SAT": target == "sm_90", "EVEN": True, "RCP": False,
              "PERSIST": False, "IE8": ie8 == 1,
              "I64": ie8 != 2}  # fmt: skip
        opts = {"num_warps": warps[0] if warps else sliced_warps(bm, bn, lanes)}
        if target == "sm_90":
            opts["maxnreg"] = nreg
        tag = f"quant_sliced_{name}_even_{fp8}"
        specs.append(AotSpec(tag, quant_sliced_kernel, ssig, cx, opts))
    return specs
