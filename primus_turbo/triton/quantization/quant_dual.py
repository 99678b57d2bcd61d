"""Sliced MXFP8 quantization (rows and dual): the fallback of the MX recipes.

``quant_sliced_kernel`` (see quant_dual_launch) takes the MX rows / MX dual recipes of inputs
the word-sliced kernel (quant_words.py, the default for bf16) cannot read as 32-bit words
(fp16 / fp32, odd ``N`` or row stride, unaligned), and of every row-contiguous input with
``PRIMUS_TURBO_QUANT_WORDS=0``. It loads a ``32 x 256`` tile as 8 row slices, each a 3-D
``[R, G, C]`` view (``R = BM / 8`` rows, ``G = BN / C`` groups of ``C = 32`` columns): slice
``k`` holds rows ``8 r + k`` and columns ``C g + c``. All slices share one register layout, so a
thread holds an ``8 x 8`` block of the tile (8 slices x one 16-byte vector). R is the outer
dimension so that Triton's layout puts it on lanes, not warps (sm_90 SASS: the column
reduction and the transposed copy need no shared memory; 18.5 vs 28 instructions per element
for the tile kernel):
* row amax: per slice, a reduction over ``c`` (in-thread 8 + 4 lanes);
* column amax: an element-wise max over the 8 slices (in-thread), then over ``R``;
* the row output: 8 stores of 8 contiguous bytes per thread; the 8 slices' row scales are
  joined and stored once per tile (one store per slice cost 2 barriers each);
* the column (transposed) output: the 8 cast slices joined along a new last axis, so a thread
  owns 8 consecutive M positions of a transposed row: 8-byte stores along M;
* E8M0 scales from the fp32 exponent bits (``_e8m0_scale``).
H200 runs 5.2 / 5.3 (x of copy): MX dual 0.721 (v3 0.496), MX rows 0.817 (v3 0.783). Removed
after measuring (session 6): the 1x128 dual mode (0.645 vs v3 0.696), persistent programs
(0.39-0.80, always slower), BN 64 / 128 / 512 and BM 64 tiles (0.665-0.695 dual), 32-bit
offsets (0.709 dual, 0.792 rows) and the integer E8M0 variant. Results are bitwise those of
``quant_tile_v2_kernel`` (same ``_finite_abs`` amaxes, scale functions and ``_cast2``).
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
from primus_turbo.triton.quantization.quant_kernel import _finite_abs
from primus_turbo.triton.quantization.quant_kernel_v2 import MAXNREG, _cast2, _e8m0_scale


@triton.jit
def _join8(c0, c1, c2, c3, c4, c5, c6, c7):
    """``[R, G, C, 8]`` with ``c_k`` at index ``k`` of the new (register-held) last axis; nested
    joins index ``[i, j, l]`` -> ``c_{4i + 2j + l}`` after the row-major reshape."""
    lo = tl.join(tl.join(c0, c4), tl.join(c2, c6))
    t = tl.join(lo, tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    return tl.reshape(t, (c0.shape[0], c0.shape[1], c0.shape[2], 8))


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
def _ptrs(base, outer, stride, inner):
    """``base + outer * stride + inner`` with 64-bit offsets."""
    return base + outer.to(tl.int64) * stride + inner


@triton.jit
def _ld(x_ptr, rows, cols, M, N, stride_xm, EVEN: tl.constexpr):
    ptrs = _ptrs(x_ptr, rows, stride_xm, cols)
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=(rows < M) & (cols < N), other=0.0)


@triton.jit
def _ld8(x_ptr, rows, cols, M, N, stride_xm, EVEN: tl.constexpr):
    """The tile's 8 row slices (rows ``rows + k``), as 8 ``_ld`` calls."""
    return (_ld(x_ptr, rows + 0, cols, M, N, stride_xm, EVEN),
            _ld(x_ptr, rows + 1, cols, M, N, stride_xm, EVEN),
            _ld(x_ptr, rows + 2, cols, M, N, stride_xm, EVEN),
            _ld(x_ptr, rows + 3, cols, M, N, stride_xm, EVEN),
            _ld(x_ptr, rows + 4, cols, M, N, stride_xm, EVEN),
            _ld(x_ptr, rows + 5, cols, M, N, stride_xm, EVEN),
            _ld(x_ptr, rows + 6, cols, M, N, stride_xm, EVEN),
            _ld(x_ptr, rows + 7, cols, M, N, stride_xm, EVEN))  # fmt: skip


