"""Grouped GEMM for MoE experts with autograd: ``grouped_gemm(a, b, group_lens, ...)``.

Validation policy: shapes, dtypes and devices are checked on every call (host metadata only).
The values of ``group_lens`` live on the device; reading them needs a device sync, so
``sum(group_lens) == M`` and ``group_lens >= 0`` are checked only when ``group_lens`` is a CPU
tensor, or when ``PRIMUS_TURBO_GROUPED_GEMM_VALIDATE=1`` (debugging; it synchronises). Without
the check, malformed sizes cannot corrupt memory: the kernels clamp offsets to ``[0, M]``.
"""

from __future__ import annotations

import functools

import torch

from primus_turbo.pytorch.core.backend import BackendType
from primus_turbo.pytorch.core.checks import check, check_dtype_arg, check_tensor, env_flag, fail
from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_impl import (
    GROUPED_DTYPES,
    GroupedGemmDispatcher,
    grouped_dims,
    grouped_gemm_impl,
    grouped_gemm_variable_k_impl,
)

__all__ = ["grouped_gemm"]

_OP = GroupedGemmDispatcher.family
_OUT_DTYPES = (*GROUPED_DTYPES, torch.float32)


class GroupedGemmFunction(torch.autograd.Function):
    """Forward ``[M, N]``; dgrad is a grouped GEMM with b transposed, wgrad the variable-K GEMM.
    Both reuse the forward's backend."""

    @staticmethod
    def forward(ctx, a, b, group_lens, group_offs, trans_b, out_dtype, backend_value):
        backend = BackendType(backend_value)
        # the backend's own offsets (int64 prefix sum / int32 ends), made once for all 3 GEMMs
        offs = GroupedGemmDispatcher.backend_class(backend).prepare_offsets(group_lens, group_offs)
        ctx.save_for_backward(a, b, group_lens, offs)
        ctx.trans_b, ctx.backend_value = trans_b, backend_value
        return grouped_gemm_impl(a, b, group_lens, offs, trans_b, out_dtype, backend)

    @staticmethod
    def backward(ctx, grad_out):
        a, b, group_lens, group_offs = ctx.saved_tensors
        trans_b, backend = ctx.trans_b, BackendType(ctx.backend_value)
        g = grad_out.to(a.dtype).contiguous()  # no-ops for the usual contiguous bf16 grad
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:  # d a = g @ op(b)^T: flip trans_b
            grad_a = grouped_gemm_impl(g, b, group_lens, group_offs, not trans_b, a.dtype, backend)
        if ctx.needs_input_grad[1]:
            if trans_b:  # b is [G, N, K]: d b_g = g_g^T @ a_g
                grad_b = grouped_gemm_variable_k_impl(
                    g, a, group_lens, group_offs, b.dtype, backend
                )
            else:  # b is [G, K, N]: d b_g = a_g^T @ g_g
                grad_b = grouped_gemm_variable_k_impl(
                    a, g, group_lens, group_offs, b.dtype, backend
                )
        return grad_a, grad_b, None, None, None, None, None


@functools.cache
def _validate_env() -> bool:
    return env_flag("PRIMUS_TURBO_GROUPED_GEMM_VALIDATE", False)


def _check_group_values(group_lens: torch.Tensor, m: int, op: str = _OP) -> None:
    """The value checks that need the sizes on the host (see the module docstring)."""
    if group_lens.device.type != "cpu" and not _validate_env():
        return
    if torch.compiler.is_compiling():
        return
    if bool((group_lens < 0).any()):
        fail(op, "group_lens", "non-negative sizes", group_lens.tolist())
    total = int(group_lens.sum())
    if total != m:
        fail(op, "group_lens", f"sizes summing to a.shape[0] = {m}", f"sum {total}")


def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None = None,
    trans_b: bool = False,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Grouped GEMM: ``out[rows of g] = a[rows of g] @ op(b[g])`` for each group ``g``.

    Args:
        a: ``[M, K]`` fp16/bf16, rows packed by group (group 0 first).
        b: ``[G, K, N]``, or ``[G, N, K]`` when ``trans_b``; same dtype and device as ``a``.
        group_lens: int64 ``[G]`` rows per group, on a's device; ``sum == M`` (see the module
            docstring for when that is checked). Zero-size groups are allowed.
        group_offs: optional int64 ``[G + 1]`` exclusive prefix sum of ``group_lens``; derived
            on the device when ``None`` (in the form the chosen backend needs).
        trans_b: b holds each expert as ``[N, K]`` (the ``GroupedLinear`` weight layout).
        out_dtype: output dtype, default ``a.dtype``.
    Returns:
        ``[M, N]`` of ``out_dtype``. Gradients flow to ``a`` and ``b``.

    No call synchronises with the host (TRITON and HIPBLASLT backends); the TORCH reference does.
    """
    check_tensor(_OP, "a", a, ndim=2, dtypes=GROUPED_DTYPES)
    check_tensor(_OP, "b", b, ndim=3, dtypes=GROUPED_DTYPES)
    check_tensor(_OP, "group_lens", group_lens, ndim=1, dtypes=(torch.int64,))
    if b.dtype != a.dtype:
        fail(_OP, "b", f"dtype {a.dtype} (same as a)", b.dtype, TypeError)
    if b.device != a.device:
        fail(_OP, "b", f"a tensor on {a.device} (same as a)", b.device, RuntimeError)
    if group_lens.device != a.device:
        where = f"a tensor on {a.device} (same as a)"
        fail(_OP, "group_lens", where, group_lens.device, RuntimeError)
    m, n, k, g = grouped_dims(a, b, trans_b)
    k_b = b.shape[2] if trans_b else b.shape[1]
    if k_b != k:
        fail(
            _OP,
            "b",
            f"a reduction size K={k} matching a {tuple(a.shape)}",
            f"shape {tuple(b.shape)} with trans_b={trans_b} (K={k_b})",
        )
    check(
        group_lens.shape[0] == g,
        _OP,
        "group_lens",
        f"one size per group of b (G={g})",
        f"{group_lens.shape[0]} sizes",
    )
    if group_offs is not None:  # None: each backend derives its offsets (one small kernel)
        check_tensor(_OP, "group_offs", group_offs, ndim=1, dtypes=(torch.int64,))
        check(
            group_offs.shape[0] == g + 1 and group_offs.device == a.device,
            _OP,
            "group_offs",
            f"an int64 [G+1] = [{g + 1}] tensor on {a.device}",
            f"shape {tuple(group_offs.shape)} on {group_offs.device}",
        )
    if out_dtype is None:
        out_dtype = a.dtype
    else:
        check_dtype_arg(_OP, "out_dtype", out_dtype, _OUT_DTYPES)
    _check_group_values(group_lens, m)
    kwargs = dict(
        a=a, b=b, group_lens=group_lens, group_offs=group_offs, trans_b=trans_b,
        out_dtype=out_dtype,
    )  # fmt: skip
    backend = GroupedGemmDispatcher.resolve(**kwargs)
    if not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
        return grouped_gemm_impl(a, b, group_lens, group_offs, trans_b, out_dtype, backend)
    return GroupedGemmFunction.apply(
        a, b, group_lens, group_offs, trans_b, out_dtype, backend.value
    )
