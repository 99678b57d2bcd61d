"""Quantization kernels, versions 2 and 3 (``PRIMUS_TURBO_QUANT_IMPL=v2|v3``; v3 the default).

``quant_tile_v2_kernel`` covers the one-pass blockwise recipes (1x128 + dual 128x1, 128x128
tiles, MX 1x32 + dual 32x1) of a row-contiguous input. Against ``quant_tile_kernel`` (v1):
* ``SAT`` (NVIDIA): the fp32 -> fp8 conversion is ``cvt.rn.satfinite``, which already clamps
  to +-max (inf included) and keeps NaN, so the clamp + NaN select (4 of ~30 instructions per
  element and output on sm_90) is dropped; the launcher caps registers (``maxnreg``) so two
  8-warp programs share an SM.
* ``STAGES >= 2``: persistent programs walk the tiles ``pid, pid + P, ...`` in a
  software-pipelined loop (cp.async on NVIDIA: the next tile is in flight while this one is
  reduced and stored). Used only where no output is transposed: a transposed read of the
  (unswizzled) staging buffer is bank-conflicted 16 ways on sm_90. ``STAGES == 1``: one tile
  per program, no loop.
``FAST`` / ``EVEN`` (``PRIMUS_TURBO_QUANT_IMPL=v3``, the default): the amaxes are taken over
plain ``|x|`` and redone with the inf/NaN filter only for a tile whose amax is not finite (same
results, ~2 fewer instructions per element); ``EVEN`` (the shape a multiple of the tile) drops
every mask. v2 is the same kernel with both off.
Per tile the input is read once, both outputs come from registers, the dual copy is
transposed in registers (its ``[N, M]`` store runs along M in 16-byte vectors when M % 16 == 0)
and scales are written once. Semantics are those of v1 (same ``_scale_of``/``_finite_abs``).
"""

from __future__ import annotations

import itertools

import triton
import triton.language as tl

from primus_turbo.triton.aot import AOT_TARGETS, AotSpec
from primus_turbo.triton.quantization.quant_common import aot_fp8, tile_signature
from primus_turbo.triton.quantization.quant_kernel import (
    GIVEN,
    MX,
    ROWS,
    TILE,
    _cast,
    _finite_abs,
    _scale_of,
)


@triton.jit
def _cast2(x, scale, FMAX: tl.constexpr, dtype, FMT: tl.constexpr, SAT: tl.constexpr):
    """``_cast``; with ``SAT`` (NVIDIA: the fp32 -> fp8 conversion is ``cvt.rn.satfinite``,
    which already clamps finite values and inf to +-max and keeps NaN) the clamp is skipped."""
    if SAT:
        return (x * scale).to(dtype)
    return _cast(x, scale, FMAX, dtype, FMT)


@triton.jit
def _e8m0_scale(amax, EMAX: tl.constexpr):
    """``_scale_of(amax, IS_MX=True)`` with ``floor(log2(.))`` read from the fp32 exponent
    field (exact for the normal ``max(amax, 2^-126)``; libdevice log2 was ~12 FMAs per scale,
    and the replicated scale layouts evaluate ~1 scale per element in the MX dual tile)."""
    a = tl.maximum(amax, 1.1754943508222875e-38)
    e = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127 - EMAX
    e = tl.minimum(tl.maximum(e, -127), 127).to(tl.float32)
    return tl.exp2(-e), e + 127.0


