"""Fused FP8 quantization kernels (amax + scale + cast), every granularity in one tile kernel.

``quant_tile_kernel`` loads one ``BM x BN`` tile of a 2-D input once and, per ``MODE``:
* ``ROWS``  (0): one scale per row of the tile (1 x BN blocks; rowwise when BN covers the row),
* ``COLS``  (1): one scale per column of the tile (BM x 1 blocks),
* ``TILE``  (2): one scale for the tile (BM x BN blocks, the 2-D weight recipe),
* ``GIVEN`` (3): one scale for the whole tensor from a precomputed amax (tensorwise cast pass),
* ``MX``    (4): power-of-two (E8M0) scale per 32 values of a row (BN a multiple of 32; the
  dual copy per 32 values of a column, BM a multiple of 32).
With ``DUAL`` it also writes a second quantized copy in one pass: column scales (ROWS/MX modes)
or the same scale (TILE/GIVEN), through its own strides, so the second copy can be the
transpose (K-major for the backward GEMMs). Scale tensors are addressed by strides too (e.g.
outer-dim-major 1x128 scales for ``torch._scaled_mm``).

Special values (see reference/quantization.py): NaN and inf are excluded from amax; inf clamps
to +-fmax, NaN stays NaN; an all-zero block uses amax = 1e-12 (q = 0).
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.aot import AOT_TARGETS, AotSpec

ROWS, COLS, TILE, GIVEN, MX = 0, 1, 2, 3, 4


@triton.jit
def _finite_abs(x):
    a = tl.abs(x)
    return tl.where(a < float("inf"), a, 0.0)  # NaN < inf is False


@triton.jit
def _fp8_bits(y, MBITS: tl.constexpr, BIAS: tl.constexpr, NAN_BITS: tl.constexpr):
    """fp8 bit pattern of ``y`` (already clamped), round to nearest even, in fp32 math.

    Used only under TRITON_INTERPRET=1, whose fp32 -> fp8 conversion (triton 3.6) mis-rounds
    when the mantissa carries into the exponent and fails on some subnormals."""
    a = tl.abs(y)
    e = tl.maximum(tl.floor(tl.log2(tl.maximum(a, 1e-30))), 1.0 - BIAS)
    ulp = tl.exp2(e - MBITS)
    t = a / ulp
    f = tl.floor(t)
    r = t - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    v = tl.where((r > 0.5) | ((r == 0.5) & odd), f + 1.0, f) * ulp
    e2 = tl.floor(tl.log2(tl.maximum(v, 1e-30)))
    normal = e2 >= 1.0 - BIAS
    man = tl.where(normal, v / tl.exp2(e2) - 1.0, v / tl.exp2(1.0 - BIAS)) * (2.0**MBITS)
    bits = tl.where(normal, (e2 + BIAS) * (2.0**MBITS), 0.0) + man
    bits = tl.where(v == 0.0, 0.0, bits) + tl.where((y < 0.0) & (v != 0.0), 128.0, 0.0)
    bits = tl.where(y != y, NAN_BITS * 1.0, bits)
    return bits.to(tl.int32).to(tl.uint8)


@triton.jit
def _cast(x, scale, FMAX: tl.constexpr, dtype, FMT: tl.constexpr = (0, 0, 0, 0)):
    """Scale, clamp (NaN kept), convert. ``FMT = (interpret, mbits, bias, nan_bits)``."""
    y = x * scale
    y = tl.where(y != y, y, tl.minimum(tl.maximum(y, -FMAX), FMAX))
    if FMT[0]:
        return _fp8_bits(y, FMT[1], FMT[2], FMT[3])
    return y.to(dtype)


@triton.jit
def _scale_of(amax, FMAX: tl.constexpr, IS_MX: tl.constexpr, EMAX: tl.constexpr):
    """(scale, scale_inv or biased exponent) from amax."""
    if IS_MX:
        e = tl.floor(tl.log2(tl.maximum(amax, 1.1754943508222875e-38)))  # fp32 min normal
        e = tl.minimum(tl.maximum(e - EMAX, -127.0), 127.0)
        return tl.exp2(-e), e + 127.0
    scale = FMAX / tl.maximum(amax, 1e-12)
    return scale, 1.0 / scale


@triton.jit
def _amax_loop(x_ptr, numel, pid, BLOCK: tl.constexpr, NP: tl.constexpr, FINITE: tl.constexpr,
               EVEN: tl.constexpr):  # fmt: skip
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for t in range(pid, tl.cdiv(numel, BLOCK), NP):
        o = tl.cast(t, tl.int64) * BLOCK + offs
        if EVEN:
            x = tl.load(x_ptr + o, eviction_policy="evict_last")
        else:
            x = tl.load(x_ptr + o, mask=o < numel, other=0.0, eviction_policy="evict_last")
        if FINITE:
            acc = tl.maximum(acc, _finite_abs(x.to(tl.float32)))
        else:
            acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
    return tl.max(acc, axis=0)


@triton.jit
def amax_partial_kernel(
    x_ptr, part_ptr, numel, BLOCK: tl.constexpr, NP: tl.constexpr, FAST: tl.constexpr = False,
    EVEN: tl.constexpr = False,
):  # fmt: skip
    """Tensorwise pass 1 over a contiguous input seen flat: exactly ``NP`` programs (the grid)
    stride over ``BLOCK``-wide tiles (tile ``t`` at iteration ``t // NP``) with wide vector
    loads; program ``p`` writes the finite amax of its tiles to ``part_ptr[p]`` (every slot is
    written, so no zero-init launch, no atomics, deterministic). ``evict_last`` keeps the tail
    of the input in L2 for the cast pass, which walks the tiles in reverse.
    ``FAST`` (v3): the loop takes plain ``|x|`` (no inf/NaN select per element); only when the
    result is not finite (an inf, or a NaN the max did not drop) the program re-reads its tiles
    with the finite filter, so the result is the same. ``EVEN``: ``numel % BLOCK == 0``."""
    pid = tl.program_id(0)
    amax = _amax_loop(x_ptr, numel, pid, BLOCK, NP, not FAST, EVEN)
    if FAST:
        if tl.where(amax < float("inf"), 0, 1) != 0:
            amax = _amax_loop(x_ptr, numel, pid, BLOCK, NP, True, EVEN)
    tl.store(part_ptr + pid, amax)


@triton.jit
def cast_flat_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    part_ptr,
    numel,
    BLOCK: tl.constexpr,
    NP: tl.constexpr,
    FMAX: tl.constexpr,
    FMT: tl.constexpr = (0, 0, 0, 0),
    SAT: tl.constexpr = False,
    EVEN: tl.constexpr = False,
):
    """Tensorwise pass 2: every program reduces the ``NP`` partial maxima (4 KB from L2), then
    casts its tiles in reverse order (the tiles pass 1 read last are the ones still in L2).
    ``SAT`` / ``EVEN`` (v3): no clamp (hardware satfinite), no masks (``numel % BLOCK == 0``)."""
    pid = tl.program_id(0)
    amax = tl.max(tl.load(part_ptr + tl.arange(0, NP)), axis=0)
    scale, sinv = _scale_of(amax, FMAX, False, 0)
    if pid == 0:
        tl.store(s_ptr, sinv)
    offs = tl.arange(0, BLOCK)
    ntiles = tl.cdiv(numel, BLOCK)
    for i in range(pid, ntiles, NP):
        o = tl.cast(ntiles - 1 - i, tl.int64) * BLOCK + offs
        if EVEN:
            x = tl.load(x_ptr + o, eviction_policy="evict_first")
        else:
            x = tl.load(x_ptr + o, mask=o < numel, other=0.0, eviction_policy="evict_first")
        if SAT:  # NVIDIA cvt.rn.satfinite clamps (inf included) and keeps NaN itself
            q = (x.to(tl.float32) * scale).to(q_ptr.dtype.element_ty)
        else:
            q = _cast(x.to(tl.float32), scale, FMAX, q_ptr.dtype.element_ty, FMT)
        if EVEN:
            tl.store(q_ptr + o, q)
        else:
            tl.store(q_ptr + o, q, mask=o < numel)


@triton.jit
def quant_tile_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    qt_ptr,
    st_ptr,
    amax_ptr,
    M,
    N,
    stride_xm,
    stride_xn,
    stride_qm,
    stride_qn,
    stride_sm,
    stride_sn,
    stride_qtm,
    stride_qtn,
    stride_stm,
    stride_stn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    MODE: tl.constexpr,
    DUAL: tl.constexpr,
    FMAX: tl.constexpr,
    EMAX: tl.constexpr,
    FMT: tl.constexpr = (0, 0, 0, 0),
    NP: tl.constexpr = 1,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rm64 = rm.to(tl.int64)
    rn64 = rn.to(tl.int64)
    mask_m = rm < M
    mask_n = rn < N
    mask = mask_m[:, None] & mask_n[None, :]
    x = tl.load(
        x_ptr + rm64[:, None] * stride_xm + rn64[None, :] * stride_xn, mask=mask, other=0.0
    ).to(tl.float32)
    a = _finite_abs(x)
    qty = q_ptr.dtype.element_ty
    q_ptrs = q_ptr + rm64[:, None] * stride_qm + rn64[None, :] * stride_qn
    if MODE == 4:  # MX: E8M0 scale per 32 along N (and per 32 along M for the dual copy)
        G: tl.constexpr = BN // 32
        scale, sinv = _scale_of(tl.max(tl.reshape(a, (BM, G, 32)), axis=2), FMAX, True, EMAX)
        q = _cast(tl.reshape(x, (BM, G, 32)), scale[:, :, None], FMAX, qty, FMT)
        tl.store(q_ptrs, tl.reshape(q, (BM, BN)), mask=mask)
        rg = pid_n * G + tl.arange(0, G)  # scale columns of this tile
        s_ptrs = s_ptr + rm64[:, None] * stride_sm + rg[None, :] * stride_sn
        tl.store(s_ptrs, sinv.to(s_ptr.dtype.element_ty),
                 mask=mask_m[:, None] & (rg[None, :] * 32 < N))  # fmt: skip
        if DUAL:
            GM: tl.constexpr = BM // 32
            a3 = tl.reshape(a, (GM, 32, BN))
            scale_c, sinv_c = _scale_of(tl.max(a3, axis=1), FMAX, True, EMAX)  # [GM, BN]
            qc = _cast(tl.reshape(x, (GM, 32, BN)), scale_c[:, None, :], FMAX, qty, FMT)
            qt = tl.trans(tl.reshape(qc, (BM, BN)))  # [BN, BM] in registers
            tl.store(qt_ptr + rn64[:, None] * stride_qtn + rm64[None, :] * stride_qtm, qt,
                     mask=mask_n[:, None] & mask_m[None, :])  # fmt: skip
            rgm = pid_m * GM + tl.arange(0, GM)
            st_ptrs = st_ptr + rgm[:, None] * stride_stm + rn64[None, :] * stride_stn
            tl.store(st_ptrs, sinv_c.to(st_ptr.dtype.element_ty),
                     mask=(rgm[:, None] * 32 < M) & mask_n[None, :])  # fmt: skip
    elif MODE == 0:  # per row of the tile
        scale, sinv = _scale_of(tl.max(a, axis=1), FMAX, False, EMAX)
        tl.store(q_ptrs, _cast(x, scale[:, None], FMAX, qty, FMT), mask=mask)
        s_ptrs = s_ptr + rm64 * stride_sm + pid_n * stride_sn
        tl.store(s_ptrs, sinv.to(s_ptr.dtype.element_ty), mask=mask_m)
        if DUAL:  # per column of the tile into the second copy
            scale_c, sinv_c = _scale_of(tl.max(a, axis=0), FMAX, False, EMAX)
            qt = tl.trans(_cast(x, scale_c[None, :], FMAX, qty, FMT))  # [BN, BM] in registers
            tl.store(qt_ptr + rn64[:, None] * stride_qtn + rm64[None, :] * stride_qtm, qt,
                     mask=mask_n[:, None] & mask_m[None, :])  # fmt: skip
            st_ptrs = st_ptr + pid_m * stride_stm + rn64 * stride_stn
            tl.store(st_ptrs, sinv_c.to(st_ptr.dtype.element_ty), mask=mask_n)
    elif MODE == 1:  # per column of the tile
        scale, sinv = _scale_of(tl.max(a, axis=0), FMAX, False, EMAX)
        tl.store(q_ptrs, _cast(x, scale[None, :], FMAX, qty, FMT), mask=mask)
        tl.store(s_ptr + pid_m * stride_sm + rn64 * stride_sn, sinv, mask=mask_n)
    else:  # one scale: the tile's (TILE) or the tensor's (GIVEN)
        if MODE == 2:
            amax = tl.max(tl.max(a, axis=1), axis=0)
        else:
            amax = tl.max(tl.load(amax_ptr + tl.arange(0, NP)), axis=0)  # partial maxima
        scale, sinv = _scale_of(amax, FMAX, False, EMAX)
        q = _cast(x, scale, FMAX, qty, FMT)
        tl.store(q_ptrs, q, mask=mask)
        if MODE == 2 or (pid_m == 0 and pid_n == 0):
            tl.store(s_ptr + pid_m * stride_sm + pid_n * stride_sn, sinv)
        if DUAL:
            qt_ptrs = qt_ptr + rn64[:, None] * stride_qtn + rm64[None, :] * stride_qtm
            # same scale (the caller shares the scale tensor); the tile transposed in registers
            # so both stores run along contiguous rows
            tl.store(qt_ptrs, tl.trans(q), mask=mask_n[:, None] & mask_m[None, :])


@triton.jit
def quant_rows_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    M,
    N,
    stride_xm,
    stride_xn,
    stride_qm,
    stride_qn,
    stride_s,
    BM: tl.constexpr,
    BN: tl.constexpr,
    FMAX: tl.constexpr,
    FMT: tl.constexpr = (0, 0, 0, 0),
    ONE_PASS: tl.constexpr = False,
    SAT: tl.constexpr = False,
    FAST: tl.constexpr = False,
    EVEN: tl.constexpr = False,
):
    """Rowwise: one scale per row. ``ONE_PASS`` (``BN >= N``): each row is read once and held
    in registers (amax, scale, cast, store). Otherwise an amax loop then a cast loop over the
    row (the second read hits L1/L2 for rows up to a few MB). v3 flags of the one-pass path:
    ``SAT`` (NVIDIA satfinite conversion, no clamp), ``FAST`` (amax of plain ``|x|``; the
    finite filter only when a row's amax is not finite), ``EVEN`` (``N == BN``, ``M % BM == 0``:
    no masks)."""
    pid = tl.program_id(0)
    rm = pid * BM + tl.arange(0, BM)
    rm64 = rm.to(tl.int64)
    mask_m = rm < M
    if ONE_PASS:
        rn = tl.arange(0, BN)  # int32 column offsets (N <= BN <= 16K), int64 row offsets
        mask = mask_m[:, None] & (rn[None, :] < N)
        x_ptrs = x_ptr + rm64[:, None] * stride_xm + rn[None, :] * stride_xn
        if EVEN:
            x = tl.load(x_ptrs, eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
            x = x.to(tl.float32)
        if FAST:
            amax = tl.max(tl.abs(x), axis=1)
            if tl.where(tl.max(amax, axis=0) < float("inf"), 0, 1) != 0:
                amax = tl.max(_finite_abs(x), axis=1)
        else:
            amax = tl.max(_finite_abs(x), axis=1)
        scale, sinv = _scale_of(amax, FMAX, False, 0)
        q_ptrs = q_ptr + rm64[:, None] * stride_qm + rn[None, :] * stride_qn
        if SAT:
            q = (x * scale[:, None]).to(q_ptr.dtype.element_ty)
        else:
            q = _cast(x, scale[:, None], FMAX, q_ptr.dtype.element_ty, FMT)
        if EVEN:
            tl.store(s_ptr + rm64 * stride_s, sinv)
            tl.store(q_ptrs, q)
        else:
            tl.store(s_ptr + rm64 * stride_s, sinv, mask=mask_m)
            tl.store(q_ptrs, q, mask=mask)
    else:
        amax = tl.zeros((BM,), dtype=tl.float32)
        for n0 in range(0, N, BN):
            rn = n0 + tl.arange(0, BN)
            mask = mask_m[:, None] & (rn[None, :] < N)
            ptrs = x_ptr + rm64[:, None] * stride_xm + rn[None, :].to(tl.int64) * stride_xn
            x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(_finite_abs(x), axis=1))
        scale, sinv = _scale_of(amax, FMAX, False, 0)
        tl.store(s_ptr + rm64 * stride_s, sinv, mask=mask_m)
        for n0 in range(0, N, BN):
            rn = n0 + tl.arange(0, BN)
            mask = mask_m[:, None] & (rn[None, :] < N)
            rn64 = rn[None, :].to(tl.int64)
            x = tl.load(x_ptr + rm64[:, None] * stride_xm + rn64 * stride_xn, mask=mask, other=0.0)
            q = _cast(x.to(tl.float32), scale[:, None], FMAX, q_ptr.dtype.element_ty, FMT)
            tl.store(q_ptr + rm64[:, None] * stride_qm + rn64 * stride_qn, q, mask=mask)


@triton.jit
def quant_mxfp4_kernel(
    x_ptr, q_ptr, s_ptr, M, N, stride_xm, stride_xn, stride_qm, stride_sm, BM: tl.constexpr
):
    """MXFP4 along rows: one E8M0 scale per 32 values, E2M1 codes rounded to nearest even and
    packed two per byte (element 2i in the low nibble). NaN -> 0, +-inf -> +-6 (E2M1 has
    neither). Grid: (cdiv(M, BM), N / 32)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * 32 + tl.arange(0, 32)
    rm64 = rm.to(tl.int64)
    mask_m = rm < M
    x = tl.load(
        x_ptr + rm64[:, None] * stride_xm + rn[None, :].to(tl.int64) * stride_xn,
        mask=mask_m[:, None], other=0.0,
    ).to(tl.float32)  # fmt: skip
    amax = tl.max(_finite_abs(x), axis=1)
    e = tl.floor(tl.log2(tl.maximum(amax, 1.1754943508222875e-38)))
    e = tl.minimum(tl.maximum(e - 2.0, -127.0), 127.0)
    y = x * tl.exp2(-e)[:, None]
    y = tl.where(y != y, 0.0, tl.minimum(tl.maximum(y, -6.0), 6.0))
    mag = tl.abs(y)
    ulp = tl.where(mag < 2.0, 0.5, tl.where(mag < 4.0, 1.0, 2.0))
    t = mag / ulp
    f = tl.floor(t)
    r = t - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    v = tl.where((r > 0.5) | ((r == 0.5) & odd), f + 1.0, f) * ulp
    code = tl.where(v < 2.0, v * 2.0, tl.where(v < 4.0, v + 2.0, v * 0.5 + 4.0))
    code = code + tl.where((y < 0.0) & (v != 0.0), 8.0, 0.0)
    lo, hi = tl.split(tl.reshape(code.to(tl.int32), (BM, 16, 2)))
    packed = (lo | (hi << 4)).to(tl.uint8)
    rq = pid_n * 16 + tl.arange(0, 16)
    tl.store(q_ptr + rm64[:, None] * stride_qm + rq[None, :], packed, mask=mask_m[:, None])
    tl.store(s_ptr + rm64 * stride_sm + pid_n, (e + 127.0).to(tl.uint8), mask=mask_m)


# ---- ahead-of-time check -------------------------------------------------------------------


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 input, the target's e4m3 output (FNUZ ``fp8e4b8`` on gfx942, OCP ``fp8e4nv``
    elsewhere); MX specs only where MX is supported (gfx950, sm_90)."""
    assert target in AOT_TARGETS, target
    fp8, fmax = ("fp8e4b8", 240.0) if target == "gfx942" else ("fp8e4nv", 448.0)
    opts = {"num_warps": 4}
    tile_sig = {
        "x_ptr": "*bf16",
        "q_ptr": f"*{fp8}",
        "s_ptr": "*fp32",
        "qt_ptr": f"*{fp8}",
        "st_ptr": "*fp32",
        "amax_ptr": "*fp32",
        "M": "i32",
        "N": "i32:16",
        "stride_xm": "i32:16",
        "stride_xn": "i32:1",
        "stride_qm": "i32:16",
        "stride_qn": "i32:1",
        "stride_sm": "i32",
        "stride_sn": "i32",
        "stride_qtm": "i32:1",
        "stride_qtn": "i32:16",
        "stride_stm": "i32",
        "stride_stn": "i32",
    }
    specs = []
    # (name, mode, BM, BN, dual, warps) as the launchers use them
    modes = [("rows", ROWS, 32, 128, False, 4), ("rows_dual", ROWS, 128, 128, True, 8)]
    modes += [("tile", TILE, 128, 128, True, 8), ("given", GIVEN, 64, 128, True, 4)]
    if target in ("gfx950", "sm_90"):
        # (128x128 / 8 warps MX dual: 221 registers on sm_90, dropped)
        modes += [("mx", MX, 64, 64, True, 4), ("mx_rows", MX, 32, 128, False, 4)]
    for name, mode, bm, bn, dual, warps in modes:
        sig = dict(tile_sig)
        if mode == MX:
            sig.update({"s_ptr": "*u8", "st_ptr": "*u8"})
        specs.append(
            AotSpec(
                f"quant_{name}_{fp8}",
                quant_tile_kernel,
                sig,
                {
                    "BM": bm,
                    "BN": bn,
                    "MODE": mode,
                    "DUAL": dual,
                    "FMAX": fmax,
                    "EMAX": 8,
                    "FMT": (0, 0, 0, 0),
                    "NP": 512 if mode == GIVEN else 1,
                },
                {"num_warps": warps},
                default=name == "rows",
            )
        )
    flat = {"BLOCK": 8192, "NP": 512}  # as quant_tensorwise picks them on an H200
    amax_sig = {"x_ptr": "*bf16", "part_ptr": "*fp32", "numel": "i32:16"}
    cast_sig = {"x_ptr": "*bf16", "q_ptr": f"*{fp8}", "s_ptr": "*fp32", "part_ptr": "*fp32",
                "numel": "i32:16"}  # fmt: skip
    for v3 in (False, True):  # v3: FAST amax, EVEN (no masks), SAT cast on NVIDIA
        tag = "_v3" if v3 else ""
        specs.append(
            AotSpec(f"amax_partial_bf16{tag}", amax_partial_kernel, amax_sig,
                    {**flat, "FAST": v3, "EVEN": v3}, {"num_warps": 8})
        )  # fmt: skip
        specs.append(
            AotSpec(f"cast_flat_{fp8}{tag}", cast_flat_kernel, cast_sig,
                    {**flat, "FMAX": fmax, "FMT": (0, 0, 0, 0),
                     "SAT": v3 and target == "sm_90", "EVEN": v3}, {"num_warps": 8})
        )  # fmt: skip
    rows_sig = {"x_ptr": "*bf16", "q_ptr": f"*{fp8}", "s_ptr": "*fp32", "M": "i32",
                "N": "i32:16", "stride_xm": "i32:16", "stride_xn": "i32:1",
                "stride_qm": "i32:16", "stride_qn": "i32:1", "stride_s": "i32:1"}  # fmt: skip
    # (name, BM, BN, one pass, warps) as quant_rowwise picks them: rows of 4096 and 16384 held
    # in registers, longer rows in two loops
    for name, bm, bn, one, warps in [("rowwise_4k", 2, 4096, True, 8),
                                     ("rowwise_16k", 1, 16384, True, 16),
                                     ("rowwise_loop", 4, 1024, False, 4)]:  # fmt: skip
        for v3 in (False, True) if one else (False,):
            cx = {"BM": bm, "BN": bn, "FMAX": fmax, "FMT": (0, 0, 0, 0), "ONE_PASS": one,
                  "SAT": v3 and target == "sm_90", "FAST": v3, "EVEN": v3}  # fmt: skip
            specs.append(
                AotSpec(f"quant_{name}_{fp8}{'_v3' if v3 else ''}", quant_rows_kernel, rows_sig,
                        cx, {"num_warps": warps})
            )  # fmt: skip
    if target in ("gfx950", "sm_90"):
        fp4_sig = {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*u8", "M": "i32", "N": "i32:16",
                   "stride_xm": "i32:16", "stride_xn": "i32:1", "stride_qm": "i32:16",
                   "stride_sm": "i32"}  # fmt: skip
        specs.append(AotSpec("quant_mxfp4", quant_mxfp4_kernel, fp4_sig, {"BM": 32}, opts))
    return specs
