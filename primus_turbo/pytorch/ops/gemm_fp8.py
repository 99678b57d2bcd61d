"""FP8 GEMM with autograd: ``gemm_fp8(a, b, trans_a, trans_b, out_dtype, config)``.

Every GEMM (forward, dgrad, wgrad) runs in NT form on K-contiguous fp8 operands. The
quantization step writes them in that layout: each input is quantized together with its
transpose in one pass (``quantize_fp8_with_trans``), so backward reads the transposed fp8
copies saved by forward and only ``grad_out`` is quantized in backward.

Recipes (``config.granularity``):
* TENSORWISE: one scale per tensor (a, b, grad_out).
* ROWWISE: a per row of ``op(a)`` along K, b per column of ``op(b)`` along K; backward re-scales
  the transposed copies along their own rows (per-K-index scales), grad_out per row (dgrad) and
  per column (wgrad).
* BLOCKWISE (block 128): a in 1x128 blocks both ways, b in 128x128 tiles (shared by forward and
  dgrad), grad_out in 1x128 blocks both ways. Shapes need not be multiples of 128 (edge blocks
  use their valid part).
* MX_BLOCKWISE (MXFP8): E8M0 scales per 32 along K, every operand quantized both ways (1x32);
  M, N, K multiples of 32 (else ValueError). TRITON (tl.dot_scaled) needs gfx950 or sm_90+ and
  K % 128 == 0; elsewhere the TORCH reference runs.
``Format.HYBRID`` quantizes grad_out to E5M2 and the inputs to E4M3.
``ScalingStrategy.DELAYED`` (TENSORWISE): the scales come from amax histories kept in an
``ops.Fp8DelayedScaling`` passed as ``delayed_scaling=`` (``modules.Float8Linear`` keeps one);
every operand is then quantized in ONE pass, and the scalers are updated after the forward
(input, weight) and after the backward (grad_output).
"""

from __future__ import annotations

import torch

from primus_turbo.pytorch.core.checks import check, check_dtype_arg, check_tensor, fail
from primus_turbo.pytorch.core.low_precision import (
    DEFAULT_BLOCK_SIZE,
    MX_BLOCK_SIZE,
    Float8QuantConfig,
    ScalingGranularity,
    ScalingStrategy,
    fp8_dtype_for_format,
)
from primus_turbo.pytorch.kernels.gemm.gemm_fp8_impl import gemm_fp8_impl
from primus_turbo.pytorch.kernels.quantization.quant_impl import quantize_impl

__all__ = ["gemm_fp8"]

_OP = "gemm_fp8"
_FLOAT = (torch.float16, torch.bfloat16, torch.float32)
_OUT = (torch.float16, torch.bfloat16, torch.float32)


def _quant_dual(x: torch.Tensor, dtype, granularity: ScalingGranularity, two_d: bool = False,
                scaler=None):  # fmt: skip
    """``((q, s, group), (q_t, s_t, group_t))``: x and x.T, each quantized along its last dim
    (tensorwise with a delayed ``scaler``: its current scale, one pass)."""
    g = granularity
    if scaler is not None:
        q, s, qt, st = scaler.quantize(x, dtype, dual=True)
        return (q, s, 1), (qt, st, 1)
    if g == ScalingGranularity.TENSORWISE:
        q, s, qt, st = quantize_impl(x, dtype, "tensor", 0, None, True)
        return (q, s, 1), (qt, st, 1)
    if g == ScalingGranularity.ROWWISE:
        q, s, qt, st = quantize_impl(x, dtype, "row", 0, -1, True)
        return (q, s, 1), (qt, st, 1)
    if g == ScalingGranularity.MX_BLOCKWISE:
        q, s, qt, st = quantize_impl(x, dtype, "mx", MX_BLOCK_SIZE, -1, True)
        return (q, s, 1), (qt, st, 1)
    axis = None if two_d else -1
    q, s, qt, st = quantize_impl(x, dtype, "block", DEFAULT_BLOCK_SIZE, axis, True)
    grp = DEFAULT_BLOCK_SIZE if two_d else 1
    return (q, s, grp), (qt, st, grp)


def _mm(x, y, gran: int, out_dtype, backend):
    """NT scaled GEMM of two ``(q, s, group)`` operands."""
    return gemm_fp8_impl(x[0], y[0], x[1], y[1], gran, x[2], y[2], out_dtype, backend)


