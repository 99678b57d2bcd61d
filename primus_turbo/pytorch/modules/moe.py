"""``MoELayer``: router -> permute -> grouped GEMM (gate|up) -> SwiGLU/GeGLU -> grouped GEMM
(down) -> unpermute, every step an autograd op of this package.

Router probabilities are applied inside the activation (``swiglu_with_probs``), where the
``[N, F]`` intermediate is produced anyway, rather than in the unpermute: this keeps the unpermute
a plain sum and the probs gradient a by-product of the activation backward. Permutation is
unpadded, so the grouped GEMMs see exactly ``T * topk`` rows and no host synchronisation happens
anywhere in the forward or backward (with the TRITON/HIPBLASLT grouped GEMM backends).
With ``fp8_config`` the two expert GEMMs run in FP8 (``grouped_gemm_fp8``).

FP8 activations (``fp8_act``): ``"fused"`` (the default for ROWWISE recipes) moves the
quantization upstream, as production FP8 MoE stacks do: the tokens are quantized before the
permutation (``T`` rows instead of ``T * topk``) and permuted as fp8 rows with their scales
(``moe_quantize_permute_fp8``), and the activation writes fp8 + row scales in one kernel
(``swiglu_with_probs_fp8``); bitwise the same forward as ``"op"``, where each grouped GEMM
quantizes its input (TENSORWISE recipes always; ``PRIMUS_TURBO_MOE_FP8_ACT=op`` selects it for
ROWWISE). H200 (call 7.3, graph timing, weight cache on, vs our bf16 layer), forward fused /
op: DeepSeek-V3 1.78 / 1.63, Qwen3-30B-A3B 1.47 / 1.36, gpt-oss-20b 1.62 / 1.59; step
(forward + backward) 1.30 / 1.30, 1.19 / 1.21, 1.28 / 1.33 (noise level). Backward: the
output gradients are quantized rowwise for the two fp8 dgrad GEMMs; the expert weight
gradients run in bf16 (``PRIMUS_TURBO_GROUPED_GEMM_FP8_WGRAD=hp``) on the dequantized fp8
activations (the values the forward multiplied; ``"op"``: the saved bf16 inputs).

``fp8_weight_cache`` (default on in fp8 mode; ``False`` quantizes the weights in every call,
no extra memory): the expert weights' fp8 copies (``quantize_grouped_weight``: forward along K
and the dgrad's along N, together the bf16 weights' bytes, weakly tied to the weights) are
kept and re-quantized EAGERLY, in place (same buffers), right after every optimizer step that
owns the weights (any ``torch.optim.Optimizer``: a global step post-hook), so every
micro-batch between two steps reuses them and a CUDA graph that captured them reads fresh
values at every replay; a fully captured step (optimizer inside the graph) captures the
refresh after the update. Other in-place changes (version counter) re-quantize lazily at the
next forward; writes that bypass both (``w.data.copy_(...)``, raw storage writes) need
``refresh_fp8_weights()``. The cache is used under CUDA-graph capture too (warm up eagerly
first: a copy missing at capture time is quantized inside the graph, into buffers the cache
keeps). Why on under capture: H200 call 7.4, graph timing, vs our bf16 layer, DeepSeek-V3 /
Qwen3-30B-A3B / gpt-oss-20b: weights quantized inside the captured step (the round-3
default) step 0.645 / 0.414 / 0.468, forward 1.27 / 0.92 / 1.02; cached: step 1.30 / 1.23 /
1.28, forward 1.74 / 1.56 / 1.64.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

from primus_turbo.pytorch.core.checks import check, check_tensor
from primus_turbo.pytorch.core.low_precision import (
    Float8QuantConfig,
    ScalingGranularity,
    fp8_dtype_for_format,
)
from primus_turbo.pytorch.modules.grouped_linear import Fp8WeightCache, cached_fp8_weight
from primus_turbo.pytorch.ops.activation import (
    geglu_with_probs,
    geglu_with_probs_fp8,
    swiglu_with_probs,
    swiglu_with_probs_fp8,
)
from primus_turbo.pytorch.ops.fp8_delayed import refuse_delayed
from primus_turbo.pytorch.ops.gemm import gemm
from primus_turbo.pytorch.ops.grouped_gemm import grouped_gemm
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import grouped_gemm_fp8
from primus_turbo.pytorch.ops.moe import moe_permute, moe_router_topk, moe_unpermute
from primus_turbo.pytorch.ops.moe_fp8 import moe_quantize_permute_fp8

__all__ = ["MoELayer"]

_ACTS = {"swiglu": swiglu_with_probs, "geglu": geglu_with_probs}
_ACTS_FP8 = {"swiglu": swiglu_with_probs_fp8, "geglu": geglu_with_probs_fp8}
_FP8_ACT_ENV = "PRIMUS_TURBO_MOE_FP8_ACT"


class _Fp32RouterLinear(torch.autograd.Function):
    """``logits = x @ w^T`` in fp32 from 16-bit ``x`` and ``w``: the forward is the 16-bit GEMM
    with fp32 accumulation and output (every product of two 16-bit values is exact in fp32: the
    fp32 GEMM of their casts, without the ``[T, D]`` fp32 copy of the tokens kept for the
    backward, or the fp32 units' speed); the backward is the fp32 GEMMs of the casts, as
    autograd of ``F.linear(x.float(), w.float())`` runs them (the gradients are rounded to
    16 bits only at the end). On GPUs the forward is the vendor BLAS's (``torch.mm`` with
    ``out_dtype``: one library call, so the eager layer's host time does not grow; H200 call
    15.4, torch.profiler: 0.73 ms of host time per call through our Triton GEMM); elsewhere
    ``ops.gemm``."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        if x.is_cuda:
            return torch.mm(x, w.t(), out_dtype=torch.float32)
        return gemm(x, w, trans_b=True, out_dtype=torch.float32)

    @staticmethod
    def backward(ctx, dlogits):
        x, w = ctx.saved_tensors
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = (dlogits @ w.float()).to(x.dtype)
        if ctx.needs_input_grad[1]:
            dw = (dlogits.t() @ x.float()).to(w.dtype)
        return dx, dw


