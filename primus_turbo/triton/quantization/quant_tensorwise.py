"""Tensorwise FP8 quantization with L2 reuse: one kernel, two phases (``PHASE``).

The tensorwise scale needs the amax of the whole tensor before the first value is cast, so the
input is read twice. The second read is cheap only if it hits L2 (H200: 50 MB, split in two
halves near their SMs; MI300X: 256 MB Infinity Cache). ``tw_quant_kernel`` walks exactly the
same tiles in both reads: program ``p`` of ``P`` owns tiles ``p, p + P, p + 2P, ...`` and casts
them in REVERSE order of its amax walk, so the tiles it read last (still in L2, and in the L2
half near its SM when the program lands on the same SM) are re-read first.

* ``PHASE=1``: amax of the own tiles -> ``part_ptr[p]`` (every slot written; no atomics).
* ``PHASE=2``: reduce the ``P`` partial maxima, cast the own tiles in reverse.
(Session 5 also had a one-launch ``PHASE=0`` with a grid barrier and the last tile held in
registers; H200 run 5.2 measured it below the two launches on every shape -- 0.612 / 0.616 vs
0.647 / 0.671 of copy, plain / dual -- so it was removed.)

Tiles: flat ``BLOCK``-wide (``DUAL=False``, any contiguous input) or ``BM x BN`` of the 2-D
input (``DUAL=True``: also writes ``x.T`` quantized, transposed in registers so both stores
are row-contiguous). Special values as in quant_kernel.py (NaN/inf excluded from amax, inf
clamps, NaN stays NaN, all-zero -> amax 1e-12).
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.aot import AOT_TARGETS, AotSpec
from primus_turbo.triton.quantization.quant_kernel import _cast, _scale_of


@triton.jit
def _tile_ptrs(t, numel, M, N, stride_xm, BLOCK: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr, DUAL: tl.constexpr):  # fmt: skip
    """(offsets into x and q, mask, rows, cols) of tile ``t``; q is x's contiguous shape."""
    if DUAL:
        ntn = tl.cdiv(N, BN)
        rm = (t // ntn) * BM + tl.arange(0, BM)
        rn = (t % ntn) * BN + tl.arange(0, BN)
        rm64 = rm.to(tl.int64)
        rn64 = rn.to(tl.int64)
        ox = rm64[:, None] * stride_xm + rn64[None, :]
        oq = rm64[:, None] * N + rn64[None, :]
        mask = (rm[:, None] < M) & (rn[None, :] < N)
    else:
        ox = tl.cast(t, tl.int64) * BLOCK + tl.arange(0, BLOCK)
        oq = ox
        mask = ox < numel
        rm64 = ox
        rn64 = ox
    return ox, oq, mask, rm64, rn64


@triton.jit
def _load(x_ptr, ox, mask, EVEN: tl.constexpr, EVICT: tl.constexpr):
    if EVEN:
        return tl.load(x_ptr + ox, eviction_policy=EVICT)
    return tl.load(x_ptr + ox, mask=mask, other=0.0, eviction_policy=EVICT)


@triton.jit
def _own_amax(x_ptr, numel, M, N, stride_xm, pid, P, kend, ktail, BLOCK: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, DUAL: tl.constexpr, EVEN: tl.constexpr,
              FINITE: tl.constexpr, EVA: tl.constexpr):  # fmt: skip
    """amax over the program's tiles ``pid + k * P`` for ``k < kend`` (fp32). The running
    maximum stays in x's dtype (abs and max are exact): half the registers of fp32 for bf16."""
    if DUAL:
        acc = tl.zeros((BM, BN), dtype=x_ptr.dtype.element_ty)
    else:
        acc = tl.zeros((BLOCK,), dtype=x_ptr.dtype.element_ty)
    for k in range(0, kend):
        ox, oq, mask, rm, rn = _tile_ptrs(pid + k * P, numel, M, N, stride_xm, BLOCK, BM, BN, DUAL)
        if EVA == 1:
            x = _load(x_ptr, ox, mask, EVEN, "evict_last")
        elif EVA == 2:  # the tiles from ktail on are the ones the cast pass re-reads from L2
            if k >= ktail:
                x = _load(x_ptr, ox, mask, EVEN, "evict_last")
            else:
                x = _load(x_ptr, ox, mask, EVEN, "evict_first")
        else:
            x = _load(x_ptr, ox, mask, EVEN, "")
        a = tl.abs(x)
        if FINITE:  # NaN < inf is False
            a = tl.where(a < float("inf"), a, tl.zeros_like(a))
        acc = tl.maximum(acc, a).to(acc.dtype)  # Triton computes bf16 max in fp32: exact
    return _max_all(acc, DUAL).to(tl.float32)


@triton.jit
def _max_all(a, DUAL: tl.constexpr):
    if DUAL:
        r = tl.max(tl.max(a, axis=1), axis=0)
    else:
        r = tl.max(a, axis=0)
    return r


@triton.jit
def _store(ptrs, v, mask, EVEN: tl.constexpr, CS: tl.constexpr):
    if CS:
        if EVEN:
            tl.store(ptrs, v, cache_modifier=".cs")
        else:
            tl.store(ptrs, v, mask=mask, cache_modifier=".cs")
    else:
        if EVEN:
            tl.store(ptrs, v)
        else:
            tl.store(ptrs, v, mask=mask)


@triton.jit
def _cast_store(x, scale, q_ptr, qt_ptr, oq, mask, rm, rn, M, FMAX: tl.constexpr,
                FMT: tl.constexpr, SAT: tl.constexpr, EVEN: tl.constexpr, DUAL: tl.constexpr,
                CS: tl.constexpr):  # fmt: skip
    if SAT:  # NVIDIA cvt.rn.satfinite clamps (inf included) and keeps NaN itself
        q = (x * scale).to(q_ptr.dtype.element_ty)
    else:
        q = _cast(x, scale, FMAX, q_ptr.dtype.element_ty, FMT)
    _store(q_ptr + oq, q, mask, EVEN, CS)
    if DUAL:  # x.T tile: rows of qt are columns of x; transposed in registers
        _store(qt_ptr + (rn[:, None] * M + rm[None, :]), tl.trans(q), tl.trans(mask), EVEN, CS)


@triton.jit
def tw_quant_kernel(
    x_ptr, q_ptr, qt_ptr, s_ptr, part_ptr,
    numel, M, N, stride_xm, P, ktail,
    PHASE: tl.constexpr, BLOCK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    DUAL: tl.constexpr, NPB: tl.constexpr, FMAX: tl.constexpr,
    FMT: tl.constexpr = (0, 0, 0, 0), SAT: tl.constexpr = False, EVEN: tl.constexpr = False,
    FAST: tl.constexpr = True, CS: tl.constexpr = False, EVA: tl.constexpr = 1,
    EVC: tl.constexpr = "evict_first",
):  # fmt: skip
    """See the module docstring. ``P`` programs (the grid), ``NPB`` a power of two >= ``P``;
    ``EVEN``: every tile of every program is full (no masks, no empty tiles); ``FAST``: plain
    ``|x|`` in the amax walk, re-walked with the inf/NaN filter only when the program's amax is
    not finite (same result); ``SAT``: NVIDIA satfinite conversion instead of the clamp;
    ``CS``: streaming (evict-first) stores of the fp8 outputs (NVIDIA), keeping L2 for x;
    ``EVA``: L2 priority of the amax walk's loads: 0 normal, 1 ``evict_last``, 2 ``evict_first``
    before walk step ``ktail`` and ``evict_last`` from there (the tail that fits in L2);
    ``EVC``: eviction policy of the cast walk's loads (``evict_first`` or ``""``)."""
    pid = tl.program_id(0)
    if DUAL:
        ntiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    else:
        ntiles = tl.cdiv(numel, BLOCK)
    kwalk = tl.cdiv(ntiles, P)  # tiles past the end (t >= ntiles) are fully masked
    if PHASE == 1:
        amax = _own_amax(x_ptr, numel, M, N, stride_xm, pid, P, kwalk, ktail, BLOCK, BM, BN,
                         DUAL, EVEN, not FAST, EVA)  # fmt: skip
        if FAST:
            if tl.where(amax < float("inf"), 0, 1) != 0:  # an inf or NaN: the filtered walk
                amax = _own_amax(x_ptr, numel, M, N, stride_xm, pid, P, kwalk, ktail, BLOCK,
                                 BM, BN, DUAL, EVEN, True, EVA)  # fmt: skip
        tl.store(part_ptr + pid, amax)
        return
    pr = tl.arange(0, NPB)
    amax = tl.max(tl.load(part_ptr + pr, mask=pr < P, other=0.0), axis=0)
    scale, sinv = _scale_of(amax, FMAX, False, 0)
    if pid == 0:
        tl.store(s_ptr, sinv)
    for i in range(0, kwalk):  # own tiles, last read first
        ox, oq, mask, rm, rn = _tile_ptrs(pid + (kwalk - 1 - i) * P, numel, M, N, stride_xm,
                                          BLOCK, BM, BN, DUAL)  # fmt: skip
        x = _load(x_ptr, ox, mask, EVEN, EVC).to(tl.float32)
        _cast_store(x, scale, q_ptr, qt_ptr, oq, mask, rm, rn, M, FMAX, FMT, SAT, EVEN, DUAL, CS)


@triton.jit
def tw_delayed_kernel(
    x_ptr, q_ptr, qt_ptr, scale_ptr, sinv_ptr, amax_ptr,
    numel, M, N, stride_xm, P,
    BLOCK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DUAL: tl.constexpr,
    FMAX: tl.constexpr, FMT: tl.constexpr = (0, 0, 0, 0), SAT: tl.constexpr = False,
    EVEN: tl.constexpr = False, FAST: tl.constexpr = True, CS: tl.constexpr = False,
    EVC: tl.constexpr = "evict_first", STORE: tl.constexpr = True, RED: tl.constexpr = False,
):  # fmt: skip
    """Delayed (one-pass) tensorwise cast: ``q = cast(x * scale)`` with the GIVEN device scale
    ``scale_ptr[0]`` (fp32), and the input's amax in the same read: every program keeps the
    running max of its tiles' ``|x|`` (in x's dtype: exact) and adds it with ONE
    ``atomic_max`` on the fp32 bits to ``amax_ptr[0]`` (int32 view; amax >= 0, so the integer
    order of the bits is the float order; the caller zeroes or keeps the slot: the result is
    ``max(old, amax(x))``). Program 0 writes ``sinv_ptr[0] = 1 / scale`` (IEEE division: the
    same bits as torch's ``1 / scale``).
    Tiles and walk as ``tw_quant_kernel`` (program ``p`` owns ``p, p + P, ...``, flat or, with
    ``DUAL``, ``BM x BN`` 2-D tiles whose transposed copy goes to ``qt``), read once.
    Special values as the dynamic kernels: NaN and +-inf are left out of the amax (``FAST``:
    the plain max first, the program re-reads its tiles with the filter only when its max is
    not finite), inf saturates to +-fmax, NaN stays NaN; values beyond the scale's range
    saturate to +-fmax. ``STORE=False``: amax only (no q; the scaler's first call).
    ``RED``: reduce every tile's max to a scalar (one cross-warp reduction per tile) instead of
    a running max of the tile's shape (registers: the 128x128 dual tile spills without it)."""
    pid = tl.program_id(0)
    if DUAL:
        ntiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
        acc = tl.zeros((BM, BN), dtype=x_ptr.dtype.element_ty)
    else:
        ntiles = tl.cdiv(numel, BLOCK)
        acc = tl.zeros((BLOCK,), dtype=x_ptr.dtype.element_ty)
    if RED:
        acc = _max_all(acc, DUAL).to(tl.float32)
    kwalk = tl.cdiv(ntiles, P)
    scale = tl.load(scale_ptr)
    if STORE:
        if pid == 0:
            tl.store(sinv_ptr, tl.div_rn(1.0, scale))
    for k in range(0, kwalk):
        ox, oq, mask, rm, rn = _tile_ptrs(pid + k * P, numel, M, N, stride_xm, BLOCK, BM, BN,
                                          DUAL)  # fmt: skip
        x = _load(x_ptr, ox, mask, EVEN, EVC)
        a = tl.abs(x)
        if not FAST:
            a = tl.where(a < float("inf"), a, tl.zeros_like(a))
        if RED:
            acc = tl.maximum(acc, _max_all(a, DUAL).to(tl.float32))
        else:
            acc = tl.maximum(acc, a).to(acc.dtype)
        if STORE:
            _cast_store(x.to(tl.float32), scale, q_ptr, qt_ptr, oq, mask, rm, rn, M, FMAX, FMT,
                        SAT, EVEN, DUAL, CS)  # fmt: skip
    if RED:
        amax = acc
    else:
        amax = _max_all(acc, DUAL).to(tl.float32)
    if FAST:
        if tl.where(amax < float("inf"), 0, 1) != 0:  # an inf or NaN: the filtered re-walk
            if RED:  # scalar per tile here too (a tile-shaped maximum costs registers)
                amax = 0.0
                for k in range(0, kwalk):
                    ox, oq, mask, rm, rn = _tile_ptrs(pid + k * P, numel, M, N, stride_xm,
                                                      BLOCK, BM, BN, DUAL)  # fmt: skip
                    a = tl.abs(_load(x_ptr, ox, mask, EVEN, ""))
                    a = tl.where(a < float("inf"), a, tl.zeros_like(a))
                    amax = tl.maximum(amax, _max_all(a, DUAL).to(tl.float32))
            else:
                amax = _own_amax(x_ptr, numel, M, N, stride_xm, pid, P, kwalk, 0, BLOCK, BM,
                                 BN, DUAL, EVEN, True, 0)  # fmt: skip
    tl.atomic_max(amax_ptr, amax.to(tl.int32, bitcast=True), sem="relaxed")


@triton.jit
def tw_delayed_guard_kernel(
    x_ptr, q_ptr, qt_ptr, scale_ptr, sinv_ptr, amax_ptr,
    numel, M, N, stride_xm, P,
    BLOCK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DUAL: tl.constexpr,
    FMAX: tl.constexpr, MARGIN_MUL: tl.constexpr, FMT: tl.constexpr = (0, 0, 0, 0),
    SAT: tl.constexpr = False, EVEN: tl.constexpr = False, CS: tl.constexpr = False,
):  # fmt: skip
    """Saturation guard of a delayed cast, launched right after ``tw_delayed_kernel`` on the
    same tensors: ``amax_ptr[0]`` (fp32, the step's recorded amax, this tensor's included) and
    the scale the cast used. When ``amax * scale <= 1.125 * FMAX`` nothing saturated by more
    than an fp8 rounding step (E4M3's top spacing is 7%; a threshold at FMAX would fire on every
    1-ulp growth of a steady tensor with margin 0): every program returns after two scalar
    loads. Otherwise (the tensor's range outgrew the history, e.g. a weight after a large
    optimizer step) the whole tensor is cast again with the scale of the
    recorded amax, ``div_rn(FMAX, amax) * 2**-margin`` (the update kernel's formula), and
    program 0 rewrites ``sinv_ptr[0]``; the scaler's own ``scale`` is left to ``update()``
    (other programs still read it). Same grid, tiles and walk as the cast."""
    amax = tl.load(amax_ptr)
    scale = tl.load(scale_ptr)
    if amax * scale > FMAX * 1.125:
        scale = tl.div_rn(FMAX, amax) * MARGIN_MUL
        pid = tl.program_id(0)
        if pid == 0:
            tl.store(sinv_ptr, tl.div_rn(1.0, scale))
        if DUAL:
            ntiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
        else:
            ntiles = tl.cdiv(numel, BLOCK)
        for k in range(0, tl.cdiv(ntiles, P)):
            ox, oq, mask, rm, rn = _tile_ptrs(pid + k * P, numel, M, N, stride_xm, BLOCK, BM, BN,
                                              DUAL)  # fmt: skip
            x = _load(x_ptr, ox, mask, EVEN, "").to(tl.float32)
            _cast_store(x, scale, q_ptr, qt_ptr, oq, mask, rm, rn, M, FMAX, FMT, SAT, EVEN, DUAL,
                        CS)  # fmt: skip


@triton.jit
def tw_delayed_update_kernel(hist_ptr, scale_ptr, sinv_ptr, L, FMAX: tl.constexpr,
                             MARGIN_MUL: tl.constexpr, MOST_RECENT: tl.constexpr,
                             BLOCK: tl.constexpr):  # fmt: skip
    """Delayed-scaling update of one scaler in ONE launch (one program, ``BLOCK >= L``):
    ``amax = max(history)`` (or ``history[0]`` with ``MOST_RECENT``); the history rolled by -1
    with slot 0 zeroed; ``scale = div_rn(FMAX, amax) * 2**-margin`` where ``amax > 0`` and the
    result is finite, else the old scale; ``scale_inv = div_rn(1, scale)``. Every load comes
    before the barrier and every store after it (the roll is in place)."""
    i = tl.arange(0, BLOCK)
    live = i < L
    h = tl.load(hist_ptr + i, mask=live, other=0.0)
    nxt = tl.load(hist_ptr + (i + 1) % L, mask=live, other=0.0)
    if MOST_RECENT:
        amax = tl.load(hist_ptr)
    else:
        amax = tl.max(h, axis=0)
    old = tl.load(scale_ptr)
    new = tl.div_rn(FMAX, tl.where(amax > 0.0, amax, 1.0)) * MARGIN_MUL
    new = tl.where((amax > 0.0) & (new < float("inf")), new, old)
    tl.debug_barrier()
    tl.store(hist_ptr + i, tl.where(i == 0, 0.0, nxt), mask=live)
    tl.store(scale_ptr, new)
    tl.store(sinv_ptr, tl.div_rn(1.0, new))


# AOT: the default launch configs (flat 8192 x 8 warps; dual 128 x 128 x 8 warps), per phase,
# and the previous dual tile (64 x 128)
_AOT = [  # (name, PHASE, DUAL, BLOCK, BM, BN, warps, maxnreg on sm_90)
    ("amax", 1, False, 8192, 16, 16, 8, 64),
    ("cast", 2, False, 8192, 16, 16, 8, 64),
    ("dual_amax", 1, True, 16, 128, 128, 8, 64),
    ("dual_cast", 2, True, 16, 128, 128, 8, 64),
    ("dual64_amax", 1, True, 16, 64, 128, 8, 64),
    ("dual64_cast", 2, True, 16, 64, 128, 8, 64),
]


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 input, the target's e4m3 output (FNUZ on gfx942); even and masked variants."""
    assert target in AOT_TARGETS, target
    fp8, fmax = ("fp8e4b8", 240.0) if target == "gfx942" else ("fp8e4nv", 448.0)
    sig = {
        "x_ptr": "*bf16",
        "q_ptr": f"*{fp8}",
        "qt_ptr": f"*{fp8}",
        "s_ptr": "*fp32",
        "part_ptr": "*fp32",
        "numel": "i32:16",
        "M": "i32:16",
        "N": "i32:16",
        "stride_xm": "i32:16",
        "P": "i32",
        "ktail": "i32",
    }
    specs = []
    for name, phase, dual, block, bm, bn, warps, nreg in _AOT:
        nv = {"maxnreg": nreg} if target == "sm_90" else {}
        for even in (True, False):
            cx = {"PHASE": phase, "BLOCK": block, "BM": bm, "BN": bn, "DUAL": dual,
                  "NPB": 1024, "FMAX": fmax, "FMT": (0, 0, 0, 0),
                  "SAT": target == "sm_90", "EVEN": even, "FAST": True,
                  "CS": target == "sm_90", "EVA": 1, "EVC": "evict_first"}  # fmt: skip
            specs.append(
                AotSpec(f"quant_tw_{name}{'_even' if even else ''}_{fp8}", tw_quant_kernel, sig,
                        cx, {"num_warps": warps, **nv}, default=name == "cast" and even)
            )  # fmt: skip
    dsig = {k: v for k, v in sig.items() if k not in ("s_ptr", "part_ptr", "ktail")}
    dsig.update(scale_ptr="*fp32", sinv_ptr="*fp32", amax_ptr="*i32")
    dsig = {k: dsig[k] for k in ("x_ptr", "q_ptr", "qt_ptr", "scale_ptr", "sinv_ptr", "amax_ptr",
                                 "numel", "M", "N", "stride_xm", "P")}  # fmt: skip
    # delayed: flat 8192 x 8 warps, 4 per SM (cap 64); dual 128x128, 3 per SM (cap 80) on
    # NVIDIA (the default), 64x128 4 per SM (cap 64; the AMD default)
    for name, dual, block, bm, nreg in (("delayed", False, 8192, 16, 64),
                                        ("delayed_dual", True, 16, 128, 80),
                                        ("delayed_dual64", True, 16, 64, 64)):  # fmt: skip
        if target != "sm_90" and name == "delayed_dual":
            continue
        nv = {"maxnreg": nreg} if target == "sm_90" else {}
        for even in (True, False):
            cx = {"BLOCK": block, "BM": bm, "BN": 128 if dual else 16,
                  "DUAL": dual, "FMAX": fmax, "FMT": (0, 0, 0, 0), "SAT": target == "sm_90",
                  "EVEN": even, "FAST": True, "CS": target == "sm_90",
                  "EVC": "" if dual else "evict_first", "STORE": True, "RED": dual}  # fmt: skip
            specs.append(
                AotSpec(f"quant_tw_{name}{'_even' if even else ''}_{fp8}", tw_delayed_kernel,
                        dsig, cx, {"num_warps": 8, **nv})
            )  # fmt: skip
            gx = {k: cx[k] for k in ("BLOCK", "BM", "BN", "DUAL", "FMAX", "FMT", "SAT", "EVEN",
                                     "CS")}  # fmt: skip
            specs.append(
                AotSpec(f"quant_tw_{name}_guard{'_even' if even else ''}_{fp8}",
                        tw_delayed_guard_kernel, {**dsig, "amax_ptr": "*fp32"},
                        {**gx, "MARGIN_MUL": 1.0}, {"num_warps": 8, **nv})
            )  # fmt: skip
    for recent in (False, True):  # the update of a 1024-slot history (the default length)
        specs.append(AotSpec(f"quant_tw_delayed_update{'_recent' if recent else ''}_{fp8}",
                             tw_delayed_update_kernel,
                             {"hist_ptr": "*fp32", "scale_ptr": "*fp32", "sinv_ptr": "*fp32",
                              "L": "i32"},
                             {"FMAX": fmax, "MARGIN_MUL": 1.0, "MOST_RECENT": recent,
                              "BLOCK": 1024}, {"num_warps": 4}))  # fmt: skip
    for sp in [sp for sp in specs if sp.name.startswith("quant_tw_amax_even")]:
        specs.append(AotSpec(sp.name.replace("quant_tw_", "quant_tw_tail_"), sp.fn, sp.signature,
                             {**sp.constexprs, "EVA": 2}, sp.options))  # fmt: skip
    return specs
