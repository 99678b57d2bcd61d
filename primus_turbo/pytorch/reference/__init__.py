"""Pure-torch references, computed in fp32 (or fp64), shared by tests, benchmarks and TORCH."""

from primus_turbo.pytorch.reference.gemm import gemm_ref

__all__ = ["gemm_ref"]
