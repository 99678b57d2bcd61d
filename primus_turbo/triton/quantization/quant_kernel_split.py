"""Dual (row + transposed column) quantization without a shared-memory transpose.

``quant_split_kernel`` (``PRIMUS_TURBO_QUANT_SPLIT=8``; see quant_launch) loads a ``BM x BN``
tile as ``SPLIT`` row slices: slice ``k`` holds rows ``SPLIT * r + k`` (``r < BM / SPLIT``).
The slices have the same shape and pointer contiguity, so they get the same register layout:
a thread holds the same ``(r, 8 columns)`` positions of every slice, i.e. a ``SPLIT x 8`` block
of the tile. Then
* row amax (1 x BN blocks) is a per-slice reduction along N, as in the plain tile;
* column amax (BM x 1 blocks) is an element-wise max over the slices (in-thread) and a
  reduction over ``r``;
* the row output is ``SPLIT`` stores of 8 contiguous bytes per thread;
* the column output is the ``SPLIT`` cast slices joined along a new last axis
  (``[BM / SPLIT, BN, SPLIT]``, held in the thread's registers: ``tl.join`` + ``tl.reshape``),
  so each thread owns ``SPLIT`` consecutive M positions of a transposed row and the store runs
  along M without the fp8 tile's round trip through shared memory (v2: ~2 LDS/STS per element
  plus their address math, 16 KB of shared memory per 128 x 128 tile).
Modes: ``ROWS`` (1 x BN and BM x 1 blocks: the 1x128 dual recipe with BM = BN = 128),
``MX`` (E8M0 scales per 32 along N and, with BM = 32, per 32 along M; ~20 SASS instructions
per element on sm_90 vs ~28 for the reshaped tile). (A tensorwise dual mode was removed: its
bits differed from the tile kernel's on the H200, run 4.4.) Scale math is
``_scale_of`` (reciprocal once per row / column, one multiply per element), the conversion
``_cast2``: results are bitwise those of ``quant_tile_v2_kernel``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.aot import AOT_TARGETS, AotSpec
from primus_turbo.triton.quantization.quant_kernel import MX, ROWS, _finite_abs, _scale_of
from primus_turbo.triton.quantization.quant_kernel_v2 import MAXNREG, _cast2, _e8m0_scale


@triton.jit
def _join8(c0, c1, c2, c3, c4, c5, c6, c7):
    """``[..., 8]`` with ``c_k`` at index ``k`` of the new (register-held) last axis. Nested
    joins index ``[i, j, l]`` -> arguments (inner i, middle j, outer l); the row-major reshape
    flattens to ``4 i + 2 j + l``, hence the argument order."""
    lo = tl.join(tl.join(c0, c4), tl.join(c2, c6))
    t = tl.join(lo, tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    return tl.reshape(t, (c0.shape[0], c0.shape[1], 8))


@triton.jit
def _rcp(x):
    """``rcp.approx.ftz.f32`` (one MUFU.RCP on sm_90)."""
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x],
                                     dtype=tl.float32, is_pure=True, pack=1)  # fmt: skip


@triton.jit
def _scale_rcp(amax, FMAX: tl.constexpr, RCP: tl.constexpr):
    """``_scale_of(amax, FMAX, False, 0)``; with ``RCP`` (NVIDIA compiled kernels) the two
    ``div.full.f32`` (range checks + scaling + MUFU.RCP + multiply, ~9 SASS each, evaluated
    per replicated row / column: ~4 SASS per element of the 1x128 dual tile) become
    ``(FMAX / 4) * rcp(amax / 4)`` and ``rcp(scale)``. Same bits as ``div.full``: for a
    divisor in [2^-126, 2^126] ``div.full(x, y) = x * rcp(y)``; ``amax / 4`` is in that range
    for every amax in [1e-12, bf16/fp32 max], ``rcp`` scales exactly by powers of two on
    normal values and the product rounds the same real; ``scale`` is in [1e-36, 5e14]."""
    if RCP:
        scale = (FMAX * 0.25) * _rcp(tl.maximum(amax, 1e-12) * 0.25)
        return scale, _rcp(scale)
    return _scale_of(amax, FMAX, False, 0)


@triton.jit
def _load(x_ptr, rows, rn, M, N, stride_xm, EVEN: tl.constexpr):
    ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + rn[None, :]
    if EVEN:
        return tl.load(ptrs).to(tl.float32)
    return tl.load(ptrs, mask=(rows < M)[:, None] & (rn < N)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _amax8(x0, x1, x2, x3, x4, x5, x6, x7, FINITE: tl.constexpr):
    """(row amax of each slice [R] x 8, column amax [BN]) of ``|x|`` (finite values only with
    ``FINITE``)."""
    if FINITE:
        a0, a1, a2, a3 = _finite_abs(x0), _finite_abs(x1), _finite_abs(x2), _finite_abs(x3)
        a4, a5, a6, a7 = _finite_abs(x4), _finite_abs(x5), _finite_abs(x6), _finite_abs(x7)
    else:
        a0, a1, a2, a3 = tl.abs(x0), tl.abs(x1), tl.abs(x2), tl.abs(x3)
        a4, a5, a6, a7 = tl.abs(x4), tl.abs(x5), tl.abs(x6), tl.abs(x7)
    a = tl.maximum(tl.maximum(tl.maximum(a0, a1), tl.maximum(a2, a3)),
                   tl.maximum(tl.maximum(a4, a5), tl.maximum(a6, a7)))  # fmt: skip
    r = _join8(tl.max(a0, axis=1)[:, None], tl.max(a1, axis=1)[:, None],
               tl.max(a2, axis=1)[:, None], tl.max(a3, axis=1)[:, None],
               tl.max(a4, axis=1)[:, None], tl.max(a5, axis=1)[:, None],
               tl.max(a6, axis=1)[:, None], tl.max(a7, axis=1)[:, None])  # fmt: skip
    return tl.reshape(r, (r.shape[0], 8)), tl.max(a, axis=0)


@triton.jit
def _store_rows(x, k: tl.constexpr, scale8, rb, rn, q_ptr, s_ptr, pid_n, M, N, stride_qm,
                stride_sm, stride_sn, FMAX: tl.constexpr, EMAX: tl.constexpr, FMT: tl.constexpr,
                SAT: tl.constexpr, EVEN: tl.constexpr, MODE: tl.constexpr):  # fmt: skip
    """Row-quantize slice ``k`` (rows ``rb + k``) and store it: ROWS with column ``k`` of
    ``scale8`` [R, 8]; MX with the E8M0 scales of its own
    32-groups (stored here too)."""
    rows = rb + k
    qty = q_ptr.dtype.element_ty
    if MODE == 0:
        sel = tl.arange(0, 8)[None, :] == k
        scale = tl.sum(tl.where(sel, scale8, 0.0), axis=1)[:, None]
        q = _cast2(x, scale, FMAX, qty, FMT, SAT)
    else:  # MX
        R: tl.constexpr = x.shape[0]
        G: tl.constexpr = x.shape[1] // 32
        xr = tl.reshape(x, (R, G, 32))
        scale, sinv = _e8m0_scale(tl.max(_finite_abs(xr), axis=2), EMAX)  # [R, G]
        q = tl.reshape(_cast2(xr, scale[:, :, None], FMAX, qty, FMT, SAT), (R, G * 32))
        g = pid_n * G + tl.arange(0, G)
        s_ptrs = s_ptr + rows.to(tl.int64)[:, None] * stride_sm + g[None, :] * stride_sn
        if EVEN:
            tl.store(s_ptrs, sinv.to(s_ptr.dtype.element_ty))
        else:
            tl.store(s_ptrs, sinv.to(s_ptr.dtype.element_ty),
                     mask=(rows < M)[:, None] & (g * 32 < N)[None, :])  # fmt: skip
    ptrs = q_ptr + rows.to(tl.int64)[:, None] * stride_qm + rn[None, :]
    if EVEN:
        tl.store(ptrs, q)
    else:
        tl.store(ptrs, q, mask=(rows < M)[:, None] & (rn < N)[None, :])


@triton.jit
def quant_split_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    qt_ptr,
    st_ptr,
    M,
    N,
    stride_xm,
    stride_qm,
    stride_qtn,
    stride_sm,
    stride_sn,
    stride_stm,
    stride_stn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    MODE: tl.constexpr,
    FMAX: tl.constexpr,
    FMT: tl.constexpr = (0, 0, 0, 0),
    SAT: tl.constexpr = False,
    EVEN: tl.constexpr = False,
    FAST: tl.constexpr = False,
    EMAX: tl.constexpr = 8,
    RCP: tl.constexpr = False,
):
    """``x`` [M, N] (unit column stride) -> ``q`` [M, N] and ``qt`` [N, M] (unit column
    strides), one ``BM x BN`` tile per program (grid: tiles, row-major over (M, N) tiles).
    ROWS: ``s`` (row, block) / ``st`` (M block, column) by strides; MX: E8M0 scales.
    ``FAST`` (ROWS; off by default: at the 128-register cap the 128 x 128 tile spills ~90 B
    on sm_90, 119 registers without it; ~20 vs ~22 SASS instructions per element, v2's tile
    kernel ~25): the amaxes of plain ``|x|`` (NaN is dropped by the max); the tile is reduced
    again with the inf/NaN filter only when the largest column amax is not finite. That test
    reads the column amaxes every warp already holds (no barrier), and every inf of the tile
    lies in some column, so the row amaxes are covered too."""
    R: tl.constexpr = BM // 8
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BN)
    pid_m = pid // grid_n
    pid_n = pid - pid_m * grid_n
    rb = pid_m * BM + tl.arange(0, R) * 8  # first row of each 8-row group
    rn = pid_n * BN + tl.arange(0, BN)
    x0 = _load(x_ptr, rb + 0, rn, M, N, stride_xm, EVEN)
    x1 = _load(x_ptr, rb + 1, rn, M, N, stride_xm, EVEN)
    x2 = _load(x_ptr, rb + 2, rn, M, N, stride_xm, EVEN)
    x3 = _load(x_ptr, rb + 3, rn, M, N, stride_xm, EVEN)
    x4 = _load(x_ptr, rb + 4, rn, M, N, stride_xm, EVEN)
    x5 = _load(x_ptr, rb + 5, rn, M, N, stride_xm, EVEN)
    x6 = _load(x_ptr, rb + 6, rn, M, N, stride_xm, EVEN)
    x7 = _load(x_ptr, rb + 7, rn, M, N, stride_xm, EVEN)
    qty = qt_ptr.dtype.element_ty
    k8 = tl.arange(0, 8)[None, :]
    if MODE == 0:
        ar, ac = _amax8(x0, x1, x2, x3, x4, x5, x6, x7, not FAST)  # [R, 8], [BN]
        if FAST:
            if tl.where(tl.max(ac, axis=0) < float("inf"), 0, 1) != 0:
                ar, ac = _amax8(x0, x1, x2, x3, x4, x5, x6, x7, True)
        sc, sinv_c = _scale_rcp(ac, FMAX, RCP)
        sr, sinv_r = _scale_rcp(ar, FMAX, RCP)  # [R, 8]: row rb + k in column k
        s_ptrs = s_ptr + (rb[:, None] + k8).to(tl.int64) * stride_sm + pid_n * stride_sn
        if EVEN:
            tl.store(st_ptr + pid_m * stride_stm + rn * stride_stn, sinv_c)
            tl.store(s_ptrs, sinv_r)
        else:
            tl.store(st_ptr + pid_m * stride_stm + rn * stride_stn, sinv_c, mask=rn < N)
            tl.store(s_ptrs, sinv_r, mask=(rb[:, None] + k8) < M)
        sc = sc[None, :]
    else:  # MX: BM == 32, so a column's 32-group is the whole tile height
        a = tl.maximum(tl.maximum(tl.maximum(_finite_abs(x0), _finite_abs(x1)),
                                  tl.maximum(_finite_abs(x2), _finite_abs(x3))),
                       tl.maximum(tl.maximum(_finite_abs(x4), _finite_abs(x5)),
                                  tl.maximum(_finite_abs(x6), _finite_abs(x7))))  # fmt: skip
        sc, sinv_c = _e8m0_scale(tl.max(a, axis=0), EMAX)  # [BN]
        sinv_c = sinv_c.to(st_ptr.dtype.element_ty)
        if EVEN:
            tl.store(st_ptr + pid_m * stride_stm + rn * stride_stn, sinv_c)
        else:
            tl.store(st_ptr + pid_m * stride_stm + rn * stride_stn, sinv_c, mask=rn < N)
        sc = sc[None, :]
        sr = sc  # unused: each slice takes its own 32-group scales
    _store_rows(x0, 0, sr, rb, rn, q_ptr, s_ptr, pid_n, M, N, stride_qm, stride_sm,
                stride_sn, FMAX, EMAX, FMT, SAT, EVEN, MODE)  # fmt: skip
    _store_rows(x1, 1, sr, rb, rn, q_ptr, s_ptr, pid_n, M, N, stride_qm, stride_sm,
                stride_sn, FMAX, EMAX, FMT, SAT, EVEN, MODE)  # fmt: skip
    _store_rows(x2, 2, sr, rb, rn, q_ptr, s_ptr, pid_n, M, N, stride_qm, stride_sm,
                stride_sn, FMAX, EMAX, FMT, SAT, EVEN, MODE)  # fmt: skip
    _store_rows(x3, 3, sr, rb, rn, q_ptr, s_ptr, pid_n, M, N, stride_qm, stride_sm,
                stride_sn, FMAX, EMAX, FMT, SAT, EVEN, MODE)  # fmt: skip
    _store_rows(x4, 4, sr, rb, rn, q_ptr, s_ptr, pid_n, M, N, stride_qm, stride_sm,
                stride_sn, FMAX, EMAX, FMT, SAT, EVEN, MODE)  # fmt: skip
    _store_rows(x5, 5, sr, rb, rn, q_ptr, s_ptr, pid_n, M, N, stride_qm, stride_sm,
                stride_sn, FMAX, EMAX, FMT, SAT, EVEN, MODE)  # fmt: skip
    _store_rows(x6, 6, sr, rb, rn, q_ptr, s_ptr, pid_n, M, N, stride_qm, stride_sm,
                stride_sn, FMAX, EMAX, FMT, SAT, EVEN, MODE)  # fmt: skip
    _store_rows(x7, 7, sr, rb, rn, q_ptr, s_ptr, pid_n, M, N, stride_qm, stride_sm,
                stride_sn, FMAX, EMAX, FMT, SAT, EVEN, MODE)  # fmt: skip
    # the column copy: 8 cast slices joined into [R, BN, 8] (8 consecutive M per thread)
    qt = _join8(
        _cast2(x0, sc, FMAX, qty, FMT, SAT), _cast2(x1, sc, FMAX, qty, FMT, SAT),
        _cast2(x2, sc, FMAX, qty, FMT, SAT), _cast2(x3, sc, FMAX, qty, FMT, SAT),
        _cast2(x4, sc, FMAX, qty, FMT, SAT), _cast2(x5, sc, FMAX, qty, FMT, SAT),
        _cast2(x6, sc, FMAX, qty, FMT, SAT), _cast2(x7, sc, FMAX, qty, FMT, SAT),
    )  # fmt: skip
    k = tl.arange(0, 8)[None, None, :]
    m3 = rb[:, None, None] + k
    n3 = rn[None, :, None]
    qt_ptrs = qt_ptr + n3.to(tl.int64) * stride_qtn + m3
    if EVEN:
        tl.store(qt_ptrs, qt)
    else:
        tl.store(qt_ptrs, qt, mask=(m3 < M) & (n3 < N))


# ---- ahead-of-time check -------------------------------------------------------------------

# (name, mode, BM, BN, warps on NVIDIA) as quant_launch picks them with
# PRIMUS_TURBO_QUANT_SPLIT=1 (warps: one 8-wide vector per thread and row slice; half on AMD)
SPLIT_CONFIGS = {
    "block_dual": (ROWS, 128, 128, 8),
    "mx_dual": (MX, 32, 256, 4),  # BM must be 32 (one MX group of rows per tile)
}


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 input, the target's e4m3 output (FNUZ on gfx942); even and masked variants."""
    assert target in AOT_TARGETS, target
    fp8, fmax = ("fp8e4b8", 240.0) if target == "gfx942" else ("fp8e4nv", 448.0)
    sig = {
        "x_ptr": "*bf16",
        "q_ptr": f"*{fp8}",
        "s_ptr": "*fp32",
        "qt_ptr": f"*{fp8}",
        "st_ptr": "*fp32",
        "M": "i32:16",
        "N": "i32:16",
        "stride_xm": "i32:16",
        "stride_qm": "i32:16",
        "stride_qtn": "i32:16",
        "stride_sm": "i32",
        "stride_sn": "i32",
        "stride_stm": "i32",
        "stride_stn": "i32",
    }
    specs = []
    nv = {"maxnreg": MAXNREG} if target == "sm_90" else {}  # as the launcher caps it
    for name, (mode, bm, bn, warps) in SPLIT_CONFIGS.items():
        if mode == MX and target == "gfx942":
            continue
        lanes = 64 if target.startswith("gfx") else 32
        warps = max(1, bm * bn // (64 * lanes))  # as the launcher derives them
        for even in (True, False):
            cx = {"BM": bm, "BN": bn, "MODE": mode, "FMAX": fmax, "FMT": (0, 0, 0, 0),
                  "SAT": target == "sm_90", "EVEN": even,
                  "FAST": False, "EMAX": 8, "RCP": False}  # fmt: skip
            ssig = dict(sig, **({"s_ptr": "*u8", "st_ptr": "*u8"} if mode == MX else {}))
            specs.append(
                AotSpec(f"quant_split_{name}{'_even' if even else ''}_{fp8}", quant_split_kernel,
                        ssig, cx, {"num_warps": warps, **nv}, default=name == "block_dual" and even)
            )  # fmt: skip
    if target == "sm_90":  # PRIMUS_TURBO_QUANT_RCP=1 (NVIDIA only)
        for sp in [sp for sp in specs if "_even" in sp.name and "mx" not in sp.name]:
            specs.append(AotSpec(sp.name.replace("_even", "_even_rcp"), sp.fn, sp.signature,
                                 {**sp.constexprs, "RCP": True}, sp.options))  # fmt: skip
    return specs
