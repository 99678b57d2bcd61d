"""Tensorwise FP8 quantization in ONE persistent launch: amax, grid barrier, cast.

``tw_persist_kernel`` runs ``P`` programs, all resident at once (the launcher picks ``P`` from
the compiled kernel's registers / shared memory and the SM count, see quant_tw_launch.py).
Program ``p`` owns tiles ``p, p + P, p + 2P, ...`` (``kall`` walk steps):

1. amax of its first ``kall - NH`` tiles (the *walked* tiles, loads ``evict_last``: they are
   re-read from L2 in step 4), then loads its last ``NH`` tiles (the *held* tiles, loads
   ``evict_first``) and KEEPS them in registers; its partial amax goes to ``part_ptr[p]``.
2. grid barrier: one atomic increment of ``bar_ptr[0]`` (acq_rel), then acquire polls (read
   by one thread, the value broadcast: every thread of the program takes the same branch)
   until it reads ``P``. At most ``spin`` polls: a program whose wait runs out (a
   program of the grid that is not resident, e.g. SMs taken by another kernel) computes the
   whole tensor's amax by itself, so the result never depends on co-residency, only the speed.
   ``bar_ptr[1]`` counts the programs past the barrier; the last one resets both counters to
   0, so the next launch on the stream finds them zeroed (no memset per call).
3. every program reduces the ``P`` partial maxima (bit-identical to the two-launch path: max
   is exact and order-free), casts and stores its held tiles from registers,
4. then re-reads its walked tiles in REVERSE order (the lines it read last come first).

Bytes from DRAM: the input once, the outputs once, plus the walked tiles that fell out of L2;
the held tiles are never re-read. Tiles: flat ``BLOCK`` (``DUAL=False``) or ``BM x BN``
(``DUAL=True``, also ``x.T`` quantized, transposed in registers), as in quant_tensorwise.py.
Special values as there (NaN/inf excluded from amax, inf clamps, NaN stays NaN, all-zero
-> amax 1e-12).
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.aot import AOT_TARGETS, AotSpec
from primus_turbo.triton.quantization.quant_kernel import _cast, _scale_of
from primus_turbo.triton.quantization.quant_tensorwise import _store


@triton.jit
def _bases(t, numel, M, N, stride_xm, BLOCK: tl.constexpr, BM: tl.constexpr,
           BN: tl.constexpr, DUAL: tl.constexpr):  # fmt: skip
    """Scalar offsets (in values) of tile ``t`` in x, q and qt, and its valid rows / columns
    (flat: valid values, both; <= 0 past the end)."""
    if DUAL:
        ntn = tl.cdiv(N, BN)
        r0 = (t // ntn) * BM
        c0 = (t % ntn) * BN
        bx = tl.cast(r0, tl.int64) * stride_xm + c0
        bq = tl.cast(r0, tl.int64) * N + c0
        bqt = tl.cast(c0, tl.int64) * M + r0
        vm = M - r0
        vn = N - c0
    else:
        bx = tl.cast(t, tl.int64) * BLOCK
        bq = bx
        bqt = bx
        vm = tl.minimum(tl.maximum(numel - bx, 0), BLOCK).to(tl.int32)
        vn = vm
    return bx, bq, bqt, vm, vn


@triton.jit
def _ldw(x_ptr, t, numel, M, N, stride_xm, BLOCK: tl.constexpr, BM: tl.constexpr,
         BN: tl.constexpr, FW: tl.constexpr, DUAL: tl.constexpr, EVEN: tl.constexpr,
         EV: tl.constexpr, row0=0, RC: tl.constexpr = 0):  # fmt: skip
    """Tile ``t`` (rows ``row0`` to ``row0 + RC`` of it with ``RC``) as int32 words of two
    16-bit values (low half first). Held in registers this way a tile takes one register per
    two values (ptxas gives each 16-bit value of a bf16 tensor its own 32-bit register).
    Offsets are even (the launcher checks)."""
    bx, bq, bqt, vm, vn = _bases(t, numel, M, N, stride_xm, BLOCK, BM, BN, DUAL)
    R: tl.constexpr = BM if DUAL else BLOCK // 2 // FW  # rows of words (a warp reads a row)
    W: tl.constexpr = BN // 2 if DUAL else FW
    NR: tl.constexpr = RC if RC > 0 else R
    r = row0 + tl.arange(0, NR)[:, None]
    c = tl.arange(0, W)[None, :]
    xw = (x_ptr + bx).to(tl.pointer_type(tl.int32))
    if DUAL:
        ptrs = xw + (r * (stride_xm // 2) + c)
        mask = (r < vm) & (c < vn // 2)
    else:
        ptrs = xw + (r * W + c)
        mask = (r * W + c) < vm // 2
    if EVEN:
        w = tl.load(ptrs, eviction_policy=EV)
    else:
        w = tl.load(ptrs, mask=mask, other=0, eviction_policy=EV)
    return w


@triton.jit
def _abs_bits(w, FINITE: tl.constexpr, INF: tl.constexpr):
    """Per word, the larger |value| bits of its two 16-bit floats (|x| bits compare as
    integers; NaN and inf are the bits >= ``INF``, excluded with ``FINITE``)."""
    lo = w & 0x7FFF
    hi = (w >> 16) & 0x7FFF
    if FINITE:
        lo = tl.where(lo < INF, lo, 0)
        hi = tl.where(hi < INF, hi, 0)
    return tl.maximum(lo, hi)


@triton.jit
def _tile_bits(w, FINITE: tl.constexpr, INF: tl.constexpr):
    """amax bits of a held tile: first along the rows (inside a warp, no block barrier, so
    the temporaries die before the cross-warp step), then across them."""
    return tl.max(tl.max(_abs_bits(w, FINITE, INF), axis=1), axis=0)


@triton.jit
def _bits_f32(b, DT: tl.constexpr):
    return b.to(tl.int16).to(DT, bitcast=True).to(tl.float32)


@triton.jit
def _walk_bits(x_ptr, numel, M, N, stride_xm, t0, step, kend, BLOCK: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, FW: tl.constexpr, DUAL: tl.constexpr,
               EVEN: tl.constexpr, FINITE: tl.constexpr, INF: tl.constexpr,
               EV: tl.constexpr):  # fmt: skip
    """amax bits over tiles ``t0 + k * step``, ``k < kend`` (a running max per word)."""
    R: tl.constexpr = BM if DUAL else BLOCK // 2 // FW  # rows of words (a warp reads a row)
    W: tl.constexpr = BN // 2 if DUAL else FW
    acc = tl.zeros((R, W), dtype=tl.int32)
    for k in range(0, kend):
        w = _ldw(x_ptr, t0 + k * step, numel, M, N, stride_xm, BLOCK, BM, BN, FW, DUAL, EVEN, EV)
        acc = tl.maximum(acc, _abs_bits(w, FINITE, INF))
    return tl.max(tl.max(acc, axis=1), axis=0)


@triton.jit
def _fp8_bits16(v, scale, dtype, FMAX: tl.constexpr, FMT: tl.constexpr, SAT: tl.constexpr):
    """fp8 bits (int32, 0-255) of ``v * scale``, converted as quant_tensorwise.py does."""
    if SAT:  # NVIDIA cvt.rn.satfinite clamps (inf included) and keeps NaN itself
        q = (v * scale).to(dtype).to(tl.uint8, bitcast=True)
    else:
        q = _cast(v, scale, FMAX, dtype, FMT)
        if not FMT[0]:
            q = q.to(tl.uint8, bitcast=True)
    return q.to(tl.int32)


@triton.jit
def _cast_words(w, t, scale, x_ptr, q_ptr, qt_ptr, numel, M, N, stride_xm, BLOCK: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, FW: tl.constexpr, DUAL: tl.constexpr,
                FMAX: tl.constexpr, FMT: tl.constexpr, SAT: tl.constexpr, EVEN: tl.constexpr,
                CS: tl.constexpr):  # fmt: skip
    """Cast tile ``t`` (int32 words) and store it as 16-bit words of two fp8 values; with
    ``DUAL`` also its transpose (rows ``2j`` and ``2j + 1`` of qt from the low / high
    halves of word column ``j``)."""
    bx, bq, bqt, vm, vn = _bases(t, numel, M, N, stride_xm, BLOCK, BM, BN, DUAL)
    R: tl.constexpr = BM if DUAL else BLOCK // 2 // FW  # rows of words (a warp reads a row)
    W: tl.constexpr = BN // 2 if DUAL else FW
    DT: tl.constexpr = x_ptr.dtype.element_ty
    dt8: tl.constexpr = q_ptr.dtype.element_ty
    if FMT[0]:  # interpreter: q is passed as raw bytes; the fp8 format is in FMT
        dt8: tl.constexpr = tl.float8e4nv
    lo = _fp8_bits16(w.to(tl.int16).to(DT, bitcast=True).to(tl.float32), scale, dt8, FMAX,
                     FMT, SAT)  # fmt: skip
    hi = _fp8_bits16((w >> 16).to(tl.int16).to(DT, bitcast=True).to(tl.float32), scale, dt8,
                     FMAX, FMT, SAT)  # fmt: skip
    r = tl.arange(0, R)[:, None]
    c = tl.arange(0, W)[None, :]
    q16 = (lo | (hi << 8)).to(tl.int16)
    qw = (q_ptr + bq).to(tl.pointer_type(tl.int16))
    if DUAL:
        mask = (r < vm) & (c < vn // 2)
        _store(qw + (r * (N // 2) + c), q16, mask, EVEN, CS)
        cr = tl.arange(0, W)[:, None]
        rr = tl.arange(0, BM)[None, :]
        tmask = tl.trans(mask)
        qt0 = qt_ptr + bqt + (2 * cr) * M + rr
        _store(qt0, tl.trans(lo.to(tl.uint8)).to(qt_ptr.dtype.element_ty, bitcast=True), tmask,
               EVEN, CS)  # fmt: skip
        _store(qt0 + M, tl.trans(hi.to(tl.uint8)).to(qt_ptr.dtype.element_ty, bitcast=True),
               tmask, EVEN, CS)  # fmt: skip
    else:
        _store(qw + (r * W + c), q16, (r * W + c) < vm // 2, EVEN, CS)


@triton.jit
def _lean_bits(x_ptr, numel, M, N, stride_xm, t0, step, kend, BLOCK: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, FW: tl.constexpr, DUAL: tl.constexpr,
               EVEN: tl.constexpr, FINITE: tl.constexpr, INF: tl.constexpr):  # fmt: skip
    """``_walk_bits`` in chunks of 1024 words and a scalar running max: few registers, for
    the rare walks made while tiles are held (inf/NaN filter, the barrier's way out)."""
    R: tl.constexpr = BM if DUAL else BLOCK // 2 // FW
    W: tl.constexpr = BN // 2 if DUAL else FW
    RC: tl.constexpr = max(1, min(R, 1024 // W))
    b = tl.max(tl.zeros((RC, W), dtype=tl.int32), axis=1)
    NS: tl.constexpr = R // RC
    for kj in range(0, kend * NS):  # one loop with a runtime trip count: not unrolled
        w = _ldw(x_ptr, t0 + (kj // NS) * step, numel, M, N, stride_xm, BLOCK, BM, BN, FW, DUAL,
                 EVEN, "", (kj % NS) * RC, RC)  # fmt: skip
        b = tl.maximum(b, tl.max(_abs_bits(w, FINITE, INF), axis=1))
    return tl.max(b, axis=0)


@triton.jit
def _whole_bits(x_ptr, numel, M, N, stride_xm, ntiles, BLOCK: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, FW: tl.constexpr, DUAL: tl.constexpr, EVEN: tl.constexpr,
                INF: tl.constexpr):  # fmt: skip
    """The finite amax bits of the whole tensor by one program (the barrier's way out)."""
    b = _lean_bits(x_ptr, numel, M, N, stride_xm, 0, 1, ntiles, BLOCK, BM, BN, FW, DUAL, EVEN,
                   False, INF)  # fmt: skip
    if b >= INF:
        b = _lean_bits(x_ptr, numel, M, N, stride_xm, 0, 1, ntiles, BLOCK, BM, BN, FW, DUAL,
                       EVEN, True, INF)  # fmt: skip
    return b


@triton.jit(do_not_specialize=["P", "spin"])
def tw_persist_kernel(
    x_ptr, q_ptr, qt_ptr, s_ptr, part_ptr, bar_ptr,
    numel, M, N, stride_xm, P, spin,
    BLOCK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DUAL: tl.constexpr,
    NH: tl.constexpr, NPB: tl.constexpr, FMAX: tl.constexpr,
    FMT: tl.constexpr = (0, 0, 0, 0), SAT: tl.constexpr = False, EVEN: tl.constexpr = False,
    CS: tl.constexpr = False, EVA: tl.constexpr = 1, EVC: tl.constexpr = "evict_first",
    EVH: tl.constexpr = "evict_first", INF: tl.constexpr = 0x7F80, FW: tl.constexpr = 128,
):  # fmt: skip
    """See the module docstring. 16-bit inputs (bf16: ``INF`` 0x7F80, fp16: 0x7C00) with even
    offsets; ``NH`` (0-4) tiles held in registers per program; ``NPB`` a power of two >= ``P``;
    ``EVEN``: every tile of every program is full and every program walks ``kall >= NH``
    tiles (no masks); ``SAT``: NVIDIA satfinite conversion; ``CS``: streaming stores of the
    fp8 outputs; ``EVA``: the walked tiles' first loads ``evict_last`` (1) or normal (0);
    ``EVC`` / ``EVH``: L2 policy of their re-reads / of the held tiles' loads; ``FW``: words
    per row of a flat tile."""
    pid = tl.program_id(0)
    if DUAL:
        ntiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    else:
        ntiles = tl.cdiv(numel, BLOCK)
    kall = tl.cdiv(ntiles, P)  # tiles past the end (t >= ntiles) are fully masked
    kw = tl.maximum(kall - NH, 0)  # walked tiles; then NH held ones
    eva: tl.constexpr = "evict_last" if EVA == 1 else ""
    bits = _walk_bits(x_ptr, numel, M, N, stride_xm, pid, P, kw, BLOCK, BM, BN, FW, DUAL, EVEN,
                      False, INF, eva)  # fmt: skip
    t0 = pid + kw * P
    if NH >= 1:
        h0 = _ldw(x_ptr, t0, numel, M, N, stride_xm, BLOCK, BM, BN, FW, DUAL, EVEN, EVH)
        bits = tl.maximum(bits, _tile_bits(h0, False, INF))
    if NH >= 2:
        h1 = _ldw(x_ptr, t0 + P, numel, M, N, stride_xm, BLOCK, BM, BN, FW, DUAL, EVEN, EVH)
        bits = tl.maximum(bits, _tile_bits(h1, False, INF))
    if NH >= 3:
        h2 = _ldw(x_ptr, t0 + 2 * P, numel, M, N, stride_xm, BLOCK, BM, BN, FW, DUAL, EVEN, EVH)
        bits = tl.maximum(bits, _tile_bits(h2, False, INF))
    if NH >= 4:
        h3 = _ldw(x_ptr, t0 + 3 * P, numel, M, N, stride_xm, BLOCK, BM, BN, FW, DUAL, EVEN, EVH)
        bits = tl.maximum(bits, _tile_bits(h3, False, INF))
    if bits >= INF:  # an inf or NaN: the filtered amax (``h ^ zz``, zz = 0 as spin >= 1: not
        zz = spin >> 31  # shared with the first abs bits, which would stay live until here)
        bits = _lean_bits(x_ptr, numel, M, N, stride_xm, pid, P, kw, BLOCK, BM, BN, FW, DUAL,
                          EVEN, True, INF)  # fmt: skip
        if NH >= 1:
            bits = tl.maximum(bits, _tile_bits(h0 ^ zz, True, INF))
        if NH >= 2:
            bits = tl.maximum(bits, _tile_bits(h1 ^ zz, True, INF))
        if NH >= 3:
            bits = tl.maximum(bits, _tile_bits(h2 ^ zz, True, INF))
        if NH >= 4:
            bits = tl.maximum(bits, _tile_bits(h3 ^ zz, True, INF))
    tl.store(part_ptr + pid, _bits_f32(bits, x_ptr.dtype.element_ty))
    # grid barrier (bounded): every partial stored before the counter says so
    tl.debug_barrier()
    seen = tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") + 1
    polls = 0
    while (seen < P) & (polls < spin):  # an atomic poll: one thread, its value broadcast, so
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")  # the branch is uniform
        polls += 1
    if seen >= P:  # the partials, after the acquire that saw P
        pr = tl.arange(0, NPB)
        amax = tl.max(tl.load(part_ptr + pr, mask=pr < P, other=0.0, volatile=True), axis=0)
    else:  # some program of the grid is not running yet: the whole amax here
        amax = _bits_f32(_whole_bits(x_ptr, numel, M, N, stride_xm, ntiles, BLOCK, BM, BN, FW,
                                     DUAL, EVEN, INF), x_ptr.dtype.element_ty)  # fmt: skip
    tl.debug_barrier()
    if tl.atomic_add(bar_ptr + 1, 1, sem="relaxed", scope="gpu") == P - 1:  # last one out
        tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(bar_ptr + 1, 0, sem="relaxed", scope="gpu")
    # ``z`` is 0, unknown to the compiler: held words are used as ``h ^ z`` below, so nothing
    # derived from them before the barrier (``h >> 16``) is kept live across it instead of h
    z = tl.where(seen > -1, 0, 1)
    scale, sinv = _scale_of(amax, FMAX, False, 0)
    if pid == 0:
        tl.store(s_ptr, sinv)
    if NH >= 1:
        _cast_words(h0 ^ z, t0, scale, x_ptr, q_ptr, qt_ptr, numel, M, N, stride_xm, BLOCK, BM, BN,
                    FW, DUAL, FMAX, FMT, SAT, EVEN, CS)  # fmt: skip
    if NH >= 2:
        _cast_words(h1 ^ z, t0 + P, scale, x_ptr, q_ptr, qt_ptr, numel, M, N, stride_xm, BLOCK, BM,
                    BN, FW, DUAL, FMAX, FMT, SAT, EVEN, CS)  # fmt: skip
    if NH >= 3:
        _cast_words(h2 ^ z, t0 + 2 * P, scale, x_ptr, q_ptr, qt_ptr, numel, M, N, stride_xm, BLOCK,
                    BM, BN, FW, DUAL, FMAX, FMT, SAT, EVEN, CS)  # fmt: skip
    if NH >= 4:
        _cast_words(h3 ^ z, t0 + 3 * P, scale, x_ptr, q_ptr, qt_ptr, numel, M, N, stride_xm, BLOCK,
                    BM, BN, FW, DUAL, FMAX, FMT, SAT, EVEN, CS)  # fmt: skip
    for i in range(0, kw):  # walked tiles, last read first
        t = pid + (kw - 1 - i) * P
        w = _ldw(x_ptr, t, numel, M, N, stride_xm, BLOCK, BM, BN, FW, DUAL, EVEN, EVC)
        _cast_words(w, t, scale, x_ptr, q_ptr, qt_ptr, numel, M, N, stride_xm, BLOCK, BM, BN,
                    FW, DUAL, FMAX, FMT, SAT, EVEN, CS)  # fmt: skip


# AOT: (name, DUAL, BLOCK, BM, BN, NH, warps, maxnreg on sm_90, programs per SM); the defaults
# (flat 8192 x 3 held, dual 64 x 128 x 2 held, 8 warps, 2 programs per SM on NVIDIA) in both
# the even and the masked form, the GPU sweep's variants even only
_AOT = [
    ("flat", False, 8192, 16, 16, 3, 8, 128, True),
    ("dual", True, 16, 64, 128, 2, 8, 128, True),
    ("flat_h0", False, 8192, 16, 16, 0, 8, 128, False),
    ("flat_h2", False, 8192, 16, 16, 2, 8, 128, False),
    ("flat16k_h1", False, 16384, 16, 16, 1, 8, 128, False),
    ("flat_h4_1sm", False, 8192, 16, 16, 4, 8, 248, False),
    ("flat16k_h4_1sm", False, 16384, 16, 16, 4, 8, 248, False),
    ("flat_w16", False, 8192, 16, 16, 2, 16, 128, False),
    ("dual128_h1", True, 16, 128, 128, 1, 8, 128, False),
    ("dual_h4_1sm", True, 16, 64, 128, 4, 8, 248, False),
]


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 input, the target's e4m3 output (FNUZ on gfx942)."""
    assert target in AOT_TARGETS, target
    fp8, fmax = ("fp8e4b8", 240.0) if target == "gfx942" else ("fp8e4nv", 448.0)
    sig = {"x_ptr": "*bf16", "q_ptr": f"*{fp8}", "qt_ptr": f"*{fp8}", "s_ptr": "*fp32",
           "part_ptr": "*fp32", "bar_ptr": "*i32", "numel": "i32:16", "M": "i32:16",
           "N": "i32:16", "stride_xm": "i32:16", "P": "i32", "spin": "i32"}  # fmt: skip
    specs = []
    for name, dual, block, bm, bn, nh, warps, nreg, both in _AOT:
        if target != "sm_90" and (nreg > 128 or (dual and bm * bn > 8192)):
            continue  # AMD: one program per CU, no register cap; 64x128 dual tile
        nv = {"maxnreg": nreg} if target == "sm_90" else {}
        for even in (True, False) if both else (True,):
            cx = {"BLOCK": block, "BM": bm, "BN": bn, "DUAL": dual, "NH": nh, "NPB": 512,
                  "FMAX": fmax, "FMT": (0, 0, 0, 0), "SAT": target == "sm_90", "EVEN": even,
                  "CS": target == "sm_90", "EVA": 1, "EVC": "evict_first",
                  "EVH": "evict_first", "INF": 0x7F80, "FW": 128}  # fmt: skip
            specs.append(
                AotSpec(f"quant_twp_{name}{'_even' if even else ''}_{fp8}", tw_persist_kernel,
                        sig, cx, {"num_warps": warps, **nv},
                        default=name in ("flat", "dual") and even)
            )  # fmt: skip
    return specs
