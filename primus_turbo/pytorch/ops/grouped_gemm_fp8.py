"""FP8 grouped GEMM with autograd: ``grouped_gemm_fp8(a, b, group_lens, ..., config)``.

Quantization reuses :func:`primus_turbo.pytorch.ops.quantization.quantize_fp8`. Every GEMM has
its scales applied in the kernel epilogue, so each scale must be constant along that GEMM's
reduction:
* forward ``a @ b_g^T``: a per row along K (ROWWISE) or one scale (TENSORWISE); b per expert
  and output column along K.
* dgrad ``grad @ b_g``: grad per row along N; b per expert and K-index along N.
* wgrad (reduction over each group's rows): by default (``PRIMUS_TURBO_GROUPED_GEMM_FP8_WGRAD``
  = ``hp``) in high precision on the saved input and the gradient through the bf16 grouped GEMM
  (``torch._grouped_mm`` for HIPBLASLT); ``fp8``: a and grad quantized per column, over all
  rows, on the fp8 variable-K kernel (slow on H200: the step fell to 0.2x the bf16 one).
  ``PRIMUS_TURBO_GROUPED_GEMM_FP8_DGRAD`` = ``fp8`` (default, as above) | ``hp`` (the dgrad on
  the bf16 grouped GEMM: no transposed copy and re-quantization of the weights).
``PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_CACHE=1`` (default off): the forward's weight quantization
is kept per weight tensor until the tensor changes (version counter) or an optimizer steps: for
several micro-batches per optimizer step (gradient accumulation). H200, DeepSeek-V3 forward vs
our bf16: gate_up 1.73x / down 1.63x with the cache, 1.41x / 1.40x without (runs 6.1 / 6.2);
semantics and limits in ``_forward_weights``.
Both operands of a backward GEMM use the gradient fp8 dtype (E5M2 for ``Format.HYBRID``), so
no kernel multiplies mixed fp8 formats. BLOCKWISE / MX_BLOCKWISE are not implemented here
(NotImplementedError). Not traceable by torch.compile (graph break), as upstream.
Group sizes are never read on the host by the TRITON backend; checks as in ``grouped_gemm``.
"""

from __future__ import annotations

import functools
import os
import weakref

import torch

from primus_turbo.pytorch.core.backend import BackendType
from primus_turbo.pytorch.core.checks import check, check_dtype_arg, check_tensor, fail
from primus_turbo.pytorch.core.low_precision import (
    Float8QuantConfig,
    ScalingGranularity,
    fp8_dtype_for_format,
)
from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_fp8_impl import (
    GroupedGemmFp8Dispatcher,
)
from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_impl import (
    GroupedGemmDispatcher,
    grouped_gemm_impl,
    grouped_gemm_variable_k_impl,
)
from primus_turbo.pytorch.ops.grouped_gemm import _check_group_values
from primus_turbo.pytorch.ops.quantization import quantize_fp8
from primus_turbo.pytorch.reference.grouped_gemm import group_offsets

__all__ = ["grouped_gemm_fp8"]

_OP = "grouped_gemm_fp8"
_FLOAT = (torch.float16, torch.bfloat16, torch.float32)
_OUT = (torch.float16, torch.bfloat16, torch.float32)
_ROW, _TENSOR = ScalingGranularity.ROWWISE, ScalingGranularity.TENSORWISE


def _quant_rows(x: torch.Tensor, dtype: torch.dtype, gran: ScalingGranularity):
    """``(q, scale [rows])``: x quantized along its last dim (one scale per row, or per tensor
    expanded over the rows)."""
    if gran == _TENSOR:
        q, s = quantize_fp8(x, dtype, _TENSOR)
        return q, s.reshape(1).expand(x.shape[0])
    q, s = quantize_fp8(x, dtype, _ROW, axis=-1)
    return q, s.reshape(-1)


def _quant_cols(x: torch.Tensor, dtype: torch.dtype, gran: ScalingGranularity):
    """``(q, scale [cols])``: x quantized along its first dim (one scale per column)."""
    if gran == _TENSOR:
        q, s = quantize_fp8(x, dtype, _TENSOR)
        return q, s.reshape(1).expand(x.shape[1])
    q, s = quantize_fp8(x, dtype, _ROW, axis=0)
    return q, s.reshape(-1)


