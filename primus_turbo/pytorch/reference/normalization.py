"""RMSNorm reference: ``y = x / sqrt(mean(x^2, -1) + eps) * gamma`` over the last dim."""

from __future__ import annotations

import torch


def rmsnorm_ref(
    x: torch.Tensor,
    gamma: torch.Tensor,
    eps: float = 1e-6,
    zero_centered: bool = False,
    acc_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """RMSNorm computed in ``acc_dtype`` (fp32, or fp64 for test references).

    Args:
        x: ``[..., N]``.
        gamma: ``[N]``; the scale is ``1 + gamma`` (computed in ``acc_dtype``) when
            ``zero_centered``.
    Returns:
        ``[..., N]`` of ``x.dtype``. Differentiable (torch autograd) w.r.t. x and gamma.
    """
    xf = x.to(acc_dtype)
    w = gamma.to(acc_dtype)
    if zero_centered:
        w = w + 1.0
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * rstd * w).to(x.dtype)


def rmsnorm_fwd_ref(
    x: torch.Tensor, gamma: torch.Tensor, eps: float, zero_centered: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, N]`` -> ``(y [M, N] of x.dtype, rstd [M] fp32)`` (the saved-statistics form)."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1) + eps)
    w = gamma.float() + 1.0 if zero_centered else gamma.float()
    return (xf * rstd[:, None] * w).to(x.dtype), rstd


def rmsnorm_bwd_ref(
    dy: torch.Tensor,
    x: torch.Tensor,
    gamma: torch.Tensor,
    rstd: torch.Tensor,
    zero_centered: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Analytic gradients in fp32 from the saved ``rstd [M]``: ``(dx [M, N], dgamma [N])``."""
    xhat = x.float() * rstd[:, None]
    g = dy.float()
    w = gamma.float() + 1.0 if zero_centered else gamma.float()
    wdy = g * w
    n = max(x.shape[-1], 1)
    c = (xhat * wdy).sum(dim=-1, keepdim=True) / n
    dx = (wdy - xhat * c) * rstd[:, None]
    dgamma = (g * xhat).sum(dim=0)
    return dx.to(x.dtype), dgamma.to(gamma.dtype)
