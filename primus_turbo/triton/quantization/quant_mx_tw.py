"""MX dual quantization on the skeleton of the tensorwise dual cast pass (session 7, opt-in).

``mx_tw_kernel``: ``x`` [M, N] bf16 -> ``q`` [M, N] with E8M0 scales ``s`` [M, N/32] (one per
row and 32 columns) and ``qt`` [N, M] with ``st`` [N, M/32] (one per column and 32 rows),
bitwise what ``quant_words_kernel`` gives. The structure is ``tw_quant_kernel``'s cast pass
(quant_tensorwise.py, PHASE=2 DUAL=True: the fastest dual-output kernel on the H200, ncu 34.8
us at 8192x4096 vs 41.3 us for the MX dual word kernel): ``BM x BN`` tiles loaded as bf16,
32 warps per SM at 64 registers (the word kernel: 16 at 96), optionally persistent
(``PERSIST``: a 1-D grid walking the tiles ``pid, pid + P, ...``); both outputs stored
row-contiguous.

Per tile:
* row path: amax keys of the bf16 bits (``(b << 17) + 2^24`` as uint32, the word kernel's
  ``lo`` key: monotone in ``|x|`` for finite values, inf/NaN below every finite value), the
  max over each row's 32-column groups, E8M0 scales (``quant_words._scales``), the fp32
  products converted (``quant_words._conv``) and stored;
* column path: the bf16 tile transposed (``tl.trans``: 2-byte elements through shared memory),
  the column keys and maxima computed on the TRANSPOSED tile (so the layout conversion cannot
  sink to the fp8 values, which would make it a byte-wise shared-memory round trip), scaled,
  converted and stored as rows of ``qt``.
Both paths use the same ops on the same fp32 values as the word kernel (bf16 -> fp32 exact,
times a power of two, the same conversion): the same bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from primus_turbo.triton.aot import AOT_TARGETS, AotSpec
from primus_turbo.triton.quantization.quant_common import aot_fp8
from primus_turbo.triton.quantization.quant_words import _conv, _scales


@triton.jit
def _keys16(x):
    """uint32 amax keys of a bf16 tensor (``quant_words._keys``' ``lo`` key)."""
    b = x.to(tl.uint16, bitcast=True).to(tl.uint32)
    return (b << 17) + 16777216


@triton.jit
def _f32(x):
    """fp32 values of a bf16 tensor from its bits (exact, subnormals included, as
    ``quant_words._unpack``; the interpreter's bf16 -> fp32 cast flushes subnormals)."""
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _block_out(x, C: tl.constexpr, FMAX: tl.constexpr, EMAX: tl.constexpr, FMT: tl.constexpr,
               SAT: tl.constexpr, dtype):  # fmt: skip
    """``x`` [A, B] bf16 quantized along its last axis in blocks of ``C``: (fp8 [A, B],
    E8M0 bytes [A, B / C])."""
    A: tl.constexpr = x.shape[0]
    B: tl.constexpr = x.shape[1]
    kmax = tl.max(tl.reshape(_keys16(x), (A, B // C, C)), axis=2)
    scale, eb = _scales(kmax, EMAX)
    y = tl.reshape(_f32(x), (A, B // C, C)) * scale[:, :, None]
    return _conv(tl.reshape(y, (A, B)), FMAX, dtype, FMT, SAT), eb


@triton.jit
def _block_out_t(x, C: tl.constexpr, FMAX: tl.constexpr, EMAX: tl.constexpr, FMT: tl.constexpr,
                 SAT: tl.constexpr, dtype):  # fmt: skip
    """``_block_out(tl.trans(x))``, with the transposed bf16 tile split into its even and odd
    columns (``tl.split`` needs the pair in one thread: the layout conversion of the
    transposition happens on the bf16 values, before the split)."""
    A: tl.constexpr = x.shape[1]
    B: tl.constexpr = x.shape[0]
    ev, od = tl.split(tl.reshape(tl.trans(x), (A, B // 2, 2)))
    k = tl.maximum(_keys16(ev), _keys16(od))
    kmax = tl.max(tl.reshape(k, (A, B // C, C // 2)), axis=2)
    scale, eb = _scales(kmax, EMAX)
    ye = tl.reshape(tl.reshape(_f32(ev), (A, B // C, C // 2)) * scale[:, :, None],
                    (A, B // 2))  # fmt: skip
    yo = tl.reshape(tl.reshape(_f32(od), (A, B // C, C // 2)) * scale[:, :, None],
                    (A, B // 2))  # fmt: skip
    y = tl.reshape(tl.join(ye, yo), (A, B))
    return _conv(y, FMAX, dtype, FMT, SAT), eb


@triton.jit
def _st2(ptrs, v, mask, EVEN: tl.constexpr):
    if EVEN:
        tl.store(ptrs, v)
    else:
        tl.store(ptrs, v, mask=mask)


@triton.jit
def _tile(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, pid_m, pid_n, M, N, stride_xm, stride_qm,
          stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn, BM: tl.constexpr,
          BN: tl.constexpr, FMAX: tl.constexpr, EMAX: tl.constexpr, FMT: tl.constexpr,
          SAT: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """Quantize tile ``(pid_m, pid_n)`` and store its four outputs."""
    C: tl.constexpr = 32
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rm64 = rm.to(tl.int64)
    rn64 = rn.to(tl.int64)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if EVEN:
        x = tl.load(x_ptr + (rm64[:, None] * stride_xm + rn64[None, :]))
    else:
        x = tl.load(x_ptr + (rm64[:, None] * stride_xm + rn64[None, :]), mask=mask, other=0.0)
    # rows: q [BM, BN], s [BM, BN / 32]
    q, eb = _block_out(x, C, FMAX, EMAX, FMT, SAT, q_ptr.dtype.element_ty)
    _st2(q_ptr + (rm64[:, None] * stride_qm + rn64[None, :]), q, mask, EVEN)
    g = pid_n * (BN // C) + tl.arange(0, BN // C)
    _st2(s_ptr + (rm64[:, None] * stride_sm + g[None, :] * stride_sn),
         eb.to(s_ptr.dtype.element_ty), (rm[:, None] < M) & (g[None, :] * C < N), EVEN)  # fmt: skip
    # columns: the bf16 tile transposed, then blocked along its rows: qt [BN, BM], st [BN, BM / 32]
    qt, ebt = _block_out_t(x, C, FMAX, EMAX, FMT, SAT, qt_ptr.dtype.element_ty)
    _st2(qt_ptr + (rn64[:, None] * stride_qtn + rm64[None, :]), qt, tl.trans(mask), EVEN)
    mb = pid_m * (BM // C) + tl.arange(0, BM // C)
    smask = (rn[:, None] < N) & (mb[None, :] * C < M)
    _st2(st_ptr + (rn64[:, None] * stride_stn + mb[None, :] * stride_stm),
         ebt.to(st_ptr.dtype.element_ty), smask, EVEN)  # fmt: skip


@triton.jit
def mx_tw_kernel(
    x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, N, stride_xm, stride_qm, stride_qtn, stride_sm,
    stride_sn, stride_stm, stride_stn, BM: tl.constexpr, BN: tl.constexpr, FMAX: tl.constexpr,
    EMAX: tl.constexpr = 8, FMT: tl.constexpr = (0, 0, 0, 0), SAT: tl.constexpr = False,
    EVEN: tl.constexpr = False, PERSIST: tl.constexpr = False,
):  # fmt: skip
    """See the module docstring. ``PERSIST``: a 1-D grid of ``P`` programs, program ``p``
    quantizing tiles ``p, p + P, ...`` (row-major over the tile grid); otherwise a 2-D grid
    ``(tiles along N, tiles along M)``, one tile per program. ``EVEN``: every tile full."""
    if PERSIST:
        grid_n = tl.cdiv(N, BN)
        ntiles = tl.cdiv(M, BM) * grid_n
        for t in range(tl.program_id(0), ntiles, tl.num_programs(0)):
            pid_m = t // grid_n
            _tile(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, pid_m, t - pid_m * grid_n, M, N,
                  stride_xm, stride_qm, stride_qtn, stride_sm, stride_sn, stride_stm,
                  stride_stn, BM, BN, FMAX, EMAX, FMT, SAT, EVEN)  # fmt: skip
    else:
        _tile(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, tl.program_id(1), tl.program_id(0), M, N,
              stride_xm, stride_qm, stride_qtn, stride_sm, stride_sn, stride_stm, stride_stn,
              BM, BN, FMAX, EMAX, FMT, SAT, EVEN)  # fmt: skip


# ---- ahead-of-time check -------------------------------------------------------------------

MX_TW_TILE = (128, 128)  # the tensorwise dual cast pass's tile on NVIDIA
# 16 warps x 2 programs per SM (32 warps per SM, as the tw cast pass's 8 x 4): the NVIDIA
# register cap 65536 / (programs x threads) = 64, no spill on sm_90; 8 warps x 4 programs
# (the tw cast pass's shape) spills 180-230 B at 64 registers (none at 96): A/B only
# (PRIMUS_TURBO_QUANT_WARPS_MX_TW=8 PRIMUS_TURBO_QUANT_MXDUAL_PER_SM=4), not in the AOT specs
MX_TW_WARPS = 16
MX_TW_PER_SM = 2

# (name, BM, BN, PERSIST, even, warps, programs per SM); cap 64 registers each
_AOT = [("p", 128, 128, True, True, 16, 2), ("p", 128, 128, True, False, 16, 2),
        ("", 128, 128, False, True, 16, 2), ("", 128, 128, False, False, 16, 2),
        ("p_64x128", 64, 128, True, True, 8, 4), ("p_64x128", 64, 128, True, False, 8, 4),
        ("64x128", 64, 128, False, True, 8, 4)]  # fmt: skip


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 input, the target's e4m3 output; MX only (gfx950 / sm_90)."""
    assert target in AOT_TARGETS, target
    if target == "gfx942":  # no MX recipes on gfx942
        return []
    fp8, fmax = aot_fp8(target)
    nvidia = target == "sm_90"
    sig = {"x_ptr": "*bf16", "q_ptr": f"*{fp8}", "s_ptr": "*u8", "qt_ptr": f"*{fp8}",
           "st_ptr": "*u8", "M": "i32:16", "N": "i32:16", "stride_xm": "i32:16",
           "stride_qm": "i32:16", "stride_qtn": "i32:16", "stride_sm": "i32", "stride_sn": "i32",
           "stride_stm": "i32", "stride_stn": "i32"}  # fmt: skip
    specs = []
    for name, bm, bn, persist, even, warps, per_sm in _AOT:
        cx = {"BM": bm, "BN": bn, "FMAX": fmax, "EMAX": 8, "FMT": (0, 0, 0, 0), "SAT": nvidia,
              "EVEN": even, "PERSIST": persist}  # fmt: skip
        opts = {"num_warps": warps}
        if nvidia:
            opts["maxnreg"] = 65536 // (per_sm * warps * 32)
        tag = f"quant_mx_tw{('_' + name) if name else ''}{'_even' if even else ''}_{fp8}"
        specs.append(AotSpec(tag, mx_tw_kernel, sig, cx, opts))
    return specs
