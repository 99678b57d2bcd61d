"""Gated activations with autograd: ``swiglu``, ``geglu`` and their ``*_with_probs`` forms.

Convention (as in the reference system): ``x: [..., 2H]``, the first half of the last dim is the
gate, the second half the up projection; ``out = act(gate) * up [* probs]``, flattened to
``[T, H]``. Forward and backward are fused Triton kernels (one program per row, fp32 math,
no atomics: bitwise deterministic).
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core.checks import check, check_same_device, check_tensor
from primus_turbo.pytorch.core.low_precision import ScalingGranularity, is_fp8_dtype
from primus_turbo.pytorch.core.quantized_tensor import QuantizedTensor
from primus_turbo.pytorch.kernels.activation.glu_impl import ACTS, glu_bwd_impl, glu_fwd_impl

__all__ = [
    "swiglu",
    "geglu",
    "swiglu_with_probs",
    "geglu_with_probs",
    "tokens_per_expert_to_mask",
    "swiglu_with_probs_fp8",
    "geglu_with_probs_fp8",
]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class GluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, probs, row_mask, act):
        ctx.save_for_backward(x, probs, row_mask)
        ctx.act = act
        return glu_fwd_impl(x, probs, row_mask, act)

    @staticmethod
    def backward(ctx, dy):
        x, probs, row_mask = ctx.saved_tensors
        dx, dp = glu_bwd_impl(x, probs, row_mask, dy.contiguous(), ctx.act)
        return dx, (dp if probs is not None else None), None, None


def _glu(op: str, x, probs, row_mask, act: str) -> torch.Tensor:
    check_tensor(op, "x", x, dtypes=FLOAT_DTYPES)
    check(
        x.dim() >= 1 and x.shape[-1] % 2 == 0,
        op,
        "x",
        "a last dim of even size 2H",
        f"shape {tuple(x.shape)}",
    )
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    t = x2.shape[0]
    if probs is not None:
        check_tensor(op, "probs", probs, dtypes=(torch.float32,))
        check(
            probs.numel() == t,
            op,
            "probs",
            f"{t} elements (one per row of x)",
            f"shape {tuple(probs.shape)}",
        )
        check_same_device(op, x=x, probs=probs)
        probs = probs.reshape(t).contiguous()
    if row_mask is not None:
        check_tensor(op, "row_mask", row_mask, dtypes=(torch.int64, torch.int32, torch.bool))
        check(row_mask.numel() == t, op, "row_mask", f"{t} elements", tuple(row_mask.shape))
        check_same_device(op, x=x, row_mask=row_mask)
        row_mask = row_mask.reshape(t).to(torch.int64).contiguous()
    return GluFunction.apply(x2, probs, row_mask, ACTS.index(act))


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :H]) * x[..., H:]``: ``x [..., 2H]`` -> ``[T, H]``."""
    return _glu("swiglu", x, None, None, "silu")


def geglu(x: torch.Tensor) -> torch.Tensor:
    """``gelu(x[..., :H]) * x[..., H:]`` (erf GELU): ``x [..., 2H]`` -> ``[T, H]``."""
    return _glu("geglu", x, None, None, "gelu")


