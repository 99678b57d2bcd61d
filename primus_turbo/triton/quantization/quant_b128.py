"""Block 1x128 dual quantization, q^T packed in 32-bit words (session 7, opt-in).

``quantize_fp8_with_trans(x, fp8, BLOCKWISE, block_size=128)`` writes ``q`` [M, N] with one
scale per (row, 128 columns) and ``q^T`` [N, M] with one scale per (column, 128 rows). The v3
tile kernel (quant_kernel_v2, MODE ROWS + DUAL, 128x128 tile, 8 warps) transposes the *fp8*
tile through shared memory byte by byte (sm_90 SASS per thread: 40 ``st.shared.b32``, 64
``ld.shared.b8``), filters inf/NaN with a compare + select per element and direction, and
evaluates ~40 divisions per thread (each column scale and its inverse is computed by every
thread holding that column): ~1600 SASS instructions per thread and tile, 25.9M warp
instructions at 8192x4096 on the H200 (ncu, run 7.1: issue 52% busy, 1 eligible warp, DRAM 46%;
0.69 of copy), against 10.1M for the tensorwise dual cast with the same outputs.

``quant_b128_kernel`` loads the tile as ``[32, 128, 4]`` (row ``4a + b``, column ``n``): Triton
gives each thread the 4 rows ``b`` of its ``(a, n)`` positions, so
* ``q`` is stored straight from the load's layout (16-byte vectors along ``n``);
* the 4 bytes of ``q^T`` at ``(n, 4a .. 4a + 3)`` are packed into one uint32 in registers and
  ``q^T`` is transposed and stored as 32-bit words (``[N, M/4]``): a quarter of the shared-memory
  operations, 16-byte stores along ``M``. ``ASM`` (NVIDIA): the packing is two
  ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` + one ``mov.b32`` per word, the instructions Triton
  itself emits for the fp32 -> fp8 conversion (same bits); elsewhere bytes are shifted and
  summed;
* amaxes use integer keys: ``k = 2 * bits(x) + 2^24`` (fp32 bits, mod 2^32) drops the sign,
  sends +-inf to 0 and NaN to [2, 2^24) and every finite ``|x|`` to ``2 * bits(|x|) + 2^24``
  (monotone), so ``max(kmax - 2^24, 0) >> 1`` are the bits of the finite amax (0.0 when no value
  is finite): one ``LEA`` + an unsigned max (``VIMNMX3``: two per instruction) per element for
  both directions, no branch, the value of ``max(_finite_abs(x))`` exactly;
* ``GATHER``: the 128 column amaxes are first spread one per thread (``tl.gather``), the scales
  and inverses divided there (2 divisions per thread instead of 32) and broadcast back.
Other options: ``STAGES`` (> 0: persistent programs, two per SM, walking tiles ``pid, pid + P,
...`` in a loop pipelined over ``STAGES`` -- cp.async into shared memory on NVIDIA, so the next
tile's read is in flight while this one is reduced and stored without holding registers),
``CS`` (streaming ``.cs`` stores, NVIDIA), ``EVL`` (``evict_first`` loads).
Scales and casts are those of v3 (``_scale_of``, ``x * scale`` -> fp8 with satfinite on NVIDIA,
``_cast2`` elsewhere), so every output is bitwise v3's (tests/pytorch/ops/
test_quantization_b128.py). Needs ``M % 4 == 0`` (the launcher keeps v3 otherwise).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from primus_turbo.triton.aot import AOT_TARGETS, AotSpec
from primus_turbo.triton.quantization.quant_common import aot_fp8, tile_signature
from primus_turbo.triton.quantization.quant_kernel import _scale_of
from primus_turbo.triton.quantization.quant_kernel_v2 import _cast2

B = tl.constexpr(128)  # the block: 1x128 (rows of q) and 128x1 (rows of q^T); the tile is B x B


@triton.jit
def _key_amax(k, AXIS: tl.constexpr):
    """Finite amax (fp32) from the keys ``k`` (see the module docstring) along ``AXIS``."""
    if AXIS is None:  # k: already the maxima
        km = k
    else:
        km = tl.max(k, axis=AXIS)
    return tl.where(km >= 0x01000000, (km - 0x01000000) >> 1, 0).to(tl.float32, bitcast=True)


@triton.jit
def _pack4(x0, x1, x2, x3, qty: tl.constexpr):
    """Scaled fp32 -> fp8 bytes of x0..x3 in one uint32, x0 lowest (NVIDIA inline PTX: the
    conversion Triton emits for ``.to(fp8)`` on sm_89+, with the same rounding/saturation)."""
    if qty == tl.float8e5:
        cvt: tl.constexpr = "cvt.rn.satfinite.e5m2x2.f32"
    else:
        cvt: tl.constexpr = "cvt.rn.satfinite.e4m3x2.f32"
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; " + cvt + " lo, $2, $1; " + cvt + " hi, $4, $3; "
        "mov.b32 $0, {lo, hi}; }",
        "=r,f,f,f,f", [x0, x1, x2, x3], dtype=tl.uint32, is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _pack2(x0, x1, qty: tl.constexpr):
    """``_pack4`` for two rows: one uint16, x0 in the low byte."""
    if qty == tl.float8e5:
        cvt: tl.constexpr = "cvt.rn.satfinite.e5m2x2.f32"
    else:
        cvt: tl.constexpr = "cvt.rn.satfinite.e4m3x2.f32"
    return tl.inline_asm_elementwise(cvt + " $0, $2, $1;", "=h,f,f", [x0, x1], dtype=tl.uint16,
                                     is_pure=True, pack=1)  # fmt: skip


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
def _b128_tile(
    t, grid_n, x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm, stride_qm, stride_qtn,
    stride_sm, stride_sn, stride_stm, stride_stn, FMAX: tl.constexpr, EMAX: tl.constexpr,
    FMT: tl.constexpr, SAT: tl.constexpr, EVEN: tl.constexpr, ASM: tl.constexpr,
    GATHER: tl.constexpr, CS: tl.constexpr, EVL: tl.constexpr, R: tl.constexpr,
):  # fmt: skip
    pid_m = t // grid_n
    pid_n = t - pid_m * grid_n
    A: tl.constexpr = B // R  # [A, B, R]: row R * a + b, column n
    rm = pid_m * B + tl.arange(0, A)[:, None, None] * R + tl.arange(0, R)[None, None, :]
    rn = pid_n * B + tl.arange(0, B)[None, :, None]
    rm64 = rm.to(tl.int64)
    policy: tl.constexpr = "evict_first" if EVL else ""
    if EVEN:
        xb = tl.load(x_ptr + rm64 * stride_xm + rn, eviction_policy=policy)
    else:
        xb = tl.load(x_ptr + rm64 * stride_xm + rn, mask=(rm < M) & (rn < N), other=0.0,
                     eviction_policy=policy)  # fmt: skip
    _b128_math(xb, pid_m, pid_n, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_qm, stride_qtn,
               stride_sm, stride_sn, stride_stm, stride_stn, FMAX, EMAX, FMT, SAT, EVEN, ASM,
               GATHER, CS, R)  # fmt: skip


@triton.jit
def _b128_math(
    xb, pid_m, pid_n, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_qm, stride_qtn, stride_sm,
    stride_sn, stride_stm, stride_stn, FMAX: tl.constexpr, EMAX: tl.constexpr,
    FMT: tl.constexpr, SAT: tl.constexpr, EVEN: tl.constexpr, ASM: tl.constexpr,
    GATHER: tl.constexpr, CS: tl.constexpr, R: tl.constexpr,
):  # fmt: skip
    """Both outputs and their scales of the loaded tile ``xb`` ([A, B, R], row ``R * a + b``)."""
    qty = q_ptr.dtype.element_ty
    A: tl.constexpr = B // R
    rm = pid_m * B + tl.arange(0, A)[:, None, None] * R + tl.arange(0, R)[None, None, :]
    rn = pid_n * B + tl.arange(0, B)[None, :, None]
    rm64 = rm.to(tl.int64)
    mask = (rm < M) & (rn < N)
    x = xb.to(tl.float32)
    k = x.to(tl.uint32, bitcast=True) * 2 + 0x01000000  # amax keys (module docstring)
    # rows: 1 x 128 blocks of q
    scale, sinv = _scale_of(_key_amax(k, 1), FMAX, False, EMAX)  # [A, R]
    _store(q_ptr + rm64 * stride_qm + rn, _cast2(x, scale[:, None, :], FMAX, qty, FMT, SAT), mask,
           EVEN, CS)  # fmt: skip
    r2 = pid_m * B + tl.arange(0, A)[:, None] * R + tl.arange(0, R)[None, :]
    tl.store(s_ptr + r2.to(tl.int64) * stride_sm + pid_n * stride_sn, sinv,
             mask=None if EVEN else r2 < M)  # fmt: skip
    # columns: 128 x 1 blocks, the rows of q^T
    kc = tl.max(tl.max(k, axis=2), axis=0)  # [B]
    cn = pid_n * B + tl.arange(0, B)
    if GATHER:  # one column per thread for the divisions, broadcast back by the multiply
        kc = tl.gather(kc, tl.arange(0, B), 0)
    sc, sinv_c = _scale_of(_key_amax(kc, None), FMAX, False, EMAX)
    tl.store(st_ptr + pid_m * stride_stm + cn * stride_stn, sinv_c,
             mask=None if EVEN else cn < N)  # fmt: skip
    xs = x * sc[None, :, None]
    if R == 4:
        wty: tl.constexpr = tl.uint32
    else:
        wty: tl.constexpr = tl.uint16
    if ASM and R == 4:
        e, o = tl.split(tl.reshape(xs, (A, B, 2, 2)))  # e: rows b = 0, 2; o: b = 1, 3
        x0, x2 = tl.split(e)
        x1, x3 = tl.split(o)
        w = _pack4(x0, x1, x2, x3, qty)
    elif ASM:
        x0, x1 = tl.split(xs)
        w = _pack2(x0, x1, qty)
    else:  # x * sc * 1.0 == x * sc: _cast2's clamp and conversion of the same value
        q8 = _cast2(xs, 1.0, FMAX, qty, FMT, SAT).to(tl.uint8, bitcast=True)
        w = tl.sum(q8.to(wty) << (tl.arange(0, R) * 8).to(wty)[None, None, :], axis=2)  # [A, B]
    ca = pid_m * A + tl.arange(0, A)
    qw = qt_ptr.to(tl.pointer_type(wty)) + cn.to(tl.int64)[:, None] * (stride_qtn // R)
    _store(qw + ca[None, :], tl.trans(w), (cn[:, None] < N) & (ca[None, :] * R < M), EVEN, CS)


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
    ASM: tl.constexpr = False,
    GATHER: tl.constexpr = False,
    STAGES: tl.constexpr = 0,
    CS: tl.constexpr = False,
    EVL: tl.constexpr = False,
    R: tl.constexpr = 4,
):
    """``x`` [M, N] (M % R == 0) -> ``q`` [M, N], ``s`` per (row, 128 columns), ``qt`` [N, M],
    ``st`` per (column, 128 rows); scale tensors addressed as in ``quant_tile_v2_kernel``
    (MODE=ROWS, DUAL). ``STAGES`` > 0: the grid's programs walk the tiles ``pid, pid + P, ...``
    in a loop software-pipelined over ``STAGES`` (NVIDIA: cp.async into shared memory)."""
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, B)
    if STAGES:
        ntiles = tl.cdiv(M, B) * grid_n
        for t in tl.range(pid, ntiles, tl.num_programs(0), num_stages=STAGES):
            _b128_tile(t, grid_n, x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm,
                       stride_qm, stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn, FMAX,
                       EMAX, FMT, SAT, EVEN, ASM, GATHER, CS, EVL, R)  # fmt: skip
    else:
        _b128_tile(pid, grid_n, x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm, stride_qm,
                   stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn, FMAX, EMAX, FMT,
                   SAT, EVEN, ASM, GATHER, CS, EVL, R)  # fmt: skip


# ---- variants (PRIMUS_TURBO_QUANT_B128=<name>) ---------------------------------------------
# name -> (warps, NVIDIA register cap, kernel constexprs); ASM wherever the satfinite
# conversion is (NVIDIA sm_89+)
_W4 = {"R": 4, "GATHER": False, "CS": False, "EVL": False, "STAGES": 0}
B128_VARIANTS = {
    "w8": (8, 128, _W4),
    "w8g": (8, 128, {**_W4, "GATHER": True}),
    "w8gc": (8, 128, {**_W4, "GATHER": True, "CS": True, "EVL": True}),
    "h8g": (8, 128, {**_W4, "R": 2, "GATHER": True}),
    "h16g": (16, 64, {**_W4, "R": 2, "GATHER": True}),
    "h16gc": (16, 64, {**_W4, "R": 2, "GATHER": True, "CS": True, "EVL": True}),
    "h16gp2": (16, 64, {**_W4, "R": 2, "GATHER": True, "STAGES": 2}),
    "h16gp2c": (16, 64, {**_W4, "R": 2, "GATHER": True, "STAGES": 2, "CS": True}),
}
# shapes that are not multiples of 128 (sm_90: the masked pipelined kernel spills 8 B at 64
# registers) and AMD (gfx942 / gfx950: 16 waves of 64 at 128 VGPRs spill 272 B) take another
# variant's plan
_MASKED_PLAN = {"h16gp2": "h16g", "h16gp2c": "h16gc"}


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
    ``cus``: SMs / CUs; ``s`` / ``st`` as quant_blockwise allocates them). False (nothing
    launched) when ``M % R != 0``: the caller keeps v3."""
    m, n = x.shape
    even = m % 128 == 0 and n % 128 == 0
    if not even or not (nvidia or fmt[0]):  # the pipelined plans: NVIDIA (and the interpreter)
        variant = _MASKED_PLAN.get(variant, variant)
    warps, nreg, cx = B128_VARIANTS[variant]
    if m % cx["R"]:
        return False
    if m == 0 or n == 0:
        return True
    grid = -(-m // 128) * -(-n // 128)
    if cx["STAGES"]:  # persistent: the programs resident at once (2 per SM / CU)
        grid = min(grid, 2 * cus)
    extra = {"maxnreg": nreg} if nvidia else {}
    quant_b128_kernel[(grid,)](
        x, u8(q), s, u8(qt), st, m, n, x.stride(0), q.stride(0), qt.stride(0),
        s.stride(0), s.stride(1), st.stride(1), st.stride(0),
        FMAX=fmax, EMAX=emax, FMT=fmt, SAT=sat, EVEN=even, ASM=sat,
        **{**cx, "CS": cx["CS"] and nvidia}, num_warps=warps, **extra,
    )  # fmt: skip
    return True


def aot_specs(target: str) -> list[AotSpec]:
    """Each variant, even and masked (``_MASKED_PLAN`` variants: even, sm_90 only); the register
    cap, ``ASM`` and ``CS`` on sm_90 only."""
    assert target in AOT_TARGETS, target
    fp8, fmax = aot_fp8(target)
    nv = target == "sm_90"
    specs = []
    for name, (warps, nreg, kcx) in B128_VARIANTS.items():
        if name in _MASKED_PLAN and not nv:
            continue
        for even in (True, False) if name not in _MASKED_PLAN else (True,):
            cx = {"FMAX": fmax, "EMAX": 8, "FMT": (0, 0, 0, 0), "SAT": nv, "EVEN": even,
                  "ASM": nv, **kcx, "CS": kcx["CS"] and nv}  # fmt: skip
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
