"""User API: functions with autograd."""

from primus_turbo.pytorch.ops.activation import (
    geglu,
    geglu_with_probs,
    geglu_with_probs_fp8,
    swiglu,
    swiglu_with_probs,
    swiglu_with_probs_fp8,
    tokens_per_expert_to_mask,
)
from primus_turbo.pytorch.ops.attention import flash_attn_func, flash_attn_varlen_func
from primus_turbo.pytorch.ops.attention_fp8 import flash_attn_fp8_func
from primus_turbo.pytorch.ops.fp8_delayed import (
    Fp8DelayedScaler,
    Fp8DelayedScaling,
    quantize_fp8_delayed,
)
from primus_turbo.pytorch.ops.gemm import gemm
from primus_turbo.pytorch.ops.gemm_fp4 import gemm_fp4
from primus_turbo.pytorch.ops.gemm_fp8 import gemm_fp8
from primus_turbo.pytorch.ops.grouped_gemm import grouped_gemm
from primus_turbo.pytorch.ops.grouped_gemm_fp8 import grouped_gemm_fp8, quantize_grouped_weight
from primus_turbo.pytorch.ops.moe import (
    fused_group_topk_routing_with_aux_score,
    moe_permute,
    moe_router_topk,
    moe_unpermute,
)
from primus_turbo.pytorch.ops.moe_fp8 import moe_quantize_permute_fp8
from primus_turbo.pytorch.ops.normalization import rmsnorm
from primus_turbo.pytorch.ops.quantization import (
    dequantize_fp4,
    dequantize_fp8,
    quantize_fp4,
    quantize_fp8,
    quantize_fp8_with_trans,
)

__all__ = ["gemm", "grouped_gemm"]
__all__ += [
    "swiglu",
    "geglu",
    "swiglu_with_probs",
    "geglu_with_probs",
    "tokens_per_expert_to_mask",
    "fused_group_topk_routing_with_aux_score",
    "moe_router_topk",
    "moe_permute",
    "moe_unpermute",
]
__all__ += ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_fp8_func"]
__all__ += ["rmsnorm"]
__all__ += ["gemm_fp8", "quantize_fp8", "quantize_fp8_with_trans", "dequantize_fp8"]
__all__ += ["quantize_fp4", "dequantize_fp4", "gemm_fp4"]
__all__ += ["grouped_gemm_fp8"]
__all__ += [
    "quantize_grouped_weight",
    "swiglu_with_probs_fp8",
    "geglu_with_probs_fp8",
    "moe_quantize_permute_fp8",
]
__all__ += ["quantize_fp8_delayed", "Fp8DelayedScaler", "Fp8DelayedScaling"]
