"""User API: functions with autograd."""

from primus_turbo.pytorch.ops.gemm import gemm

__all__ = ["gemm"]
