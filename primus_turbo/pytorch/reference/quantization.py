"""Reference (pure torch, fp32) quantization: the math every kernel is tested against.

Dynamic scaling: ``scale = fmax / max(amax, 1e-12)``, ``q = clamp(x * scale, -fmax, fmax)``,
``scale_inv = 1 / scale`` (fp32); ``dequant = q.float() * scale_inv``.

Defined behaviour for special inputs (kernels match it):
* all-zero block: amax is taken as 1e-12, so ``q == 0`` and ``scale_inv`` is finite (tiny).
* all-equal block ``c``: every value maps to ``+-fmax`` exactly, dequantizes to ``c`` (to fp32
  rounding of the scale).
* ``+-inf``: excluded from amax (amax is over finite values), then clamped to ``+-fmax``.
* ``NaN``: excluded from amax, stays NaN in ``q`` (the other values of its block are unaffected).

Blocks that run past the tensor edge (shapes not a multiple of the block) take the amax of their
valid part: no error, no padding in the output; scale tensors have ``ceil(dim / block)`` entries.

MX (E8M0 scales, blocks of 32 along the last dim): ``scale_inv = 2**(floor(log2(amax)) - emax)``
with ``emax`` the element format's largest exponent (8 for e4m3, 15 for e5m2, 2 for e2m1);
stored as the biased byte ``exponent + 127`` (uint8). Values are clamped to ``+-fmax``.
"""

from __future__ import annotations

import torch

AMAX_EPS = 1e-12
E2M1_MAX = 6.0
_EMAX = {"e4m3": 8, "e5m2": 15, "e2m1": 2}


def finite_abs(x: torch.Tensor) -> torch.Tensor:
    """``|x|`` with NaN and inf replaced by 0 (what amax sees)."""
    a = x.float().abs()
    return torch.where(torch.isfinite(a), a, torch.zeros_like(a))


