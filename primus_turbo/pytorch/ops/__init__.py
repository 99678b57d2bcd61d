"""User API: functions with autograd."""

from primus_turbo.pytorch.ops.gemm import gemm
from primus_turbo.pytorch.ops.grouped_gemm import grouped_gemm

__all__ = ["gemm", "grouped_gemm"]