class MoELayer(torch.nn.Module):
    """Token-choice top-k MoE feed-forward block (single device, all experts local).

    Args:
        hidden_size: ``D``.
        ffn_hidden_size: ``F``, each expert's intermediate size.
        num_experts: ``E``.
        topk: experts per token.
        score_function, groups, selected_groups, scaling_factor: router options (see
            ``ops.moe_router_topk``).
        activation: ``"swiglu"`` or ``"geglu"``.
        fp8_config: when given, both expert GEMMs run as ``grouped_gemm_fp8`` with this recipe
            (TENSORWISE or ROWWISE, bf16 output).
        fp8_act: where the fp8 activations are quantized (see the module doc): ``"op"`` (in
            each GEMM) or ``"fused"`` (ROWWISE only: before the permutation and inside the
            activation kernel); None: ``PRIMUS_TURBO_MOE_FP8_ACT`` (default ``fused`` for
            ROWWISE, ``op`` for TENSORWISE, which ``fused`` does not apply to).
        fp8_weight_cache: keep the expert weights' fp8 copies from one optimizer step to the
            next, refreshed in place right after each step (see the module doc). None
            (default) = True in fp8 mode; False: off.
        router_dtype: ``torch.float32`` (default): fp32 router logits (as Megatron's
            ``moe_router_dtype="fp32"``; from the 16-bit GEMM with fp32 accumulation and
            output, whose products are exact, and fp32 backward GEMMs); None: the router GEMM
            in the tokens' dtype, forward and backward (Megatron's default), the scores and
            selection still in fp32 (``ops.moe_router_topk``).
    Parameters: ``router_weight [E, D]``, ``w1 [E, 2F, D]`` (gate rows then up rows),
    ``w2 [E, D, F]``; the ``[out, in]`` layout of ``GroupedLinear`` (``trans_b=True``).

    ``forward(x [..., D]) -> [..., D]`` in x's dtype; ``self.last_aux_scores`` keeps the router's
    ``[T, E]`` scores of the last call for an auxiliary load-balancing loss.
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        num_experts: int,
        topk: int,
        score_function: str = "softmax",
        groups: int = 1,
        selected_groups: int = 1,
        scaling_factor: float = 1.0,
        activation: str = "swiglu",
        fp8_config: Float8QuantConfig | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        fp8_act: str | None = None,
        fp8_weight_cache: bool | None = None,
        router_dtype: torch.dtype | None = torch.float32,
    ) -> None:
        super().__init__()
        op = "MoELayer"
        check(activation in _ACTS, op, "activation", "'swiglu' or 'geglu'", repr(activation))
        check(1 <= topk <= num_experts, op, "topk", f"in [1, {num_experts}]", topk)
        self.hidden_size, self.ffn_hidden_size = hidden_size, ffn_hidden_size
        self.num_experts, self.topk = num_experts, topk
        self.score_function, self.groups = score_function, groups
        self.selected_groups, self.scaling_factor = selected_groups, scaling_factor
        self.activation = activation
        check(fp8_config is None or isinstance(fp8_config, Float8QuantConfig), op, "fp8_config",
              "None or a Float8QuantConfig", type(fp8_config).__name__, TypeError)  # fmt: skip
        refuse_delayed(op, "fp8_config", fp8_config)
        self.fp8_config = fp8_config
        row = fp8_config is not None and fp8_config.granularity == ScalingGranularity.ROWWISE
        if fp8_act is None:
            env = os.environ.get(_FP8_ACT_ENV, "fused").strip().lower() or "fused"
            check(env in ("op", "fused"), op, _FP8_ACT_ENV, "'op' or 'fused'", repr(env))
            fp8_act = env if row else "op"
        check(fp8_act in ("op", "fused"), op, "fp8_act", "'op' or 'fused'", repr(fp8_act))
        check(fp8_act == "op" or row, op, "fp8_act",
              "'op' unless fp8_config is ROWWISE", repr(fp8_act))  # fmt: skip
        check(fp8_weight_cache in (None, True, False), op, "fp8_weight_cache",
              "None, True or False", repr(fp8_weight_cache), TypeError)  # fmt: skip
        check(not fp8_weight_cache or fp8_config is not None, op, "fp8_weight_cache",
              "False or None without fp8_config", fp8_weight_cache)  # fmt: skip
        if fp8_weight_cache is None:  # default: on in fp8 mode
            fp8_weight_cache = fp8_config is not None
        self.fp8_act, self.fp8_weight_cache = fp8_act, fp8_weight_cache
        check(router_dtype in (torch.float32, None), op, "router_dtype", "torch.float32 or None",
              repr(router_dtype))  # fmt: skip
        self.router_dtype = router_dtype
        self._fp8_cached = Fp8WeightCache(fp8_config)
        kw = {"device": device, "dtype": dtype}
        e, d, f = num_experts, hidden_size, ffn_hidden_size
        self.router_weight = torch.nn.Parameter(torch.empty(e, d, **kw))
        self.w1 = torch.nn.Parameter(torch.empty(e, 2 * f, d, **kw))
        self.w2 = torch.nn.Parameter(torch.empty(e, d, f, **kw))
        self.last_aux_scores: torch.Tensor | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for w in (self.router_weight, self.w1, self.w2):
                bound = 1.0 / math.sqrt(w.shape[-1])
                w.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Drop the previous call's scores before anything touches ``x``: they hold that call's
        # autograd graph, and with it the gradient accumulator nodes of the parameters and of
        # a reused input, which autograd hands to every new node (even the ``reshape`` below)
        # while any graph holds them. A node remembers the stream it was made on, so one made
        # by an eager call on the legacy default stream would make a later CUDA-graph capture
        # of the backward (torch.cuda.make_graphed_callables) wait on that stream: "operation
        # would make the legacy stream depend on a capturing blocking stream" (H200 call 14.5;
        # call 15.1: dropping them after the reshape still kept the input's node).
        self.last_aux_scores = None
        check_tensor("MoELayer", "x", x, dtypes=(torch.bfloat16, torch.float16))
        check(x.shape[-1] == self.hidden_size, "MoELayer", "x", f"last dim {self.hidden_size}",
              f"shape {tuple(x.shape)}")  # fmt: skip
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        logits = self._router_logits(x2)
        aux, probs, idx = moe_router_topk(
            logits, self.topk, self.groups, self.selected_groups, self.score_function,
            self.scaling_factor,
        )  # fmt: skip
        self.last_aux_scores = aux
        if self.fp8_config is not None and self.fp8_act == "fused":
            y, row_map = self._fp8_fused_experts(x2, idx, probs)
        else:
            permuted, row_map, tokens_per_expert, *_, permuted_probs = moe_permute(
                x2, idx, num_local_experts=self.num_experts, probs=probs
            )
            h = self._expert_gemm(permuted, "w1", tokens_per_expert, x2.dtype)
            a = _ACTS[self.activation](h, permuted_probs)
            y = self._expert_gemm(a, "w2", tokens_per_expert, x2.dtype)
        out, _ = moe_unpermute(y, row_map)
        return out.reshape(shape)

    def _router_logits(self, x2: torch.Tensor) -> torch.Tensor:
        w = self.router_weight
        if self.router_dtype is None:
            return F.linear(x2, w.to(x2.dtype))
        if w.dtype == x2.dtype:  # 16-bit weights and tokens
            return _Fp32RouterLinear.apply(x2, w)
        return F.linear(x2.float(), w.float())

    @torch._dynamo.disable
    def _fp8_fused_experts(self, x2, idx, probs):
        """Experts with upstream fp8 activations: quantize (T rows) + fp8 permute, gate|up
        GEMM, activation fused with its quantization, down GEMM. Returns ``(y [N, D], row_map)``.
        Runs eagerly under torch.compile (a graph break, as ``grouped_gemm_fp8`` is one)."""
        dtype = fp8_dtype_for_format(self.fp8_config.format, x2.device)
        a1, row_map, lens, permuted_probs = moe_quantize_permute_fp8(
            x2, idx, num_local_experts=self.num_experts, dtype=dtype, probs=probs
        )
        h = self._expert_gemm(a1, "w1", lens, x2.dtype)
        a2 = _ACTS_FP8[self.activation](h, permuted_probs, dtype)
        return self._expert_gemm(a2, "w2", lens, x2.dtype), row_map

    def _expert_gemm(self, a, name: str, lens: torch.Tensor, out_dtype) -> torch.Tensor:
        w = getattr(self, name)
        if self.fp8_config is None:
            return grouped_gemm(a, w, lens, trans_b=True)
        if self.fp8_weight_cache:
            w = cached_fp8_weight(self._fp8_cached, name, w, self.fp8_config)
        return grouped_gemm_fp8(a, w, lens, trans_b=True, out_dtype=out_dtype,
                                config=self.fp8_config)  # fmt: skip

    def refresh_fp8_weights(self) -> None:
        """Re-quantize the cached fp8 expert weights now, in place (same buffers). Optimizer
        steps do this themselves; needed after ``.data`` / raw storage writes of the weights
        (before replaying a CUDA graph that reads the copies)."""
        self._fp8_cached.refresh()

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
            f"num_experts={self.num_experts}, topk={self.topk}, "
            f"score_function={self.score_function!r}, activation={self.activation!r}, "
            f"router_dtype={self.router_dtype}, "
            f"fp8={self.fp8_config is not None}"
            + (f", fp8_act={self.fp8_act!r}, fp8_weight_cache={self.fp8_weight_cache}"
               if self.fp8_config is not None else "")
        )  # fmt: skip
