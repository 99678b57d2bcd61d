"""Word-sliced MXFP8 quantization (rows and dual) on bf16 pairs held as uint32.

``quant_words_kernel`` (the default MX rows / MX dual kernel for bf16 inputs, see
quant_dual_launch) is the sliced kernel of quant_dual.py (a ``BM x BN`` tile as 8 row slices,
slice ``k`` = rows ``8 r + k``, a thread holding 8 slices x one 16-byte vector) with the input
read as 32-bit words, each word two adjacent bf16 values (``lo`` = the even column in bits
0-15, ``hi`` = the odd one in 16-31), so the per-element work is integer ops the compiler
cannot widen (sliced MX dual tile on sm_90: 18.6 SASS per element):
* unpack: ``lo = w << 16``, ``hi = w & 0xFFFF0000`` (exact fp32 bits of each bf16);
* amax key, one op per element shared by the row and the column amax: ``(w << 17) + 2^24``
  (``lo``) / ``(w << 1) + 2^24`` (``hi``; the ``lo`` bits below bit 17 are noise the result
  drops). Doubling drops the sign; a finite ``|x|`` maps to ``[2^24, 2^32)`` monotonically, an
  inf or NaN (exponent field all ones) wraps to ``[0, 2^24)``, below every finite value, so an
  unsigned max skips them as ``_finite_abs`` does (a block of only inf/NaN: amax 0);
* E8M0 scales from the key max in integer ops (``_scales``: bitwise ``_e8m0_scale``);
* the fp32 products of a slice joined ``(lo, hi)`` before the fp8 conversion, so each
  converted pair is two adjacent outputs (no byte permutes); the column copy joins the 8
  slices first, as quant_dual does, and stores 8 consecutive M bytes per thread from a
  ``[C/8, R, G, 8, 8]`` view whose dims are in the order Triton's store coalescing assigns
  lanes, so the store needs no layout conversion (quant_dual's goes through shared memory).
Slice ``k``'s pointers are slice 0's plus ``k`` rows; the grid is 2-D (no integer division for
the tile coordinates) unless the tile rows exceed a grid axis. sm_90 SASS per element (even
32x256 tiles): MX dual 11.75 (sliced 18.6), MX rows 7.4 (10.5). H200 run 6.2 (8192x4096, x of
copy): MX rows 0.866 (sliced 0.846), MX dual 0.779 with the 64x256 tile (32x256 0.725, sliced
0.720). H200 run 6.3 (8192x4096 / 6144x4096), MX dual tiles: 128x128 (the default) 0.791 /
0.793, 64x256 0.785 / 0.779, 128x256 0.767 / 0.750 (removed); 32-bit offsets (OFF32, removed)
0.780 / 0.776 on 64x256: every offset is 64-bit. The 1x128 dual had a words path too; it lost to
the v3 tile kernel (0.58 vs 0.695) and was removed. Results are bitwise those of
``quant_sliced_kernel`` / ``quant_tile_v2_kernel``. The launcher checks what word loads need: an
even ``N`` and row stride, a 4-byte aligned input.
H200 call 7.2 (MX dual, x of copy, 8192x4096 / 6144x4096 geomean; default 0.793): tiles 128x64
0.769 / 128x32 0.606, evict-first loads + ``.cs`` stores 0.706, persistent with the next tile
prefetched 0.718, 4 row slices per thread (64 registers, 32 warps per SM) 0.757-0.790, the even
and odd column scales in one store 0.791: all removed (docs/low_precision_notes.md, session 7).
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.aot import AOT_TARGETS, AotSpec
from primus_turbo.triton.quantization.quant_common import (
    aot_fp8,
    mx_slice_constexprs,
    slice_warps,
    tile_signature,
)
from primus_turbo.triton.quantization.quant_dual import _join8, _ptrs, _store_row_scales
from primus_turbo.triton.quantization.quant_kernel import _fp8_bits

KEY0 = 1 << 24  # the key of |x| = 0 (see the module docstring)


@triton.jit
def _keys(w):
    """(lo key, hi key) of a word tensor (uint32)."""
    return (w << 17) + 16777216, (w << 1) + 16777216


@triton.jit
def _unpack(w):
    """(lo, hi) fp32 values of a word tensor (uint32, two bf16)."""
    lo = (w << 16).to(tl.float32, bitcast=True)
    hi = (w & 0xFFFF0000).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def _scales(kmax, EMAX: tl.constexpr):
    """(multiplier, stored E8M0 byte) of blocks with key maximum ``kmax``, bitwise
    ``_e8m0_scale``: ``max(exponent(amax), 1)`` is the exponent of ``max(amax, 2^-126)``,
    stored ``clamp(that - EMAX, 0, 254)``, multiplier ``2^(127 - stored)`` built from its bits.
    The exponent of a key >= 2^24 is ``(key >> 24) - 1``, a key < 2^24 (amax 0) gives a
    negative value; no upper clamp (exponent <= 254 for a finite amax, EMAX >= 8)."""
    eb = tl.maximum((kmax >> 24).to(tl.int32) - (1 + EMAX), 0)
    scale = ((254 - eb) << 23).to(tl.float32, bitcast=True)
    return scale, eb


@triton.jit
def _conv(y, FMAX: tl.constexpr, dtype, FMT: tl.constexpr, SAT: tl.constexpr):
    """``_cast2`` of already scaled values ``y`` (the same ops after the product)."""
    if SAT:
        return y.to(dtype)
    y = tl.where(y != y, y, tl.minimum(tl.maximum(y, -FMAX), FMAX))
    if FMT[0]:
        return _fp8_bits(y, FMT[1], FMT[2], FMT[3])
    return y.to(dtype)


@triton.jit
def _join2(lo, hi):
    """``[..., W]`` pairs -> ``[..., 2 W]`` in column order (lo, hi of each word)."""
    j = tl.join(lo, hi)
    return tl.reshape(j, (lo.shape[0], lo.shape[1], lo.shape[2] * 2))


@triton.jit
def _koff(k: tl.constexpr, stride):
    """64-bit offset of slice ``k`` from slice 0 (``k`` rows of ``stride`` elements)."""
    return stride.to(tl.int64) * k


@triton.jit
def _wld(xb, k: tl.constexpr, rows, wcols, M, NW, stride_w, EVEN: tl.constexpr):
    """Words of slice ``k`` (``xb``: slice 0's pointers, ``rows`` its rows)."""
    ptrs = xb + _koff(k, stride_w)
    if EVEN:
        w = tl.load(ptrs)
    else:
        w = tl.load(ptrs, mask=(rows + k < M) & (wcols < NW), other=0)
    return w


@triton.jit
def _st(ptrs, v, mask, EVEN: tl.constexpr):
    """Store of an fp8 output."""
    if EVEN:
        tl.store(ptrs, v)
    else:
        tl.store(ptrs, v, mask=mask)


@triton.jit
def _row_out(w, kmax, k: tl.constexpr, rows, cols, qb, M, N, stride_qm, FMAX: tl.constexpr,
             EMAX: tl.constexpr, FMT: tl.constexpr, SAT: tl.constexpr,
             EVEN: tl.constexpr):  # fmt: skip
    """Row-quantize slice ``k``'s words ``w`` ``[R, G, W]`` (``kmax`` its per-(row, group) key
    max ``[R, G]``), store it at columns ``cols`` ``[1, G, 2 W]`` (``qb``: slice 0's output
    pointers, ``rows`` its rows); its stored scales."""
    scale, sinv = _scales(kmax, EMAX)
    lo, hi = _unpack(w)
    q = _conv(_join2(lo, hi) * scale[:, :, None], FMAX, qb.dtype.element_ty, FMT, SAT)
    _st(qb + _koff(k, stride_qm), q, (rows + k < M) & (cols < N), EVEN)
    return sinv


@triton.jit
def _col_vals(w, slo, shi, NB: tl.constexpr):
    """fp32 column-scaled values ``[R, G, 2 W]`` of one slice (``slo``/``shi``: ``[NB, G, W]``
    multipliers of the even / odd columns, ``NB`` 32-row groups per tile)."""
    lo, hi = _unpack(w)
    if NB == 1:
        return _join2(lo * slo, hi * shi)
    R: tl.constexpr = w.shape[0]
    shp4: tl.constexpr = (NB, R // NB, w.shape[1], w.shape[2])
    lo4 = tl.reshape(lo, shp4) * slo[:, None, :, :]
    hi4 = tl.reshape(hi, shp4) * shi[:, None, :, :]
    return _join2(tl.reshape(lo4, w.shape), tl.reshape(hi4, w.shape))


@triton.jit
def _col_reduce(k, NB: tl.constexpr):
    """Column key max ``[NB, G, W]`` of the slices' element-wise max ``k`` ``[R, G, W]``."""
    if NB == 1:
        return tl.max(k, axis=0)[None, :, :]
    R: tl.constexpr = k.shape[0]
    return tl.max(tl.reshape(k, (NB, R // NB, k.shape[1], k.shape[2])), axis=1)


@triton.jit
def _store_col_scales(v, pid_m, wc, st_ptr, M, N, stride_stm, stride_stn, ODD: tl.constexpr,
                      EVEN: tl.constexpr):  # fmt: skip
    """Column scales ``v`` ``[NB, G, W]`` of the even (``ODD = 0``) or odd columns."""
    NB: tl.constexpr = v.shape[0]
    c = wc * 2 + ODD
    mb = pid_m * NB + tl.arange(0, NB)[:, None, None]
    ptrs = st_ptr + mb * stride_stm + c.to(tl.int64) * stride_stn
    if EVEN:
        tl.store(ptrs, v)
    else:
        tl.store(ptrs, v, mask=(c < N) & (mb * 32 < M))


@triton.jit
def quant_words_kernel(
    x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xw, stride_qm, stride_qtn, stride_sm,
    stride_sn, stride_stm, stride_stn, BM: tl.constexpr, BN: tl.constexpr, DUAL: tl.constexpr,
    FMAX: tl.constexpr, EMAX: tl.constexpr = 8, FMT: tl.constexpr = (0, 0, 0, 0),
    SAT: tl.constexpr = False, EVEN: tl.constexpr = False, GRID2D: tl.constexpr = False,
):  # fmt: skip
    """``x`` [M, N] bf16 (unit column stride, ``stride_xw`` its row stride in 32-bit words) ->
    ``q`` [M, N] and, with ``DUAL``, ``qt`` [N, M]; E8M0 scales ``s`` [M, N/32] / ``st``
    [N, M/32] as ``quant_sliced_kernel``'s MX ones (``BM`` and ``BN`` multiples of 32)."""
    C: tl.constexpr = 32  # the MX block
    G: tl.constexpr = BN // C
    W: tl.constexpr = C // 2  # words per row block
    R: tl.constexpr = BM // 8
    if GRID2D:  # (grid_n, grid_m): no integer division for the tile's coordinates
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
    else:  # one axis (tile rows past the 65535 limit of a second grid axis)
        pid = tl.program_id(0)
        grid_n = tl.cdiv(N, BN)
        pid_m = pid // grid_n
        pid_n = pid - pid_m * grid_n
    NW = N // 2
    xw_ptr = x_ptr.to(tl.pointer_type(tl.uint32))
    rows = pid_m * BM + tl.arange(0, R)[:, None, None] * 8
    wc = pid_n * (BN // 2) + tl.arange(0, G)[None, :, None] * W + tl.arange(0, W)[None, None, :]
    cols = pid_n * BN + tl.arange(0, G)[None, :, None] * C + tl.arange(0, 2 * W)[None, None, :]
    xb = _ptrs(xw_ptr, rows, stride_xw, wc)  # slice 0; slice k at + k rows
    w0 = _wld(xb, 0, rows, wc, M, NW, stride_xw, EVEN)
    w1 = _wld(xb, 1, rows, wc, M, NW, stride_xw, EVEN)
    w2 = _wld(xb, 2, rows, wc, M, NW, stride_xw, EVEN)
    w3 = _wld(xb, 3, rows, wc, M, NW, stride_xw, EVEN)
    w4 = _wld(xb, 4, rows, wc, M, NW, stride_xw, EVEN)
    w5 = _wld(xb, 5, rows, wc, M, NW, stride_xw, EVEN)
    w6 = _wld(xb, 6, rows, wc, M, NW, stride_xw, EVEN)
    w7 = _wld(xb, 7, rows, wc, M, NW, stride_xw, EVEN)
    l0, h0 = _keys(w0)
    l1, h1 = _keys(w1)
    l2, h2 = _keys(w2)
    l3, h3 = _keys(w3)
    l4, h4 = _keys(w4)
    l5, h5 = _keys(w5)
    l6, h6 = _keys(w6)
    l7, h7 = _keys(w7)
    # the reductions first, so the 16 key tensors die before the row outputs: per slice the
    # (row, group) key max, over the slices the column partial maxima (dead code without DUAL)
    r0, r1 = tl.max(tl.maximum(l0, h0), axis=2), tl.max(tl.maximum(l1, h1), axis=2)
    r2, r3 = tl.max(tl.maximum(l2, h2), axis=2), tl.max(tl.maximum(l3, h3), axis=2)
    r4, r5 = tl.max(tl.maximum(l4, h4), axis=2), tl.max(tl.maximum(l5, h5), axis=2)
    r6, r7 = tl.max(tl.maximum(l6, h6), axis=2), tl.max(tl.maximum(l7, h7), axis=2)
    klo = tl.maximum(tl.maximum(tl.maximum(l0, l1), tl.maximum(l2, l3)),
                     tl.maximum(tl.maximum(l4, l5), tl.maximum(l6, l7)))  # fmt: skip
    khi = tl.maximum(tl.maximum(tl.maximum(h0, h1), tl.maximum(h2, h3)),
                     tl.maximum(tl.maximum(h4, h5), tl.maximum(h6, h7)))  # fmt: skip
    qb = _ptrs(q_ptr, rows, stride_qm, cols)
    s0 = _row_out(w0, r0, 0, rows, cols, qb, M, N,
                  stride_qm, FMAX, EMAX, FMT, SAT, EVEN)  # fmt: skip
    s1 = _row_out(w1, r1, 1, rows, cols, qb, M, N,
                  stride_qm, FMAX, EMAX, FMT, SAT, EVEN)  # fmt: skip
    s2 = _row_out(w2, r2, 2, rows, cols, qb, M, N,
                  stride_qm, FMAX, EMAX, FMT, SAT, EVEN)  # fmt: skip
    s3 = _row_out(w3, r3, 3, rows, cols, qb, M, N,
                  stride_qm, FMAX, EMAX, FMT, SAT, EVEN)  # fmt: skip
    s4 = _row_out(w4, r4, 4, rows, cols, qb, M, N,
                  stride_qm, FMAX, EMAX, FMT, SAT, EVEN)  # fmt: skip
    s5 = _row_out(w5, r5, 5, rows, cols, qb, M, N,
                  stride_qm, FMAX, EMAX, FMT, SAT, EVEN)  # fmt: skip
    s6 = _row_out(w6, r6, 6, rows, cols, qb, M, N,
                  stride_qm, FMAX, EMAX, FMT, SAT, EVEN)  # fmt: skip
    s7 = _row_out(w7, r7, 7, rows, cols, qb, M, N,
                  stride_qm, FMAX, EMAX, FMT, SAT, EVEN)  # fmt: skip
    _store_row_scales(s0, s1, s2, s3, s4, s5, s6, s7, rows, pid_n, s_ptr, M, N, stride_sm,
                      stride_sn, C, EVEN)  # fmt: skip
    if DUAL:
        NB: tl.constexpr = BM // 32  # 32-row column blocks per tile
        slo, stlo = _scales(_col_reduce(klo, NB), EMAX)  # [NB, G, W]
        shi, sthi = _scales(_col_reduce(khi, NB), EMAX)
        wc3 = tl.reshape(wc, (1, G, W))
        sty = st_ptr.dtype.element_ty
        _store_col_scales(stlo.to(sty), pid_m, wc3, st_ptr, M, N, stride_stm, stride_stn, 0, EVEN)
        _store_col_scales(sthi.to(sty), pid_m, wc3, st_ptr, M, N, stride_stm, stride_stn, 1, EVEN)
        qt = _join8(_col_vals(w0, slo, shi, NB), _col_vals(w1, slo, shi, NB),
                    _col_vals(w2, slo, shi, NB), _col_vals(w3, slo, shi, NB),
                    _col_vals(w4, slo, shi, NB), _col_vals(w5, slo, shi, NB),
                    _col_vals(w6, slo, shi, NB), _col_vals(w7, slo, shi, NB))  # fmt: skip
        qt = _conv(qt, FMAX, qt_ptr.dtype.element_ty, FMT, SAT)  # [R, G, C, 8]
        # [C / 8, R, G, 8, 8]: a thread's 8 columns x 8 rows in the order Triton's store
        # coalescing lays out threads (contiguous M last, then dims 0, 1, 2), which is the
        # order the values already have: no layout conversion (shared memory) before the store
        qt = tl.permute(tl.reshape(qt, (R, G, C // 8, 8, 8)), (2, 0, 1, 3, 4))
        i8 = tl.arange(0, 8)
        n5 = (
            pid_n * BN
            + tl.arange(0, C // 8)[:, None, None, None, None] * 8
            + tl.arange(0, G)[None, None, :, None, None] * C
            + i8[None, None, None, :, None]
        )
        m5 = (pid_m * BM + tl.arange(0, R)[None, :, None, None, None] * 8
              + i8[None, None, None, None, :])  # fmt: skip
        _st(_ptrs(qt_ptr, n5, stride_qtn, m5), qt, (m5 < M) & (n5 < N), EVEN)


# ---- ahead-of-time check -------------------------------------------------------------------

# (name: BM, BN, dual): the default tiles (MX dual 128x128, 8 warps: H200 run 6.3 0.791 /
# 0.793 of copy at 8192x4096 / 6144x4096 vs 64x256 0.785 / 0.779, 128x256 0.767 / 0.750; run
# 6.2: 32x256 0.725, 32x128 0.707); PRIMUS_TURBO_QUANT_WORDS_TILE overrides them for A/B runs
WORDS_CONFIGS = {
    "mx_dual": (128, 128, True),
    "mx_rows": (32, 256, False),
}


# NVIDIA register caps (sm_90 AOT, no spill): MX rows 85 registers uncapped (64: 8 programs
# per SM; run 6.2: 48 0.861, 128 0.863 vs 64 0.866 of copy), MX dual 96
WORDS_MAXNREG = {"mx_rows": 64, "mx_dual": 96}


# AOT only, even: the previous MX dual default (64x256, run 6.3 0.785 / 0.779 of copy), kept
# as the PRIMUS_TURBO_QUANT_WORDS_TILE A/B variant (name: base, BM, BN)
_AOT_TILES = {"mx_dual_64x256": ("mx_dual", 64, 256)}


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 input, the target's e4m3 output (MX: gfx950 / sm_90 only); even (no masks) and
    masked."""
    assert target in AOT_TARGETS, target
    if target == "gfx942":  # no MX recipes on gfx942 (FNUZ fp8)
        return []
    fp8, fmax = aot_fp8(target)
    lanes = AOT_TARGETS[target][2]
    specs = []
    configs = [(name, name, bm, bn, (True, False)) for name, (bm, bn, _) in WORDS_CONFIGS.items()]
    configs += [(name, base, bm, bn, (True,)) for name, (base, bm, bn) in _AOT_TILES.items()]
    for name, base, bm, bn, evens in configs:
        dual = WORDS_CONFIGS[base][2]
        sig = dict(tile_signature(fp8, True))
        sig["stride_xw"] = sig.pop("stride_xm")
        sig = {k: sig[k] for k in ("x_ptr", "q_ptr", "s_ptr", "qt_ptr", "st_ptr", "M", "N",
                                   "stride_xw", "stride_qm", "stride_qtn", "stride_sm",
                                   "stride_sn", "stride_stm", "stride_stn")}  # fmt: skip
        for even in evens:
            cx = {**mx_slice_constexprs(bm, bn, dual, fmax, target, even), "GRID2D": True}
            opts = {"num_warps": slice_warps(bm, bn, lanes)}
            if target == "sm_90":
                opts["maxnreg"] = WORDS_MAXNREG[base]
            specs.append(
                AotSpec(f"quant_words_{name}{'_even' if even else ''}_{fp8}", quant_words_kernel,
                        sig, cx, opts, default=even and name == base)
            )  # fmt: skip
    return specs
