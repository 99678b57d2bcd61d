"""nn.Module wrappers over the ops."""

from primus_turbo.pytorch.modules.linear import Linear

__all__ = ["Linear"]