class GemmFp8Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, trans_a, trans_b, out_dtype, config, backend, ds=None):
        a2 = a.t() if trans_a else a  # [M, K]
        bt = b if trans_b else b.t()  # [N, K]
        g = config.granularity
        fdt = fp8_dtype_for_format(config.format, a.device)
        qa, qa_t = _quant_dual(a2, fdt, g, scaler=ds.input if ds is not None else None)
        qb, qb_t = _quant_dual(bt, fdt, g, two_d=g == ScalingGranularity.BLOCKWISE,
                               scaler=ds.weight if ds is not None else None)  # fmt: skip
        if ds is not None:  # the casts above used the old scales (stream order)
            ds.input.update()
            ds.weight.update()
        out = _mm(qa, qb, g.value, out_dtype, backend)
        ctx.save_for_backward(qa_t[0], qa_t[1], qb_t[0], qb_t[1])
        ctx.groups = (qa_t[2], qb_t[2])
        ctx.trans = (trans_a, trans_b)
        ctx.in_dtypes = (a.dtype, b.dtype)
        ctx.config, ctx.backend, ctx.ds = config, backend, ds
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qa_t_q, qa_t_s, qb_t_q, qb_t_s = ctx.saved_tensors
        qa_t = (qa_t_q, qa_t_s, ctx.groups[0])  # op(a)^T [K, M]
        qb_t = (qb_t_q, qb_t_s, ctx.groups[1])  # op(b)   [K, N]
        trans_a, trans_b = ctx.trans
        cfg = ctx.config
        gran = cfg.granularity
        gdt = fp8_dtype_for_format(cfg.format, grad_out.device, grad=True)
        ds = ctx.ds
        qg, qg_t = _quant_dual(grad_out.contiguous(), gdt, gran,
                               scaler=ds.grad_output if ds is not None else None)  # fmt: skip
        if ds is not None:
            ds.grad_output.update()
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:  # d op(a) = g @ op(b)^T  -> [M, K]
            # trans_a too (a.grad is [K, M]): computed as [M, K] and returned as a transposed
            # view. The direct form op(b) @ g^T puts b's 128x128-scaled copy on the left, which
            # HIPBLASLT refuses (the H200 failures of test_gemm_fp8_snr[4096-4096-4096-True-*-
            # HIPBLASLT-BLOCKWISE]) and which costs the Triton kernel a per-column scale.
            grad_a = _mm(qg, qb_t, gran.value, ctx.in_dtypes[0], ctx.backend)
            if trans_a:
                grad_a = grad_a.t()
        if ctx.needs_input_grad[1]:  # d op(b) = op(a)^T @ g -> [K, N]
            if trans_b:
                grad_b = _mm(qg_t, qa_t, gran.value, ctx.in_dtypes[1], ctx.backend)
            else:
                grad_b = _mm(qa_t, qg_t, gran.value, ctx.in_dtypes[1], ctx.backend)
        return grad_a, grad_b, None, None, None, None, None, None


@torch._dynamo.disable
def gemm_fp8(
    a: torch.Tensor,
    b: torch.Tensor,
    trans_a: bool = False,
    trans_b: bool = False,
    out_dtype: torch.dtype | None = None,
    config: Float8QuantConfig | None = None,
    backend=None,
    *,
    delayed_scaling=None,
) -> torch.Tensor:
    """FP8 GEMM ``op(a) @ op(b)`` with dynamic quantization inside and autograd.

    Args:
        a: ``[M, K]`` (``[K, M]`` if ``trans_a``), fp16/bf16/fp32.
        b: ``[K, N]`` (``[N, K]`` if ``trans_b``), same dtype as ``a``.
        out_dtype: default ``a.dtype``; fp16/bf16/fp32.
        config: :class:`Float8QuantConfig`, default E4M3 tensorwise. BLOCKWISE needs
            ``block_size=128``.
        backend: optional ``BackendChoice`` pinning the backend of every GEMM of this call
            (default: settings, then HIPBLASLT for tensorwise/rowwise where it can, else TRITON).
        delayed_scaling: an ``ops.Fp8DelayedScaling`` (required by, and only allowed with,
            ``config.strategy == DELAYED``): the amax histories and scales of a, b and
            grad_out; updated once per forward / backward. ``modules.Float8Linear`` keeps one.
    Returns:
        ``[M, N]`` of ``out_dtype``. Not traced by torch.compile (runs eagerly inside graphs).
    """
    check_tensor(_OP, "a", a, ndim=2, dtypes=_FLOAT)
    check_tensor(_OP, "b", b, ndim=2, dtypes=_FLOAT)
    if a.dtype != b.dtype:
        fail(_OP, "b", f"dtype {a.dtype} (same as a)", b.dtype, TypeError)
    k_a = a.shape[0] if trans_a else a.shape[1]
    k_b = b.shape[1] if trans_b else b.shape[0]
    if k_a != k_b:
        fail(_OP, "b", f"a reduction size K={k_a} matching a {tuple(a.shape)}",
             f"shape {tuple(b.shape)} with trans_b={trans_b} (K={k_b})")  # fmt: skip
    out_dtype = a.dtype if out_dtype is None else out_dtype
    check_dtype_arg(_OP, "out_dtype", out_dtype, _OUT)
    config = Float8QuantConfig() if config is None else config
    if not isinstance(config, Float8QuantConfig):
        fail(_OP, "config", "a Float8QuantConfig or None", type(config).__name__, TypeError)
    g = config.granularity
    if config.strategy == ScalingStrategy.DELAYED:
        from primus_turbo.pytorch.ops.fp8_delayed import Fp8DelayedScaling

        if not isinstance(delayed_scaling, Fp8DelayedScaling):
            fail(_OP, "delayed_scaling", "an ops.Fp8DelayedScaling(config) for strategy DELAYED "
                 "(the scales live in its amax histories; modules.Float8Linear keeps one)",
                 type(delayed_scaling).__name__, TypeError)  # fmt: skip
    elif delayed_scaling is not None:
        fail(_OP, "delayed_scaling", "None unless config.strategy is DELAYED",
             type(delayed_scaling).__name__)  # fmt: skip
    if g == ScalingGranularity.MX_BLOCKWISE:
        m = a.shape[1] if trans_a else a.shape[0]
        n = b.shape[0] if trans_b else b.shape[1]
        check(m % 32 == 0 and n % 32 == 0 and k_a % 32 == 0, _OP, "a/b",
              "M, N, K multiples of 32 for MX_BLOCKWISE", f"M={m} N={n} K={k_a}")  # fmt: skip
    if g == ScalingGranularity.BLOCKWISE:
        check(config.block_size == DEFAULT_BLOCK_SIZE, _OP, "config.block_size",
              f"{DEFAULT_BLOCK_SIZE} for BLOCKWISE GEMM", config.block_size)  # fmt: skip
    return GemmFp8Function.apply(a, b, trans_a, trans_b, out_dtype, config, backend,
                                 delayed_scaling)  # fmt: skip