def swiglu_with_probs(
    x: torch.Tensor, probs: torch.Tensor, row_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``silu(gate) * up * probs[t]``.

    Args:
        x: ``[..., 2H]`` fp16/bf16/fp32, flattened to ``[T, 2H]``.
        probs: fp32 with ``T`` elements (per-token router weight); gets a gradient.
        row_mask: optional int ``[T]``; rows with 0 produce zeros and zero gradients.
    Returns:
        ``[T, H]`` in x's dtype.
    """
    return _glu("swiglu_with_probs", x, probs, row_mask, "silu")


def geglu_with_probs(
    x: torch.Tensor, probs: torch.Tensor, row_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``gelu(gate) * up * probs[t]``; see ``swiglu_with_probs``."""
    return _glu("geglu_with_probs", x, probs, row_mask, "gelu")


def tokens_per_expert_to_mask(tokens_per_expert: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """int64 ``[num_tokens]``: 1 for the first ``sum(tokens_per_expert)`` rows, else 0 (no sync)."""
    check_tensor("tokens_per_expert_to_mask", "tokens_per_expert", tokens_per_expert, ndim=1)
    total = tokens_per_expert.sum()
    idx = torch.arange(num_tokens, device=tokens_per_expert.device)
    return (idx < total).to(torch.int64)


# ---- fused activation + rowwise fp8 quantization ------------------------------------------------


def grad_sink(like: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A placeholder of ``shape`` in ``like``'s dtype that takes no memory (zero strides, one
    element): the ``source`` of a ``grad_only`` QuantizedTensor, whose gradient an autograd
    Function receives while the fp8 data is what the next GEMM reads."""
    return torch.empty_strided(shape, (0, 0), dtype=like.dtype, device=like.device)


class GluQuantFunction(torch.autograd.Function):
    """Forward: ``(sink [T, H], q [T, H] fp8, scale_inv [T])`` in one kernel; backward: the
    unfused GLU backward on the saved high-precision input (the sink's gradient is ``dy``)."""

    @staticmethod
    def forward(ctx, x, probs, act, dtype):
        from primus_turbo.pytorch.kernels.activation.glu_impl import _use_triton
        from primus_turbo.triton.activation.glu_kernel import QUANT_MAX_H

        ctx.save_for_backward(x, probs)
        ctx.act = act
        t, h = x.shape[0], x.shape[1] // 2
        if _use_triton(x) and h <= QUANT_MAX_H:
            from primus_turbo.triton.activation.glu_kernel import glu_fwd_quant_triton

            q, s = glu_fwd_quant_triton(x, probs, act, dtype)
        else:  # the unfused pair (same results): very long rows, or no Triton
            from primus_turbo.pytorch.ops.quantization import quantize_fp8

            q, s = quantize_fp8(glu_fwd_impl(x, probs, None, act), dtype,
                                ScalingGranularity.ROWWISE, axis=-1)  # fmt: skip
            s = s.reshape(t)
        ctx.mark_non_differentiable(q, s)
        return grad_sink(x, (t, h)), q, s

    @staticmethod
    def backward(ctx, dy, _dq, _ds):
        x, probs = ctx.saved_tensors
        if dy is None:
            return None, None, None, None
        dx, dp = glu_bwd_impl(x, probs, None, dy.contiguous(), ctx.act)
        return dx, (dp if probs is not None else None), None, None


def _glu_fp8(op: str, x, probs, dtype, act: str) -> QuantizedTensor:
    check(is_fp8_dtype(dtype), op, "dtype", "an fp8 dtype", dtype, TypeError)
    check_tensor(op, "x", x, dtypes=(torch.float16, torch.bfloat16))
    check(x.dim() >= 1 and x.shape[-1] % 2 == 0, op, "x", "a last dim of even size 2H",
          f"shape {tuple(x.shape)}")  # fmt: skip
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) != x2.shape[1]):
        x2 = x2.contiguous()
    t = x2.shape[0]
    if probs is not None:
        check_tensor(op, "probs", probs, dtypes=(torch.float32,))
        check(probs.numel() == t, op, "probs", f"{t} elements (one per row of x)",
              f"shape {tuple(probs.shape)}")  # fmt: skip
        check_same_device(op, x=x, probs=probs)
        probs = probs.reshape(t).contiguous()
    sink, q, s = GluQuantFunction.apply(x2, probs, ACTS.index(act), dtype)
    return QuantizedTensor(q, s.reshape(t, 1), x.dtype, ScalingGranularity.ROWWISE, 1,
                           source=sink, grad_only=True)  # fmt: skip


def swiglu_with_probs_fp8(
    x: torch.Tensor, probs: torch.Tensor | None, dtype: torch.dtype
) -> QuantizedTensor:
    """``swiglu_with_probs`` fused with the rowwise fp8 quantization of its output (one pass:
    per row the activation, rounded to x's dtype, its amax, scale and cast): bitwise equal to
    ``quantize_fp8(swiglu_with_probs(x, probs), dtype, ROWWISE, axis=-1)``. ``MoELayer``'s
    default ROWWISE fp8 path (``fp8_act="fused"``) runs it between the two expert GEMMs.

    Args:
        x: ``[..., 2H]`` fp16/bf16, flattened to ``[T, 2H]``.
        probs: fp32 with ``T`` elements, or None (plain SwiGLU).
        dtype: the fp8 dtype (e.g. ``fp8_dtype_for_format(config.format, device)``).
    Returns:
        A ROWWISE ``QuantizedTensor`` ``[T, H]`` (``scale_inv [T, 1]``) for
        ``grouped_gemm_fp8``'s ``a``; its ``source`` is a zero-memory gradient sink
        (``grad_only``): gradients reach ``x`` and ``probs`` through the unfused backward on the
        saved ``x``; the GEMM's weight gradient uses the dequantized fp8 values.
    """
    return _glu_fp8("swiglu_with_probs_fp8", x, probs, dtype, "silu")


def geglu_with_probs_fp8(
    x: torch.Tensor, probs: torch.Tensor | None, dtype: torch.dtype
) -> QuantizedTensor:
    """``geglu_with_probs`` fused with rowwise fp8 quantization; see ``swiglu_with_probs_fp8``."""
    return _glu_fp8("geglu_with_probs_fp8", x, probs, dtype, "gelu")
