"""Gated activations with autograd: ``swiglu``, ``geglu`` and their ``*_with_probs`` forms.

Convention (as in the reference system): ``x: [..., 2H]``, the first half of the last dim is the
gate, the second half the up projection; ``out = act(gate) * up [* probs]``, flattened to
``[T, H]``. Forward and backward are fused Triton kernels (one program per row, fp32 math,
no atomics: bitwise deterministic).
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core.checks import check, check_same_device, check_tensor
from primus_turbo.pytorch.kernels.activation.glu_impl import ACTS, glu_bwd_impl, glu_fwd_impl

__all__ = [
    "swiglu",
    "geglu",
    "swiglu_with_probs",
    "geglu_with_probs",
    "tokens_per_expert_to_mask",
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