def _quant_experts(w: torch.Tensor, dtype: torch.dtype, gran: ScalingGranularity):
    """``w [G, R, C]`` -> ``(q [G, R, C], scale [G, R])``, each row quantized along C."""
    g, r, c = w.shape
    q, s = _quant_rows(w.reshape(g * r, c), dtype, gran)
    return q.reshape(g, r, c), s.reshape(g, r)


@functools.cache
def _mode(which: str, default: str) -> str:
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_{WGRAD,DGRAD}`` = ``hp`` | ``fp8``."""
    var = f"PRIMUS_TURBO_GROUPED_GEMM_FP8_{which}"
    mode = os.environ.get(var, default).strip().lower()
    if mode not in ("hp", "fp8"):
        raise ValueError(f"primus_turbo: {var} expected 'hp' or 'fp8', got {mode!r}")
    return mode


def _hp_backend(ctx, a: torch.Tensor, g: torch.Tensor) -> tuple[BackendType, torch.dtype]:
    """The bf16/fp16 grouped GEMM backend (and dtype) for a high-precision backward GEMM:
    ``torch._grouped_mm`` for the vendor fp8 backend where it can run, else our Triton kernels;
    the reference on the TORCH backend."""
    fp8_backend = BackendType(ctx.backend_value)
    if fp8_backend == BackendType.TORCH:
        return BackendType.TORCH, a.dtype
    hp = torch.bfloat16 if a.dtype == torch.float32 else a.dtype
    vendor_ok = hp == torch.bfloat16 and a.shape[1] % 8 == 0 and g.shape[1] % 8 == 0
    if fp8_backend == BackendType.HIPBLASLT and vendor_ok:
        return BackendType.HIPBLASLT, hp
    return BackendType.TRITON, hp


def _wgrad_high_precision(a, g, group_lens, group_offs, trans_b, out_dtype, ctx):
    """The weight gradient in high precision on the saved input and the incoming gradient,
    through the bf16 grouped GEMM (see ``_hp_backend``): no column quantization of the two
    ``[M, *]`` tensors and no fp8 variable-K kernel."""
    backend, hp = _hp_backend(ctx, a, g)
    x, y = (g, a) if trans_b else (a, g)  # trans_b: [G, N, K] = grad_g^T @ a_g
    x, y = x.to(hp).contiguous(), y.to(hp).contiguous()
    offs = GroupedGemmDispatcher.backend_class(backend).prepare_offsets(group_lens, group_offs)
    wdt = out_dtype if backend != BackendType.HIPBLASLT else torch.bfloat16
    return grouped_gemm_variable_k_impl(x, y, group_lens, offs, wdt, backend).to(out_dtype)


def _dgrad_high_precision(a, b, g, group_lens, group_offs, trans_b, ctx):
    """The input gradient ``g @ op(b)^T`` in high precision (no transposed copy and
    re-quantization of the weights), through the bf16 grouped GEMM."""
    backend, hp = _hp_backend(ctx, a, g)
    offs = GroupedGemmDispatcher.backend_class(backend).prepare_offsets(group_lens, group_offs)
    odt = a.dtype if backend != BackendType.HIPBLASLT else torch.bfloat16
    gh, bh = g.to(hp).contiguous(), b.to(hp).contiguous()
    return grouped_gemm_impl(gh, bh, group_lens, offs, not trans_b, odt, backend).to(a.dtype)


@functools.cache
def _weight_cache_on() -> bool:
    from primus_turbo.pytorch.core.checks import env_flag

    return env_flag("PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_CACHE", False)


# id(b) -> (weakref to b, signature, (qb, sb)): the last forward quantization of each weight
_WEIGHT_CACHE: dict[int, tuple] = {}
_STEP_HOOK: list = []  # the handle of the optimizer step hook, registered on the first use


def clear_weight_cache() -> None:
    """Drop every cached weight quantization (``PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_CACHE``).
    Called after every ``torch.optim.Optimizer`` step; call it yourself after updating weights
    outside an optimizer step through ``.data`` or a raw storage write (neither bumps the
    parameter's version counter)."""
    _WEIGHT_CACHE.clear()


def _on_optimizer_step(_opt, _args, _kwargs) -> None:
    clear_weight_cache()


def _forward_weights(b: torch.Tensor, trans_b: bool, dtype: torch.dtype, gran):
    """The forward's weight operand ``(q [G, N, K], scale [G, N])``.

    ``PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_CACHE=1`` (default off): the result is kept per
    weight tensor (weakly referenced: the entry goes with the tensor) and reused while all of
    these hold, so the weights are quantized once per optimizer step instead of once per
    micro-batch (gradient accumulation, activation recomputation):
    * the same tensor object with the same ``data_ptr``, shape, strides, dtype, device,
      ``trans_b``, fp8 dtype and granularity;
    * the same version counter (every in-place op on the tensor, a view of it, its base or
      ``.detach()`` bumps it; ``torch.optim`` with ``fused=True`` does NOT, nor ``.data``);
    * no ``torch.optim.Optimizer`` step since (a global step post-hook empties the cache: this
      covers fused optimizers and every Optimizer subclass, e.g. apex / TE FusedAdam);
    * not capturing a CUDA graph: a captured forward always quantizes (a cached operand would be
      baked into the graph and go stale when the weights change between replays).
    Memory: one fp8 copy (half the bf16 bytes) plus fp32 scales per live weight, freed at the
    next optimizer step. Weights changed outside both an in-place op and an optimizer step
    (``.data`` writes, collectives into a flat parameter buffer) need ``clear_weight_cache()``."""

    def quant():
        b_nk = (b if trans_b else b.transpose(1, 2)).contiguous()  # [G, N, K]
        return _quant_experts(b_nk, dtype, gran)

    if not _weight_cache_on() or torch.compiler.is_compiling():
        return quant()
    if b.is_cuda and torch.cuda.is_current_stream_capturing():
        return quant()
    if not _STEP_HOOK:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _STEP_HOOK.append(register_optimizer_step_post_hook(_on_optimizer_step))
    sig = (b.data_ptr(), b._version, tuple(b.shape), b.stride(), b.dtype, b.device, trans_b,
           dtype, gran)  # fmt: skip
    key = id(b)
    hit = _WEIGHT_CACHE.get(key)
    if hit is not None and hit[0]() is b and hit[1] == sig:
        return hit[2]
    out = quant()
    ref = weakref.ref(b, lambda _r, key=key: _WEIGHT_CACHE.pop(key, None))
    _WEIGHT_CACHE[key] = (ref, sig, out)
    return out


class GroupedGemmFp8Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, group_lens, group_offs, trans_b, out_dtype, config, backend_value):
        gran = config.granularity
        fwd_dtype = fp8_dtype_for_format(config.format, a.device)
        impl = GroupedGemmFp8Dispatcher.backend_class(BackendType(backend_value))
        ctx.save_for_backward(a, b, group_lens, group_offs)
        ctx.trans_b, ctx.config, ctx.backend_value = trans_b, config, backend_value
        qa, sa = _quant_rows(a.contiguous(), fwd_dtype, gran)
        qb, sb = _forward_weights(b, trans_b, fwd_dtype, gran)
        return impl.execute(qa, sa, qb, sb, group_offs, group_lens, out_dtype)

    @staticmethod
    def backward(ctx, grad_out):
        a, b, group_lens, group_offs = ctx.saved_tensors
        trans_b, config = ctx.trans_b, ctx.config
        gran = config.granularity
        dtype = fp8_dtype_for_format(config.format, a.device, grad=True)
        impl = GroupedGemmFp8Dispatcher.backend_class(BackendType(ctx.backend_value))
        g = grad_out.contiguous()
        grad_a = grad_b = None
        if ctx.needs_input_grad[0] and _mode("DGRAD", "fp8") == "hp":
            grad_a = _dgrad_high_precision(a, b, g, group_lens, group_offs, trans_b, ctx)
        elif ctx.needs_input_grad[0]:  # grad [M, N] @ b_g [N, K]: b as [G, K, N] rows along N
            b_kn = (b.transpose(1, 2) if trans_b else b).contiguous()
            qg, sg = _quant_rows(g, dtype, gran)
            qb, sb = _quant_experts(b_kn, dtype, gran)
            grad_a = impl.execute(qg, sg, qb, sb, group_offs, group_lens, a.dtype)
        if ctx.needs_input_grad[1] and _mode("WGRAD", "hp") == "hp":
            grad_b = _wgrad_high_precision(a, g, group_lens, group_offs, trans_b, b.dtype, ctx)
        elif ctx.needs_input_grad[1]:
            qa, sa = _quant_cols(a, dtype, gran)
            qg, sg = _quant_cols(g, dtype, gran)
            if trans_b:  # [G, N, K] = grad_g^T @ a_g
                grad_b = impl.variable_k(qg, sg, qa, sa, group_offs, group_lens, b.dtype)
            else:  # [G, K, N] = a_g^T @ grad_g
                grad_b = impl.variable_k(qa, sa, qg, sg, group_offs, group_lens, b.dtype)
        return grad_a, grad_b, None, None, None, None, None, None


