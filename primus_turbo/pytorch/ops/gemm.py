"""Dense GEMM with autograd: ``gemm(a, b, trans_a, trans_b, out_dtype)``."""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core.backend import BackendType
from primus_turbo.pytorch.core.checks import (
    check,
    check_dtype_arg,
    check_same_device,
    check_tensor,
    fail,
)
from primus_turbo.pytorch.kernels.gemm.gemm_impl import (
    FLOAT_DTYPES,
    GemmDispatcher,
    gemm_dims,
    gemm_impl,
)

__all__ = ["gemm"]

_OP = GemmDispatcher.family


class GemmFunction(torch.autograd.Function):
    """``C = op(a) @ op(b)``; dgrad and wgrad reuse the forward's backend."""

    @staticmethod
    def forward(ctx, a, b, trans_a, trans_b, out_dtype, backend_value, accum_main_grad):
        backend = BackendType(backend_value)
        ctx.save_for_backward(a, b)
        ctx.trans_a, ctx.trans_b, ctx.backend_value = trans_a, trans_b, backend_value
        ctx.accum_main_grad = accum_main_grad
        if accum_main_grad:
            b.grad_added_to_main_grad = True
        return gemm_impl(a, b, trans_a, trans_b, out_dtype, backend)

    @staticmethod
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        ta, tb, backend = ctx.trans_a, ctx.trans_b, BackendType(ctx.backend_value)
        g = grad_out.to(a.dtype)
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            if ta:  # a is [K, M]: d a = op(b) @ g^T
                grad_a = gemm_impl(b, g, tb, True, a.dtype, backend)
            else:  # d a = g @ op(b)^T
                grad_a = gemm_impl(g, b, False, not tb, a.dtype, backend)
        if ctx.needs_input_grad[1] or ctx.accum_main_grad:
            if tb:  # b is [N, K]: d b = g^T @ op(a)
                grad_b = gemm_impl(g, a, True, ta, b.dtype, backend)
            else:  # d b = op(a)^T @ g
                grad_b = gemm_impl(a, g, not ta, False, b.dtype, backend)
            if ctx.accum_main_grad:
                b.main_grad.add_(grad_b)
                grad_b = None
        return grad_a, grad_b, None, None, None, None, None


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    trans_a: bool = False,
    trans_b: bool = False,
    out_dtype: torch.dtype | None = None,
    fuse_bgrad_accum_pattern: str | None = None,
) -> torch.Tensor:
    """Dense GEMM ``op(a) @ op(b)`` with autograd.

    Args:
        a: ``[M, K]``, or ``[K, M]`` when ``trans_a``; fp16/bf16/fp32.
        b: ``[K, N]``, or ``[N, K]`` when ``trans_b``; same dtype and device as ``a``.
        trans_a, trans_b: use the transpose of the operand (no copy is made).
        out_dtype: output dtype, default ``a.dtype``; fp32 output from fp16/bf16 inputs is
            computed without an intermediate rounding.
        fuse_bgrad_accum_pattern: ``"megatron"`` accumulates b's gradient into ``b.main_grad``
            (which must exist, same shape) instead of returning it, and sets
            ``b.grad_added_to_main_grad``.
    Returns:
        ``[M, N]`` tensor of ``out_dtype``.

    The backend is chosen once per call (see ``GlobalBackendManager``) and reused by both
    backward GEMMs.
    """
    check_tensor(_OP, "a", a, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor(_OP, "b", b, ndim=2, dtypes=FLOAT_DTYPES)
    if a.dtype != b.dtype:
        fail(_OP, "b", f"dtype {a.dtype} (same as a)", b.dtype, TypeError)
    if a.device != b.device:
        check_same_device(_OP, a=a, b=b)
    m, n, k = gemm_dims(a, b, trans_a, trans_b)
    k_b = b.shape[1] if trans_b else b.shape[0]
    if k != k_b:
        fail(
            _OP,
            "b",
            f"a reduction size K={k} matching a (a: {tuple(a.shape)}, trans_a={trans_a})",
            f"shape {tuple(b.shape)} with trans_b={trans_b} (K={k_b})",
        )
    if out_dtype is None:
        out_dtype = a.dtype
    else:
        check_dtype_arg(_OP, "out_dtype", out_dtype, FLOAT_DTYPES)
    accum = fuse_bgrad_accum_pattern is not None
    if accum:
        check(
            fuse_bgrad_accum_pattern == "megatron",
            _OP,
            "fuse_bgrad_accum_pattern",
            "None or 'megatron'",
            repr(fuse_bgrad_accum_pattern),
        )
        main_grad = getattr(b, "main_grad", None)
        check(
            isinstance(main_grad, torch.Tensor) and main_grad.shape == b.shape,
            _OP,
            "b.main_grad",
            f"a tensor of shape {tuple(b.shape)} for fuse_bgrad_accum_pattern='megatron'",
            None if main_grad is None else tuple(main_grad.shape),
        )
    backend = GemmDispatcher.resolve(
        a=a, b=b, trans_a=trans_a, trans_b=trans_b, out_dtype=out_dtype
    )
    needs_grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    if not accum and (
        not needs_grad
        or (
            GemmDispatcher.backend_class(backend).differentiable
            and not torch.compiler.is_compiling()
        )
    ):  # no autograd node of ours needed: inference, or torch's autograd on the same backend
        return gemm_impl(a, b, trans_a, trans_b, out_dtype, backend)
    return GemmFunction.apply(a, b, trans_a, trans_b, out_dtype, backend.value, accum)
