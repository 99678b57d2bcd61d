"""Pure-torch references, computed in fp32 (or fp64), shared by tests, benchmarks and TORCH."""

from primus_turbo.pytorch.reference.activation import geglu_ref, glu_ref, swiglu_ref
from primus_turbo.pytorch.reference.attention import attention_ref, attention_varlen_ref
from primus_turbo.pytorch.reference.gemm import gemm_ref
from primus_turbo.pytorch.reference.grouped_gemm import (
    group_offsets,
    grouped_gemm_ref,
    grouped_gemm_variable_k_ref,
)
from primus_turbo.pytorch.reference.moe import (
    moe_layer_ref,
    permute_ref,
    router_ref,
    unpermute_ref,
)
from primus_turbo.pytorch.reference.normalization import rmsnorm_ref

__all__ = ["attention_ref", "attention_varlen_ref", "gemm_ref"]
__all__ += ["group_offsets", "grouped_gemm_ref", "grouped_gemm_variable_k_ref"]
__all__ += ["glu_ref", "swiglu_ref", "geglu_ref"]
__all__ += ["moe_layer_ref", "permute_ref", "router_ref", "unpermute_ref"]
__all__ += ["rmsnorm_ref"]
