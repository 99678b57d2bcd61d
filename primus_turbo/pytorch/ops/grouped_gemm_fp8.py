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
  rows, on the fp8 variable-K kernel (slow on H200: the step fell to 0.2x the bf16 one; the
  row-major fp8 operands reduce along their strided dim: see ``docs/moe_notes.md``).
  ``PRIMUS_TURBO_GROUPED_GEMM_FP8_DGRAD`` = ``fp8`` (default, as above) | ``hp`` (the dgrad on
  the bf16 grouped GEMM: no transposed copy and re-quantization of the weights).
``PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_CACHE=1`` (default off): the forward's weight quantization
is kept per weight tensor until the tensor changes (version counter) or an optimizer steps: for
several micro-batches per optimizer step (gradient accumulation). H200, DeepSeek-V3 forward vs
our bf16: gate_up 1.73x / down 1.63x with the cache, 1.41x / 1.40x without (runs 6.1 / 6.2);
semantics and limits in ``_forward_weights``. This is the raw op's opt-in; the modules' cache
(``MoELayer`` / ``GroupedLinear`` in fp8, ``Fp8WeightCache``: on by default, refreshed in place
by the optimizer step hook, valid under CUDA-graph capture) passes pre-quantized weights; both
keep their entries in a :class:`WeightCache` (one freshness rule).
Pre-quantized operands (``core.quantized_tensor``; checked against the recipe: fp8 dtype,
granularity, scaled axis, shapes): ``b`` as :func:`quantize_grouped_weight` builds it (once per
optimizer step; ``GroupedLinear(fp8_weight_cache=True)`` does this), ``a`` as
``QuantizedTensor.quantize(a, dtype, granularity, axis=1)`` (e.g. quantized before an fp8
permute). Same kernels as quantizing in the op, so the results are bitwise equal; gradients go
to each operand's ``source`` (the high-precision tensor), and a backward GEMM that needs an
operand without a source uses its dequantized fp8 values. Unlike the weight cache this also
holds under CUDA-graph capture (the fp8 weights are inputs of the graph, refreshed outside it).
H200 bounds of the forward ratio to our bf16 forward from bytes and FLOPs (``fp8_bounds`` of
the benchmark): quantizing the weights in every call caps it at ~1.1 / 1.2 on Qwen3-30B-A3B
(128 experts) and below 1.5 on gpt-oss-20b with the measured fp8 GEMM; pre-quantized, above 2.
Both operands of a backward GEMM use the gradient fp8 dtype (E5M2 for ``Format.HYBRID``), so
no kernel multiplies mixed fp8 formats. BLOCKWISE / MX_BLOCKWISE are not implemented here
(NotImplementedError). Not traceable by torch.compile (graph break), as upstream.
Group sizes are never read on the host by the TRITON backend; checks as in ``grouped_gemm``.
Without ``group_offs`` from the caller the TRITON forward's ``f8s`` kernel builds its group
table from ``group_lens`` (``_lens_on``; ``PRIMUS_TURBO_GROUPED_GEMM_FP8_LENS=0``: the op
computes ``group_offsets`` first, the old path, kept for A/B).
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
from primus_turbo.pytorch.core.quantized_tensor import (
    QuantizedTensor,
    QuantizedTensorPair,
    check_quantized_tensor,
)
from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_fp8_impl import (
    GroupedGemmFp8Dispatcher,
)
from primus_turbo.pytorch.kernels.grouped_gemm.grouped_gemm_impl import (
    GroupedGemmDispatcher,
    grouped_gemm_impl,
    grouped_gemm_variable_k_impl,
)
from primus_turbo.pytorch.ops.fp8_delayed import refuse_delayed
from primus_turbo.pytorch.ops.grouped_gemm import _check_group_values
from primus_turbo.pytorch.ops.quantization import dequantize_fp8, quantize_fp8
from primus_turbo.pytorch.reference.grouped_gemm import group_offsets

__all__ = ["grouped_gemm_fp8", "quantize_grouped_weight"]

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


