"""Gated-activation references (fp32 math): ``act(gate) * up [* probs]``."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def glu_ref(
    x: torch.Tensor,
    probs: torch.Tensor | None = None,
    row_mask: torch.Tensor | None = None,
    act: str = "silu",
) -> torch.Tensor:
    """``x: [..., 2H]`` -> ``[T, H]`` (x flattened to 2-D), computed in fp32, cast to x's dtype.

    The first half of the last dim is the gate, the second half the up projection. ``probs``
    (``T`` elements) scales each row; rows with ``row_mask == 0`` are zero.
    """
    x2 = x.reshape(-1, x.shape[-1]).float()
    h = x2.shape[-1] // 2
    gate, up = x2[:, :h], x2[:, h:]
    a = F.silu(gate) if act == "silu" else F.gelu(gate)
    y = a * up
    if probs is not None:
        y = y * probs.reshape(-1, 1).float()
    if row_mask is not None:
        y = y * (row_mask.reshape(-1, 1) != 0)
    return y.to(x.dtype)


def swiglu_ref(x, probs=None, row_mask=None):
    return glu_ref(x, probs, row_mask, "silu")


def geglu_ref(x, probs=None, row_mask=None):
    return glu_ref(x, probs, row_mask, "gelu")


def glu_bwd_ref(
    x: torch.Tensor,
    probs: torch.Tensor | None,
    row_mask: torch.Tensor | None,
    dy: torch.Tensor,
    act: str = "silu",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Closed-form backward of ``glu_ref`` in fp32 (usable where autograd is off, e.g. inside
    a custom op): ``(dx [T, 2H] in x's dtype, dprobs [T] fp32 or None)``."""
    x2 = x.reshape(-1, x.shape[-1]).float()
    h = x2.shape[-1] // 2
    g, u = x2[:, :h], x2[:, h:]
    d = dy.reshape(-1, h).float()
    if row_mask is not None:
        d = d * (row_mask.reshape(-1, 1) != 0)
    if act == "silu":
        s = torch.sigmoid(g)
        a, da = g * s, s * (1 + g * (1 - s))
    else:
        cdf = 0.5 * (1 + torch.erf(g * 0.7071067811865476))
        a, da = g * cdf, cdf + g * torch.exp(-0.5 * g * g) * 0.3989422804014327
    p = probs.reshape(-1, 1).float() if probs is not None else 1.0
    dx = torch.cat([d * u * p * da, d * a * p], dim=1).to(x.dtype)
    dp = (d * a * u).sum(1) if probs is not None else None
    return dx, dp
