"""``MoELayer``: router -> permute -> grouped GEMM (gate|up) -> SwiGLU/GeGLU -> grouped GEMM
(down) -> unpermute, every step an autograd op of this package.

Router probabilities are applied inside the activation (``swiglu_with_probs``), where the
``[N, F]`` intermediate is produced anyway, rather than in the unpermute: this keeps the unpermute
a plain sum and the probs gradient a by-product of the activation backward. Permutation is
unpadded, so the grouped GEMMs see exactly ``T * topk`` rows and no host synchronisation happens
anywhere in the forward or backward (with the TRITON/HIPBLASLT grouped GEMM backends).
With ``fp8_config`` the two expert GEMMs run in FP8 (``grouped_gemm_fp8``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from primus_turbo.pytorch.core.checks import check, check_tensor
from primus_turbo.pytorch.core.low_precision import Float8QuantConfig
from primus_turbo.pytorch.ops.activation import geglu_with_probs, swiglu_with_probs
from primus_turbo.pytorch.ops.grouped_gemm import grouped_gemm
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import grouped_gemm_fp8
from primus_turbo.pytorch.ops.moe import moe_permute, moe_router_topk, moe_unpermute

__all__ = ["MoELayer"]

_ACTS = {"swiglu": swiglu_with_probs, "geglu": geglu_with_probs}


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
            (TENSORWISE or ROWWISE; activations and weights quantized on the fly, bf16 output).
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
        self.fp8_config = fp8_config
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
        check_tensor("MoELayer", "x", x, dtypes=(torch.bfloat16, torch.float16))
        check(x.shape[-1] == self.hidden_size, "MoELayer", "x", f"last dim {self.hidden_size}",
              f"shape {tuple(x.shape)}")  # fmt: skip
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        logits = F.linear(x2.float(), self.router_weight.float())  # router in fp32
        aux, probs, idx = moe_router_topk(
            logits, self.topk, self.groups, self.selected_groups, self.score_function,
            self.scaling_factor,
        )  # fmt: skip
        self.last_aux_scores = aux
        permuted, row_map, tokens_per_expert, *_, permuted_probs = moe_permute(
            x2, idx, num_local_experts=self.num_experts, probs=probs
        )
        h = self._expert_gemm(permuted, self.w1, tokens_per_expert)
        a = _ACTS[self.activation](h, permuted_probs)
        y = self._expert_gemm(a, self.w2, tokens_per_expert)
        out, _ = moe_unpermute(y, row_map)
        return out.reshape(shape)

    def _expert_gemm(self, a: torch.Tensor, w: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        if self.fp8_config is None:
            return grouped_gemm(a, w, lens, trans_b=True)
        return grouped_gemm_fp8(a, w, lens, trans_b=True, out_dtype=a.dtype,
                                config=self.fp8_config)  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
            f"num_experts={self.num_experts}, topk={self.topk}, "
            f"score_function={self.score_function!r}, activation={self.activation!r}, "
            f"fp8={self.fp8_config is not None}"
        )