@torch._dynamo.disable
def grouped_gemm_fp8(
    a: torch.Tensor,
    b: torch.Tensor,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None = None,
    trans_b: bool = True,
    out_dtype: torch.dtype | None = None,
    config: Float8QuantConfig | None = None,
) -> torch.Tensor:
    """FP8 grouped GEMM ``out[rows of g] = a[rows of g] @ op(b[g])`` with autograd.

    Args:
        a: ``[M, K]`` fp16/bf16/fp32 (quantized here), rows packed by group.
        b: ``[G, N, K]`` when ``trans_b`` (the default, as upstream), else ``[G, K, N]``.
        group_lens: int64 ``[G]`` on a's device; group_offs: optional int64 ``[G + 1]``.
        out_dtype: default ``a.dtype``.
        config: ``Float8QuantConfig`` (default TENSORWISE E4M3); TENSORWISE and ROWWISE.
    Returns:
        ``[M, N]`` of ``out_dtype``.
    """
    config = config or Float8QuantConfig()
    if not isinstance(config, Float8QuantConfig):
        fail(_OP, "config", "a Float8QuantConfig", type(config).__name__, TypeError)
    if config.granularity not in (_ROW, _TENSOR):
        fail(
            _OP,
            "config.granularity",
            "TENSORWISE or ROWWISE (BLOCKWISE/MX_BLOCKWISE not implemented)",
            config.granularity.name,
            NotImplementedError,
        )
    check_tensor(_OP, "a", a, ndim=2, dtypes=_FLOAT)
    check_tensor(_OP, "b", b, ndim=3, dtypes=_FLOAT)
    check_tensor(_OP, "group_lens", group_lens, ndim=1, dtypes=(torch.int64,))
    if b.device != a.device or group_lens.device != a.device:
        fail(_OP, "b/group_lens", f"tensors on {a.device}", f"{b.device}/{group_lens.device}")
    m, k = a.shape
    g = b.shape[0]
    k_b = b.shape[2] if trans_b else b.shape[1]
    check(k_b == k, _OP, "b", f"a reduction size K={k}", f"shape {tuple(b.shape)}")
    check(group_lens.shape[0] == g, _OP, "group_lens", f"{g} sizes", group_lens.shape[0])
    if group_offs is None:
        group_offs = group_offsets(group_lens)
    else:
        check_tensor(_OP, "group_offs", group_offs, ndim=1, dtypes=(torch.int64,))
        check(group_offs.device == a.device, _OP, "group_offs", f"a tensor on {a.device}",
              group_offs.device)  # fmt: skip
        check(group_offs.shape[0] == g + 1, _OP, "group_offs", f"[{g + 1}]", group_offs.shape)
    out_dtype = out_dtype or a.dtype
    check_dtype_arg(_OP, "out_dtype", out_dtype, _OUT)
    _check_group_values(group_lens, m, _OP)
    backend = GroupedGemmFp8Dispatcher.resolve(a=a, b=b, out_dtype=out_dtype)
    return GroupedGemmFp8Function.apply(
        a, b, group_lens, group_offs, trans_b, out_dtype, config, backend.value
    )
