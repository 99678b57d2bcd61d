"""Block 1x128 dual quantization with the next tile's load in flight (session 6, opt-in).

``PRIMUS_TURBO_QUANT_B128=<variant>`` (unset: the v3 tile kernel, unchanged) routes the
1x128 dual recipe (``quant_blockwise(x, dtype, 128, -1, dual=True)``) of a row-contiguous
input on NVIDIA to ``quant_b128_pf_kernel``: persistent programs walk the 128x128 tiles
``pid, pid + P, ...``; each iteration first issues the (bf16) load of its next tile into
registers, then reduces, converts and stores the current one, so HBM reads stay in flight
while a program computes and stores (v3: load -> reduce -> convert -> stores, serially, two
programs per SM). The last prefetch of a program is masked off (no extra traffic).
Variants (``B128_VARIANTS``: warps, register cap, programs per SM):
* ``pf16``: 16 warps, cap 128, one program per SM (16 warps per SM, as v3's two 8-warp ones;
  half the values per thread leave room for the prefetched tile);
* ``pf32``: 32 warps, cap 64, one program per SM (32 warps per SM, twice v3's); shapes that
  are not multiples of 128 take pf16's plan (``_MASKED_PLAN``).
Same math as v3 (``_tile_amaxes`` / ``_scale_of`` / ``_cast2`` of quant_kernel(_v2)), so
bitwise equal; masked for any shape (``EVEN`` drops the masks when M and N are multiples
of 128); 64-bit row offsets. AMD keeps v3 (no specs for gfx942 / gfx950: the variants are
NVIDIA register plans); TRITON_INTERPRET=1 runs the kernel (tests).

Status (end of session 6): bitwise equal to v3 in the interpreter tests only. It has NOT run on
a GPU yet (the session's device time ran out before its A/B, see benchmark/RESULTS.md run 6.5):
first thing to do with it is ``test_quantization_b128.py`` on the H200 and the A/B line in
scripts/gpu_lines/s6_r3_qb128.txt; remove it if it does not beat v3 (0.689 / 0.665 of copy).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from primus_turbo.triton.aot import AOT_TARGETS, AotSpec
from primus_turbo.triton.quantization.quant_common import aot_fp8, tile_signature
from primus_turbo.triton.quantization.quant_kernel import _scale_of
from primus_turbo.triton.quantization.quant_kernel_v2 import _cast2, _tile_amaxes

# variant -> (warps, maxnreg, programs per SM)
# (sm_90 AOT, even / masked: pf16 123 / 125 registers, pf32 64 / 64, no spill. Not kept: 8 warps
# at cap 128, two programs per SM as v3, spilled 128 B; 8 warps at cap 240 (225 registers, one
# program of 8 warps per SM) has half v3's warps per SM)
B128_VARIANTS = {"pf16": (16, 128, 1), "pf32": (32, 64, 1)}
# masked shapes (M or N not a multiple of 128) of a variant launch another's plan: pf32's
# masked kernel spills 4 B at cap 64 on sm_90
_MASKED_PLAN = {"pf32": "pf16"}


@triton.jit
def _load_tile(x_ptr, t, ntiles, grid_n, M, N, stride_xm, BM: tl.constexpr, BN: tl.constexpr,
               EVEN: tl.constexpr):  # fmt: skip
    """Tile ``t``'s bf16 values (all masked off when ``t >= ntiles``)."""
    pid_m = t // grid_n
    pid_n = t - pid_m * grid_n
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rn[None, :]
    if EVEN:
        ok = tl.full((BM, BN), 1, tl.int1) & (t < ntiles)
    else:
        ok = (rm < M)[:, None] & (rn < N)[None, :] & (t < ntiles)
    return tl.load(ptrs, mask=ok, other=0.0)


@triton.jit
def _rows_dual_tile(
    xb, t, grid_n, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_qm, stride_qtn, stride_sm,
    stride_sn, stride_stm, stride_stn, BM: tl.constexpr, BN: tl.constexpr, FMAX: tl.constexpr,
    EMAX: tl.constexpr, FMT: tl.constexpr, SAT: tl.constexpr, FAST: tl.constexpr,
    EVEN: tl.constexpr,
):  # fmt: skip
    """The ROWS + DUAL branch of quant_kernel_v2's ``_one_tile`` on a loaded tile ``xb``."""
    qty = q_ptr.dtype.element_ty
    pid_m = t // grid_n
    pid_n = t - pid_m * grid_n
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rm64 = rm.to(tl.int64)
    mask_m = rm < M
    mask_n = rn < N
    if EVEN:
        mask = None
        mask_t = None
    else:
        mask = mask_m[:, None] & mask_n[None, :]
        mask_t = mask_n[:, None] & mask_m[None, :]
    x = xb.to(tl.float32)
    ar, ac = _tile_amaxes(x, BM, BN, 0, True, FAST)
    scale, sinv = _scale_of(ar, FMAX, False, EMAX)
    tl.store(q_ptr + rm64[:, None] * stride_qm + rn[None, :],
             _cast2(x, scale[:, None], FMAX, qty, FMT, SAT), mask=mask)  # fmt: skip
    tl.store(s_ptr + rm64 * stride_sm + pid_n * stride_sn, sinv, mask=None if EVEN else mask_m)
    sc, sinv_c = _scale_of(ac, FMAX, False, EMAX)
    tl.store(qt_ptr + rn.to(tl.int64)[:, None] * stride_qtn + rm[None, :],
             tl.trans(_cast2(x, sc[None, :], FMAX, qty, FMT, SAT)), mask=mask_t)  # fmt: skip
    tl.store(st_ptr + pid_m * stride_stm + rn * stride_stn, sinv_c,
             mask=None if EVEN else mask_n)  # fmt: skip


