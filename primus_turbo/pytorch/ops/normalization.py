"""RMSNorm with autograd: ``rmsnorm(x, gamma, eps=1e-6, zero_centered=False)``."""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core.backend import BackendType
from primus_turbo.pytorch.core.checks import check, check_same_device, check_tensor, fail
from primus_turbo.pytorch.kernels.normalization.rmsnorm_impl import (
    FLOAT_DTYPES,
    RMSNormDispatcher,
    rmsnorm_bwd_impl,
    rmsnorm_fwd_impl,
)

__all__ = ["rmsnorm"]

_OP = RMSNormDispatcher.family


class RMSNormFunction(torch.autograd.Function):
    """``y = x * rstd * gamma`` on ``x [M, N]``; saves x, gamma and the fp32 ``rstd [M]``; the
    backward reuses the forward's backend."""

    @staticmethod
    def forward(ctx, x2, gamma, eps, zero_centered, backend_value):
        backend = BackendType(backend_value)
        y, rstd = rmsnorm_fwd_impl(x2, gamma, eps, zero_centered, backend)
        ctx.save_for_backward(x2, gamma, rstd)
        ctx.zero_centered, ctx.backend_value = zero_centered, backend_value
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, gamma, rstd = ctx.saved_tensors
        dx, dgamma = rmsnorm_bwd_impl(
            dy.to(x2.dtype).contiguous(),
            x2,
            gamma,
            rstd,
            ctx.zero_centered,
            BackendType(ctx.backend_value),
        )
        return (
            dx if ctx.needs_input_grad[0] else None,
            dgamma if ctx.needs_input_grad[1] else None,
            None,
            None,
            None,
        )


def rmsnorm(
    x: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-6, zero_centered: bool = False
) -> torch.Tensor:
    """RMSNorm over the last dim: ``x / sqrt(mean(x^2) + eps) * gamma`` (matches
    ``F.rms_norm``), fp32 accumulation, with autograd for x and gamma.

    Args:
        x: ``[..., N]``, fp16/bf16/fp32, any leading dims (zero rows allowed); a non-contiguous
            x is copied to a contiguous one first.
        gamma: ``[N]``, fp16/bf16/fp32, same device; its gradient has gamma's dtype.
        eps: added to the mean square, must be >= 0.
        zero_centered: scale by ``1 + gamma`` (computed in fp32) instead of ``gamma``.
    Returns:
        ``[..., N]`` tensor of ``x.dtype``.

    The backend is chosen once per call (env ``PRIMUS_TURBO_RMSNORM_BACKEND`` or
    ``GlobalBackendManager.set_backend("rmsnorm", ...)``) and reused by the backward.
    """
    check_tensor(_OP, "x", x, dtypes=FLOAT_DTYPES)
    check_tensor(_OP, "gamma", gamma, ndim=1, dtypes=FLOAT_DTYPES)
    check(x.dim() >= 1, _OP, "x", "a tensor with at least 1 dim", f"shape {tuple(x.shape)}")
    n = x.shape[-1]
    if gamma.shape[0] != n:
        fail(_OP, "gamma", f"shape ({n},) matching x's last dim", f"shape {tuple(gamma.shape)}")
    if x.device != gamma.device:
        check_same_device(_OP, x=x, gamma=gamma)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps < 0:
        fail(_OP, "eps", "a float >= 0", repr(eps))
    x2 = x.reshape(-1, n)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    g = gamma if gamma.is_contiguous() else gamma.contiguous()
    backend = RMSNormDispatcher.resolve(x=x2, gamma=g, eps=float(eps), zero_centered=zero_centered)
    if torch.is_grad_enabled() and (x.requires_grad or gamma.requires_grad):
        y = RMSNormFunction.apply(x2, g, float(eps), bool(zero_centered), backend.value)
    else:
        y = rmsnorm_fwd_impl(x2, g, float(eps), bool(zero_centered), backend)[0]
    return y.view(x.shape)