@triton.jit
def _amaxes(a, BM: tl.constexpr, BN: tl.constexpr, MODE: tl.constexpr, DUAL: tl.constexpr):
    """(row-direction amax, column-direction amax) of a tile of ``|x|`` per ``MODE``: MX per
    32-group ([BM, BN/32], [BM/32, BN]); ROWS per row / column; TILE the tile's (twice)."""
    if MODE == 4:
        ar = tl.max(tl.reshape(a, (BM, BN // 32, 32)), axis=2)
        if DUAL:
            ac = tl.max(tl.reshape(a, (BM // 32, 32, BN)), axis=1)
        else:
            ac = ar
    elif MODE == 0:
        ar = tl.max(a, axis=1)
        if DUAL:
            ac = tl.max(a, axis=0)
        else:
            ac = ar
    else:
        ar = tl.max(tl.max(a, axis=1), axis=0)
        ac = ar
    return ar, ac


@triton.jit
def _tile_amaxes(x, BM: tl.constexpr, BN: tl.constexpr, MODE: tl.constexpr,
                 DUAL: tl.constexpr, FAST: tl.constexpr):  # fmt: skip
    """``_amaxes`` of the finite ``|x|``. ``FAST`` (v3): first over plain ``|x|`` (no inf/NaN
    select per element: 2 of ~25 SASS instructions per element in the 1x128 dual tile); when
    the tile's largest row amax is not finite (an inf, or a NaN the max did not drop) the tile
    is reduced again with the filter, so the result is always the filtered one."""
    if FAST:
        ar, ac = _amaxes(tl.abs(x), BM, BN, MODE, DUAL)
        top = ar
        if MODE == 4:
            top = tl.max(ar, axis=1)
        if MODE != 2:
            top = tl.max(top, axis=0)
        if tl.where(top < float("inf"), 0, 1) != 0:
            ar, ac = _amaxes(_finite_abs(x), BM, BN, MODE, DUAL)
    else:
        ar, ac = _amaxes(_finite_abs(x), BM, BN, MODE, DUAL)
    return ar, ac


MX4 = 5  # MX through a 4-D [BM/32, 32, BN/32, 32] view of the tile (v3, see _mx_tile_4d)


@triton.jit
def _mx_tile_4d(
    t, grid_n, x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm, stride_qm, stride_qtn,
    stride_sm, stride_sn, stride_stm, stride_stn, BM: tl.constexpr, BN: tl.constexpr,
    DUAL: tl.constexpr, FMAX: tl.constexpr, EMAX: tl.constexpr, FMT: tl.constexpr,
    SAT: tl.constexpr, FAST: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    """MX tile addressed as 4-D ``[GM, 32, G, 32]`` (row group, row, column group, column) so
    both 32-groups are plain axis reductions (axis 3: along N; axis 1: along M) and the
    row output is stored from the load's layout: no reshapes (each was a shared-memory layout
    conversion). The dual copy permutes the loaded (bf16) tile to ``[G, 32, GM, 32]`` once, so
    its 32-groups along M are last-axis reductions too and its store runs along M."""
    qty = q_ptr.dtype.element_ty
    G: tl.constexpr = BN // 32
    GM: tl.constexpr = BM // 32
    pid_m = t // grid_n
    pid_n = t - pid_m * grid_n
    i32 = tl.arange(0, 32)
    row = pid_m * BM + tl.arange(0, GM)[:, None, None, None] * 32 + i32[None, :, None, None]
    col = pid_n * BN + tl.arange(0, G)[None, None, :, None] * 32 + i32[None, None, None, :]
    row64 = row.to(tl.int64)
    if EVEN:
        mask = None
        xr = tl.load(x_ptr + row64 * stride_xm + col)
    else:
        mask = (row < M) & (col < N)
        xr = tl.load(x_ptr + row64 * stride_xm + col, mask=mask, other=0.0)
    x = xr.to(tl.float32)
    if FAST:  # plain |x|; the filtered amaxes only when a row group's amax is not finite
        ar = tl.max(tl.abs(x), axis=3)  # [GM, 32, G]
        if tl.where(tl.max(tl.max(tl.max(ar, axis=2), axis=1), axis=0) < float("inf"), 0,
                    1) != 0:  # fmt: skip
            ar = tl.max(_finite_abs(x), axis=3)
    else:
        ar = tl.max(_finite_abs(x), axis=3)
    scale, sinv = _e8m0_scale(ar, EMAX)
    tl.store(q_ptr + row64 * stride_qm + col,
             _cast2(x, scale[:, :, :, None], FMAX, qty, FMT, SAT), mask=mask)  # fmt: skip
    g3 = pid_n * G + tl.arange(0, G)[None, None, :]
    row3 = pid_m * BM + tl.arange(0, GM)[:, None, None] * 32 + i32[None, :, None]
    tl.store(s_ptr + row3.to(tl.int64) * stride_sm + g3 * stride_sn,
             sinv.to(s_ptr.dtype.element_ty),
             mask=None if EVEN else (row3 < M) & (g3 * 32 < N))  # fmt: skip
    if DUAL:  # the bf16 tile transposed once (2 B/element through shared memory), then the
        # column groups are reductions along the last axis, as the row groups were
        xt = tl.permute(xr, (2, 3, 0, 1)).to(tl.float32)  # [G, 32, GM, 32]
        if FAST:
            ac = tl.max(tl.abs(xt), axis=3)  # [G, 32, GM]
            if tl.where(tl.max(tl.max(tl.max(ac, axis=2), axis=1), axis=0) < float("inf"),
                        0, 1) != 0:  # fmt: skip
                ac = tl.max(_finite_abs(xt), axis=3)
        else:
            ac = tl.max(_finite_abs(xt), axis=3)
        sc, sinv_c = _e8m0_scale(ac, EMAX)
        qc = _cast2(xt, sc[:, :, :, None], FMAX, qty, FMT, SAT)
        col_t = pid_n * BN + tl.arange(0, G)[:, None, None, None] * 32 + i32[None, :, None, None]
        row_t = pid_m * BM + tl.arange(0, GM)[None, None, :, None] * 32 + i32[None, None, None, :]
        tl.store(qt_ptr + col_t.to(tl.int64) * stride_qtn + row_t, qc,
                 mask=None if EVEN else (col_t < N) & (row_t < M))  # fmt: skip
        col3 = pid_n * BN + tl.arange(0, G)[:, None, None] * 32 + i32[None, :, None]
        gm3 = pid_m * GM + tl.arange(0, GM)[None, None, :]
        tl.store(st_ptr + gm3 * stride_stm + col3.to(tl.int64) * stride_stn,
                 sinv_c.to(st_ptr.dtype.element_ty),
                 mask=None if EVEN else (gm3 * 32 < M) & (col3 < N))  # fmt: skip


@triton.jit
def _one_tile(
    t, grid_n, x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm, stride_qm, stride_qtn,
    stride_sm, stride_sn, stride_stm, stride_stn, BM: tl.constexpr, BN: tl.constexpr,
    MODE: tl.constexpr, DUAL: tl.constexpr, FMAX: tl.constexpr, EMAX: tl.constexpr,
    FMT: tl.constexpr, SAT: tl.constexpr, NP: tl.constexpr, FAST: tl.constexpr,
    EVEN: tl.constexpr,
):  # fmt: skip
    qty = q_ptr.dtype.element_ty
    pid_m = t // grid_n
    pid_n = t - pid_m * grid_n
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rm64 = rm.to(tl.int64)
    mask_m = rm < M
    mask_n = rn < N
    mask = mask_m[:, None] & mask_n[None, :]
    mask_t = mask_n[:, None] & mask_m[None, :]
    if EVEN:  # M % BM == 0 and N % BN == 0: no masks (the constant-true ones fold away)
        mask = None
        mask_t = None
        x = tl.load(x_ptr + rm64[:, None] * stride_xm + rn[None, :])
    else:
        x = tl.load(x_ptr + rm64[:, None] * stride_xm + rn[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    q_ptrs = q_ptr + rm64[:, None] * stride_qm + rn[None, :]
    qt_ptrs = qt_ptr + rn.to(tl.int64)[:, None] * stride_qtn + rm[None, :]
    if MODE != 3:
        ar, ac = _tile_amaxes(x, BM, BN, MODE, DUAL, FAST)
    if MODE == 4:  # MX: E8M0 scale per 32 along N (dual: per 32 along M)
        G: tl.constexpr = BN // 32
        scale, sinv = _e8m0_scale(ar, EMAX)
        q = _cast2(tl.reshape(x, (BM, G, 32)), scale[:, :, None], FMAX, qty, FMT, SAT)
        tl.store(q_ptrs, tl.reshape(q, (BM, BN)), mask=mask)
        rg = pid_n * G + tl.arange(0, G)
        s_mask = None if EVEN else mask_m[:, None] & (rg[None, :] * 32 < N)
        tl.store(s_ptr + rm64[:, None] * stride_sm + rg[None, :] * stride_sn,
                 sinv.to(s_ptr.dtype.element_ty), mask=s_mask)  # fmt: skip
        if DUAL:
            GM: tl.constexpr = BM // 32
            sc, sinv_c = _e8m0_scale(ac, EMAX)
            qc = _cast2(tl.reshape(x, (GM, 32, BN)), sc[:, None, :], FMAX, qty, FMT, SAT)
            tl.store(qt_ptrs, tl.trans(tl.reshape(qc, (BM, BN))), mask=mask_t)
            rgm = pid_m * GM + tl.arange(0, GM)
            st_mask = None if EVEN else (rgm[:, None] * 32 < M) & mask_n[None, :]
            tl.store(st_ptr + rgm[:, None] * stride_stm + rn[None, :] * stride_stn,
                     sinv_c.to(st_ptr.dtype.element_ty), mask=st_mask)  # fmt: skip
    elif MODE == 0:  # ROWS: one scale per row of the tile (1 x BN blocks)
        scale, sinv = _scale_of(ar, FMAX, False, EMAX)
        tl.store(q_ptrs, _cast2(x, scale[:, None], FMAX, qty, FMT, SAT), mask=mask)
        tl.store(s_ptr + rm64 * stride_sm + pid_n * stride_sn, sinv,
                 mask=None if EVEN else mask_m)  # fmt: skip
        if DUAL:  # one scale per column of the tile (BM x 1 blocks) into the copy
            sc, sinv_c = _scale_of(ac, FMAX, False, EMAX)
            tl.store(qt_ptrs, tl.trans(_cast2(x, sc[None, :], FMAX, qty, FMT, SAT)), mask=mask_t)
            tl.store(st_ptr + pid_m * stride_stm + rn * stride_stn, sinv_c,
                     mask=None if EVEN else mask_n)  # fmt: skip
    else:  # TILE: the tile's scale; GIVEN: the tensor's, from NP partial maxima at st_ptr
        if MODE == 2:
            amax = ar
        else:
            amax = tl.max(tl.load(st_ptr + tl.arange(0, NP)), axis=0)
        scale, sinv = _scale_of(amax, FMAX, False, EMAX)
        q = _cast2(x, scale, FMAX, qty, FMT, SAT)
        tl.store(q_ptrs, q, mask=mask)
        if MODE == 2 or t == 0:
            tl.store(s_ptr + pid_m * stride_sm + pid_n * stride_sn, sinv)
        if DUAL:
            tl.store(qt_ptrs, tl.trans(q), mask=mask_t)


@triton.jit
def quant_tile_v2_kernel(
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
    DUAL: tl.constexpr,
    FMAX: tl.constexpr,
    EMAX: tl.constexpr,
    FMT: tl.constexpr = (0, 0, 0, 0),
    STAGES: tl.constexpr = 1,
    SAT: tl.constexpr = False,
    NP: tl.constexpr = 1,
    FAST: tl.constexpr = False,
    EVEN: tl.constexpr = False,
):
    """``x`` [M, N] (unit column stride) -> ``q`` [M, N] (unit column stride) and, with
    ``DUAL``, ``qt`` [N, M] (unit column stride). Scale tensors are addressed by strides
    (``s``: (row, block) for ROWS/MX, (tile row, tile col) for TILE; ``st``: (M block, column)
    for ROWS/MX; TILE shares ``s``; GIVEN (tensorwise cast) reads ``NP`` partial maxima at
    ``st_ptr`` and writes the 0-d ``s`` from the first tile)."""
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BN)
    if MODE == 5:  # MX4: one tile per program
        _mx_tile_4d(pid, grid_n, x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm,
                    stride_qm, stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn, BM, BN,
                    DUAL, FMAX, EMAX, FMT, SAT, FAST, EVEN)  # fmt: skip
    elif STAGES == 1:  # one tile per program (no loop: fewer registers)
        _one_tile(pid, grid_n, x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm, stride_qm,
                  stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn, BM, BN, MODE, DUAL,
                  FMAX, EMAX, FMT, SAT, NP, FAST, EVEN)  # fmt: skip
    else:  # persistent, software-pipelined over the tiles pid, pid + P, ...
        ntiles = tl.cdiv(M, BM) * grid_n
        for t in tl.range(pid, ntiles, tl.num_programs(0), num_stages=STAGES):
            _one_tile(t, grid_n, x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm,
                      stride_qm, stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn, BM,
                      BN, MODE, DUAL, FMAX, EMAX, FMT, SAT, NP, FAST, EVEN)  # fmt: skip


# ---- ahead-of-time check -------------------------------------------------------------------

# (name, mode, BM, BN, dual, warps, stages) as quant_launch picks them for v2 by default.
# Stages 1: one tile per program; >= 2: persistent + cp.async-pipelined (only where no output
# is transposed: the pipelined tile sits in an unswizzled shared buffer, and a transposed read
# of it is bank-conflicted 16 ways on sm_90, as the AOT PTX shows).
V2_CONFIGS = {
    "block_dual": (ROWS, 128, 128, True, 8, 1),
    "tile": (TILE, 128, 128, False, 8, 2),
    "tile_dual": (TILE, 128, 128, True, 8, 1),
    "mx_dual": (MX, 32, 128, True, 4, 1),  # 29 PTX ops/element on sm_90 (64x64: 39)
    "mx_rows": (MX, 32, 128, False, 4, 2),
    "given_dual": (GIVEN, 64, 128, True, 4, 1),
}
# v3 only: the MX recipes through _mx_tile_4d (PRIMUS_TURBO_QUANT_MX4D)
V3_CONFIGS = {
    "mx4_dual": (MX4, 32, 128, True, 4, 1),
    "mx4_rows": (MX4, 32, 128, False, 4, 1),
}
# v3 keeps the per-element filter here: with FAST the 128x128 dual tile spills 8 B on sm_90
# at MAXNREG (x stays live across the re-reduction branch). The 1x128 and MX dual tiles keep
# the v2 flags (no FAST, no EVEN): H200 run 4.2 (graph time, 3 shapes) measured v3 below v2
# there (1x128 dual 0.617 vs 0.696 of copy, MX dual 0.466 vs 0.493): FAST's branch needs the
# whole tile's row amax (a cross-warp reduction + barrier) before the first store.
V3_NO_FAST = frozenset({"tile_dual", "block_dual", "mx_dual"})
V3_NO_EVEN = frozenset({"block_dual", "mx_dual"})
# v3 stage overrides: the 128x128 weight tile one tile per program (H200 run 4.2, 8192x4096:
# STAGES=1 0.867, 3 0.844, 2 (v2's) 0.801 of copy)
V3_STAGES = {"tile": 1}
MAXNREG = 128  # NVIDIA: registers/thread cap, so two 8-warp programs fit on an SM
# v3 per-config caps (NVIDIA): the 128x128 weight tile at 80 registers, three 8-warp programs
# per SM, no spill on sm_90 (H200 run 5.2, graph time, 3 shapes: 0.884 of copy vs 0.843 at 128;
# WARPS=16 at 48: 0.852, WARPS=4 at 160: 0.846)
V3_MAXNREG = {"tile": 80}
# extra AOT-only specs: the block1x128 dual tile at the register caps the round-2 sweep tries
# (PRIMUS_TURBO_QUANT_MAXNREG_BLOCK_DUAL / _WARPS_BLOCK_DUAL), to see their spills
_AOT_SWEEP = (("block_dual", 8, 80), ("block_dual", 16, 64), ("block_dual", 16, 40),
              ("block_dual", 32, 64), ("block_dual", 32, 32))  # fmt: skip


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 input, the target's e4m3 output (FNUZ on gfx942); MX only on gfx950 / sm_90.
    ``M`` carries the ``:16`` hint the JIT gives model shapes (it lets the transposed store
    vectorise along M)."""
    assert target in AOT_TARGETS, target
    fp8, fmax = aot_fp8(target)
    specs = []
    combos = list(itertools.product(V2_CONFIGS.items(), (False, True)))
    combos += [(item, True) for item in V3_CONFIGS.items()]
    for (name, (mode, bm, bn, dual, warps, stages)), v3 in combos:
        if mode in (MX, MX4) and target == "gfx942":
            continue
        s = tile_signature(fp8, mode in (MX, MX4))
        if target != "sm_90":
            stages = 1  # the launcher pipelines on NVIDIA only (gfx950 tile: 24 SGPR spills)
        cx = {"BM": bm, "BN": bn, "MODE": mode, "DUAL": dual, "FMAX": fmax, "EMAX": 8,
              "FMT": (0, 0, 0, 0), "STAGES": stages, "SAT": target == "sm_90",
              "NP": 512 if mode == GIVEN else 1, "EVEN": v3 and name not in V3_NO_EVEN,
              "FAST": v3 and name not in V3_NO_FAST}  # fmt: skip
        nreg = V3_MAXNREG.get(name, MAXNREG) if v3 else MAXNREG
        if v3 and target == "sm_90":
            cx["STAGES"] = V3_STAGES.get(name, stages)
        specs.append(
            AotSpec(f"quant_v{2 + v3}_{name}_{fp8}", quant_tile_v2_kernel, s, cx,
                    {"num_warps": warps, **({"maxnreg": nreg} if target == "sm_90" else {})},
                    default=name == "block_dual" and v3)
        )  # fmt: skip
    if target == "sm_90":
        for name, warps, nreg in _AOT_SWEEP:
            base = next(sp for sp in specs if sp.name == f"quant_v3_{name}_{fp8}")
            specs.append(AotSpec(f"quant_v3_{name}_w{warps}_r{nreg}_{fp8}", base.fn,
                                 base.signature, base.constexprs,
                                 {"num_warps": warps, "maxnreg": nreg}))  # fmt: skip
    return specs
