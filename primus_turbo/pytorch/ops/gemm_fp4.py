"""MXFP4 GEMM with autograd: ``gemm_fp4(a, b, trans_a, trans_b, out_dtype, config)``.

Operands are quantized to E2M1 (two per byte) with E8M0 scales per 32 values along K, in both
directions (``x`` and ``x.T``), so forward, dgrad and wgrad all run NT on K-contiguous packed
operands (same structure as :mod:`gemm_fp8`). Backends: TRITON (``tl.dot_scaled``, gfx950 or
sm_90+, K % 128 == 0) and the TORCH reference (decode, fp32 matmul). M, N, K must be multiples
of 32. Quantization: the fused MXFP4 Triton kernel (two launches: x and x.T). Stochastic rounding,
Hadamard transforms and preshuffled layouts are not implemented (rejected by the config).
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core.checks import check, check_dtype_arg, check_tensor, fail
from primus_turbo.pytorch.core.low_precision import Float4QuantConfig, ScalingGranularity
from primus_turbo.pytorch.kernels.gemm.gemm_fp8_impl import gemm_fp8_impl
from primus_turbo.pytorch.ops.quantization import quantize_fp4

__all__ = ["gemm_fp4"]

_OP = "gemm_fp4"
_FLOAT = (torch.float16, torch.bfloat16, torch.float32)
_MX = ScalingGranularity.MX_BLOCKWISE.value


def _quant_dual(x: torch.Tensor):
    q, s = quantize_fp4(x)
    qt, st = quantize_fp4(x, axis=0)  # x.T, K-contiguous
    return (q, s, 1), (qt, st, 1)


def _mm(x, y, out_dtype, backend):
    return gemm_fp8_impl(x[0], y[0], x[1], y[1], _MX, 1, 1, out_dtype, backend)


class GemmFp4Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, trans_a, trans_b, out_dtype, backend):
        qa, qa_t = _quant_dual(a.t() if trans_a else a)
        qb, qb_t = _quant_dual(b if trans_b else b.t())
        ctx.save_for_backward(qa_t[0], qa_t[1], qb_t[0], qb_t[1])
        ctx.trans, ctx.dtypes, ctx.backend = (trans_a, trans_b), (a.dtype, b.dtype), backend
        return _mm(qa, qb, out_dtype, backend)

    @staticmethod
    def backward(ctx, grad_out):
        qa_q, qa_s, qb_q, qb_s = ctx.saved_tensors
        qa_t, qb_t = (qa_q, qa_s, 1), (qb_q, qb_s, 1)
        trans_a, trans_b = ctx.trans
        qg, qg_t = _quant_dual(grad_out)
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            x, y = (qb_t, qg) if trans_a else (qg, qb_t)
            grad_a = _mm(x, y, ctx.dtypes[0], ctx.backend)
        if ctx.needs_input_grad[1]:
            x, y = (qg_t, qa_t) if trans_b else (qa_t, qg_t)
            grad_b = _mm(x, y, ctx.dtypes[1], ctx.backend)
        return grad_a, grad_b, None, None, None, None


@torch._dynamo.disable
def gemm_fp4(
    a: torch.Tensor,
    b: torch.Tensor,
    trans_a: bool = False,
    trans_b: bool = False,
    out_dtype: torch.dtype | None = None,
    config: Float4QuantConfig | None = None,
    backend=None,
) -> torch.Tensor:
    """MXFP4 GEMM ``op(a) @ op(b)`` (every layout) with dynamic quantization and autograd.

    ``a``/``b`` fp16/bf16/fp32 with M, N, K multiples of 32; ``out_dtype`` default ``a.dtype``;
    ``backend`` an optional ``BackendChoice`` (TRITON or TORCH).
    """
    check_tensor(_OP, "a", a, ndim=2, dtypes=_FLOAT)
    check_tensor(_OP, "b", b, ndim=2, dtypes=_FLOAT)
    if a.dtype != b.dtype:
        fail(_OP, "b", f"dtype {a.dtype} (same as a)", b.dtype, TypeError)
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    n, k_b = (b.shape[0], b.shape[1]) if trans_b else (b.shape[1], b.shape[0])
    if k != k_b:
        fail(_OP, "b", f"a reduction size K={k}", f"shape {tuple(b.shape)} (K={k_b})")
    check(m % 32 == 0 and n % 32 == 0 and k % 32 == 0, _OP, "a/b",
          "M, N, K multiples of 32 for MXFP4", f"M={m} N={n} K={k}")  # fmt: skip
    out_dtype = a.dtype if out_dtype is None else out_dtype
    check_dtype_arg(_OP, "out_dtype", out_dtype, _FLOAT)
    if config is not None and not isinstance(config, Float4QuantConfig):
        fail(_OP, "config", "a Float4QuantConfig or None", type(config).__name__, TypeError)
    return GemmFp4Function.apply(a, b, trans_a, trans_b, out_dtype, backend)