@triton.jit
def quant_b128_pf_kernel(
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
    FAST: tl.constexpr = False,
    EVEN: tl.constexpr = False,
):
    """``x`` [M, N] -> ``q`` [M, N] with scales ``s`` per (row, 128 columns) and ``qt`` [N, M]
    with scales ``st`` per (column, 128 rows), addressed as in ``quant_tile_v2_kernel``
    (MODE=ROWS, DUAL). Persistent over the 128x128 tiles, one tile's load ahead."""
    BM: tl.constexpr = 128
    BN: tl.constexpr = 128
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    grid_n = tl.cdiv(N, BN)
    ntiles = tl.cdiv(M, BM) * grid_n
    xn = _load_tile(x_ptr, pid, ntiles, grid_n, M, N, stride_xm, BM, BN, EVEN)
    for t in range(pid, ntiles, P):
        xb = xn
        xn = _load_tile(x_ptr, t + P, ntiles, grid_n, M, N, stride_xm, BM, BN, EVEN)
        _rows_dual_tile(xb, t, grid_n, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_qm,
                        stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn, BM, BN, FMAX,
                        EMAX, FMT, SAT, FAST, EVEN)  # fmt: skip


def b128_variant() -> str | None:
    """``PRIMUS_TURBO_QUANT_B128``: unset / empty / ``v3`` -> None (the v3 tile kernel), else a
    key of ``B128_VARIANTS``."""
    raw = os.environ.get("PRIMUS_TURBO_QUANT_B128", "").strip().lower()
    if raw in ("", "v3"):
        return None
    if raw not in B128_VARIANTS:
        raise ValueError(
            f"primus_turbo: PRIMUS_TURBO_QUANT_B128 expected v3 or one of "
            f"{sorted(B128_VARIANTS)}, got {raw!r}"
        )
    return raw


def launch_b128(x, q, s, qt, st, variant, fmax, emax, fmt, sat, interp, cus, u8):
    """Launch ``quant_b128_pf_kernel`` (``u8`` views fp8 outputs as bytes under the
    interpreter; ``cus``: SMs; ``s`` / ``st`` as quant_blockwise allocates them)."""
    m, n = x.shape
    if m == 0 or n == 0:
        return
    even = m % 128 == 0 and n % 128 == 0
    warps, nreg, per_sm = B128_VARIANTS[variant if even else _MASKED_PLAN.get(variant, variant)]
    ntiles = -(-m // 128) * -(-n // 128)
    grid = min(ntiles, per_sm * cus)
    extra = {} if interp else {"maxnreg": nreg}
    quant_b128_pf_kernel[(grid,)](
        x, u8(q), s, u8(qt), st, m, n, x.stride(0), q.stride(0), qt.stride(0),
        s.stride(0), s.stride(1), st.stride(1), st.stride(0),
        FMAX=fmax, EMAX=emax, FMT=fmt, SAT=sat, FAST=False,
        EVEN=even, num_warps=warps, **extra,
    )  # fmt: skip


def aot_specs(target: str) -> list[AotSpec]:
    """sm_90 only (the launcher routes NVIDIA devices only): each variant, EVEN and masked
    (the masked one only where ``_MASKED_PLAN`` does not replace it)."""
    assert target in AOT_TARGETS, target
    if target != "sm_90":
        return []
    fp8, fmax = aot_fp8(target)
    specs = []
    for name, (warps, nreg, _) in B128_VARIANTS.items():
        for even in (True, False) if name not in _MASKED_PLAN else (True,):
            cx = {"FMAX": fmax, "EMAX": 8, "FMT": (0, 0, 0, 0), "SAT": True, "FAST": False,
                  "EVEN": even}  # fmt: skip
            specs.append(AotSpec(f"quant_b128_{name}_{'even' if even else 'mask'}_{fp8}",
                                 quant_b128_pf_kernel, tile_signature(fp8), cx,
                                 {"num_warps": warps, "maxnreg": nreg},
                                 default=name == "pf16" and even))  # fmt: skip
    return specs