@triton.jit
def _row_out(x, a, k: tl.constexpr, rows0, cols, q_ptr, M, N, stride_qm, FMAX: tl.constexpr,
             EMAX: tl.constexpr, FMT: tl.constexpr, SAT: tl.constexpr,
             EVEN: tl.constexpr):  # fmt: skip
    """Row-quantize slice ``k`` (fp32 ``x``, its finite ``|x|`` ``a``), store it and return its
    E8M0 scales ``[R, G]``, one per row and 32-column group (stored by the caller, all slices
    at once)."""
    rows = rows0 + k
    scale, sinv = _e8m0_scale(tl.max(a, axis=2), EMAX)
    q = _cast2(x, scale[:, :, None], FMAX, q_ptr.dtype.element_ty, FMT, SAT)
    ptrs = _ptrs(q_ptr, rows, stride_qm, cols)
    if EVEN:
        tl.store(ptrs, q)
    else:
        tl.store(ptrs, q, mask=(rows < M) & (cols < N))
    return sinv


@triton.jit
def _row_out8(f0, f1, f2, f3, f4, f5, f6, f7, a0, a1, a2, a3, a4, a5, a6, a7, r, c, q, M, N, sq,
              FMAX: tl.constexpr, EMAX: tl.constexpr, FMT: tl.constexpr, SAT: tl.constexpr,
              EVEN: tl.constexpr):  # fmt: skip
    """``_row_out`` of the 8 slices, in slice order; their row scales."""
    return (_row_out(f0, a0, 0, r, c, q, M, N, sq, FMAX, EMAX, FMT, SAT, EVEN),
            _row_out(f1, a1, 1, r, c, q, M, N, sq, FMAX, EMAX, FMT, SAT, EVEN),
            _row_out(f2, a2, 2, r, c, q, M, N, sq, FMAX, EMAX, FMT, SAT, EVEN),
            _row_out(f3, a3, 3, r, c, q, M, N, sq, FMAX, EMAX, FMT, SAT, EVEN),
            _row_out(f4, a4, 4, r, c, q, M, N, sq, FMAX, EMAX, FMT, SAT, EVEN),
            _row_out(f5, a5, 5, r, c, q, M, N, sq, FMAX, EMAX, FMT, SAT, EVEN),
            _row_out(f6, a6, 6, r, c, q, M, N, sq, FMAX, EMAX, FMT, SAT, EVEN),
            _row_out(f7, a7, 7, r, c, q, M, N, sq, FMAX, EMAX, FMT, SAT, EVEN))  # fmt: skip


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
    BN: tl.constexpr, DUAL: tl.constexpr, FMAX: tl.constexpr, EMAX: tl.constexpr,
    FMT: tl.constexpr, SAT: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    """Quantize one tile given as its 8 slices (see the module docstring)."""
    C: tl.constexpr = 32
    rows, cols = _offsets(t, grid_n, BM, BN, C)
    pid_m = t // grid_n
    pid_n = t - pid_m * grid_n
    f0, f1, f2, f3 = x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32)
    f4, f5, f6, f7 = x4.to(tl.float32), x5.to(tl.float32), x6.to(tl.float32), x7.to(tl.float32)
    a0, a1, a2, a3 = _finite_abs(f0), _finite_abs(f1), _finite_abs(f2), _finite_abs(f3)
    a4, a5, a6, a7 = _finite_abs(f4), _finite_abs(f5), _finite_abs(f6), _finite_abs(f7)
    s0, s1, s2, s3, s4, s5, s6, s7 = _row_out8(f0, f1, f2, f3, f4, f5, f6, f7, a0, a1, a2, a3,
                                               a4, a5, a6, a7, rows, cols, q_ptr, M, N,
                                               stride_qm, FMAX, EMAX, FMT, SAT,
                                               EVEN)  # fmt: skip
    _store_row_scales(s0, s1, s2, s3, s4, s5, s6, s7, rows, pid_n, s_ptr, M, N, stride_sm,
                      stride_sn, C, EVEN)  # fmt: skip
    if DUAL:  # NB = BM / 32 column groups per tile
        NB: tl.constexpr = BM // 32
        R: tl.constexpr = BM // 8
        G: tl.constexpr = BN // C
        a = tl.maximum(tl.maximum(tl.maximum(a0, a1), tl.maximum(a2, a3)),
                       tl.maximum(tl.maximum(a4, a5), tl.maximum(a6, a7)))  # fmt: skip
        if NB == 1:  # the 1-tile-row path exactly as measured in run 5.2
            ac = tl.max(a, axis=0)  # [G, C]
        else:
            ac = tl.max(tl.reshape(a, (NB, R // NB, G, C)), axis=1)  # [NB, G, C]
        sc, sinv_c = _e8m0_scale(ac, EMAX)
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
        qt_ptrs = _ptrs(qt_ptr, n4, stride_qtn, m4)
        if EVEN:
            tl.store(qt_ptrs, qt)
        else:
            tl.store(qt_ptrs, qt, mask=(m4 < M) & (n4 < N))


@triton.jit
def quant_sliced_kernel(
    x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm, stride_qm, stride_qtn, stride_sm,
    stride_sn, stride_stm, stride_stn, BM: tl.constexpr, BN: tl.constexpr, DUAL: tl.constexpr,
    FMAX: tl.constexpr, EMAX: tl.constexpr = 8, FMT: tl.constexpr = (0, 0, 0, 0),
    SAT: tl.constexpr = False, EVEN: tl.constexpr = False,
):  # fmt: skip
    """``x`` [M, N] (unit column stride) -> ``q`` [M, N] and, with ``DUAL``, ``qt`` [N, M]
    (unit column strides); E8M0 ``s`` [M, N/32] / ``st`` [N, M/32] by (row, group) /
    (M group, column) strides. One tile per program."""
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BN)
    rows, cols = _offsets(pid, grid_n, BM, BN, 32)
    x0, x1, x2, x3, x4, x5, x6, x7 = _ld8(x_ptr, rows, cols, M, N, stride_xm, EVEN)
    _quant_tile(x0, x1, x2, x3, x4, x5, x6, x7, pid, grid_n, q_ptr, s_ptr, qt_ptr, st_ptr,
                M, N, stride_qm, stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn,
                BM, BN, DUAL, FMAX, EMAX, FMT, SAT, EVEN)  # fmt: skip


# ---- ahead-of-time check -------------------------------------------------------------------

# (name: BM, BN, dual, warps on NVIDIA) as quant_dual_launch picks them (AMD: half the warps,
# wavefront 64: the same lanes per tile)
SLICED_CONFIGS = {
    "mx_dual": (32, 256, True, 4),
    "mx_rows": (32, 256, False, 4),
}


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 input, the target's e4m3 output (MX: gfx950 / sm_90 only); even (no masks) and
    masked."""
    assert target in AOT_TARGETS, target
    if target == "gfx942":  # no MX recipes on gfx942 (FNUZ fp8)
        return []
    fp8, fmax = aot_fp8(target)
    nv = {"maxnreg": MAXNREG} if target == "sm_90" else {}
    lanes = AOT_TARGETS[target][2]
    specs = []
    for name, (bm, bn, dual, _) in SLICED_CONFIGS.items():
        for even in (True, False):
            cx = mx_slice_constexprs(bm, bn, dual, fmax, target, even)
            specs.append(
                AotSpec(f"quant_sliced_{name}{'_even' if even else ''}_{fp8}", quant_sliced_kernel,
                        tile_signature(fp8, True), cx,
                        {"num_warps": slice_warps(bm, bn, lanes), **nv}, default=even)
            )  # fmt: skip
    return specs