def _fmax(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def _cast(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    fmax = _fmax(dtype)
    y = x.float() * scale
    return torch.where(torch.isnan(y), y, y.clamp(-fmax, fmax)).to(dtype)


def _scale_from_amax(amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _fmax(dtype) / amax.clamp_min(AMAX_EPS)


def quantize_tensorwise_ref(x: torch.Tensor, dtype: torch.dtype):
    scale = _scale_from_amax(finite_abs(x).amax(), dtype)
    return _cast(x, scale, dtype), (1.0 / scale).float()


def quantize_rowwise_ref(x: torch.Tensor, dtype: torch.dtype, axis: int):
    """One scale per slice along ``axis`` (keepdim): axis=-1 -> ``[M, 1]``, axis=0 -> ``[1, N]``."""
    scale = _scale_from_amax(finite_abs(x).amax(dim=axis, keepdim=True), dtype)
    return _cast(x, scale, dtype), (1.0 / scale).float()


def _block_amax(x: torch.Tensor, bm: int, bn: int) -> torch.Tensor:
    """amax over ``bm x bn`` tiles of a 2-D tensor (edge tiles use their valid part)."""
    m, n = x.shape
    mb, nb = -(-m // bm), -(-n // bn)
    a = torch.zeros(mb * bm, nb * bn, dtype=torch.float32, device=x.device)
    a[:m, :n] = finite_abs(x)
    return a.view(mb, bm, nb, bn).amax(dim=(1, 3))


def _expand(s: torch.Tensor, bm: int, bn: int, m: int, n: int) -> torch.Tensor:
    return s.repeat_interleave(bm, 0).repeat_interleave(bn, 1)[:m, :n]


def quantize_blockwise_ref(x: torch.Tensor, dtype: torch.dtype, block: int, axis: int | None):
    """``axis=-1/1``: 1 x block blocks, scale ``[M, ceil(N/b)]``; ``axis=0``: block x 1 blocks,
    scale ``[ceil(M/b), N]``; ``axis=None``: block x block tiles, scale
    ``[ceil(M/b), ceil(N/b)]``."""
    m, n = x.shape
    bm, bn = {None: (block, block), 0: (block, 1), 1: (1, block), -1: (1, block)}[axis]
    scale = _scale_from_amax(_block_amax(x, bm, bn), dtype)
    q = _cast(x, _expand(scale, bm, bn, m, n), dtype)
    return q, (1.0 / scale).float()


def dequantize_blockwise_ref(q, scale_inv, block: int, axis: int | None, out_dtype):
    m, n = q.shape
    bm, bn = {None: (block, block), 0: (block, 1), 1: (1, block), -1: (1, block)}[axis]
    return (q.float() * _expand(scale_inv.float(), bm, bn, m, n)).to(out_dtype)


def mx_scale_exponent(amax: torch.Tensor, emax: int) -> torch.Tensor:
    """Unbiased shared exponent ``floor(log2(amax)) - emax`` in [-127, 127] (int32)."""
    e = torch.floor(torch.log2(amax.clamp_min(2.0**-127))).to(torch.int32) - emax
    return e.clamp(-127, 127)


def quantize_mx_ref(x: torch.Tensor, dtype: torch.dtype, block: int = 32):
    """MXFP8 along the last dim: ``(q [M, N], scale_e8m0 [M, N/32] uint8)``."""
    m, n = x.shape
    amax = finite_abs(x).view(m, n // block, block).amax(dim=-1)
    emax = _EMAX["e5m2" if dtype in (torch.float8_e5m2, torch.float8_e5m2fnuz) else "e4m3"]
    e = mx_scale_exponent(amax, emax)
    scale = torch.exp2(-e.float()).repeat_interleave(block, 1)
    return _cast(x, scale, dtype), (e + 127).to(torch.uint8)


def e8m0_to_float(s: torch.Tensor) -> torch.Tensor:
    return torch.exp2(s.to(torch.int32).float() - 127)


def dequantize_mx_ref(q: torch.Tensor, scale_e8m0: torch.Tensor, out_dtype, block: int = 32):
    return (q.float() * e8m0_to_float(scale_e8m0).repeat_interleave(block, 1)).to(out_dtype)


# ---- FP4 (E2M1, two per byte: element 2i in the low nibble, 2i+1 in the high nibble) -------

_E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """fp32 values (already clamped to +-6) -> 4-bit codes, round to nearest, ties to even code."""
    mag = v.abs()
    vals = _E2M1_VALUES.to(v.device)
    # midpoints between neighbours; a value on a midpoint lands on the upper code (right=True)
    # and moves down when that code is odd: ties go to the even code (even mantissa bit)
    mids = (vals[1:] + vals[:-1]) / 2
    idx = torch.bucketize(mag, mids, right=True)
    tie = (idx > 0) & (mag == mids[(idx - 1).clamp_min(0)]) & (idx % 2 == 1)
    idx = torch.where(tie, idx - 1, idx)
    sign = (v < 0) & (idx > 0)
    return (idx | (sign.to(torch.int64) << 3)).to(torch.uint8)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    vals = _E2M1_VALUES.to(code.device)
    mag = vals[(code & 7).long()]
    return torch.where((code & 8) != 0, -mag, mag)


def quantize_mxfp4_ref(x: torch.Tensor, block: int = 32):
    """MXFP4 along the last dim: ``(packed uint8 [M, N/2], scale_e8m0 uint8 [M, N/32])``."""
    m, n = x.shape
    amax = finite_abs(x).view(m, n // block, block).amax(dim=-1)
    e = mx_scale_exponent(amax, _EMAX["e2m1"])
    y = x.float() * torch.exp2(-e.float()).repeat_interleave(block, 1)
    y = torch.where(torch.isnan(y), torch.zeros_like(y), y.clamp(-E2M1_MAX, E2M1_MAX))
    codes = e2m1_encode(y)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, (e + 127).to(torch.uint8)


def dequantize_mxfp4_ref(packed: torch.Tensor, scale_e8m0: torch.Tensor, out_dtype, block=32):
    lo, hi = e2m1_decode(packed & 15), e2m1_decode(packed >> 4)
    vals = torch.stack((lo, hi), dim=-1).flatten(-2)
    return (vals * e8m0_to_float(scale_e8m0).repeat_interleave(block, 1)).to(out_dtype)