def _dequant_rows(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q [M, K]`` fp8 rows times their fp32 scales ``s [M]``, in ``dtype``: one Triton pass
    on CUDA (bf16 / fp16 out), elsewhere :func:`dequantize_fp8` (ROWWISE); both fp32 math
    rounded once, bitwise the same values."""
    s = s.float().reshape(-1)
    if q.is_cuda and dtype in (torch.bfloat16, torch.float16) and q.stride(-1) == 1:
        from primus_turbo.triton.moe.permute_kernel import dequant_rows_triton

        return dequant_rows_triton(q, s.contiguous(), dtype)
    return dequantize_fp8(q, dtype, _ROW, axis=-1, scale_inv=s.reshape(-1, 1))


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


def _hp_backend(ctx, dtype: torch.dtype, k: int, n: int) -> tuple[BackendType, torch.dtype]:
    """The bf16/fp16 grouped GEMM backend (and dtype) for a high-precision backward GEMM of
    activations of ``dtype`` (``K = k``, ``N = n``): ``torch._grouped_mm`` for the vendor fp8
    backend where it can run, else our Triton kernels; the reference on the TORCH backend."""
    fp8_backend = BackendType(ctx.backend_value)
    if fp8_backend == BackendType.TORCH:
        return BackendType.TORCH, dtype
    hp = torch.bfloat16 if dtype == torch.float32 else dtype
    vendor_ok = hp == torch.bfloat16 and k % 8 == 0 and n % 8 == 0
    if fp8_backend == BackendType.HIPBLASLT and vendor_ok:
        return BackendType.HIPBLASLT, hp
    return BackendType.TRITON, hp


def _wgrad_high_precision(a, g, group_lens, group_offs, trans_b, out_dtype, ctx):
    """The weight gradient in high precision on the saved input and the incoming gradient,
    through the bf16 grouped GEMM (see ``_hp_backend``): no column quantization of the two
    ``[M, *]`` tensors and no fp8 variable-K kernel."""
    backend, hp = _hp_backend(ctx, a.dtype, a.shape[1], g.shape[1])
    x, y = (g, a) if trans_b else (a, g)  # trans_b: [G, N, K] = grad_g^T @ a_g
    x, y = x.to(hp).contiguous(), y.to(hp).contiguous()
    offs = GroupedGemmDispatcher.backend_class(backend).prepare_offsets(group_lens, group_offs)
    wdt = out_dtype if backend != BackendType.HIPBLASLT else torch.bfloat16
    return grouped_gemm_variable_k_impl(x, y, group_lens, offs, wdt, backend).to(out_dtype)


def _dgrad_high_precision(a_dtype, b, g, group_lens, group_offs, trans_b, ctx):
    """The input gradient ``g @ op(b)^T`` (of ``a_dtype``) in high precision (no transposed
    copy and re-quantization of the weights), through the bf16 grouped GEMM."""
    k = b.shape[2] if trans_b else b.shape[1]
    backend, hp = _hp_backend(ctx, a_dtype, k, g.shape[1])
    offs = GroupedGemmDispatcher.backend_class(backend).prepare_offsets(group_lens, group_offs)
    odt = a_dtype if backend != BackendType.HIPBLASLT else torch.bfloat16
    gh, bh = g.to(hp).contiguous(), b.to(hp).contiguous()
    return grouped_gemm_impl(gh, bh, group_lens, offs, not trans_b, odt, backend).to(a_dtype)


def _lens_on() -> bool:
    """``PRIMUS_TURBO_GROUPED_GEMM_FP8_LENS`` (read per call; default on, session 9): without
    ``group_offs`` from the caller, the TRITON forward's ``f8s`` kernel builds its group table
    from ``group_lens`` (prefix sums in the kernel) instead of the op launching a zero-fill and
    a cumsum for ``group_offsets`` (the backward, other plans and backends compute them where
    they need them); bitwise the same (call 9.1: Qwen3-30B-A3B op forward +1.2%). ``0``: the
    old offsets path."""
    from primus_turbo.pytorch.core.checks import env_flag

    return env_flag("PRIMUS_TURBO_GROUPED_GEMM_FP8_LENS", True)


@functools.cache
def _weight_cache_on() -> bool:
    from primus_turbo.pytorch.core.checks import env_flag

    return env_flag("PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_CACHE", False)


class WeightCache(dict):
    """Quantized copies of weight tensors, the one cache mechanism of this op's opt-in cache
    (``_WEIGHT_CACHE``, keyed by ``id(b)``) and of the modules' ``Fp8WeightCache`` (keyed by
    parameter name): ``key -> (signature, generation, value, weakref to the weight)``. An
    entry serves only the tensor it was taken from, is fresh while that tensor's
    :func:`weight_signature` (plus the caller's extra keys) and the :func:`weight_generation`
    are unchanged, and goes when the tensor dies."""

    def entry(self, key, w: torch.Tensor):
        """``self[key]`` when it was taken from ``w`` itself (stale or not), else None."""
        hit = self.get(key)
        return hit if hit is not None and hit[3]() is w else None

    @staticmethod
    def fresh(hit, sig: tuple) -> bool:
        """``hit`` (an :meth:`entry`) has signature ``sig`` and the current generation."""
        return hit is not None and hit[:2] == (sig, weight_generation())

    def put(self, key, w: torch.Tensor, sig: tuple, value):
        """Store ``value`` for ``w`` at the current generation; returns ``value``."""

        cache = weakref.ref(self)

        def drop(ref):  # w died: free its copy (unless the entry was replaced since)
            c = cache()
            if c is not None and c.get(key, (None,) * 4)[3] is ref:
                c.pop(key, None)

        self[key] = (sig, weight_generation(), value, weakref.ref(w, drop))
        return value


_WEIGHT_CACHE = WeightCache()  # id(b) -> entry of the forward's (qb, sb)
_STEP_HOOK: list = []  # the handle of the optimizer step hook, registered on the first use
_GENERATION = [0]  # bumped by every optimizer step and clear_weight_cache()
_STEP_REFRESH: list = []  # callables(optimizer) run by the step hook (module caches' refresh)


def register_step_refresh(fn) -> None:
    """Run ``fn(optimizer)`` right after every optimizer step (after the generation bump):
    ``modules.grouped_linear`` refreshes its module caches (``Fp8WeightCache``) there."""
    _STEP_REFRESH.append(fn)


def clear_weight_cache() -> None:
    """Drop the raw op's cached weight quantizations (``PRIMUS_TURBO_GROUPED_GEMM_FP8_WEIGHT_
    CACHE``) and mark the module caches (``MoELayer`` / ``GroupedLinear`` fp8 weight cache)
    stale: they re-quantize lazily, in place, at their next use. Called by every
    ``torch.optim.Optimizer`` step (which then refreshes the module caches of the weights it
    owns eagerly); call it yourself after updating weights through ``.data`` or a raw storage
    write (neither bumps the version counter), or the modules' ``refresh_fp8_weights()``
    (eager: needed before replaying a CUDA graph that reads the copies)."""
    _WEIGHT_CACHE.clear()
    _GENERATION[0] += 1


def weight_generation() -> int:
    """A counter bumped by every optimizer step (a global step post-hook, registered on the
    first call) and every :func:`clear_weight_cache`: a cached weight quantization taken at
    another generation is stale."""
    if not _STEP_HOOK:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _STEP_HOOK.append(register_optimizer_step_post_hook(_on_optimizer_step))
    return _GENERATION[0]


def weight_signature(b: torch.Tensor) -> tuple:
    """What must be unchanged for a weight quantization to be reused (besides the generation):
    storage address, version counter (bumped by every in-place op), shape, strides, dtype."""
    return (b.data_ptr(), b._version, tuple(b.shape), b.stride(), b.dtype, b.device)


def _on_optimizer_step(opt, _args, _kwargs) -> None:
    """Drop the raw op's cache, bump the generation, then refresh the module caches eagerly
    (in place; captured after the optimizer's kernels when the step is graph-captured)."""
    clear_weight_cache()
    for fn in _STEP_REFRESH:
        fn(opt)


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
    (Graph users: the modules' cache, ``Fp8WeightCache``, is refreshed in place and stays on
    under capture.) Memory: one fp8 copy (half the bf16 bytes) plus fp32 scales per live
    weight, freed at the next optimizer step. Weights changed outside both an in-place op and
    an optimizer step (``.data`` writes, collectives into a flat parameter buffer) need
    ``clear_weight_cache()``."""

    def quant():
        b_nk = (b if trans_b else b.transpose(1, 2)).contiguous()  # [G, N, K]
        return _quant_experts(b_nk, dtype, gran)

    if not _weight_cache_on() or torch.compiler.is_compiling():
        return quant()
    if b.is_cuda and torch.cuda.is_current_stream_capturing():
        return quant()
    sig = (*weight_signature(b), trans_b, dtype, gran)
    hit = _WEIGHT_CACHE.entry(id(b), b)
    if _WEIGHT_CACHE.fresh(hit, sig):  # (registers the optimizer step hook)
        return hit[2]
    return _WEIGHT_CACHE.put(id(b), b, sig, quant())


class GroupedGemmFp8Function(torch.autograd.Function):
    """Inputs: ``a`` / ``b`` the high-precision operands (None: pre-quantized without a source,
    no gradient for it); ``qa``/``sa`` the fp8 activations ``[M, K]`` / ``[M]`` when
    pre-quantized (else None: quantized here from ``a``); ``qb``/``sb`` the forward's fp8
    weights ``[G, N, K]`` / ``[G, N]`` likewise; ``qbt``/``sbt`` the dgrad's ``[G, K, N]`` /
    ``[G, K]`` when pre-quantized (a ``QuantizedTensorPair``'s ``data_t``); ``a_dtype`` the
    activations' high-precision dtype (grad_a's)."""

    @staticmethod
    def forward(ctx, a, qa, sa, b, qb, sb, qbt, sbt, group_lens, group_offs, trans_b, out_dtype,
                config, backend_value, a_dtype, a_grad_only=False):  # fmt: skip
        gran = config.granularity
        fwd_dtype = fp8_dtype_for_format(config.format, group_lens.device)
        impl = GroupedGemmFp8Dispatcher.backend_class(BackendType(backend_value))
        pre_a, pre_b = qa is not None, qb is not None
        deq_a = pre_a and (a is None or a_grad_only)  # the wgrad reads the dequantized fp8 a
        ctx.save_for_backward(a if not a_grad_only else None, b, group_lens, group_offs, qbt,
                              sbt, qb if pre_b else None, sb if pre_b else None,
                              qa if deq_a else None, sa if deq_a else None)  # fmt: skip
        ctx.trans_b, ctx.config, ctx.backend_value = trans_b, config, backend_value
        ctx.a_dtype = a_dtype
        if not pre_a:
            qa, sa = _quant_rows(a.contiguous(), fwd_dtype, gran)
        if not pre_b:
            qb, sb = _forward_weights(b, trans_b, fwd_dtype, gran)
        return impl.execute(qa, sa, qb, sb, group_offs, group_lens, out_dtype)

    @staticmethod
    def backward(ctx, grad_out):
        a, b, group_lens, group_offs, qbt, sbt, qb, sb, qa, sa = ctx.saved_tensors
        if group_offs is None:  # LENS (_lens_on): the forward read the sizes
            group_offs = group_offsets(group_lens)
        trans_b, config = ctx.trans_b, ctx.config
        gran = config.granularity
        dtype = fp8_dtype_for_format(config.format, grad_out.device, grad=True)
        impl = GroupedGemmFp8Dispatcher.backend_class(BackendType(ctx.backend_value))
        g = grad_out.contiguous()
        grad_a = grad_b = None
        if a is None and ctx.needs_input_grad[3]:  # pre-quantized a: no source, or grad_only
            a = _dequant_rows(qa, sa, ctx.a_dtype)
        if ctx.needs_input_grad[0]:
            # the weights in high precision when needed: the source, else the fp8 forward
            # weights dequantized ([G, N, K] -> b's layout)
            def hp_b():
                if b is not None:
                    return b
                g_, n_, k_ = qb.shape
                deq = _dequant_rows(qb.reshape(g_ * n_, k_), sb, ctx.a_dtype).view(g_, n_, k_)
                return deq if trans_b else deq.transpose(1, 2)

            if _mode("DGRAD", "fp8") == "hp":
                grad_a = _dgrad_high_precision(ctx.a_dtype, hp_b(), g, group_lens, group_offs,
                                               trans_b, ctx)  # fmt: skip
            else:  # grad [M, N] @ b_g [N, K]: b as [G, K, N] rows along N
                qg, sg = _quant_rows(g, dtype, gran)
                if qbt is None:
                    hb = hp_b()
                    b_kn = (hb.transpose(1, 2) if trans_b else hb).contiguous()
                    qbt, sbt = _quant_experts(b_kn, dtype, gran)
                grad_a = impl.execute(qg, sg, qbt, sbt, group_offs, group_lens, ctx.a_dtype)
        if ctx.needs_input_grad[3] and _mode("WGRAD", "hp") == "hp":
            grad_b = _wgrad_high_precision(a, g, group_lens, group_offs, trans_b, b.dtype, ctx)
        elif ctx.needs_input_grad[3]:
            qa, sa = _quant_cols(a, dtype, gran)
            qg, sg = _quant_cols(g, dtype, gran)
            if trans_b:  # [G, N, K] = grad_g^T @ a_g
                grad_b = impl.variable_k(qg, sg, qa, sa, group_offs, group_lens, b.dtype)
            else:  # [G, K, N] = a_g^T @ grad_g
                grad_b = impl.variable_k(qa, sa, qg, sg, group_offs, group_lens, b.dtype)
        return (grad_a, None, None, grad_b) + (None,) * 12


def _prequantized(b, trans_b: bool, config: Float8QuantConfig, device: torch.device):
    """``(source or None, qb [G, N, K], sb [G, N], qbt [G, K, N] or None, sbt [G, K] or None,
    b's logical shape)`` of a pre-quantized ``b`` (``QuantizedTensor`` or
    ``QuantizedTensorPair``), each checked against the recipe this op builds."""
    pair = b if isinstance(b, QuantizedTensorPair) else QuantizedTensorPair(b)
    data, data_t = pair.data, pair.data_t
    gran = config.granularity
    k_axis, n_axis = (2, 1) if trans_b else (1, 2)
    fwd = fp8_dtype_for_format(config.format, device)
    check(data.dim() == 3, _OP, "b", "a 3-D quantized tensor", f"shape {tuple(data.shape)}")
    check_quantized_tensor(_OP, "b", data, dtype=fwd, granularity=gran, axis=k_axis)
    check(data.device == device, _OP, "b", f"a tensor on {device}", data.device)
    g = data.shape[0]

    def operand(qt: QuantizedTensor, axis: int):  # -> [G, R, C] rows scaled along C = axis
        q = qt.qdata if axis == 2 else qt.qdata.transpose(1, 2)
        rows = q.shape[1]
        s = qt.scale_inv.float()
        s = s.reshape(1, 1).expand(g, rows) if s.numel() == 1 else s.reshape(g, rows)
        return q.contiguous(), s

    qb, sb = operand(data, k_axis)
    qbt = sbt = None
    if data_t is not None:
        gdt = fp8_dtype_for_format(config.format, device, grad=True)
        check_quantized_tensor(_OP, "b.data_t", data_t, dtype=gdt, granularity=gran,
                               axis=n_axis, shape=tuple(data.shape))  # fmt: skip
        qbt, sbt = operand(data_t, n_axis)
    src = pair.source
    if src is not None:
        check(tuple(src.shape) == tuple(data.shape), _OP, "b.source",
              f"shape {tuple(data.shape)}", tuple(src.shape))  # fmt: skip
    return src, qb, sb, qbt, sbt, tuple(data.shape)


def quantize_grouped_weight(
    b: torch.Tensor,
    config: Float8QuantConfig | None = None,
    trans_b: bool = True,
    with_dgrad: bool = True,
    keep_source: bool | None = None,
) -> QuantizedTensorPair:
    """The weights ``b`` (``[G, N, K]`` when ``trans_b``, else ``[G, K, N]``) quantized as
    :func:`grouped_gemm_fp8` would quantize them (same kernels: its outputs are bitwise equal),
    for reuse across calls (e.g. once per optimizer step): ``data`` scaled along K for the
    forward; with ``with_dgrad`` also ``data_t`` scaled along N in the gradient fp8 dtype for
    the dgrad (``PRIMUS_TURBO_GROUPED_GEMM_FP8_DGRAD=fp8``), else the dgrad re-quantizes the
    source (or, without one, the dequantized forward weights). ``keep_source`` (default
    ``b.requires_grad``): gradients flow to ``b``."""
    config = config or Float8QuantConfig()
    if not isinstance(config, Float8QuantConfig):
        fail(_OP, "config", "a Float8QuantConfig", type(config).__name__, TypeError)
    refuse_delayed("quantize_grouped_weight", "config", config)
    check_tensor(_OP, "b", b, ndim=3, dtypes=_FLOAT)
    gran = config.granularity
    k_axis, n_axis = (2, 1) if trans_b else (1, 2)
    fwd = fp8_dtype_for_format(config.format, b.device)
    data = QuantizedTensor.quantize(b, fwd, gran, axis=k_axis, keep_source=keep_source)
    data_t = None
    if with_dgrad:
        gdt = fp8_dtype_for_format(config.format, b.device, grad=True)
        data_t = QuantizedTensor.quantize(b, gdt, gran, axis=n_axis, keep_source=False)
    return QuantizedTensorPair(data, data_t)


def _prequantized_a(a, config: Float8QuantConfig):
    """``(source or None, qa [M, K], sa [M], dtype)`` of a pre-quantized activation operand
    (``QuantizedTensor`` or a pair's ``data``: ROWWISE along K or TENSORWISE), checked."""
    qt = a.data if isinstance(a, QuantizedTensorPair) else a
    check(qt.dim() == 2, _OP, "a", "a 2-D quantized tensor", f"shape {tuple(qt.shape)}")
    fwd = fp8_dtype_for_format(config.format, qt.device)
    check_quantized_tensor(_OP, "a", qt, dtype=fwd, granularity=config.granularity, axis=1)
    m = qt.shape[0]
    s = qt.scale_inv.float()
    s = s.reshape(1).expand(m) if s.numel() == 1 and config.granularity == _TENSOR else s
    src = qt.source
    if src is not None:
        check(tuple(src.shape) == tuple(qt.shape), _OP, "a.source", f"shape {tuple(qt.shape)}",
              tuple(src.shape))  # fmt: skip
    return (
        src,
        qt.qdata.contiguous(),
        s.reshape(-1),
        qt.dtype,
        bool(qt.grad_only and src is not None),
    )


@torch._dynamo.disable
def grouped_gemm_fp8(
    a: torch.Tensor | QuantizedTensor,
    b: torch.Tensor | QuantizedTensor | QuantizedTensorPair,
    group_lens: torch.Tensor,
    group_offs: torch.Tensor | None = None,
    trans_b: bool = True,
    out_dtype: torch.dtype | None = None,
    config: Float8QuantConfig | None = None,
) -> torch.Tensor:
    """FP8 grouped GEMM ``out[rows of g] = a[rows of g] @ op(b[g])`` with autograd.

    Args:
        a: ``[M, K]`` fp16/bf16/fp32 (quantized here), rows packed by group; or pre-quantized
            (``QuantizedTensor.quantize(a, fp8 dtype, granularity, axis=1)``, e.g. quantized
            before an fp8 permute): the input gradient goes to its ``source`` (none without
            one); the weight gradient then uses the source, or the dequantized fp8 values
            (without a source, or with ``grad_only``: a gradient sink such as the placeholder
            of ``swiglu_with_probs_fp8`` / ``moe_quantize_permute_fp8``).
        b: ``[G, N, K]`` when ``trans_b`` (the default, as upstream), else ``[G, K, N]``; a
            tensor (quantized here), or pre-quantized (:func:`quantize_grouped_weight`): a
            ``QuantizedTensor`` scaled along K, or a ``QuantizedTensorPair`` whose ``data_t``
            (scaled along N, gradient fp8 dtype) serves the dgrad. They must match ``config``
            (fp8 dtype, granularity, axis: else TypeError/ValueError). The weight gradient goes
            to their ``source`` (none without one). Without ``data_t`` the dgrad quantizes the
            source along N (or the forward's fp8 weights dequantized, without a source).
        group_lens: int64 ``[G]`` on a's device; group_offs: optional int64 ``[G + 1]``.
        out_dtype: default ``a.dtype``.
        config: ``Float8QuantConfig`` (default TENSORWISE E4M3); TENSORWISE and ROWWISE.
    Returns:
        ``[M, N]`` of ``out_dtype``.
    """
    config = config or Float8QuantConfig()
    if not isinstance(config, Float8QuantConfig):
        fail(_OP, "config", "a Float8QuantConfig", type(config).__name__, TypeError)
    refuse_delayed(_OP, "config", config)
    if config.granularity not in (_ROW, _TENSOR):
        fail(
            _OP,
            "config.granularity",
            "TENSORWISE or ROWWISE (BLOCKWISE/MX_BLOCKWISE not implemented)",
            config.granularity.name,
            NotImplementedError,
        )
    qa = sa = None
    a_grad_only = False
    if isinstance(a, (QuantizedTensor, QuantizedTensorPair)):
        a, qa, sa, a_dtype, a_grad_only = _prequantized_a(a, config)
        (m, k), a_dev = qa.shape, qa.device
    else:
        check_tensor(_OP, "a", a, ndim=2, dtypes=_FLOAT)
        (m, k), a_dev, a_dtype = a.shape, a.device, a.dtype
    qb = sb = qbt = sbt = None
    if isinstance(b, (QuantizedTensor, QuantizedTensorPair)):
        src, qb, sb, qbt, sbt, b_shape = _prequantized(b, trans_b, config, a_dev)
        b, b_dev = src, qb.device
    else:
        check_tensor(_OP, "b", b, ndim=3, dtypes=_FLOAT)
        b_shape, b_dev = tuple(b.shape), b.device
    check_tensor(_OP, "group_lens", group_lens, ndim=1, dtypes=(torch.int64,))
    if b_dev != a_dev or group_lens.device != a_dev:
        fail(_OP, "b/group_lens", f"tensors on {a_dev}", f"{b_dev}/{group_lens.device}")
    g = b_shape[0]
    k_b = b_shape[2] if trans_b else b_shape[1]
    check(k_b == k, _OP, "b", f"a reduction size K={k}", f"shape {b_shape}")
    check(group_lens.shape[0] == g, _OP, "group_lens", f"{g} sizes", group_lens.shape[0])
    if group_offs is None:  # LENS: the TRITON forward builds its table from the sizes
        group_offs = None if _lens_on() else group_offsets(group_lens)
    else:
        check_tensor(_OP, "group_offs", group_offs, ndim=1, dtypes=(torch.int64,))
        check(group_offs.device == a_dev, _OP, "group_offs", f"a tensor on {a_dev}",
              group_offs.device)  # fmt: skip
        check(group_offs.shape[0] == g + 1, _OP, "group_offs", f"[{g + 1}]", group_offs.shape)
    out_dtype = out_dtype or a_dtype
    check_dtype_arg(_OP, "out_dtype", out_dtype, _OUT)
    _check_group_values(group_lens, m, _OP)
    ra = a if a is not None and not a_grad_only else qa
    rb = b if b is not None else qb
    backend = GroupedGemmFp8Dispatcher.resolve(a=ra, b=rb, out_dtype=out_dtype)
    return GroupedGemmFp8Function.apply(
        a, qa, sa, b, qb, sb, qbt, sbt, group_lens, group_offs, trans_b, out_dtype, config,
        backend.value, a_dtype, a_grad_only,
    )  # fmt: skip
