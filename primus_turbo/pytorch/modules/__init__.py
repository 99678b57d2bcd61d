"""nn.Module wrappers over the ops."""

from primus_turbo.pytorch.modules.attention import TurboAttention
from primus_turbo.pytorch.modules.float8_linear import Float8Linear
from primus_turbo.pytorch.modules.grouped_linear import GroupedLinear
from primus_turbo.pytorch.modules.linear import Linear
from primus_turbo.pytorch.modules.moe import MoELayer
from primus_turbo.pytorch.modules.normalization import RMSNorm

__all__ = ["GroupedLinear", "Linear"]
__all__ += ["TurboAttention"]
__all__ += ["RMSNorm"]
__all__ += ["MoELayer"]
__all__ += ["Float8Linear"]
