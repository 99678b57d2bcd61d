"""PyTorch frontend: ``import primus_turbo.pytorch as turbo; turbo.ops.gemm(a, b)``."""

import torch

from primus_turbo.pytorch import core, modules, ops

float8_e4m3 = torch.float8_e4m3fn
float8_e5m2 = torch.float8_e5m2

__all__ = ["core", "modules", "ops", "float8_e4m3", "float8_e5m2"]
