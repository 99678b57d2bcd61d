"""FP8 / FP4 quantization ops: ``quantize_fp8``, ``quantize_fp8_with_trans``, ``dequantize_fp8``,
``quantize_fp4``, ``dequantize_fp4``.

Conventions (see reference/quantization.py for the math and the special-value rules):
* ``scale_inv`` is what dequantization multiplies by (fp32; uint8 E8M0 for MX).
* TENSORWISE: 0-d scale. ROWWISE (``axis`` required): ``[M, 1]`` (axis=-1/1) or ``[1, N]``
  (axis=0). BLOCKWISE (``block_size`` required): ``scaling_recipe.use_2d_block`` gives
  ``block x block`` tiles (scale ``[ceil(M/b), ceil(N/b)]``), else 1-D blocks along ``axis``
  (axis=-1/1: ``[M, ceil(N/b)]``, stored outer-dim-major; axis=0: ``[ceil(M/b), N]``).
  MX_BLOCKWISE: blocks of 32 along ``axis`` (default -1; axis=0 quantizes ``x.T``
  and returns its data and scales), needs that dim to be a multiple of 32; the GPU kernels store
  the E8M0 scales ``[M, N/32]`` outer-dim-major too (stride ``(1, M)``; the TORCH reference:
  contiguous). Consumers index them through their strides.
* Shapes not a multiple of the block are handled (edge blocks use their valid part); MX and
  FP4 need the blocked dim to be a multiple of 32 and raise otherwise.
* ``*_with_trans`` returns ``(q, s, q_t, s_t)``: ``x`` and ``x.T`` quantized in one pass,
  ``q_t`` contiguous ``[N, M]`` (the K-major copy the backward GEMMs read).
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core.checks import check, check_tensor, fail
from primus_turbo.pytorch.core.low_precision import (
    DEFAULT_BLOCK_SIZE,
    MX_BLOCK_SIZE,
    ScalingGranularity,
    ScalingRecipe,
    is_fp8_dtype,
)
from primus_turbo.pytorch.core.platform import triton_interpret
from primus_turbo.pytorch.kernels.quantization.quant_impl import quantize_impl
from primus_turbo.pytorch.reference import quantization as ref

__all__ = [
    "dequantize_fp4",
    "dequantize_fp8",
    "quantize_fp4",
    "quantize_fp8",
    "quantize_fp8_with_trans",
]

_FLOAT = (torch.float16, torch.bfloat16, torch.float32)
_KIND = {
    ScalingGranularity.TENSORWISE: "tensor",
    ScalingGranularity.ROWWISE: "row",
    ScalingGranularity.BLOCKWISE: "block",
    ScalingGranularity.MX_BLOCKWISE: "mx",
}


def _args(op, x, out_dtype, granularity, block_size, axis, recipe, dual):
    check_tensor(op, "x", x, ndim=2, dtypes=_FLOAT)
    if not is_fp8_dtype(out_dtype):
        fail(op, "out_dtype", "an fp8 dtype", out_dtype, TypeError)
    if not isinstance(granularity, ScalingGranularity):
        fail(op, "granularity", "a ScalingGranularity", repr(granularity), TypeError)
    recipe = recipe or ScalingRecipe()
    for flag in ("use_sr", "use_rht", "shuffle_scale", "shuffle_out"):
        check(not getattr(recipe, flag), op, "scaling_recipe", f"{flag}=False", recipe)
    g = granularity
    if g == ScalingGranularity.TENSORWISE:
        return "tensor", 0, None
    if g == ScalingGranularity.ROWWISE:
        if dual:
            return "row", 0, -1
        check(axis in (-1, 0, 1), op, "axis", "-1, 0 or 1 for ROWWISE", axis)
        return "row", 0, axis
    if g == ScalingGranularity.BLOCKWISE:
        b = block_size if block_size is not None else (DEFAULT_BLOCK_SIZE if dual else None)
        check(isinstance(b, int) and b > 0, op, "block_size", "a positive int", block_size)
        check(b in (32, 64, 128, 256), op, "block_size", "32, 64, 128 or 256", b)
        if recipe.use_2d_block:
            return "block", b, None
        if dual:
            return "block", b, -1
        check(axis in (-1, 0, 1), op, "axis", "-1, 0 or 1 (or use_2d_block)", axis)
        return "block", b, axis
    b = MX_BLOCK_SIZE if block_size is None else block_size
    check(b == MX_BLOCK_SIZE, op, "block_size", f"{MX_BLOCK_SIZE} for MX_BLOCKWISE", b)
    axis = -1 if axis is None else axis
    check(axis in (-1, 0, 1), op, "axis", "-1, 0 or 1 (or None) for MX_BLOCKWISE", axis)
    return "mx", b, axis


def _mx_input(op, x, axis, dual):
    if dual:
        dims = x.shape
    else:
        dims = (x.shape[-1 if axis in (-1, 1) else 0],)
    check(
        all(d % MX_BLOCK_SIZE == 0 for d in dims),
        op, "x", f"blocked dims multiple of {MX_BLOCK_SIZE} for MX", f"shape {tuple(x.shape)}",
    )  # fmt: skip
    return x if axis in (-1, 1) else x.t()


def quantize_fp8(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    *,
    block_size: int | None = None,
    axis: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
):
    """``(q, scale_inv)``; see the module docstring for shapes. Dynamic scaling."""
    op = "quantize_fp8"
    kind, block, axis = _args(op, x, out_dtype, granularity, block_size, axis, scaling_recipe, 0)
    if kind == "mx":
        x = _mx_input(op, x, axis, False)
        axis = -1
    return quantize_impl(x, out_dtype, kind, block, axis, False)


def quantize_fp8_with_trans(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    *,
    block_size: int | None = None,
    scaling_recipe: ScalingRecipe | None = None,
    scaling_recipe_for_trans: ScalingRecipe | None = None,
):
    """``(q, s, q_t, s_t)``: ``x`` along its last dim and ``x.T`` along its last dim (= x's
    columns), fused in one pass for every granularity except ROWWISE (two passes). BLOCKWISE
    1x128 of bf16 inputs on NVIDIA runs the CUDA cast-transpose (bitwise the Triton kernel;
    ``PRIMUS_TURBO_QUANT_CUDA=0`` forces Triton, see kernels/quantization/quant_cuda.py)."""
    op = "quantize_fp8_with_trans"
    if scaling_recipe_for_trans is not None and scaling_recipe_for_trans != scaling_recipe:
        fail(op, "scaling_recipe_for_trans", "None or equal to scaling_recipe", "a different one")
    kind, block, axis = _args(op, x, out_dtype, granularity, block_size, -1, scaling_recipe, 1)
    if kind == "mx":
        _mx_input(op, x, -1, True)
    return quantize_impl(x, out_dtype, kind, block, axis, True)


def dequantize_fp8(
    x: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: ScalingGranularity,
    *,
    block_size: int | None = None,
    axis: int | None = None,
    scale_inv: torch.Tensor,
    scaling_recipe: ScalingRecipe | None = None,
):
    """Inverse of :func:`quantize_fp8` (same arguments); torch ops, fp32 math."""
    op = "dequantize_fp8"
    check_tensor(op, "x", x, ndim=2)
    if not is_fp8_dtype(x.dtype):
        fail(op, "x", "an fp8 tensor", x.dtype, TypeError)
    g = granularity
    if g in (ScalingGranularity.TENSORWISE, ScalingGranularity.ROWWISE):
        return (x.float() * scale_inv.float()).to(out_dtype)
    if g == ScalingGranularity.BLOCKWISE:
        recipe = scaling_recipe or ScalingRecipe()
        b = block_size or DEFAULT_BLOCK_SIZE
        ax = None if recipe.use_2d_block else (-1 if axis is None else axis)
        return ref.dequantize_blockwise_ref(x, scale_inv, b, ax, out_dtype)
    if axis == 0:
        return ref.dequantize_mx_ref(x, scale_inv, out_dtype).t()
    return ref.dequantize_mx_ref(x, scale_inv, out_dtype)


def quantize_fp4(x: torch.Tensor, *, axis: int = -1):
    """MXFP4 along ``axis``: ``(packed uint8 [M, N/2], scale_e8m0 uint8 [M, N/32])``; axis=0
    quantizes ``x.T``. E2M1 has no NaN or inf: NaN becomes 0, +-inf clamps to +-6 * scale."""
    op = "quantize_fp4"
    check_tensor(op, "x", x, ndim=2, dtypes=_FLOAT)
    x = _mx_input(op, x, axis, False)
    if x.device.type == "cuda" or triton_interpret():
        from primus_turbo.triton.quantization.quant_launch import quant_mxfp4

        return quant_mxfp4(x)
    return ref.quantize_mxfp4_ref(x)


def dequantize_fp4(packed: torch.Tensor, scale_inv: torch.Tensor, out_dtype: torch.dtype):
    check_tensor("dequantize_fp4", "packed", packed, ndim=2, dtypes=(torch.uint8,))
    return ref.dequantize_mxfp4_ref(packed, scale_inv, out_dtype)
