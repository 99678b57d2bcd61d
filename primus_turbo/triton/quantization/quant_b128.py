"""Block 1x128 dual quantization on the tensorwise dual cast's plan (session 7 round 2, opt-in).

``quantize_fp8_with_trans(x, fp8, BLOCKWISE, block_size=128)`` writes ``q`` [M, N] with one
scale per (row, 128 columns) and ``q^T`` [N, M] with one scale per (column, 128 rows). The v3
tile kernel (quant_kernel_v2, MODE ROWS + DUAL: one 128x128 tile per program, 8 warps, 119
registers, 2 programs per SM) reaches ~0.69 of copy on the H200; the tensorwise dual cast pass
(quant_tensorwise ``tw_quant_kernel`` PHASE=2 DUAL: same two outputs, 128x128 tiles, 8 warps,
4 persistent programs per SM at 64 registers) reaches ~copy speed. What differs, each a knob:
* the transposition. In the tensorwise cast the chain from the load to the q^T store is all
  elementwise, so Triton moves its one layout conversion back onto the loaded *bf16* tile
  (sm_90: 8 ``st.shared.v4`` + 8 ``ldmatrix.x4.trans`` per thread). In v3 the column scale
  comes from a reduction Triton does not rematerialise in another layout, so the conversion
  stays in front of the store, on the *fp8* tile, byte by byte (40 ``st.shared.b32`` + 64
  ``ld.shared.b8``); ``tl.trans`` of the bf16 tile, even behind an opaque inline-asm
  identity, gives the same code. Here the column amaxes are stored to their ``st`` slots and
  read back after a barrier (the row path runs in between); the scale entering the q^T
  multiply is then a load, and the bf16 tile is what gets transposed (every variant);
* occupancy: persistent programs (``PERSIST``) walking the tiles ``pid, pid + P, ...``, 2 or
  3 per SM, 8 or 16 warps, under register caps (see ``B128_VARIANTS``); the tile stays in
  bf16 (amaxes in bf16, fp32 only inside the casts);
* ``EVL``: ``evict_first`` loads (the tensorwise cast's ``EVC``); ``PF``: the program's next
  tile prefetched into L2 (sm_90), the L2 hits the tensorwise cast gets from its amax pass.
Scales and casts are v3's (``_scale_of``, ``x * scale`` -> fp8, satfinite on NVIDIA,
``_cast2`` elsewhere; amaxes equal to ``max(_finite_abs(x))``), so every output is bitwise
v3's (tests/pytorch/ops/test_quantization_b128.py). Round 1's word-packed variants (w8, w8g,
w8gc, h8g, h16g, h16gc, h16gp2, h16gp2c) all lost to v3 on the H200 (call 7.2: 0.601 ..
0.299 vs 0.687 of copy) and were removed.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from primus_turbo.triton.aot import AOT_TARGETS, AotSpec
from primus_turbo.triton.quantization.quant_common import aot_fp8, tile_signature
from primus_turbo.triton.quantization.quant_kernel import _scale_of
from primus_turbo.triton.quantization.quant_kernel_v2 import _cast2

B = tl.constexpr(128)  # the block: 1x128 (rows of q) and 128x1 (rows of q^T); the tile is B x B


@triton.jit
def _prefetch_l2(x_ptr, t, grid_n, stride_xm):
    """NVIDIA sm_90: ``cp.async.bulk.prefetch.L2`` of tile ``t``'s 128 rows (256 bytes each;
    the rows 16-byte aligned: ``stride_xm % 8 == 0``, full tiles), so the next load of that
    tile hits L2 (what the tensorwise cast gets from its amax pass)."""
    pid_m = t // grid_n
    pid_n = t - pid_m * grid_n
    rows = x_ptr + (pid_m * B + tl.arange(0, B)).to(tl.int64) * stride_xm + pid_n * B
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], 256; mov.u32 $0, 0;",
                              "=r,l", [rows], dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _amax(x, AXIS: tl.constexpr):
    """Finite amax (fp32) of the bf16 ``x`` along ``AXIS``: ``|x|`` and the inf/NaN filter in
    bf16 (exact; ``max(_finite_abs(x.to(fp32)))`` bit for bit), no fp32 copy of the tile; the
    filtered tile is shared by the row and the column reductions. (Integer keys of the bf16
    bits and fp32 math both needed more registers on sm_90: 8 warps at 80 spilled 226 / 108 B
    against 28 B here.)"""
    a = tl.abs(x)
    return tl.max(tl.where(a < float("inf"), a, tl.zeros_like(a)), axis=AXIS).to(tl.float32)


@triton.jit
def _rows_out(x, q_ptr, s_ptr, r0, c0, R, C, stride_qm, stride_sm, stride_sn, blk,
              FMAX: tl.constexpr, EMAX: tl.constexpr, FMT: tl.constexpr, SAT: tl.constexpr,
              EVEN: tl.constexpr):  # fmt: skip
    """1x128 blocks of the bf16 tile ``x`` [B, B] (rows ``r0 + i`` of an ``R x C`` output,
    columns ``c0 + j``): the casts to ``q_ptr`` and one scale per row at ``s_ptr``."""
    r = r0 + tl.arange(0, B)
    c = c0 + tl.arange(0, B)
    r64 = r.to(tl.int64)
    scale, sinv = _scale_of(_amax(x, 1), FMAX, False, EMAX)
    q = _cast2(x.to(tl.float32), scale[:, None], FMAX, q_ptr.dtype.element_ty, FMT, SAT)
    if EVEN:
        tl.store(q_ptr + r64[:, None] * stride_qm + c[None, :], q)
        tl.store(s_ptr + r64 * stride_sm + blk * stride_sn, sinv)
    else:
        tl.store(q_ptr + r64[:, None] * stride_qm + c[None, :], q,
                 mask=(r[:, None] < R) & (c[None, :] < C))  # fmt: skip
        tl.store(s_ptr + r64 * stride_sm + blk * stride_sn, sinv, mask=r < R)


@triton.jit
def _b128_tile(
    t, grid_n, x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm, stride_qm, stride_qtn,
    stride_sm, stride_sn, stride_stm, stride_stn, FMAX: tl.constexpr, EMAX: tl.constexpr,
    FMT: tl.constexpr, SAT: tl.constexpr, EVEN: tl.constexpr, EVL: tl.constexpr,
):  # fmt: skip
    pid_m = t // grid_n
    pid_n = t - pid_m * grid_n
    rm = pid_m * B + tl.arange(0, B)
    rn = pid_n * B + tl.arange(0, B)
    ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rn[None, :]
    policy: tl.constexpr = "evict_first" if EVL else ""
    if EVEN:
        x = tl.load(ptrs, eviction_policy=policy)
    else:
        x = tl.load(ptrs, mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0,
                    eviction_policy=policy)  # fmt: skip
    # The column amaxes go to their st slots and are read back after a barrier (the row path
    # runs in between), then overwritten with the inverse scales after a second barrier: the
    # scale entering the q^T multiply is a load, not a reduction, so Triton converts the
    # *bf16* tile to the store's layout (ldmatrix.trans, as in the tensorwise dual cast)
    # instead of the fp8 one byte by byte. The scales are computed from the values read back.
    c = pid_n * B + tl.arange(0, B)
    sptr = st_ptr + pid_m * stride_stm + c.to(tl.int64) * stride_stn
    smask = None if EVEN else c < N
    tl.store(sptr, _amax(x, 0), mask=smask)
    tl.debug_barrier()
    # rows of q: 1 x 128 blocks, scale (row, pid_n)
    _rows_out(x, q_ptr, s_ptr, pid_m * B, pid_n * B, M, N, stride_qm, stride_sm, stride_sn,
              pid_n, FMAX, EMAX, FMT, SAT, EVEN)  # fmt: skip
    # rows of q^T: 128 x 1 blocks, scale (column, pid_m)
    if EVEN:
        ac = tl.load(sptr, cache_modifier=".cg")
    else:
        ac = tl.load(sptr, mask=smask, other=0.0, cache_modifier=".cg")
    tl.debug_barrier()
    sc, sinv_c = _scale_of(ac, FMAX, False, EMAX)
    tl.store(sptr, sinv_c, mask=smask)
    q = _cast2(tl.trans(x).to(tl.float32), sc[:, None], FMAX, qt_ptr.dtype.element_ty, FMT, SAT)
    r = pid_m * B + tl.arange(0, B)
    ptrs = qt_ptr + c.to(tl.int64)[:, None] * stride_qtn + r[None, :]
    if EVEN:
        tl.store(ptrs, q)
    else:
        tl.store(ptrs, q, mask=(c[:, None] < N) & (r[None, :] < M))


@triton.jit
def quant_b128_kernel(
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
    FMAX: tl.constexpr,
    EMAX: tl.constexpr,
    FMT: tl.constexpr = (0, 0, 0, 0),
    SAT: tl.constexpr = False,
    EVEN: tl.constexpr = False,
    EVL: tl.constexpr = False,
    PERSIST: tl.constexpr = True,
    PF: tl.constexpr = False,
):
    """``x`` [M, N] -> ``q`` [M, N], ``s`` per (row, 128 columns), ``qt`` [N, M], ``st`` per
    (column, 128 rows); scale tensors addressed as in ``quant_tile_v2_kernel`` (MODE=ROWS,
    DUAL). ``PERSIST``: the grid's programs walk the tiles ``pid, pid + P, ...``; else one
    tile per program. ``PF`` (persistent, full tiles, NVIDIA sm_90): each step first
    prefetches the program's next tile into L2 (``tl.range(num_stages=2)`` does not pipeline
    this loop in Triton 3.6: no cp.async in the sm_90 PTX)."""
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, B)
    if not PERSIST:
        _b128_tile(pid, grid_n, x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm, stride_qm,
                   stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn, FMAX, EMAX, FMT,
                   SAT, EVEN, EVL)  # fmt: skip
    else:
        ntiles = tl.cdiv(M, B) * grid_n
        for t in range(pid, ntiles, tl.num_programs(0)):
            if PF:
                if t + tl.num_programs(0) < ntiles:
                    _prefetch_l2(x_ptr, t + tl.num_programs(0), grid_n, stride_xm)
            _b128_tile(t, grid_n, x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm,
                       stride_qm, stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn, FMAX,
                       EMAX, FMT, SAT, EVEN, EVL)  # fmt: skip


# ---- variants (PRIMUS_TURBO_QUANT_B128=<name>) ---------------------------------------------
# name -> (programs per SM / CU (0: one tile per program, the v3 grid), warps, NVIDIA register
# cap, evict_first loads). sm_90 (ptxas): 16 warps at 64 and 8 warps at 96+ do not spill;
# 8 warps at 80 (3 programs per SM) spill 28 B, at 64 (the tensorwise cast's 4 per SM) 196 B;
# 16 warps at 40 (3 per SM) 64 B, at 32 (4 per SM) 242 B.
B128_VARIANTS = {
    "x8": (0, 8, 128, False),  # v3's grid and occupancy, only the bf16 transposition
    "x16": (0, 16, 64, False),  # one tile per program, 2 x 16 warps per SM
    "p16": (2, 16, 64, False),  # persistent, 2 x 16 warps per SM
    "p16e": (2, 16, 64, True),  # + evict_first loads
    "p16f": (2, 16, 64, False),  # + the next tile prefetched into L2 (sm_90)
    "p8": (2, 8, 128, False),  # persistent, 2 x 8 warps per SM
    "p8f": (2, 8, 128, False),  # + the next tile prefetched into L2 (sm_90)
    "p83": (3, 8, 80, False),  # persistent, 3 x 8 warps per SM (28 B spilled on sm_90)
    "p83f": (3, 8, 80, False),  # + the next tile prefetched into L2 (sm_90)
    "p163": (3, 16, 40, False),  # persistent, 3 x 16 warps per SM (64 B spilled on sm_90)
}
PREFETCH = frozenset({"p16f", "p8f", "p83f"})  # NVIDIA sm_90, full tiles, stride_xm % 8 == 0
# masked shapes (not multiples of 128) take another plan (8 warps at 80 spill 296 B there)
_MASKED_PLAN = {"p83": "p8", "p83f": "p8f", "p163": "p16"}

# the variant an unset PRIMUS_TURBO_QUANT_B128 selects on NVIDIA (None: v3 until measured)
DEFAULT_NVIDIA: str | None = None


def b128_variant(nvidia: bool = False) -> str | None:
    """``PRIMUS_TURBO_QUANT_B128``: ``v3`` -> None (the v3 tile kernel); unset / empty ->
    ``DEFAULT_NVIDIA`` on NVIDIA, else None; otherwise a key of ``B128_VARIANTS``."""
    raw = os.environ.get("PRIMUS_TURBO_QUANT_B128", "").strip().lower()
    if raw == "":
        return DEFAULT_NVIDIA if nvidia else None
    if raw == "v3":
        return None
    if raw not in B128_VARIANTS:
        raise ValueError(
            f"primus_turbo: PRIMUS_TURBO_QUANT_B128 expected v3 or one of "
            f"{sorted(B128_VARIANTS)}, got {raw!r}"
        )
    return raw


def launch_b128(x, q, s, qt, st, variant, fmax, emax, fmt, sat, nvidia, cus, u8) -> bool:
    """Launch ``quant_b128_kernel`` (``u8`` views fp8 outputs as bytes under the interpreter;
    ``cus``: SMs / CUs; ``s`` / ``st`` as quant_blockwise allocates them). Always taken (True)."""
    m, n = x.shape
    if m == 0 or n == 0:
        return True
    even = m % 128 == 0 and n % 128 == 0
    if not even:
        variant = _MASKED_PLAN.get(variant, variant)
    per_sm, warps, nreg, evl = B128_VARIANTS[variant]
    ntiles = -(-m // 128) * -(-n // 128)
    grid = min(ntiles, per_sm * cus) if per_sm else ntiles
    extra = {"maxnreg": nreg} if nvidia else {}
    pf = variant in PREFETCH and nvidia and even and x.stride(0) % 8 == 0
    pf = pf and torch.cuda.get_device_capability(x.device)[0] >= 9
    quant_b128_kernel[(grid,)](
        x, u8(q), s, u8(qt), st, m, n, x.stride(0), q.stride(0), qt.stride(0),
        s.stride(0), s.stride(1), st.stride(1), st.stride(0),
        FMAX=fmax, EMAX=emax, FMT=fmt, SAT=sat, EVEN=even, EVL=evl, PERSIST=per_sm > 0, PF=pf,
        num_warps=warps, **extra,
    )  # fmt: skip
    return True


def aot_specs(target: str) -> list[AotSpec]:
    """Each variant, even and masked; the register cap on sm_90 only."""
    assert target in AOT_TARGETS, target
    fp8, fmax = aot_fp8(target)
    nv = target == "sm_90"
    specs = []
    for name, (per_sm, warps, nreg, evl) in B128_VARIANTS.items():
        pf = name in PREFETCH
        if pf and not nv:
            continue
        for even in (True,) if pf or name in _MASKED_PLAN else (True, False):
            cx = {"FMAX": fmax, "EMAX": 8, "FMT": (0, 0, 0, 0), "SAT": nv, "EVEN": even,
                  "EVL": evl, "PERSIST": per_sm > 0, "PF": pf}  # fmt: skip
            specs.append(
                AotSpec(
                    f"quant_b128_{name}_{'even' if even else 'mask'}_{fp8}",
                    quant_b128_kernel,
                    tile_signature(fp8),
                    cx,
                    {"num_warps": warps, **({"maxnreg": nreg} if nv else {})},
                )
            )
    return specs
